"""Trajectory boundaries as fixed-shape tensors, found without reading a number back: :class:`DenseTrajectories`.

NOTE [dense trajectory index]
On an accelerator, ``nonzero``, ``unique`` or ``.item()`` stall the device until it catches up, and the compact
index of :func:`.ends.find_trajectories` needs them (its size is the number of trajectories). Here every tensor has
one entry per filled row of a 1-D ring storage whatever the number ``T`` of trajectories, so finding the trajectories
after a write reads nothing back. In unrolled positions (:mod:`.layout`) a position ends a trajectory when its done
flag is set or its id differs from the next one's, and the newest row always does; trajectory ``j < T`` (``T`` a 0-d
tensor) starts at ``dense_starts[j]`` and holds ``dense_lengths[j]`` steps; the entries from ``T`` on are padding.
:class:`DenseEligible` counts the trajectories long enough for a slice with a cumulative sum, and finds the ``i``-th
of them by a binary search (``searchsorted``): the same table, oldest first, with the same float64 factors as a slice
sampler's compact one, so the same uniforms give the same slices.

Whether any trajectory is long enough (an error otherwise) is a number on the device: a *witness*, the unrolled
start of the newest trajectory of at least ``need`` steps, is read once (one sync) and carried over appends on the
host. An append of ``k`` rows changes no trajectory but the newest (which grows) and the oldest ones (overwritten):
the witness holds while its first row is held, shifted by the rows dropped at the front.
"""

from __future__ import annotations

import torch

from torchrl.data.replay_buffers.trajectories.layout import TrajectoryIndex

_BELOW_ONE = 1.0 - 2.0**-52  # floor(u * n * _BELOW_ONE) < n for every float64 u in [0, 1)
_EMPTY = torch.zeros(0, dtype=torch.long)


