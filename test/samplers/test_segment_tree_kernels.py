"""The fast prioritized trees: the compiled (numba) loops give bit-identical trees and draws to the numpy loops,
both match a brute-force cumsum/min under random batched updates, repeated indices keep the last write, and the
min tree's block minimums stay exact when the leaf holding a block's minimum grows."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers.extras import needs
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl.data import LazyTensorStorage, PrioritizedSampler
from torchrl.data.replay_buffers.samplers import _tree_kernels
from torchrl.data.replay_buffers.samplers.segment_tree import MinSegmentTree, SumSegmentTree

KERNELS = ["numpy", pytest.param("numba", marks=needs("numba"))]
FLAT_LEVELS = (0, 2, 11)


def _tree(cls, capacity: int, kernel: str, flat_level: int = 11):
    tree = cls(capacity, kernel=kernel)
    tree._flat_level = min(tree._depth, flat_level)  # before any write
    return tree


def _brute_first_reaching(leaves: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The first leaf whose inclusive prefix sum reaches each ``v`` (exact in integers)."""
    return np.searchsorted(np.cumsum(leaves), v, side="left")


# -- invariants vs brute force, both kernels ---------------------------------------------------------------------
@st.composite
def _batches(draw):
    capacity = draw(st.integers(1, 300))
    batch = st.lists(st.tuples(st.integers(0, capacity - 1), st.integers(0, 9)), min_size=1, max_size=40)
    return capacity, draw(st.lists(batch, min_size=1, max_size=6)), draw(st.sampled_from(FLAT_LEVELS))


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=40, deadline=None)
@given(scenario=_batches())
def test_sums_minimums_and_searches_match_a_brute_force_cumsum(kernel, scenario):
    capacity, batches, flat_level = scenario
    sums = _tree(SumSegmentTree, capacity, kernel, flat_level)
    mins = _tree(MinSegmentTree, capacity, kernel, flat_level)
    reference = np.zeros(capacity)
    written = np.full(capacity, np.inf)  # a min tree's leaves never written hold +inf
    for batch in batches:
        index = np.array([i for i, _ in batch])
        value = np.array([float(v) for _, v in batch])
        sums.update(index, value)
        mins.update(index, value)
        for i, v in batch:  # the reference semantics: writes in order, the last one wins
            reference[i] = written[i] = v
        assert sums.query() == reference.sum() and sums.reduce_all() == reference.sum()
        assert mins.query() == written.min() and mins.reduce_all() == written.min()
        for start, end in [(0, capacity), (capacity // 3, capacity - capacity // 4), (1, 2), (0, 0)]:
            end = min(max(end, start), capacity)
            assert sums.query(start, end) == reference[start:end].sum()
            assert mins.query(start, end) == (written[start:end].min() if end > start else np.inf)
        total = reference.sum()
        if total > 0:
            v = np.arange(1, int(total) + 1, dtype=np.float64)  # every integer prefix sum: exact arithmetic
            assert sums.scan_lower_bound(v).tolist() == _brute_first_reaching(reference, v).tolist()


@pytest.mark.parametrize("kernel", KERNELS)
def test_repeated_indices_keep_the_last_value(kernel):
    sums, mins = SumSegmentTree(10, kernel=kernel), MinSegmentTree(10, kernel=kernel)
    index, value = [3, 7, 3, 3, 7, 1], [5.0, 1.0, 2.0, 9.0, 4.0, 6.0]
    sums.update(index, value)
    mins.update(index, value)
    assert sums[:].tolist() == [0.0, 6.0, 0.0, 9.0, 0, 0, 0, 4.0, 0, 0]
    assert sums.query() == 19.0 and mins.query() == 4.0 and mins.query(2, 5) == 9.0


@pytest.mark.parametrize("kernel", KERNELS)
def test_min_tree_recomputes_a_block_whose_minimum_grew(kernel):
    # 4096 leaves, 2048 flat slots: blocks of 2 leaves; leaf 6 holds its block's (and the tree's) minimum
    tree = MinSegmentTree(4096, kernel=kernel)
    tree.set_all(np.full(4096, 5.0))
    tree.update([6], [1.0])
    assert tree.query() == 1.0 and tree.query(6, 8) == 1.0
    tree.update([6, 7], [8.0, 3.0])  # the holder grows while its neighbour lowers the block
    assert tree.query() == 3.0 and tree.query(6, 8) == 3.0 and tree.query(6, 7) == 8.0
    tree.update([7], [9.0])  # the new holder grows: the block is recomputed from both leaves
    assert tree.query(6, 8) == 8.0 and tree.query() == 5.0
    tree.update([0, 1, 1], [0.5, 2.0, 0.25])  # two leaves of one block in one batch: the lowest survives
    assert tree.query(0, 2) == 0.25 and tree.reduce_all() == 0.25


# -- numba vs numpy: identical trees and draws -------------------------------------------------------------------
@needs("numba")
@pytest.mark.parametrize("capacity", [5, 100, 3000, 1 << 15])
@pytest.mark.parametrize("flat_level", FLAT_LEVELS)
def test_compiled_trees_and_draws_are_bit_identical_to_numpy(capacity, flat_level):
    rng = np.random.default_rng(capacity + flat_level)
    trees = {
        kernel: (_tree(SumSegmentTree, capacity, kernel, flat_level), _tree(MinSegmentTree, capacity, kernel, flat_level))
        for kernel in ("numpy", "numba")
    }
    assert trees["numba"][0].kernel == "numba" and trees["numpy"][0].kernel == "numpy"
    for _ in range(15):
        index = rng.integers(0, capacity, min(capacity, 256))
        value = rng.random(index.size) * rng.choice([0.0, 1.0, 1e-30, 1e30], index.size)  # zeros, tiny, huge
        uniform = rng.random(300)
        drawn = {}
        for kernel, (sums, mins) in trees.items():
            sums.update(index, value)
            mins.update(index, value)
            drawn[kernel] = sums.draw(uniform)
        np.testing.assert_array_equal(trees["numpy"][0]._tree, trees["numba"][0]._tree)
        np.testing.assert_array_equal(trees["numpy"][1]._tree, trees["numba"][1]._tree)
        a, b = drawn["numpy"], drawn["numba"]
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])


