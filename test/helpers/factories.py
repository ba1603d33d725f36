"""Data and component factories shared by the tests.

Every item written by these factories carries its own id in every leaf (``obs`` holds the id in each of its
3 columns, the other leaves hold the id or ``id + 0.5``), so a test can read back any batch, check that its
leaves belong together, and recover which items it holds with :func:`ids_of`. :func:`tagged_rows` does the same
for rows written by several processes: each leaf encodes the writer and its sequence number.
"""

from __future__ import annotations

import json
import os
import zlib

import pytest
import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase, tensorclass

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    Sampler,
    SamplerWithoutReplacement,
    Storage,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    TensorStorage,
    Writer,
)
from torchrl.envs.transforms import Transform

KINDS = ("tensor", "tensordict", "tensorclass", "dict", "tuple")
STORAGES = ("list", "tensor", "lazy", "memmap")
TENSOR_STORAGES = ("tensor", "lazy", "memmap")
SAMPLERS = ("random", "without_replacement")
# (data kind, writer): the TensorDict writer only makes sense for TensorDict data.
CASES = tuple((kind, "round_robin") for kind in KINDS) + (("tensordict", "tensordict_round_robin"),)
CASE_IDS = tuple(f"{kind}-{writer}" for kind, writer in CASES)
FEATURES = 3


@tensorclass
class Transition:
    """A tensorclass item: an observation and a reward."""

    obs: torch.Tensor
    reward: torch.Tensor


def make_batch(kind: str, start: int, n: int):
    """``n`` items of ``kind`` with ids ``start .. start + n - 1``."""
    ids = torch.arange(start, start + n)
    obs = ids.to(torch.float32).unsqueeze(-1).expand(n, FEATURES).clone()
    if kind == "tensor":
        return obs
    if kind == "tensordict":
        return TensorDict(
            {"obs": obs, "action": ids.clone(), ("next", "obs"): obs + 0.5, "done": ids % 2 == 0},
            batch_size=[n],
        )
    if kind == "tensorclass":
        return Transition(obs=obs, reward=ids.to(torch.float32) + 0.5, batch_size=[n])
    if kind == "dict":
        return {"obs": obs, "nested": {"reward": ids.to(torch.float32) + 0.5}}
    if kind == "tuple":
        return (obs, ids.clone())
    raise ValueError(f"unknown data kind {kind!r}")


def is_tuple_of_items(storage: str, kind: str) -> bool:
    """Whether a ``kind`` batch written to a ``storage`` buffer is read as items rather than as one batch.

    A tuple extended into a ``ListStorage`` is a tuple of items (TorchRL's rule, as for a list or a range), not a
    pytree batch: ``make_batch("tuple", ...)`` holds two leaves, not ``n`` items, there. The grid tests that write
    pytree batches skip that pair; the tuple-of-items case has its own tests
    (test/storages/test_memmap_compressed_torchrl_compat.py).
    """
    return storage == "list" and kind == "tuple"


def skip_tuple_of_items(storage: str, kind: str) -> None:
    if is_tuple_of_items(storage, kind):
        pytest.skip(
            "a tuple extended into a ListStorage is a tuple of items (TorchRL's rule), not a pytree batch"
        )


def make_item(kind: str, i: int):
    """One item of ``kind`` (no batch dim) with id ``i``."""
    batch = make_batch(kind, i, 1)
    if kind in ("dict", "tuple"):
        return pytree.tree_map(lambda t: t[0], batch)
    return batch[0]


