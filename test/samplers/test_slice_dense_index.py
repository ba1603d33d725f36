"""The dense trajectory index of slice samplers on accelerators (NOTE [dense trajectory index] in
``trajectories/dense_index.py``), run on CPU tensors: the same trajectories and the same draws as the compact index,
built and drawn from without a host sync, and the witness that a trajectory holds a slice carried over appends."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.factories import DONE, episodes, ring_write
from helpers.syncs import SyncCounter
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl.data import LazyTensorStorage
from torchrl.data.replay_buffers.samplers.slice import SliceSampler, _Boundaries
from torchrl.data.replay_buffers.trajectories.dense_index import DenseEligible, DenseTrajectories
from torchrl.data.replay_buffers.trajectories.ends import find_trajectories
from torchrl.data.replay_buffers.trajectories.layout import ring_layout


def _written(lengths, capacity, chunk):
    """A storage written by appends of ``chunk`` rows, and its layout."""
    storage = LazyTensorStorage(capacity)
    data = episodes(lengths)
    cursor = 0
    for start in range(0, data.shape[0], chunk):
        cursor = ring_write(storage, data[start : start + chunk], cursor)
    return storage, ring_layout(storage)


def _values(storage, is_done, n_rows):
    return storage.get_entry(DONE if is_done else "episode")[:n_rows].reshape(n_rows)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=25),
    capacity=st.integers(4, 60),
    chunk=st.integers(1, 17),
    is_done=st.booleans(),
)
def test_the_dense_index_holds_the_trajectories_the_compact_one_finds(lengths, capacity, chunk, is_done):
    storage, (n_rows, _, offset, last_row) = _written(lengths, capacity, chunk)
    values = _values(storage, is_done, n_rows)
    compact = find_trajectories(
        values.view(-1, 1), is_done=is_done, n_rows=n_rows, n_cols=1, offset=offset, last_row=last_row, ndim=1
    )
    dense = DenseTrajectories(values, is_done=is_done, offset=offset)
    assert torch.equal(dense.starts, compact.starts) and torch.equal(dense.lengths, compact.lengths)
    rows = torch.arange(n_rows)
    assert torch.equal(dense.storage_index(rows)[0][0], compact.storage_index(rows)[0][0])


@pytest.mark.parametrize("span", [False, True, (0, 2)])
@pytest.mark.parametrize("slice_len", [1, 4, 9])
def test_dense_draws_equal_the_compact_ones_for_the_same_uniforms(slice_len, span):
    storage, (n_rows, _, offset, last_row) = _written([3, 9, 1, 12, 5, 10, 2, 11] * 3, 50, 7)
    values = _values(storage, False, n_rows)
    compact = find_trajectories(
        values.view(-1, 1), is_done=False, n_rows=n_rows, n_cols=1, offset=offset, last_row=last_row, ndim=1
    )
    sampler = SliceSampler(slice_len=slice_len, traj_key="episode", span=span)
    bounds = _Boundaries(key=None, index=compact, done=None, terminated=None, is_init=None)
    expected = sampler._eligible(bounds, slice_len)
    left, right = sampler._span_steps(slice_len)
    dense = DenseEligible(
        DenseTrajectories(values, is_done=False, offset=offset), slice_len, left, right, True
    )
    assert dense.size == expected.size and dense.all_full == expected.all_full
    u = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(slice_len))
    chosen_a, offsets_a = expected.draw(u.clone())
    chosen_b, offsets_b = dense.draw(u.clone())
    assert torch.equal(chosen_a, chosen_b) and torch.equal(offsets_a, offsets_b)
    assert torch.equal(expected.starts_at(chosen_a), dense.starts_at(chosen_b))
    assert torch.equal(expected.lengths_at(chosen_a), dense.lengths_at(chosen_b))


@pytest.mark.parametrize("is_done", [False, True])
def test_the_dense_index_is_built_and_drawn_from_without_a_host_sync(is_done):
    storage, (n_rows, _, offset, _) = _written([40] * 12, 200, 56)
    values = _values(storage, is_done, n_rows)
    previous = DenseTrajectories(values, is_done=is_done, offset=offset)
    elig = DenseEligible(previous, 16, 0, 0, True)
    assert previous.has_trajectory_of(16, elig.before)  # read once (a sync): the witness
    with SyncCounter() as syncs:
        index = DenseTrajectories(values, is_done=is_done, offset=offset, previous=(previous, 0))
        elig = DenseEligible(index, 16, 0, 0, True)
        assert index.has_trajectory_of(16, elig.before)  # carried over: known on the host
        chosen, offsets = elig.draw(torch.rand(8, dtype=torch.float64))
        steps = elig.starts_at(chosen).add_(offsets).unsqueeze(-1) + torch.arange(16)
        index.storage_index(steps.view(-1))
    assert syncs.ops == []


def test_the_witness_holds_while_its_first_row_is_held():
    lengths = [40, 40, 40, 5, 5, 5, 5]
    storage, (n_rows, _, offset, _) = _written(lengths, 140, 20)  # the three long ones, then short ones
    values = _values(storage, False, n_rows)
    index = DenseTrajectories(values, is_done=False, offset=offset)
    assert index.has_trajectory_of(30, DenseEligible(index, 30, 0, 0, True).before)
    newest_long = 80  # the third trajectory of 40 steps starts at row 80
    assert index._witness == {30: newest_long}
    carried = DenseTrajectories(values, is_done=False, offset=offset, previous=(index, 80))
    assert carried._witness == {30: 0}  # still held: the oldest trajectory now
    assert DenseTrajectories(values, is_done=False, offset=offset, previous=(index, 81))._witness == {}
    short = _values(_written([5] * 20, 100, 10)[0], False, 100)
    index = DenseTrajectories(short, is_done=False, offset=0)
    assert not index.has_trajectory_of(6, DenseEligible(index, 6, 0, 0, True).before)
    assert index._witness == {}


@pytest.mark.parametrize("source", [{"traj_key": "episode"}, {"end_key": DONE}])
def test_slices_drawn_from_the_dense_index_equal_those_of_the_live_one(source):
    """What a CUDA storage gets, on the CPU: the sampler's dense boundaries (carried over appends) give the slices
    and info the live index gives for the same generator state, without a host sync after the first build."""
    storage = LazyTensorStorage(200)
    data = episodes([40] * 30)
    dense_sampler, live_sampler = SliceSampler(num_slices=4, **source), SliceSampler(num_slices=4, **source)
    cursor, syncs = ring_write(storage, data[:120], 0), []
    for step, start in enumerate(range(120, 600, 56)):
        n_rows, _, offset, last_row = ring_layout(storage)
        key = dense_sampler._cache_key(storage)
        assert not dense_sampler._finds_dense(
            storage, key, n_rows, last_row
        )  # the CPU: the live index serves
        flags = SliceSampler(num_slices=4, **source)._find_boundaries(storage, key)  # the stored flags
        with SyncCounter() as counter:
            keys, is_done = dense_sampler._resolve_source(storage)
            values = dense_sampler._trajectory_values(storage, keys, is_done, n_rows, 1)
            index = dense_sampler._dense_trajectories(storage, values, (tuple(keys), is_done), offset)
            bounds = _Boundaries(
                key=key, index=index, done=flags.done, terminated=flags.terminated, is_init=None
            )
            elig = dense_sampler._eligible(bounds, 16)
            for sampler in (dense_sampler, live_sampler):
                sampler._rng = torch.Generator().manual_seed(step)
            chosen, offsets = dense_sampler._draw_slices(elig, 4)
            (index_a,), info_a = dense_sampler._build_slices(bounds, elig, chosen, offsets, 16)
        syncs.append(counter.count)
        (index_b,), info_b = live_sampler.sample(storage, 64)
        assert torch.equal(index_a, index_b)
        assert sorted(map(str, info_a)) == sorted(map(str, info_b))
        assert all(torch.equal(value, info_b[key]) for key, value in info_a.items())
        cursor = ring_write(storage, data[start : start + 56], cursor)
    # the first build reads the witness that a trajectory holds a slice (the newest one, started at row 80); the
    # next ones carry it over the appends until the ring overwrites it (after 280 rows), then read a newer one:
    # about once per lap of the ring
    assert syncs[0] == 2 and syncs[1:3] == [0, 0] and syncs[3] == 2, syncs
    assert sum(count > 0 for count in syncs) <= 1 + 600 // 200 and set(syncs) == {0, 2}, syncs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("source", [{"traj_key": "episode"}, {"end_key": DONE}])
def test_draws_right_after_appends_to_a_cuda_storage_sync_about_once_per_lap(source):
    capacity, data = 400, episodes([40] * 60)
    storage = LazyTensorStorage(capacity, device="cuda")
    storage.set(torch.arange(120), data[:120])
    sampler = SliceSampler(num_slices=4, **source)
    sampler.sample(storage, 64)  # the first index and its witness (syncs)
    syncing = 0
    for start in range(120, 2400, 56):  # appends over more than five laps of the ring
        storage.set(torch.arange(start, start + 56) % capacity, data[start : start + 56])
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                (index,), _ = sampler.sample(storage, 64)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncing += bool(caught)
        assert index.device.type == "cuda"
        ids = storage.get(index)["episode"].view(4, 16)
        assert (ids == ids[:, :1]).all()
    assert syncing <= 1 + 2400 // capacity  # a witness read back each time the ring overwrites it


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("source", [{"traj_key": "episode"}, {"end_key": DONE}])
def test_draws_right_after_appends_to_a_large_cuda_storage_do_not_sync(source):
    data = episodes([40] * 60)
    storage = LazyTensorStorage(10_000, device="cuda")
    storage.set(torch.arange(120), data[:120])
    sampler = SliceSampler(num_slices=4, **source)
    sampler.sample(storage, 64)
    for start in range(120, 2400, 56):
        storage.set(torch.arange(start, start + 56), data[start : start + 56])
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            sampler.sample(storage, 64)
        finally:
            torch.cuda.set_sync_debug_mode("default")
