"""Benchmarks of prioritized sampling and of the segment tree (pytest-benchmark).

Data: the core benchmark data (``obs: f32[84]``, ``action: i64``, ``reward: f32``,
``("next", "obs"): f32[84]``, ``("next", "done"): bool``) in trajectories of 100 steps, batch 256.
Targets (issue 3):

- ``PrioritizedSampler`` sample + ``update_priority`` of the batch on 100k entries: at most 2x
  ``RandomSampler`` sample, compared three ways: the samplers alone, a full draw (sampler + ``storage.get``)
  and at the buffer level (``ReplayBuffer.sample()`` vs ``PrioritizedReplayBuffer.sample()`` +
  ``update_priority``). Not met (about 3.5x on a full draw on the 2-core reference machine): see the
  breakdown the script prints and the closing note of issue 3;
- ``SumSegmentTree`` of capacity 1M: a batched update of 256 leaves + a search of 256 prefix sums in under
  200 microseconds.

Sizes come from the environment so a quick check can run small: ``PRIORITIZED_BENCH_ENTRIES`` (default
100_000) and ``PRIORITIZED_BENCH_TREE_CAPACITY`` (default 1_048_576), e.g.
``PRIORITIZED_BENCH_ENTRIES=2000 PRIORITIZED_BENCH_TREE_CAPACITY=4096 pytest
benchmarks/test_prioritized_benchmark.py``. ``python benchmarks/test_prioritized_benchmark.py [--rounds R]``
prints the same comparisons as a table, each pair timed in interleaved rounds (median microseconds per
batch, median of the per-round ratios), then the time of each part of the prioritized loop (sample /
``storage.get`` / ``update_priority``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import pytest
import torch
from _timing import interleaved, median_ratio, repeat
from tensordict import TensorDict

from torchrl.data import PrioritizedReplayBuffer, ReplayBuffer
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


def _interleaved(pairs, *, rounds: int, number: int = 200) -> list[tuple[str, float, str, float, float]]:
    """For each ``(name_a, fn_a, name_b, fn_b)``: median microseconds over ``rounds`` rounds that time
    ``fn_a`` then ``fn_b`` (``number`` calls each), and the median of the per-round ratios ``b / a``."""
    results = []
    for name_a, fn_a, name_b, fn_b in pairs:
        a_s, b_s = interleaved(fn_a, fn_b, rounds=rounds, number=number)
        results.append((name_a, statistics.median(a_s) * 1e6, name_b, statistics.median(b_s) * 1e6,
                        median_ratio(b_s, a_s)))
    return results


def _buffers(n: int):
    """A uniform ReplayBuffer and a PrioritizedReplayBuffer holding the same ``n`` core steps."""
    data = _core_storage(n)._storage
    uniform = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=BATCH)
    uniform.extend(data)
    prioritized = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(n), batch_size=BATCH)
    prioritized.extend(data)
    prioritized.update_priority(torch.arange(n), torch.rand(n, generator=torch.Generator().manual_seed(1)))
    return uniform, prioritized


def _breakdown(sampler, storage, td_error, steps: int = 2000) -> tuple[float, float, float]:
    """Median microseconds of sample / storage.get / update_priority inside the prioritized learner loop."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        index, _ = sampler.sample(storage, BATCH)
        t1 = time.perf_counter()
        storage.get(index)
        t2 = time.perf_counter()
        sampler.update_priority(index, td_error)
        times.append((t1 - t0, time.perf_counter() - t2, t2 - t1))
    sample, update, get = (statistics.median(column) * 1e6 for column in zip(*times))
    return sample, get, update


def _tree_us() -> float:
    tree, rng = _filled_tree(TREE_CAPACITY), np.random.default_rng(1)
    return statistics.median(repeat(lambda: _tree_step(tree, rng), 7, 200)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per comparison")
    rounds = parser.parse_args().rounds
    tree_us = _tree_us()  # the tree alone first, before the process holds the buffers (its own target)
    print(f"SumSegmentTree({TREE_CAPACITY}) update {BATCH} + search {BATCH}: {tree_us:.1f} us (target < 200)")
    storage = _core_storage(ENTRIES)
    random_sampler, prioritized = _random_sampler(), _prioritized_sampler(ENTRIES)
    td_error = _td_errors()
    uniform_rb, prioritized_rb = _buffers(ENTRIES)

    def buffer_step():
        _, info = prioritized_rb.sample(return_info=True)
        prioritized_rb.update_priority(info["index"], td_error)

    pairs = [
        (
            "RandomSampler.sample (sampler only)",
            lambda: _random_step(random_sampler, storage, read=False),
            "PrioritizedSampler.sample + update_priority (sampler only)",
            lambda: _prioritized_step(prioritized, storage, td_error, read=False),
        ),
        (
            "RandomSampler.sample + storage.get",
            lambda: _random_step(random_sampler, storage, read=True),
            "PrioritizedSampler.sample + storage.get + update_priority",
            lambda: _prioritized_step(prioritized, storage, td_error, read=True),
        ),
        (
            "ReplayBuffer.sample()",
            uniform_rb.sample,
            "PrioritizedReplayBuffer.sample() + update_priority",
            buffer_step,
        ),
    ]
    print(f"{ENTRIES} entries, batch {BATCH}, {rounds} interleaved rounds (ratio: median of round ratios)")
    for name_a, a_us, name_b, b_us, ratio in _interleaved(pairs, rounds=rounds):
        print(f"  {name_a:<62} {a_us:8.1f} us")
        print(f"  {name_b:<62} {b_us:8.1f} us   x{ratio:.2f}")
    sample, get, update = _breakdown(prioritized, storage, td_error)
    print(
        f"Inside the prioritized loop (medians): sample {sample:.1f} us, storage.get {get:.1f} us, "
        f"update_priority {update:.1f} us"
    )


if __name__ == "__main__":
    main()
