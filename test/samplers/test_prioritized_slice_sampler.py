"""PrioritizedSliceSampler: starts weighed by priority, slices inside trajectories across the ring wrap, errors and
state, through a buffer, on ``ndim=2`` storages, and ``span=`` (right-truncated slices, the first trajectory)."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.assertions import check_slices, reference_runs
from helpers.factories import TRUNC, episodes, make_buffer, ring_write
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler


# -- prioritized slices --------------------------------------------------------------------------------------
def _prioritized(storage, n, **kwargs):
    kwargs.setdefault("traj_key", "episode")
    sampler = PrioritizedSliceSampler(storage.max_size, alpha=1.0, beta=0.5, eps=0.0, **kwargs)
    sampler.extend(torch.arange(n))
    sampler._rng = torch.Generator().manual_seed(0)
    return sampler


def test_prioritized_starts_only_where_a_full_slice_fits():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(40), episodes([10] * 4))
    sampler = _prioritized(storage, 40, slice_len=4)
    priority = torch.zeros(40)
    priority[[2, 8, 15]] = torch.tensor([1.0, 100.0, 3.0])  # 8 cannot start a slice of 4 (episode ends at 9)
    sampler.update_priority(torch.arange(40), priority)
    index, info = sampler.sample(storage, 4 * 4000)
    starts = index[0].view(-1, 4)[:, 0]
    counts = torch.bincount(starts, minlength=40)
    assert set(starts.unique().tolist()) == {2, 15}
    assert abs(counts[15] / counts[2] - 3.0) < 0.35, counts[[2, 15]]
    weight = info["priority_weight"].view(-1, 4)
    assert (weight == weight[:, :1]).all()  # one weight per slice, on every step
    expected = torch.where(starts == 2, torch.tensor(1.0), torch.tensor(3.0**-0.5))
    assert torch.allclose(weight[:, 0], expected) and (weight <= 1).all()


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=20),
    capacity=st.integers(8, 50),
    slice_len=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_prioritized_slices_stay_inside_trajectories_across_the_wrap(lengths, capacity, slice_len, seed):
    storage = LazyTensorStorage(capacity)
    data = episodes(lengths)
    cursor = 0
    for start in range(0, data.shape[0], 7):
        cursor = ring_write(storage, data[start : start + 7], cursor)
    sampler = _prioritized(storage, len(storage), slice_len=slice_len, cache_values=True)
    gen = torch.Generator().manual_seed(seed)
    sampler.update_priority(torch.arange(len(storage)), torch.rand(len(storage), generator=gen) + 0.01)
    where = reference_runs(storage, "episode", is_done=False)
    longest = {}
    for run, pos in where.values():
        longest[run] = max(longest.get(run, 0), pos + 1)
    if max(longest.values()) < slice_len:
        with pytest.raises(RuntimeError, match="long enough"):
            sampler.sample(storage, 2 * slice_len)
        return
    index, info = sampler.sample(storage, 5 * slice_len)
    check_slices(index, where, slice_len)
    assert info["priority_weight"].shape == (5 * slice_len,)
    assert info[TRUNC].view(5, slice_len)[:, -1].all()
    sampler.update_priority(index, torch.ones(5 * slice_len))  # the batch index goes back as is


def test_prioritized_slice_errors_state_and_warnings():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), episodes([10, 10]))
    sampler = PrioritizedSliceSampler(20, 1.0, 1.0, slice_len=5, traj_key="episode")
    assert sampler.requires_shared_state
    with pytest.raises(RuntimeError, match="priority zero"):
        sampler.sample(storage, 10)  # the sampler was never told about the writes
    sampler.extend(torch.arange(20))
    sampler.sample(storage, 10)
    state = sampler.state_dict()
    other = PrioritizedSliceSampler(20, 1.0, 1.0, slice_len=5, traj_key="episode")
    other.load_state_dict(state)
    other.sample(storage, 10)
    with pytest.raises(RuntimeError, match="max_capacity"):
        PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=5).sample(storage, 10)
    with pytest.warns(UserWarning, match="left part of `span`"):
        spanned = PrioritizedSliceSampler(20, 1.0, 1.0, slice_len=5, span=True, traj_key="episode")
    assert spanned.span == (False, True)
    with pytest.raises(TypeError, match="num_slices.*slice_len"):
        PrioritizedSliceSampler(20, 1.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedSliceSampler(20, -1.0, 1.0, slice_len=2)


def test_prioritized_slice_through_a_replay_buffer():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(50),
        sampler=PrioritizedSliceSampler(50, 0.7, 0.5, num_slices=4, traj_key="episode", cache_values=True),
        batch_size=20,
    )
    rb.extend(episodes([10] * 5))
    batch = rb.sample()
    ep = batch["episode"].view(4, 5)
    assert (ep == ep[:, :1]).all()
    assert batch["priority_weight"].shape == (20,)
    rb.update_priority(batch["index"], torch.rand(20))


def test_prioritized_slices_on_ndim2_storage():
    data = torch.stack([episodes([6, 6]), episodes([4, 8], first_episode=10)], 1)  # [12, 2]
    storage = LazyTensorStorage(24, ndim=2)
    storage.set(torch.arange(12), data)
    sampler = PrioritizedSliceSampler(24, 1.0, 1.0, slice_len=5, traj_key="episode")
    sampler.extend(torch.arange(24))
    index, info = sampler.sample(storage, 50)
    assert len(index) == 2
    got = storage.get(index)
    assert (got["episode"].view(10, 5) == got["episode"].view(10, 5)[:, :1]).all()
    assert (got["t"].view(10, 5).diff(dim=1) == 1).all()
    assert set(got["episode"].tolist()) <= {0, 1, 11}  # episode 10 (4 steps) is too short


# -- span= through a buffer: right-truncated slices and the first trajectory ------------------------------
SLICE_LEN, NUM_SLICES = 5, 4


def _buffer(span, strict_length=True) -> TensorDictReplayBuffer:
    index = torch.arange(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a left span is ignored with a warning (tested above)
        sampler = PrioritizedSliceSampler(
            100, alpha=0.7, beta=0.9, span=span, traj_key="traj", slice_len=SLICE_LEN, strict_length=strict_length
        )
    data = TensorDict({"traj": index // 10, "data": index}, [100])  # 10 trajectories of 10 steps
    return make_buffer(
        cls=TensorDictReplayBuffer, capacity=100, sampler=sampler, batch_size=SLICE_LEN * NUM_SLICES, data=data
    )


def _slices(rb, draws: int = 200):
    """The slices of ``draws`` batches, each cut after its step marked truncated (a slice's last step)."""
    for _ in range(draws):
        batch = rb.sample()
        ends = batch["next", "truncated"].squeeze(-1).nonzero().squeeze(-1)
        assert ends.numel() == NUM_SLICES and ends[-1] == batch.numel() - 1
        yield from torch.tensor_split(batch, (ends[:-1] + 1).tolist())


@pytest.mark.parametrize("span", [False, (False, True), 3, (False, 3)])
def test_every_trajectory_is_sampled_the_first_included(span):
    seen = set()
    for piece in _slices(_buffer(span)):
        assert (piece["traj"] == piece["traj"][0]).all()  # a slice never crosses into the next trajectory
        seen.add(int(piece["traj"][0]))
    assert seen == set(range(10))


@pytest.mark.parametrize("strict_length", [True, False])
@pytest.mark.parametrize("span, right", [(False, 0), ((False, True), SLICE_LEN - 1), (3, 3), ((False, 2), 2)])
def test_right_span_returns_right_truncated_slices(span, right, strict_length):
    """With a right span of ``r`` steps, a slice may start up to ``r`` steps after the last full start of its
    trajectory; it then stops at the trajectory's last step (fewer steps, the last one marked truncated, as in
    TorchRL), whatever ``strict_length``. Without a span, every slice is a full one."""
    starts_in_traj, shorter = set(), False
    for piece in _slices(_buffer(span, strict_length), draws=300):
        data = piece["data"]
        start = int(data[0]) % 10
        starts_in_traj.add(start)
        assert torch.equal(data, torch.arange(min(SLICE_LEN, 10 - start)) + data[0])
        shorter |= piece.numel() < SLICE_LEN
    assert starts_in_traj == set(range(10 - SLICE_LEN + 1 + right))
    assert shorter == (right > 0)


def test_span_without_strict_length_returns_shorter_slices_in_their_trajectory():
    """Without ``strict_length``, a slice past the trajectory's end is shorter instead (no repeated step)."""
    rb, shorter = _buffer((False, True), strict_length=False), False
    for _ in range(50):
        batch = rb.sample()
        ends = batch["next", "truncated"].squeeze(-1).nonzero().squeeze(-1)
        assert ends.numel() == NUM_SLICES and ends[-1] == batch.numel() - 1
        for piece in torch.tensor_split(batch, (ends[:-1] + 1).tolist()):
            assert (piece["traj"] == piece["traj"][0]).all()
            assert torch.equal(piece["data"], torch.arange(piece.numel()) + piece["data"][0])
            shorter |= piece.numel() < SLICE_LEN
    assert shorter
