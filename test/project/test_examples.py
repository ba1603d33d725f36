"""Tests of the example scripts: every example is registered, runs in smoke mode, and the behaviour cloning
example clones its expert (500/500 on CartPole) and writes a checkpoint that ``rlrender`` plays back.

The registry is ``examples/registry.py``; the smoke runs and the full run happen in subprocesses, as a user
runs the scripts. The helpers of the behaviour cloning example are also imported and tested in-process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers.extras import require

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "examples"
BC_EXAMPLE = "replay-buffers/dataloader_behavior_cloning.py"
EVAL_LINE = re.compile(r"^eval episode (\d+): return (\d+) / 500$", re.MULTILINE)


def _load_module(name: str, path: Path) -> ModuleType:
    """Imports a script by path (examples are not a package); registered in sys.modules for dataclasses."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


registry = _load_module("_torchrl_examples_registry", EXAMPLES_DIR / "registry.py")


def _example_files(directory: Path = EXAMPLES_DIR) -> list[str]:
    return sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*.py"))


def _registry_problems(files: list[str], examples, excluded) -> list[str]:
    """What is wrong between the ``.py`` files present and the registry (empty when they agree)."""
    registered = [entry.path for entry in examples] + [entry.path for entry in excluded]
    problems = [f"{path}: not registered" for path in files if path not in registered]
    problems += [f"{path}: registered but no such file" for path in registered if path not in files]
    problems += [f"{path}: registered twice" for path in sorted(set(registered)) if registered.count(path) > 1]
    problems += [f"{entry.path}: excluded without a reason" for entry in excluded if not entry.reason.strip()]
    return problems


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _run_example(path: str, args: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Runs ``examples/<path> args`` with this interpreter; the working directory is ``cwd``."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES_DIR / path), *args],
        cwd=cwd,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _failure(proc: subprocess.CompletedProcess) -> str:
    return f"exit code {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


# ---------------------------------------------------------------------------------------------- the registry
def test_every_example_file_is_registered():
    problems = _registry_problems(_example_files(), registry.EXAMPLES, registry.EXCLUDED)
    assert not problems, (
        "examples/registry.py and the files under examples/ disagree:\n  " + "\n  ".join(problems) + "\n"
        "Add each example to EXAMPLES with its smoke arguments, or to EXCLUDED with the reason."
    )


@pytest.mark.parametrize(
    "files, examples, excluded, expected",
    [
        (["a.py", "b/c.py"], ["a.py", "b/c.py"], [], []),
        (["a.py", "b/c.py"], ["a.py"], [], ["b/c.py: not registered"]),
        (["a.py"], ["a.py"], [("a.py", "why")], ["a.py: registered twice"]),
        (["a.py"], ["a.py", "gone.py"], [], ["gone.py: registered but no such file"]),
        (["a.py", "r.py"], ["a.py"], [("r.py", " ")], ["r.py: excluded without a reason"]),
        (["a.py", "r.py"], ["a.py"], [("r.py", "not an example")], []),
    ],
)
def test_registry_check_reports_unregistered_missing_and_duplicate_entries(files, examples, excluded, expected):
    entries = [registry.Example(path, smoke_args=()) for path in examples]
    exclusions = [registry.Excluded(path, reason) for path, reason in excluded]
    assert _registry_problems(files, entries, exclusions) == expected


def test_example_walker_finds_nested_scripts_only(tmp_path):
    (tmp_path / "topic").mkdir()
    for name in ("top.py", "topic/nested.py", "topic/notes.md", "topic/data.pyc"):
        (tmp_path / name).write_text("")
    assert _example_files(tmp_path) == ["top.py", "topic/nested.py"]


def test_registry_entries_are_well_formed():
    assert any(entry.path == BC_EXAMPLE for entry in registry.EXAMPLES)
    for entry in registry.EXAMPLES:
        assert isinstance(entry.smoke_args, tuple) and all(isinstance(a, str) for a in entry.smoke_args)
        assert entry.timeout > 0
        assert not any(arg.startswith(str(ROOT)) for arg in entry.smoke_args), "smoke runs write under {tmp}"


# ---------------------------------------------------------------------------------------------- smoke runs
def _smoke_param(entry) -> pytest.param:
    marks = [pytest.mark.multiprocess, pytest.mark.timeout(entry.timeout + 60)]
    if entry.requires:
        marks.append(pytest.mark.extras)
    return pytest.param(entry, id=entry.path, marks=marks)


@pytest.mark.parametrize("entry", [_smoke_param(entry) for entry in registry.EXAMPLES])
def test_registered_example_runs_in_smoke_mode(entry, tmp_path):
    for module in entry.requires:
        require(module)
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in entry.smoke_args]
    proc = _run_example(entry.path, args, cwd=tmp_path, timeout=entry.timeout)
    assert proc.returncode == 0, _failure(proc)


