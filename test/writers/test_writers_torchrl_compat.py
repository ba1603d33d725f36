"""TorchRL compatibility of the writers (facts file §3): the max-value writer's refusal of non-tensor-collection
data and its ``_cursor``, and slot generations kept on the storage."""

from __future__ import annotations

import pickle
import re

import pytest
import torch
from helpers.assertions import start_spawned
from tensordict import TensorDict, tensorclass

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.data.replay_buffers.writers.max_value import MAX_VALUE_WRITER_DATA

MAX_VALUE_PHRASE = MAX_VALUE_WRITER_DATA.phrase
assert MAX_VALUE_PHRASE == "expects data to be a tensor collection"

STORAGES = {
    "lazy": lambda n: LazyTensorStorage(n),
    "memmap": lambda n: LazyMemmapStorage(n),
    "list": lambda n: ListStorage(n),
}


@tensorclass
class _Ranked:
    r: torch.Tensor


# -- TensorDictMaxValueWriter: data that is not a tensor collection ----------------------------------------------
def _non_collections(method: str):
    single = method in ("add", "writer.add")
    if single:
        return {"tensor": torch.tensor(1.0), "dict": {"r": torch.tensor(1.0)}, "list": [torch.tensor(1.0)]}
    return {
        "tensor": torch.arange(4.0),
        "dict": {"r": torch.arange(4.0)},
        "list": [torch.tensor(float(i)) for i in range(4)],
    }


@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("method", ["add", "extend", "writer.add", "writer.extend"])
@pytest.mark.parametrize("data", ["tensor", "dict", "list"])
def test_max_value_writer_refuses_non_tensor_collections_at_write_time(storage, method, data):
    rb = ReplayBuffer(
        storage=STORAGES[storage](5), writer=TensorDictMaxValueWriter(rank_key="r")
    )  # builds fine
    write = {
        "add": rb.add,
        "extend": rb.extend,
        "writer.add": rb.writer.add,
        "writer.extend": rb.writer.extend,
    }
    with pytest.raises(RuntimeError, match=re.escape(MAX_VALUE_PHRASE)) as info:
        write[method](_non_collections(method)[data])
    assert "TensorDictMaxValueWriter" in str(info.value)  # names the writer, then says what to do
    assert "Wrap the data in a TensorDict" in str(info.value)
    assert len(rb) == 0 and rb.writer.cursor == 0 and rb.writer.write_count == 0  # nothing written


def test_max_value_writer_refusal_is_also_a_type_error_and_keeps_stored_items():
    rb = ReplayBuffer(storage=LazyTensorStorage(3), writer=TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(TensorDict(r=torch.tensor([1.0, 2.0]), batch_size=[2]))
    with pytest.raises(TypeError, match="got a Tensor of shape \\[3\\]"):
        rb.extend(torch.zeros(3))
    assert len(rb) == 2 and rb[:]["r"].tolist() == [1.0, 2.0] and rb.writer.write_count == 2


def test_max_value_writer_accepts_a_tensorclass_batch():
    rb = ReplayBuffer(storage=LazyTensorStorage(2), writer=TensorDictMaxValueWriter(rank_key="r"))
    assert rb.extend(_Ranked(r=torch.tensor([3.0, 1.0, 5.0]), batch_size=[3])).tolist() == [0, -1, 1]
    assert sorted(rb[:].r.tolist()) == [3.0, 5.0]


# -- TensorDictMaxValueWriter._cursor ------------------------------------------------------------------------------
@pytest.mark.parametrize(("capacity", "expected"), [(3, 0), (5, 0), (100, 5)])
def test_max_value_writer_cursor_wraps_to_zero_once_full(capacity, expected):
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), writer=TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(TensorDict(r=torch.arange(5.0), batch_size=[5]))
    assert rb.writer._cursor == expected
    assert rb.writer.cursor == min(capacity, 5)  # ours: the number of filled slots


def test_max_value_writer_cursor_advances_while_filling_then_stays_at_zero():
    writer = TensorDictMaxValueWriter(rank_key="r")
    writer.register_storage(LazyTensorStorage(3))
    seen = []
    for r in [1.0, 2.0, 3.0, 4.0, 0.5, 9.0]:
        writer.add(TensorDict(r=torch.tensor(r)))
        seen.append(writer._cursor)
    assert seen == [1, 2, 0, 0, 0, 0]
    writer._empty()
    assert writer._cursor == 0 and writer.cursor == 0


# -- slot generations --------------------------------------------------------------------------------------------
def _tracking(capacity: int, **kwargs):
    writer = RoundRobinWriter(track_generations=True)
    writer.register_storage(LazyTensorStorage(capacity, **kwargs))
    return writer


@pytest.mark.parametrize("size", [1, 3, 4])
def test_extend_of_twice_the_capacity_writes_every_slot_twice(size):
    writer = _tracking(size)
    writer.extend(torch.arange(2 * size))
    assert writer.generations_of(torch.arange(size)).tolist() == [1] * size


def test_each_repetition_of_a_slot_within_one_extend_counts():
    writer = _tracking(4)
    writer.extend(torch.arange(10))
    assert writer.generations_of(torch.arange(4)).tolist() == [2, 2, 1, 1]
    writer.extend(torch.arange(3))  # slots 2, 3, 0
    assert writer.generations_of(torch.arange(4)).tolist() == [3, 2, 2, 2]


