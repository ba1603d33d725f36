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
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import weakref

from torchrl.data.replay_buffers._shared.cleanup import register_owned_path, remove_owned_path


class _NullLock:
    """The write lock of a storage that no other process writes: a no-op context manager."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def acquire(self, blocking: bool = True) -> bool:
        return True

    def release(self) -> None:
        return None

    def __repr__(self) -> str:
        return "NULL_LOCK"


NULL_LOCK = _NullLock()

_LIVE_LOCKS: weakref.WeakSet = weakref.WeakSet()
_SPINS = 50  # non-blocking tries (yielding the core in between) before a writer sleeps on the lock


def _lock_dir() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


class ProcessLock:
    """A re-entrant lock that excludes the other threads of this process and every other process.

    A ``threading.Lock`` orders the threads of one process; an exclusive ``flock`` on a lock file orders the
    processes. The file is created in ``/dev/shm`` (or the temporary directory) by the process that builds
    the lock. Each process opens the file on its own (a forked child reopens it, since a descriptor
    inherited through fork would share the parent's lock), so the lock works across fork, spawn, forkserver
    and ``torch.multiprocessing``. Pickling sends the path of the file. The file is removed by its creator
    when the lock is garbage collected, at exit and on SIGTERM (:mod:`~torchrl.data.replay_buffers._shared.cleanup`);
    a creator killed by SIGKILL leaves an empty file.

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
        self._reset(self._create())

    def _create(self) -> int:
        """Creates this process's lock file, removed when the lock is dropped, at exit and on SIGTERM."""
        fd, self.path = tempfile.mkstemp(prefix=f"torchrl-lock-{os.getpid()}-", dir=_lock_dir())
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

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                # the process that created the lock has exited: this process starts a new lock group
                self._fd = self._create()
        return self._fd

    def _after_fork_in_child(self) -> None:
        inherited = self._fd
        fd = None
        if inherited is not None:
            try:  # a new open file description of the same file, even if it was unlinked meanwhile
                fd = os.open(f"/proc/self/fd/{inherited}", os.O_RDWR)
            except OSError:
                fd = None
            os.close(inherited)
        self._reset(fd)

    @property
    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident() and self._pid == os.getpid()

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        if self._owner == me:  # re-entry: the common case inside a write, kept to a compare and an add
            self._depth += 1
            return True
        if self._pid != os.getpid():  # copied by fork without the at-fork hook (should not happen)
            self._after_fork_in_child()
        if not self._thread_lock.acquire(blocking):
            return False
        try:
            if not self._flock(blocking):
                self._thread_lock.release()
                return False
        except BaseException:
            self._thread_lock.release()
            raise
        self._owner = me
        self._depth = 1
        return True

    def _flock(self, blocking: bool) -> bool:
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
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("ProcessLock.release() called by a thread that does not hold the lock.")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._thread_lock.release()

    def __enter__(self) -> ProcessLock:
        if self._owner == threading.get_ident():
            self._depth += 1
        else:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self._depth > 1 and self._owner == threading.get_ident():
            self._depth -= 1
        else:
            self.release()

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state) -> None:
        self.path = state["path"]
        self._reset(None)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and getattr(self, "_pid", None) == os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r}, held={self.held})"


def _reset_locks_after_fork() -> None:
    for lock in list(_LIVE_LOCKS):
        lock._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_locks_after_fork)