# ---------------------------------------------------------------------------------- behaviour cloning example
@pytest.fixture(scope="module")
def bc_smoke(tmp_path_factory):
    """One smoke run of the behaviour cloning example: ``(completed process, checkpoint directory)``."""
    require("gymnasium")
    require("tqdm")
    tmp = tmp_path_factory.mktemp("bc_smoke")
    ckpt = tmp / "ckpt"
    proc = _run_example(BC_EXAMPLE, ["--smoke", "--seed", "3", "--out", str(ckpt)], cwd=tmp, timeout=180)
    assert proc.returncode == 0, _failure(proc)
    return proc, ckpt


@pytest.fixture(scope="module")
def bc():
    """The behaviour cloning example imported as a module (its helpers are tested in-process)."""
    require("gymnasium")
    require("tqdm")
    return _load_module("_torchrl_example_bc", EXAMPLES_DIR / BC_EXAMPLE)


@pytest.fixture
def restore_torch_globals():
    """The example's main() seeds torch and sets its thread count: restore both for the other tests."""
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    yield
    torch.set_num_threads(threads)
    torch.random.set_rng_state(rng)


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_bc_smoke_run_writes_a_checkpoint_that_rlrender_plays_as_a_gif(bc_smoke, tmp_path, capsys):
    pil_image = require("PIL.Image")
    pil_sequence = require("PIL.ImageSequence")
    require("pygame")
    from torchrl.render.cli import main

    _, ckpt = bc_smoke
    gif = tmp_path / "play.gif"
    code = main([str(ckpt), "--episodes", "1", "--max-steps", "30", "--gif", str(gif)])
    assert code == 0
    out = capsys.readouterr().out
    steps = int(re.search(r"^episode 1: return [\d.]+ \((\d+) steps\)$", out, re.MULTILINE).group(1))
    assert 1 <= steps <= 30
    with pil_image.open(gif) as image:
        frames = [frame.copy() for frame in pil_sequence.Iterator(image)]
        assert image.format == "GIF"
    # The frame after the reset and one per step; Pillow may merge identical consecutive frames.
    assert 2 <= len(frames) <= steps + 1
    assert len({frame.size for frame in frames}) == 1 and frames[0].size[0] > 0


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_bc_smoke_run_prints_returns_and_the_playback_command(bc_smoke):
    from torchrl.render import MLPPolicy, load_policy_checkpoint

    proc, ckpt = bc_smoke
    returns = [float(r) for _, r in EVAL_LINE.findall(proc.stdout)]
    assert len(returns) == 1 and 1 <= returns[0] <= 500
    command = next(line for line in proc.stdout.splitlines() if "--gif" in line)
    assert str(ckpt) in command and ("rlrender" in command or "torchrl.render" in command)
    assert "behaviour cloning" in proc.stderr  # the tqdm progress bar
    loaded = load_policy_checkpoint(ckpt)
    assert loaded.env_id == "CartPole-v1" and isinstance(loaded.policy, MLPPolicy)
    assert loaded.metadata["eval_returns"] == returns and loaded.metadata["updates"] == 8


