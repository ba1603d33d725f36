"""Sampler state in shared memory: :class:`SharedArray` (a numpy array that can move to shared memory) and
:class:`StateGuard` (the cross-process lock around a sampler's state, with a flag that outlives a writer).

A sampler shares its state when a dataset read by DataLoader workers is built over its buffer
(``sampler.share_memory_()``): its arrays move to shared memory, so the main process and every worker read
and write one copy, under fork, spawn and forkserver. Picklers, as for the storage counters
(:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters`):

- ``multiprocessing`` (DataLoader workers): a shared array travels as a handle to the same memory;
- ``pickle``/``torch.save``/``copy.deepcopy``: by value; the copy is private (its guard is a no-op).

NOTE [sampler state guard]: every read or write of a shared sampler state holds the guard's
:class:`~torchrl.data.replay_buffers._shared.lock.ProcessLock`, an ``flock`` that the kernel releases when its
holder dies (SIGKILL included), so a killed worker never deadlocks the others. The lock is held only around
tree reads and updates and cursor moves, never around ``storage.get`` or transforms. A writer also raises a
flag in shared memory for the length of its write (:meth:`StateGuard.write`); if it dies mid-write, the flag
stays up and the next process to take the lock calls the owner's ``repair`` function (e.g. rebuild the
priority trees from the raw priorities) before reading.
"""

from __future__ import annotations

import numpy as np
import torch

from torchrl.data.replay_buffers._shared.lock import NULL_LOCK, ProcessLock

__all__ = ["SharedArray", "StateGuard"]


