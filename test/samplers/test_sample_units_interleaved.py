"""Sequence and FrameStack windows, and HER goals, over interleaved trajectories (``fragmented=True``): checked
against a brute-force reference (Python loops over the stored (trajectory, step) pairs) on 1-D and ``ndim=2``
storages, wrapped rings and missing steps."""

from __future__ import annotations

import math
import pickle
import random

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import HERReplayBuffer, LazyTensorStorage, Sequence, TensorDictReplayBuffer
from torchrl.data.replay_buffers.sample_units import FrameStack

TRAJ = ("collector", "traj_ids")
STEP = "step_count"


def streams(rows: int, *, envs: int = 5, missing: float = 0.05, seed: int = 0) -> TensorDict:
    """``rows`` steps of ``envs`` envs interleaved at random, episodes of 3-15 steps with unique ids, ``missing`` of
    the step numbers skipped; ``achieved_goal`` holds ``(traj, step)``."""
    rng = random.Random(seed)
    episode, step, left, next_id = list(range(envs)), [0] * envs, [rng.randint(3, 15) for _ in range(envs)], envs
    traj, steps = [], []
    for _ in range(rows):
        e = rng.randrange(envs)
        if rng.random() < missing:
            step[e] += 1
        traj.append(episode[e])
        steps.append(step[e])
        step[e] += 1
        left[e] -= 1
        if left[e] <= 0:
            episode[e], next_id, step[e], left[e] = next_id, next_id + 1, 0, rng.randint(3, 15)
    traj, steps = torch.tensor(traj), torch.tensor(steps)
    goal = torch.stack([traj, steps], -1).float()
    return TensorDict(
        {
            TRAJ: traj,
            STEP: steps,
            "pixels": steps.float().view(-1, 1, 1),
            "achieved_goal": goal,
            "desired_goal": torch.full_like(goal, -1.0),
            ("next", "reward"): torch.zeros(rows, 1),
            ("next", "done"): torch.zeros(rows, 1, dtype=torch.bool),
        },
        batch_size=[rows],
    )


def filled(ndim: int, seed: int = 0, **kwargs) -> TensorDictReplayBuffer:
    """A buffer over 40 rows (x3 cells for ``ndim=2``) written with 70 rows in two extends (the ring wraps)."""
    cols = 1 if ndim == 1 else 3
    data = streams(70 * cols, seed=seed)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40 * cols, ndim=ndim), **kwargs)
    if ndim == 2:
        data = data.reshape(70, cols).transpose(0, 1).contiguous()  # [envs, time], as the buffer takes it
        rb.extend(data[:, :35])
        rb.extend(data[:, 35:])
    else:
        rb.extend(data[:35])
        rb.extend(data[35:])
    return rb


class Reference:
    """The stored steps by Python loops: cell -> (traj, step), (traj, step) -> cell, and each step's run."""

    def __init__(self, storage):
        content = storage[:]
        self.cols = 1 if storage.ndim == 1 else content.shape[1]
        traj = content[TRAJ].reshape(-1).tolist()
        step = content[STEP].reshape(-1).tolist()
        self.of = {cell: (t, s) for cell, (t, s) in enumerate(zip(traj, step))}
        self.where = {ts: cell for cell, ts in self.of.items()}

    def run(self, cell: int) -> tuple[int, int, int, int]:
        traj, s = self.of[cell]
        first, last = s, s
        while (traj, first - 1) in self.where:
            first -= 1
        while (traj, last + 1) in self.where:
            last += 1
        return traj, s, first, last

    def cell(self, rows, cols=None) -> list[int]:
        rows = rows.reshape(-1).tolist()
        cols = [0] * len(rows) if cols is None else cols.reshape(-1).tolist()
        return [r * self.cols + c for r, c in zip(rows, cols)]


