"""Crash safety of checkpoint writes: a writer killed (SIGKILL) at any moment leaves the old or the new one.

Children are forked writers. Step kills: the child kills itself at a named step of the write (through the
test-only ``_checkpoint_fs.STEP_HOOK``), for both switch implementations (``renameat2`` exchange, two
renames). Random kills: the child rewrites the checkpoint in a loop, with short sleeps at every step to
widen the switch windows, and the parent kills it at a random time. After each kill the checkpoint must
read back as exactly one complete version, and the next write must succeed and leave no leftovers.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import time

import pytest
import torch

from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
from torchrl.data.replay_buffers.checkpointers import read_checkpoint, write_checkpoint

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks writers and sends SIGKILL"),
]


def _content(version: int) -> dict[str, torch.Tensor]:
    """A few MB whose every byte depends on ``version``, in several files and a sub-directory."""
    return {
        "obs": torch.full((256, 1024), float(version)),
        "nested/action": torch.arange(50_000, dtype=torch.int64) + version,
        "flags": torch.arange(1000) % (version + 2) == 0,
        "reward": torch.tensor(float(version), dtype=torch.float64),
    }


def _write_version(path: str, version: int, fsync: bool = True) -> None:
    write_checkpoint(path, _content(version), {"version": version}, fsync=fsync)


def _read_version(path: str) -> int:
    """The version read at ``path``, after checking that every tensor is exactly that version's."""
    tensors, metadata = read_checkpoint(path)
    version = metadata["version"]
    expected = _content(version)
    assert set(tensors) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(tensors[name], tensor), f"{name} of version {version} is mixed with another version"
    return version


def _leftovers(path: str) -> list[str]:
    parent, name = os.path.split(path)
    return sorted(e for e in os.listdir(parent) if e.startswith(name + "."))


def _kill_self_at(step: str, nth: int = 1):
    seen = {"n": 0}

    def hook(name: str) -> None:
        if name == step:
            seen["n"] += 1
            if seen["n"] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _child_write_once(path: str, version: int, step: str, nth: int, use_exchange: bool) -> None:
    torch.set_num_threads(1)  # OpenMP's pool does not survive fork: parallel ops in the child would hang
    _checkpoint_fs.USE_EXCHANGE = use_exchange
    _checkpoint_fs.STEP_HOOK = _kill_self_at(step, nth)
    _write_version(path, version)


_CTX = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None


def _run_to_death(target, *args) -> int:
    """Runs ``target(*args)`` in a forked child until it dies; returns its exit code."""
    child = _CTX.Process(target=target, args=args)
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
        raise AssertionError("the child writer hung")
    return child.exitcode

# (step, nth occurrence, whether the new version is in place once the process dies there)
_BEFORE = [("tmp_created", 1), ("tensor_written", 1), ("tensor_written", 3), ("metadata_written", 1)]
_BEFORE += [("marker_written", 1), ("before_switch", 1)]
_AFTER = [("after_rename", 1), ("after_parent_sync", 1), ("after_cleanup", 1)]
STEP_CASES = (
    [(s, n, "exchange", False) for s, n in _BEFORE]
    + [("after_exchange", 1, "exchange", True)]
    + [(s, n, "exchange", True) for s, n in _AFTER[1:]]
    + [(s, n, "two-renames", False) for s, n in _BEFORE]
    + [("after_aside", 1, "two-renames", False)]
    + [(s, n, "two-renames", True) for s, n in _AFTER]
)


@pytest.mark.parametrize("step, nth, mode, new_expected", STEP_CASES, ids=lambda v: str(v))
def test_kill_at_each_step_leaves_exactly_the_old_or_the_new_checkpoint(tmp_path, step, nth, mode, new_expected):
    path = str(tmp_path / "ckpt")
    _write_version(path, 1)
    exitcode = _run_to_death(_child_write_once, path, 2, step, nth, mode == "exchange")
    assert exitcode == -signal.SIGKILL, f"the child was not killed at {step!r} (exit {exitcode})"
    assert _read_version(path) == (2 if new_expected else 1)
    _write_version(path, 3)  # the next writer recovers and cleans up
    assert _read_version(path) == 3
    assert _leftovers(path) == []


@pytest.mark.parametrize("step", ["tmp_created", "tensor_written", "marker_written", "before_switch"])
def test_kill_of_the_first_write_leaves_no_checkpoint_and_the_next_write_works(tmp_path, step):
    path = str(tmp_path / "ckpt")
    assert _run_to_death(_child_write_once, path, 1, step, 1, True) == -signal.SIGKILL
    with pytest.raises(FileNotFoundError):
        read_checkpoint(path)
    _write_version(path, 2)
    assert _read_version(path) == 2 and _leftovers(path) == []


def _child_write_loop(path: str, done, use_exchange: bool, seed: int) -> None:
    torch.set_num_threads(1)
    _checkpoint_fs.USE_EXCHANGE = use_exchange
    rng = random.Random(seed)
    _checkpoint_fs.STEP_HOOK = lambda name: time.sleep(rng.uniform(0, 0.004))
    version = done.value
    while True:
        version += 1
        _write_version(path, version, fsync=rng.random() < 0.5)
        done.value = version


@pytest.mark.parametrize("trial", range(24))
def test_kill_at_a_random_time_leaves_exactly_the_old_or_the_new_checkpoint(tmp_path, trial):
    rng = random.Random(trial)
    path = str(tmp_path / "ckpt")
    _write_version(path, 1)
    # no lock: the child is the only writer, and one SIGKILLed while holding the Value's lock (its `done.value =`)
    # left the parent's read blocked until the test timed out (once on CI)
    done = _CTX.Value("q", 1, lock=False)
    child = _CTX.Process(target=_child_write_loop, args=(path, done, trial % 2 == 0, trial))
    child.start()
    deadline = time.monotonic() + 30
    while done.value < 1 + trial % 3 and time.monotonic() < deadline:  # let it overwrite a few times
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.08))
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    committed = done.value
    version = _read_version(path)
    assert version in (committed, committed + 1), (version, committed)
    _write_version(path, 10_000)
    assert _read_version(path) == 10_000 and _leftovers(path) == []
