"""Buffers and their components in checkpoints (``dumps``/``loads``): round trips of every storage x sampler x
writer, refusals that leave the target unchanged, list storages, memory-mapped storages, the handler registry.
The format engine itself: test_checkpoint_format.py."""

from __future__ import annotations

import os

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from helpers.factories import (
    CASE_IDS,
    CASES,
    STORAGES,
    ids_of,
    make_batch,
    make_buffer,
    rewrite_checkpoint_metadata,
    skip_tuple_of_items,
)
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.checkpointers import (
    CheckpointError,
    dump_component,
    load_component,
    register_checkpoint_handler,
)

# -- round trips ------------------------------------------------------------------------------------------------
BUFFER_SAMPLERS = ("random", "without_replacement", "prioritized")

@pytest.fixture(autouse=True)
def _pytree_batches_only(request):
    """The ``(list, tuple)`` pair of the grid writes a tuple of two items, not a batch: see is_tuple_of_items."""
    params = getattr(request.node, "callspec", None)
    if params is not None:
        skip_tuple_of_items(params.params.get("storage"), params.params.get("kind"))



def _buffer(storage: str, sampler: str, kind: str, writer: str, seed: int):
    """An empty buffer of 10 items (see ``helpers.factories.make_buffer``) with a generator seeded with ``seed``."""
    return make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4, seed=seed)


def _next_ids(rb, kind: str, n: int = 3) -> list[list[int]]:
    return [ids_of(kind, rb.sample()).tolist() for _ in range(n)]


@pytest.mark.parametrize("sampler", BUFFER_SAMPLERS)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("kind, writer", CASES, ids=CASE_IDS)
def test_buffer_loaded_into_a_fresh_one_samples_and_writes_like_the_original(tmp_path, storage, sampler, kind, writer):
    rb = _buffer(storage, sampler, kind, writer, seed=0)
    rb.extend(make_batch(kind, 0, 7))
    rb.sample()
    if sampler == "prioritized":
        rb.update_priority(torch.tensor([1, 4]), torch.tensor([5.0, 0.1]))
    fresh = assert_checkpoint_round_trip(rb, lambda: _buffer(storage, sampler, kind, writer, seed=123), tmp_path, draws=0)
    assert len(fresh) == len(rb) == 7
    assert _next_ids(fresh, kind) == _next_ids(rb, kind)
    written = [b.extend(make_batch(kind, 100, 5)) for b in (rb, fresh)]
    assert torch.as_tensor(written[0]).tolist() == torch.as_tensor(written[1]).tolist()
    assert ids_of(kind, fresh[:]).tolist() == ids_of(kind, rb[:]).tolist()
    assert _next_ids(fresh, kind) == _next_ids(rb, kind)


