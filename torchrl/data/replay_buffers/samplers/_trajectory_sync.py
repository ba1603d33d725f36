"""Keeping a :class:`~._trajectory_index.TrajectoryEnds` in step with the storage it indexes: :class:`TrajectorySync`.

The index learns of the writes made in its own process through the storage (:meth:`Storage.attach`: writers
call ``storage.mark_update(index)`` under the write lock right after the write, when ``storage.write_revision``
is the revision that write made) and through the sampler's own ``mark_update(index, storage=...)``; it logs ``(revision, rows)`` and, at the next draw, applies the logged writes to the index if
they explain every revision since the index was built (consecutive revisions, nothing else wrote in between)
and they continue the ring at its newest row, in fewer rows than the ring holds; then it checks the result
against the storage's own layout counters. Anything else (a write it was not told about: another process, a
DataLoader worker's copy, ``storage.set`` called directly; a write elsewhere than at the newest row; more rows
than the ring holds) rebuilds the index from the whole storage, so the index is never stale.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import torch

from torchrl.data.replay_buffers.samplers._entries import values_at
from torchrl.data.replay_buffers.samplers._trajectories import find_trajectories, ring_layout
from torchrl.data.replay_buffers.samplers._trajectory_index import TrajectoryEnds
from torchrl.data.replay_buffers.storages.tensor import TensorStorage


def read_ring_range(storage, keys, is_done: bool, start: int, k: int, *, who: str) -> np.ndarray:
    """The done flags (OR-ed over ``keys``, bool) or the trajectory ids (``keys[0]``) of the ``k`` rows
    ``start, start + 1, ...`` (modulo the capacity) of a tensor storage, as a 1-D numpy array.

    A CPU column is read through a numpy view (a slice, or two when the range wraps); other dtypes go through
    :func:`._entries.values_at`.
    """
    capacity = int(storage.max_size)
    out = None
    for key in keys if is_done else keys[:1]:
        column = storage.get_entry(key)
        try:
            array = None if column is None else column.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): read through torch
            array = None
        if array is None:
            rows = torch.arange(start, start + k).remainder_(capacity)
            values = values_at(storage, key, rows, who=who).reshape(k, -1)
            values = values != 0 if is_done and values.dtype != torch.bool else values
            array = values.numpy() if values.dtype in (torch.bool, torch.int64) else values.double().numpy()
        elif start + k <= capacity:
            array = array[start : start + k].reshape(k, -1)
        else:
            array = np.concatenate([array[start:], array[: start + k - capacity]]).reshape(k, -1)
        if not is_done:
            return array[:, 0]
        flags = array if array.dtype == np.bool_ else array != 0
        flags = flags[:, 0] if flags.shape[1] == 1 else flags.any(-1)
        out = flags if out is None else out | flags
    return out


def supports_live_index(storage) -> bool:
    """Whether ``storage`` can be indexed incrementally: a 1-D CPU tensor storage with a write revision."""
    if not isinstance(storage, TensorStorage) or storage.ndim != 1 or storage.write_revision is None:
        return False
    device = getattr(storage, "device", None)
    return device is None or torch.device(device).type == "cpu"


class TrajectorySync:
    """The index of one storage and the writes logged since it was built (see the module docstring)."""

    def __init__(self):
        self._listener: _WriteListener | None = None
        self.rebuilds = 0  # how many times the index was built from the whole storage (for tests)
        self.reset()

    def reset(self) -> None:
        """Forgets the index and the log (``rb.empty()``, a new source of trajectories)."""
        self.index: TrajectoryEnds | None = None
        self._storage_ref = None
        self.revision: int | None = None
        self.source = None
        self._log: list[tuple[int, torch.Tensor]] = []
        self._log_rows = 0

    def _storage(self):
        return None if self._storage_ref is None else self._storage_ref()

    def note_write(self, rows, storage) -> None:
        """Logs a write of ``rows`` that just made ``storage.write_revision`` (called by the write hooks)."""
        if self.index is None or storage is None or storage is not self._storage():
            return
        revision = storage.write_revision
        if self._log and self._log[-1][0] == revision:  # the same write, told twice (storage and buffer)
            return
        rows = torch.as_tensor(rows).reshape(-1)
        self._log.append((revision, rows))
        self._log_rows += rows.numel()
        if self._log_rows >= self.index.capacity:  # more than the ring holds: rebuilt at the next draw
            self._log, self._log_rows, self.index = [], 0, None

    def current(
        self, storage, source: tuple, read_all: Callable, read_rows: Callable
    ) -> TrajectoryEnds | None:
        """The index of ``storage`` as it is now, or ``None`` when its layout cannot be indexed incrementally
        (not full and its newest row is not the last filled one: the caller reads the whole storage).

        Args:
            storage: the storage (see :func:`supports_live_index`).
            source (tuple): ``(keys, is_done)``: where the trajectories come from; another source rebuilds.
            read_all (callable): ``read_all(storage, source, n_rows) -> Tensor [n_rows, 1]``: the done flags or
                trajectory ids of every filled row.
            read_rows (callable): ``read_rows(storage, source, start, k) -> np.ndarray``: the same values at
                the ``k`` rows ``start, start + 1, ...`` (modulo the capacity).
        """
        index = self.index
        revision = storage.write_revision
        if index is not None and storage is self._storage() and source == self.source:
            if revision == self.revision:
                return index
            if self._apply_log(storage, revision, read_rows):
                return self.index
        return self._rebuild(storage, revision, source, read_all)

    def _apply_log(self, storage, revision: int, read_rows: Callable) -> bool:
        log, self._log, self._log_rows = self._log, [], 0
        index, self.index = self.index, None  # put back once updated: a failure below leaves no half update
        expected = self.revision
        parts = []
        for rev, rows in log:
            if rev <= self.revision:  # logged before the index was built
                continue
            if rev != expected + 1:
                return False
            expected = rev
            parts.append(rows)
        if expected != revision or not parts:
            return False
        rows = (parts[0] if len(parts) == 1 else torch.cat(parts)).numpy()
        k = rows.size
        capacity = index.capacity
        if k >= capacity:
            return False
        start = (index.last_row + 1) % capacity if index.n_rows else 0
        appended = np.arange(start, start + k)
        if start + k > capacity:
            appended %= capacity
        if not np.array_equal(rows, appended):
            return False
        if index.n_rows:  # the newest row before the write, then the new rows
            values = read_rows(storage, self.source, index.last_row, k + 1)
            index.append(values[1:], values[0])
        else:
            index.append(read_rows(storage, self.source, 0, k), None)
        if not self._layout_matches(storage, index):
            return False
        self.index, self.revision = index, revision
        return True

    @staticmethod
    def _layout_matches(storage, index: TrajectoryEnds) -> bool:
        n_rows, _, offset, last_row = ring_layout(storage)
        return (n_rows, offset, last_row) == (index.n_rows, index.offset, index.last_row)

    def _rebuild(self, storage, revision: int, source: tuple, read_all: Callable) -> TrajectoryEnds | None:
        self.reset()
        n_rows, n_cols, offset, last_row = ring_layout(storage)
        capacity = int(storage.max_size)
        full = n_rows >= capacity
        if n_rows > capacity or (not full and last_row != n_rows - 1):
            return None
        is_done = source[1]
        values = read_all(storage, source, n_rows)
        found = find_trajectories(
            values, is_done=is_done, n_rows=n_rows, n_cols=1, offset=offset, last_row=last_row, ndim=1
        )
        ends = (found.starts + found.lengths - 1).numpy().astype(np.int64, copy=False)
        first = offset if full else 0  # the time of unrolled position 0 (see NOTE [live trajectory index])
        index = TrajectoryEnds(capacity, is_done, ends + first, n_rows, first=first)
        self.index, self._storage_ref, self.revision, self.source = (
            index,
            weakref.ref(storage),
            revision,
            source,
        )
        self.rebuilds += 1
        if self._listener is None or self._listener.storage() is not storage:
            self._listener = _WriteListener(self, storage)
            storage.attach(self._listener)
        return index


class _WriteListener:
    """What a storage tells of its writes (:meth:`Storage.attach`), forwarded to a :class:`TrajectorySync` while
    it lives (the storage holds the listener, the listener only weak references)."""

    def __init__(self, sync: TrajectorySync, storage):
        self.sync = weakref.ref(sync)
        self.storage = weakref.ref(storage)

    def mark_update(self, index) -> None:
        sync, storage = self.sync(), self.storage()
        if sync is None:
            if storage is not None:
                storage.detach(self)
            return
        sync.note_write(index, storage)
