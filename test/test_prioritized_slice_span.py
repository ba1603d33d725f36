"""``PrioritizedSliceSampler(span=...)`` through a buffer: right-truncated slices and the first trajectory."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler, TensorDictReplayBuffer

SLICE_LEN, NUM_SLICES = 5, 4


def _buffer(span, strict_length=True) -> TensorDictReplayBuffer:
    index = torch.arange(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a left span is ignored with a warning (tested in test_slice_sampler.py)
        sampler = PrioritizedSliceSampler(
            100, alpha=0.7, beta=0.9, span=span, traj_key="traj", slice_len=SLICE_LEN, strict_length=strict_length
        )
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=SLICE_LEN * NUM_SLICES)
    rb.extend(TensorDict({"traj": index // 10, "data": index}, [100]))  # 10 trajectories of 10 steps
    return rb


def _slices(rb, draws: int = 200):
    for _ in range(draws):
        batch = rb.sample()
        assert batch.shape == (SLICE_LEN * NUM_SLICES,)
        yield batch.view(NUM_SLICES, SLICE_LEN)


@pytest.mark.parametrize("span", [False, (False, True), 3, (False, 3)])
def test_every_trajectory_is_sampled_the_first_included(span):
    seen = set()
    for slices in _slices(_buffer(span)):
        traj = slices["traj"]
        assert (traj == traj[:, :1]).all()  # a slice never crosses into the next trajectory
        seen |= set(traj[:, 0].tolist())
    assert seen == set(range(10))


@pytest.mark.parametrize("span, right", [(False, 0), ((False, True), SLICE_LEN - 1), (3, 3), ((False, 2), 2)])
def test_right_span_returns_right_truncated_slices(span, right):
    """With a right span of ``r`` steps, a slice may start up to ``r`` steps after the last full start of its
    trajectory; it then stops at the trajectory's last step (repeated, marked truncated), so batches keep their
    size. Without a span, every slice is a full one."""
    starts_in_traj, truncated_seen = set(), False
    for slices in _slices(_buffer(span), draws=300):
        data, truncated = slices["data"], slices["next", "truncated"].squeeze(-1)
        offset = (data[:, 0] % 10).tolist()
        starts_in_traj |= set(offset)
        for row, start in enumerate(offset):
            real = min(SLICE_LEN, 10 - start)
            expected = torch.arange(real) + data[row, 0]
            assert torch.equal(data[row, :real], expected)
            assert (data[row, real:] == data[row, real - 1]).all()  # the last step, repeated
            assert truncated[row, real - 1] and not truncated[row, : real - 1].any()
            truncated_seen |= real < SLICE_LEN
    assert starts_in_traj == set(range(10 - SLICE_LEN + 1 + right))
    assert truncated_seen == (right > 0)


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