def test_max_value_writer_and_slice_sampler_round_trip(tmp_path):
    def build():
        return TensorDictReplayBuffer(
            storage=LazyMemmapStorage(16),
            sampler=SliceSampler(slice_len=2, traj_key="episode"),
            writer=TensorDictMaxValueWriter(rank_key="score"),
            batch_size=4,
            generator=torch.Generator().manual_seed(0),
        )

    rb = build()
    data = TensorDict(
        {"score": torch.arange(20.0) % 7, "episode": torch.arange(20) // 4, "obs": torch.arange(20.0)}, batch_size=[20]
    )
    rb.extend(data)
    fresh = assert_checkpoint_round_trip(rb, lambda: build(), tmp_path, draws=0)
    assert torch.equal(fresh.sample()["obs"], rb.sample()["obs"])
    more = TensorDict({"score": torch.tensor([9.0, 0.5]), "episode": torch.tensor([9, 9]), "obs": torch.tensor([-1.0, -2.0])}, [2])
    rb.extend(more)
    fresh.extend(more)
    assert torch.equal(fresh[:]["obs"], rb[:]["obs"])


def test_storage_ndim_2_round_trip(tmp_path):
    storage = LazyTensorStorage(12, ndim=2)
    storage.set(torch.arange(3), TensorDict(obs=torch.arange(12.0).reshape(3, 4), batch_size=[3, 4]))
    fresh = assert_checkpoint_round_trip(storage, lambda: LazyTensorStorage(12, ndim=2), tmp_path)
    assert len(fresh) == len(storage) and torch.equal(fresh.get(slice(None))["obs"], storage.get(slice(None))["obs"])


@pytest.mark.parametrize("component", ["storage", "sampler", "writer"])
def test_each_component_dumps_and_loads_on_its_own(tmp_path, component):
    rb = _buffer("lazy", "without_replacement", "tensordict", "round_robin", seed=0)
    rb.extend(make_batch("tensordict", 0, 6))
    rb.sample()
    source = getattr(rb, component)
    target = assert_checkpoint_round_trip(
        source, lambda: getattr(_buffer("lazy", "without_replacement", "tensordict", "round_robin", seed=0), component),
        tmp_path,
    )
    if component == "storage":
        assert len(target) == 6 and ids_of("tensordict", target.get(slice(None))).tolist() == list(range(6))
    else:
        assert str(target.state_dict()) == str(source.state_dict())


# -- components: mismatches leave the target unchanged ---------------------------------------------------------------
def _mismatches():
    base = dict(storage=lambda: LazyTensorStorage(10), sampler=RandomSampler, cls=ReplayBuffer)
    return {
        "capacity": ({**base, "storage": lambda: LazyTensorStorage(20)}, "max_size"),
        "storage class": ({**base, "storage": lambda: LazyMemmapStorage(10)}, "storage class"),
        "sampler class": ({**base, "sampler": SamplerWithoutReplacement}, "class"),
        "buffer class": ({**base, "cls": TensorDictReplayBuffer}, "replay buffer class"),
        "prioritized capacity": (
            {**base, "sampler": lambda: PrioritizedSampler(11, 0.7, 0.5)},
            "max_capacity",
        ),
    }


@pytest.mark.parametrize("case", list(_mismatches()))
def test_loads_into_a_differently_built_buffer_says_what_differs_and_changes_nothing(tmp_path, case):
    config, match = _mismatches()[case]
    source_sampler = PrioritizedSampler(10, 0.7, 0.5) if case == "prioritized capacity" else RandomSampler()
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=source_sampler, batch_size=2)
    rb.extend(make_batch("tensordict", 0, 5))
    rb.dumps(tmp_path / "ckpt")
    target = config["cls"](storage=config["storage"](), sampler=config["sampler"](), batch_size=3)
    target.extend(make_batch("tensordict", 50, 2))
    before = (len(target), target.writer.state_dict(), str(target.sampler.state_dict()), target.batch_size)
    with pytest.raises(ValueError, match=match):
        target.loads(tmp_path / "ckpt")
    after = (len(target), target.writer.state_dict(), str(target.sampler.state_dict()), target.batch_size)
    assert after == before
    assert ids_of("tensordict", target[:]).tolist() == [50, 51]


@pytest.mark.parametrize(
    "other, match",
    [
        (lambda: TensorDict(obs=torch.zeros(2, 3), batch_size=[2]), "data keys"),
        (lambda: {**make_batch("tensordict", 0, 2).to_dict(), "obs": torch.zeros(2, 4)}, "shape"),
        (lambda: make_batch("tensordict", 0, 2).apply(lambda t: t.to(torch.float64) if t.is_floating_point() else t), "dtype"),
    ],
    ids=["keys", "shape", "dtype"],
)
def test_loads_into_an_initialized_storage_of_other_keys_shapes_or_dtypes_is_refused(tmp_path, other, match):
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(5), make_batch("tensordict", 0, 5))
    storage.dumps(tmp_path / "s")
    target = LazyTensorStorage(10)
    data = other()
    data = data if isinstance(data, TensorDict) else TensorDict(data, batch_size=[2])
    target.set(torch.arange(2), data)
    snapshot = target.get(slice(None)).clone()
    with pytest.raises(ValueError, match=match):
        target.loads(tmp_path / "s")
    assert len(target) == 2 and (target.get(slice(None)) == snapshot).all()


def test_loads_of_an_unknown_schema_version_is_refused_before_anything_changes(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(torch.ones(3, 2))
    rb.dumps(tmp_path / "ckpt")
    rewrite_checkpoint_metadata(tmp_path / "ckpt", lambda doc: doc.update(schema_version=2))
    fresh = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    with pytest.raises(CheckpointError, match="schema_version 2"):
        fresh.loads(tmp_path / "ckpt")
    assert len(fresh) == 0


@pytest.mark.parametrize(
    "mutate",
    [
        lambda doc: doc["metadata"].pop("component"),
        lambda doc: doc["metadata"]["component"]["doc"].pop("parts"),
        lambda doc: doc["metadata"]["component"]["doc"]["parts"]["storage"]["doc"].pop("leaves"),
    ],
)
def test_loads_of_a_malformed_component_description_raises_checkpoint_error(tmp_path, mutate):
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(torch.ones(3, 2))
    rb.dumps(tmp_path / "ckpt")
    rewrite_checkpoint_metadata(tmp_path / "ckpt", mutate)
    fresh = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    with pytest.raises(CheckpointError):
        fresh.loads(tmp_path / "ckpt")
    assert len(fresh) == 0


# -- components: list storages ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "items",
    [
        [torch.ones(2), torch.zeros(3), torch.arange(4)],  # ragged: one entry per item
        [TensorDict(a=torch.ones(2)), TensorDict(b=torch.zeros(1))],
        [{"x": torch.ones(2), "y": (torch.zeros(1), torch.arange(3))}] * 3,  # homogeneous pytrees: stacked
        [torch.ones(2, dtype=torch.bfloat16)] * 4,
    ],
    ids=["ragged-tensors", "different-tensordicts", "pytrees", "same-tensors"],
)
def test_list_storage_items_round_trip(tmp_path, items):
    storage = ListStorage(10)
    storage.set(list(range(len(items))), items)
    fresh = assert_checkpoint_round_trip(storage, lambda: ListStorage(10), tmp_path)
    assert len(fresh) == len(items)
    for got, want in zip(fresh, items):
        got_leaves, want_leaves = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
        if isinstance(want, TensorDict):
            assert (got == want).all()
        else:
            assert all(torch.equal(a, b) for a, b in zip(got_leaves, want_leaves))


