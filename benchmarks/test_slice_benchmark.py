"""Benchmarks of the slice samplers (pytest-benchmark).

Data: the core benchmark data (``obs: f32[84]``, ``action: i64``, ``reward: f32``,
``("next", "obs"): f32[84]``, ``("next", "done"): bool``) in trajectories of 100 steps, batch 256.
Targets (issue 3):

- ``SliceSampler(slice_len=32, cache_values=True)`` on 100k entries: at most 2x ``RandomSampler`` (compared
  both on the sampler alone and on a full draw, sampler + ``storage.get``);
- ``SliceSampler(slice_len=32)`` without cache on 1M entries: under 5 ms per batch.

Sizes come from the environment so a quick check can run small: ``SLICE_BENCH_ENTRIES`` (default 100_000) and
``SLICE_BENCH_LARGE_ENTRIES`` (default 1_000_000), e.g.
``SLICE_BENCH_ENTRIES=2000 SLICE_BENCH_LARGE_ENTRIES=4000 pytest benchmarks/test_slice_benchmark.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, RandomSampler
from torchrl.data.replay_buffers.samplers.slice import SliceSampler

ENTRIES = int(os.environ.get("SLICE_BENCH_ENTRIES", 100_000))
LARGE_ENTRIES = int(os.environ.get("SLICE_BENCH_LARGE_ENTRIES", 1_000_000))
TRAJ_LEN = 100
BATCH = 256


def _core_storage(n: int, *, small: bool = False) -> LazyTensorStorage:
    """``n`` steps of the core data in trajectories of ``TRAJ_LEN`` steps (``small``: flags only)."""
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[TRAJ_LEN - 1 :: TRAJ_LEN] = True
    fields = {("next", "done"): done}
    if not small:
        fields.update(
            {
                "obs": torch.randn(n, 84),
                "action": torch.randint(0, 4, (n,)),
                "reward": torch.randn(n),
                ("next", "obs"): torch.randn(n, 84),
            }
        )
    storage = LazyTensorStorage(n)
    storage.set(torch.arange(n), TensorDict(fields, batch_size=[n]))
    return storage


@pytest.fixture(scope="module")
def storage():
    return _core_storage(ENTRIES)


@pytest.fixture(scope="module")
def large_storage():
    return _core_storage(LARGE_ENTRIES, small=True)  # the sampler reads only the done flags


def _generator(sampler):
    sampler._rng = torch.Generator().manual_seed(0)
    return sampler


@pytest.mark.benchmark(group="slice-sampler-100k")
def test_random_sampler_sample(benchmark, storage):
    sampler = _generator(RandomSampler())
    benchmark(sampler.sample, storage, BATCH)


@pytest.mark.benchmark(group="slice-sampler-100k")
def test_slice_sampler_cached_sample(benchmark, storage):
    sampler = _generator(SliceSampler(slice_len=32, cache_values=True))
    sampler.sample(storage, BATCH)  # build the cache
    index, _ = benchmark(sampler.sample, storage, BATCH)
    assert index[0].numel() == BATCH


@pytest.mark.benchmark(group="slice-draw-100k")
def test_random_sampler_draw(benchmark, storage):
    sampler = _generator(RandomSampler())
    benchmark(lambda: storage.get(sampler.sample(storage, BATCH)[0]))


@pytest.mark.benchmark(group="slice-draw-100k")
def test_slice_sampler_cached_draw(benchmark, storage):
    sampler = _generator(SliceSampler(slice_len=32, cache_values=True))
    sampler.sample(storage, BATCH)
    benchmark(lambda: storage.get(sampler.sample(storage, BATCH)[0]))


@pytest.mark.benchmark(group="slice-sampler-1M")
def test_slice_sampler_uncached_sample_large(benchmark, large_storage):
    sampler = _generator(SliceSampler(slice_len=32, end_key=("next", "done")))
    index, _ = benchmark(sampler.sample, large_storage, BATCH)
    assert index[0].numel() == BATCH
