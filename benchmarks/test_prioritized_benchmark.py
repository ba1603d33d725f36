"""Benchmarks of prioritized sampling and of the segment tree (pytest-benchmark).

Data: the core benchmark data (``obs: f32[84]``, ``action: i64``, ``reward: f32``,
``("next", "obs"): f32[84]``, ``("next", "done"): bool``) in trajectories of 100 steps, batch 256.
Targets (issue 3):

- ``PrioritizedSampler`` sample + ``update_priority`` of the batch on 100k entries: at most 2x
  ``RandomSampler`` sample (compared on the sampler alone and on a full draw, sampler + ``storage.get``);
- ``SumSegmentTree`` of capacity 1M: a batched update of 256 leaves + a search of 256 prefix sums in under
  200 microseconds.

Sizes come from the environment so a quick check can run small: ``PRIORITIZED_BENCH_ENTRIES`` (default
100_000) and ``PRIORITIZED_BENCH_TREE_CAPACITY`` (default 1_048_576), e.g.
``PRIORITIZED_BENCH_ENTRIES=2000 PRIORITIZED_BENCH_TREE_CAPACITY=4096 pytest
benchmarks/test_prioritized_benchmark.py``. ``python benchmarks/test_prioritized_benchmark.py`` prints the
same comparisons as a table (median microseconds per batch and ratio to ``RandomSampler``).
"""

from __future__ import annotations

import os
import timeit

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
from torchrl.data.replay_buffers.samplers.random import RandomSampler
from torchrl.data.replay_buffers.samplers.segment_tree import SumSegmentTree
from torchrl.data.replay_buffers.storages import LazyTensorStorage

ENTRIES = int(os.environ.get("PRIORITIZED_BENCH_ENTRIES", 100_000))
TREE_CAPACITY = int(os.environ.get("PRIORITIZED_BENCH_TREE_CAPACITY", 1 << 20))
TRAJ_LEN = 100
BATCH = 256


def _core_storage(n: int) -> LazyTensorStorage:
    """``n`` steps of the core data in trajectories of ``TRAJ_LEN`` steps."""
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[TRAJ_LEN - 1 :: TRAJ_LEN] = True
    data = TensorDict(
        {
            "obs": torch.randn(n, 84),
            "action": torch.randint(0, 4, (n,)),
            "reward": torch.randn(n),
            ("next", "obs"): torch.randn(n, 84),
            ("next", "done"): done,
        },
        batch_size=[n],
    )
    storage = LazyTensorStorage(n)
    storage.set(torch.arange(n), data)
    return storage


def _random_sampler() -> RandomSampler:
    sampler = RandomSampler()
    sampler._rng = torch.Generator().manual_seed(0)
    return sampler


def _prioritized_sampler(n: int) -> PrioritizedSampler:
    sampler = PrioritizedSampler(n, alpha=0.7, beta=0.5)
    sampler._rng = torch.Generator().manual_seed(0)
    sampler.extend(torch.arange(n))
    sampler.update_priority(torch.arange(n), torch.rand(n, generator=torch.Generator().manual_seed(1)))
    return sampler


def _td_errors() -> torch.Tensor:
    return torch.rand(BATCH, generator=torch.Generator().manual_seed(2))


def _prioritized_step(sampler: PrioritizedSampler, storage, td_error: torch.Tensor, *, read: bool):
    """One learner step of the sampler: draw a batch (and read it), then write back its priorities."""
    index, info = sampler.sample(storage, BATCH)
    if read:
        storage.get(index)
    sampler.update_priority(index, td_error)
    return index, info


def _random_step(sampler: RandomSampler, storage, *, read: bool):
    index, info = sampler.sample(storage, BATCH)
    if read:
        storage.get(index)
    return index, info


def _tree_step(tree: SumSegmentTree, rng: np.random.Generator):
    """Update 256 leaves, then search 256 prefix sums (what one prioritized batch costs the sum tree)."""
    tree.update(rng.integers(0, tree.capacity, BATCH), rng.random(BATCH))
    return tree.scan_lower_bound(rng.random(BATCH) * tree.total)


def _filled_tree(capacity: int) -> SumSegmentTree:
    tree = SumSegmentTree(capacity)
    tree.update(np.arange(capacity), np.random.default_rng(0).random(capacity))
    return tree


@pytest.fixture(scope="module")
def storage():
    return _core_storage(ENTRIES)


@pytest.mark.benchmark(group="prioritized-sampler-100k")
def test_random_sampler_sample(benchmark, storage):
    index, _ = benchmark(_random_step, _random_sampler(), storage, read=False)
    assert index.numel() == BATCH


@pytest.mark.benchmark(group="prioritized-sampler-100k")
def test_prioritized_sampler_sample_and_update(benchmark, storage):
    sampler = _prioritized_sampler(ENTRIES)
    index, info = benchmark(_prioritized_step, sampler, storage, _td_errors(), read=False)
    assert index.numel() == BATCH and info["priority_weight"].shape == (BATCH,)


@pytest.mark.benchmark(group="prioritized-draw-100k")
def test_random_sampler_sample_and_get(benchmark, storage):
    index, _ = benchmark(_random_step, _random_sampler(), storage, read=True)
    assert index.numel() == BATCH


@pytest.mark.benchmark(group="prioritized-draw-100k")
def test_prioritized_sampler_sample_get_and_update(benchmark, storage):
    sampler = _prioritized_sampler(ENTRIES)
    index, _ = benchmark(_prioritized_step, sampler, storage, _td_errors(), read=True)
    assert index.numel() == BATCH


@pytest.mark.benchmark(group="segment-tree-1m")
def test_sum_tree_update_and_search(benchmark):
    tree = _filled_tree(TREE_CAPACITY)
    found = benchmark(_tree_step, tree, np.random.default_rng(1))
    assert found.shape == (BATCH,) and found.max() < TREE_CAPACITY


def _median_us(fn, *, number: int = 200, repeat: int = 7) -> float:
    return sorted(timeit.repeat(fn, number=number, repeat=repeat))[repeat // 2] / number * 1e6


def main() -> None:
    storage = _core_storage(ENTRIES)
    random_sampler, prioritized = _random_sampler(), _prioritized_sampler(ENTRIES)
    td_error = _td_errors()
    rows = []
    for read in (False, True):
        base = _median_us(lambda read=read: _random_step(random_sampler, storage, read=read))
        cost = _median_us(lambda read=read: _prioritized_step(prioritized, storage, td_error, read=read))
        what = "sample + storage.get" if read else "sampler only"
        rows.append((f"RandomSampler sample ({what})", base, 1.0))
        rows.append((f"PrioritizedSampler sample + update_priority ({what})", cost, cost / base))
    tree, rng = _filled_tree(TREE_CAPACITY), np.random.default_rng(1)
    tree_us = _median_us(lambda: _tree_step(tree, rng))
    rows.append((f"SumSegmentTree({TREE_CAPACITY}) update {BATCH} + search {BATCH}", tree_us, None))
    print(f"{ENTRIES} entries, batch {BATCH}")
    for name, us, ratio in rows:
        print(f"{name:<72} {us:9.1f} us" + ("" if ratio is None else f"   x{ratio:.2f}"))


if __name__ == "__main__":
    main()
