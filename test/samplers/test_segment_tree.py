"""Sum/min segment trees: equal to brute-force numpy references under random batched updates."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl.data.replay_buffers.samplers.segment_tree import MinSegmentTree, SumSegmentTree

# 0: the whole search is a binary descent; 2: a short flat top; 11: the default (capacity <= 2048 is all flat)
FLAT_LEVELS = (0, 2, 11)


def _tree(cls, capacity: int, flat_level: int):
    tree = cls(capacity)
    tree._flat_level = min(tree._depth, flat_level)  # before any write: both update and search use it
    return tree


def _apply(reference: np.ndarray, index, value) -> None:
    """The reference semantics: writes in order, so the last write to a position wins."""
    for i, v in zip(np.asarray(index).tolist(), np.broadcast_to(value, np.shape(index)).tolist()):
        reference[i] = v


@st.composite
def _scenario(draw, integer_values: bool):
    capacity = draw(st.integers(1, 300))
    values = st.integers(0, 9).map(float) if integer_values else st.floats(-1e6, 1e6)
    batches = draw(
        st.lists(
            st.lists(st.tuples(st.integers(0, capacity - 1), values), min_size=1, max_size=40),
            min_size=1,
            max_size=6,
        )
    )
    flat_level = draw(st.sampled_from(FLAT_LEVELS))
    return capacity, batches, flat_level


@settings(max_examples=150, deadline=None)
@given(scenario=_scenario(integer_values=True), data=st.data())
def test_sum_tree_matches_bruteforce_reference(scenario, data):
    capacity, batches, flat_level = scenario
    tree = _tree(SumSegmentTree, capacity, flat_level)
    reference = np.zeros(capacity)
    for batch in batches:
        index, value = (np.array(x) for x in zip(*batch))
        tree.update(index, value)
        _apply(reference, index, value)
        np.testing.assert_array_equal(tree[np.arange(capacity)], reference)
        assert tree.query() == reference.sum() == tree.total
        start = data.draw(st.integers(0, capacity))
        end = data.draw(st.integers(start, capacity))
        assert tree.query(start, end) == reference[start:end].sum()
        # integer values: float sums are exact, so the search must agree with cumsum + searchsorted exactly
        target_values = st.integers(-1, int(reference.sum()) + 2)
        targets = np.array(data.draw(st.lists(target_values, min_size=1, max_size=20)))
        expected = np.searchsorted(np.cumsum(reference), targets, side="left")
        expected[targets <= 0] = 0
        np.testing.assert_array_equal(tree.scan_lower_bound(targets.astype(float)), expected)


@settings(max_examples=150, deadline=None)
@given(scenario=_scenario(integer_values=False), data=st.data())
def test_min_tree_matches_bruteforce_reference(scenario, data):
    capacity, batches, flat_level = scenario
    tree = _tree(MinSegmentTree, capacity, flat_level)
    reference = np.full(capacity, np.inf)
    for batch in batches:
        index, value = (np.array(x) for x in zip(*batch))
        tree.update(index, value)
        _apply(reference, index, value)
        np.testing.assert_array_equal(tree[np.arange(capacity)], reference)
        assert tree.query() == reference.min()
        start = data.draw(st.integers(0, capacity))
        end = data.draw(st.integers(start, capacity))
        assert tree.query(start, end) == (reference[start:end].min() if end > start else np.inf)


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    zero_fraction=st.floats(0, 0.95),
    flat_level=st.sampled_from(FLAT_LEVELS),
)
def test_scan_never_returns_a_zero_leaf_for_positive_targets(capacity, seed, zero_fraction, flat_level):
    rng = np.random.default_rng(seed)
    values = rng.random(capacity) * 10.0 ** rng.integers(-8, 8, capacity)
    values[rng.random(capacity) < zero_fraction] = 0.0
    tree = _tree(SumSegmentTree, capacity, flat_level)
    tree.update(np.arange(capacity), values)
    total = tree.total
    if total == 0:
        assert tree.scan_lower_bound([0.0, 1.0]).tolist() == [0, capacity]
        return
    targets = np.concatenate([rng.random(200) * total, [total, np.nextafter(total, 0), 5e-324]])
    found = tree.scan_lower_bound(targets)
    assert ((found >= 0) & (found < capacity)).all()
    assert (values[found] > 0).all()
    # within rounding of the exact answer: the prefix sum before the found leaf is below the target
    before = np.concatenate([[0.0], np.cumsum(values)])[found]
    assert (before <= targets * (1 + 1e-9)).all()
    above = np.array([np.nextafter(total, np.inf), 2 * total + 1.0])
    assert (tree.scan_lower_bound(above) == capacity).all()


@pytest.mark.parametrize("flat_level", FLAT_LEVELS)
def test_float_sums_match_numpy_at_scale(flat_level):
    capacity = (1 << 16) + 3
    rng = np.random.default_rng(0)
    tree = _tree(SumSegmentTree, capacity, flat_level)
    reference = np.zeros(capacity)
    for _ in range(20):
        index = rng.integers(0, capacity, 256)
        value = rng.random(256)
        tree.update(index, value)
        _apply(reference, index, value)
    np.testing.assert_allclose(tree.query(), reference.sum(), rtol=1e-12)
    np.testing.assert_allclose(tree.query(100, 50_000), reference[100:50_000].sum(), rtol=1e-12)
    targets = rng.random(256) * tree.total
    found = tree.scan_lower_bound(targets)
    np.testing.assert_array_equal(found, np.searchsorted(np.cumsum(reference), targets))


def test_repeated_index_last_write_wins():
    tree = SumSegmentTree(4)
    tree.update([1, 2, 1, 1], [5.0, 1.0, 7.0, 3.0])
    assert tree[1] == 3.0 and tree.query() == 4.0
    tree = MinSegmentTree(4)
    tree.update(torch.tensor([0, 0]), torch.tensor([-1.0, 2.0]))
    assert tree[0] == 2.0 and tree.query() == 2.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32])
def test_accepts_tensors_of_any_real_dtype(dtype):
    tree = SumSegmentTree(6)
    tree.update(torch.tensor([0, 5], dtype=torch.int32), torch.tensor([2, 3], dtype=dtype))
    assert tree.query() == 5.0
    leaves = tree[torch.tensor([5, 0])]
    assert isinstance(leaves, torch.Tensor) and leaves.dtype == torch.float64
    assert leaves.tolist() == [3.0, 2.0]
    assert isinstance(tree.scan_lower_bound(torch.tensor([1.0, 4.0])), torch.Tensor)
    tree.update(3, 1.5)  # int index, scalar value
    assert tree[3] == 1.5 and tree[:].tolist() == [2.0, 0.0, 0.0, 1.5, 0.0, 3.0]


@pytest.mark.parametrize("cls", [SumSegmentTree, MinSegmentTree])
def test_state_dict_and_pickle_round_trip(cls):
    rng = np.random.default_rng(1)
    tree = cls(100)
    tree.update(rng.integers(0, 100, 50), rng.random(50))
    clone = cls(100)
    clone.load_state_dict(tree.state_dict())
    unpickled = pickle.loads(pickle.dumps(tree))
    for other in (clone, unpickled):
        np.testing.assert_array_equal(other[:], tree[:])
        assert other.query(3, 77) == tree.query(3, 77)
        other.update([7], [0.25])  # the internal views must still point at the live array
        assert other[7] == 0.25 and other.query(7, 8) == 0.25
    assert tree.state_dict()["values"].dtype == torch.float64


@pytest.mark.parametrize(
    "capacity, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_bad_capacity_raises(capacity, error):
    with pytest.raises(error, match="capacity"):
        SumSegmentTree(capacity)


@pytest.mark.parametrize(
    "index, value, error, match",
    [
        ([4], [1.0], IndexError, "out of range"),
        ([-1], [1.0], IndexError, "out of range"),
        ([0.5], [1.0], TypeError, "integer"),
        (torch.tensor([True, False, True, False]), 1.0, TypeError, "boolean"),
        (np.zeros((2, 2), dtype=int), 1.0, ValueError, "1-D"),
        ([0, 1], [1.0, 2.0, 3.0], ValueError, "one value per index"),
        ([0], [-1.0], ValueError, ">= 0"),
        ([0], [np.nan], ValueError, ">= 0"),
        ([0], [np.inf], ValueError, "finite"),
        ([0], "a", TypeError, "value"),
        ("ab", [1.0], TypeError, "index"),
    ],
)
def test_sum_tree_bad_update_raises_and_changes_nothing(index, value, error, match):
    tree = SumSegmentTree(4)
    tree.update([0, 1], [1.0, 2.0])
    with pytest.raises(error, match=match):
        tree.update(index, value)
    assert tree[:].tolist() == [1.0, 2.0, 0.0, 0.0] and tree.query() == 3.0


def test_min_tree_rejects_nan_but_accepts_negative_values():
    tree = MinSegmentTree(3)
    tree.update([0], [-4.0])
    assert tree.query() == -4.0
    with pytest.raises(ValueError, match="NaN"):
        tree.update([1], [np.nan])


@pytest.mark.parametrize(
    "start, end, error",
    [(-1, 2, ValueError), (2, 1, ValueError), (0, 5, ValueError), (0.0, 2, TypeError), (0, "2", TypeError)],
)
def test_bad_query_range_raises(start, end, error):
    with pytest.raises(error, match="start|end"):
        SumSegmentTree(4).query(start, end)


def test_empty_query_is_the_identity():
    assert SumSegmentTree(4).query(2, 2) == 0.0
    assert MinSegmentTree(4).query(2, 2) == np.inf


def test_scan_rejects_nan():
    tree = SumSegmentTree(4)
    tree.update([0], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        tree.scan_lower_bound([0.5, np.nan])


@pytest.mark.parametrize(
    "state, match",
    [
        ({"capacity": 5, "values": torch.zeros(5)}, "capacity 5"),
        ({"values": torch.zeros(4)}, "'capacity' and 'values'"),
        ([1, 2], "'capacity' and 'values'"),
        ({"capacity": 4, "values": torch.zeros(3)}, "3 entries"),
        ({"capacity": 4, "values": -torch.ones(4)}, ">= 0"),
    ],
)
def test_bad_state_dict_raises_and_changes_nothing(state, match):
    tree = SumSegmentTree(4)
    tree.update([2], [1.0])
    with pytest.raises(ValueError, match=match):
        tree.load_state_dict(state)
    assert tree[:].tolist() == [0.0, 0.0, 1.0, 0.0] and tree.query() == 1.0


def test_scan_repairs_rounding_overshoots_onto_zero_leaves():
    tree = SumSegmentTree(5)
    tree.update(np.arange(5), [1.0, 0.0, 0.0, 2.0, 0.0])
    tree._scan = lambda v: np.array([2, 4, 0])  # what partial sums rounded past a positive leaf give
    assert tree.scan_lower_bound([1.0, 3.0, 0.5]).tolist() == [0, 3, 0]


# -- the API the prioritized samplers use ----------------------------------------------------------------------
@pytest.mark.parametrize("flat_level", FLAT_LEVELS)
@pytest.mark.parametrize("end", [None, 6])
def test_draw_follows_the_leaves_before_end_and_never_a_zero_leaf(flat_level, end):
    tree = _tree(SumSegmentTree, 10, flat_level)
    leaves = np.array([1.0, 0.0, 3.0, 0.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0])
    if end is not None:
        leaves[8] = 5.0  # past `end`: never drawn
    tree.update(np.arange(10), leaves)
    u = torch.rand(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).numpy()
    index, values = tree.draw(u, end=end)
    assert index.dtype == np.int64 and np.array_equal(values, leaves[index])
    counts = np.bincount(index, minlength=10)
    kept = leaves[:6]
    assert counts[6:].sum() == 0 and (counts[:6][kept == 0] == 0).all()
    assert np.allclose(counts[:6] / counts.sum(), kept / kept.sum(), atol=0.02)


def test_draw_returns_none_when_every_leaf_before_end_is_zero():
    tree = SumSegmentTree(4)
    assert tree.draw(np.array([0.5])) is None
    tree.update([3], [1.0])
    assert tree.draw(np.array([0.5]), end=3) is None
    assert tree.draw(np.array([0.5]))[0].tolist() == [3]


def test_values_is_a_read_only_view_that_follows_updates():
    tree = MinSegmentTree(3)
    values = tree.values
    tree.update_unique(np.array([1]), np.array([2.0]))
    assert values.tolist() == [np.inf, 2.0, np.inf] and len(values) == 3
    with pytest.raises(ValueError):
        values[0] = 1.0


@pytest.mark.parametrize("cls", [SumSegmentTree, MinSegmentTree])
def test_set_all_and_reduce_all_agree_with_update_and_query(cls):
    values = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    a, b = cls(5), cls(5)
    a.set_all(values)
    b.update(np.arange(5), values)
    assert a[:].tolist() == b[:].tolist() and a.query(1, 4) == b.query(1, 4)
    assert a.reduce_all() == pytest.approx(b.query())
    with pytest.raises(ValueError, match="one per leaf"):
        a.set_all(values[:3])