def ids_of(kind: str, data) -> torch.Tensor:
    """The ids of the items in ``data`` (any leading shape), after checking that all leaves agree."""
    if kind == "tensor":
        obs, others = data, []
    elif kind == "tensordict":
        obs = data["obs"]
        others = [(data["action"], 0.0), (data["next", "obs"][..., 0], 0.5)]
    elif kind == "tensorclass":
        obs, others = data.obs, [(data.reward, 0.5)]
    elif kind == "dict":
        obs, others = data["obs"], [(data["nested"]["reward"], 0.5)]
    elif kind == "tuple":
        obs, others = data[0], [(data[1], 0.0)]
    else:
        raise ValueError(f"unknown data kind {kind!r}")
    obs = torch.as_tensor(obs)
    ids = obs[..., 0]
    assert (obs == ids.unsqueeze(-1)).all(), "the columns of one item disagree"
    for leaf, offset in others:
        assert torch.equal(torch.as_tensor(leaf).to(torch.float32), ids + offset), (
            "leaves of one item disagree"
        )
    return ids.to(torch.long)


def _zeros_like_batch(data):
    if isinstance(data, (torch.Tensor, TensorDictBase)) or hasattr(data, "zero_"):
        return data.clone().zero_()
    return pytree.tree_map(torch.zeros_like, data)


def make_storage(
    name: str,
    capacity: int,
    kind: str = "tensordict",
    writer: str = "round_robin",
    *,
    template=None,
    **kwargs,
):
    """A storage of type ``name`` (see :data:`STORAGES`) holding ``capacity`` items.

    ``"tensor"`` builds a :class:`TensorStorage` over a zeroed preallocated backing of ``kind`` (with the
    ``"index"`` entry that :class:`TensorDictRoundRobinWriter` writes, when that is the writer), emptied so
    that every storage starts with ``len() == 0``. ``template``, a batch of ``capacity`` items, replaces the
    batch of ``kind`` as the model of that backing (for tests that write items of their own layout).
    """
    if name == "list":
        return ListStorage(capacity, **kwargs)
    if name == "lazy":
        return LazyTensorStorage(capacity, **kwargs)
    if name == "memmap":
        return LazyMemmapStorage(capacity, **kwargs)
    if name == "tensor":
        backing = _zeros_like_batch(make_batch(kind, 0, capacity) if template is None else template)
        if writer == "tensordict_round_robin":
            backing.set("index", torch.zeros(capacity, dtype=torch.long))
        storage = TensorStorage(backing, **kwargs)
        storage._empty()  # a preallocated storage counts its rows as data: start empty like the others
        return storage
    raise ValueError(f"unknown storage {name!r}")


def filled_storage(name: str, kind: str = "tensordict", n: int = 6, capacity: int = 10, **kwargs):
    """A :func:`make_storage` storage holding the items ``0 .. n - 1`` of ``kind`` (see :func:`make_batch`)."""
    storage = make_storage(name, capacity, kind, **kwargs)
    storage.set(torch.arange(n), make_batch(kind, 0, n))
    return storage


def make_sampler(name: str, capacity: int = 10, **kwargs):
    """A sampler of ``name`` (see :data:`SAMPLERS`, plus ``"prioritized"`` over ``capacity`` items)."""
    if name == "random":
        return RandomSampler(**kwargs)
    if name == "without_replacement":
        return SamplerWithoutReplacement(**kwargs)
    if name == "prioritized":
        return PrioritizedSampler(capacity, alpha=0.7, beta=0.5, **kwargs)
    raise ValueError(f"unknown sampler {name!r}")


WRITERS = {"round_robin": RoundRobinWriter, "tensordict_round_robin": TensorDictRoundRobinWriter}


