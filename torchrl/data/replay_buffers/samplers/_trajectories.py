"""Trajectory boundaries in a replay-buffer storage, found with vectorized tensor ops.

Data model. A storage is a ring buffer of ``n`` filled rows (time). A 1-D storage is one stream; an
``ndim=2`` storage (``[time, envs]``) holds one stream per env column. When the storage is full, the row just
written (``storage.last_written_row``) holds the newest step and the next row holds the oldest one, so
time runs ``last_row + 1, ..., n - 1, 0, ..., last_row``. We call the position of a row in that order its
*unrolled* position ``u = (row - offset) % n`` with ``offset = last_row + 1`` (``0`` when the storage is not
full). Streams are laid end to end: the *flat* position of step ``u`` of env ``e`` is ``p = e * n + u``.

In flat positions, every trajectory is one contiguous run ``[start, start + length)``. A run ends:

- at a step flagged done (end-key mode) or whose trajectory id differs from the next step's (id mode);
- at the newest row of each stream (the write position), so no run goes from the newest data to the oldest;
- at the last row of each stream, so no run crosses from one env column to the next.

Only the flags are scanned (one ``nonzero``); everything after works on the (much smaller) list of ends, so
finding boundaries in a 1M-row storage costs a few milliseconds and no Python loop over items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.tensor import TensorStorage


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

    def storage_index(self, flat: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The per-dim index tuple for ``storage.get`` and the cell positions in row-major order."""
        row, col = self.storage_rows(flat)
        if col is None:
            return (row,), row
        cell = row * self.n_cols + col
        return (row, col), cell


# -- reading a column ----------------------------------------------------------------------------------------
def _get_nested(item, key):
    if isinstance(item, TensorDictBase) or is_tensorclass(item):
        return item.get(key)
    for part in (key,) if isinstance(key, str) else key:
        if not isinstance(item, Mapping):  # e.g. a tensor item: it holds no entries
            raise KeyError(key)
        item = item[part]
    return item


def has_key(storage, key) -> bool:
    """Whether the items of ``storage`` hold an entry ``key`` (a str or a tuple of str)."""
    if isinstance(storage, TensorStorage):
        return storage.get_entry(key) is not None
    if isinstance(storage, ListStorage):
        if not len(storage):
            return False
        try:
            value = _get_nested(storage.get(0), key)
        except (KeyError, TypeError, IndexError, AttributeError):
            return False
        return value is not None  # TensorDict.get returns None for a missing key
    data = storage.get(slice(None))
    return isinstance(data, TensorDictBase) and data.get(key, None) is not None


def read_column(storage, key, n_rows: int) -> torch.Tensor:
    """The values of entry ``key`` over the filled rows of ``storage`` (``[n_rows, *cols, *feature]``).

    Tensor storages return a view of the backing (no copy); a :class:`ListStorage` stacks the items' values.
    """
    if isinstance(storage, TensorStorage):
        column = storage.get_entry(key)
        if column is None:
            raise KeyError(f"The storage holds no entry {key!r}.")
        return _check_column(column, key)[:n_rows]
    if isinstance(storage, ListStorage):
        values = [_check_column(_get_nested(item, key), key) for item in storage.get(slice(0, n_rows))]
        return torch.stack([torch.as_tensor(value) for value in values])
    data = storage.get(slice(None))
    if not isinstance(data, TensorDictBase):
        raise RuntimeError(
            f"Cannot read the entry {key!r} from a {type(storage).__name__} whose items are "
            f"{type(data).__name__}: store TensorDicts, or pass `ends=`/`trajectories=` (with "
            f"cache_values=True)."
        )
    return _check_column(data.get(key), key)[:n_rows]


def _check_column(value, key):
    """``value`` unless it is a group of entries (a sub-TensorDict), which holds no per-step values."""
    if isinstance(value, (TensorDictBase, Mapping)) or is_tensorclass(value):
        raise ValueError(
            f"The entry {key!r} is a group of entries ({type(value).__name__}), not one value per step: name "
            f"a tensor inside it, e.g. {(key if isinstance(key, tuple) else (key,)) + ('done',)!r}. A nested "
            f"key is one tuple: pass several end keys as a list, end_keys=[('next', 'done'), ...]."
        )
    return value


def as_step_values(column: torch.Tensor, n_rows: int, n_cols: int, *, name: str, reduce_any: bool):
    """Reshapes a column to ``[n_rows, n_cols]``: one value per step.

    Trailing feature dims of size 1 are dropped (a view); larger ones are reduced with ``any`` for flags, and
    refused for trajectory ids.
    """
    column = torch.as_tensor(column)
    lead = n_rows * n_cols
    if column.numel() == lead:
        return column.reshape(n_rows, n_cols)
    if column.ndim == 0 or column.shape[0] != n_rows or column.numel() % lead:
        raise ValueError(
            f"The {name} has shape {list(column.shape)}, which does not give one value per step of the "
            f"{n_rows} x {n_cols} stored steps. Pass one value per stored step."
        )
    if not reduce_any:
        raise ValueError(
            f"The {name} has shape {list(column.shape)}: trajectory ids must be one scalar per step "
            f"(shape [{n_rows}] or [{n_rows}, 1]{'' if n_cols == 1 else f' per env ({n_cols})'})."
        )
    return column.reshape(n_rows, n_cols, -1).any(-1)


