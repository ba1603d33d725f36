"""The ring layout of a storage: where its newest and oldest rows are, and positions in time order.

Data model. A storage is a ring buffer of ``n`` filled rows (time). A 1-D storage is one stream; an ``ndim=2``
storage (``[time, envs]``) holds one stream per env column. The newest step is at the row written last
(:func:`newest_row`); when the storage is full, the next row holds the oldest step, so time runs
``last_row + 1, ..., n - 1, 0, ..., last_row`` (:func:`oldest_first`). The position of a row in that order is its
*unrolled* position ``u = (row - offset) % n`` with ``offset = last_row + 1`` (``0`` when the storage is not full).
Streams are laid end to end: the *flat* position of step ``u`` of env ``e`` is ``p = e * n + u``; in flat positions
every trajectory is one contiguous run (:class:`TrajectoryIndex`).

A :class:`~torchrl.data.ListStorage` does not track where it wrapped: readers that know the writer's cursor pass it
(``cursor=``), and the newest row of a full list storage is the one before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchrl.data.replay_buffers.storages.list import ListStorage


def newest_row(storage, n_rows: int, *, cursor=None) -> int:
    """The row that holds the newest step of ``storage`` (``n_rows`` filled rows; ``n_rows - 1`` when unknown).

    Args:
        storage (Storage): the storage.
        n_rows (int): its filled rows.

    Keyword Args:
        cursor (int, optional): the writer's next row, for a full :class:`ListStorage` (which does not track
            where it wrapped). Defaults to ``None``.
    """
    if cursor is not None and isinstance(storage, ListStorage) and storage._is_full:
        return (int(cursor) - 1) % max(n_rows, 1)
    last = int(storage.last_written_row)
    return last if 0 <= last < n_rows else n_rows - 1


def oldest_row(storage, n_rows: int, last_row: int) -> int:
    """The row of unrolled position ``0``: the one after the newest of a full ring, else ``0``."""
    return (last_row + 1) % n_rows if storage._is_full and n_rows else 0


def ring_layout(storage, *, cursor=None) -> tuple[int, int, int, int]:
    """``(n_rows, n_cols, offset, last_row)`` of a storage's filled part (see the module docstring)."""
    n_rows = storage.rows_written()
    n_cols = 1
    if storage.ndim > 1:
        if storage.ndim > 2:
            raise ValueError(
                f"Slice samplers handle storages with ndim=1 or ndim=2 ([time, envs]); got "
                f"ndim={storage.ndim}. Flatten the env dims into one before storing."
            )
        n_cols = int(storage.shape[1])
    last_row = newest_row(storage, n_rows, cursor=cursor)
    return n_rows, n_cols, oldest_row(storage, n_rows, last_row), last_row


def oldest_first(storage, n_rows: int, *, cursor=None) -> torch.Tensor:
    """The ``n_rows`` filled rows of ``storage`` in time order, the oldest first (int64 ``[n_rows]``).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> storage.set(torch.arange(4), torch.zeros(4))
        >>> storage.set(torch.arange(4, 6) % 4, torch.zeros(2))  # wraps: rows 0 and 1 are the newest
        >>> oldest_first(storage, 4)
        tensor([2, 3, 0, 1])
    """
    rows = torch.arange(n_rows)
    offset = oldest_row(storage, n_rows, newest_row(storage, n_rows, cursor=cursor)) if n_rows else 0
    return rows.roll(-offset) if offset else rows


def flat_storage_index(storage, n_rows: int, *, cursor=None):
    """The storage index of every flat position, in flat order: the ``n_rows`` filled rows oldest first for a 1-D
    storage, ``(row, col)`` for an ``ndim=2`` one (env columns end to end, see the module docstring).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(3, ndim=2)
        >>> storage.set(torch.arange(2), torch.zeros(2, 2))
        >>> flat_storage_index(storage, 2)
        (tensor([0, 1, 0, 1]), tensor([0, 0, 1, 1]))
    """
    rows = oldest_first(storage, n_rows, cursor=cursor)
    if storage.ndim == 1:
        return rows
    n_cols = int(storage.shape[1])
    return rows.repeat(n_cols), torch.arange(n_cols).repeat_interleave(rows.numel())


@dataclass
class TrajectoryIndex:
    """Trajectories of a storage in flat positions (see the module docstring).

    Attributes:
        starts (Tensor): int64 ``[T]``, flat position of the first step of each trajectory, increasing.
        lengths (Tensor): int64 ``[T]``, number of steps of each trajectory.
        n_rows (int): filled rows (time steps per stream).
        n_cols (int): streams (env columns; ``1`` for 1-D storages).
        offset (int): row of unrolled position ``0`` (the oldest row).
        ndim (int): the storage's ``ndim`` (1 or 2), which sets the form of the index returned.
    """

    starts: torch.Tensor
    lengths: torch.Tensor
    n_rows: int
    n_cols: int
    offset: int
    ndim: int

    def storage_rows(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Maps flat positions to ``(row, column)`` of the storage (``column`` is ``None`` for 1-D)."""
        n = self.n_rows
        if self.n_cols == 1:
            unrolled, col = flat, None
        else:
            col = torch.div(flat, n, rounding_mode="floor")
            unrolled = flat - col * n
        row = unrolled if self.offset == 0 else (unrolled + self.offset).remainder_(n)
        return row, col

    def flat_positions(self, row: torch.Tensor, col: torch.Tensor | None = None) -> torch.Tensor:
        """Maps storage ``row`` (and ``column``, for ``ndim=2``) to flat positions: the inverse of :meth:`storage_rows`."""
        unrolled = row if self.offset == 0 else (row - self.offset).remainder_(self.n_rows)
        return unrolled if col is None else col * self.n_rows + unrolled

    def storage_index(self, flat: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The per-dim index tuple for ``storage.get`` and the cell positions in row-major order."""
        row, col = self.storage_rows(flat)
        if col is None:
            return (row,), row
        cell = row * self.n_cols + col
        return (row, col), cell
