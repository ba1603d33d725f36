"""Trajectory boundaries of a 1-D ring storage, updated on each append: :class:`TrajectoryEnds`.

NOTE [live trajectory index]
Every row appended after the newest one gets the next *time* ``t`` (0, 1, 2, ... in write order). A storage
of ``n`` filled rows holds the times ``[first, total)`` with ``first = total - n``, and the row at unrolled
position ``u`` (see :mod:`.layout`) holds time ``first + u``. A trajectory is a run of times that ends at
an entry of ``ends`` (sorted, inclusive) and starts one after the previous entry (``first`` for the oldest one),
so the index is the sorted list of ends and nothing per row. Each trajectory ever indexed has a *serial*
number (its position in ``ends`` plus a base that moves when the buffer is compacted), which never changes while
it is held: a trajectory that grows keeps its serial, and one removed by overwrites leaves from the front.

An append of ``k`` rows (a write continuing the ring at the newest row) costs ``O(k)``: the ends found in the
new rows are pushed at the back (the newest trajectory is extended when the new rows continue it) and the ends
older than ``first`` are popped at the front (the rows overwritten); the oldest trajectory left is cut to start
at ``first``. Only the oldest trajectory (cut) and the newest one (grown) change length, so the trajectories
long enough for a slice (``length >= need``) are kept as a deque of serials per ``need``, updated at its two
ends. The boundaries are those :func:`.ends.find_trajectories` finds from scratch for the same content
(tested against it).

Memory: 8 bytes per trajectory for ``ends`` and 8 per trajectory of each eligible deque, in buffers at most twice
the entries they hold.
"""

from __future__ import annotations

import numpy as np
import torch

from torchrl.data.replay_buffers.trajectories.layout import TrajectoryIndex

_MIN_SIZE = 16


class _Buffer:
    """A growable int64 deque: ``values[head:tail]`` are the entries; position ``i`` holds entry ``base + i``.

    ``limit`` is the most entries it ever holds: the buffer never grows past ``limit + 16`` entries.
    """

    __slots__ = ("values", "head", "tail", "base", "limit")

    def __init__(self, values: np.ndarray | None, limit: int):
        values = np.zeros(0, dtype=np.int64) if values is None else np.asarray(values, dtype=np.int64)
        self.limit = int(limit)
        self.values = np.zeros(min(max(_MIN_SIZE, 2 * values.size), self.limit + _MIN_SIZE), dtype=np.int64)
        self.values[: values.size] = values
        self.head, self.tail, self.base = 0, values.size, 0

    def __len__(self) -> int:
        return self.tail - self.head

    def live(self) -> np.ndarray:
        """A view of the entries."""
        return self.values[self.head : self.tail]

    def push(self, new: np.ndarray) -> None:
        """Appends the entries ``new``; compacts or grows the buffer when it is full (amortized ``O(len(new))``)."""
        k = new.size
        if not k:
            return
        if self.tail + k > self.values.size:
            live = self.tail - self.head
            size = self.values.size
            if live + k > size // 2 or size > 4 * max(live + k, _MIN_SIZE):  # grow, or shrink a sparse buffer
                size = max(live + k, min(max(_MIN_SIZE, 2 * (live + k)), self.limit + _MIN_SIZE))
            values = np.zeros(size, dtype=np.int64) if size != self.values.size else self.values
            values[:live] = self.values[self.head : self.tail]
            self.values = values
            self.base += self.head
            self.head, self.tail = 0, live
        self.values[self.tail : self.tail + k] = new
        self.tail += k

    def pop_back(self) -> None:
        self.tail -= 1

    def nbytes(self) -> int:
        return self.values.nbytes


