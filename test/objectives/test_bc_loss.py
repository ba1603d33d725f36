"""Tests of torchrl.objectives.BCLoss: each loss and reduction against torch.nn.functional, and errors."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

import torchrl.objectives.bc as bc_module
from torchrl.objectives import BCLoss

OBS_DIM, NUM_ACTIONS, ACTION_DIM, BATCH = 5, 3, 2, 7
REDUCTIONS = ["mean", "sum", "none"]
REGRESSION = {"l1": F.l1_loss, "l2": F.mse_loss, "mse": F.mse_loss, "smooth_l1": F.smooth_l1_loss}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _discrete_batch(batch=(BATCH,), action_shape=()):
    return TensorDict(
        {
            "observation": torch.randn(*batch, OBS_DIM),
            "action": torch.randint(NUM_ACTIONS, (*batch, *action_shape)),
        },
        batch_size=list(batch),
    )


def _continuous_batch(batch=(BATCH,)):
    return TensorDict(
        {"observation": torch.randn(*batch, OBS_DIM), "action": torch.randn(*batch, ACTION_DIM)},
        batch_size=list(batch),
    )


def _expected_reduction(reduction):
    return reduction or "mean"


@pytest.mark.parametrize("reduction", REDUCTIONS + [None])
@pytest.mark.parametrize("name", sorted(REGRESSION))
def test_regression_losses_match_functional(name, reduction):
    actor = nn.Linear(OBS_DIM, ACTION_DIM)
    td = _continuous_batch()
    out = BCLoss(actor, loss_function=name, reduction=reduction)(td)
    pred = actor(td["observation"])
    expected = REGRESSION[name](pred, td["action"], reduction=_expected_reduction(reduction))
    torch.testing.assert_close(out["loss_bc"], expected)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_float_actions_default_to_mse(reduction):
    actor = nn.Linear(OBS_DIM, ACTION_DIM)
    td = _continuous_batch()
    out = BCLoss(actor, reduction=reduction)(td)
    expected = F.mse_loss(actor(td["observation"]), td["action"], reduction=reduction)
    torch.testing.assert_close(out["loss_bc"], expected)


@pytest.mark.parametrize("reduction", REDUCTIONS + [None])
@pytest.mark.parametrize("loss_function", [None, "cross_entropy"])
@pytest.mark.parametrize("action_shape", [(), (1,)])
def test_integer_actions_use_cross_entropy(loss_function, reduction, action_shape):
    actor = nn.Linear(OBS_DIM, NUM_ACTIONS)
    td = _discrete_batch(action_shape=action_shape)
    out = BCLoss(actor, loss_function=loss_function, reduction=reduction)(td)
    expected = F.cross_entropy(
        actor(td["observation"]), td["action"].reshape(BATCH), reduction=_expected_reduction(reduction)
    )
    torch.testing.assert_close(out["loss_bc"], expected)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_with_extra_batch_dims_keeps_the_batch_shape(reduction):
    actor = nn.Linear(OBS_DIM, NUM_ACTIONS)
    td = _discrete_batch(batch=(4, 6))
    loss = BCLoss(actor, reduction=reduction)(td)["loss_bc"]
    logits = actor(td["observation"])
    flat = F.cross_entropy(logits.reshape(-1, NUM_ACTIONS), td["action"].reshape(-1), reduction="none")
    expected = {"none": flat.reshape(4, 6), "mean": flat.mean(), "sum": flat.sum()}[reduction]
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_accepts_class_probabilities(reduction):
    actor = nn.Linear(OBS_DIM, NUM_ACTIONS)
    td = _discrete_batch()
    td["action"] = F.one_hot(td["action"], NUM_ACTIONS).float()
    out = BCLoss(actor, loss_function="cross_entropy", reduction=reduction)(td)
    expected = F.cross_entropy(actor(td["observation"]), td["action"], reduction=reduction)
    torch.testing.assert_close(out["loss_bc"], expected)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_callable_loss_is_reduced(reduction):
    actor = nn.Linear(OBS_DIM, ACTION_DIM)
    td = _continuous_batch()
    seen = []

    def cubic(pred, target):
        seen.append((pred.shape, target.shape))
        return (pred - target).abs() ** 3

    out = BCLoss(actor, loss_function=cubic, reduction=reduction)(td)
    elementwise = (actor(td["observation"]) - td["action"]).abs() ** 3
    expected = {"none": elementwise, "mean": elementwise.mean(), "sum": elementwise.sum()}[reduction]
    torch.testing.assert_close(out["loss_bc"], expected)
    assert seen == [(torch.Size([BATCH, ACTION_DIM]), torch.Size([BATCH, ACTION_DIM]))]


def test_callable_module_loss_returning_a_scalar():
    actor = nn.Linear(OBS_DIM, ACTION_DIM)
    td = _continuous_batch()
    out = BCLoss(actor, loss_function=nn.HuberLoss(delta=0.5))(td)
    expected = F.huber_loss(actor(td["observation"]), td["action"], delta=0.5)
    torch.testing.assert_close(out["loss_bc"], expected)


@pytest.mark.parametrize("name", sorted(REGRESSION))
def test_regression_loss_is_zero_for_a_perfect_prediction(name):
    td = TensorDict({"observation": torch.randn(BATCH, 3)}, batch_size=[BATCH])
    td["action"] = td["observation"].clone()
    loss = BCLoss(nn.Identity(), loss_function=name, reduction="none")(td)["loss_bc"]
    assert loss.shape == (BATCH, 3)
    assert torch.all(loss == 0)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_sum_is_mean_times_count_and_loss_is_nonnegative(kind):
    if kind == "discrete":
        actor, td = nn.Linear(OBS_DIM, NUM_ACTIONS), _discrete_batch()
    else:
        actor, td = nn.Linear(OBS_DIM, ACTION_DIM), _continuous_batch()
    losses = {r: BCLoss(actor, reduction=r)(td)["loss_bc"] for r in REDUCTIONS}
    assert torch.all(losses["none"] >= 0)
    torch.testing.assert_close(losses["sum"], losses["mean"] * losses["none"].numel())
    assert losses["mean"].shape == losses["sum"].shape == torch.Size([])


def test_output_is_a_tensordict_with_loss_bc_only():
    out = BCLoss(nn.Linear(OBS_DIM, NUM_ACTIONS))(_discrete_batch())
    assert isinstance(out, TensorDict)
    assert list(out.keys()) == ["loss_bc"]
    assert out.batch_size == torch.Size([])


def _mlp(out_dim):
    return nn.Sequential(nn.Linear(OBS_DIM, 8), nn.Tanh(), nn.Linear(8, out_dim))


def _td_actor(out_key, out_dim):
    return TensorDictModule(nn.Linear(OBS_DIM, out_dim), in_keys=["observation"], out_keys=[out_key])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tensordict_module_with_logits(reduction):
    actor = _td_actor("logits", NUM_ACTIONS)
    td = _discrete_batch()
    before = td.clone()
    out = BCLoss(actor, reduction=reduction)(td)
    expected = F.cross_entropy(actor.module(td["observation"]), td["action"], reduction=reduction)
    torch.testing.assert_close(out["loss_bc"], expected)
    assert list(td.keys()) == list(before.keys()), "the user's batch must not be modified"


def test_tensordict_module_writing_action_does_not_overwrite_the_expert_action():
    actor = _td_actor("action", ACTION_DIM)
    td = _continuous_batch()
    expert = td["action"].clone()
    out = BCLoss(actor)(td)
    torch.testing.assert_close(out["loss_bc"], F.mse_loss(actor.module(td["observation"]), expert))
    assert torch.equal(td["action"], expert)


def test_tensordict_module_prediction_key_rules():
    assert BCLoss(_td_actor("logits", NUM_ACTIONS)).prediction_key == "logits"
    assert BCLoss(_td_actor("action", ACTION_DIM)).prediction_key == "action"
    assert BCLoss(_td_actor("pred", ACTION_DIM)).prediction_key == "pred"
    two = TensorDictModule(lambda x: (x, x), in_keys=["observation"], out_keys=["logits", "action"])
    assert BCLoss(two).prediction_key == "logits"
    assert BCLoss(nn.Linear(2, 2)).prediction_key is None


def test_tensordict_module_with_nested_keys():
    actor = TensorDictModule(nn.Linear(OBS_DIM, NUM_ACTIONS), in_keys=[("obs", "vec")], out_keys=["logits"])
    td = TensorDict(
        {("obs", "vec"): torch.randn(BATCH, OBS_DIM), ("expert", "a"): torch.randint(NUM_ACTIONS, (BATCH,))},
        batch_size=[BATCH],
    )
    loss = BCLoss(actor).set_keys(action=("expert", "a"))
    out = loss(td)
    torch.testing.assert_close(
        out["loss_bc"], F.cross_entropy(actor.module(td["obs", "vec"]), td["expert", "a"])
    )
    assert loss.in_keys == [("expert", "a"), ("obs", "vec")]


def test_set_keys_for_plain_module():
    actor = nn.Linear(OBS_DIM, NUM_ACTIONS)
    td = TensorDict(
        {"obs": torch.randn(BATCH, OBS_DIM), "expert": torch.randint(NUM_ACTIONS, (BATCH,))},
        batch_size=[BATCH],
    )
    loss = BCLoss(actor).set_keys(action="expert", observation="obs")
    assert loss.in_keys == ["expert", "obs"]
    torch.testing.assert_close(loss(td)["loss_bc"], F.cross_entropy(actor(td["obs"]), td["expert"]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: (_mlp(NUM_ACTIONS), _discrete_batch()),
        lambda: (_mlp(ACTION_DIM), _continuous_batch()),
        lambda: (
            TensorDictModule(_mlp(NUM_ACTIONS), in_keys=["observation"], out_keys=["logits"]),
            _discrete_batch(),
        ),
    ],
    ids=["plain-discrete", "plain-continuous", "tdmodule-discrete"],
)
def test_gradients_flow_to_every_actor_parameter(make):
    actor, td = make()
    loss = BCLoss(actor)(td)["loss_bc"]
    loss.backward()
    for name, param in actor.named_parameters():
        assert param.grad is not None, name
        assert torch.any(param.grad != 0), name


def test_a_few_steps_of_training_reduce_the_loss():
    actor = nn.Linear(OBS_DIM, NUM_ACTIONS)
    td = _discrete_batch(batch=(64,))
    td["action"] = (td["observation"][:, 0] > 0).long()  # learnable expert
    loss_fn = BCLoss(actor)
    optim = torch.optim.SGD(actor.parameters(), lr=0.5)
    first = loss_fn(td)["loss_bc"].item()
    for _ in range(20):
        optim.zero_grad()
        loss_fn(td)["loss_bc"].backward()
        optim.step()
    assert loss_fn(td)["loss_bc"].item() < first


# ---------------------------------------------------------------------------------------------------- errors


def test_missing_action_key_names_it_and_the_keys_present():
    td = _discrete_batch().exclude("action")
    with pytest.raises(KeyError, match=r"'action'.*Keys present: \['observation'\]"):
        BCLoss(nn.Linear(OBS_DIM, NUM_ACTIONS))(td)


def test_missing_observation_key_for_plain_module():
    td = _discrete_batch().rename_key_("observation", "obs")
    with pytest.raises(KeyError, match=r"'observation'.*Keys present: \['action', 'obs'\]"):
        BCLoss(nn.Linear(OBS_DIM, NUM_ACTIONS))(td)


def test_missing_in_key_of_tensordict_module():
    td = _discrete_batch().rename_key_("observation", "obs")
    with pytest.raises(KeyError, match=r"lacks \['observation'\].*Keys present"):
        BCLoss(_td_actor("logits", NUM_ACTIONS))(td)


@pytest.mark.parametrize("name", sorted(REGRESSION))
def test_regression_shape_mismatch(name):
    td = _continuous_batch()
    with pytest.raises(ValueError, match=r"Shape mismatch.*\[7, 3\].*\[7, 2\]"):
        BCLoss(nn.Linear(OBS_DIM, ACTION_DIM + 1), loss_function=name)(td)


@pytest.mark.parametrize("action_shape", [(2,), (1, 1)])
def test_cross_entropy_shape_mismatch(action_shape):
    td = TensorDict(
        {
            "observation": torch.randn(BATCH, OBS_DIM),
            "action": torch.randint(NUM_ACTIONS, (BATCH, *action_shape)),
        },
        batch_size=[BATCH],
    )
    with pytest.raises(ValueError, match="Shape mismatch"):
        BCLoss(nn.Linear(OBS_DIM, NUM_ACTIONS))(td)


def test_cross_entropy_probability_shape_mismatch():
    td = _continuous_batch()  # float actions of size 2 vs logits of size 3
    with pytest.raises(ValueError, match=r"Shape mismatch.*class probabilities"):
        BCLoss(nn.Linear(OBS_DIM, NUM_ACTIONS), loss_function="cross_entropy")(td)


@pytest.mark.parametrize("bad", [-1, NUM_ACTIONS])
def test_out_of_range_action_index(bad):
    td = _discrete_batch()
    td["action"][0] = bad
    with pytest.raises(ValueError, match=rf"\[0, {NUM_ACTIONS}\)"):
        BCLoss(nn.Linear(OBS_DIM, NUM_ACTIONS))(td)


@pytest.mark.parametrize("name", sorted(REGRESSION))
def test_integer_actions_with_a_regression_loss(name):
    with pytest.raises(ValueError, match=r"needs floating.*cross_entropy"):
        BCLoss(nn.Linear(OBS_DIM, 1), loss_function=name)(_discrete_batch(action_shape=(1,)))


@pytest.mark.parametrize("bad", ["huber", "L3", ""])
def test_unknown_loss_function_string_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match=r"`loss_function`.*'l1', 'l2', 'mse', 'smooth_l1', 'cross_entropy'"):
        BCLoss(nn.Linear(2, 2), loss_function=bad)


def test_loss_function_of_the_wrong_type():
    with pytest.raises(TypeError, match="`loss_function`"):
        BCLoss(nn.Linear(2, 2), loss_function=3)


@pytest.mark.parametrize("bad", ["avg", "Mean", 1])
def test_unknown_reduction_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match=r"`reduction`.*'mean', 'sum', 'none'"):
        BCLoss(nn.Linear(2, 2), reduction=bad)


def test_actor_that_is_not_a_module():
    with pytest.raises(TypeError, match="`actor_network`"):
        BCLoss(lambda obs: obs)


def test_tensordict_module_without_a_usable_out_key():
    actor = TensorDictModule(lambda x: (x, x), in_keys=["observation"], out_keys=["loc", "scale"])
    with pytest.raises(ValueError, match=r"neither 'logits' nor 'action'"):
        BCLoss(actor)


def test_input_that_is_not_a_tensordict():
    with pytest.raises(TypeError, match="TensorDict batch"):
        BCLoss(nn.Linear(2, 2))({"observation": torch.zeros(1, 2), "action": torch.zeros(1, 2)})


class _TupleActor(nn.Module):
    def forward(self, obs):
        return obs, obs


class _ArgmaxActor(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(OBS_DIM, NUM_ACTIONS)

    def forward(self, obs):
        return self.linear(obs).argmax(-1)


def test_plain_actor_returning_a_tuple():
    with pytest.raises(TypeError, match="must return a tensor"):
        BCLoss(_TupleActor())(_continuous_batch())


def test_integer_prediction_is_refused():
    with pytest.raises(TypeError, match="floating outputs"):
        BCLoss(_ArgmaxActor())(_discrete_batch())


def test_callable_returning_a_non_tensor():
    with pytest.raises(TypeError, match="must return a tensor"):
        BCLoss(nn.Linear(OBS_DIM, ACTION_DIM), loss_function=lambda p, t: 0.0)(_continuous_batch())


def test_boolean_actions_are_ambiguous():
    td = _continuous_batch()
    td["action"] = td["action"] > 0
    with pytest.raises(TypeError, match="Boolean expert actions"):
        BCLoss(nn.Linear(OBS_DIM, ACTION_DIM))(td)


def test_docstring_examples_run():
    result = doctest.testmod(bc_module)
    assert result.attempted > 0 and result.failed == 0
