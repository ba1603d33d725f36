"""Reward2GoTransform: the discounted reward-to-go written by a replay buffer, restarting after each done step."""

from __future__ import annotations

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

import torchrl.envs
import torchrl.envs.transforms
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs.transforms import Reward2GoTransform
from torchrl.envs.transforms.reward_to_go import reward_to_go


def _steps(reward: torch.Tensor, done: torch.Tensor) -> TensorDict:
    """TED steps of batch size ``reward.shape[:-1]`` (time last), rewards and done flags under ``"next"``."""
    return TensorDict({"next": {"reward": reward, "done": done}}, batch_size=reward.shape[:-1])


def _loop_reward_to_go(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """The rule written as its recursion, one step at a time (the reference of the vectorised sum)."""
    out = torch.zeros(reward.shape, dtype=torch.float64)
    running = torch.zeros(reward[..., 0, :].shape, dtype=torch.float64)
    keep = (~torch.broadcast_to(done, reward.shape).bool()).double()
    for t in range(reward.shape[-2] - 1, -1, -1):
        running = reward[..., t, :].double() + gamma * running * keep[..., t, :]
        out[..., t, :] = running
    return out


def test_the_worked_example_of_two_episodes_and_a_tail():
    reward = torch.ones(10, 1)
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[3] = done[7] = True
    td = Reward2GoTransform(gamma=0.99).inv(_steps(reward, done))
    expected = torch.tensor([3.9404, 2.9701, 1.99, 1.0, 3.9404, 2.9701, 1.99, 1.0, 1.99, 1.0])
    torch.testing.assert_close(td["next", "reward"].squeeze(-1), expected, atol=1e-4, rtol=0)


def test_batched_series_are_summed_along_time_each_on_its_own():
    reward = torch.arange(12, dtype=torch.float32).reshape(2, 6, 1)
    done = torch.zeros(2, 6, 1, dtype=torch.bool)
    done[0, 2] = done[0, 5] = True
    done[1, 0] = True  # the second series: one step, then a tail of five
    out = Reward2GoTransform(gamma=0.5).inv(_steps(reward, done))["next", "reward"]
    torch.testing.assert_close(out.double(), _loop_reward_to_go(reward, done, 0.5))
    assert out[1, 0, 0].item() == 6.0  # a done step's reward-to-go is its own reward


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.01, 0.0])
@pytest.mark.parametrize("steps", [1, 5, 400])
def test_the_vectorised_sum_follows_the_recursion(gamma, steps):
    """Small gammas cut long series into chunks (0.01: 75 steps a chunk): the chunks' carries are checked too."""
    gen = torch.Generator().manual_seed(steps)
    reward = torch.randn(3, steps, 2, generator=gen)
    done = torch.rand(3, steps, 1, generator=gen) < 0.03
    torch.testing.assert_close(reward_to_go(reward, done, gamma).double(), _loop_reward_to_go(reward, done, gamma))


def test_a_long_episode_with_a_small_gamma_stays_finite():
    reward = torch.ones(1, 5000, 1, dtype=torch.float64)
    done = torch.zeros(1, 5000, 1, dtype=torch.bool)
    done[0, -1] = True
    out = reward_to_go(reward, done, 0.5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, :10, 0], torch.full((10,), 2.0, dtype=torch.float64))
    assert out[0, -1, 0].item() == 1.0


def test_a_buffer_stores_rewards_to_go_and_samples_them_unchanged():
    reward = torch.ones(2, 5, 1)
    done = torch.zeros(2, 5, 1, dtype=torch.bool)
    done[:, 2] = done[:, 4] = True
    rb = make_buffer(cls=ReplayBuffer, storage=LazyTensorStorage(4), transform=Reward2GoTransform(gamma=0.5))
    rb.extend(_steps(reward, done))
    expected = torch.tensor([1.75, 1.5, 1.0, 1.5, 1.0])
    for item in (rb[0], rb[1], rb.sample(1)[0]):
        torch.testing.assert_close(item["next", "reward"].squeeze(-1), expected)


def test_out_keys_keep_the_original_reward():
    reward = torch.ones(3, 1)
    done = torch.tensor([[False], [False], [True]])
    td = Reward2GoTransform(out_keys=[("next", "reward_to_go")]).inv(_steps(reward, done))
    assert td["next", "reward"].squeeze(-1).tolist() == [1.0, 1.0, 1.0]
    assert td["next", "reward_to_go"].squeeze(-1).tolist() == [3.0, 2.0, 1.0]


