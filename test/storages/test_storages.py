"""Storages on their own: ListStorage, TensorStorage, LazyTensorStorage, LazyMemmapStorage."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch
from helpers.factories import (
    KINDS,
    STORAGES,
    TENSOR_STORAGES,
    filled_storage,
    ids_of,
    make_batch,
    make_item,
    make_storage,
)
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, ReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.storages._index import as_index_tensor

kinds = pytest.mark.parametrize("kind", KINDS)
storages = pytest.mark.parametrize("storage", STORAGES)
tensor_storages = pytest.mark.parametrize("storage", TENSOR_STORAGES)


def _collated(kind, out):
    """ListStorage returns a list of items for batch reads; stack it like the buffer's collate does."""
    from torchrl.data import tensordict_collate

    return tensordict_collate(out) if isinstance(out, list) else out


# -- reads and writes ---------------------------------------------------------------------------------------


@kinds
@storages
def test_set_then_get_round_trips_every_kind(storage, kind):
    s = filled_storage(storage, kind)
    assert len(s) == 6
    assert ids_of(kind, _collated(kind, s.get(torch.tensor([4, 1, 1])))).tolist() == [4, 1, 1]
    assert ids_of(kind, s.get(2)).item() == 2
    assert ids_of(kind, s[-1]).item() == 5
    s.set(6, make_item(kind, 66))
    assert len(s) == 7 and ids_of(kind, s[6]).item() == 66


@storages
@pytest.mark.parametrize(
    "index,expected",
    [
        (3, [3]),
        (np.int64(3), [3]),
        (torch.tensor(3), [3]),
        (-2, [4]),
        (slice(1, 4), [1, 2, 3]),
        (slice(None, None, 2), [0, 2, 4]),
        ([5, 0], [5, 0]),
        (np.array([1, 2]), [1, 2]),
        (torch.tensor([0, 5, -1]), [0, 5, 5]),
        (torch.tensor([True, False, True, False, False, True]), [0, 2, 5]),
        (range(2, 4), [2, 3]),
        ((torch.tensor([1, 2]),), [1, 2]),
    ],
)
def test_get_accepts_every_index_type(storage, index, expected):
    s = filled_storage(storage, "tensor")
    out = s.get(index)
    ids = ids_of("tensor", _collated("tensor", out)).reshape(-1)
    assert ids.tolist() == expected


@storages
def test_iter_contains_and_len(storage):
    s = filled_storage(storage, "tensordict", n=4)
    assert [ids_of("tensordict", item).item() for item in s] == [0, 1, 2, 3]
    assert 3 in s and -4 in s
    assert 4 not in s and -5 not in s
    assert torch.tensor([0, 3]) in s
    assert torch.tensor([0, 4]) not in s


@tensor_storages
def test_tensor_storages_gather_batches_as_one_tensor(storage):
    s = filled_storage(storage, "tensordict")
    out = s.get(torch.tensor([1, 3]))
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([2])
    assert s.get(torch.tensor([], dtype=torch.long)).batch_size == torch.Size([0])


def test_list_storage_holds_items_of_different_shapes():
    s = ListStorage(5)
    s.set(0, torch.zeros(2))
    s.set([1, 2], [torch.ones(3), "any object"])
    assert s.get(1).shape == (3,) and s.get(2) == "any object"
    assert s.get([0, 2])[1] == "any object"
    assert ListStorage().max_size == torch.iinfo(torch.int64).max


@tensor_storages
def test_uint8_frames_round_trip(storage):
    frames = torch.randint(0, 255, (8, 3, 12, 12), dtype=torch.uint8)
    s = make_storage(storage, 8, "tensor") if storage != "tensor" else TensorStorage(torch.zeros_like(frames))
    s.set(torch.arange(8), frames)
    idx = torch.tensor([7, 0, 3])
    assert torch.equal(s.get(idx), frames.index_select(0, idx))
    assert s.get(idx).dtype == torch.uint8


