"""Tests of torchrl.render: MLPPolicy, the pickle-free policy checkpoint format and the ``rlrender`` CLI."""

from __future__ import annotations

import doctest
import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.extras import require
from torch import nn

import torchrl
import torchrl.render.checkpoint as checkpoint_module
import torchrl.render.cli as cli_module
import torchrl.render.policy as policy_module
from torchrl.render import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointFormatError,
    MLPPolicy,
    load_policy_checkpoint,
    save_policy_checkpoint,
)
from torchrl.render._rollout import RenderError, _headless, write_gif
from torchrl.render.cli import main

REPO_ROOT = Path(torchrl.__file__).resolve().parent.parent
ERROR_PREFIX = "rlrender: error:"
EPISODE_LINE = re.compile(r"^episode (\d+): return (-?[\d.]+) \((\d+) steps\)$", re.MULTILINE)


@pytest.fixture
def cartpole_ckpt(tmp_path):
    torch.manual_seed(0)
    return save_policy_checkpoint(tmp_path / "ckpt", MLPPolicy(4, 2, hidden=(16,)), env_id="CartPole-v1")


def _run_cli(argv, capsys):
    """Runs main(argv); returns (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _replace_weights(ckpt: Path, obj):
    """Saves ``obj`` as the weights file and records its hash, so only the content check can refuse it."""
    torch.save(obj, ckpt / "weights.pt")
    spec = json.loads((ckpt / "policy.json").read_text())
    _rewrite_spec(ckpt, weights={**spec["weights"], "sha256": _sha256(ckpt / "weights.pt")})


def _rewrite_spec(ckpt: Path, **changes):
    spec = json.loads((ckpt / "policy.json").read_text())
    spec.update(changes)
    (ckpt / "policy.json").write_text(json.dumps(spec))
    return spec


# ------------------------------------------------------------------------------------------------- MLPPolicy


@pytest.mark.parametrize("hidden", [(), (8,), (16, 8, 4)])
@pytest.mark.parametrize("activation", sorted(policy_module.ACTIVATIONS))
def test_mlp_policy_shapes_and_greedy_action(hidden, activation):
    policy = MLPPolicy(6, 3, hidden=hidden, activation=activation)
    obs = torch.randn(10, 6)
    logits = policy(obs)
    assert logits.shape == (10, 3)
    assert torch.equal(policy.act(obs), logits.argmax(-1))
    assert policy.act(obs[0].numpy()).shape == torch.Size([])
    linears = [m for m in policy.modules() if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [*hidden, 3]
    expected = {"obs_dim": 6, "num_actions": 3, "hidden": list(hidden), "activation": activation}
    assert policy.config() == expected


def test_mlp_policy_config_round_trip_rebuilds_the_same_architecture():
    policy = MLPPolicy(4, 2, hidden=(32, 32), activation="relu")
    clone = MLPPolicy.from_config(json.loads(json.dumps(policy.config())))
    clone.load_state_dict(policy.state_dict())
    obs = torch.randn(3, 4)
    assert torch.equal(clone(obs), policy(obs))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"obs_dim": 0}, ValueError, "`obs_dim`"),
        ({"obs_dim": 2.5}, ValueError, "`obs_dim`"),
        ({"num_actions": -1}, ValueError, "`num_actions`"),
        ({"num_actions": True}, ValueError, "`num_actions`"),
        ({"hidden": "64"}, TypeError, "`hidden`"),
        ({"hidden": (64, 0)}, ValueError, "`hidden`"),
        ({"activation": "sigmoid"}, ValueError, r"`activation`.*'tanh'"),
    ],
)
def test_mlp_policy_argument_errors(kwargs, error, match):
    args = {"obs_dim": 4, "num_actions": 2, **kwargs}
    with pytest.raises(error, match=match):
        MLPPolicy(**args)


def test_mlp_policy_observation_size_error():
    with pytest.raises(ValueError, match=r"obs_dim=4.*\[2, 5\]"):
        MLPPolicy(4, 2)(torch.zeros(2, 5))


@pytest.mark.parametrize(
    "config, error",
    [
        ([4, 2], TypeError),
        ({"obs_dim": 4, "num_actions": 2, "hidden": [8]}, ValueError),
        ({"obs_dim": 4, "num_actions": 2, "hidden": [8], "activation": "tanh", "dropout": 0.1}, ValueError),
    ],
)
def test_mlp_policy_from_config_errors(config, error):
    with pytest.raises(error, match="`config`"):
        MLPPolicy.from_config(config)


def test_mlp_policy_is_a_bc_loss_actor_and_survives_a_checkpoint(tmp_path):
    from tensordict import TensorDict

    from torchrl.objectives import BCLoss

    torch.manual_seed(0)
    policy = MLPPolicy(4, 2, hidden=(16,))
    obs = torch.randn(256, 4)
    batch = TensorDict({"observation": obs, "action": (obs[:, 2] > 0).long()}, batch_size=[256])
    loss_fn = BCLoss(policy)
    optim = torch.optim.Adam(policy.parameters(), lr=0.05)
    for _ in range(100):
        optim.zero_grad()
        loss_fn(batch)["loss_bc"].backward()
        optim.step()
    accuracy = (policy.act(obs) == batch["action"]).float().mean().item()
    assert accuracy > 0.9
    ckpt = load_policy_checkpoint(save_policy_checkpoint(tmp_path, policy, env_id="CartPole-v1"))
    assert torch.equal(ckpt.policy.act(obs), policy.act(obs))


# ----------------------------------------------------------------------------------------------- checkpoint


def test_checkpoint_round_trip(tmp_path):
    policy = MLPPolicy(4, 2, hidden=(8, 8), activation="elu")
    metadata = {"updates": 500, "eval_returns": [500.0, 500.0], "note": "bc"}
    path = save_policy_checkpoint(tmp_path / "a" / "b", policy, env_id="CartPole-v1", metadata=metadata)
    assert path == tmp_path / "a" / "b"
    assert sorted(p.name for p in path.iterdir()) == ["policy.json", "weights.pt"]
    ckpt = load_policy_checkpoint(str(path))
    assert isinstance(ckpt.policy, MLPPolicy) and not ckpt.policy.training
    assert (ckpt.env_id, ckpt.metadata, ckpt.path) == ("CartPole-v1", metadata, path)
    assert ckpt.version == FORMAT_VERSION
    assert ckpt.policy.config() == policy.config()
    for key, value in policy.state_dict().items():
        assert torch.equal(ckpt.policy.state_dict()[key], value), key


def test_checkpoint_files_follow_the_documented_format(cartpole_ckpt):
    spec = json.loads((cartpole_ckpt / "policy.json").read_text())
    assert spec["format"] == FORMAT_NAME and spec["version"] == FORMAT_VERSION
    assert spec["env_id"] == "CartPole-v1"
    assert spec["policy"] == {
        "class": "MLPPolicy",
        "config": {"obs_dim": 4, "num_actions": 2, "hidden": [16], "activation": "tanh"},
    }
    weights = cartpole_ckpt / "weights.pt"
    assert spec["weights"] == {"file": "weights.pt", "sha256": _sha256(weights)}
    state_dict = torch.load(weights, weights_only=True)
    assert set(state_dict) == set(MLPPolicy(4, 2, hidden=(16,)).state_dict())
    assert not [p for p in cartpole_ckpt.iterdir() if p.name.endswith(".tmp")]


def test_load_accepts_the_policy_json_path(cartpole_ckpt):
    assert load_policy_checkpoint(cartpole_ckpt / "policy.json").path == cartpole_ckpt


def test_saving_again_replaces_the_checkpoint(cartpole_ckpt):
    new = MLPPolicy(4, 2, hidden=(3,), activation="relu")
    save_policy_checkpoint(cartpole_ckpt, new, env_id="Acrobot-v1")
    ckpt = load_policy_checkpoint(cartpole_ckpt)
    assert ckpt.env_id == "Acrobot-v1" and ckpt.policy.config() == new.config()


@pytest.mark.parametrize(
    "policy, kwargs, error, match",
    [
        (nn.Linear(4, 2), {"env_id": "CartPole-v1"}, TypeError, r"`policy`.*Linear"),
        (MLPPolicy(4, 2), {"env_id": ""}, ValueError, "`env_id`"),
        (MLPPolicy(4, 2), {"env_id": None}, ValueError, "`env_id`"),
        (MLPPolicy(4, 2), {"env_id": "a-v0", "metadata": {"t": torch.ones(1)}}, TypeError, "`metadata`"),
        (MLPPolicy(4, 2), {"env_id": "a-v0", "metadata": {1: "a"}}, TypeError, "`metadata`"),
        (MLPPolicy(4, 2), {"env_id": "a-v0", "metadata": {"x": float("nan")}}, TypeError, "`metadata`"),
    ],
)
def test_save_argument_errors(tmp_path, policy, kwargs, error, match):
    with pytest.raises(error, match=match):
        save_policy_checkpoint(tmp_path / "ckpt", policy, **kwargs)
    assert not (tmp_path / "ckpt" / "policy.json").exists()


def test_save_refuses_an_existing_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="`path`"):
        save_policy_checkpoint(tmp_path / "file", MLPPolicy(4, 2), env_id="CartPole-v1")


def test_load_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy_checkpoint(tmp_path / "nope")


def test_load_refuses_a_torch_save_file(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(MLPPolicy(4, 2), path)
    with pytest.raises(CheckpointFormatError, match="is a file.*not loaded"):
        load_policy_checkpoint(path)


def test_load_refuses_a_directory_without_policy_json(tmp_path):
    torch.save(MLPPolicy(4, 2).state_dict(), tmp_path / "weights.pt")
    with pytest.raises(CheckpointFormatError, match=r"no policy.json.*weights.pt"):
        load_policy_checkpoint(tmp_path)


class _Payload:
    """A pickle whose loading would create a marker file: loading must never run it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_load_never_unpickles_code(cartpole_ckpt, tmp_path):
    marker = tmp_path / "pwned"
    _replace_weights(cartpole_ckpt, {"net.0.weight": _Payload(marker)})
    with pytest.raises(CheckpointFormatError, match=r"weights_only=True"):
        load_policy_checkpoint(cartpole_ckpt)
    assert not marker.exists()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda ckpt: (ckpt / "policy.json").write_text("{not json"), "not valid JSON"),
        (lambda ckpt: (ckpt / "policy.json").write_text("[1, 2]"), "another format"),
        (lambda ckpt: _rewrite_spec(ckpt, format="something.else"), r"another format \('something.else'\)"),
        (lambda ckpt: _rewrite_spec(ckpt, version=FORMAT_VERSION + 1), "newer.*Upgrade"),
        (lambda ckpt: _rewrite_spec(ckpt, version="1"), "invalid format version"),
        (lambda ckpt: _rewrite_spec(ckpt, env_id=3), "'env_id' must be a str"),
        (lambda ckpt: _rewrite_spec(ckpt, policy={"class": "os.system", "config": {}}), "cannot rebuild"),
        (
            lambda ckpt: _rewrite_spec(ckpt, policy={"class": "MLPPolicy", "config": {"obs_dim": 4}}),
            "invalid MLPPolicy config",
        ),
        (
            lambda ckpt: _rewrite_spec(ckpt, weights={"file": "../../etc/passwd"}),
            "plain file name",
        ),
        (lambda ckpt: (ckpt / "weights.pt").unlink(), "no weights file"),
        (lambda ckpt: (ckpt / "weights.pt").write_bytes(b"garbage"), "SHA-256"),
        (
            lambda ckpt: _rewrite_spec(
                ckpt, policy={"class": "MLPPolicy", "config": {**MLPPolicy(4, 2).config(), "hidden": [8]}}
            ),
            "do not fit the architecture",
        ),
    ],
    ids=[
        "bad-json",
        "json-list",
        "other-format",
        "newer-version",
        "bad-version",
        "bad-env-id",
        "unknown-class",
        "bad-config",
        "weights-path-escape",
        "no-weights",
        "corrupted-weights",
        "shape-mismatch",
    ],
)
def test_load_format_errors(cartpole_ckpt, mutate, match):
    mutate(cartpole_ckpt)
    with pytest.raises(CheckpointFormatError, match=match):
        load_policy_checkpoint(cartpole_ckpt)


