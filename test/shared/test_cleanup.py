"""Nothing left behind: scratch directories on SIGTERM, forked children, DataLoader rings, stale directories.

Each scenario runs in a real child process (``python -c``) so that signals, exit paths and leftovers are those
of a user's process, not of the test runner.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from torchrl.data import LazyMemmapStorage, cleanup_stale_scratch_dirs
from torchrl.data.replay_buffers._shared import cleanup as _cleanup

TIMEOUT = 40
RING_GLOB = "/dev/shm/torchrl-batch-ring-*"  # where the worker transport used to leave its ring files


def start(script: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=None if env is None else {**os.environ, **env},
    )


def read_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"the child printed nothing; stderr:\n{proc.stderr.read()}")
    return line.strip()


def finish(proc: subprocess.Popen, input: str | None = None) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(input, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


OWNER = """
import os, signal, sys, time
import torch
{before}
from torchrl.data import LazyMemmapStorage
storage = LazyMemmapStorage(100)
storage.set(torch.arange(10), torch.ones(10, 4))
print(storage.memmap_dir, flush=True)
sys.stdin.readline()  # until the test says so (or kills us)
print("still there:", os.path.isdir(storage.memmap_dir), flush=True)
"""


# -- SIGTERM --------------------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_sigterm_removes_the_scratch_dir_and_the_process_still_dies_of_sigterm():
    proc = start(OWNER.format(before=""))
    path = read_line(proc)
    assert os.path.isdir(path) and os.path.basename(path).startswith(f"torchrl-memmap-{proc.pid}-")
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == -signal.SIGTERM, err
    assert not os.path.exists(path)


PREVIOUS_HANDLERS = {  # what the handler does after printing "handled"
    "redeliver": "signal.signal(s, signal.SIG_DFL); os.kill(os.getpid(), s)",  # dies of SIGTERM: no atexit
    "os_exit": "os._exit(7)",  # leaves at once: no atexit
    "sys_exit": "sys.exit(5)",  # SystemExit: atexit runs too
}


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,expected_code",
                         [("redeliver", -signal.SIGTERM), ("os_exit", 7), ("sys_exit", 5)])
def test_sigterm_chains_to_the_handler_installed_before(kind, expected_code):
    handler = f"def handler(s, f):\n    print('handled', flush=True)\n    {PREVIOUS_HANDLERS[kind]}\n"
    proc = start(OWNER.format(before=handler + "signal.signal(signal.SIGTERM, handler)"))
    path = read_line(proc)
    assert os.path.isdir(path)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == expected_code, err
    assert out.strip() == "handled"  # the previous handler ran
    assert not os.path.exists(path)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_an_ignored_sigterm_keeps_the_process_and_its_files_until_exit():
    proc = start(OWNER.format(before="signal.signal(signal.SIGTERM, signal.SIG_IGN)"))
    path = read_line(proc)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, input="check\n")
    assert code == 0, err  # still alive after SIGTERM ...
    assert out.strip() == "still there: True"  # ... with its files ...
    assert not os.path.exists(path)  # ... and its normal exit removed the directory


# -- forked children and multiprocessing children -------------------------------------------------------------
FORKED_CHILD = """
import gc, multiprocessing, os, signal, sys, time
import torch
from torchrl.data import LazyMemmapStorage
storage = LazyMemmapStorage(100)
storage.set(torch.arange(10), torch.ones(10, 4))
path = storage.memmap_dir
how = sys.argv[1]
if how == "multiprocessing":
    def child(storage):
        del storage
        gc.collect()
    proc = multiprocessing.get_context("fork").Process(target=child, args=(storage,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0, proc.exitcode
else:
    pid = os.fork()
    if pid == 0:  # the child: drop its copy, then leave the way the test asks
        del storage
        gc.collect()
        if how == "exit":
            sys.exit(0)  # atexit hooks (inherited from the parent) run here
        time.sleep(30)
        os._exit(3)
    if how == "sigterm":
        time.sleep(0.3)
        os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    expected = signal.SIGTERM if how == "sigterm" else None
    assert (os.WTERMSIG(status) if os.WIFSIGNALED(status) else None) == expected, status
print(path, os.path.isdir(path), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["exit", "sigterm", "multiprocessing"])
def test_a_forked_child_never_removes_the_parents_dir(how):
    proc = subprocess.run([sys.executable, "-c", FORKED_CHILD, how], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    path, exists = proc.stdout.split()
    assert exists == "True"  # still there after the child ended
    assert not os.path.exists(path)  # and removed when the owner exited


BLOCKED_CHILD = """
import ctypes, os, signal, sys, time
import torch
from torchrl.data import LazyMemmapStorage
storage = LazyMemmapStorage(100)
storage.set(torch.arange(10), torch.ones(10, 4))
pid = os.fork()
if pid == 0:  # blocked in C code: a normal mutex locked twice waits for itself, and signals do not end the wait
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
    os._exit(3)
time.sleep(0.5)
os.kill(pid, signal.SIGTERM)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print(os.waitstatus_to_exitcode(status), os.path.isdir(storage.memmap_dir), flush=True)
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("survived", os.path.isdir(storage.memmap_dir), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_forked_child_blocked_in_c_code_dies_of_sigterm():
    # The parent owns a scratch dir (its SIGTERM handler is installed); the child owns nothing, so it has the
    # default action back: a Python handler could not run while the child is blocked in C code.
    proc = subprocess.run([sys.executable, "-c", BLOCKED_CHILD], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(-signal.SIGTERM), "True"], proc.stdout  # and the parent's dir stays


HANDLER_LIFETIME = """
import os, signal, tempfile
from torchrl.data.replay_buffers._shared import cleanup as _cleanup
def mine(s, f):
    pass
def current():
    handler = signal.getsignal(signal.SIGTERM)
    return {signal.SIG_DFL: "default", _cleanup._on_sigterm: "cleanup", mine: "mine"}.get(handler, repr(handler))
seen = [current()]
a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
_cleanup.register_owned_path(a)
_cleanup.register_owned_path(b)
seen.append(current())
_cleanup.remove_owned_path(a)
seen.append(current())  # b is still owned
_cleanup.unregister_owned_path(b)
seen.append(current())  # nothing owned: the default is back
signal.signal(signal.SIGTERM, mine)
_cleanup.register_owned_path(a)
seen.append(current())
_cleanup.remove_owned_paths()
seen.append(current())  # the handler it replaced
os.rmdir(b)
print(" ".join(seen))
"""


def test_the_sigterm_handler_is_installed_only_while_this_process_owns_paths():
    proc = subprocess.run([sys.executable, "-c", HANDLER_LIFETIME], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["default", "cleanup", "cleanup", "default", "cleanup", "mine"]


MP_CHILD_OWNER = """
import multiprocessing, os
import torch
from torchrl.data import LazyMemmapStorage
KEEP = []
def child(queue):
    storage = LazyMemmapStorage(100)
    storage.set(torch.arange(10), torch.ones(10, 4))
    KEEP.append(storage)  # alive until the child exits (never garbage collected)
    queue.put(storage.memmap_dir)
if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    path = queue.get(timeout=30)
    proc.join(30)
    print(path, proc.exitcode, flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_multiprocessing_child_removes_its_own_dir_when_it_returns():
    # fork children leave through os._exit: atexit (and weakref.finalize) never run there
    proc = subprocess.run([sys.executable, "-c", MP_CHILD_OWNER], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    path, exitcode = proc.stdout.split()
    assert exitcode == "0" and os.path.basename(path).startswith("torchrl-memmap-")
    assert not os.path.exists(path)


REGISTRY = """
import os, signal, sys, tempfile, threading
from torchrl.data.replay_buffers._shared import cleanup as _cleanup
before = signal.getsignal(signal.SIGTERM)
paths = []
def register_many(k):
    for i in range(50):
        fd, p = tempfile.mkstemp(prefix=f"reg-{k}-{i}-", dir=sys.argv[1])
        os.close(fd)
        _cleanup.register_owned_path(p)
threads = [threading.Thread(target=register_many, args=(k,)) for k in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
assert signal.getsignal(signal.SIGTERM) is before, "installed from a thread that is not the main thread"
keep = os.path.join(sys.argv[1], "kept")
open(keep, "w").close()
_cleanup.register_owned_path(keep)
assert signal.getsignal(signal.SIGTERM) is _cleanup._on_sigterm  # the first registration from the main thread
_cleanup.unregister_owned_path(keep)
assert not _cleanup.remove_owned_path(keep) and os.path.exists(keep)
d = os.path.join(sys.argv[1], "a-dir")
os.makedirs(os.path.join(d, "nested"))
_cleanup.register_owned_path(d)
pid = os.fork()
if pid == 0:
    ok = not _cleanup.remove_owned_path(d) and _cleanup.remove_owned_paths() == [] and os.path.isdir(d)
    os._exit(0 if ok else 1)
assert os.waitpid(pid, 0)[1] == 0, "a forked child removed its parent's path"
removed = _cleanup.remove_owned_paths()
assert len(removed) == 201 and not any(os.path.exists(p) for p in removed), len(removed)
print(sorted(os.listdir(sys.argv[1])))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_registry_is_thread_safe_fork_safe_and_installs_the_handler_from_the_main_thread_only(tmp_path):
    proc = subprocess.run([sys.executable, "-c", REGISTRY, str(tmp_path)], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['kept']"


def test_register_owned_path_names_the_argument():
    with pytest.raises(TypeError, match="`path` must be a str or os.PathLike, got int"):
        _cleanup.register_owned_path(3)


# -- DataLoader worker rings ----------------------------------------------------------------------------------
LOADER = """
import os, signal, sys, time
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torchrl.data import LazyTensorStorage, ReplayBuffer, tensordict_collate

def has_ring(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "torchrl-batch-ring" in f.read()
    except OSError:
        return False

method, when = sys.argv[1], sys.argv[2]
rb = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=32)
rb.extend(TensorDict(x=torch.arange(256.0), y=torch.zeros(256, 64), batch_size=[256]))
loader = DataLoader(rb.as_dataset(num_batches=8 if when == "normal_end" else None), batch_size=None,
                    num_workers=2, collate_fn=tensordict_collate, multiprocessing_context=method, timeout=30)
it = iter(loader)
pids = [w.pid for w in it._workers]
if when != "before_first_batch":
    for _ in range(3):
        next(it)
deadline = time.monotonic() + 30
while not all(has_ring(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.05)  # each worker has written a batch into its ring (before_first_batch: none read yet)
print("rings", sum(has_ring(pid) for pid in pids), *pids, flush=True)
if when == "normal_end":
    assert len(list(it)) == 5
    del it  # the workers exit
    sys.exit(0)
if when == "main_sigterm":
    sys.stdin.readline()  # until the test sends SIGTERM
for pid in pids:
    os.kill(pid, signal.SIGKILL)
try:  # torch's SIGCHLD handler raises in this thread once it sees the killed workers
    time.sleep(1)
except RuntimeError:
    pass
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "method,when",
    [("fork", "before_first_batch"), pytest.param("spawn", "before_first_batch", marks=pytest.mark.slow),
     ("fork", "mid_epoch"), pytest.param("spawn", "mid_epoch", marks=pytest.mark.slow),
     ("fork", "normal_end"), ("fork", "main_sigterm")],
)
def test_dataloader_workers_leave_no_ring_file(method, when):
    before = set(glob.glob(RING_GLOB))
    proc = start(LOADER, method, when)
    fields = read_line(proc).split()
    assert fields[:2] == ["rings", "2"], fields  # both workers did send batches through their ring
    if when == "main_sigterm":  # the workers outlive the main process for a few seconds: check at once
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == -signal.SIGTERM
        assert set(glob.glob(RING_GLOB)) <= before
        for pid in map(int, fields[2:]):  # the orphaned workers would exit within 5 s: end them now
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _, _, err = finish(proc)
    assert set(glob.glob(RING_GLOB)) <= before, err


# -- stale scratch directories ---------------------------------------------------------------------------------
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def fake_scratch_dir(root, pid: int, marker: dict | None = None, suffix: str = "abc123") -> str:
    path = os.path.join(root, f"torchrl-memmap-{pid}-{suffix}")
    os.mkdir(path)
    if marker is not False:  # a real marker (inodes, write time), with the entries of `marker` forged
        fields = dict(marker or {})
        _cleanup._write_marker(path, fields.pop("pid", pid), **fields)
    return path


def test_stale_dirs_of_dead_processes_are_removed_and_nothing_else(tmp_path, monkeypatch):
    dead = dead_pid()
    stale = fake_scratch_dir(tmp_path, dead)
    live_other = fake_scratch_dir(tmp_path, os.getppid())  # a live process that is not this one
    no_marker = fake_scratch_dir(tmp_path, dead, marker=False, suffix="nomark")
    here = {**_cleanup.process_identity(), "pid": dead}
    wrong_pid = fake_scratch_dir(tmp_path, dead, marker={**here, "pid": dead + 1}, suffix="pid")
    other_host = fake_scratch_dir(tmp_path, dead, marker={**here, "host": "elsewhere"}, suffix="host")
    other_ns = fake_scratch_dir(tmp_path, dead, marker={**here, "pid_ns": "pid:[1]"}, suffix="ns")
    os.symlink(stale, tmp_path / f"torchrl-memmap-{dead}-link")  # a link is never followed
    (tmp_path / f"torchrl-memmap-{dead}-file").write_text("")  # not a directory
    other_name = tmp_path / f"my-memmap-{dead}-x"
    os.mkdir(other_name)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    mine = LazyMemmapStorage(10)
    mine.set(torch.arange(1), torch.ones(1))  # a scratch dir of this live process, with the real marker
    assert os.path.dirname(mine.memmap_dir) == str(tmp_path)

    listed = cleanup_stale_scratch_dirs(tmp_path, dry_run=True)
    assert listed == [stale] and os.path.isdir(stale)  # dry run: listed, not removed
    assert cleanup_stale_scratch_dirs() == [stale]  # root defaults to tempfile.gettempdir()
    assert not os.path.exists(stale)
    for kept in (live_other, no_marker, wrong_pid, other_host, other_ns, other_name, mine.memmap_dir):
        assert os.path.isdir(kept), kept
    assert cleanup_stale_scratch_dirs(tmp_path) == []


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_the_dir_of_an_owner_killed_with_sigkill_is_left_and_the_helper_removes_it(tmp_path):
    proc = start(OWNER.format(before=""), env={"TMPDIR": str(tmp_path)})
    path = read_line(proc)
    assert os.path.dirname(path) == str(tmp_path)
    proc.kill()  # SIGKILL: nothing can run
    code, _, _ = finish(proc)
    assert code == -signal.SIGKILL and os.path.isdir(path)
    assert cleanup_stale_scratch_dirs(tmp_path, dry_run=True) == [path] and os.path.isdir(path)
    assert cleanup_stale_scratch_dirs(tmp_path) == [path] and not os.path.exists(path)


def test_cleanup_stale_scratch_dirs_names_a_bad_root(tmp_path):
    with pytest.raises(NotADirectoryError, match="`root` must be an existing directory"):
        cleanup_stale_scratch_dirs(tmp_path / "missing")
