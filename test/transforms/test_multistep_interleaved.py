"""MultiStepTransform on an interleaved stream (several environments writing one buffer step by step).

With ``traj_key`` each trajectory is looked ahead over its own steps: the stored n-step transitions equal
:class:`~torchrl.data.MultiStep` over each trajectory alone, whatever the interleaving and the chunk sizes.
"""

from __future__ import annotations

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import MultiStep
from torchrl.envs.transforms import MultiStepTransform


def interleaved_stream(n_envs=3, steps_per_env=14, seed=0) -> TensorDict:
    """Each env runs episodes of random lengths (done at their end, the last one unfinished); steps interleaved."""
    g = torch.Generator().manual_seed(seed)
    per_env, next_id = [], 0
    for _ in range(n_envs):
        rows = []
        while len(rows) < steps_per_env:
            length = int(torch.randint(2, 8, (1,), generator=g))
            rows += [(next_id, s, s == length - 1) for s in range(length)]
            next_id += 1
        per_env.append(rows[:steps_per_env])
    stream, cursor = [], [0] * n_envs
    while any(c < steps_per_env for c in cursor):
        live = [e for e in range(n_envs) if cursor[e] < steps_per_env]
        e = live[int(torch.randint(len(live), (1,), generator=g))]
        stream.append(per_env[e][cursor[e]])
        cursor[e] += 1
    n = len(stream)
    ids = torch.tensor([r[0] for r in stream])
    step = torch.tensor([r[1] for r in stream])
    done = torch.tensor([r[2] for r in stream]).unsqueeze(-1)
    obs = (100 * ids + step).float()
    return TensorDict({"traj": ids, "row": torch.arange(n), "obs": obs,
                       "next": {"obs": obs + 1, "reward": torch.rand(n, 1, generator=g), "done": done}},
                      batch_size=[n])  # fmt: skip


def per_trajectory_reference(stream: TensorDict, n_steps: int, gamma: float) -> dict:
    """MultiStep over each trajectory's steps alone, keyed by trajectory id."""
    out = {}
    for i in stream["traj"].unique().tolist():
        out[i] = MultiStep(gamma, n_steps)(stream[stream["traj"] == i])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_steps", [1, 3])
def test_each_trajectory_is_looked_ahead_over_its_own_steps(seed, n_steps):
    stream = interleaved_stream(seed=seed)
    reference = per_trajectory_reference(stream, n_steps, 0.9)
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(len(stream) - 1, generator=g)[:5].add(1).tolist())
    rb = make_buffer(capacity=200, transform=MultiStepTransform(n_steps, 0.9, traj_key="traj"))
    for a, b in zip([0, *cuts], [*cuts, len(stream)]):
        rb.extend(stream[a:b])
    stored = rb[:]
    assert torch.equal(stored["row"].sort().values, stored["row"].unique()), "each step stored once"
    for i, expected in reference.items():
        mine = stored[stored["traj"] == i]
        finished = bool(expected["next", "done"][-1])
        assert len(mine) == (len(expected) if finished else max(len(expected) - n_steps, 0))
        assert bool((mine["row"][1:] > mine["row"][:-1]).all()), (
            "a trajectory's steps stay in the order written"
        )
        for key in (("next", "reward"), ("next", "obs"), "steps_to_next_obs", "gamma", ("next", "done")):
            torch.testing.assert_close(mine[key], expected[key][: len(mine)], msg=str(key))
        assert bool(((mine["next", "obs"] // 100) == i).all()), "never looks into another trajectory"


def test_without_traj_key_an_interleaved_stream_mixes_trajectories():
    stream = interleaved_stream(seed=0)
    rb = make_buffer(capacity=200, transform=MultiStepTransform(3, 0.9))
    rb.extend(stream)
    stored = rb[:]
    assert bool(((stored["next", "obs"] // 100) != stored["traj"]).any()), "TorchRL's rule: one time line"


def test_the_held_steps_are_those_of_unfinished_trajectories():
    stream = interleaved_stream(seed=4)
    transform = MultiStepTransform(2, 0.5, traj_key="traj")
    out = transform.inv(stream.clone())
    held = transform.get_extra_state()["held"]
    assert len(out) + len(held) == len(stream)
    assert not bool(held["next", "done"].any()), "a finished trajectory is released whole"
    for i in held["traj"].unique().tolist():
        assert int((held["traj"] == i).sum()) <= 2


def test_interleaved_mode_errors_leave_the_held_steps_alone():
    stream = interleaved_stream(seed=0)
    transform = MultiStepTransform(3, 0.9, traj_key="traj")
    transform.inv(stream[:10].clone())
    before = transform.get_extra_state()["held"].clone()
    with pytest.raises(ValueError, match="cannot append the data written to the steps it holds"):
        transform.inv(stream[10:20].exclude("traj"))
    assert torch.equal(transform.get_extra_state()["held"]["row"], before["row"])
    fresh = MultiStepTransform(3, 0.9, traj_key="traj")
    with pytest.raises(KeyError, match="needs one trajectory id per step under 'traj'"):
        fresh.inv(stream[10:20].exclude("traj"))
    assert fresh.get_extra_state()["held"] is None
    batched = MultiStepTransform(3, 0.9, traj_key="traj")
    with pytest.raises(ValueError, match=r"one interleaved stream of batch size \[T\]"):
        batched.inv(torch.stack([stream[:5], stream[5:10]]))
    with pytest.raises(TypeError, match="`traj_key` must be a key"):
        MultiStepTransform(3, 0.9, traj_key=3)
    assert "traj_key='traj'" in repr(transform)
