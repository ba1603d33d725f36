"""TorchRL's writer API: ``Writer(compilable=False)``, ``TensorDictMaxValueWriter(rank_key=None, reduction="sum",
**kwargs)`` and its ``get_insert_index``, and the refusal of a max-value writer in a buffer shared between processes
(TorchRL's "cannot be shared between processes"), made before anything is shared."""

from __future__ import annotations

import inspect

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    Writer,
)
from torchrl.data.replay_buffers.writers.max_value import MAX_VALUE_WRITER_SHARED

PHRASE = "cannot be shared between processes"
assert MAX_VALUE_WRITER_SHARED.phrase == PHRASE


class _Appender(Writer):
    """A user writer built through ``Writer.__init__``."""

    def __init__(self, compilable=False):
        super().__init__(compilable)

    def add(self, data):
        return 0

    def extend(self, data):
        return torch.zeros(0, dtype=torch.long)


def test_writer_takes_torchrl_s_compilable_argument():
    assert [
        (p.name, p.default) for p in list(inspect.signature(Writer.__init__).parameters.values())[1:]
    ] == [("compilable", False)]
    assert _Appender(True)._compilable is True and _Appender()._compilable is False
    with pytest.raises(TypeError, match="compilable"):
        _Appender("yes")


def test_max_value_writer_passes_its_keywords_to_writer():
    assert TensorDictMaxValueWriter(rank_key="r", compilable=True)._compilable is True
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['capacity'\].*compilable"):
        TensorDictMaxValueWriter(rank_key="r", capacity=3)


def _scored(score) -> TensorDict:
    return TensorDict(score=torch.as_tensor(score, dtype=torch.float))


def test_get_insert_index_decides_and_records_as_add_does_without_writing():
    storage = LazyTensorStorage(2)
    writer = TensorDictMaxValueWriter(rank_key="score")
    writer.register_storage(storage)
    assert [writer.get_insert_index(_scored(s)) for s in (3.0, 1.0, 0.5, 2.0)] == [0, 1, None, 1]
    assert writer.ranks.tolist() == [3.0, 2.0] and writer.write_count == 4
    assert len(storage) == 0  # the caller writes the items


def test_get_insert_index_of_a_trajectory_reduces_its_rank():
    writer = TensorDictMaxValueWriter(rank_key="score", reduction="max")
    writer.register_storage(LazyTensorStorage(1))
    assert writer.get_insert_index(TensorDict(score=torch.tensor([1.0, 5.0]), batch_size=[2])) == 0
    assert writer.get_insert_index(TensorDict(score=torch.tensor([4.0, 4.5]), batch_size=[2])) is None
    assert writer.ranks.tolist() == [5.0]


def test_get_insert_index_refuses_data_without_a_rank_and_changes_nothing():
    writer = TensorDictMaxValueWriter(rank_key="score")
    writer.register_storage(LazyTensorStorage(2))
    with pytest.raises(KeyError, match="score"):
        writer.get_insert_index(TensorDict(other=torch.tensor(1.0)))
    assert writer.cursor == 0 and writer.write_count == 0


def _max_value_buffer(storage=None) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(
        storage=storage if storage is not None else LazyTensorStorage(4),
        writer=TensorDictMaxValueWriter(rank_key="score"),
    )


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_a_shared_buffer_with_a_max_value_writer_is_refused(storage):
    writer = TensorDictMaxValueWriter(rank_key="score")
    backing = storage(4)
    with pytest.raises(RuntimeError, match=f"TensorDictMaxValueWriter {PHRASE}.*RoundRobinWriter"):
        TensorDictReplayBuffer(storage=backing, writer=writer, shared=True)
    assert writer._storage is None  # refused before the components were wired


def test_share_of_a_max_value_buffer_is_refused_before_anything_is_shared():
    rb = _max_value_buffer()
    rb.extend(TensorDict(score=torch.arange(3.0), batch_size=[3]))
    with pytest.raises(RuntimeError, match=PHRASE):
        rb.share()
    assert not rb.storage.is_shared and not rb.writer._counters.is_shared
    rb.extend(TensorDict(score=torch.tensor([9.0, -1.0]), batch_size=[2]))  # still a working private buffer
    assert sorted(rb[:]["score"].tolist()) == [0.0, 1.0, 2.0, 9.0]


def test_a_shared_buffer_with_a_round_robin_writer_is_still_accepted():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), writer=RoundRobinWriter(), shared=True)
    rb.extend(TensorDict(score=torch.arange(3.0), batch_size=[3]))
    assert rb.storage.is_shared and len(rb) == 3
