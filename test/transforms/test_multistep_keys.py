"""MultiStepTransform's key properties (TorchRL's ``reward_keys``, ``done_key``, ``done_keys``, ``mask_key``, each
with a setter): read back as given, checked on assignment, ``None`` sets the default back, and a change applies to
the next write."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import DEFAULT_DONE_KEYS
from torchrl.envs.transforms import MultiStepTransform


def _steps(n: int = 6, *, done_at=(), stop_at=()) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    stop = torch.zeros(n, 1, dtype=torch.bool)
    done[list(done_at)] = True
    stop[list(stop_at)] = True
    return TensorDict(
        {"obs": torch.arange(float(n)),
         "next": {"obs": torch.arange(1.0, n + 1), "reward": torch.ones(n, 1), "bonus": torch.full((n, 1), 10.0),
                  "done": done, "stop": stop}},
        batch_size=[n],
    )  # fmt: skip


def test_the_properties_read_back_the_constructor_s_keys_and_defaults():
    default = MultiStepTransform(2, 0.5)
    assert default.reward_keys == ["reward"] and default.done_key == "done" and default.mask_key == "mask"
    assert default.done_keys == list(DEFAULT_DONE_KEYS)
    custom = MultiStepTransform(2, 0.5, reward_keys=("agent", "r"), done_key="stop", done_keys=["stop"],
                                mask_key=("m", "k"))
    assert custom.reward_keys == [("agent", "r")] and custom.done_key == "stop"
    assert custom.done_keys == ["stop"] and custom.mask_key == ("m", "k")
    for name in ("reward_keys", "done_key", "done_keys", "mask_key"):
        assert isinstance(getattr(MultiStepTransform, name), property)


def test_setting_done_key_changes_where_the_look_ahead_stops():
    transform = MultiStepTransform(3, 1.0)
    data = _steps(done_at=(), stop_at=(0,))
    assert transform.inv(data.clone())["next", "reward"][0].item() == 3.0  # no "done": three rewards summed
    transform = MultiStepTransform(3, 1.0)
    transform.done_key = "stop"
    transform.done_keys = ["stop"]
    assert transform.inv(data.clone())["next", "reward"][0].item() == 1.0  # "stop" at step 0 ends it there


def test_setting_reward_keys_changes_the_entries_summed():
    transform = MultiStepTransform(2, 1.0)
    transform.reward_keys = ["bonus"]
    out = transform.inv(_steps())
    assert out["next", "bonus"][0].item() == 20.0 and out["next", "reward"][0].item() == 1.0


def test_none_sets_the_default_back():
    transform = MultiStepTransform(2, 0.5, reward_keys="r", done_key="stop", done_keys=["stop"], mask_key="m")
    transform.reward_keys = transform.done_key = transform.done_keys = transform.mask_key = None
    assert transform.reward_keys == ["reward"] and transform.done_key == "done"
    assert transform.done_keys == list(DEFAULT_DONE_KEYS) and transform.mask_key == "mask"


@pytest.mark.parametrize(("name", "bad"), [("done_key", 3), ("mask_key", ["a"]), ("reward_keys", [1]),
                                           ("done_keys", [])])
def test_a_bad_key_is_refused_and_the_old_one_kept(name, bad):
    transform = MultiStepTransform(2, 0.5)
    before = getattr(transform, name)
    with pytest.raises(TypeError, match=f"`{name}` must be"):
        setattr(transform, name, bad)
    assert getattr(transform, name) == before
