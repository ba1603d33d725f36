"""The min tree's update rescans a block once however many of its leaves grew (issue 30, item 2): same block
minimums on the numpy and the compiled path as a brute-force minimum, and (numpy path) one scan per block."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.extras import needs

from torchrl.data import PrioritizedSampler
from torchrl.data.replay_buffers.samplers import _tree_kernels
from torchrl.data.replay_buffers.samplers.segment_tree import MinSegmentTree

KERNELS = ["numpy", pytest.param("numba", marks=needs("numba"))]
CAPACITY = 1 << 15  # blocks of 16 leaves under a flat level of 2048 slots


def _flat_level(tree: MinSegmentTree) -> np.ndarray:
    """The block minimums, read through whole-block queries."""
    lo = 1 << 11
    return np.asarray([tree.query(b * (CAPACITY // lo), (b + 1) * (CAPACITY // lo)) for b in range(lo)])


def _expected_blocks(leaves: np.ndarray) -> np.ndarray:
    return leaves.reshape(1 << 11, -1).min(axis=1)


@pytest.mark.parametrize("kernel", KERNELS)
def test_many_grown_leaves_of_one_block_keep_exact_minimums(kernel):
    tree = MinSegmentTree(CAPACITY, kernel=kernel)
    tree.update(np.arange(CAPACITY), 1.0)  # every leaf holds its block's minimum
    grown = np.arange(32, 48)  # all 16 leaves of block 2 grow, and 10 of block 3
    grown = np.concatenate([grown, np.arange(48, 58)])
    tree.update(grown, np.linspace(2.0, 3.0, grown.size))
    leaves = tree.values.copy()
    blocks = _flat_level(tree)
    np.testing.assert_array_equal(blocks, _expected_blocks(leaves))
    assert blocks[2] == 2.0 and blocks[3] == 1.0
    assert tree.query() == 1.0 and tree.query(32, 48) == 2.0


@pytest.mark.parametrize("seed", range(4))
def test_random_updates_give_the_same_tree_on_both_paths_and_the_brute_force_minimum(seed):
    rng = np.random.default_rng(seed)
    kernels = ["numpy"] + (["numba"] if _tree_kernels.compiled_kernels() is not None else [])
    trees = {k: MinSegmentTree(CAPACITY, kernel=k) for k in kernels}
    reference = np.full(CAPACITY, np.inf)
    for _ in range(30):
        # a few crowded blocks: many leaves of one block grow in one update, others shrink beside them
        start = int(rng.integers(0, CAPACITY - 64))
        index = np.unique(np.concatenate([start + rng.integers(0, 64, 40), rng.integers(0, CAPACITY, 20)]))
        index = rng.permutation(index)
        value = rng.choice([0.5, 1.0, 2.0, np.inf], index.size) * rng.random(index.size)
        reference[index] = value
        for tree in trees.values():
            tree.update_unique(index, value)
    for tree in trees.values():
        np.testing.assert_array_equal(tree.values, reference)
        blocks = _flat_level(tree)
        np.testing.assert_array_equal(blocks, _expected_blocks(reference))
    if len(trees) == 2:
        np.testing.assert_array_equal(trees["numpy"]._tree, trees["numba"]._tree)


class _CountingLeaves(np.ndarray):
    """The leaves of a tree, recording how many blocks each fancy-indexed read of a block view gathers."""

    gathered: list[int] = []

    def __getitem__(self, item):
        if isinstance(item, np.ndarray) and self.ndim == 2:
            _CountingLeaves.gathered.append(int(item.size))
        return super().__getitem__(item)


def test_the_numpy_update_scans_each_block_once():
    tree = MinSegmentTree(CAPACITY, kernel="numpy")
    tree.update(np.arange(CAPACITY), 1.0)
    size = tree._size  # the test looks inside the tree it built: its leaves view records its block reads
    tree._leaves = tree._tree[size:].view(_CountingLeaves)
    _CountingLeaves.gathered = []
    tree.update_unique(np.arange(32, 64), np.full(32, 2.0))  # 32 grown leaves of 2 blocks
    assert _CountingLeaves.gathered == [2]
    np.testing.assert_array_equal(tree._tree[(1 << 11) + 2 : (1 << 11) + 4], [2.0, 2.0])


@pytest.mark.parametrize("kernel", KERNELS)
def test_extend_after_the_max_rose_keeps_the_weights_of_a_sampler(kernel):
    previous = _tree_kernels.DEFAULT_KERNEL
    _tree_kernels.DEFAULT_KERNEL = kernel
    try:
        sampler = PrioritizedSampler(CAPACITY, alpha=1.0, beta=1.0, eps=0.0, dtype=torch.float64)
    finally:
        _tree_kernels.DEFAULT_KERNEL = previous
    sampler.extend(torch.arange(CAPACITY))
    sampler.update_priority(torch.tensor([5]), torch.tensor([4.0]))  # new items get 4.0 from now on
    sampler.extend(torch.arange(100, 300))  # 200 grown leaves over 13 blocks, each held its block's minimum
    sampler.update_priority(torch.tensor([7]), torch.tensor([0.5]))
    leaves = sampler._sum_tree.values
    np.testing.assert_array_equal(sampler._min_tree.values, np.where(leaves > 0, leaves, np.inf))
    assert sampler._min_tree.query(96, 304) == 1.0 and sampler._min_tree.query(112, 288) == 4.0
    assert sampler._min_tree.reduce_all() == 0.5