# -- boundaries ----------------------------------------------------------------------------------------------
def ring_layout(storage) -> tuple[int, int, int, int]:
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
    last_row = storage.last_written_row
    if not 0 <= last_row < n_rows:
        last_row = n_rows - 1
    full = storage._is_full
    offset = (last_row + 1) % n_rows if full and n_rows else 0
    return n_rows, n_cols, offset, last_row


def _as_numpy(values: torch.Tensor):
    """A numpy view of a CPU tensor, or the tensor itself for dtypes numpy lacks (bfloat16, ...)."""
    try:
        return values.detach().numpy()
    except TypeError:
        return values


def _nonzero_2d(mask) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, col)`` of the True entries of a 2-D mask (a tensor, or a numpy array for CPU data), row-major.

    numpy's ``flatnonzero`` is ~20x faster than ``torch.nonzero`` on CPU for sparse masks of 1M entries.
    """
    if isinstance(mask, np.ndarray):
        flat = torch.from_numpy(np.flatnonzero(mask))
        width = mask.shape[1]
        if mask.shape[0] == 1:
            return torch.zeros_like(flat), flat
        return torch.div(flat, width, rounding_mode="floor"), flat.remainder(width)
    rc = mask.nonzero()
    return rc[:, 0], rc[:, 1]


def find_trajectories(
    values: torch.Tensor, *, is_done: bool, n_rows: int, n_cols: int, offset: int, last_row: int, ndim: int
) -> TrajectoryIndex:
    """Finds the trajectories given per-step done flags or trajectory ids (``values``: ``[n_rows, n_cols]``).

    Args:
        values (Tensor): done flags (``is_done=True``) or trajectory ids, in storage row order.
        is_done (bool): what ``values`` holds.
        n_rows, n_cols, offset, last_row: the layout from :func:`ring_layout`.
        ndim (int): the storage's ``ndim``.
    """
    device = values.device
    n = n_rows
    data = _as_numpy(values) if device.type == "cpu" else values
    if is_done:
        flags = data if data.dtype in (np.bool_, torch.bool) else data != 0
        col, row = _nonzero_2d(flags.T)  # by column, then row
    else:
        change = data[:-1] != data[1:]  # [n-1, n_cols]: row r ends a run when its id differs from r+1's
        col, row = _nonzero_2d(change.T)
    col, row = col.to(device), row.to(device)
    extra_rows, extra_cols = [], []
    if not is_done and offset:  # the last row is followed (in time) by row 0
        wrap = torch.as_tensor(data[-1] != data[0]).to(device).nonzero().squeeze(-1)
        extra_rows.append(torch.full_like(wrap, n - 1))
        extra_cols.append(wrap)
    # every stream ends at its newest row (last_row, which is unrolled position n - 1 when rotating)
    cols = torch.arange(n_cols, device=device)
    for forced in [last_row] if offset else [last_row, n - 1]:
        extra_rows.append(torch.full_like(cols, forced))
        extra_cols.append(cols)
    col = torch.cat([col, *extra_cols])
    row = torch.cat([row, *extra_rows])
    unrolled = row if offset == 0 else (row - offset).remainder_(n)
    ends = torch.unique(col * n + unrolled)  # sorted, duplicates removed
    starts = torch.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    return TrajectoryIndex(
        starts=starts, lengths=ends - starts + 1, n_rows=n, n_cols=n_cols, offset=offset, ndim=ndim
    )


def format_lengths(lengths: torch.Tensor, limit: int = 8) -> str:
    """A short description of the trajectory lengths present, for error messages."""
    values, counts = torch.unique(lengths, return_counts=True)
    pairs = [f"{int(v)} (x{int(c)})" for v, c in zip(values[-limit:], counts[-limit:])]
    more = "" if values.numel() <= limit else f" and {values.numel() - limit} shorter ones"
    return ", ".join(pairs) + more


def sibling_key(key, name: str) -> str | tuple[str, ...]:
    """``key`` (normalized) with its last element replaced by ``name``: ``("next", "truncated")`` gives
    ``("next", name)``, ``"truncated"`` gives ``name``."""
    return name if isinstance(key, str) else (*key[:-1], name)


def normalize_key(key) -> str | tuple[str, ...]:
    """A nested key as a str (one level) or a tuple of str; raises TypeError otherwise."""
    if isinstance(key, str):
        return key
    if isinstance(key, Sequence) and key and all(isinstance(k, str) for k in key):
        return key[0] if len(key) == 1 else tuple(key)
    raise TypeError(f"A key must be a str or a non-empty tuple of str, got {key!r}.")
