"""The cross-process write lock of a shared storage: :class:`ProcessLock`, and :data:`NULL_LOCK` for private ones.

NOTE [write lock and versions]: writers of a shared storage, in any number of processes, are serialized by
:class:`ProcessLock`, a ``flock`` on a small lock file. The kernel releases an ``flock`` when its holder dies,
SIGKILL included, so a killed writer cannot deadlock the others (a ``multiprocessing.Lock`` is a semaphore
that stays taken forever in that case). Readers do not take the lock; instead each row of a shared tensor
storage has a version in :class:`~torchrl.data.replay_buffers._shared.row_versions.RowVersions`, made odd while
the row is written and even again once it is complete. A reader reads the versions, gathers the rows, reads the
versions again and re-reads the rows whose version moved or was odd (a seqlock per row). The ordering this relies
on (the version store before the data stores, the data loads before the second version load) holds on x86-64's
total store order; on weakly ordered CPUs (ARM) the check is best effort.

NOTE [lock identity]: the identity of a lock is the lock file's *inode*, never its name. Every process that
attaches holds an open descriptor of that inode, and a copy of the lock sent to another process through
``multiprocessing`` (the arguments of a spawn/forkserver process, a DataLoader worker, a ``Queue``) carries a
descriptor of it (``multiprocessing.reduction.DupFd``), which the receiver reopens as an open file description
of its own (``/proc/self/fd``: an ``flock`` belongs to an open file description, so a shared one would not
exclude). A forked child reopens its inherited descriptor the same way. The name in ``/dev/shm`` is only needed
by a copy made by value (``pickle``) while no descriptor of the lock lives in the receiving process; such a copy
checks that the file it opens is the same inode. So the creator may exit, be SIGTERMed or drop the lock (its
name is then removed) while writers live: they still hold one lock. A process never creates a new lock in
place of a missing one (that would split the writers into groups that do not exclude each other); it raises.
Lock files left behind by creators killed with SIGKILL are removed by :func:`cleanup_stale_lock_files`, which
the first lock made by each process also runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing.reduction
import os
import re
import stat
import tempfile
import threading
import time
import weakref

from torchrl.data.replay_buffers._shared.cleanup import (
    pid_is_gone,
    process_identity,
    register_owned_path,
    remove_owned_path,
)

__all__ = ["NULL_LOCK", "ProcessLock", "cleanup_stale_lock_files"]


class _NullLock(contextlib.nullcontext):
    """The write lock of a storage that no other process writes: a no-op context manager.

    A :class:`contextlib.nullcontext` (its ``with`` returns the lock itself), so a reader following a write does
    not open this file for a lock that does nothing. One instance, :data:`NULL_LOCK`, which copies (pickle,
    ``deepcopy``) resolve to.
    """

    def __init__(self) -> None:
        super().__init__(self)

    def acquire(self, blocking: bool = True) -> bool:
        return True

    def release(self) -> None:
        return None

    def __reduce__(self):
        return "NULL_LOCK"

    def __repr__(self) -> str:
        return "NULL_LOCK"


NULL_LOCK = _NullLock()

LOCK_PREFIX = "torchrl-lock"
_NAME = re.compile(rf"^{re.escape(LOCK_PREFIX)}-(\d{{1,10}})-[A-Za-z0-9_]+$")
_MAX_MARKER = 512
_LIVE_LOCKS: weakref.WeakSet = weakref.WeakSet()
_SPINS = 50  # non-blocking tries (yielding the core in between) before a writer sleeps on the lock
_swept_in_pid: int | None = None  # the process whose first lock swept the stale lock files
_get_ident = threading.get_ident
_getpid = os.getpid
_monotonic = time.monotonic
_file_lock = fcntl.flock
_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB


def _lock_dir() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _reopen(fd: int) -> int | None:
    """A new open file description of the file behind ``fd`` (the file may be unlinked), or ``None``."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
    except OSError:
        return None


