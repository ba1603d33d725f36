"""Tests of TensorDictMaxValueWriter: top-k invariants, -1 for rejected items, state, errors."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl.data.replay_buffers.replay_buffers import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler
from torchrl.data.replay_buffers.storages import LazyMemmapStorage, LazyTensorStorage, ListStorage
from torchrl.data.replay_buffers.writers.max_value import TensorDictMaxValueWriter

STORAGES = {
    "lazy_tensor": LazyTensorStorage,
    "list": ListStorage,
    "memmap": LazyMemmapStorage,
}


def _batch(ranks, ids) -> TensorDict:
    ranks = torch.as_tensor(ranks, dtype=torch.float32)
    return TensorDict(
        {"id": torch.as_tensor(ids, dtype=torch.long), "next": {"reward": ranks.unsqueeze(-1)}},
        batch_size=[ranks.numel()],
    )


def _writer(capacity: int, storage: str = "lazy_tensor", **kwargs):
    writer = TensorDictMaxValueWriter(**kwargs)
    store = STORAGES[storage](capacity)
    writer.register_storage(store)
    return writer, store


def _stored_ids(store, writer) -> list[int]:
    n = writer.cursor
    if n == 0:
        return []
    data = store.get(torch.arange(n))
    if isinstance(data, list):
        return [int(d["id"]) for d in data]
    return data["id"].tolist()


def _sequential_reference(capacity: int, batches) -> list[set[int]]:
    """Item-by-item model of the writer (distinct ranks): the set of stored ids after each batch."""
    stored: dict[int, float] = {}
    out = []
    for ranks, ids in batches:
        for r, i in zip(ranks, ids):
            if len(stored) < capacity:
                stored[i] = r
            else:
                weakest = min(stored, key=stored.get)
                if r > stored[weakest]:
                    del stored[weakest]
                    stored[i] = r
        out.append(set(stored))
    return out


@pytest.mark.parametrize("storage", sorted(STORAGES))
@pytest.mark.parametrize("capacity", [1, 5, 17])
def test_stored_items_match_item_by_item_reference(storage, capacity):
    gen = torch.Generator().manual_seed(capacity)
    writer, store = _writer(capacity, storage)
    batches, next_id = [], 0
    for _ in range(12):
        n = int(torch.randint(1, 2 * capacity + 3, (1,), generator=gen))
        ranks = torch.randn(n, generator=gen, dtype=torch.float64).tolist()
        batches.append((ranks, list(range(next_id, next_id + n))))
        next_id += n
    expected = _sequential_reference(capacity, batches)
    for (ranks, ids), want in zip(batches, expected):
        index = writer.extend(_batch(ranks, ids))
        assert set(_stored_ids(store, writer)) == want
        # an item has a slot iff it is stored there after the call
        for i, slot in zip(ids, index.tolist()):
            assert (slot >= 0) == (i in want)
            if slot >= 0:
                assert _stored_ids(store, writer)[slot] == i


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 8),
    batches=st.lists(st.lists(st.integers(-3, 3), min_size=0, max_size=12), min_size=1, max_size=8),
)
def test_stored_ranks_are_top_k_of_everything_written_with_ties(capacity, batches):
    writer, store = _writer(capacity)
    written: list[int] = []
    for ranks in batches:
        base = len(written)
        index = writer.extend(_batch(ranks, list(range(base, base + len(ranks)))))
        written.extend(ranks)
        top = sorted(written, reverse=True)[:capacity]
        assert sorted(writer.ranks.tolist(), reverse=True) == top
        if writer.cursor == capacity:  # the fast-reject floor never exceeds the stored minimum
            assert float(writer._floor) <= min(top)
        # the storage holds the items the writer thinks it holds, with the ranks it recorded
        if writer.cursor:
            stored = store.get(torch.arange(writer.cursor))
            assert stored["next", "reward"].squeeze(-1).tolist() == writer.ranks.tolist()
            assert (stored["index"] == torch.arange(writer.cursor)).all()
        assert index.shape == (len(ranks),)
        assert int((index >= 0).sum()) <= len(ranks)
        assert index[index >= 0].unique().numel() == int((index >= 0).sum())  # no slot given twice


def test_ties_keep_incumbents_and_earlier_items_of_the_batch():
    writer, _ = _writer(2)
    assert writer.extend(_batch([1.0, 1.0], [0, 1])).tolist() == [0, 1]
    assert writer.extend(_batch([1.0, 1.0, 1.0], [2, 3, 4])).tolist() == [-1, -1, -1]
    index = writer.extend(_batch([2.0, 2.0, 2.0], [5, 6, 7]))
    assert index.tolist()[2] == -1 and sorted(index.tolist()[:2]) == [0, 1]


def test_rejected_items_get_minus_one_in_return_and_index_entry():
    writer, store = _writer(3)
    writer.extend(_batch([5.0, 6.0, 7.0], [0, 1, 2]))
    td = _batch([1.0, 8.0, 2.0], [3, 4, 5])
    index = writer.extend(td)
    assert index.tolist() == [-1, 0, -1]
    assert td["index"].tolist() == [-1, 0, -1]
    assert store.get(0)["id"].item() == 4


def test_add_returns_slot_or_none():
    writer, store = _writer(2)
    item = lambda r, i: _batch([r], [i])[0]  # noqa: E731
    assert writer.add(item(1.0, 0)) == 0
    assert writer.add(item(3.0, 1)) == 1
    rejected = item(0.5, 2)
    assert writer.add(rejected) is None
    assert rejected["index"].item() == -1
    assert writer.add(item(2.0, 3)) == 0
    assert store.get(0)["id"].item() == 3
    assert writer.write_count == 4


@pytest.mark.parametrize(
    "reduction, expected",
    [
        ("sum", [6.0, 3.0]),
        ("max", [3.0, 3.0]),
        ("min", [1.0, 0.0]),
        ("mean", [2.0, 1.0]),
        ("median", [2.0, 0.0]),
    ],
)
def test_reduction_over_per_step_ranks(reduction, expected):
    writer, _ = _writer(4, rank_key="r", reduction=reduction)
    td = TensorDict(r=torch.tensor([[1.0, 2.0, 3.0], [0.0, 3.0, 0.0]]), batch_size=[2])
    writer.extend(td)
    assert writer.ranks.tolist() == expected


def test_items_with_extra_batch_dims_get_index_over_all_dims():
    writer, store = _writer(4, rank_key="r")
    td = TensorDict(r=torch.tensor([[1.0, 2.0], [5.0, 0.0]]), batch_size=[2, 2])
    assert writer.extend(td).tolist() == [0, 1]
    assert td["index"].tolist() == [[0, 0], [1, 1]]
    assert store.get(1)["r"].tolist() == [5.0, 0.0]


def test_mark_update_gets_the_winning_slots():
    class Spy:
        def __init__(self):
            self.calls = []

        def mark_update(self, index):
            self.calls.append(torch.as_tensor(index).tolist())

    writer, store = _writer(2)
    spy = Spy()
    store.attach(spy)
    writer.extend(_batch([1.0, 2.0], [0, 1]))
    writer.extend(_batch([0.0, 3.0], [2, 3]))
    writer.extend(_batch([-1.0], [4]))  # nothing written: no notification
    writer.add(_batch([9.0], [5])[0])
    assert spy.calls == [[0, 1], [0], 1]


def test_with_tensordict_replay_buffer_and_sampler_ignores_rejected():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictMaxValueWriter(), sampler=RandomSampler(), batch_size=8
    )
    for step in range(5):
        rb.extend(_batch(torch.arange(6.0) + step, torch.arange(6) + 6 * step))
    assert len(rb) == 4
    assert sorted(rb.writer.ranks.tolist()) == [7.0, 8.0, 8.0, 9.0]
    batch = rb.sample()
    assert (batch["next", "reward"] >= 7).all()
    assert rb.write_count == 30


@pytest.mark.parametrize("split", [0, 1, 3])
def test_state_dict_round_trip_then_identical_behaviour(split):
    gen = torch.Generator().manual_seed(split)
    sizes = torch.randint(1, 7, (6,), generator=gen).tolist()
    batches = [torch.randint(0, 6, (n,), generator=gen) for n in sizes]
    a, _ = _writer(5)
    for ranks in batches[:split]:
        a.extend(_batch(ranks, torch.zeros_like(ranks)))
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b, _ = _writer(5)
    b.load_state_dict(state)
    assert b.cursor == a.cursor and b.write_count == a.write_count and torch.equal(b.ranks, a.ranks)
    for ranks in batches[split:]:
        ia = a.extend(_batch(ranks, torch.zeros_like(ranks)))
        ib = b.extend(_batch(ranks, torch.zeros_like(ranks)))
        assert torch.equal(ia, ib)
        assert torch.equal(a.ranks, b.ranks)


def test_load_state_dict_before_register_storage():
    a, _ = _writer(3)
    a.extend(_batch([1.0, 2.0], [0, 1]))
    b = TensorDictMaxValueWriter()
    b.load_state_dict(a.state_dict())
    b.register_storage(LazyTensorStorage(3))
    assert b.ranks.tolist() == [1.0, 2.0]


def test_empty_resets_cursor_ranks_and_optionally_write_count():
    writer, _ = _writer(2)
    writer.extend(_batch([1.0, 2.0, 3.0], [0, 1, 2]))
    writer._empty(empty_write_count=False)
    assert writer.cursor == 0 and writer.ranks.numel() == 0 and writer.write_count == 3
    writer._empty()
    assert writer.write_count == 0
    assert writer.extend(_batch([0.0], [0])).tolist() == [0]


def test_pickled_writer_keeps_its_state():
    writer, _ = _writer(3)
    writer.extend(_batch([1.0, 2.0], [0, 1]))
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.cursor == 2 and copy.ranks.tolist() == [1.0, 2.0]
    assert copy.extend(_batch([3.0, 0.5], [2, 3])).tolist() == [2, -1]
    assert writer.cursor == 2  # independent after pickling by value


def test_reregistering_the_same_storage_keeps_state():
    writer, store = _writer(3)
    writer.extend(_batch([1.0], [0]))
    writer.register_storage(store)
    assert writer.ranks.tolist() == [1.0]


# -- errors --------------------------------------------------------------------------------------------------
def test_bad_reduction_lists_the_choices():
    with pytest.raises(ValueError, match="`reduction`.*'max', 'min', 'mean', 'median', 'sum'.*'avg'"):
        TensorDictMaxValueWriter(reduction="avg")


@pytest.mark.parametrize("rank_key", [3, (), ("a", 1)])
def test_bad_rank_key_type(rank_key):
    with pytest.raises(TypeError, match="`rank_key`"):
        TensorDictMaxValueWriter(rank_key=rank_key)


def test_default_rank_key_is_next_reward():
    assert TensorDictMaxValueWriter().rank_key == ("next", "reward")


def test_ndim_2_storage_is_refused():
    with pytest.raises(ValueError, match="1-D storage.*ndim=2"):
        TensorDictMaxValueWriter().register_storage(LazyTensorStorage(10, ndim=2))


def test_unbounded_storage_is_refused():
    with pytest.raises(ValueError, match="unbounded"):
        TensorDictMaxValueWriter().register_storage(ListStorage())


def test_registering_another_capacity_with_state_is_refused():
    writer, _ = _writer(3)
    writer.extend(_batch([1.0], [0]))
    with pytest.raises(ValueError, match="capacity 3"):
        writer.register_storage(LazyTensorStorage(4))


@pytest.mark.parametrize("method", ["add", "extend"])
def test_missing_rank_key_names_it(method):
    writer, _ = _writer(3, rank_key=("next", "score"))
    td = TensorDict(obs=torch.zeros(2), batch_size=[2])
    with pytest.raises(KeyError, match="'next', 'score'"):
        getattr(writer, method)(td if method == "extend" else td[0])
    assert writer.cursor == 0 and writer.write_count == 0


@pytest.mark.parametrize("method", ["add", "extend"])
def test_non_tensordict_is_refused(method):
    writer, _ = _writer(3)
    with pytest.raises(TypeError, match="TensorDict.*Tensor"):
        getattr(writer, method)(torch.zeros(3))


def test_nan_rank_is_refused_and_nothing_changes():
    writer, store = _writer(3, rank_key="r")
    with pytest.raises(ValueError, match="NaN"):
        writer.extend(TensorDict(r=torch.tensor([1.0, float("nan")]), batch_size=[2]))
    assert writer.cursor == 0 and len(store) == 0


def test_extend_without_batch_dim_is_refused():
    writer, _ = _writer(3, rank_key="r")
    with pytest.raises(ValueError, match="batch dim"):
        writer.extend(TensorDict(r=torch.tensor(1.0)))


def test_empty_batch_returns_empty_index():
    writer, _ = _writer(3, rank_key="r")
    assert writer.extend(TensorDict(r=torch.zeros(0), batch_size=[0])).shape == (0,)


def test_write_without_storage_is_refused():
    with pytest.raises(RuntimeError, match="register_storage"):
        TensorDictMaxValueWriter().extend(_batch([1.0], [0]))


def test_failed_storage_write_leaves_writer_unchanged():
    writer, store = _writer(3)
    writer.extend(_batch([1.0], [0]))
    # a subset of the keys plus a new one is a partial write (issue 12); a wrong shape is refused before any write
    bad = TensorDict({"other": torch.zeros(2), "id": torch.zeros(2, 3, dtype=torch.long),
                      "next": {"reward": torch.ones(2, 1)}}, batch_size=[2])
    with pytest.raises(ValueError, match="Nothing was written"):
        writer.extend(bad)
    assert writer.cursor == 1 and writer.ranks.tolist() == [1.0] and len(store) == 1


@pytest.mark.parametrize(
    "state, error, match",
    [
        ({"_cursor": 1}, KeyError, "lacks"),
        ({"_cursor": 2, "_ranks": torch.zeros(1), "_capacity": 3}, ValueError, "Inconsistent"),
        ({"_cursor": 4, "_ranks": torch.zeros(4), "_capacity": 3}, ValueError, "Inconsistent"),
        ({"_cursor": 1, "_ranks": torch.zeros(1), "_capacity": 5}, ValueError, "capacity 5"),
    ],
)
def test_bad_state_dict_is_refused(state, error, match):
    writer, _ = _writer(3)
    with pytest.raises(error, match=match):
        writer.load_state_dict(state)