@tensor_storages
def test_empty_keeps_allocation_and_resets_length(storage):
    s = filled_storage(storage, "tensordict")
    s._empty()
    assert len(s) == 0
    with pytest.raises(IndexError, match="out of range"):
        s.get(0)
    s.set(torch.arange(2), make_batch("tensordict", 10, 2))
    assert ids_of("tensordict", s[:]).tolist() == [10, 11]


def test_counters_are_shared_exactly_when_the_content_is_and_state_dict_holds_plain_values():
    s = filled_storage("lazy", "tensor")
    assert not s.is_shared and not s._counters.is_shared
    s.share_memory_()
    assert s.is_shared and s._counters.is_shared and s._storage.is_shared()
    assert filled_storage("memmap", "tensor").is_shared
    state = s.state_dict()
    assert isinstance(state["_len"], int) and state["_len"] == 6
    assert isinstance(state["_last_row"], int) and state["_last_row"] == 5


@kinds
@storages
def test_storage_state_dict_round_trip_into_a_fresh_storage(storage, kind):
    s = filled_storage(storage, kind)
    if kind in ("dict", "tuple") and storage != "list":  # TorchRL's rule: pytree contents have no state dict
        with pytest.raises(TypeError, match="are not supported by"):
            s.state_dict()
        return
    fresh = make_storage(storage, 10, kind)
    fresh.load_state_dict(s.state_dict())
    assert len(fresh) == 6
    assert ids_of(kind, _collated(kind, fresh.get(list(range(6))))).tolist() == list(range(6))
    fresh.set(0, make_item(kind, 77))  # the copy is independent
    assert ids_of(kind, s[0]).item() == 0


def test_load_state_dict_of_another_layout_is_refused():
    s = filled_storage("lazy", "tensordict")
    other = LazyTensorStorage(10)
    other.set(torch.arange(2), TensorDict(x=torch.zeros(2), batch_size=[2]))
    before = other.get(torch.arange(2))["x"].clone()
    with pytest.raises(ValueError, match="state to load holds keys"):
        other.load_state_dict(s.state_dict())
    assert torch.equal(other.get(torch.arange(2))["x"], before) and len(other) == 2


# -- preallocated TensorStorage -----------------------------------------------------------------------------


def test_tensor_storage_infers_max_size_and_checks_a_given_one():
    backing = TensorDict(obs=torch.zeros(10, 3), batch_size=[10])
    assert TensorStorage(backing).max_size == 10
    assert TensorStorage(backing, max_size=10).max_size == 10
    with pytest.raises(ValueError, match=r"max_size=6 but the storage holds 10 rows.*Pass max_size=10"):
        TensorStorage(backing, max_size=6)
    with pytest.raises(ValueError, match=r"storage=None.*LazyTensorStorage\(max_size\)"):
        TensorStorage(None)


def test_preallocated_tensor_storage_counts_its_data():
    data = TensorDict(obs=torch.arange(10.0), batch_size=[10])
    s = TensorStorage(data)
    assert len(s) == 10
    assert torch.equal(s.get(torch.tensor([9]))["obs"], torch.tensor([9.0]))


# -- ndim > 1 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LazyTensorStorage, LazyMemmapStorage])
def test_ndim2_storage_counts_cells_and_reads_per_dim_indices(cls):
    s = cls(20, ndim=2)
    assert s.max_size == 20
    with pytest.raises(RuntimeError, match="no shape before it is initialized"):
        _ = s.shape
    data = torch.arange(12).reshape(3, 4)  # 3 rows of 4 envs
    s.set(torch.arange(3), data)
    assert tuple(s.shape) == (5, 4) and len(s) == 12 and s.rows_written() == 3
    rows, envs = torch.tensor([0, 2, 1]), torch.tensor([3, 0, 1])
    assert s.get((rows, envs)).tolist() == [3, 8, 5]
    assert s.get(1).tolist() == [4, 5, 6, 7]
    flat = s.flatten()
    assert len(flat) == 12 and flat.get(torch.tensor([11, 0])).tolist() == [11, 0]
    with pytest.raises(IndexError, match="out of range"):
        s.get((torch.tensor([3]), torch.tensor([0])))


