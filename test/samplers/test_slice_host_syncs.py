"""Slice draws make no host sync once the trajectory index is up to date (NOTE [host syncs of slice draws] in
``samplers/slice.py``), counted on the CPU with :class:`helpers.syncs.SyncCounter`.

Paths: the live index of a 1-D CPU tensor storage (draws right after an append included), and the boundaries found
in the whole storage (``ndim=2`` storages, a layout the live index does not follow; on CUDA, ``strict_length=False``),
where the first draw after a write finds them again and may sync; compilable storages. The dense index of 1-D CUDA
storages has its own tests (test_slice_dense_index.py). Only the sampler's
``sample`` is counted: the buffer's ``extend`` and the storage's ``get`` are the storage's. With a CUDA device, the
same draws run under ``torch.cuda.set_sync_debug_mode("error")``."""

from __future__ import annotations

import pytest
import torch
from helpers.factories import DONE, episodes
from helpers.syncs import SyncCounter

from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.samplers.slice_without_replacement import SliceSamplerWithoutReplacement

BATCH = 64
SOURCES = {"traj_key": {"traj_key": "episode"}, "end_key": {"end_key": DONE}}
SHAPES = {"num_slices": {"num_slices": 4}, "slice_len": {"slice_len": 16}}
# strict_length=False with every trajectory long enough for a slice: nothing is dropped or padded
LENGTHS = {
    "strict": {},
    "not-strict": {"strict_length": False},
    "padded": {"strict_length": False, "pad_output": True},
}
STREAM = episodes([40] * 60)  # 2400 steps: several wraps of a 200-row ring, every trajectory >= 16 steps


def _syncs_of_draws(sampler, storage, draws: int = 3) -> list[str]:
    with SyncCounter() as syncs:
        for _ in range(draws):
            sampler.sample(storage, BATCH)
    return syncs.ops


def _appending_buffer(sampler, capacity: int = 200):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=BATCH)
    return rb, rb.storage


