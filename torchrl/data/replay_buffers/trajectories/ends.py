"""Episode ends: where the trajectories of a storage start and stop, found with vectorized tensor ops.

In flat positions (:mod:`.layout`), every trajectory is one contiguous run ``[start, start + length)``. A run ends:

- at a step flagged done (end-key mode) or whose trajectory id differs from the next step's (id mode);
- at the newest row of each stream (the write position), so no run goes from the newest data to the oldest;
- at the last row of each stream, so no run crosses from one env column to the next.

Only the flags are scanned (one ``nonzero``); everything after works on the (much smaller) list of ends, so
finding boundaries in a 1M-row storage costs a few milliseconds and no Python loop over items.
:func:`find_trajectories` is the one finder: slice samplers, ``Sequence``, HER and trajectory queries use it (the
live index of :mod:`.live_index` keeps its result up to date on appends).
"""

from __future__ import annotations

import numpy as np
import torch

from torchrl.data.replay_buffers.trajectories.layout import TrajectoryIndex


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


def time_ordered_runs(values: torch.Tensor, *, is_done: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(starts, lengths)`` of the trajectories of values already in time order (nothing wraps).

    Args:
        values (Tensor): done flags (``is_done=True``) or trajectory ids, ``[n]`` (one stream) or ``[n, n_cols]``
            (streams end to end: column ``e`` holds the flat positions ``[e * n, (e + 1) * n)``).
        is_done (bool): what ``values`` holds.

    Examples:
        >>> import torch
        >>> time_ordered_runs(torch.tensor([3, 3, 4, 4, 4, 7]), is_done=False)
        (tensor([0, 2, 5]), tensor([2, 3, 1]))
    """
    if not values.numel():
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty
    grid = values.reshape(values.shape[0], -1)
    n = grid.shape[0]
    found = find_trajectories(
        grid, is_done=is_done, n_rows=n, n_cols=grid.shape[1], offset=0, last_row=n - 1, ndim=grid.ndim
    )
    return found.starts, found.lengths