def test_ndim2_lazy_storage_rounds_rows_up_like_torchrl():
    s = LazyTensorStorage(100, ndim=2)
    s.set(torch.arange(2), torch.zeros(2, 3))
    assert tuple(s.shape) == (34, 3) and s.max_size == 102


def test_flatten_of_an_uninitialized_ndim2_storage_says_to_write_first():
    with pytest.raises(RuntimeError, match="write data first"):
        LazyTensorStorage(10, ndim=2).flatten()


# -- LazyMemmapStorage files --------------------------------------------------------------------------------


def test_memmap_storage_writes_into_scratch_dir(tmp_path):
    s = LazyMemmapStorage(10, scratch_dir=tmp_path / "rb")
    s.set(torch.arange(3), make_batch("tensordict", 0, 3))
    assert s.memmap_dir == str(tmp_path / "rb")
    files = {f for _, _, names in os.walk(tmp_path / "rb") for f in names}
    assert any(f.endswith(".memmap") for f in files)
    assert ids_of("tensordict", s[:]).tolist() == [0, 1, 2]


def test_memmap_existsok_false_refuses_existing_files_and_changes_nothing(tmp_path):
    (tmp_path / "old.txt").write_text("keep me")
    s = LazyMemmapStorage(10, scratch_dir=tmp_path)
    with pytest.raises(FileExistsError, match=r"`scratch_dir`.*existsok=True"):
        s.set(torch.arange(2), torch.zeros(2))
    assert os.listdir(tmp_path) == ["old.txt"] and (tmp_path / "old.txt").read_text() == "keep me"
    assert len(s) == 0 and not s.initialized


def test_memmap_existsok_true_reuses_a_directory(tmp_path):
    first = LazyMemmapStorage(10, scratch_dir=tmp_path)
    first.set(torch.arange(2), torch.ones(2))
    second = LazyMemmapStorage(10, scratch_dir=tmp_path, existsok=True)
    second.set(torch.arange(3), torch.full((3,), 2.0))
    assert second.get(torch.arange(3)).tolist() == [2.0, 2.0, 2.0]


def test_memmap_temporary_dir_is_removed_with_the_storage():
    s = LazyMemmapStorage(10)
    assert s.memmap_dir is None
    s.set(torch.arange(2), torch.ones(2))
    path = s.memmap_dir
    assert os.path.isdir(path)
    del s
    gc.collect()
    assert not os.path.exists(path)


@pytest.mark.parametrize("device", ["meta", "cuda", torch.device("meta")])
def test_memmap_storage_refuses_non_cpu_devices(device):
    with pytest.raises(ValueError, match=r"`device` must be 'cpu'.*LazyTensorStorage\(device="):
        LazyMemmapStorage(10, device=device)


def test_memmap_storage_auto_device_means_cpu():
    assert LazyMemmapStorage(10, device="auto").device == torch.device("cpu")


# -- bad arguments ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ListStorage, LazyTensorStorage, LazyMemmapStorage])
@pytest.mark.parametrize("max_size", [0, -5])
def test_non_positive_max_size_is_refused(cls, max_size):
    with pytest.raises(ValueError, match=rf"`max_size` must be a positive int, got {max_size}"):
        cls(max_size)


@pytest.mark.parametrize("cls", [ListStorage, LazyTensorStorage, LazyMemmapStorage])
@pytest.mark.parametrize("max_size", [2.5, "10", True])
def test_non_int_max_size_is_a_type_error(cls, max_size):
    with pytest.raises(TypeError, match=r"`max_size` must be a positive int"):
        cls(max_size)