class DenseTrajectories:
    """The trajectories of the ``n`` filled rows of a 1-D ring storage, ``n``-entry tensors (see the module NOTE).

    A :class:`~.layout.TrajectoryIndex` for its readers (the same layout and position maps); its ``starts`` and
    ``lengths`` (the ``T`` trajectories only) read ``T`` back, on first access only.

    Args:
        values (Tensor): ``[n]`` done flags (``is_done=True``) or trajectory ids, in storage row order.

    Keyword Args:
        is_done (bool): what ``values`` holds.
        offset (int): the row of unrolled position ``0`` (the oldest row; ``0`` while the ring is not full). The
            newest row is unrolled position ``n - 1``.
        previous (tuple, optional): ``(index, dropped)``: the index of the same storage before an append, and the
            oldest rows the append overwrote; its witnesses are carried over. Defaults to ``None``.

    Examples:
        >>> import torch
        >>> found = DenseTrajectories(torch.tensor([3, 3, 4, 4, 4, 7]), is_done=False, offset=0)
        >>> found.count, found.dense_starts[:3], found.dense_lengths[:3]
        (tensor(3), tensor([0, 2, 5]), tensor([2, 3, 1]))
        >>> found.lengths
        tensor([2, 3, 1])
    """

    def __init__(self, values: torch.Tensor, *, is_done: bool, offset: int, previous: tuple | None = None):
        values = values.reshape(-1)
        n = values.shape[0]
        self.n_rows, self.n_cols, self.offset, self.ndim = n, 1, offset, 1
        device = values.device
        if offset:
            values = values.index_select(0, torch.arange(offset, offset + n, device=device).remainder_(n))
        end = torch.empty(n, dtype=torch.bool, device=device)
        if is_done:
            end.copy_(values if values.dtype == torch.bool else values != 0)
        else:
            torch.ne(values[:-1], values[1:], out=end[:-1])
        end[-1] = True
        first = torch.empty_like(end)
        first[0] = True
        first[1:] = end[:-1]
        traj = first.cumsum(0).sub_(1)  # the trajectory of each position
        positions = torch.arange(n, device=device)
        slots = torch.zeros(2, n + 1, dtype=torch.long, device=device)  # slot n: the positions not written
        slots[0].scatter_(0, torch.where(first, traj, n), positions)
        slots[1].scatter_(0, torch.where(end, traj, n), positions)
        self.dense_starts = slots[0, :n]
        self.dense_lengths = slots[1, :n] - self.dense_starts + 1
        self.count = traj[-1] + 1
        self._layout = TrajectoryIndex(
            starts=_EMPTY, lengths=_EMPTY, n_rows=n, n_cols=1, offset=offset, ndim=1
        )
        self._compact: tuple[torch.Tensor, torch.Tensor] | None = None
        self._witness: dict[int, int] = {}
        if previous is not None:
            old, dropped = previous
            self._witness = {need: u - dropped for need, u in old._witness.items() if u >= dropped}

    def _trajectories(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._compact is None:
            t = int(self.count)  # a host sync, once
            self._compact = (self.dense_starts[:t], self.dense_lengths[:t])
        return self._compact

    @property
    def starts(self) -> torch.Tensor:
        """The first position of each of the ``T`` trajectories (reads ``T``: a host sync on first access)."""
        return self._trajectories()[0]

    @property
    def lengths(self) -> torch.Tensor:
        """The steps of each of the ``T`` trajectories (reads ``T``: a host sync on first access)."""
        return self._trajectories()[1]

    def has_trajectory_of(self, need: int, before: torch.Tensor) -> bool:
        """Whether a trajectory holds ``need`` steps; ``before`` is :attr:`DenseEligible.before` for ``need``.

        Known on the host after the first answer for ``need`` (a sync), then carried over appends."""
        if need in self._witness:
            return True
        held = int(before[-1])
        if held:
            newest = torch.searchsorted(before, before[-1:])  # the first position reaching the total
            self._witness[need] = int(self.dense_starts[newest])
        return held > 0

    def storage_rows(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._layout.storage_rows(flat)

    def flat_positions(self, row: torch.Tensor, col: torch.Tensor | None = None) -> torch.Tensor:
        return self._layout.flat_positions(row, col)

    def storage_index(self, flat: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return self._layout.storage_index(flat)


class DenseEligible:
    """The trajectories of a :class:`DenseTrajectories` a slice of ``slice_len`` steps may come from.

    The same table as a slice sampler's compact one (trajectories oldest first, start offsets drawn in
    ``[-left, -left + count)``), read through a cumulative count of the eligible trajectories.

    Args:
        index (DenseTrajectories): the trajectories.
        slice_len (int): the steps of a slice.
        left, right (int): the span steps a slice may start before / end after its trajectory.
        strict_length (bool): only trajectories holding a full slice (``length + left + right >= slice_len``).
    """

    def __init__(self, index: DenseTrajectories, slice_len: int, left: int, right: int, strict_length: bool):
        self.index = index
        lengths = index.dense_lengths
        ok = torch.arange(index.n_rows, device=lengths.device) < index.count
        if strict_length:
            ok &= lengths >= slice_len - left - right
        self.before = ok.cumsum(0)  # eligible trajectories up to each position, included
        high = lengths - slice_len + right
        if not strict_length:
            high = high.clamp_min(-left)
        self._count = high + left + 1
        self.low = -left
        self.n_float = self.before[-1].double() * _BELOW_ONE
        self.all_full = strict_length and left == right == 0
        self._size: int | None = None
        self._found: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def size(self) -> int:
        """The number of eligible trajectories (read once: a host sync)."""
        if self._size is None:
            self._size = int(self.before[-1])
        return self._size

    @property
    def device(self) -> torch.device:
        return self.before.device

    def _trajectories(self, chosen: torch.Tensor) -> torch.Tensor:
        """The trajectories (positions in the index) of the eligible ones ``chosen`` (positions in this table)."""
        found = self._found
        if found is None or found[0] is not chosen:
            found = self._found = (chosen, torch.searchsorted(self.before, chosen + 1))
        return found[1]

    def draw(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, offsets)`` from uniform float64 draws ``u``: the integer part of ``u * size`` picks the
        trajectory, the fractional part the start offset."""
        draw = u.mul_(self.n_float)
        chosen = draw.long()
        return chosen, self.offsets(chosen, draw.sub_(chosen))

    def offsets(self, chosen: torch.Tensor, frac: torch.Tensor) -> torch.Tensor:
        """Start offsets (relative to each trajectory's first step) from uniform draws ``frac`` in [0, 1)."""
        count = self._count.index_select(0, self._trajectories(chosen))
        offsets = frac.mul_(count.double().mul_(_BELOW_ONE)).long()
        return offsets.add_(self.low) if self.low else offsets

    def starts_at(self, chosen: torch.Tensor) -> torch.Tensor:
        return self.index.dense_starts.index_select(0, self._trajectories(chosen))

    def lengths_at(self, chosen: torch.Tensor) -> torch.Tensor:
        return self.index.dense_lengths.index_select(0, self._trajectories(chosen))
