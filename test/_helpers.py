"""Data and component factories shared by the replay-buffer core tests.

Every item written by these factories carries its own id in every leaf (``obs`` holds the id in each of its
3 columns, the other leaves hold the id or ``id + 0.5``), so a test can read back any batch, check that its
leaves belong together, and recover which items it holds with :func:`ids_of`.

The child-process targets at the bottom live here (not in the test modules) so that a ``spawn`` child only
imports this light module to unpickle them.
"""

from __future__ import annotations

import gc
import math
import os
import time

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


def make_storage(
    name: str, capacity: int, kind: str = "tensordict", writer: str = "round_robin", *, template=None, **kwargs
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
        sampler=make_sampler(sampler, capacity),
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


# -- the checkpoint contract, for any component ------------------------------------------------------------------
def assert_same_state(a, b, where: str = "state") -> None:
    """``a`` and ``b`` hold equal values: tensors (any subclass), TensorDicts, arrays, containers, scalars."""
    import numpy as np
    from tensordict import is_tensorclass

    if isinstance(a, TensorDictBase) or isinstance(b, TensorDictBase):
        assert isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase), f"{where}: {type(a)} vs {type(b)}"
        assert a.batch_size == b.batch_size, f"{where}: batch sizes {a.batch_size} vs {b.batch_size}"
        assert set(a.keys(True, True)) == set(b.keys(True, True)), f"{where}: keys differ"
        for key in a.keys(True, True):
            assert_same_state(a.get(key), b.get(key), f"{where}[{key!r}]")
    elif isinstance(a, (torch.Tensor, np.ndarray)):
        a, b = torch.as_tensor(a).as_subclass(torch.Tensor), torch.as_tensor(b).as_subclass(torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                      and torch.equal(a.nan_to_num(), b.nan_to_num())), f"{where}: values differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {b!r:.200}"
        for key in a:
            assert_same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r:.200} vs {b!r:.200}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif is_tensorclass(a):
        assert_same_state(a._tensordict, b._tensordict, where)
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def observable_state(component):
    """What a round trip must preserve: the state dict, where a storage's backing (whose unwritten rows hold
    arbitrary bytes) is replaced by its length and written content."""
    if hasattr(component, "buffers") and hasattr(component, "sampler"):  # a buffer ensemble
        state = component.state_dict()
        state["_buffers"] = [observable_state(rb) for rb in component.buffers]
        return state
    if hasattr(component, "sampler") and hasattr(component, "storage"):  # a buffer
        return {**component.state_dict(), "_storage": observable_state(component.storage)}
    if hasattr(component, "storages"):  # a storage ensemble
        return {"members": [observable_state(s) for s in component.storages],
                "transforms": [t.state_dict() for t in component.transforms]}
    if hasattr(component, "get") and hasattr(component, "max_size"):  # a storage
        state = {k: v for k, v in component.state_dict().items() if k != "_storage"}
        return {**state, "len": len(component), "content": component.get(slice(None)) if len(component) else None}
    return component.state_dict()


def _saved_document(path) -> dict:
    import json

    with open(os.path.join(path, "metadata.json")) as f:
        return json.load(f)["metadata"]["component"]


def assert_checkpoint_round_trip(component, make_fresh, tmp_path, *, draws: int = 2) -> None:
    """The checkpoint contract of ``component`` (storage, sampler, writer, transform or buffer).

    ``make_fresh()`` builds a component of the same configuration. Checked, at three points (the first load, a
    second load into the same object, a load of the re-saved checkpoint):

    - its part: every tensor is named under the part's prefix and the document is JSON, whatever the prefix;
    - ``dumps`` then ``loads`` into a fresh object gives the same state dict (and content, for a storage);
    - loading is idempotent, and re-saving the loaded object gives the same document (a fixed point);
    - a checkpoint of another class is refused with a ``ValueError`` and leaves the target unchanged;
    - for a buffer, the next ``draws`` seeded samples of the original and of the loaded copy are equal.
    """
    import json

    import pytest

    from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_part, dump_part

    for prefix in ("", "outer/"):
        tensors, wrapped = dump_part(component, PartContext(str(tmp_path / "unused"), prefix))
        assert all(name.startswith(prefix) for name in tensors), sorted(tensors)
        assert json.loads(json.dumps(wrapped)) == wrapped
        check_part(make_fresh(), wrapped, tensors, PartContext(str(tmp_path / "unused"), prefix))

    from torchrl.data.replay_buffers.checkpointers import dump_component, load_component

    def dumps(obj, path):  # transforms (nn.Modules) have no dumps/loads of their own
        obj.dumps(path) if hasattr(obj, "dumps") else dump_component(obj, path)

    def loads(obj, path):
        obj.loads(path) if hasattr(obj, "loads") else load_component(obj, path)

    first, second = tmp_path / "first", tmp_path / "second"
    dumps(component, first)
    fresh = make_fresh()
    loads(fresh, first)
    expected = observable_state(component)
    assert_same_state(observable_state(fresh), expected, "after loads")
    loads(fresh, first)
    assert_same_state(observable_state(fresh), expected, "after a second loads")
    dumps(fresh, second)
    assert _saved_document(second) == _saved_document(first)
    again = make_fresh()
    loads(again, second)
    assert_same_state(observable_state(again), expected, "after loads of the re-saved checkpoint")

    class Other:
        def state_dict(self):
            return {}

    dump_component(Other(), tmp_path / "other")
    target = make_fresh()
    loads(target, first)
    with pytest.raises(ValueError, match="class"):
        loads(target, tmp_path / "other")
    assert_same_state(observable_state(target), expected, "after a refused loads")

    if hasattr(component, "sample") and getattr(component, "batch_size", None):
        for i in range(draws):  # seeded twice: buffers without a generator draw from torch's global one
            torch.manual_seed(1000 + i)
            drawn = fresh.sample()
            torch.manual_seed(1000 + i)
            assert_same_state(drawn, component.sample(), f"draw {i}")


def child_set_priority(rb, index: int, priority: float) -> None:
    """Sets one priority of a shared prioritized buffer from another process."""
    rb.update_priority(torch.tensor([index]), torch.tensor([priority]))


# -- statistics ----------------------------------------------------------------------------------------------
def chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def chi2_crit(df: int, z: float = 3.29) -> float:
    """The chi-square quantile at p ~ 0.9995 (Wilson-Hilferty; scipy is not a dependency)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