@pytest.mark.parametrize("ndim", [0, -1, 1.5, True])
def test_ndim_below_one_is_refused(ndim):
    for build in (
        lambda: LazyTensorStorage(10, ndim=ndim),
        lambda: LazyMemmapStorage(10, ndim=ndim),
        lambda: TensorStorage(torch.zeros(4, 2), ndim=ndim),
    ):
        with pytest.raises(ValueError, match=r"`ndim` must be a positive int"):
            build()


@pytest.mark.parametrize("cls", [LazyTensorStorage, LazyMemmapStorage])
def test_reading_an_uninitialized_storage_says_to_write_first(cls):
    with pytest.raises(RuntimeError, match=r"uninitialized storage: write data first"):
        cls(10).get(0)


@storages
def test_out_of_range_reads_name_the_valid_positions(storage):
    s = filled_storage(storage, "tensor", n=4)
    for index in (4, -5, torch.tensor([1, 4]), [-5]):
        with pytest.raises(IndexError, match=r"out of range.*0\.\.3"):
            s.get(index)


@storages
def test_float_indices_are_a_type_error(storage):
    s = filled_storage(storage, "tensor", n=4)
    with pytest.raises(TypeError, match="must be integers"):
        s.get(torch.tensor([0.5]))


@storages
def test_writes_out_of_range_change_nothing(storage):
    s = filled_storage(storage, "tensor", n=4, capacity=6)
    before = ids_of("tensor", _collated("tensor", s.get(list(range(4))))).tolist()
    with pytest.raises(IndexError):
        s.set(torch.tensor([1, 6]), make_batch("tensor", 40, 2))
    assert len(s) == 4
    assert ids_of("tensor", _collated("tensor", s.get(list(range(4))))).tolist() == before


@pytest.mark.parametrize("data", [TensorDict(obs=torch.zeros(2, 3), batch_size=[2]), "text", 3.0])
def test_writing_another_kind_into_a_tensor_storage_is_a_type_error(data):
    s = filled_storage("lazy", "tensor")
    with pytest.raises(TypeError, match="holds tensors"):
        s.set(torch.arange(2), data)
    assert len(s) == 6


@pytest.mark.parametrize("data", ["text", {"a": 1.0}])
def test_lazy_storage_refuses_non_tensor_data_at_first_write(data):
    s = LazyTensorStorage(10)
    with pytest.raises(TypeError, match=r"(tensors, TensorDicts, tensorclasses or pytrees|must be a tensor)"):
        s.set(0, data)
    assert not s.initialized


# -- what readers other than get() use (slice samplers) ---------------------------------------------------------
@storages
def test_ring_layout_accessors_follow_writes(storage):
    s = make_storage(storage, 4, "tensordict")
    revision = s.write_revision
    s.set(torch.arange(3), make_batch("tensordict", 0, 3))
    assert s.rows_written() == 3 and s.last_written_row == 2
    s.set(torch.tensor([3, 0]), make_batch("tensordict", 3, 2))  # wraps: row 0 is now the newest
    assert s.rows_written() == 4
    if storage == "list":  # keeps no write position nor revision
        assert s.last_written_row == 3 and s.write_revision is None
    else:
        assert s.last_written_row == 0 and s.write_revision != revision


@tensor_storages
def test_get_entry_is_a_view_of_one_entry_or_none(storage):
    s = filled_storage(storage, "tensordict", n=4)
    column = s.get_entry(("next", "obs"))
    assert column.shape[0] == 10  # every row of the backing; rows from rows_written() on hold no data
    assert torch.equal(column[:4, 0], torch.arange(4.0) + 0.5)
    assert s.get_entry("missing") is None and s.get_entry(("next", "missing")) is None
    assert filled_storage(storage, "tensor").get_entry("obs") is None  # plain tensors hold no entries
    assert LazyTensorStorage(3).get_entry("obs") is None  # nothing written yet


