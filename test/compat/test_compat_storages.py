"""Storage behaviours TorchRL user code relies on (issue 12, "Behaviours that differ today")."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest
import torch
from tensordict import TensorDict, lazy_stack

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictMaxValueWriter,
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
def _start_spawned(obj):
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=len, args=(obj,), daemon=True)
    try:
        proc.start()
    finally:
        if proc.pid is not None:  # started (no refusal): do not leave it behind
            proc.join(60)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_list_storage_sent_to_a_spawned_process_names_its_type():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(torch.arange(3))
    with pytest.raises(RuntimeError, match=r"Cannot share a storage of type ListStorage between processes"):
        _start_spawned(rb)
    assert rb[:].tolist() == [0, 1, 2]


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_max_value_writer_is_not_sent_to_a_spawned_process():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictMaxValueWriter(rank_key="score")
    )
    rb.extend(TensorDict(score=torch.arange(3.0), batch_size=[3]))
    with pytest.raises(RuntimeError, match=r"TensorDictMaxValueWriter cannot be shared between processes"):
        _start_spawned(rb)
    assert pickle.loads(pickle.dumps(rb.writer)).cursor == 3  # plain pickling (no process) still works


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


# -- prefetched batches are state ----------------------------------------------------------------------------------
def _prefetching_buffer():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100), batch_size=4, prefetch=3, generator=torch.Generator().manual_seed(0)
    )
    rb.extend(torch.arange(100))
    rb.sample()  # fills the prefetch queue
    return rb


def test_state_dict_keeps_prefetched_batches():
    rb = _prefetching_buffer()
    state = rb.state_dict()
    assert state["_prefetch_state"]["version"] == 1 and len(state["_prefetch_state"]["queue"]) == 3
    restored = ReplayBuffer(
        storage=LazyTensorStorage(100), batch_size=4, prefetch=3, generator=torch.Generator()
    )
    restored.load_state_dict(state)
    assert [restored.sample().tolist() for _ in range(6)] == [rb.sample().tolist() for _ in range(6)]
    other = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, prefetch=2)
    with pytest.raises(ValueError, match="prefetch=3"):
        other.load_state_dict(state)


def test_pickled_buffer_returns_the_same_next_batches():
    rb = _prefetching_buffer()
    copy = pickle.loads(pickle.dumps(rb))
    assert len(copy._prefetch_queue) == 3
    assert [copy.sample().tolist() for _ in range(6)] == [rb.sample().tolist() for _ in range(6)]
    worker_copy = pickle.loads(pickle.dumps(rb))
    worker_copy.prepare_worker_copy(seed=1)  # a DataLoader worker never sees the parent's prefetched batches
    assert len(worker_copy._prefetch_queue) == 0


@pytest.mark.parametrize("tensordict_items", [False, True])
def test_dumps_keeps_prefetched_batches_without_pickle(tmp_path, tensordict_items):
    def build(prefetch=3):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(100),
            batch_size=4,
            prefetch=prefetch,
            generator=torch.Generator().manual_seed(0),
        )
        data = torch.arange(100)
        rb.extend(
            TensorDict(a=data, nested={"b": data.float()}, batch_size=[100]) if tensordict_items else data
        )
        return rb

    rb = build()
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").rglob("*.pkl"))
    restored = build()
    restored.loads(tmp_path / "ckpt")
    for _ in range(6):
        (want, want_info), (got, got_info) = rb.sample(return_info=True), restored.sample(return_info=True)
        assert (want == got).all() and torch.equal(want_info["index"], got_info["index"])
    with pytest.raises(RuntimeError, match="prefetch queue with capacity 3.*prefetch=3"):  # TorchRL's type
        build(prefetch=2).loads(tmp_path / "ckpt")