def anchors(storage, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(len(storage) if storage.ndim == 1 else storage.shape[0], (n,), generator=g)
    if storage.ndim == 1:
        return rows
    return rows, torch.randint(storage.shape[1], (n,), generator=g)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize(
    "length,boundary,burn_in,bootstrap,dilation",
    [(4, "pad", 0, 0, 1), (3, "pad", 2, 1, 1), (2, "stop", 1, 1, 2), (5, "stop", 0, 2, 1)],
)
def test_sequence_windows_match_a_brute_force_reference(ndim, length, boundary, burn_in, bootstrap, dilation):
    rb = filled(ndim)
    ref = Reference(rb.storage)
    unit = Sequence(length, boundary, burn_in=burn_in, bootstrap=bootstrap, dilation=dilation, fragmented=True)
    drawn = anchors(rb.storage, 60, seed=ndim)
    index, info = unit.expand(drawn, {}, rb.storage)
    w = unit.window
    got = ref.cell(*index) if ndim == 2 else ref.cell(index)
    valid = info["validity_mask"].view(-1, w).tolist()
    cells = ref.cell(*drawn) if ndim == 2 else ref.cell(drawn)
    for b, cell in enumerate(cells):
        traj, s, first, last = ref.run(cell)
        steps = [s + (j - burn_in) * dilation for j in range(w)]
        if boundary == "stop":
            overrun = max(0, steps[-1] - last)
            back = min(math.ceil(overrun / dilation), (s - first) // dilation)
            steps = [t - back * dilation for t in steps]
        assert valid[b] == [first <= t <= last for t in steps]
        assert got[b * w : (b + 1) * w] == [ref.where[(traj, min(max(t, first), last))] for t in steps]
    if ndim == 1:
        assert torch.equal(info["anchor_index"].view(-1, w)[:, 0], drawn)
    else:  # one (time, env) pair per record
        assert torch.equal(info["anchor_index"].view(-1, w, 2)[:, 0], torch.stack(drawn, -1))


@pytest.mark.parametrize("ndim", [1, 2])
def test_frame_stacks_match_a_brute_force_reference(ndim):
    rb = filled(ndim)
    ref = Reference(rb.storage)
    k = 4
    unit = FrameStack(k, frame_keys=["pixels", STEP], traj_key=TRAJ, fragmented=True, mask_key="padded")
    drawn = anchors(rb.storage, 60, seed=3)
    index, _ = unit.expand(drawn, {}, rb.storage)
    got = ref.cell(*index) if ndim == 2 else ref.cell(index)
    out = unit.read(rb.storage, index)
    cells = ref.cell(*drawn) if ndim == 2 else ref.cell(drawn)
    for b, cell in enumerate(cells):
        traj, s, first, _ = ref.run(cell)
        steps = list(range(s - k + 1, s + 1))
        assert got[b * k : (b + 1) * k] == [ref.where[(traj, max(t, first))] for t in steps]
        assert out["padded"][b].tolist() == [t < first for t in steps]
        assert out[STEP][b].tolist() == [max(t, first) for t in steps]
    assert out["pixels"].shape == (60, k, 1, 1)


def test_units_in_a_buffer_sample_windows_of_one_run():
    rb = filled(1, sample_unit=Sequence(6, fragmented=True, traj_key=TRAJ), batch_size=8)
    for _ in range(20):
        batch = rb.sample()
        traj, step = batch[TRAJ].view(8, 6), batch[STEP].view(8, 6)
        valid = batch["validity_mask"].view(8, 6)
        assert (traj == traj[:, :1]).all()
        assert ((step[:, 1:] - step[:, :-1])[valid[:, 1:] & valid[:, :-1]] == 1).all()
        assert valid[:, 0].all()


def test_units_refuse_what_interleaved_trajectories_cannot_use():
    with pytest.raises(ValueError, match="step_key must be provided when fragmented=True"):
        Sequence(2, fragmented=True, step_key=None)
    with pytest.raises(ValueError, match="include_reset"):
        Sequence(2, "include_reset", fragmented=True)
    with pytest.raises(TypeError, match="`fragmented`"):
        Sequence(2, fragmented=1)
    with pytest.raises(ValueError, match="step_key must be provided when fragmented=True"):
        FrameStack(2, fragmented=True, step_key=None)
    with pytest.raises(ValueError, match="end_key"):
        FrameStack(2, fragmented=True, end_key=("next", "done"))
    with pytest.raises(TypeError, match="`fragmented`"):
        FrameStack(2, fragmented="yes")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"pixels": torch.zeros(4, 1), STEP: torch.arange(4)}, [4]))
    with pytest.raises(RuntimeError, match="fragmented=True requires a trajectory identifier under traj_key"):
        FrameStack(2, fragmented=True).expand(torch.tensor([1]), {}, rb.storage)


def test_units_pickle_with_their_keys_and_rebuild_the_index():
    rb = filled(1)
    for unit in (Sequence(3, fragmented=True, traj_key=TRAJ), FrameStack(3, fragmented=True, traj_key=TRAJ)):
        expected = unit.expand(torch.tensor([5, 9]), {}, rb.storage)[0]
        copy = pickle.loads(pickle.dumps(unit))
        assert copy.fragmented and copy.step_key == STEP and copy.traj_key == TRAJ
        assert torch.equal(copy.expand(torch.tensor([5, 9]), {}, rb.storage)[0], expected)


def _reward(td):
    return (td["next", "reward"] * 0).reshape(-1, 1)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_her_goals_come_from_the_sampled_steps_run(strategy):
    rb = filled(
        1,
        seed=5,
        sampler=None,
        batch_size=16,
        generator=torch.Generator().manual_seed(0),
    )
    her = HERReplayBuffer(
        _reward, her_ratio=1.0, strategy=strategy, storage=rb.storage, batch_size=16, fragmented=True,
        generator=torch.Generator().manual_seed(1),
    )
    ref = Reference(her.storage)
    for _ in range(200):
        batch = her.sample()
        for cell, goal in zip(batch["index"].tolist(), batch["desired_goal"].long().tolist()):
            traj, s, first, last = ref.run(cell)
            assert goal[0] == traj and first <= goal[1] <= last
            if strategy == "future":
                assert goal[1] >= s
            if strategy == "final":
                assert goal[1] == last


def test_her_fragmented_keywords_are_checked():
    with pytest.raises(ValueError, match="step_key must be provided when fragmented=True"):
        HERReplayBuffer(_reward, fragmented=True, step_key=None, storage=LazyTensorStorage(4))
    with pytest.raises(TypeError, match="`fragmented`"):
        HERReplayBuffer(_reward, fragmented="no", storage=LazyTensorStorage(4))