class TrajectoryEnds:
    """The trajectories of a 1-D ring storage as sorted trajectory ends in write time (see the module NOTE).

    Args:
        capacity (int): the rows of the storage (the ring size).
        is_done (bool): the boundaries come from done flags (``True``) or from trajectory ids (``False``).
        ends (np.ndarray): the time of the last step of each trajectory of the ``n_rows`` filled rows,
            increasing, the last one ``first + n_rows - 1``.
        n_rows (int): the filled rows.

    Keyword Args:
        first (int): the time of the oldest row, a multiple of ``capacity`` plus the storage row of the oldest
            step (``0`` while the ring is not full). Defaults to ``0``.
    """

    def __init__(self, capacity: int, is_done: bool, ends: np.ndarray, n_rows: int, *, first: int = 0):
        self.capacity = int(capacity)
        self.is_done = bool(is_done)
        self.total = int(first) + int(n_rows)  # the time of the next row appended
        self.n_rows = int(n_rows)
        self._ends = _Buffer(ends, self.capacity)
        self._eligible: dict[int, _Buffer] = {}

    # -- layout ----------------------------------------------------------------------------------------------
    @property
    def first(self) -> int:
        """The time of the oldest row held."""
        return self.total - self.n_rows

    @property
    def last_row(self) -> int:
        """The storage row of the newest step."""
        return (self.total - 1) % self.capacity

    @property
    def offset(self) -> int:
        """The storage row of unrolled position ``0`` (``0`` while the ring is not full)."""
        return self.total % self.capacity if self.n_rows == self.capacity else 0

    def row_of_time(self, t: int) -> int:
        return t % self.capacity

    @property
    def num_trajectories(self) -> int:
        return len(self._ends)

    def nbytes(self) -> int:
        """The bytes held by the index (ends and eligible deques)."""
        return self._ends.nbytes() + sum(buf.nbytes() for buf in self._eligible.values())

    # -- writes ----------------------------------------------------------------------------------------------
    def append(self, values: np.ndarray, previous) -> None:
        """Indexes ``k = len(values)`` rows appended after the newest one (``k < capacity``).

        ``values`` are their done flags (bool) or trajectory ids, in write order; ``previous`` is the value of the
        row that was the newest before them (ignored when the storage was empty).
        """
        k = values.size
        if not k:
            return
        ends = self._ends
        old_tail_serial = ends.base + ends.tail
        t = self.total
        n_rows = min(self.capacity, self.n_rows + k)
        first = t + k - n_rows  # the oldest time held after the write (the ends before it were overwritten)
        live = ends.live()
        if (
            live.size and live[0] < first
        ):  # trajectories removed whole by the overwrite (never the newest: k < capacity)
            ends.head += int(np.searchsorted(live, first, side="left"))
        if self.n_rows:
            continues = (not bool(previous)) if self.is_done else bool(previous == values[0])
            if continues:  # the newest trajectory goes on: its forced end (the old newest row) goes away
                ends.pop_back()
        if self.is_done:
            inner = np.flatnonzero(values[:-1])
        else:
            inner = np.flatnonzero(values[:-1] != values[1:])
        new = np.empty(inner.size + 1, dtype=np.int64)
        np.add(inner, t, out=new[:-1])
        new[-1] = t + k - 1  # every stream ends at its newest row
        ends.push(new)
        self.total, self.n_rows = t + k, n_rows
        for need, deque in self._eligible.items():
            self._update_eligible(need, deque, old_tail_serial - 1)

    # -- trajectories ----------------------------------------------------------------------------------------
    def _bounds(self, serials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start time, length)`` of the trajectories ``serials``."""
        ends = self._ends
        pos = serials - ends.base
        end = ends.values[pos]
        before = ends.values[np.maximum(pos - 1, 0)] + 1
        start = np.where(pos == ends.head, self.first, before)
        return start, end - start + 1

    def _update_eligible(self, need: int, deque: _Buffer, grown_from: int) -> None:
        ends = self._ends
        values = ends.values
        head_serial = ends.base + ends.head
        if deque.tail > deque.head and deque.values[deque.head] < head_serial:
            live = deque.live()
            deque.head += int(np.searchsorted(live, head_serial, side="left"))
        if deque.tail > deque.head and deque.values[deque.head] == head_serial:
            if int(values[ends.head]) - self.first + 1 < need:
                deque.head += 1  # the oldest trajectory, cut too short
        low = max(grown_from, head_serial)
        top = ends.base + ends.tail
        newest = int(deque.values[deque.tail - 1]) if deque.tail > deque.head else -1
        if top - low <= 8:  # the common case: one or a few trajectories grew or started
            keep = []
            for serial in range(max(low, newest + 1), top):
                pos = serial - ends.base
                start = self.first if pos == ends.head else int(values[pos - 1]) + 1
                if int(values[pos]) - start + 1 >= need:
                    keep.append(serial)
            if keep:
                deque.push(np.array(keep, dtype=np.int64))
            return
        serials = np.arange(max(low, newest + 1), top, dtype=np.int64)
        _, lengths = self._bounds(serials)
        deque.push(serials[lengths >= need])

    def all_serials(self) -> tuple[int, int]:
        """``(first serial, number of trajectories)``."""
        ends = self._ends
        return ends.base + ends.head, len(ends)

    def eligible(self, need: int) -> np.ndarray:
        """The serials of the trajectories of at least ``need`` steps, oldest first (a view; do not modify)."""
        deque = self._eligible.get(need)
        if deque is None:
            first, n = self.all_serials()
            serials = np.arange(first, first + n, dtype=np.int64)
            _, lengths = self._bounds(serials)
            deque = self._eligible[need] = _Buffer(serials[lengths >= need], self.capacity // need)
        return deque.live()

    def trajectories(self, serials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, length)`` of the trajectories ``serials``, starts in unrolled positions."""
        start, length = self._bounds(serials)
        return start - self.first, length

    def all_trajectories(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of every trajectory, oldest first, starts in unrolled positions."""
        live = self._ends.live()
        starts = np.empty_like(live)
        starts[0] = self.first
        starts[1:] = live[:-1] + 1
        return starts - self.first, live - starts + 1

    def locate(self, unrolled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, last)`` unrolled positions of the trajectory holding each unrolled position."""
        live = self._ends.live()
        times = unrolled + self.first
        pos = np.searchsorted(live, times, side="left")
        last = live[pos]
        before = live[np.maximum(pos - 1, 0)] + 1
        start = np.where(pos == 0, self.first, before)
        return start - self.first, last - self.first


class LiveEligible:
    """The trajectories a slice of ``slice_len`` steps may come from, read from a :class:`TrajectoryEnds`.

    The same table as a slice sampler's from-scratch one (trajectories oldest first, the same start ranges and the
    same float64 factors), computed only for the trajectories drawn.

    Args:
        index (TrajectoryEnds): the index.
        slice_len (int): the steps of a slice.
        left, right (int): the span steps a slice may start before / end after its trajectory.
        strict_length (bool): only trajectories holding a full slice (``length + left + right >= slice_len``).
    """

    _BELOW_ONE = 1.0 - 2.0**-52

    def __init__(self, index: TrajectoryEnds, slice_len: int, left: int, right: int, strict_length: bool):
        self.index = index
        self.slice_len, self.right, self.strict = slice_len, right, strict_length
        self.low = -left
        need = slice_len - left - right
        self.serials = index.eligible(need) if strict_length and need > 1 else None
        if self.serials is None:
            self._first, self._size = index.all_serials()
        else:
            self._first, self._size = 0, int(self.serials.size)
        self.n_float = self._size * self._BELOW_ONE
        # every slice lies inside its trajectory: no span, and each trajectory holds a full slice (strict_length,
        # or all of them long enough: the eligible deque of that length holds them all, O(1) once it is built)
        self.all_full = left == right == 0 and (
            strict_length or slice_len <= 1 or index.eligible(slice_len).size == index.num_trajectories
        )
        self._picked = None

    @property
    def size(self) -> int:
        return self._size

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def _pick(self, positions: np.ndarray):
        """``(starts, lengths, count_float)`` (numpy) of the trajectories at ``positions`` of this table."""
        serials = self.serials[positions] if self.serials is not None else positions + self._first
        starts, lengths = self.index.trajectories(serials)
        count = lengths - self.slice_len + self.right
        if not self.strict:
            np.maximum(count, self.low, out=count)
        count += 1 - self.low
        return starts, lengths, count.astype(np.float64) * self._BELOW_ONE

    def draw(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, offsets)`` from uniform float64 draws ``u``, as a slice sampler's from-scratch table gives:
        the integer part of ``u * size`` picks the trajectory, the fractional part the start offset."""
        draw = u.numpy() * self.n_float
        chosen = draw.astype(np.int64)
        return torch.from_numpy(chosen), self._offsets(chosen, draw - chosen)

    def offsets(self, chosen: torch.Tensor, frac: torch.Tensor) -> torch.Tensor:
        """Start offsets of the trajectories ``chosen`` from uniform draws ``frac`` in ``[0, 1)``."""
        return self._offsets(chosen.numpy(), frac.numpy())

    def _offsets(self, positions: np.ndarray, frac: np.ndarray) -> torch.Tensor:
        starts, lengths, count_float = self._pick(positions)
        offsets = (frac * count_float).astype(np.int64)
        if self.low:
            offsets += self.low
        self._picked = (positions, torch.from_numpy(starts), torch.from_numpy(lengths))
        return torch.from_numpy(offsets)

    def _picked_for(self, chosen: torch.Tensor):
        picked = self._picked
        positions = chosen.numpy()
        if picked is None or not np.array_equal(picked[0], positions):
            starts, lengths, _ = self._pick(positions)
            picked = self._picked = (positions, torch.from_numpy(starts), torch.from_numpy(lengths))
        return picked

    def starts_at(self, chosen: torch.Tensor) -> torch.Tensor:
        return self._picked_for(chosen)[1].clone()

    def lengths_at(self, chosen: torch.Tensor) -> torch.Tensor:
        return self._picked_for(chosen)[2]

    def all_lengths(self) -> torch.Tensor:
        """The lengths of every trajectory held (for error messages)."""
        return torch.from_numpy(self.index.all_trajectories()[1])


class LiveTrajectoryIndex:
    """A :class:`~.layout.TrajectoryIndex` view of a :class:`TrajectoryEnds`: the same layout and position
    maps; ``starts``/``lengths`` (every trajectory, ``O(T)``) are built on first access only.

    Args:
        ends (TrajectoryEnds): the index, at the state it has now (a later write makes a new view).
    """

    _EMPTY = torch.zeros(0, dtype=torch.long)

    def __init__(self, ends: TrajectoryEnds):
        self.ends = ends
        self.n_rows, self.n_cols, self.offset, self.ndim = ends.n_rows, 1, ends.offset, 1
        self._layout = TrajectoryIndex(
            starts=self._EMPTY, lengths=self._EMPTY, n_rows=ends.n_rows, n_cols=1, offset=ends.offset, ndim=1
        )
        self._all: tuple[torch.Tensor, torch.Tensor] | None = None

    def _trajectories(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._all is None:
            starts, lengths = self.ends.all_trajectories()
            self._all = (torch.from_numpy(starts), torch.from_numpy(lengths))
        return self._all

    @property
    def starts(self) -> torch.Tensor:
        return self._trajectories()[0]

    @property
    def lengths(self) -> torch.Tensor:
        return self._trajectories()[1]

    def storage_rows(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._layout.storage_rows(flat)

    def storage_index(self, flat: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return self._layout.storage_index(flat)
