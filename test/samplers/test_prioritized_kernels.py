"""The prioritized hot path (issue 30, item 2): the draw that reads both trees at once, the compiled update of a
prioritized sampler (one pass for the checks, one for the writes) and the compiled search, each against the numpy
path it replaces: same positions, same trees, same max priority, same errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.extras import needs

from torchrl.data import LazyTensorStorage, PrioritizedSampler
from torchrl.data.replay_buffers.samplers import _tree_kernels
from torchrl.data.replay_buffers.samplers.segment_tree import (
    MinSegmentTree,
    SumSegmentTree,
    draw_with_min,
    update_sum_and_min,
    write_priorities,
)

KERNELS = ["numpy", pytest.param("numba", marks=needs("numba"))]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("capacity", [3, 100, 5000])
def test_draw_with_min_is_the_draw_and_the_smallest_leaf(kernel, capacity):
    rng = np.random.default_rng(capacity)
    sums, mins = SumSegmentTree(capacity, kernel=kernel), MinSegmentTree(capacity, kernel=kernel)
    assert draw_with_min(sums, mins, rng.random(4)) is None  # nothing to draw yet
    index = np.unique(rng.integers(0, capacity, min(capacity, 300)))
    value = rng.random(index.size) * rng.choice([0.0, 1.0, 1e-20], index.size)
    value[0] = 0.5
    update_sum_and_min(sums, mins, index, value)
    mins_of_positive = np.where(value > 0, value, np.inf).min()
    uniform = rng.random(257)
    positions, found, smallest = draw_with_min(sums, mins, uniform)
    expected_positions, expected_found = sums.draw(uniform)
    np.testing.assert_array_equal(positions, expected_positions)
    np.testing.assert_array_equal(found, expected_found)
    assert smallest == mins.reduce_all() == mins_of_positive
    assert (found > 0).all() and np.isin(positions, index[value > 0]).all()


@needs("numba")
@pytest.mark.parametrize("capacity", [64, 4096, 1 << 15])
def test_compiled_search_lands_on_exact_prefix_sums_as_numpy(capacity):
    """Keys equal to a prefix sum (integer leaves: exact sums) sit on the boundary the lower bound decides."""
    rng = np.random.default_rng(7)
    trees = {k: SumSegmentTree(capacity, kernel=k) for k in ("numpy", "numba")}
    leaves = rng.integers(0, 4, capacity).astype(np.float64)
    for tree in trees.values():
        tree.set_all(leaves)
    prefix = np.cumsum(leaves)
    keys = np.concatenate([prefix[leaves > 0], prefix[leaves > 0] - 0.5, rng.random(300) * prefix[-1]])
    keys = keys[keys > 0]
    rng.shuffle(keys)
    expected = np.searchsorted(prefix, keys, side="left")
    for tree in trees.values():
        np.testing.assert_array_equal(tree.scan_lower_bound(keys), expected)


def _sampler(kernel: str, n: int, monkeypatch, **kwargs) -> tuple[PrioritizedSampler, LazyTensorStorage]:
    monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", kernel)
    sampler = PrioritizedSampler(n, alpha=0.7, beta=0.5, **kwargs)
    storage = LazyTensorStorage(n)
    storage.set(torch.arange(n), torch.arange(n))
    sampler.extend(torch.arange(n))
    return sampler, storage


def _state(sampler: PrioritizedSampler):
    state = sampler.state_dict()
    return (
        state["_sum_tree"]["values"],
        state["_min_tree"]["values"],
        state["_priority"],
        state["_max_priority"],
        sampler._sum_tree.query(),
        sampler._min_tree.query(),
    )


UPDATES = [  # (index, priority): repeats, ties at the top with and without repeats, zeros, -1 entries
    ([3, 7, 3, 3, 7, 1], [5.0, 1.0, 2.0, 9.0, 4.0, 6.0]),
    ([9, 2, 5], [4.0, 4.0, 1.0]),  # a tie at the top, no repeat: the first position given holds it
    ([9, 2, 5, 5], [4.0, 4.0, 1.0, 0.5]),  # a tie at the top, with a repeat: the smallest position
    ([0, 1, 2, 0], [0.0, 0.0, 0.0, 0.0]),
    ([4, -1, 6, -1], [2.0, 99.0, 3.0, 99.0]),  # -1 entries are skipped
    ([10, 11, 10], [50.0, 50.0, 1.0]),  # the top written first at 10 is overwritten: 11 holds it
    ([12, 13], [1e60, 3e-9]),  # past float32's range once raised to alpha: clamped in float32 leaves
]


@needs("numba")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("max_priority_within_buffer", [False, True])
def test_compiled_update_priority_matches_the_numpy_path(monkeypatch, max_priority_within_buffer, dtype):
    samplers = {
        k: _sampler(k, 16, monkeypatch, max_priority_within_buffer=max_priority_within_buffer, dtype=dtype)
        for k in ("numpy", "numba")
    }
    assert samplers["numba"][0]._sum_tree.kernel == "numba"
    for index, priority in UPDATES:
        for sampler, storage in samplers.values():
            sampler.update_priority(torch.tensor(index), torch.tensor(priority, dtype=torch.float64), storage=storage)
        got, want = _state(samplers["numba"][0]), _state(samplers["numpy"][0])
        for a, b in zip(got[:3], want[:3]):
            np.testing.assert_array_equal(a.numpy(), b.numpy())  # NaN: a position never given a priority
        assert got[3:] == want[3:]
    sampler = samplers["numba"][0]
    assert sampler._max_priority == 1e60 and sampler._max_priority_index == 12
    assert sampler._priority[[3, 7, 1, 9, 2, 5, 4, 6, 10, 11]].tolist() == [9, 4, 0, 4, 0, 0.5, 2, 3, 1, 50]
    clamped = float(np.finfo(np.float32).max) if dtype is torch.float32 else (1e60 + 1e-8) ** 0.7
    assert sampler._sum_tree[12] == clamped


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "index, priority, error, match",
    [
        ([1, 40], [1.0, 1.0], IndexError, "out of range"),
        ([1, 12], [1.0, 1.0], IndexError, "never written"),
        ([1, 2], [1.0, float("nan")], ValueError, "finite and >= 0"),
        ([1, 2], [1.0, -2.0], ValueError, "finite and >= 0"),
        ([1, 2], [float("inf"), 1.0], ValueError, "finite and >= 0"),
    ],
)
def test_a_refused_update_changes_nothing_on_both_paths(monkeypatch, kernel, index, priority, error, match):
    sampler, _ = _sampler(kernel, 16, monkeypatch)
    storage = LazyTensorStorage(16)
    storage.set(torch.arange(12), torch.arange(12))  # 12 items written
    sampler.update_priority(torch.tensor([0, 5]), torch.tensor([3.0, 0.25]), storage=storage)
    before = _state(sampler)
    with pytest.raises(error, match=match):
        sampler.update_priority(torch.tensor(index), torch.tensor(priority), storage=storage)
    after = _state(sampler)
    for a, b in zip(after[:3], before[:3]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert after[3:] == before[3:]


@needs("numba")
def test_write_priorities_keeps_the_last_write_of_a_repeated_position():
    sums, mins = SumSegmentTree(8, kernel="numba"), MinSegmentTree(8, kernel="numba")
    priority = np.full(8, np.nan)
    top, where = write_priorities(
        sums, mins, priority, np.array([2, 5, 2]), np.array([7.0, 1.0, 3.0]), np.array([7.0, 1.0, 3.0])
    )
    assert (top, where) == (3.0, 2)
    assert sums[:].tolist() == [0, 0, 3.0, 0, 0, 1.0, 0, 0] and sums.query() == 4.0 and mins.query() == 1.0
    assert priority[[2, 5]].tolist() == [3.0, 1.0]


@pytest.mark.parametrize("kernel", KERNELS)
def test_shared_sampler_takes_the_same_update_path(monkeypatch, kernel):
    sampler, storage = _sampler(kernel, 16, monkeypatch)
    sampler.share_memory_()
    sampler.update_priority(torch.tensor([1, 1, 4]), torch.tensor([8.0, 2.0, 5.0]), storage=storage)
    assert sampler._priority[[1, 4]].tolist() == [2.0, 5.0]
    assert (sampler._max_priority, sampler._max_priority_index) == (5.0, 4)
    sampler._rng = torch.Generator().manual_seed(0)
    index, info = sampler.sample(storage, 64)
    assert index.shape == (64,) and info["priority_weight"].dtype == torch.float32
    assert float(info["priority_weight"].max()) <= 1.0
