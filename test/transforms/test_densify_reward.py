"""DensifyReward (issue 26 item 2): the reward-to-go over trajectory segments, beside MultiStep."""

from __future__ import annotations

import importlib

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import DensifyReward


def td_of(reward, done) -> TensorDict:
    return TensorDict({"next": {"reward": reward, "done": done}}, batch_size=reward.shape[:-1])


def brute_force(reward, done, discount):
    """Reward-to-go by a loop over the steps of each (batch, feature) series, time at dim -2."""
    r = reward.movedim(-2, -1).reshape(-1, reward.shape[-2])
    d = done.movedim(-2, -1).reshape(-1, reward.shape[-2])
    out = torch.zeros_like(r, dtype=torch.float64)
    for s in range(r.shape[0]):
        for t in range(r.shape[1]):
            total, k = 0.0, t
            while k < r.shape[1]:
                total += discount ** (k - t) * float(r[s, k])
                if d[s, k]:
                    break
                k += 1
            out[s, t] = total
    shape = (*reward.shape[:-2], reward.shape[-1], reward.shape[-2])
    return out.reshape(shape).movedim(-1, -2).to(reward.dtype)


def test_sparse_rewards_become_dense():
    reward = torch.zeros(10, 1)
    reward[3], reward[7] = 3.0, 7.0
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[3] = done[7] = True
    td = td_of(reward, done)
    out = DensifyReward()(td)
    assert out is td  # in place
    assert out["next", "reward"].squeeze(-1).tolist() == [3, 3, 3, 3, 7, 7, 7, 7, 0, 0]


@pytest.mark.parametrize("discount", [1.0, 0.9, 0.0])
def test_equals_a_brute_force_loop_for_batched_data(discount):
    g = torch.Generator().manual_seed(0)
    reward = torch.randn(2, 3, 12, 1, generator=g)
    done = torch.rand(2, 3, 12, 1, generator=g) < 0.2
    out = DensifyReward(discount=discount)(td_of(reward.clone(), done))
    torch.testing.assert_close(out["next", "reward"], brute_force(reward, done, discount))


def test_reward_key_out_keeps_the_reward():
    reward = torch.ones(4, 1)
    done = torch.tensor([[False], [True], [False], [False]])
    module = DensifyReward(reward_key_out="reward_to_go", discount=0.5)
    out = module(td_of(reward, done))
    assert out["next", "reward"].squeeze(-1).tolist() == [1, 1, 1, 1]
    assert out["next", "reward_to_go"].squeeze(-1).tolist() == [1.5, 1.0, 1.5, 1.0]
    assert module.in_keys == ["reward", "done"] and module.out_keys == ["reward_to_go"]
    assert DensifyReward().out_keys == ["reward"] and DensifyReward().time_dim == 2


def test_nested_keys():
    td = TensorDict({"next": {"agent": {"r": torch.ones(3, 1), "end": torch.zeros(3, 1, dtype=torch.bool)}}},
                    batch_size=[3])
    out = DensifyReward(reward_key=("agent", "r"), done_key=("agent", "end"))(td)
    assert out["next", "agent", "r"].squeeze(-1).tolist() == [3, 2, 1]


def test_importable_from_torchrl_paths():
    for path in ("torchrl.data", "torchrl.data.postprocs", "torchrl.data.postprocs.postprocs"):
        assert importlib.import_module(path).DensifyReward is DensifyReward


# -- errors --------------------------------------------------------------------------------------------------------
def test_reward_and_done_of_different_shapes_are_refused():
    td = td_of(torch.ones(5, 1), torch.zeros(5, 1, dtype=torch.bool))
    td["next", "done"] = torch.zeros(5, 2, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="reward and done state are expected to have the same shape"):
        DensifyReward()(td)
    assert td["next", "reward"].tolist() == [[1.0]] * 5


def test_rewards_without_a_feature_dim_are_refused():
    td = td_of(torch.ones(5), torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[\.\.\., T, 1\]"):
        DensifyReward()(td)


def test_missing_entries_and_bad_arguments():
    with pytest.raises(KeyError, match="'reward'"):
        DensifyReward()(TensorDict({"next": {"done": torch.zeros(3, 1, dtype=torch.bool)}}, batch_size=[3]))
    with pytest.raises(TypeError, match="takes a TensorDict"):
        DensifyReward()(torch.zeros(3))
    with pytest.raises(ValueError, match="`discount` must be a number in"):
        DensifyReward(discount=1.5)
    with pytest.raises(TypeError, match="`reward_key` must be a key"):
        DensifyReward(reward_key=3)
    with pytest.raises(TypeError, match="`time_dim` must be an int"):
        DensifyReward(time_dim="2")