def test_absent_input_keys_are_skipped_while_one_is_present():
    reward = torch.ones(2, 1)
    done = torch.tensor([[False], [True]])
    transform = Reward2GoTransform(in_keys=[("next", "reward"), ("next", "bonus")])
    td = transform.inv(_steps(reward, done))
    assert td["next", "reward"].squeeze(-1).tolist() == [2.0, 1.0] and ("next", "bonus") not in td.keys(True)


def test_the_sample_path_is_the_identity():
    td = _steps(torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.bool))
    assert Reward2GoTransform()(td) is td and td["next", "reward"].squeeze(-1).tolist() == [1.0, 1.0, 1.0]


def test_defaults_and_gamma_buffer():
    transform = Reward2GoTransform(gamma=0.9)
    assert transform.in_keys == [("next", "reward")] and transform.out_keys == [("next", "reward")]
    assert transform.done_key == "done"
    assert "gamma" in transform.state_dict() and float(transform.gamma) == pytest.approx(0.9)


def test_it_is_exported_where_torchrl_has_it():
    assert torchrl.envs.Reward2GoTransform is Reward2GoTransform
    assert "Reward2GoTransform" in torchrl.envs.__all__ and "Reward2GoTransform" in torchrl.envs.transforms.__all__


# -- refusals: nothing written -----------------------------------------------------------------------------------
def test_a_series_without_a_done_step_is_refused():
    done = torch.zeros(2, 4, 1, dtype=torch.bool)
    done[0, 1] = True  # the second series never ends
    td = _steps(torch.ones(2, 4, 1), done)
    with pytest.raises(RuntimeError, match="No episode ends found to calculate the reward to go"):
        Reward2GoTransform().inv(td)
    assert td["next", "reward"].sum().item() == 8.0  # unchanged


def test_a_buffer_refuses_the_write_and_stores_nothing():
    rb = make_buffer(cls=ReplayBuffer, storage=LazyTensorStorage(4), transform=Reward2GoTransform())
    with pytest.raises(RuntimeError, match="No episode ends found"):
        rb.extend(_steps(torch.ones(1, 3, 1), torch.zeros(1, 3, 1, dtype=torch.bool)))
    assert len(rb) == 0


def test_no_input_key_present_is_refused():
    td = _steps(torch.ones(2, 1), torch.tensor([[False], [True]]))
    with pytest.raises(KeyError, match="Could not find any of the input keys"):
        Reward2GoTransform(in_keys=[("next", "bonus")]).inv(td)


def test_a_missing_done_entry_is_refused():
    td = TensorDict({"next": {"reward": torch.ones(2, 1)}}, batch_size=[2])
    with pytest.raises(KeyError, match="episode ends at \\('next', 'done'\\)"):
        Reward2GoTransform().inv(td)


def test_done_flags_without_a_time_dim_or_of_another_shape_are_refused():
    flat = TensorDict({"next": {"reward": torch.ones(3), "done": torch.ones(3, dtype=torch.bool)}}, batch_size=[3])
    with pytest.raises(ValueError, match="trailing dim"):
        Reward2GoTransform().inv(flat)
    wide = _steps(torch.ones(3, 1), torch.ones(3, 2, dtype=torch.bool))  # two flags per step, one reward
    with pytest.raises(ValueError, match="do not broadcast"):
        Reward2GoTransform().inv(wide)
    assert wide["next", "reward"].squeeze(-1).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan"), "0.9", None])
def test_a_gamma_outside_zero_one_is_refused(gamma):
    with pytest.raises(ValueError, match="`gamma` must be a number in \\[0, 1\\]"):
        Reward2GoTransform(gamma=gamma)


@pytest.mark.parametrize("kwargs", [{"done_key": 3}, {"in_keys": [1]}, {"out_keys": [("next", 2)]}])
def test_keys_that_are_not_nested_keys_are_refused(kwargs):
    with pytest.raises(TypeError, match="keys"):
        Reward2GoTransform(**kwargs)


def test_data_that_is_not_a_tensordict_is_refused():
    with pytest.raises(TypeError, match="takes TensorDicts"):
        Reward2GoTransform().inv(torch.ones(3))