def make_buffer(
    *,
    storage: str | Storage | None = "lazy",
    sampler: str | Sampler | None = None,
    writer: str | Writer | None = None,
    cls: type[ReplayBuffer] | None = None,
    kind: str = "tensordict",
    capacity: int = 10,
    batch_size: int | None = None,
    seed: int | None = None,
    data=None,
    **kwargs,
) -> ReplayBuffer:
    """The one buffer factory of the tests: a buffer of ``cls`` over the given components, every argument a keyword.

    Args:
        storage: a storage, or the name of one (see :data:`STORAGES`) built by :func:`make_storage` over
            ``capacity`` items of ``kind``; ``None`` leaves the buffer's default. A preallocated ``"tensor"`` storage
            starts empty (``rb.empty()``). Defaults to ``"lazy"`` (a ``LazyTensorStorage(capacity)``).
        sampler: a sampler, or the name of one (see :func:`make_sampler`, over ``capacity`` items); ``None`` leaves
            the buffer's default. Defaults to ``None``.
        writer: a writer, or ``"round_robin"`` / ``"tensordict_round_robin"``; ``None`` leaves the buffer's default.
            Defaults to ``None``.
        cls: the buffer class. Defaults to :class:`TensorDictReplayBuffer` with the TensorDict writer's name,
            :class:`ReplayBuffer` otherwise.
        batch_size: the buffer's ``batch_size``. Defaults to ``None`` (the buffer's default).
        seed: seeds a fresh ``torch.Generator`` given as ``generator=`` (``generator=`` itself is accepted too).
            Defaults to ``None`` (torch's global generator).
        data: written with ``rb.extend(data)`` before the buffer is returned. Defaults to ``None`` (empty).
        **kwargs: the other keywords of ``cls`` (``prefetch``, ``transform``, ``shared``, ``rate_limiter``...).

    Example: ``make_buffer(storage="memmap", sampler="prioritized", batch_size=4, seed=0, data=make_batch(...))``.
    """
    writer_name = writer if isinstance(writer, str) else "round_robin"
    if cls is None:
        cls = TensorDictReplayBuffer if writer == "tensordict_round_robin" else ReplayBuffer
    components = {}
    if storage is not None:
        components["storage"] = make_storage(storage, capacity, kind, writer_name) if isinstance(storage, str) else storage
    if sampler is not None:
        components["sampler"] = make_sampler(sampler, capacity) if isinstance(sampler, str) else sampler
    if writer is not None:
        components["writer"] = WRITERS[writer]() if isinstance(writer, str) else writer
    if batch_size is not None:
        components["batch_size"] = batch_size
    if seed is not None:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    rb = cls(**components, **kwargs)
    if isinstance(storage, str) and storage == "tensor":
        rb.empty()  # a preallocated TensorStorage may count its backing as filled: start from empty
    if data is not None:
        rb.extend(data)
    return rb


def snapshot(rb, kind: str) -> tuple:
    """What a failed write must not change: length, writer cursor, and the stored ids."""
    content = ids_of(kind, rb[:]) if len(rb) else torch.zeros(0, dtype=torch.long)
    return len(rb), getattr(rb.writer, "cursor", None), content.tolist()


# -- rows that carry their id in ``obs`` and ``idx`` (the DataLoader and shared-sampler tests) -------------------
def make_data(n: int, start: int = 0, *, with_index: bool = False) -> TensorDict:
    """``n`` rows with ids ``start .. start + n - 1``: ``obs`` holds the id in each of its 3 columns, ``idx`` the id.

    With ``with_index``, an ``index`` entry (``0 .. n - 1``) as well: the entry a :class:`TensorDictRoundRobinWriter`
    writes, which a preallocated storage must hold.
    """
    idx = torch.arange(start, start + n)
    td = TensorDict(obs=idx.float().unsqueeze(-1).expand(n, FEATURES).clone(), idx=idx, batch_size=[n])
    if with_index:
        td["index"] = torch.arange(n)
    return td


def data_storage(name: str, capacity: int = 256):
    """An empty :func:`make_storage` storage of ``name``; a preallocated one (``"tensor"``) fits :func:`make_data`."""
    return make_storage(name, capacity, template=make_data(capacity, with_index=True))


def filled_buffer(storage: str = "lazy", n: int = 64, batch_size: int = 8, **kwargs) -> TensorDictReplayBuffer:
    """The DataLoader tests' buffer: a :func:`make_buffer` over a :func:`data_storage` of ``storage`` holding
    ``make_data(n)``."""
    return make_buffer(
        cls=TensorDictReplayBuffer, storage=data_storage(storage), batch_size=batch_size, data=make_data(n), **kwargs
    )