def test_out_of_range_slots_read_as_never_written():
    writer = _tracking(4)
    writer.extend(torch.arange(4))
    assert writer.generations_of(torch.tensor([-5, -1, 4, 100])).tolist() == [-1, -1, -1, -1]
    assert writer.generations_of(-1).item() == -1


def _shared_pair(second_tracks: bool):
    storage = LazyTensorStorage(4)
    first = ReplayBuffer(storage=storage, writer=RoundRobinWriter(track_generations=True))
    second = ReplayBuffer(storage=storage, writer=RoundRobinWriter(track_generations=second_tracks))
    return first, second


@pytest.mark.parametrize("second_tracks", [True, False])
def test_another_buffer_overwriting_a_shared_storage_makes_handles_stale(second_tracks):
    first, second = _shared_pair(second_tracks)
    index = first.extend(torch.arange(4))
    handles = first.writer.generations_of(index)
    assert handles.tolist() == [0, 0, 0, 0]
    second.extend(torch.tensor([10, 11]))  # the second writer's own cursor: slots 0 and 1
    assert first.writer.generations_of(index).tolist() == [1, 1, 0, 0]
    assert (first.writer.generations_of(index) == handles).tolist() == [False, False, True, True]


@pytest.mark.parametrize("second_tracks", [True, False])
def test_empty_through_another_buffer_bumps_every_written_slot(second_tracks):
    first, second = _shared_pair(second_tracks)
    first.extend(torch.arange(3))
    second.empty()
    assert first.writer.generations_of(torch.arange(4)).tolist() == [1, 1, 1, -1]


def test_a_tracking_writer_sees_writes_of_a_max_value_writer_on_its_storage():
    storage = LazyTensorStorage(3)
    tracked = TensorDictReplayBuffer(
        storage=storage, writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    tracked.extend(TensorDict(r=torch.zeros(3), batch_size=[3]))
    top = TensorDictMaxValueWriter(rank_key="r")
    top.register_storage(storage)
    top.extend(TensorDict(r=torch.tensor([5.0]), batch_size=[1]))  # the max-value writer fills slot 0
    assert tracked.writer.generations_of(torch.arange(3)).tolist() == [1, 0, 0]


def test_generations_of_on_an_ndim2_storage():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(12, ndim=2), writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    index = rb.extend(TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3]))  # backing [6 rows, 2 envs]
    assert index.shape == (6, 2)
    writer = rb.writer
    assert writer.generations_of(index).shape == (6,)  # [N, 2] coordinates -> [N]
    assert writer.generations_of(torch.tensor([1, 2])).shape == (2,)  # a 1-D tensor: rows, even of length 2
    assert writer.generations_of(torch.tensor([1, 9])).tolist() == [0, -1]
    cell = writer.generations_of((torch.tensor(1), torch.tensor(0)))
    assert cell.shape == () and cell.item() == 0


def test_generations_survive_state_dict_into_a_fresh_buffer_through_the_storage():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True))
    rb.extend(torch.arange(6))
    fresh = ReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(track_generations=True))
    fresh.load_state_dict(rb.state_dict())
    assert fresh.writer.generations_of(torch.arange(4)).tolist() == [1, 1, 0, 0]
    other = ReplayBuffer(storage=fresh.storage, writer=RoundRobinWriter())
    other.extend(torch.tensor([7]))  # the loaded counts are the storage's: another writer bumps them
    assert fresh.writer.generations_of(torch.arange(4)).tolist() == [2, 1, 0, 0]


def test_writer_state_loaded_before_its_storage_is_installed_on_register():
    writer = _tracking(3)
    writer.extend(torch.arange(4))
    fresh = RoundRobinWriter(track_generations=True)
    fresh.load_state_dict(writer.state_dict())
    fresh.register_storage(LazyTensorStorage(3))
    assert fresh.generations_of(torch.arange(3)).tolist() == [1, 0, 0]


def test_writer_state_for_another_capacity_is_refused_unchanged():
    writer = _tracking(3)
    writer.extend(torch.arange(2))
    big = _tracking(5)
    big.extend(torch.arange(1))
    with pytest.raises(ValueError, match="3 slots.*5 rows"):
        big.load_state_dict(writer.state_dict())
    assert big.cursor == 1 and big.generations_of(torch.arange(2)).tolist() == [0, -1]


# -- exception types (from the behaviours TorchRL code relies on, issue 12) ------------------------------------------
def test_max_value_writer_non_tensordict_is_type_and_runtime_error():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), writer=TensorDictMaxValueWriter())
    for exc in (TypeError, RuntimeError):
        with pytest.raises(exc, match="expects data to be a tensor collection"):
            rb.add(torch.zeros(3))


# -- refused under spawn (from the behaviours TorchRL code relies on, issue 12) --------------------------------------


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_max_value_writer_is_not_sent_to_a_spawned_process():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictMaxValueWriter(rank_key="score")
    )
    rb.extend(TensorDict(score=torch.arange(3.0), batch_size=[3]))
    with pytest.raises(RuntimeError, match=r"TensorDictMaxValueWriter cannot be shared between processes"):
        start_spawned(rb)
    assert pickle.loads(pickle.dumps(rb.writer)).cursor == 3  # plain pickling (no process) still works