def test_weights_that_are_not_a_state_dict(cartpole_ckpt):
    _replace_weights(cartpole_ckpt, [torch.zeros(2)])
    with pytest.raises(CheckpointFormatError, match="does not hold a state_dict"):
        load_policy_checkpoint(cartpole_ckpt)


# ------------------------------------------------------------------------------ CLI errors (no gymnasium)


def test_cli_missing_checkpoint(tmp_path, capsys):
    code, out, err = _run_cli([tmp_path / "nope"], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX) and "does not exist" in err and out == ""


def test_cli_pickle_file(tmp_path, capsys):
    path = tmp_path / "policy.pkl"
    path.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    code, _, err = _run_cli([path], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX) and "is a file" in err


def test_cli_directory_without_policy_json(tmp_path, capsys):
    code, _, err = _run_cli([tmp_path], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX) and "no policy.json" in err


@pytest.mark.parametrize(
    "args", [["--episodes", "0"], ["--max-steps", "-3"], ["--fps", "nan"], ["--seed", "x"]]
)
def test_cli_bad_arguments(cartpole_ckpt, capsys, args):
    code, _, err = _run_cli([cartpole_ckpt, *args], capsys)
    assert code == 2 and f"{ERROR_PREFIX} argument" in err


def test_cli_without_gymnasium(cartpole_ckpt, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # makes `import gymnasium` raise ImportError
    code, _, err = _run_cli([cartpole_ckpt], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX) and "pip install gymnasium" in err


def test_cli_gif_without_pillow(cartpole_ckpt, capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    code, out, err = _run_cli([cartpole_ckpt, "--gif", tmp_path / "x.gif"], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX) and "pip install pillow" in err
    assert "episode" not in out, "the missing dependency is reported before playing"


def test_module_entry_point_help():
    result = subprocess.run(
        [sys.executable, "-m", "torchrl.render", "--help"],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rlrender ")
    for flag in ("CHECKPOINT", "--env", "--episodes", "--seed", "--gif", "--max-steps"):
        assert flag in result.stdout


def test_importing_torchrl_render_needs_no_optional_dependency():
    code = (
        "import sys, torchrl.render, torchrl.render.cli; "
        "print(sorted(m for m in ('gymnasium', 'pygame', 'PIL') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_subprocess_env(), timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_headless_default_respects_the_user_setting(monkeypatch):
    monkeypatch.delenv("SDL_VIDEODRIVER", raising=False)
    _headless()
    assert os.environ["SDL_VIDEODRIVER"] == "dummy"
    monkeypatch.setenv("SDL_VIDEODRIVER", "offscreen")
    _headless()
    assert os.environ["SDL_VIDEODRIVER"] == "offscreen"


def test_docstring_examples_run():
    for module in (checkpoint_module, policy_module, cli_module):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ---------------------------------------------------------------------------------------------- GIF writer


def _moving_square_frames(count, size=(40, 60)):
    frames = []
    for i in range(count):
        frame = np.full((*size, 3), 255, dtype=np.uint8)
        frame[10:20, i : i + 10] = (200, 40, 40)
        frames.append(frame)
    return frames


@pytest.mark.parametrize("count", [1, 2, 30])
def test_write_gif_keeps_every_frame_and_its_colors(tmp_path, count):
    image = require("PIL.Image")
    from PIL import ImageSequence

    frames = _moving_square_frames(count)
    path = write_gif(tmp_path / "sub" / "a.gif", frames, fps=25)
    with image.open(path) as img:
        decoded = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(img)]
        assert img.info["duration"] == 40 and img.info.get("loop") == 0
    assert len(decoded) == count
    for got, expected in zip(decoded, frames):
        assert np.abs(got.astype(int) - expected).max() <= 8


def test_write_gif_with_frames_of_different_sizes(tmp_path):
    image = require("PIL.Image")
    frames = _moving_square_frames(2) + _moving_square_frames(1, size=(30, 60))
    with image.open(write_gif(tmp_path / "a.gif", frames, fps=10)) as img:
        assert img.n_frames == 3


def test_write_gif_without_frames(tmp_path):
    require("PIL.Image")
    with pytest.raises(RenderError, match="no frame"):
        write_gif(tmp_path / "a.gif", [], fps=10)


# ------------------------------------------------------------------------------------- CLI with gymnasium


def _episodes(out):
    return [(int(i), float(ret), int(steps)) for i, ret, steps in EPISODE_LINE.findall(out)]


@pytest.mark.extras
def test_cli_plays_and_writes_a_gif(cartpole_ckpt, capsys, tmp_path, monkeypatch):
    require("gymnasium")
    image = require("PIL.Image")
    from PIL import ImageSequence

    monkeypatch.delenv("SDL_VIDEODRIVER", raising=False)
    gif = tmp_path / "out" / "tmp.gif"
    code, out, err = _run_cli([cartpole_ckpt, "--episodes", "1", "--max-steps", "20", "--gif", gif], capsys)
    assert code == 0, err
    [(index, episode_return, steps)] = _episodes(out)
    assert index == 1 and 1 <= steps <= 20
    assert episode_return == steps  # CartPole pays 1 per step
    assert f"wrote {gif} ({steps + 1} frames)" in out
    with image.open(gif) as img:
        frames = list(ImageSequence.Iterator(img))
        assert img.size == (600, 400)
    assert 1 < len(frames) <= steps + 1


@pytest.mark.extras
def test_cli_is_deterministic_for_a_seed_and_plays_each_episode(cartpole_ckpt, capsys):
    require("gymnasium")
    args = [cartpole_ckpt, "--episodes", "3", "--seed", "5", "--env", "CartPole-v1"]
    first = _run_cli(args, capsys)
    second = _run_cli(args, capsys)
    assert first[0] == second[0] == 0
    episodes = _episodes(first[1])
    assert [e[0] for e in episodes] == [1, 2, 3]
    assert episodes == _episodes(second[1])
    mean = sum(e[1] for e in episodes) / 3
    assert f"mean return over 3 episode(s): {mean:.1f}" in first[1]


@pytest.mark.extras
@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "CartPole-v99", "nowhere/CartPole-v1"])
def test_cli_unknown_environment(cartpole_ckpt, capsys, env_id):
    require("gymnasium")
    code, out, err = _run_cli([cartpole_ckpt, "--env", env_id], capsys)
    assert code == 2 and err.startswith(f"{ERROR_PREFIX} unknown environment id {env_id!r}")
    assert "episode" not in out


@pytest.mark.extras
def test_cli_unknown_environment_stored_in_the_checkpoint(tmp_path, capsys):
    require("gymnasium")
    ckpt = save_policy_checkpoint(tmp_path / "ckpt", MLPPolicy(4, 2), env_id="Gone-v3")
    code, _, err = _run_cli([ckpt], capsys)
    assert code == 2 and err.startswith(f"{ERROR_PREFIX} unknown environment id 'Gone-v3'")


@pytest.mark.extras
@pytest.mark.parametrize(
    "num_actions, env_id, match",
    [
        (2, "Acrobot-v1", "the policy has 2 actions, but 'Acrobot-v1' has 3"),
        (3, "Acrobot-v1", "observations of size 4"),
        (2, "Pendulum-v1", "discrete-action environment"),
    ],
)
def test_cli_environment_that_does_not_fit_the_policy(tmp_path, capsys, num_actions, env_id, match):
    require("gymnasium")
    ckpt = save_policy_checkpoint(tmp_path / "ckpt", MLPPolicy(4, num_actions), env_id="CartPole-v1")
    code, _, err = _run_cli([ckpt, "--env", env_id], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX) and match in err


@pytest.mark.extras
def test_cli_gif_path_that_cannot_be_written(cartpole_ckpt, capsys, tmp_path):
    require("gymnasium")
    require("PIL.Image")
    (tmp_path / "afile").write_text("x")
    gif = tmp_path / "afile" / "x.gif"  # its parent is a file
    code, _, err = _run_cli([cartpole_ckpt, "--max-steps", "3", "--gif", gif], capsys)
    assert code == 2 and err.startswith(ERROR_PREFIX)