# -- rows written by several processes (shared/test_shared_writes.py) ------------------------------------------
TAG_WIDTH = 4


def tagged_rows(writer_id: int, seq_start: int, n: int) -> TensorDict:
    """``n`` rows written by ``writer_id``: every leaf of row ``k`` encodes ``(writer_id, seq_start + k)``."""
    seq = torch.arange(seq_start, seq_start + n)
    tag = writer_id * 1_000_000 + seq
    return TensorDict(
        {
            "writer": torch.full((n,), writer_id),
            "seq": seq,
            "a": tag.double().unsqueeze(-1).expand(n, TAG_WIDTH).clone(),
            ("nested", "w"): tag.clone(),
        },
        batch_size=[n],
    )


def torn_rows(td) -> int:
    """How many rows of a batch of :func:`tagged_rows` mix two writes (their leaves disagree)."""
    tag = td["writer"] * 1_000_000 + td["seq"]
    ok = (td["a"] == tag.double().unsqueeze(-1)).all(-1) & (td["nested", "w"] == tag)
    return int((~ok).sum())


# -- crafted checkpoints ------------------------------------------------------------------------------------------
def rewrite_checkpoint_metadata(path, mutate) -> None:
    """Edits the ``metadata.json`` of a checkpoint with ``mutate(document)`` and re-signs its ``COMPLETE`` marker, as
    a crafted (not merely corrupted) checkpoint would."""
    meta_path = os.path.join(path, "metadata.json")
    with open(meta_path) as f:
        document = json.load(f)
    mutate(document)
    raw = json.dumps(document).encode()
    with open(meta_path, "wb") as f:
        f.write(raw)
    marker = {"schema_version": 1, "metadata_nbytes": len(raw), "metadata_crc32": zlib.crc32(raw)}
    with open(os.path.join(path, "COMPLETE"), "w") as f:
        json.dump(marker, f)


# -- trajectories (the slice samplers' tests) -------------------------------------------------------------------
DONE = ("next", "done")
TRUNC = ("next", "truncated")
TERM = ("next", "terminated")
MASK = ("collector", "mask")


def episodes(lengths, first_episode: int = 0, first_step: int = 0, n_envs: int | None = None) -> TensorDict:
    """Steps of consecutive trajectories: ``episode`` id, global step ``t``, done/terminated flags."""
    lengths = torch.as_tensor(lengths)
    n = int(lengths.sum())
    episode = torch.repeat_interleave(torch.arange(len(lengths)), lengths) + first_episode
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[lengths.cumsum(0) - 1] = True
    td = TensorDict(
        {
            "episode": episode,
            "t": torch.arange(first_step, first_step + n),
            "obs": torch.randn(n, 2),
            DONE: done,
            TERM: done & (episode % 2 == 0).unsqueeze(-1),
        },
        batch_size=[n],
    )
    return td


def ring_write(storage, data: TensorDict, cursor: int, split_wrap: bool = True) -> int:
    """Writes ``data`` at ``cursor`` as a round-robin writer would; returns the next cursor."""
    rows = storage._max_size_along_dim0(batched_data=data)
    n = data.shape[0]
    if n > rows:
        data, cursor, n = data[-rows:], (cursor + n - rows) % rows, rows
    index = (torch.arange(n) + cursor) % rows
    if split_wrap and n and index[-1] < index[0]:  # two writes (see test_wrapped_single_write_...)
        cut = rows - cursor
        storage.set(index[:cut], data[:cut])
        storage.set(index[cut:], data[cut:])
    else:
        storage.set(index, data)
    return (cursor + n) % rows


class Doubler(Transform):
    """A transform that doubles its ``in_keys`` (``out_keys = in_keys``) and counts its forward calls."""

    def __init__(self, in_keys):
        super().__init__(in_keys=in_keys)
        self.calls = 0

    def forward(self, td):
        self.calls += 1
        return super().forward(td)

    def _apply_transform(self, value):
        return value * 2
