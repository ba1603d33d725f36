"""Tensor storages behave as TorchRL's do (facts §2, §7, §8 of the behaviour reference) and never hand out
uninitialised memory or half-done writes (issue 29, items 2, 6 and 7)."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, lazy_stack, tensorclass

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
)
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer

LAZY = [LazyTensorStorage, LazyMemmapStorage]


@tensorclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


def _snapshot(storage):
    """The content and counters of a storage, to compare before and after a refused call."""
    content = storage.get(slice(None)) if len(storage) else None
    if isinstance(content, TensorDict):
        content = content.clone().to_dict()
    elif isinstance(content, torch.Tensor):
        content = content.clone()
    keys = sorted(map(str, storage._storage.keys(True, True))) if storage._storage is not None else None
    return len(storage), storage.last_written_row, keys, content


def _assert_same(a, b):
    assert a[:3] == b[:3]
    if isinstance(a[3], dict):
        assert a[3].keys() == b[3].keys()
        for k in a[3]:
            torch.testing.assert_close(a[3][k], b[3][k])
    elif a[3] is not None:
        assert torch.equal(a[3], b[3])


# -- §2 / §9: errors of construction and of lists -------------------------------------------------------------
def test_tensor_storage_of_none_names_the_lazy_alternative():
    with pytest.raises(ValueError, match="Expected storage to be non-null") as err:
        TensorStorage(None)
    assert "LazyTensorStorage(max_size)" in str(err.value)


def test_max_size_that_differs_from_the_preallocated_rows():
    with pytest.raises(ValueError, match="The max-size and the storage shape mismatch") as err:
        TensorStorage(torch.randn(3), max_size=4)
    assert "max_size=4" in str(err.value) and "3 rows" in str(err.value)


@pytest.mark.parametrize(
    "items",
    [
        [torch.zeros(3), torch.zeros(4)],
        [TensorDict(a=torch.zeros(3)), TensorDict(a=torch.zeros(2))],
        [{"a": torch.zeros(2)}, {"b": torch.zeros(2)}],
        [(torch.zeros(2),), (torch.zeros(3),)],
    ],
    ids=["tensors", "tensordicts", "dict-structures", "tuple-shapes"],
)
def test_unstackable_list_is_a_runtime_error_and_writes_nothing(items):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend([items[0], items[0]])
    before = _snapshot(rb.storage) if not isinstance(items[0], (dict, tuple)) else len(rb)
    with pytest.raises(RuntimeError, match="Stacking the elements of the list resulted in an error") as err:
        rb.extend(items)
    assert isinstance(err.value, ValueError)  # our precise type, too
    if isinstance(before, tuple):
        _assert_same(_snapshot(rb.storage), before)
    else:
        assert len(rb) == before


# -- §2: items keep their own batch dims ----------------------------------------------------------------------
@pytest.mark.parametrize("storage_cls", LAZY)
def test_tensordict_items_with_batch_dims_keep_them(storage_cls):
    storage = storage_cls(10)
    storage.set(torch.arange(3), TensorDict(a=torch.randn(3, 4, 2), batch_size=[3, 4]))
    assert storage.shape == torch.Size([10]) and storage._storage.batch_size == torch.Size([10, 4])
    out = storage.get(torch.tensor([2, 0]))
    assert out.batch_size == torch.Size([2, 4]) and out["a"].shape == (2, 4, 2)
    assert len(storage) == 3


def test_tensorclass_items_with_batch_dims_keep_them():
    storage = LazyTensorStorage(5)
    storage.set(torch.arange(2), Pair(x=torch.ones(2, 4), y=torch.zeros(2, 4, 3), batch_size=[2, 4]))
    out = storage.get(torch.tensor([1, 0, 1]))
    assert isinstance(out, Pair) and out.batch_size == torch.Size([3, 4]) and out.y.shape == (3, 4, 3)


def test_a_list_of_one_batched_tensordict_is_one_item():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend([TensorDict({"a": torch.randn(2, 3)}, [2])])
    assert len(rb) == 1 and rb[:].shape == torch.Size([1, 2])


# -- §2: lazy stacks whose members differ along an inner dim --------------------------------------------------
def _ragged_inner():
    return lazy_stack(
        [
            TensorDict(a=torch.zeros(5, 4, 8), batch_size=[5]),
            TensorDict(a=torch.ones(5, 3, 8), batch_size=[5]),
        ],
        dim=1,
    )


@pytest.mark.parametrize("storage_cls", LAZY)
def test_lazy_stack_ragged_along_an_inner_dim_is_stored_and_sampled(storage_cls):
    rb = ReplayBuffer(storage=storage_cls(6), batch_size=3)
    rb.extend(_ragged_inner())
    assert len(rb) == 5
    sample = rb.sample(3)
    assert isinstance(sample, LazyStackedTensorDict) and sample.batch_size == torch.Size([3, 2])
    first, second = sample.get("a", as_list=True)
    assert first.shape == (3, 4, 8) and second.shape == (3, 3, 8)
    assert (first == 0).all() and (second == 1).all()
    item = rb[4]
    assert item.batch_size == torch.Size([2]) and item.get("a", as_list=True)[1].shape == (3, 8)


@pytest.mark.parametrize("storage_cls", LAZY)
def test_a_write_of_other_member_shapes_is_refused_before_anything_is_written(storage_cls):
    storage = storage_cls(6)
    storage.set(torch.arange(5), _ragged_inner())
    before = [m["a"].clone() for m in storage._storage.tensordicts]
    wrong = lazy_stack(
        [
            TensorDict(a=torch.zeros(2, 4, 8), batch_size=[2]),
            TensorDict(a=torch.ones(2, 4, 8), batch_size=[2]),
        ],
        dim=1,
    )
    with pytest.raises(ValueError, match=r"member 1.*\[2, 4, 8\].*expects \[2, 3, 8\].*Nothing was written"):
        storage.set(torch.tensor([0, 5]), wrong)
    assert len(storage) == 5
    for member, old in zip(storage._storage.tensordicts, before):
        assert torch.equal(member["a"], old)


# -- §2: an uninitialised ndim=2 storage written with set_cursor=False -----------------------------------------
@pytest.mark.parametrize("storage_cls", LAZY)
def test_set_cursor_false_initialises_and_only_skips_the_bookkeeping(storage_cls):
    n_steps, envs = 10, 4
    td = TensorDict(obs=torch.arange(100 * n_steps).reshape(100, n_steps), batch_size=[100, n_steps])
    storage = storage_cls(1000, ndim=2)
    storage.set(0, td[0], set_cursor=False)
    assert storage.initialized and storage.shape == torch.Size([100, n_steps])
    assert len(storage) == 0 and storage.last_written_row == -1  # no length or cursor bookkeeping
    assert torch.equal(storage[0]["obs"], td[0]["obs"])
    storage.set(slice(0, 100), td[:100], set_cursor=False)
    assert len(storage) == 0 and torch.equal(storage[99]["obs"], td[99]["obs"])
    members = [TensorDict(obs=torch.full((envs,), -t), batch_size=[envs]) for t in range(n_steps)]
    storage.set(torch.tensor([0, 1, 2, 3]), lazy_stack(members, dim=1))
    assert len(storage) == 4 * n_steps and storage.last_written_row == 3
    for i in range(4):
        assert storage[i]["obs"].tolist() == [-t for t in range(n_steps)]
    assert torch.equal(storage[50]["obs"], td[50]["obs"])  # a row written with set_cursor=False reads back


def test_item_assignment_still_refuses_rows_that_hold_no_data():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(3), torch.arange(3))
    with pytest.raises(IndexError, match="out of range"):
        storage[5] = torch.tensor(9)
    storage.set(5, torch.tensor(9), set_cursor=False)  # set() may write any allocated row
    assert len(storage) == 3 and storage[5].item() == 9


# -- §2: rb[i, j] on an ndim=2 buffer is [envs, time] ---------------------------------------------------------
@pytest.mark.parametrize("storage_cls", LAZY)
def test_two_dim_buffer_indexing_uses_the_envs_time_layout(storage_cls):
    envs, steps = 2, 50
    rb = TensorDictReplayBuffer(storage=storage_cls(200, ndim=2), batch_size=4)
    data = TensorDict(obs=torch.arange(envs * steps).reshape(envs, steps).float(), batch_size=[envs, steps])
    rb.extend(data)
    assert len(rb) == 100 and rb.writer._cursor == 50
    assert torch.equal(rb[0, 3:4]["obs"], data[0, 3:4]["obs"])
    assert torch.equal(rb[:, 7:8]["obs"], data[:, 7:8]["obs"]) and rb[:, 7:8].batch_size == torch.Size([2, 1])
    assert rb[1, 5]["obs"].item() == data[1, 5]["obs"].item()
    td = TensorDict(obs=torch.tensor(-1.0))
    rb[0, 3:4] = td.expand(1)
    rb[:, 7:8] = td.expand(2, 1)
    rb[:, 10:20] = TensorDict(obs=torch.tensor(-2.0))  # broadcast over envs and steps
    backing = rb.storage[:]["obs"]  # [time, envs]
    assert backing[3].tolist() == [-1.0, 53.0]
    assert (backing[7] == -1).all() and (backing[10:20] == -2).all() and backing[20].tolist() == [20.0, 70.0]
    assert len(rb) == 100 and rb.writer._cursor == 50


# -- §7: checkpoints and state dicts --------------------------------------------------------------------------
@pytest.mark.parametrize("storage_cls", LAZY)
@pytest.mark.parametrize("data", [torch.arange(4.0), {"a": torch.arange(4.0)}], ids=["tensor", "pytree"])
def test_checkpointer_loads_of_tensor_data_need_an_initialised_storage(storage_cls, data, tmp_path):
    source = storage_cls(4)
    source.set(range(4), data)
    source.dumps(tmp_path / "s")
    target = storage_cls(4)
    with pytest.raises(RuntimeError, match="Cannot fill a non-initialized pytree-based TensorStorage"):
        TensorStorageCheckpointer().loads(target, tmp_path / "s")
    assert not target.initialized
    with pytest.raises(RuntimeError, match="Cannot fill a non-initialized pytree-based TensorStorage"):
        target.loads(tmp_path / "s")
    target.set(0, data[0] if isinstance(data, torch.Tensor) else {"a": data["a"][0]})
    target.loads(tmp_path / "s")
    assert len(target) == 4


@pytest.mark.parametrize("storage_cls", LAZY)
def test_checkpointer_loads_of_tensordicts_into_a_fresh_storage(storage_cls, tmp_path):
    source = storage_cls(4)
    source.set(range(4), TensorDict(a=torch.arange(4.0), batch_size=[4]))
    source.dumps(tmp_path / "s")
    target = storage_cls(4)
    TensorStorageCheckpointer().loads(target, tmp_path / "s")
    assert target[:]["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_whole_buffer_checkpoint_of_tensors_loads_into_a_fresh_buffer(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(torch.arange(4.0))
    rb.dumps(tmp_path / "rb")
    fresh = ReplayBuffer(storage=LazyTensorStorage(4))
    fresh.loads(tmp_path / "rb")
    assert fresh[:].tolist() == [0.0, 1.0, 2.0, 3.0]


def _local_tensorclass():
    @tensorclass
    class Local:
        x: torch.Tensor

    return Local


@pytest.mark.parametrize("storage_cls", LAZY)
def test_a_tensorclass_defined_in_a_function_round_trips(storage_cls, tmp_path):
    Local = _local_tensorclass()
    data = Local(x=torch.arange(6.0), batch_size=[6])
    source = storage_cls(6)
    source.set(range(6), data)
    source.dumps(tmp_path / "s")
    initialised = storage_cls(6)
    initialised.set(range(6), Local(x=torch.zeros(6), batch_size=[6]))
    initialised.loads(tmp_path / "s")  # copied into the existing backing, the class kept
    assert isinstance(initialised[0], Local) and initialised[:].x.tolist() == data.x.tolist()
    fresh = storage_cls(6)
    with pytest.warns(UserWarning, match="cannot import.*as TensorDicts"):
        fresh.loads(tmp_path / "s")
    assert fresh[:]["x"].tolist() == data.x.tolist()


def test_a_tensorclass_defined_in_a_function_loads_its_state_dict():
    Local = _local_tensorclass()
    data = Local(x=torch.arange(5.0), batch_size=[5])
    source = LazyTensorStorage(5)
    source.set(range(5), data)
    state = source.state_dict()
    target = TensorStorage(torch.zeros_like(data))
    target.load_state_dict(state)
    assert isinstance(target[0], Local) and target[:].x.tolist() == data.x.tolist()


def test_state_dict_of_a_pytree_storage_is_refused():
    storage = TensorStorage({"a": torch.zeros(4), "b": (torch.ones(4), torch.ones(4, 2))})
    with pytest.raises(TypeError, match="are not supported by") as err:
        storage.state_dict()
    assert "TensorStorage.state_dict()" in str(err.value) and "dumps" in str(err.value)
    assert TensorStorage(torch.zeros(4)).state_dict()["_len"] == 4  # tensors have one


# -- §8: shared_init on a non-CPU device ----------------------------------------------------------------------
def test_shared_init_on_a_meta_device_warns_at_the_first_write_and_falls_back_to_cpu():
    storage = LazyTensorStorage(8, device="meta", shared_init=True)
    rb = ReplayBuffer(storage=storage, batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ReplayBuffer(storage=LazyTensorStorage(8, device="meta", shared_init=True))  # no warning yet
    with pytest.warns(UserWarning, match="cannot be honored"):
        rb.extend(torch.arange(4))
    assert storage.device == torch.device("cpu") and rb.sample().device.type == "cpu"


# -- issue 29 item 2: never-written cells read as zero --------------------------------------------------------
def _dirty_the_allocator():
    """Frees blocks full of non-zero bytes, so that uninitialised memory handed out next is likely not zero."""
    blocks = [torch.full((n,), 7.0) for n in (5, 8, 16, 64, 256) for _ in range(8)]
    del blocks
    gc.collect()


def _shared_lazy(n):
    return LazyTensorStorage(n).share_memory_()


@pytest.mark.parametrize(
    "make", [LazyTensorStorage, LazyMemmapStorage, _shared_lazy], ids=["lazy", "memmap", "shared"]
)
def test_cells_no_write_reached_read_as_zero(make):
    _dirty_the_allocator()
    storage = make(5)
    storage.set(torch.arange(2), TensorDict(obs=torch.ones(2), act=torch.full((2, 3), 2), batch_size=[2]))
    storage.set(torch.arange(2, 5), TensorDict(obs=torch.ones(3), batch_size=[3]))  # lacks "act"
    assert storage[:]["act"][2:].tolist() == [[0, 0, 0]] * 3
    _dirty_the_allocator()
    skipped = make(8)
    skipped.set(torch.tensor([6]), torch.full((1, 4), 3.0))  # rows 0-5 are counted, never written
    assert (skipped[:6] == 0).all() and len(skipped) == 7


# -- issue 29 item 6: the reserved string key -----------------------------------------------------------------
@pytest.mark.parametrize("storage_cls", LAZY)
def test_an_entry_named_like_the_reserved_string_key_is_refused_before_writing(storage_cls):
    storage = storage_cls(10)
    storage.set(torch.arange(2), TensorDict(a=torch.ones(2), batch_size=[2]))
    before = _snapshot(storage)
    bad = TensorDict(a=torch.full((2,), 5.0), _utf8=torch.ones(2), batch_size=[2])
    for write in (lambda: storage.set(torch.arange(2), bad), lambda: storage.set(torch.arange(2, 4), bad)):
        with pytest.raises(ValueError, match=r"'_utf8'.*reserve.*Rename.*Nothing was written"):
            write()
        _assert_same(_snapshot(storage), before)
    with pytest.raises(ValueError, match="'_utf8'"):
        LazyTensorStorage(10).set(0, {"_utf8": torch.ones(2)})
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(ValueError, match="'_utf8'"):
        rb.extend(TensorDict(_utf8=torch.ones(3), batch_size=[3]))
    assert len(rb) == 0 and not rb.storage.initialized


# -- issue 29 item 7: boolean masks and capacities ------------------------------------------------------------
@pytest.mark.parametrize("storage_cls", LAZY)
def test_a_boolean_mask_of_another_length_is_refused(storage_cls):
    storage = storage_cls(20)
    storage.set(torch.arange(20), torch.arange(20))
    with pytest.raises(IndexError, match=r"mask of shape \[5\].*20 rows.*length 20"):
        storage.get(torch.tensor([True, False, True, False, True]))
    before = storage[:].clone()
    with pytest.raises(IndexError, match=r"mask of shape \[5\]"):
        storage.set(torch.tensor([True] * 5), torch.zeros(5, dtype=torch.long))
    assert torch.equal(storage[:], before)
    mask = torch.zeros(20, dtype=torch.bool)
    mask[[1, 3]] = True
    assert storage.get(mask).tolist() == [1, 3]


def test_a_mask_over_the_filled_rows_or_the_capacity_is_accepted():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), torch.arange(4))
    assert storage.get(torch.tensor([False, True, False, True])).tolist() == [1, 3]
    assert storage.get(torch.arange(10) == 2).tolist() == [2]


@pytest.mark.parametrize("storage_cls", [*LAZY, TensorStorage])
def test_a_max_size_no_index_can_reach_is_refused_at_construction(storage_cls):
    with pytest.raises(ValueError, match=r"`max_size`=100000000000000000000.*2\*\*63 - 1"):
        storage_cls(None, max_size=10**20) if storage_cls is TensorStorage else storage_cls(10**20)


def test_items_that_are_ragged_lazy_stacks_round_trip_their_state_dict_and_refuse_dumps(tmp_path):
    storage = LazyTensorStorage(6)
    storage.set(torch.arange(5), _ragged_inner())
    restored = LazyTensorStorage(6)
    restored.load_state_dict(storage.state_dict())
    assert len(restored) == 5 and restored[4].get("a", as_list=True)[1].shape == (3, 8)
    with pytest.raises(TypeError, match="lazy stacks whose members differ in shape.*LazyStackStorage"):
        storage.dumps(tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_a_ragged_lazy_stack_into_a_dense_storage_is_refused_clearly():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict(a=torch.zeros(5, 2, 4, 8), batch_size=[5, 2]))
    with pytest.raises(ValueError, match="members differ in shape.*LazyStackStorage"):
        rb.extend(_ragged_inner())
    assert len(rb) == 5