def test_advise_huge_pages_only_on_private_cpu_memory_and_keeps_the_content():
    data = TensorDict(obs=torch.randn(4096, 300), nested=TensorDict(x=torch.arange(4096), batch_size=[4096]),
                      batch_size=[4096])  # fmt: skip
    assert LazyTensorStorage(4096).advise_huge_pages() is False  # nothing allocated yet
    private = LazyTensorStorage(4096)
    private.set(torch.arange(4096), data)
    assert private.advise_huge_pages() is True
    assert (private.get(torch.arange(4096)) == data).all()
    private.set(torch.arange(10), data[:10] + 1)  # writes after the advice land as before
    assert torch.equal(private.get(torch.arange(10))["obs"], data["obs"][:10] + 1)
    shared = LazyTensorStorage(16).share_memory_()
    shared.set(torch.arange(4), data[:4])
    memmap = LazyMemmapStorage(16)
    memmap.set(torch.arange(4), data[:4])
    assert shared.advise_huge_pages() is False and memmap.advise_huge_pages() is False


# -- an empty index selects nothing --------------------------------------------------------------------------------
# ListStorage and the tensor storages return an empty batch for it. ``np.asarray([])`` is float64; storages
# read an empty Python list (or tuple of nothing, or nested empty list) as an empty int64 index, as numpy does
# for ``array[[]]``, instead of refusing "a float64 index".
EMPTY = {
    "list": [],
    "nested-list": [[]],
    "long-tensor": torch.zeros(0, dtype=torch.long),
    "range": range(0),
    "int-ndarray": np.zeros(0, dtype=np.int64),
}

EMPTY_INDEX_STORAGES = {
    "list": lambda: ListStorage(10),
    "lazy": lambda: LazyTensorStorage(10),
    "memmap": lambda: LazyMemmapStorage(10),
    "tensor": lambda: TensorStorage(TensorDict(obs=torch.zeros(10, 2), batch_size=[10])),
}


def _filled_with_three(name: str):
    storage = EMPTY_INDEX_STORAGES[name]()
    storage.set(torch.arange(3), TensorDict(obs=torch.arange(6.0).view(3, 2), batch_size=[3]))
    return storage


@pytest.mark.parametrize("index", list(EMPTY.values()), ids=list(EMPTY))
def test_an_empty_index_is_a_long_tensor(index):
    out = as_index_tensor(index)
    assert out.dtype == torch.long and out.shape == (0,)


@pytest.mark.parametrize("index", [np.zeros(0), torch.zeros(0)], ids=["float-ndarray", "float-tensor"])
def test_an_explicitly_float_empty_index_is_still_refused(index):
    with pytest.raises(TypeError, match="indices must be integers"):
        as_index_tensor(index)


@pytest.mark.parametrize("index", list(EMPTY.values()), ids=list(EMPTY))
@pytest.mark.parametrize("name", sorted(EMPTY_INDEX_STORAGES))
def test_storages_return_an_empty_batch(name, index):
    storage = _filled_with_three(name)
    got = storage.get(index)
    if name == "list":
        assert got == []
    else:
        assert got.batch_size == (0,) and got["obs"].shape == (0, 2)


@pytest.mark.parametrize("name", sorted(EMPTY_INDEX_STORAGES))
def test_an_empty_list_reads_like_an_empty_long_tensor(name):
    storage = _filled_with_three(name)
    by_list, by_tensor = storage.get([]), storage.get(torch.zeros(0, dtype=torch.long))
    if name == "list":
        assert by_list == by_tensor == []
    else:
        assert by_list.batch_size == by_tensor.batch_size and set(by_list.keys()) == set(by_tensor.keys())


def test_list_storage_write_of_nothing_changes_nothing():
    storage = _filled_with_three("list")
    storage.set([], [])
    assert len(storage) == 3


def test_buffer_index_read_with_an_empty_list():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(torch.arange(5))
    assert rb[[]].shape == (0,)
