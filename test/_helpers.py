"""Data and component factories shared by the replay-buffer core tests.

Every item written by these factories carries its own id in every leaf (``obs`` holds the id in each of its
3 columns, the other leaves hold the id or ``id + 0.5``), so a test can read back any batch, check that its
leaves belong together, and recover which items it holds with :func:`ids_of`.

The child-process targets at the bottom live here (not in the test modules) so that a ``spawn`` child only
imports this light module to unpickle them.
"""

from __future__ import annotations

import gc
import os
import time

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase, tensorclass

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    TensorStorage,
)

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
        assert torch.equal(torch.as_tensor(leaf).to(torch.float32), ids + offset), "leaves of one item disagree"
    return ids.to(torch.long)


def _zeros_like_batch(data):
    if isinstance(data, (torch.Tensor, TensorDictBase)) or hasattr(data, "zero_"):
        return data.clone().zero_()
    return pytree.tree_map(torch.zeros_like, data)


def make_storage(name: str, capacity: int, kind: str = "tensordict", writer: str = "round_robin", **kwargs):
    """A storage of type ``name`` (see :data:`STORAGES`) holding ``capacity`` items.

    ``"tensor"`` builds a :class:`TensorStorage` over a zeroed preallocated backing of ``kind`` (with the
    ``"index"`` entry that :class:`TensorDictRoundRobinWriter` writes, when that is the writer), emptied so
    that every storage starts with ``len() == 0``.
    """
    if name == "list":
        return ListStorage(capacity, **kwargs)
    if name == "lazy":
        return LazyTensorStorage(capacity, **kwargs)
    if name == "memmap":
        return LazyMemmapStorage(capacity, **kwargs)
    if name == "tensor":
        backing = _zeros_like_batch(make_batch(kind, 0, capacity))
        if writer == "tensordict_round_robin":
            backing.set("index", torch.zeros(capacity, dtype=torch.long))
        storage = TensorStorage(backing, **kwargs)
        storage._empty()  # a preallocated storage counts its rows as data: start empty like the others
        return storage
    raise ValueError(f"unknown storage {name!r}")


def make_sampler(name: str, **kwargs):
    if name == "random":
        return RandomSampler(**kwargs)
    if name == "without_replacement":
        return SamplerWithoutReplacement(**kwargs)
    raise ValueError(f"unknown sampler {name!r}")


def make_buffer(
    storage: str,
    sampler: str,
    kind: str,
    writer: str = "round_robin",
    *,
    capacity: int = 10,
    batch_size: int | None = 4,
    generator: torch.Generator | None = None,
    **kwargs,
) -> ReplayBuffer:
    """An empty buffer over a fresh storage/sampler/writer of the given names.

    The TensorDict writer comes with a :class:`TensorDictReplayBuffer` (its default), the round-robin writer
    with a plain :class:`ReplayBuffer`.
    """
    if writer == "tensordict_round_robin":
        cls, writer_obj = TensorDictReplayBuffer, TensorDictRoundRobinWriter()
    else:
        cls, writer_obj = ReplayBuffer, RoundRobinWriter()
    rb = cls(
        storage=make_storage(storage, capacity, kind, writer),
        sampler=make_sampler(sampler),
        writer=writer_obj,
        batch_size=batch_size,
        generator=generator,
        **kwargs,
    )
    # A preallocated TensorStorage may count its backing as filled; the grid starts from an empty buffer.
    rb.empty()
    return rb


def snapshot(rb, kind: str) -> tuple:
    """What a failed write must not change: length, writer cursor, and the stored ids."""
    content = ids_of(kind, rb[:]) if len(rb) else torch.zeros(0, dtype=torch.long)
    return len(rb), getattr(rb.writer, "cursor", None), content.tolist()


# -- child-process targets (spawn) --------------------------------------------------------------------------


def child_read_storage(storage, queue) -> None:
    """Sends back the content (as a list: a tensor would be lost when the child exits) and the length."""
    try:
        queue.put(("ok", storage.get(torch.arange(len(storage))).tolist(), len(storage)))
    except Exception as err:  # the parent reports it
        queue.put(("error", repr(err), -1))


def child_sample(rb, queue) -> None:
    """Sends back one batch of 4 sampled from a buffer received from the parent."""
    try:
        queue.put(("ok", rb.sample(4).tolist(), len(rb)))
    except Exception as err:
        queue.put(("error", repr(err), -1))


def child_share_and_drop(rb, queue, event) -> None:
    """Exercises a buffer shared with the parent, step by step.

    Reports the length; waits for the parent to write; reports the length and content; writes ids
    100..104 and reports the length; then drops its copy of the buffer, collects garbage and reports
    whether the memmap directory (if any) still exists.
    """
    queue.put(len(rb))
    event.wait(30)
    queue.put((len(rb), rb[:].tolist()))
    rb.extend(torch.arange(100, 105))
    queue.put(len(rb))
    path = getattr(rb.storage, "memmap_dir", None)
    del rb
    gc.collect()
    queue.put(path is None or os.path.isdir(path))


# -- several writer processes (test_shared_writes.py) ----------------------------------------------------------
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


def child_write_tagged(rb, writer_id: int, batches: int, batch: int, start=None) -> None:
    """Writes ``batches`` x ``batch`` tagged rows into ``rb``; waits for ``start`` (an Event) first."""
    if start is not None:
        start.wait(30)
    for b in range(batches):
        rb.extend(tagged_rows(writer_id, b * batch, batch))


def child_hold_write_lock(rb, held, seconds: float) -> None:
    """Takes the buffer's write lock, sets ``held`` and sleeps holding it (the test kills this process)."""
    with rb.write_lock:
        held.set()
        time.sleep(seconds)


def child_extend_and_report(rb, queue) -> None:
    """Extends ``rb`` (whatever it shares with the parent) and reports the child's own view of it."""
    rb.extend(tagged_rows(7, 0, 3))
    queue.put((len(rb), rb.writer.cursor))
