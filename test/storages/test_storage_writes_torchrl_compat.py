"""Storage behaviours TorchRL user code relies on: partial writes (subsets of the stored keys, new keys), what a write
accepts (lists of items, lazy stacks, 2-D storages) and the refusal of a ListStorage sent to a spawned process."""

from __future__ import annotations

import pytest
import torch
from helpers.assertions import start_spawned
from tensordict import TensorDict, lazy_stack

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
)


# -- partial writes: subsets of the stored keys, new keys, an empty preallocated TensorDict ---------------------
def test_empty_preallocated_tensordict_takes_the_keys_of_the_first_write():
    storage = TensorStorage(TensorDict(batch_size=[5]))
    storage.set(torch.tensor([0, 1]), TensorDict(obs=torch.ones(2, 3), batch_size=[2]))
    got = storage.get(torch.arange(5))
    assert set(got.keys()) == {"obs"}
    assert got["obs"].shape == (5, 3)
    torch.testing.assert_close(got["obs"][:2], torch.ones(2, 3))
    torch.testing.assert_close(got["obs"][2:], torch.zeros(3, 3))  # rows not written are zero


def test_new_key_adds_an_entry_zero_in_the_other_rows():
    storage = TensorStorage(TensorDict(obs=torch.zeros(4), batch_size=[4]))
    storage.set(2, TensorDict(reward=torch.tensor(1.5), batch_size=[]))
    torch.testing.assert_close(storage.get(torch.arange(4))["reward"], torch.tensor([0.0, 0.0, 1.5, 0.0]))
    torch.testing.assert_close(storage.get(torch.arange(4))["obs"], torch.zeros(4))


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
def test_subset_of_the_keys_updates_only_those_entries(storage_cls, tmp_path):
    kwargs = {"scratch_dir": tmp_path} if storage_cls is LazyMemmapStorage else {}
    rb = TensorDictReplayBuffer(storage=storage_cls(4, **kwargs))
    rb.extend(TensorDict(a=torch.zeros(2), c=torch.full((2,), 7.0), batch_size=[2]))
    rb.storage.set(torch.arange(2), TensorDict(a=torch.ones(2), batch_size=[2]), set_cursor=False)
    torch.testing.assert_close(rb[:]["a"], torch.ones(2))
    torch.testing.assert_close(rb[:]["c"], torch.full((2,), 7.0))


def test_shared_storage_drops_keys_it_does_not_hold():
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(2), TensorDict(a=torch.zeros(2), batch_size=[2]))
    storage.share_memory_()
    storage.set(torch.arange(2), TensorDict(a=torch.ones(2), z=torch.ones(2), batch_size=[2]))
    got = storage.get(torch.arange(2))
    assert set(got.keys()) == {"a"}
    torch.testing.assert_close(got["a"], torch.ones(2))


def test_partial_write_with_a_wrong_shape_writes_nothing():
    storage = TensorStorage(TensorDict(a=torch.zeros(4), batch_size=[4]))
    with pytest.raises(ValueError, match="Nothing was written"):
        storage.set(torch.arange(2), TensorDict(a=torch.ones(2, 3), new=torch.ones(2), batch_size=[2]))
    assert set(storage.get(torch.arange(4)).keys()) == {"a"}
    torch.testing.assert_close(storage.get(torch.arange(4))["a"], torch.zeros(4))


# -- refusals TorchRL makes ---------------------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_list_storage_sent_to_a_spawned_process_names_its_type():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(torch.arange(3))
    with pytest.raises(RuntimeError, match=r"Cannot share a storage of type ListStorage between processes"):
        start_spawned(rb)
    assert rb[:].tolist() == [0, 1, 2]


# -- what extend accepts: lists of items, lazy stacks, 2-D storages -----------------------------------------------
def test_list_of_tensordicts_is_a_batch_of_items():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    index = rb.extend([TensorDict(a=torch.ones(2)), TensorDict(a=torch.zeros(2))])
    assert index.tolist() == [0, 1]
    batch = rb[:]
    assert isinstance(batch, TensorDict) and batch.batch_size == (2,)
    torch.testing.assert_close(batch["a"], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_list_of_pytrees_is_a_batch_of_items():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend([{"a": torch.ones(2), "b": (torch.tensor(1),)}, {"a": torch.zeros(2), "b": (torch.tensor(2),)}])
    batch = rb[:]
    torch.testing.assert_close(batch["a"], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert batch["b"][0].tolist() == [1, 2]
    with pytest.raises(ValueError, match="different structures"):
        rb.extend([{"a": torch.ones(2)}, {"c": torch.ones(2)}])
    assert len(rb) == 2


def test_ragged_lazy_stack_goes_to_a_list_storage_and_is_refused_by_tensor_storages():
    ragged = lazy_stack([TensorDict(a=torch.ones(2)), TensorDict(a=torch.ones(3))])
    rb = ReplayBuffer(storage=ListStorage(10))
    assert rb.extend(ragged).tolist() == [0, 1]
    assert rb[1]["a"].shape == (3,)
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(ValueError, match="ragged.*Use ListStorage"):
        rb.extend(ragged)
    assert len(rb) == 0 and rb.write_count == 0 and not rb.storage.initialized


def test_two_dim_storage_extend_and_item_assignment():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
    rb.extend(TensorDict(a=torch.zeros(3, 4), batch_size=[3, 4]))
    assert len(rb) == 12
    rb[0, 1] = TensorDict(a=torch.tensor(5.0))  # the buffer's [envs, time] layout: env 0 at step 1
    assert rb.storage.get((torch.tensor([1]), torch.tensor([0])))["a"].tolist() == [5.0]  # backing [time, envs]
    assert rb[0, 1]["a"].item() == 5.0
    assert float(rb[:]["a"].sum()) == 5.0