class ProcessLock:
    """A re-entrant lock that excludes the other threads of this process and every other process.

    A ``threading.Lock`` orders the threads of one process; an exclusive ``flock`` on a lock file orders the
    processes. The file is created in ``/dev/shm`` (or the temporary directory) by the process that builds the
    lock; its inode is the lock's identity (NOTE [lock identity] above): a copy sent through
    ``multiprocessing`` (fork, spawn, forkserver, ``torch.multiprocessing``, DataLoader workers, queues) carries
    a descriptor of it, so the lock stays one lock when its creator exits or drops it while other processes
    still write. The file's name is removed by its creator when the lock is garbage collected, at exit and on
    SIGTERM (:mod:`~torchrl.data.replay_buffers._shared.cleanup`); a creator killed by SIGKILL leaves it, for
    :func:`cleanup_stale_lock_files`.

    The kernel drops an ``flock`` when the process that holds it dies, SIGKILL included: a killed holder never
    deadlocks the others.

    Examples:
        >>> lock = ProcessLock()
        >>> with lock:
        ...     with lock:  # re-entrant
        ...         lock.held
        True
        >>> lock.held
        False
    """

    def __init__(self) -> None:
        _sweep_once()
        fd = self._create()
        self._key = _identity(fd)
        self._creator = os.getpid()
        self._attach_error: str | None = None
        self._reset(fd)

    def _create(self) -> int:
        """Creates the lock file, removed when the lock is dropped, at exit and on SIGTERM."""
        fd, self.path = tempfile.mkstemp(prefix=f"{LOCK_PREFIX}-{os.getpid()}-", dir=_lock_dir())
        try:  # who made it, for cleanup_stale_lock_files (the content plays no part in the locking)
            os.write(fd, json.dumps({"pid": os.getpid(), **process_identity()}).encode())
        except OSError:
            pass
        register_owned_path(self.path)
        weakref.finalize(self, remove_owned_path, self.path)
        return fd

    def _reset(self, fd: int | None) -> None:
        self._pid = os.getpid()
        self._fd = fd
        self._thread_lock = threading.Lock()
        self._owner: int | None = None  # the thread holding the lock
        self._depth = 0
        _LIVE_LOCKS.add(self)

    # -- attaching: the same inode, never a new lock ---------------------------------------------------------------
    def _adopt(self, fd: int | None, how: str) -> None:
        """Takes ``fd`` (a descriptor this object owns) if it is the lock's inode, else records why not."""
        if fd is not None:
            try:
                same = _identity(fd) == self._key
            except OSError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)
            how = f"{how}: the file there is another file than the lock's"
        self._attach_error = how

    def _attach_by_name(self) -> None:
        """Opens the lock's inode in a process that received a copy by value (through a descriptor of a live
        lock of this process first, then by the file's name), or records why it cannot."""
        for other in list(_LIVE_LOCKS):
            if (
                other is not self
                and other._fd is not None
                and other._pid == os.getpid()
                and other._key == self._key
            ):
                fd = _reopen(other._fd)
                if fd is not None:
                    self._adopt(fd, "")
                    return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as err:
            self._attach_error = f"its file {self.path!r} cannot be opened ({err.strerror})"
            return
        self._adopt(fd, f"its file {self.path!r} was replaced")

    def _open(self) -> int:
        fd = self._fd
        if fd is None:
            if self._attach_error is None:
                self._attach_by_name()
            if self._fd is None:
                raise RuntimeError(
                    f"This process (pid {os.getpid()}) cannot attach to the write lock of a shared buffer made by "
                    f"process {self._creator}: {self._attach_error}. A lock is never re-created in place of a lost "
                    f"one (the writers would no longer exclude each other). Send shared buffers to other processes "
                    f"through multiprocessing (Process arguments, DataLoader workers, a Queue), which carries the "
                    f"lock itself, not a pickle or a copy made after the creating process dropped the buffer."
                )
            fd = self._fd
        return fd

    def _after_fork_in_child(self) -> None:
        inherited = self._fd
        fd = None
        if inherited is not None:
            fd = _reopen(inherited)  # a new open file description of the same file, even if it was unlinked
            os.close(inherited)
        self._reset(None)
        if fd is not None:
            self._adopt(fd, "")
        elif inherited is not None:
            self._attach_error = "its inherited descriptor cannot be reopened (is /proc mounted?)"

    @property
    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident() and self._pid == os.getpid()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock (re-entrant); as ``threading.Lock.acquire``: with ``blocking=False`` a single try, with
        ``timeout >= 0`` (seconds) at most that long, both returning ``False`` when the lock stayed taken."""
        me = _get_ident()
        if self._owner == me:  # re-entry: the common case inside a write, kept to a compare and an add
            self._depth += 1
            return True
        if self._pid != _getpid():  # copied by fork without the at-fork hook (should not happen)
            self._after_fork_in_child()
        if timeout is None:
            timeout = -1
        deadline = None if timeout < 0 else _monotonic() + timeout
        if not self._thread_lock.acquire(blocking, timeout):
            return False
        try:
            fd = self._fd
            if fd is not None:  # the common case first: the file lock is free at once
                try:
                    _file_lock(fd, _EX_NB)
                except BlockingIOError:
                    fd = None
            if fd is None and not self._flock(blocking, deadline):
                self._thread_lock.release()
                return False
        except BaseException:
            self._thread_lock.release()
            raise
        self._owner = me
        self._depth = 1
        return True

    def _flock(self, blocking: bool, deadline: float | None = None) -> bool:
        fd = self._open()
        # a holder keeps the lock for a write (tens of microseconds): a few non-blocking tries that yield the
        # core in between hand the lock over faster than sleeping in the kernel and being woken up
        for _ in range(_SPINS if blocking else 1):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                os.sched_yield()
        if not blocking:
            return False
        if deadline is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return True
        # a blocking flock cannot be given a deadline: poll, sleeping 0.5 ms doubling to 5 ms in between
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            remaining = deadline - _monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, 0.005)

    def release(self) -> None:
        if self._owner != _get_ident():
            raise RuntimeError("ProcessLock.release() called by a thread that does not hold the lock.")
        depth = self._depth - 1
        self._depth = depth
        if depth == 0:
            self._owner = None
            _file_lock(self._fd, fcntl.LOCK_UN)
            self._thread_lock.release()

    def __enter__(self) -> ProcessLock:
        if self._owner == _get_ident():
            self._depth += 1
        else:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self._depth > 1 and self._owner == _get_ident():
            self._depth -= 1
        else:
            self.release()

    # -- copies ----------------------------------------------------------------------------------------------------
    def __getstate__(self):
        """A copy by value (``pickle``, ``copy.deepcopy``): the name and the inode the copy must find there."""
        return {"path": self.path, "key": list(self._key), "creator": self._creator}

    def __setstate__(self, state) -> None:
        self.path = state["path"]
        key = state.get("key")
        self._key = None if key is None else tuple(key)
        self._creator = state.get("creator")
        self._attach_error = None
        self._reset(None)
        if self._key is None:  # a state without an identity cannot be checked: never attached to
            self._attach_error = "the copy carries no identity of the lock's file"
        else:
            self._attach_by_name()  # now, while the file is most likely still there

    def _reduce_for_multiprocessing(self):
        """What ``multiprocessing`` pickles: the state plus a descriptor of the lock's inode (NOTE [lock
        identity]), so that the receiver needs neither the file's name nor its creator."""
        fd = self._fd if self._pid == os.getpid() else None
        handle = None if fd is None else multiprocessing.reduction.DupFd(fd)
        return _rebuild_lock, (self.__getstate__(), handle)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and getattr(self, "_pid", None) == os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r}, held={self.held})"


