"""Crash safety of incremental dumps: a writer killed (SIGKILL) at any moment leaves a loadable checkpoint,
the previous one or the new one, whose rows are exactly those of the buffer at that dump.

Children are forked writers that build a buffer over a memory-mapped storage, dump it in full, then loop:
``extend`` a few rows, ``rb.dumps`` onto the same path (incremental: patch files, hard links of the rest). Every
row holds its write index, so the rows a checkpoint must hold follow from the writer's saved ``write_count``.
Step kills stop the child at a named step of an incremental dump (both switch implementations); random kills
stop it at a random time. Then the checkpoint must load, hold the rows of a committed dump, and take the next
dump of another buffer.
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
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, ReplayBuffer
from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
from torchrl.data.replay_buffers.checkpointers import read_checkpoint

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks writers and sends SIGKILL"),
]

CAPACITY, STEP = 512, 17
_CTX = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None


def _rows(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(obs=ids.unsqueeze(-1).float().expand(n, 16).clone(), step=ids, batch_size=[n])


def _buffer(directory) -> ReplayBuffer:
    return make_buffer(storage=LazyMemmapStorage(CAPACITY, scratch_dir=directory), batch_size=4)


def _check_loaded(path, directory) -> int:
    """Loads ``path`` and checks every row against the write count it was saved with; returns that count."""
    rb = _buffer(directory)
    rb.loads(path)
    total = rb.writer.write_count
    assert len(rb) == min(total, CAPACITY)
    steps = rb[:]["step"]
    for row in range(len(rb)):  # the newest write of each row: the write index w < total with w % CAPACITY == row
        expected = row + (total - 1 - row) // CAPACITY * CAPACITY
        assert int(steps[row]) == expected, (row, int(steps[row]), expected, total)
    assert (rb[:]["obs"] == steps.unsqueeze(-1).float()).all()
    return total


def _writer_loop(path: str, scratch: str, done, step_kill, use_exchange: bool, seed: int) -> None:
    torch.set_num_threads(1)  # OpenMP's pool does not survive fork
    _checkpoint_fs.USE_EXCHANGE = use_exchange
    rb = _buffer(scratch)
    rb.extend(_rows(0, 300))
    rb.dumps(path, fsync=False)
    done.value = rb.writer.write_count
    rng = random.Random(seed)
    if step_kill is None:
        _checkpoint_fs.STEP_HOOK = lambda name: time.sleep(rng.uniform(0, 0.003))
    else:
        step, nth = step_kill
        seen = [0]

        def hook(name: str) -> None:
            if name == step:
                seen[0] += 1
                if seen[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

        _checkpoint_fs.STEP_HOOK = hook
    while True:
        rb.extend(_rows(rb.writer.write_count, STEP))
        rb.dumps(path, fsync=rng.random() < 0.5)
        done.value = rb.writer.write_count


def _is_incremental(path) -> bool:
    """Whether the checkpoint readers see at ``path`` (maybe the previous one, moved aside) is incremental."""
    _, metadata = read_checkpoint(path)
    return "patches" in metadata["component"]["doc"]["parts"]["storage"]["doc"]


def _after_the_kill(tmp_path, path, committed: int) -> None:
    total = _check_loaded(path, tmp_path / "check")
    assert total in (committed, committed + STEP), (total, committed)
    other = _buffer(tmp_path / "next")  # the next writer recovers, cleans up and writes
    other.extend(_rows(0, 50))
    other.dumps(path)
    assert _check_loaded(path, tmp_path / "check2") == 50
    parent, name = os.path.split(path)
    assert sorted(e for e in os.listdir(parent) if e.startswith(name + ".")) == []


# a step of the third incremental dump (the first two complete): (step, nth occurrence in the loop)
_STEPS = [("tmp_created", 3), ("tensor_written", 7), ("metadata_written", 3), ("marker_written", 3),
          ("before_switch", 3), ("after_parent_sync", 3), ("after_cleanup", 3)]  # fmt: skip
STEP_CASES = [(s, n, "exchange") for s, n in _STEPS + [("after_exchange", 3)]]
STEP_CASES += [(s, n, "two-renames") for s, n in _STEPS + [("after_aside", 3), ("after_rename", 3)]]


@pytest.mark.parametrize("step, nth, mode", STEP_CASES, ids=lambda v: str(v))
def test_kill_at_each_step_of_an_incremental_dump_leaves_a_loadable_checkpoint(tmp_path, step, nth, mode):
    path = str(tmp_path / "ckpt")
    done = _CTX.Value("q", 0, lock=False)  # one writer; a lock held by a SIGKILLed child would block the reads
    child = _CTX.Process(target=_writer_loop, args=(path, str(tmp_path / "live"), done, (step, nth), mode == "exchange", 0))
    child.start()
    child.join(60)
    assert not child.is_alive() and child.exitcode == -signal.SIGKILL, child.exitcode
    assert _is_incremental(path) or done.value == 300
    _after_the_kill(tmp_path, path, done.value)


@pytest.mark.parametrize("trial", range(20))
def test_kill_at_a_random_time_during_incremental_dumps_leaves_the_old_or_the_new_checkpoint(tmp_path, trial):
    rng = random.Random(trial)
    path = str(tmp_path / "ckpt")
    done = _CTX.Value("q", 0, lock=False)  # one writer; a lock held by a SIGKILLed child would block the reads
    child = _CTX.Process(target=_writer_loop, args=(path, str(tmp_path / "live"), done, None, trial % 2 == 0, trial))
    child.start()
    deadline = time.monotonic() + 30
    while done.value < 300 + STEP * (1 + trial % 3) and time.monotonic() < deadline:  # a few incremental dumps
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.05))
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    _after_the_kill(tmp_path, path, done.value)
