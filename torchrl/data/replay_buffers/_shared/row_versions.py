"""Per-row write versions of a tensor storage: :class:`RowVersions` (a seqlock per row).

See NOTE [write lock and versions] in :mod:`~torchrl.data.replay_buffers._shared.lock`. A read that finds rows
mid-write for too long raises :class:`~torchrl.data.replay_buffers.errors.TornReadError`.

A shared storage's versions live in shared memory and serve two readers: gathers that re-read rows a concurrent
write changed, and incremental dumps (which rows changed since a checkpoint: ``storages/_incremental.py``). A
private CPU storage keeps versions in its own memory for the second use only: each write call stamps its rows
once (:meth:`RowVersions.stamp_ring`: a writer's ring write is remembered and stamped when the versions are
read, NOTE [deferred ring stamps]; :meth:`RowVersions.stamp`: one numpy scatter for an index), and :meth:`RowVersions.share_memory_`
moves them to shared memory, in place, when the storage is shared.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from torchrl.data.replay_buffers.errors import TornReadError


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

    Keyword Args:
        shared (bool): allocate in shared memory (``False``: in this process's memory, for a private storage;
            see :meth:`share_memory_`). Defaults to ``True``.

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

    def __init__(self, rows: int, *, shared: bool = True):
        # the last slot is the global sequence number
        self._attach(
            torch.zeros(int(rows) + 1, dtype=torch.int64).share_memory_() if shared else _private(rows)
        )

    @property
    def is_shared(self) -> bool:
        """Whether the versions live in shared memory (seen by every process sharing the storage)."""
        return self._tensor.is_shared()

    def share_memory_(self) -> RowVersions:
        """Moves the versions to shared memory, in place, keeping every stamp (the storage is being shared)."""
        self._flush()
        if not self._tensor.is_shared():
            self._tensor.share_memory_()
            self._attach(self._tensor)  # the memory moved: numpy views of the old memory are stale
        return self

    def _attach(self, tensor: torch.Tensor) -> None:
        self._pending: list[list[int]] = []  # private ring writes not stamped yet: [start, stop) (NOTE below)
        self._tensor = tensor
        self._array = tensor.numpy()
        self._rows = self._array[:-1]
        self._global = self._array.shape[0] - 1

    def __len__(self) -> int:
        return self._rows.shape[0]

    def begin(self, rows) -> None:
        """Stamps ``rows`` (an int, an index array or a slice) with a new, odd, global sequence number."""
        if self._pending:
            self._flush()
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

    def begin_ring(self, start: int, n: int) -> None:
        """:meth:`begin` for ``n`` consecutive rows from ``start``, wrapping at the last row (a writer's ring
        write): slice stores, no index array."""
        array, rows = self._array, self._rows
        current = int(array[self._global])
        if current & 1:  # as in begin
            rows[rows == current] = self._POISON
        seq = (current + 1) | 1
        array[self._global] = seq
        capacity = rows.shape[0]
        if n >= capacity:
            rows[:] = seq
            return
        stop = start + n
        rows[start:stop] = seq
        if stop > capacity:
            rows[: stop - capacity] = seq

    def stamp(self, rows) -> None:
        """:meth:`begin` and :meth:`end` at once, for a private storage (no reader runs during its writes): one
        call per write, ``rows`` an int, an index array or a slice."""
        if self._pending:
            self._flush()
        array = self._array
        seq = int(array[self._global]) | 1
        array[self._global] = seq + 1
        self._rows[rows] = seq

    # NOTE [deferred ring stamps]: a private storage's ring writes are only remembered by stamp_ring (a list
    # append, or one int add when the write continues the previous one), and stamped when something reads
    # the versions (snapshot, torn, share_memory_, another stamp) or every _MAX_PENDING writes: the stores
    # into the row array cost several microseconds per write once the storage's copies evicted it from the
    # caches. The deferred writes share one sequence number, the one a dump's snapshot sees after them: a row
    # is never stamped older than its write, which is what incremental dumps need.
    _MAX_PENDING = 256

    def stamp_ring(self, start: int, n: int) -> None:
        """:meth:`stamp` of a ring write (:meth:`begin_ring`'s rows), deferred (NOTE [deferred ring stamps])."""
        pending = self._pending
        if pending:
            last = pending[-1]
            if last[1] % self._global == start:  # continues the previous write
                last[1] += n
                return
            if len(pending) >= self._MAX_PENDING:
                self._flush()
        pending.append([start, start + n])

    def _flush(self) -> None:
        """Stamps the deferred ring writes, with one new sequence number."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        array, rows = self._array, self._rows
        seq = int(array[self._global]) | 1
        array[self._global] = seq + 1
        capacity = rows.shape[0]
        for start, stop in pending:
            if stop - start >= capacity:
                rows[:] = seq
                continue
            rows[start:stop] = seq
            if stop > capacity:
                rows[: stop - capacity] = seq

    def end(self, rows=None) -> None:
        """Publishes the write that :meth:`begin` started as complete (the global number turns even)."""
        array = self._array
        array[self._global] = int(array[self._global]) + 1

    def snapshot(self) -> int:
        """The global sequence number, read before a gather."""
        if self._pending:
            self._flush()
        return int(self._array[self._global])

    def torn(self, snapshot: int, rows: np.ndarray) -> np.ndarray | None:
        """``None`` when no write overlapped the read since ``snapshot``, else a mask of the rows to read
        again (a write began on them at or after the snapshot, or left them mid-write)."""
        if self._pending:
            self._flush()
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
        if not self._tensor.is_shared():  # private: a copy starts afresh (no stamp says anything to it)
            return {"rows": len(self)}
        return {"tensor": self._tensor}

    def __setstate__(self, state) -> None:
        if "rows" in state:
            self._attach(_private(state["rows"]))
            return
        tensor = state["tensor"]
        self._attach(tensor if tensor.is_shared() else tensor.clone().share_memory_())


def _private(rows: int) -> torch.Tensor:
    """Zeroed private versions for ``rows`` rows: numpy's zeroed allocation, whose pages the kernel zeroes as they
    are first touched (``torch.zeros`` writes every page now: milliseconds per million rows at each load)."""
    return torch.from_numpy(np.zeros(int(rows) + 1, dtype=np.int64))
