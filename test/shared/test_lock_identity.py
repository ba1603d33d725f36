"""The write lock of a shared buffer stays one lock when the process that made it goes away (NOTE [lock identity]
in ``_shared/lock.py``), and the lock files of processes killed with SIGKILL are cleaned up.

The writer scenarios run ``lock_identity_scenario.py`` as a script: its main process builds a shared buffer,
starts writer processes, then joins them, returns (multiprocessing joins them at exit), is SIGTERMed, or drops
its buffer. Every row is tagged (writer id, sequence number, CRC32 of its payload): the first writer, once all
are done, counts the rows missing, duplicated and torn.
"""

from __future__ import annotations

import gc
import json
import multiprocessing.reduction
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest

import torchrl.data.replay_buffers._shared.lock as lock_module
from torchrl.data.replay_buffers._shared.lock import ProcessLock, cleanup_stale_lock_files

pytestmark = pytest.mark.multiprocess

SCRIPT = os.path.join(os.path.dirname(__file__), "lock_identity_scenario.py")
ROWS = 2000


def _kill_group(proc: subprocess.Popen) -> None:
    """Kills what is left of the process group the scenario started (its writers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_scenario(
    method: str, n_writers: int, scenario: str, out, timeout: float = 240.0
) -> tuple[int, dict, dict]:
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, method, str(n_writers), str(ROWS), scenario, str(out)],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + timeout
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the main process of {scenario!r} did not end within {timeout} s: a deadlock?")
        result_path = out / "result.json"
        while (
            not result_path.exists() and time.monotonic() < deadline
        ):  # writer 0 may outlive the main process
            time.sleep(0.1)
        assert result_path.exists(), f"no result from writer 0:\n{output.decode()[-3000:]}"
        with open(result_path) as f:
            result = json.load(f)
        with open(out / "parent.json") as f:
            parent = json.load(f)
        return proc.returncode, parent, result
    finally:
        _kill_group(proc)


def _check_no_row_lost(method: str, n_writers: int, scenario: str, tmp_path) -> None:
    rc, parent, result = _run_scenario(method, n_writers, scenario, tmp_path)
    assert rc == (-signal.SIGTERM if scenario == "sigterm" else 0), result
    if scenario == "del":
        assert not parent["lock_file_existed"], "the scenario must drop the creator's lock while writers live"
    total = 2 + n_writers * ROWS
    assert result["writers_done"] == n_writers, result
    assert result["lock_inodes"] == 1, f"the writers held {result['lock_inodes']} different locks"
    assert (result["missing"], result["duplicated"], result["torn"]) == (0, 0, 0), result
    assert result["len"] == result["stored"] == total, result


# Every start method meets every way the creator goes away once, with 2 or 4 writers in turn (12 runs of about
# 15 s of CPU each: three torch imports); the three fast ones run with every test run, the rest with -m slow.
GRID = [
    (method, 2 + 2 * ((i + j) % 2), scenario)
    for i, method in enumerate(("spawn", "forkserver", "fork"))
    for j, scenario in enumerate(("join", "exit", "sigterm", "del"))
]
FAST = [("spawn", 4, "exit"), ("forkserver", 4, "sigterm"), ("forkserver", 2, "del")]
assert set(FAST) <= set(GRID)
SLOW = [case for case in GRID if case not in FAST]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method,n_writers,scenario", FAST)
def test_writers_lose_no_row_when_the_creator_goes_away_first(method, n_writers, scenario, tmp_path):
    _check_no_row_lost(method, n_writers, scenario, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method,n_writers,scenario", SLOW)
def test_writers_lose_no_row_when_the_creator_goes_away_first_full_grid(
    method, n_writers, scenario, tmp_path
):
    _check_no_row_lost(method, n_writers, scenario, tmp_path)


# -- copies of the lock --------------------------------------------------------------------------------------------
def _taken_elsewhere(lock: ProcessLock) -> bool:
    """Whether another thread finds ``lock`` taken (a non-blocking try from that thread)."""
    found = []
    thread = threading.Thread(target=lambda: found.append(not _try(lock)))
    thread.start()
    thread.join(10)
    return found == [True]


def _try(lock: ProcessLock) -> bool:
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def _my_lock_files() -> set[str]:
    root = lock_module._lock_dir()
    prefix = f"{lock_module.LOCK_PREFIX}-{os.getpid()}-"
    return {name for name in os.listdir(root) if name.startswith(prefix)}


def test_a_copy_sent_through_multiprocessing_needs_neither_the_file_name_nor_the_creator():
    lock = ProcessLock()
    payload = multiprocessing.reduction.ForkingPickler.dumps(lock)  # carries a descriptor of the lock's file
    path = lock.path
    del lock
    gc.collect()
    assert not os.path.exists(path)  # the creator dropped its lock: the name is gone
    before = _my_lock_files()
    copy = pickle.loads(payload)
    with copy:
        assert copy.held
        twin = pickle.loads(pickle.dumps(copy))  # a copy by value, resolved through this process's descriptor
        assert _taken_elsewhere(twin), "a copy of the lock must exclude the holder"
    assert _try(twin)
    assert _my_lock_files() == before, "no new lock may be created in place of the lost file"


def test_a_copy_by_value_of_a_lost_lock_raises_instead_of_creating_a_new_lock():
    lock = ProcessLock()
    payload = pickle.dumps(lock)
    del lock
    gc.collect()
    before = _my_lock_files()
    copy = pickle.loads(payload)
    with pytest.raises(RuntimeError, match=r"cannot attach to the write lock.*never re-created"):
        copy.acquire()
    assert _my_lock_files() == before
    assert not copy.held


def test_a_copy_by_value_refuses_another_file_at_the_lock_s_name():
    lock = ProcessLock()
    payload, path = pickle.dumps(lock), lock.path
    del lock
    gc.collect()
    with open(path, "w"):  # someone makes another file under that name
        pass
    try:
        copy = pickle.loads(payload)
        with pytest.raises(RuntimeError, match="another file than the lock's"):
            copy.acquire()
    finally:
        os.unlink(path)


def test_a_forked_child_keeps_the_lock_after_the_name_is_removed():
    lock = ProcessLock()
    os.unlink(lock.path)  # as the creator's cleanup would
    read_end, write_end = os.pipe()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: the lock is held by its parent, so a non-blocking try must fail
            try:
                os.write(write_end, b"1" if not lock.acquire(blocking=False) else b"0")
            finally:
                os._exit(0)
        os.close(write_end)
        answer = os.read(read_end, 1)
        os.waitpid(pid, 0)
    os.close(read_end)
    assert answer == b"1"


# -- lock files of creators killed with SIGKILL ----------------------------------------------------------------
def _lock_made_by_a_killed_process(root) -> str:
    """The lock file left in ``root`` by a process that made a lock there and was killed with SIGKILL."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "import torchrl.data.replay_buffers._shared.lock as m\n"
            "m._lock_dir = lambda: sys.argv[1]  # a directory of this test's own: no other sweep sees it\n"
            "lock = m.ProcessLock()\nprint(lock.path, flush=True)\ntime.sleep(120)\n",
            str(root),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        path = child.stdout.readline().strip()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert path and os.path.exists(path), "the killed creator leaves its lock file"
    return path