def _prioritized_run(monkeypatch, kernel: str, n: int, seed: int):
    """Samples and updates of a prioritized sampler, trees built with ``kernel``, from one generator state."""
    monkeypatch.setattr(_tree_kernels, "DEFAULT_KERNEL", kernel)
    sampler = PrioritizedSampler(n, alpha=0.7, beta=0.5)
    assert sampler._sum_tree.kernel == kernel and sampler._min_tree.kernel == kernel
    storage = LazyTensorStorage(n)
    storage.set(torch.arange(n), torch.arange(n))
    sampler.extend(torch.arange(n))
    sampler._rng = torch.Generator().manual_seed(seed)
    priorities = torch.Generator().manual_seed(seed + 1)
    out = []
    for step in range(30):
        index, info = sampler.sample(storage, 64)
        out.append((index.clone(), info["priority_weight"].clone()))
        new = torch.rand(64, generator=priorities) * (step % 3)  # zeros every third step
        sampler.update_priority(index, new, storage=storage)
        if step % 7 == 0:
            sampler.mark_update(torch.arange(13))  # rewritten items: the default (max) priority
    return out, sampler.state_dict()


@needs("numba")
@pytest.mark.parametrize("n", [100, 5000])
def test_prioritized_sampler_draws_are_identical_with_and_without_numba(monkeypatch, n):
    numpy_draws, numpy_state = _prioritized_run(monkeypatch, "numpy", n, seed=3)
    numba_draws, numba_state = _prioritized_run(monkeypatch, "numba", n, seed=3)
    for (i_np, w_np), (i_nb, w_nb) in zip(numpy_draws, numba_draws):
        assert torch.equal(i_np, i_nb) and torch.equal(w_np, w_nb)
    for key in ("_sum_tree", "_min_tree"):
        assert torch.equal(numpy_state[key]["values"], numba_state[key]["values"])
    assert numpy_state["_max_priority"] == numba_state["_max_priority"]


# -- the kernel choice ---------------------------------------------------------------------------------------------
def test_a_bad_kernel_name_raises_naming_the_choices():
    with pytest.raises(ValueError, match=r"`kernel` must be one of \['auto', 'numba', 'numpy'\]"):
        SumSegmentTree(4, kernel="cuda")


def test_numpy_is_forced_by_the_kernel_argument_and_survives_pickling():
    tree = SumSegmentTree(8, kernel="numpy")
    tree.update([1, 2], [1.0, 2.0])
    assert tree.kernel == "numpy"
    copy = pickle.loads(pickle.dumps(tree))
    assert copy.kernel == "numpy" and copy.query() == 3.0 and copy.draw(np.array([0.9]))[0].tolist() == [1]


@needs("numba")
def test_a_pickled_numba_tree_keeps_working_and_its_kernel():
    tree = MinSegmentTree(64, kernel="numba")
    tree.update([3, 40], [2.0, 1.0])
    copy = pickle.loads(pickle.dumps(tree))
    assert copy.kernel == "numba" and copy.query() == 1.0
    copy.update([40], [5.0])
    assert copy.query() == 2.0 and tree.query() == 1.0


def test_the_environment_variable_forces_numpy_in_a_fresh_process():
    import subprocess
    import sys

    code = (
        "from torchrl.data.replay_buffers.samplers.segment_tree import SumSegmentTree;"
        "print(SumSegmentTree(4).kernel)"
    )
    env = {**__import__("os").environ, _tree_kernels.KERNEL_ENV: "numpy"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "numpy"