def _rebuild_lock(state: dict, handle) -> ProcessLock:
    """Rebuilds a lock sent through ``multiprocessing``: reopens the descriptor it carries as this process's own."""
    lock = ProcessLock.__new__(ProcessLock)
    lock.path = state["path"]
    lock._key = tuple(state["key"])
    lock._creator = state["creator"]
    lock._attach_error = None
    lock._reset(None)
    received = None
    if handle is not None:
        try:
            received = handle.detach()
        except (OSError, EOFError):  # the sender exited before this process received the descriptor (a Queue)
            received = None
    if received is None:
        lock._attach_by_name()
        return lock
    # the received descriptor shares the sender's open file description: never flock it, reopen it
    fd = _reopen(received)
    os.close(received)
    if fd is None:
        lock._attach_by_name()
    else:
        lock._adopt(fd, "the descriptor it received is another file than the lock's")
    return lock


multiprocessing.reduction.ForkingPickler.register(ProcessLock, ProcessLock._reduce_for_multiprocessing)


def _reset_locks_after_fork() -> None:
    for lock in list(_LIVE_LOCKS):
        lock._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_locks_after_fork)


# -- lock files left by creators killed with SIGKILL -----------------------------------------------------------------
def _creator_is_dead(pid: int, marker: dict | None, here: dict) -> bool:
    """Whether the process that made a lock file is certainly gone (``False`` when unsure)."""
    if pid == os.getpid() or pid <= 0:
        return False
    if marker is not None:
        if marker.get("pid") != pid:
            return False
        if marker.get("boot_id") and here["boot_id"] and marker["boot_id"] != here["boot_id"]:
            return True  # made before this machine rebooted
        if marker.get("pid_ns") != here["pid_ns"]:
            return False  # another pid namespace: its pids mean nothing here
    return pid_is_gone(pid)


