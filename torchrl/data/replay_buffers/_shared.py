"""Shared-memory primitives: counters, a cross-process write lock, per-row write versions.

Storages and writers keep their length, cursor and write count in :class:`SharedCounters`. The counters are
shared between processes exactly when the storage content is (``share_memory_()``, memory-mapped files), so a
copy of the object in a DataLoader worker (fork, spawn or forkserver) observes writes made by the parent after
the worker started, while a forked copy of a private storage stays private: its writes never move the
parent's length.

Picklers:

- ``multiprocessing`` (DataLoader workers, ``mp.Process`` arguments): shared counters travel as a handle to
  the same memory; private counters travel by value;
- ``pickle``/``torch.save``/``copy.deepcopy``: the counters travel by value and the copy is private.

NOTE [write lock and versions]: writers of a shared storage, in any number of processes, are serialized by
:class:`ProcessLock`, a ``flock`` on a small lock file. The kernel releases an ``flock`` when its holder dies,
SIGKILL included, so a killed writer cannot deadlock the others (a ``multiprocessing.Lock`` is a semaphore
that stays taken forever in that case). Readers do not take the lock; instead each row of a shared tensor
storage has a version in :class:`RowVersions`, made odd while the row is written and even again once it is
complete. A reader reads the versions, gathers the rows, reads the versions again and re-reads the rows
whose version moved or was odd (a seqlock per row). The ordering this relies on (the version store before
the data stores, the data loads before the second version load) holds on x86-64's total store order; on
weakly ordered CPUs (ARM) the check is best effort.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import tempfile
import threading
import time
import weakref

import numpy as np
import torch

from torchrl.data.replay_buffers._cleanup import register_owned_path, remove_owned_path

__all__ = ["SharedCounters", "ProcessLock", "RowVersions", "TornReadError", "is_spawning", "NULL_LOCK"]


class SharedCounters:
    """A fixed set of named int64 counters, in private or shared memory.

    Args:
        names: the counter names, in order.

    Keyword Args:
        shared (bool): allocate the counters in shared memory. Defaults to ``False``; see
            :meth:`share_memory_`.

    Examples:
        >>> c = SharedCounters(("length", "cursor"))
        >>> c["length"] = 3
        >>> c["length"]
        3
        >>> c.as_dict()
        {'length': 3, 'cursor': 0}
        >>> c.is_shared
        False
    """

    __slots__ = ("_names", "_pos", "_tensor", "_array", "_shared")

    def __init__(self, names: tuple[str, ...], *, shared: bool = False):
        self._names = tuple(names)
        self._pos = {name: i for i, name in enumerate(self._names)}
        tensor = torch.zeros(len(self._names), dtype=torch.int64)
        self._attach(tensor.share_memory_() if shared else tensor)

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        # a numpy view of the same memory: reads and writes cost ~0.1 us instead of a tensor op's ~3 us
        self._array = tensor.numpy()
        self._shared = tensor.is_shared()

    @property
    def is_shared(self) -> bool:
        """Whether the counters live in shared memory."""
        return self._shared

    def share_memory_(self) -> SharedCounters:
        """Moves the counters to shared memory (in place; a no-op when they already are)."""
        if not self._shared:
            self._attach(self._tensor.clone().share_memory_())
        return self

    def __getitem__(self, name: str) -> int:
        return int(self._array[self._pos[name]])

    def __setitem__(self, name: str, value: int) -> None:
        self._array[self._pos[name]] = int(value)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self._names, self._array.tolist()))

    def load_dict(self, values: dict[str, int]) -> None:
        for name, value in values.items():
            self[name] = value

    def __getstate__(self):
        if self._shared:
            return {"names": self._names, "tensor": self._tensor}
        # by value: torch's multiprocessing reducer would move a private tensor to shared memory in place,
        # behind the numpy view, and make a forked-style private copy silently shared
        return {"names": self._names, "values": self._array.tolist()}

    def __setstate__(self, state):
        self._names = tuple(state["names"])
        self._pos = {name: i for i, name in enumerate(self._names)}
        if "values" in state:
            self._attach(torch.tensor(state["values"], dtype=torch.int64))
        else:
            # a shared tensor arrives shared through multiprocessing, by value through pickle: then private
            self._attach(state["tensor"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()})"


def is_spawning() -> bool:
    """True while multiprocessing pickles the arguments of a process it is starting (spawn/forkserver)."""
    return multiprocessing.context.get_spawning_popen() is not None


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
    when the lock is garbage collected, at exit and on SIGTERM (:mod:`~torchrl.data.replay_buffers._cleanup`);
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


class TornReadError(RuntimeError):
    """Raised by a read of a shared storage when rows stayed mid-write longer than a reader waits (2 s).

    Their writer most likely died while writing them; the next write at the writer's cursor completes them.
    ``storage.consistent_reads = False`` reads them anyway (possibly mixing two writes).
    """


class RowVersions:
    """Write sequence numbers in shared memory: one global, and per row the last write that began on it.

    Writers hold the storage's :class:`ProcessLock`. :meth:`begin` takes the next sequence number ``s``
    (odd), publishes it as the global number, then stamps it on the rows about to be written; :meth:`end`
    makes the global number even (``s + 1``) once the rows are complete. A reader takes a :meth:`snapshot` of
    the global number ``g`` before gathering rows and asks :meth:`torn` afterwards: if the global number is
    still ``g`` and even, no write overlapped the read (two scalar loads); otherwise the rows stamped with a
    sequence number at or after ``g`` may mix two writes and are read again. A writer that died inside a
    write leaves the global number odd; the next writer stamps the rows it left with a poison value, so they
    stay unreadable until they are written again. See the note at the top of this module.

    Args:
        rows (int): the number of rows.

    Examples:
        >>> import numpy as np
        >>> versions = RowVersions(4)
        >>> rows = np.array([1, 2])
        >>> snap = versions.snapshot()
        >>> versions.torn(snap, rows) is None  # no write since the snapshot
        True
        >>> versions.begin(np.array([2])); versions.end()
        >>> versions.torn(snap, rows).tolist()
        [False, True]
    """

    # a reader waits up to this long for a row that stays mid-write before it blames a dead writer
    max_wait_s = 2.0
    _POISON = np.iinfo(np.int64).max

    def __init__(self, rows: int):
        # the last slot is the global sequence number
        self._attach(torch.zeros(int(rows) + 1, dtype=torch.int64).share_memory_())

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._array = tensor.numpy()
        self._rows = self._array[:-1]
        self._global = self._array.shape[0] - 1

    def __len__(self) -> int:
        return self._rows.shape[0]

    def begin(self, rows) -> None:
        """Stamps ``rows`` (an int, an index array or a slice) with a new, odd, global sequence number."""
        array = self._array
        current = int(array[self._global])
        if current & 1:  # the previous writer died inside its write: its rows stay unreadable
            self._rows[self._rows == current] = self._POISON
        seq = (current + 1) | 1
        array[self._global] = seq
        if isinstance(rows, np.ndarray) and rows.size <= 4:  # a few scalar stores beat fancy indexing
            for row in rows.tolist():
                array[row] = seq
        else:
            self._rows[rows] = seq

    def end(self, rows=None) -> None:
        """Publishes the write that :meth:`begin` started as complete (the global number turns even)."""
        array = self._array
        array[self._global] = int(array[self._global]) + 1

    def snapshot(self) -> int:
        """The global sequence number, read before a gather."""
        return int(self._array[self._global])

    def torn(self, snapshot: int, rows: np.ndarray) -> np.ndarray | None:
        """``None`` when no write overlapped the read since ``snapshot``, else a mask of the rows to read
        again (a write began on them at or after the snapshot, or left them mid-write)."""
        if not snapshot & 1 and int(self._array[self._global]) == snapshot:
            return None
        return self._rows[rows] >= (snapshot | 1)

    def wait(self, attempt: int, started: float, rows: np.ndarray) -> None:
        """Backs off before re-reading ``rows``; raises :class:`TornReadError` once ``max_wait_s`` passed."""
        if time.monotonic() - started > self.max_wait_s:
            raise TornReadError(
                f"Rows {rows[:8].tolist()}{'...' if rows.size > 8 else ''} of a shared storage stayed mid-write "
                f"for over {self.max_wait_s} s: the process writing them most likely died during the write. "
                f"They are rewritten by the next write at the writer's cursor; to read them anyway, set "
                f"`storage.consistent_reads = False`."
            )
        time.sleep(0 if attempt < 8 else 1e-4)

    def __getstate__(self):
        return {"tensor": self._tensor}

    def __setstate__(self, state) -> None:
        tensor = state["tensor"]
        self._attach(tensor if tensor.is_shared() else tensor.clone().share_memory_())