@pytest.mark.parametrize("lengths", sorted(LENGTHS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_draws_between_and_right_after_appends_make_no_host_sync(source, shape, lengths):
    sampler = SliceSampler(**SOURCES[source], **SHAPES[shape], **LENGTHS[lengths])
    rb, storage = _appending_buffer(sampler)
    rb.extend(STREAM[:120])
    sampler.sample(storage, BATCH)  # builds the index
    assert _syncs_of_draws(sampler, storage) == []
    # appends, across ring wraps: each draw catches up first. Without strict_length, whole trajectories: the ring
    # would otherwise cut its oldest one shorter than a slice (then the batch is shorter, which syncs)
    step = 56 if lengths == "strict" else 40
    for start in range(120, 1000, step):
        rb.extend(STREAM[start : start + step])
        assert _syncs_of_draws(sampler, storage, draws=1) == [], f"after the append at {start}"
    assert sampler.trajectory_index_stats["rebuilds"] == 1


@pytest.mark.parametrize("span", [True, 3, (2, 0)])
def test_draws_with_a_span_make_no_host_sync(span):
    sampler = SliceSampler(slice_len=8, traj_key="episode", span=span)
    rb, storage = _appending_buffer(sampler)
    rb.extend(STREAM[:300])
    sampler.sample(storage, BATCH)
    assert _syncs_of_draws(sampler, storage) == []


def _unfollowed_layout_storage():
    """A 1-D storage whose newest row is not its last filled one: the live index does not follow it."""
    storage = LazyTensorStorage(200)
    storage.set(torch.arange(160), STREAM[:160])
    storage.set(torch.arange(20), STREAM[160:180])
    return storage


def _two_env_storage():
    storage = LazyTensorStorage(300, ndim=2)  # 150 rows of 2 envs
    storage.set(torch.arange(120), torch.stack([STREAM[:120], STREAM[1000:1120]], 1))
    return storage


@pytest.mark.parametrize("lengths", ["strict", "not-strict"])
@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("storage_fn", [_unfollowed_layout_storage, _two_env_storage], ids=["1d", "ndim2"])
@pytest.mark.parametrize("cache_values", [False, True])
def test_draws_from_boundaries_found_in_the_whole_storage_make_no_host_sync(
    storage_fn, source, lengths, cache_values
):
    storage = storage_fn()
    kwargs = {**SOURCES[source], **LENGTHS[lengths]}
    if lengths == "not-strict":  # the short trajectory at the write seam would shorten slices: use short ones
        kwargs["slice_len"] = 1
    else:
        kwargs["num_slices"] = 4
    sampler = SliceSampler(cache_values=cache_values, **kwargs)
    first, _ = sampler.sample(storage, BATCH)  # finds the boundaries (may sync)
    assert sampler.trajectory_index_stats["rebuilds"] == 0  # not the live index
    assert _syncs_of_draws(sampler, storage) == []
    rows = STREAM[180:190]  # a write: the next draw finds the new boundaries
    storage.set(torch.arange(20, 30), rows if storage.ndim == 1 else torch.stack([rows, rows], 1))
    sampler.sample(storage, BATCH)
    assert _syncs_of_draws(sampler, storage) == []


def test_boundaries_kept_without_cache_values_follow_every_write():
    """Kept between draws (keyed on the write revision), the boundaries are found again after each write."""
    storage = LazyTensorStorage(60, ndim=2)
    storage.set(torch.arange(30), torch.stack([episodes([10] * 3), episodes([10] * 3)], 1))
    sampler = SliceSampler(slice_len=10, traj_key="episode")
    index, _ = sampler.sample(storage, 40)
    assert (index[0].view(4, 10) % 10 == torch.arange(10)).all()
    storage.set(torch.arange(30), torch.stack([episodes([5] * 6), episodes([5] * 6)], 1))  # same rows
    with pytest.raises(RuntimeError, match="strict_length"):
        sampler.sample(storage, 40)
    index, _ = SliceSampler(slice_len=5, traj_key="episode").sample(storage, 40)
    assert (index[0].view(8, 5) % 5 == torch.arange(5)).all()


@pytest.mark.parametrize("pad_output", [False, True])
def test_not_strict_draws_equal_strict_ones_when_every_trajectory_holds_a_slice(pad_output):
    storage = LazyTensorStorage(200)
    storage.set(torch.arange(160), STREAM[:160])
    strict = SliceSampler(slice_len=16, traj_key="episode")
    loose = SliceSampler(slice_len=16, traj_key="episode", strict_length=False, pad_output=pad_output)
    storage.set(torch.arange(160, 200), STREAM[160:200])  # add "is_init" flags the slices also mark
    for sampler in (strict, loose):
        sampler._rng = torch.Generator().manual_seed(3)
    for _ in range(3):
        (index_a,), info_a = strict.sample(storage, BATCH)
        (index_b,), info_b = loose.sample(storage, BATCH)
        assert torch.equal(index_a, index_b)
        assert sorted(info_a, key=str) == sorted(info_b, key=str)
        for key, value in info_a.items():
            assert torch.equal(value, info_b[key]), key


def test_slices_without_replacement_make_no_host_sync():
    sampler = SliceSamplerWithoutReplacement(num_slices=4, traj_key="episode")
    rb, storage = _appending_buffer(sampler)
    rb.extend(STREAM[:200])
    sampler.sample(storage, BATCH)
    assert _syncs_of_draws(sampler, storage, draws=6) == []  # across the end of an epoch (5 trajectories)
    ndim2 = _two_env_storage()
    sampler = SliceSamplerWithoutReplacement(num_slices=4, traj_key="episode")
    sampler.sample(ndim2, BATCH)
    assert _syncs_of_draws(sampler, ndim2, draws=6) == []


def test_prioritized_slices_make_no_tensor_host_sync_on_the_cpu():
    """The slice part makes none; the priority trees are host (numpy) ones here, whose reads the count cannot see."""
    sampler = PrioritizedSliceSampler(200, alpha=0.7, beta=0.5, num_slices=4, traj_key="episode")
    rb, storage = _appending_buffer(sampler)
    rb.extend(STREAM[:200])
    sampler.sample(storage, BATCH)
    assert _syncs_of_draws(sampler, storage) == []
    rb.extend(STREAM[200:256])
    assert _syncs_of_draws(sampler, storage, draws=1) == []


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_draws_from_a_compilable_storage_read_its_counters_only_after_a_write(source):
    """Its counters are a tensor (a sync to read): the boundaries are kept until the sampler hears of a write."""
    sampler = SliceSampler(num_slices=4, **SOURCES[source])
    storage = LazyTensorStorage(200, compilable=True)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=BATCH, compilable=True)
    rb.extend(STREAM[:120])
    sampler.sample(storage, BATCH)
    assert _syncs_of_draws(sampler, storage) == []
    rb.extend(
        episodes([60], first_episode=100)
    )  # heard: the next draw reads the new trajectory (rows 120..179)
    for _ in range(3):
        (index,), _ = sampler.sample(storage, 200)  # slices of 50 steps: only the new trajectory holds one
        assert (index >= 120).all() and (index < 180).all()
    assert _syncs_of_draws(sampler, storage) == []
    storage.set(torch.arange(130, 140), episodes([10], first_episode=200))  # cuts it: told by mark_update
    sampler.mark_update(torch.arange(130, 140), storage=storage)
    with pytest.raises(RuntimeError, match="strict_length"):
        sampler.sample(storage, 200)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lengths", sorted(LENGTHS))
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_draws_from_a_cuda_storage_do_not_sync(source, lengths):
    storage = LazyTensorStorage(200, device="cuda")
    storage.set(torch.arange(200), STREAM[:200])
    sampler = SliceSampler(num_slices=4, **SOURCES[source], **LENGTHS[lengths])
    sampler.sample(storage, BATCH)  # finds the boundaries (syncs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            index, info = sampler.sample(storage, BATCH)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert index[0].device.type == "cuda" and info[("next", "truncated")].device.type == "cuda"