@pytest.mark.parametrize("item", ["a string", {"x": torch.ones(1), "tag": "text"}, 3.5, object()], ids=str)
def test_list_storage_with_items_a_checkpoint_cannot_hold_fails_at_dumps(tmp_path, item):
    storage = ListStorage(10)
    storage.set([0, 1], [torch.ones(1), item])
    with pytest.raises(TypeError, match="item 1 of the ListStorage"):
        storage.dumps(tmp_path / "s")
    assert not os.path.exists(tmp_path / "s") and os.listdir(tmp_path) == []


# -- components: memory-mapped storages --------------------------------------------------------------------------------
def test_memmap_storage_inside_the_checkpoint_is_linked_not_copied_and_mapped_back(tmp_path):
    path = tmp_path / "ckpt"
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=path / "storage"), batch_size=4)
    rb.extend(make_batch("tensordict", 0, 8))
    inode = os.stat(path / "storage" / "obs.memmap").st_ino
    for _ in range(2):  # the first dumps adopts the scratch directory, the second replaces a checkpoint
        rb.dumps(path)
        assert os.stat(path / "storage" / "obs.memmap").st_ino == inode
    rb.extend(make_batch("tensordict", 8, 2))  # the storage still writes to the checkpoint's files
    assert ids_of("tensordict", rb[:]).tolist() == list(range(10))
    fresh = TensorDictReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=path / "storage", existsok=True), batch_size=4)
    fresh.loads(path)
    assert len(fresh) == 8 and fresh.storage._storage["obs"].filename == str(path / "storage" / "obs.memmap")
    assert ids_of("tensordict", fresh[:]).tolist() == list(range(8))


def test_loads_into_a_memmap_storage_copies_files_without_reading_them(tmp_path, monkeypatch):
    from torchrl.data.replay_buffers._checkpoint import io as _checkpoint_io

    storage = LazyMemmapStorage(50)
    storage.set(torch.arange(40), make_batch("tensordict", 0, 40))
    storage.dumps(tmp_path / "s")
    copies = []
    original = _checkpoint_io.copy_between_files
    monkeypatch.setattr(_checkpoint_io, "copy_between_files", lambda *a: copies.append(a[4]) or original(*a))
    monkeypatch.setattr(_checkpoint_io, "_preadv_all", None)  # any read into memory would fail
    target = LazyMemmapStorage(50, scratch_dir=tmp_path / "scratch")
    target.loads(tmp_path / "s")
    assert len(copies) == 4 and ids_of("tensordict", target.get(slice(None))).tolist() == list(range(40))


# -- components: registry --------------------------------------------------------------------------------------------
def test_registered_handler_is_found_along_the_mro(tmp_path):
    class Base:
        def __init__(self):
            self.weights = torch.zeros(3)

    class Child(Base):
        pass

    register_checkpoint_handler(
        Base,
        dump=lambda obj, ctx: ({ctx.prefix + "w": obj.weights}, {"norm": float(obj.weights.norm())}),
        load=lambda obj, doc, tensors, ctx: obj.weights.copy_(tensors[ctx.prefix + "w"]),
    )
    child = Child()
    child.weights += 2
    dump_component(child, tmp_path / "c")
    fresh = Child()
    load_component(fresh, tmp_path / "c")
    assert fresh.weights.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="class"):
        load_component(Base(), tmp_path / "c")
    with pytest.raises(TypeError, match="`dump`"):
        register_checkpoint_handler(Base, dump=3, load=print)


def test_component_without_state_dict_or_handler_is_refused_at_dumps(tmp_path):
    with pytest.raises(TypeError, match="no state_dict"):
        dump_component(object(), tmp_path / "c")
