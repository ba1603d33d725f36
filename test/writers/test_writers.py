"""Writers: RoundRobinWriter, TensorDictRoundRobinWriter, ImmutableDatasetWriter."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.factories import STORAGES, ids_of, make_batch, make_item, make_storage
from tensordict import TensorDict

from torchrl.data import (
    ImmutableDatasetWriter,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    Writer,
)

storages = pytest.mark.parametrize("storage", STORAGES)


def _writer_on(storage: str, cls=RoundRobinWriter, capacity: int = 5, kind: str = "tensordict"):
    writer = cls()
    writer.register_storage(make_storage(storage, capacity, kind))
    return writer


@storages
def test_round_robin_cursor_and_write_count_follow_writes(storage):
    writer = _writer_on(storage)
    assert writer.extend(make_batch("tensordict", 0, 3)).tolist() == [0, 1, 2]
    assert (writer.cursor, writer.write_count) == (3, 3)
    assert int(writer.add(make_item("tensordict", 3))) == 3
    assert writer.extend(make_batch("tensordict", 4, 3)).tolist() == [4, 0, 1]
    assert (writer.cursor, writer.write_count) == (2, 7)
    assert ids_of("tensordict", writer._storage[:] if storage != "list" else torch.stack(writer._storage[:])) \
        .tolist() == [5, 6, 2, 3, 4]


@storages
def test_extend_with_no_items_changes_nothing(storage):
    writer = _writer_on(storage, kind="tensor")
    index = writer.extend(torch.zeros(0, 3))
    assert index.numel() == 0 and index.dtype == torch.long
    assert (writer.cursor, writer.write_count, len(writer._storage)) == (0, 0, 0)


def test_extend_without_a_batch_dim_says_to_use_add():
    writer = _writer_on("lazy", kind="tensor")
    with pytest.raises(ValueError, match=r"no batch dim.*Use add\(\)"):
        writer.extend(torch.tensor(1.0))
    with pytest.raises(TypeError, match="extend\\(\\) takes a tensor"):
        writer.extend({"a": 1.0})
    assert writer.cursor == 0


@pytest.mark.parametrize("cls", [RoundRobinWriter, TensorDictRoundRobinWriter, ImmutableDatasetWriter])
def test_writer_without_storage_says_how_to_attach_one(cls):
    if cls is ImmutableDatasetWriter:
        with pytest.raises(RuntimeError, match="read-only"):
            cls().extend(torch.zeros(2))
        return
    with pytest.raises(RuntimeError, match=r"register_storage\(storage\)"):
        cls().extend(torch.zeros(2))


def test_a_refused_write_leaves_the_cursor_unchanged():
    writer = _writer_on("lazy", kind="tensor")
    writer.extend(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="Nothing was written"):
        writer.extend(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="Nothing was written"):
        writer.add(torch.zeros(4))
    assert (writer.cursor, writer.write_count, len(writer._storage)) == (2, 2, 2)


@pytest.mark.parametrize("storage", ["list", "lazy", "memmap"])
def test_tensordict_writer_stores_and_returns_the_index_entry(storage):
    writer = TensorDictRoundRobinWriter()
    writer.register_storage(make_storage(storage, 4, "tensordict"))
    td = make_batch("tensordict", 0, 3)
    writer.extend(td)
    assert td["index"].tolist() == [0, 1, 2]  # set in place: the caller sees where items went
    item = make_item("tensordict", 3)
    writer.add(item)
    assert int(item["index"]) == 3
    td = make_batch("tensordict", 4, 2)
    writer.extend(td)
    assert td["index"].tolist() == [0, 1]
    stored = writer._storage.get(list(range(4)))
    stored = torch.stack(stored) if isinstance(stored, list) else stored
    assert stored["index"].tolist() == [0, 1, 2, 3]
    assert ids_of("tensordict", stored).tolist() == [4, 5, 2, 3]


def test_tensordict_writer_passes_other_kinds_through():
    writer = TensorDictRoundRobinWriter()
    writer.register_storage(LazyTensorStorage(4))
    assert writer.extend(torch.arange(3)).tolist() == [0, 1, 2]
    assert writer._storage.get(torch.arange(3)).tolist() == [0, 1, 2]


def test_tensordict_writer_writes_cell_indices_for_ndim2():
    writer = TensorDictRoundRobinWriter()
    writer.register_storage(LazyTensorStorage(12, ndim=2))
    td = TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3])
    index = writer.extend(td)
    assert index.shape == (6, 2)
    assert td["index"].tolist() == [[0, 0, 0], [1, 1, 1]]  # the row of each cell


@pytest.mark.parametrize("method", ["add", "extend", "_empty"])
def test_immutable_writer_refuses_every_write(method):
    writer = ImmutableDatasetWriter()
    writer.register_storage(LazyTensorStorage(4))
    with pytest.raises(RuntimeError, match=r"read-only \(ImmutableDatasetWriter\).*writer=RoundRobinWriter\(\)"):
        if method == "add":
            writer.add(torch.zeros(()))
        elif method == "extend":
            writer.extend(torch.zeros(2))
        else:
            writer._empty()
    assert len(writer._storage) == 0


def test_state_dict_round_trip_restores_cursor_and_count():
    writer = _writer_on("lazy", kind="tensor")
    writer.extend(torch.zeros(7, 3))
    state = writer.state_dict()
    assert state == {"_cursor": 2, "_write_count": 7}
    fresh = RoundRobinWriter()
    fresh.load_state_dict(state)
    assert (fresh.cursor, fresh.write_count) == (2, 7)


def test_empty_resets_cursor_and_optionally_the_write_count():
    writer = _writer_on("lazy", kind="tensor")
    writer.extend(torch.zeros(3, 3))
    writer._empty(empty_write_count=False)
    assert (writer.cursor, writer.write_count) == (0, 3)
    writer._empty()
    assert (writer.cursor, writer.write_count) == (0, 0)


@pytest.mark.parametrize("share", ["before_register", "after_register", "never"])
def test_counters_are_shared_with_the_storage_and_pickled_copies_are_independent(share):
    storage = make_storage("lazy", 5, "tensor")
    if share == "before_register":
        storage.share_memory_()
    writer = RoundRobinWriter()
    ReplayBuffer(storage=storage, writer=writer)  # the storage tells its buffers when it becomes shared
    if share == "after_register":
        storage.share_memory_()
    writer.extend(torch.zeros(2, 3))
    assert writer._counters.is_shared is (share != "never")
    copy = pickle.loads(pickle.dumps(writer))
    assert (copy.cursor, copy.write_count) == (2, 2)
    copy.extend(torch.zeros(1, 3))
    assert (writer.cursor, copy.cursor) == (2, 3)


class _Recorder:
    def __init__(self):
        self.updates = []

    def mark_update(self, index):
        self.updates.append(torch.as_tensor(index).tolist())


@storages
def test_writes_notify_every_attached_entity(storage):
    writer = _writer_on(storage, capacity=4)
    recorder = _Recorder()
    writer._storage.attach(recorder)
    writer._storage.attach(recorder)  # attaching twice is a no-op
    writer.extend(make_batch("tensordict", 0, 3))
    writer.add(make_item("tensordict", 3))
    writer.extend(make_batch("tensordict", 4, 6))  # larger than the storage: only surviving rows notified
    assert recorder.updates == [[0, 1, 2], 3, [2, 3, 0, 1]]


class _RecordingSampler(RandomSampler):
    def __init__(self):
        self.calls = []

    def add(self, index):
        self.calls.append(("add", torch.as_tensor(index).tolist()))

    def extend(self, index):
        self.calls.append(("extend", torch.as_tensor(index).tolist()))

    def mark_update(self, index, *, storage=None):
        self.calls.append(("mark_update", torch.as_tensor(index).tolist()))


def test_buffer_forwards_writes_to_its_sampler():
    sampler = _RecordingSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=sampler)
    rb.extend(torch.arange(2))
    rb.add(torch.tensor(5))
    assert sampler.calls == [("mark_update", [0, 1]), ("extend", [0, 1]), ("mark_update", 2), ("add", 2)]


def test_writer_base_class_is_abstract():
    with pytest.raises(TypeError):
        Writer()