@pytest.mark.slow
@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_bc_defaults_reach_500_on_every_eval_episode(tmp_path):
    require("gymnasium")
    require("tqdm")
    args = ["--seed", "0", "--out", str(tmp_path / "ckpt"), "--check-return", "500"]
    proc = _run_example(BC_EXAMPLE, args, cwd=tmp_path, timeout=540)
    assert proc.returncode == 0, _failure(proc)
    returns = [int(r) for _, r in EVAL_LINE.findall(proc.stdout)]
    assert returns == [500] * 5, proc.stdout


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_collectors_and_learner_finishes_with_its_defaults(tmp_path):
    # Its collectors are forked (the default) after the parent built the default-size shared buffer, which ran
    # OpenMP work there: see NOTE [OpenMP and fork] in torchrl/data/replay_buffers/_shared/openmp_fork.py.
    proc = _run_example("replay-buffers/collectors_and_learner.py", [], cwd=tmp_path, timeout=540)
    assert proc.returncode == 0, _failure(proc)
    assert re.search(r"^step +1592 .* inserts +25600 ", proc.stdout, re.MULTILINE), proc.stdout


@pytest.mark.extras
@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_bc_expert_reaches_500_and_labels_every_transition(bc, noise):
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1500), batch_size=8)
    returns = bc.collect_demonstrations(rb, episodes=3, noise=noise, seed=11)
    assert returns == [500.0] * 3 and len(rb) == 1500
    data = rb.storage.get(torch.arange(len(rb)))
    assert data["observation"].dtype == torch.float32 and data["observation"].shape == (1500, 4)
    assert data["action"].dtype == torch.int64
    # The label is the expert's action in the state it was taken, whatever action was played.
    expected = [bc.expert_action(obs.numpy()) for obs in data["observation"]]
    assert data["action"].tolist() == expected


@pytest.mark.extras
@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], {"updates": 500, "demo_episodes": 20, "eval_episodes": 5, "num_workers": 2}),
        (["--smoke"], {"updates": 8, "demo_episodes": 2, "eval_episodes": 1, "num_workers": 2}),
        (["--smoke", "--updates", "3", "--eval-episodes", "2"], {"updates": 3, "eval_episodes": 2}),
        (["--updates", "7", "--num-workers", "0"], {"updates": 7, "demo_episodes": 20, "num_workers": 0}),
    ],
)
def test_bc_smoke_lowers_only_the_sizes_not_given(bc, argv, expected):
    args = bc.parse_args(argv)
    assert {name: getattr(args, name) for name in expected} == expected


@pytest.mark.extras
@pytest.mark.parametrize(
    "argv, name",
    [
        (["--updates", "0"], "--updates"),
        (["--num-workers", "-1"], "--num-workers"),
        (["--batch-size", "0"], "--batch-size"),
        (["--expert-noise", "1.5"], "--expert-noise"),
        (["--check-return", "high"], "--check-return"),
    ],
)
def test_bc_rejects_bad_arguments_with_a_usage_error(bc, argv, name, capsys):
    with pytest.raises(SystemExit) as exc:
        bc.parse_args(argv)
    assert exc.value.code == 2
    assert name in capsys.readouterr().err


@pytest.mark.extras
@pytest.mark.parametrize("threshold, code", [(0, 0), (501, 1)])
def test_bc_check_return_sets_the_exit_code(bc, tmp_path, capsys, restore_torch_globals, threshold, code):
    argv = ["--smoke", "--num-workers", "0", "--out", str(tmp_path / "ckpt"), "--check-return", str(threshold)]
    assert bc.main(argv) == code
    err = capsys.readouterr().err
    assert ("--check-return 501 not reached" in err) == (code == 1)
    assert (tmp_path / "ckpt" / "policy.json").is_file()  # the checkpoint is written either way