@pytest.mark.timeout(120)
def test_lock_files_of_sigkilled_creators_are_removed_unless_held(monkeypatch, tmp_path):
    stale = _lock_made_by_a_killed_process(tmp_path)
    monkeypatch.setattr(lock_module, "_lock_dir", lambda: str(tmp_path))
    monkeypatch.setattr(lock_module, "_swept_in_pid", os.getpid())  # no sweep yet
    live = ProcessLock()  # this process's own lock: never touched
    held = os.open(stale, os.O_RDONLY)  # a process still holds the dead creator's lock file open
    try:
        assert cleanup_stale_lock_files(dry_run=True) == []
    finally:
        os.close(held)
    assert cleanup_stale_lock_files(dry_run=True) == [stale]
    assert os.path.exists(stale)  # a dry run removes nothing
    monkeypatch.setattr(lock_module, "_swept_in_pid", None)
    ProcessLock()  # the first lock of a process sweeps
    assert not os.path.exists(stale)
    assert os.path.exists(live.path)


def test_cleanup_of_lock_files_ignores_names_it_did_not_make(tmp_path):
    for name in (
        "torchrl-lock-99999999999999-abc",
        "torchrl-lock-4294967299-abc",
        "torchrl-lock-x-abc",
        "other",
    ):
        (tmp_path / name).write_text("")
    os.symlink(tmp_path / "other", tmp_path / "torchrl-lock-1-link")
    assert cleanup_stale_lock_files(tmp_path) == []
    assert len(os.listdir(tmp_path)) == 5
    with pytest.raises(NotADirectoryError, match="`root`"):
        cleanup_stale_lock_files(tmp_path / "other")
    with pytest.raises(TypeError, match="`dry_run`"):
        cleanup_stale_lock_files(tmp_path, dry_run="yes")