class SharedArray:
    """A 1-D numpy array over the memory of a torch tensor, which :meth:`share_memory_` moves to shared memory.

    :attr:`array` is the numpy view the owner reads and writes (numpy indexing costs a fraction of a tensor
    op). After :meth:`share_memory_` the owner must fetch :attr:`array` again: the memory moved.

    Args:
        array (ndarray): the initial values (copied only when the array moves to shared memory).

    Examples:
        >>> import numpy as np
        >>> a = SharedArray(np.zeros(3))
        >>> a.array[1] = 2.0
        >>> a.share_memory_().is_shared, a.array.tolist()
        (True, [0.0, 2.0, 0.0])
    """

    __slots__ = ("_tensor", "array")

    def __init__(self, array: np.ndarray) -> None:
        self._attach(torch.from_numpy(np.ascontiguousarray(array)))

    def _attach(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self.array = tensor.numpy()

    @property
    def is_shared(self) -> bool:
        """Whether the array lives in shared memory."""
        return self._tensor.is_shared()

    def share_memory_(self) -> SharedArray:
        """Moves the values to shared memory (a no-op when they already are there)."""
        if not self._tensor.is_shared():
            tensor = self._tensor.clone()
            if tensor.numel() == 0:  # an empty tensor has no memory to share: keep one slot
                tensor = torch.empty(1, dtype=tensor.dtype)[:0]
            self._attach(tensor.share_memory_())
        return self

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getstate__(self):
        if self._tensor.is_shared():
            return {"tensor": self._tensor}
        # by value: torch's multiprocessing reducer would move a private tensor to shared memory in place, behind
        # the numpy view, and make a private copy silently shared
        return {"array": self.array}

    def __setstate__(self, state) -> None:
        if "array" in state:
            self._attach(torch.from_numpy(np.array(state["array"])))
        else:  # shared through multiprocessing; by value (then private) through pickle
            self._attach(state["tensor"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={len(self)}, dtype={self.array.dtype}, shared={self.is_shared})"


class _Held:
    """What :meth:`StateGuard.read` and :meth:`StateGuard.write` return: the guard, held in a ``with`` block."""

    __slots__ = ("_guard", "_repair", "_write")

    def __init__(self, guard: StateGuard, repair, write: bool) -> None:
        self._guard, self._repair, self._write = guard, repair, write

    def __enter__(self) -> StateGuard:
        guard = self._guard
        guard.acquire(self._repair)
        if self._write:
            guard.begin_write()
        return guard

    def __exit__(self, exc_type, exc, tb) -> None:
        guard = self._guard
        try:
            if self._write:  # a write that raised half-way stays flagged: the next holder repairs
                guard.end_write(complete=exc_type is None)
        finally:
            guard.release()


class _Unheld:
    """What :meth:`StateGuard.read` and :meth:`StateGuard.write` return while the guard is private: a ``with``
    block that takes nothing (the private lock is a no-op and there is no flag to raise)."""

    __slots__ = ("_guard",)

    def __init__(self, guard: StateGuard) -> None:
        self._guard = guard

    def __enter__(self) -> StateGuard:
        return self._guard

    def __exit__(self, exc_type, exc, tb) -> None:
        return None


class StateGuard:
    """The lock around a sampler's state and the "write in progress" flag of its shared copy.

    A private guard (the default) costs next to nothing: its lock is a no-op and it has no flag. After
    :meth:`share_memory_`, :meth:`read` and :meth:`write` hold a :class:`~torchrl.data.replay_buffers._shared.
    ProcessLock` (re-entrant within a thread, exclusive across threads and processes), and a write raises a
    shared flag while it runs. See the note at the top of this module.

    Examples:
        >>> guard = StateGuard().share_memory_()
        >>> repaired = []
        >>> with guard.write(lambda: repaired.append(True)):
        ...     pass
        >>> repaired  # a complete write leaves nothing to repair
        []
        >>> try:
        ...     with guard.write(lambda: repaired.append(True)):
        ...         raise RuntimeError("the writer fails half-way")  # as a writer killed mid-write would
        ... except RuntimeError:
        ...     pass
        >>> with guard.read(lambda: repaired.append(True)):  # the next holder repairs first
        ...     repaired
        [True]
    """

    def __init__(self) -> None:
        self._lock = NULL_LOCK
        self._flags: SharedArray | None = None  # [writing], in shared memory once shared
        self._flag: np.ndarray | None = None  # its numpy view
        self._depth = 0  # nested writes of this thread: the flag drops when the outermost one ends
        self._unheld = _Unheld(self)

    @property
    def is_shared(self) -> bool:
        """Whether the guard orders several processes (after :meth:`share_memory_`)."""
        return self._flags is not None

    @property
    def lock(self):
        """The lock held by :meth:`read` and :meth:`write` (a no-op lock while private)."""
        return self._lock

    def share_memory_(self) -> StateGuard:
        """Creates the cross-process lock and the shared flag (a no-op when shared already)."""
        if self._flags is None:
            self._lock = ProcessLock()
            self._flags = SharedArray(np.zeros(1, dtype=np.int64)).share_memory_()
            self._flag = self._flags.array
        return self

    def read(self, repair) -> _Held:
        """A context that holds the lock; ``repair()`` runs first if a writer died mid-write."""
        return _Held(self, repair, False) if self._flags is not None else self._unheld

    def write(self, repair) -> _Held:
        """A context that holds the lock and flags a write in progress until it exits without an exception."""
        return _Held(self, repair, True) if self._flags is not None else self._unheld

    def acquire(self, repair) -> None:
        """Takes the lock; calls ``repair()`` (lock held) when the flag says a writer died mid-write."""
        self._lock.acquire()
        flag = self._flag
        if flag is not None and self._depth == 0 and flag[0]:
            try:
                repair()
            except BaseException:
                self._lock.release()
                raise
            flag[0] = 0

    def release(self) -> None:
        self._lock.release()

    def begin_write(self) -> None:
        """Marks a write in progress (lock held)."""
        self._depth += 1
        if self._flag is not None and self._depth == 1:
            self._flag[0] = 1

    def end_write(self, complete: bool = True) -> None:
        """Ends a write (lock held); the flag stays up if the write did not ``complete`` (it raised)."""
        self._depth -= 1
        if self._flag is not None and self._depth == 0 and complete:
            self._flag[0] = 0

    def __getstate__(self):
        if self._flags is None:
            return {}
        return {"lock": self._lock, "flags": self._flags}

    def __setstate__(self, state) -> None:
        self._lock, self._flags, self._flag, self._depth = NULL_LOCK, None, None, 0
        self._unheld = _Unheld(self)
        flags = state.get("flags")
        if flags is not None and flags.is_shared:  # a copy by value (pickle) is private: no lock, no flag
            self._lock, self._flags, self._flag = state["lock"], flags, flags.array

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shared={self.is_shared})"
