"""Keeping a :class:`~.live_index.TrajectoryEnds` in step with the storage it indexes: :class:`TrajectorySync`.

NOTE [catching up on appends]: the index follows the storage through its counters
(:meth:`TensorStorage.append_state`: ``revision``, ``appended`` rows, ``append_break``), which live in shared
memory with the content, so the process that wrote, a DataLoader worker's copy and any other process writing into
a shared storage all read the same ones. At a draw, the index labelled ``(revision R, appended A)`` is current when
the revision is still ``R``; when ``append_break <= R`` every write since was an append and it reads only the
``appended - A`` rows after its newest row (``O(k)``); anything else (a write elsewhere than after the newest row,
``storage.set`` with ``set_cursor=False``, ``empty``, a load, ``k >= capacity`` rows) rebuilds it from the whole
storage, so the index is never stale: it holds every write completed before the draw began.
Concurrent writers (readers take no lock): writers store the content, then the layout counters, then
``appended``/``append_break``, then ``revision``; a reader loads the counters first (``revision``, ``appended``,
``append_break``), labels the index with them, and reads rows only after. The rows it reads for ``appended`` were
complete before the counter moved. A write in flight during the read may leave the index with some of its rows,
but the index is labelled before that write, whose rows are read again when it is caught up (an append) or which
rebuilds the index (anything else). After each catch-up the index's layout (rows, newest row) is checked against
the storage's; a mismatch (a write in flight moved the layout before its counters) catches up again a few
times, then rebuilds.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import numpy as np
import torch

from torchrl.data.replay_buffers.storages.tensor import TensorStorage
from torchrl.data.replay_buffers.trajectories.ends import find_trajectories
from torchrl.data.replay_buffers.trajectories.layout import ring_layout
from torchrl.data.replay_buffers.trajectories.live_index import TrajectoryEnds


def supports_live_index(storage) -> bool:
    """Whether ``storage`` can be indexed incrementally: a 1-D CPU tensor storage with a write revision."""
    if not isinstance(storage, TensorStorage) or storage.ndim != 1 or storage.write_revision is None:
        return False
    device = getattr(storage, "device", None)
    return device is None or torch.device(device).type == "cpu"


_ATTEMPTS = 4  # catch-ups tried while concurrent writes keep the layout check failing, before a rebuild


class TrajectorySync:
    """The index of one storage, labelled with the storage's append state it holds (NOTE [catching up on
    appends]). ``rebuilds`` counts the builds from the whole storage, ``catch_ups`` the draws that applied
    writes in ``O(rows written)`` (public counters, for tests and benchmarks)."""

    def __init__(self):
        self.rebuilds = 0
        self.catch_ups = 0
        self.reset()

    def reset(self) -> None:
        """Forgets the index (``rb.empty()``, a new source of trajectories)."""
        self.index: TrajectoryEnds | None = None
        self._storage_ref = None
        self.revision: int | None = None
        self.appended: int | None = None
        self.source = None

    def _storage(self):
        return None if self._storage_ref is None else self._storage_ref()

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
        if self.index is not None and storage is self._storage() and source == self.source:
            state = storage.append_state()
            if state[0] == self.revision:
                return self.index
            for _ in range(_ATTEMPTS):
                if not self._catch_up(storage, state, read_rows):
                    break
                if self._layout_matches(storage, self.index):
                    self.catch_ups += 1
                    return self.index
                time.sleep(0)  # a write in flight moves the layout before its counters: let it land
                state = storage.append_state()
        return self._rebuild(storage, source, read_all)

    def _catch_up(self, storage, state: tuple[int, int, int], read_rows: Callable) -> bool:
        """Applies the rows appended since the index's label, if appends explain every write since."""
        revision, appended, broken = state
        index = self.index
        k = appended - self.appended
        if broken > self.revision or not 0 <= k < index.capacity:
            return False
        self.index = None  # put back once updated: a failure below leaves no half update
        if k and index.n_rows:  # the newest row before the writes, then the new rows
            values = read_rows(storage, self.source, index.last_row, k + 1)
            index.append(values[1:], values[0])
        elif k:
            index.append(read_rows(storage, self.source, 0, k), None)
        self.index, self.revision, self.appended = index, revision, appended
        return True

    @staticmethod
    def _layout_matches(storage, index: TrajectoryEnds) -> bool:
        n_rows, _, offset, last_row = ring_layout(storage)
        return (n_rows, offset, last_row) == (index.n_rows, index.offset, index.last_row)

    def _rebuild(self, storage, source: tuple, read_all: Callable) -> TrajectoryEnds | None:
        self.reset()
        revision, appended, _ = storage.append_state()  # the label, loaded before the layout and the rows
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
        self.index, self._storage_ref, self.source = index, weakref.ref(storage), source
        self.revision, self.appended = revision, appended
        self.rebuilds += 1
        return index