def _read_marker(fd: int) -> dict | None:
    try:
        marker = json.loads(os.pread(fd, _MAX_MARKER, 0) or b"null")
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _open_inodes() -> set[tuple[int, int]] | None:
    """The ``(device, inode)`` of every file held open by a process this one can inspect (``None``: unknown)."""
    found: set[tuple[int, int]] = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone meanwhile, or another user's
            continue
        for fd in fds:
            try:
                info = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            found.add((info.st_dev, info.st_ino))
    return found


def cleanup_stale_lock_files(root=None, *, dry_run: bool = False) -> list[str]:
    """Removes the lock files left behind by processes killed with SIGKILL (or crashed).

    A shared buffer's write lock (:class:`ProcessLock`) keeps a small file ``torchrl-lock-<pid>-<random>`` in
    ``/dev/shm`` (or the temporary directory), removed by its creator when the lock is dropped, at exit and on
    SIGTERM. Nothing runs on SIGKILL: then it stays. This removes such files under ``root``: only those with that
    name, regular files owned by the current user, whose creator is certainly dead (gone, or made before the
    last reboot; never one of another pid namespace) and that no process holds (locked now, or open in a
    process this one can inspect). The first :class:`ProcessLock` made by each process runs it.

    Args:
        root (str or path-like, optional): the directory to scan (not recursively). Defaults to ``/dev/shm``
            when writable, else :func:`tempfile.gettempdir`.

    Keyword Args:
        dry_run (bool): list the files that would be removed, remove nothing. Defaults to ``False``.

    Returns:
        The paths removed (or, with ``dry_run=True``, that would be removed), sorted.

    Examples:
        >>> import tempfile
        >>> from torchrl.data.replay_buffers._shared.lock import cleanup_stale_lock_files
        >>> with tempfile.TemporaryDirectory() as root:
        ...     print(cleanup_stale_lock_files(root))
        []
    """
    if not isinstance(dry_run, bool):
        raise TypeError(f"`dry_run` must be a bool; got {dry_run!r}.")
    root = _lock_dir() if root is None else os.fspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(
            f"`root` must be an existing directory, got {root!r}; pass None for the default ({_lock_dir()!r})."
        )
    here, uid, candidates = process_identity(), os.getuid(), []
    for name in sorted(os.listdir(root)):
        match = _NAME.match(name)
        if match is None:
            continue
        path = os.path.join(root, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                continue
            if not _creator_is_dead(int(match.group(1)), _read_marker(fd), here):
                continue
            try:  # held by a writer now
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                continue
            candidates.append((path, (info.st_dev, info.st_ino)))
        finally:
            os.close(fd)
    if not candidates:
        return []
    in_use = _open_inodes()
    if in_use is None:
        return []
    removed = []
    for path, key in candidates:
        if key in in_use:  # a process still holds the lock (its creator died, its writers live on)
            continue
        if not dry_run:
            try:
                os.unlink(path)
            except OSError:
                continue
        removed.append(path)
    return removed


def _sweep_once() -> None:
    """Runs :func:`cleanup_stale_lock_files` at the first lock made by this process (best effort)."""
    global _swept_in_pid
    pid = os.getpid()
    if _swept_in_pid == pid:
        return
    _swept_in_pid = pid
    try:
        cleanup_stale_lock_files()
    except OSError:
        pass
