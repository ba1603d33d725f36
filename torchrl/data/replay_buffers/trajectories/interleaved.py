"""Interleaved trajectories: the live index of trajectories whose steps are spread over the storage.

When several environments or collectors write into one buffer step by step, the steps of one trajectory are not
contiguous in the storage: they are found by a trajectory id (``traj_key``) and ordered by a step counter
(``step_key``). :class:`InterleavedRuns` keeps them as *runs*, maximal stretches of consecutive steps of one
trajectory (a missing step splits a trajectory into two runs), which slice samplers, sample units, HER and queries
cut windows from (``SliceSampler(fragmented=True, step_key=...)``).

Contract (what the readers use; names are stable):

- ``InterleavedRuns(traj_key, step_key)``: ``traj_key=None`` probes the storage at the first :meth:`refresh` for
  ``("collector", "traj_ids")``, then ``"episode"`` (TorchRL's probe), and keeps the key found in ``traj_key``.
- ``refresh(storage) -> None``: brings the index up to date with ``storage`` (every write completed before the
  call). After it, numpy-backed int64 tensors, valid until the next :meth:`refresh` (they may be views of buffers
  that refresh rewrites: copy what you keep longer; never modify them):

  - ``slots`` ``[M]``: the storage *cells* of the ``M`` live steps, sorted by (trajectory id, step). A cell is the
    storage row for a 1-D storage and ``row * n_cols + col`` (row-major) for an ``ndim=2`` storage: map it back
    with ``row, col = divmod(cell, n_cols)``, or :meth:`storage_index` (the tuple ``storage.get`` takes);
  - ``steps`` ``[M]`` and ``traj`` ``[M]``: the step and trajectory id of each entry of ``slots`` (decoded on first
    access after a change);
  - ``run_start`` ``[R]``: the position in ``slots`` of the first step of each run, increasing;
    ``run_length`` ``[R]``: its steps; ``run_traj`` ``[R]``: its trajectory id (``run_start`` and ``run_traj``
    derived on first access after a change); ``run_starts_of(run_ids)``: ``run_start`` of a few runs (numpy,
    without deriving every start). Runs are ordered by
    (trajectory id, first step): the order depends only on the stored content, not on the history of writes, so
    every process indexing the same content has the same runs.
- ``window_slots(run_ids, offsets, length) -> [n, length]``: the cells of windows of ``length`` steps starting
  ``offsets`` steps into the runs ``run_ids`` (one gather); a step past a run's end repeats its last cell (the
  caller masks or drops it).
- ``storage_index(cells)``: ``(index tuple for storage.get, cells)``; ``locate(cells)``: ``(live, run, offset)`` of
  storage cells (numpy; a binary search each); ``eligible(need)``: the runs of at least ``need`` steps;
  ``longest()`` / :func:`check_run_length`: whether a run holds ``need`` steps; ``as_trajectories()``: the runs as
  contiguous trajectories for slice samplers (:class:`RunTrajectories`); ``version``: bumped at every change (key
  caches on it); ``rebuilds`` / ``catch_ups``: how the index followed the writes.

NOTE [interleaved runs index]
The index keeps, per storage cell, the (trajectory id, step) it holds as the composite key
``(id - id_low) * 2**32 + step``, and the live keys sorted with their cells in a buffer (``[head, tail)`` in use);
a step continues a run when its key is the previous one plus 1. It follows the storage through the same shared
append counters as the contiguous live index (NOTE [catching up on appends] in ``sync.py``): at the first draw after
writes of ``k`` rows after the newest one, it reads only those rows (``k * n_cols`` values per key), removes the
keys they overwrote and inserts the new ones (a binary search each). Overwritten rows are the oldest steps, at the
front of the oldest trajectories, and new steps extend the newest trajectories, at the back when ids grow with time
(as collectors number them): the survivors of the front are packed towards the middle, the back is shifted to make
room, and the runs are found again there only; the runs in between keep their buffer positions. The runs are kept
the same way, their starts (buffer positions) and lengths in buffers with a head and a tail: the front runs are
replaced by moving the head, the back ones at the tail, and a run in between keeps its position there (its
*serial*), so the runs long enough for a window are kept as sorted serials per length, updated at both ends too
(what the slice samplers draw from: the same table, so the same windows, as one built from scratch). The contract's
tensors are views of these buffers, and what needs every run (``run_start``, which subtracts the head, ``run_traj``,
``longest``) is derived on first access. A catch-up then costs ``O(k + keys moved + runs changed)``, amortized (a
buffer that runs out of room is copied whole), up to ``O(M)`` when the writes land in the middle of the order (ids
not growing with time). Anything else (a write elsewhere, ``empty``, a load, ``k >= capacity``) rebuilds it from the
whole storage, as do ids outside the composite range (they are then sorted as pairs at each change).
Draws between writes read only the index: a window is ``slots[run_start[r] + offset + arange(length)]``, so its
cost does not depend on the number of stored steps.
Each process keeps its own copy (pickling keeps only the keys): a DataLoader worker or another process writing into
a shared storage builds it from the shared content and catches up through the shared counters, as the contiguous
index does. Every value read is checked before the index changes (a refused refresh leaves the index as it was).

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage
    >>> storage = LazyTensorStorage(10)
    >>> traj = torch.tensor([0, 1, 0, 1, 0, 1, 0])
    >>> step = torch.tensor([0, 0, 1, 1, 2, 3, 3])  # trajectory 1 misses step 2
    >>> storage.set(torch.arange(7), TensorDict(traj=traj, step_count=step, batch_size=[7]))
    >>> runs = InterleavedRuns("traj", "step_count")
    >>> runs.refresh(storage)
    >>> runs.slots.tolist(), runs.run_start.tolist(), runs.run_length.tolist(), runs.run_traj.tolist()
    ([0, 2, 4, 6, 1, 3, 5], [0, 4, 6], [4, 2, 1], [0, 1, 1])
    >>> runs.window_slots(torch.tensor([0]), torch.tensor([1]), 3)
    tensor([[2, 4, 6]])
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool
from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.tensor import TensorStorage
from torchrl.data.replay_buffers.trajectories.keys import normalize_key, trajectory_keys
from torchrl.data.replay_buffers.trajectories.layout import ring_layout
from torchrl.data.replay_buffers.trajectories.live_index import LiveEligible

__all__ = [
    "InterleavedRuns",
    "RunTrajectories",
    "check_fragmented_step_key",
    "check_run_length",
    "entry_values",
    "resolve_traj_key",
    "too_short_error",
]

#: TorchRL's probe without ``traj_key``: ``("collector", "traj_ids")``, then ``"episode"``.
PROBED_KEYS = trajectory_keys(exclude=("traj_ids",))

FRAGMENTED_STEP_KEY = TorchRLPhrase(
    ValueError,
    "step_key must be provided when fragmented=True",
    "step_key must be provided when fragmented=True: it names the entry holding each step's number within its "
    "trajectory (got step_key=None). Pass step_key='step_count' (the default) or the entry your collector writes.",
)
FRAGMENTED_NO_TRAJ = TorchRLPhrase(
    RuntimeError,
    "fragmented=True requires a trajectory identifier under traj_key; end-of-trajectory flags alone cannot "
    "reconstruct interleaved data",
    "fragmented=True requires a trajectory identifier under traj_key; end-of-trajectory flags alone cannot "
    "reconstruct interleaved data. The storage holds none of {tried}: pass traj_key=<the entry holding one id per "
    "step> (e.g. ('collector', 'traj_ids') as collectors write it).",
)
FRAGMENTED_STORAGE = TorchRLPhrase(
    TypeError,
    "Fragmented trajectory indexing requires a single-dimensional storage whose slices return a tensor collection",
    "Fragmented trajectory indexing requires a single-dimensional storage whose slices return a tensor collection "
    "(or an ndim=2 tensor storage); this {storage} returns {got}. Use a LazyTensorStorage, LazyMemmapStorage or "
    "LazyStackStorage of TensorDicts.",
)
FRAGMENTED_NOT_TENSOR = TorchRLPhrase(
    TypeError,
    "must contain a tensor",
    "The entry key={key!r} must contain a tensor (one integer per stored step) for fragmented trajectories, got "
    "{got}. Name a tensor entry.",
)
FRAGMENTED_NOT_SCALAR = TorchRLPhrase(
    RuntimeError,
    "Expected scalar values under key=",
    "Expected scalar values under key={key!r}: one value per stored step (shape {per_step}, a trailing 1 allowed), "
    "got shape {shape}. Store one trajectory id and one step number per step.",
)
FRAGMENTED_NOT_INTEGER = TorchRLPhrase(
    TypeError,
    "must contain integer values",
    "The entry key={key!r} must contain integer values (trajectory ids and step numbers), got dtype {dtype}. Store "
    "it as an integer tensor (e.g. torch.long).",
)
FRAGMENTED_NEGATIVE_STEP = TorchRLPhrase(
    ValueError,
    "Step numbers must be non-negative",
    "Step numbers must be non-negative: key={key!r} holds {value}. Count the steps of each trajectory from 0.",
)
FRAGMENTED_DUPLICATE = TorchRLPhrase(
    RuntimeError,
    "Found duplicate records for trajectory",
    "Found duplicate records for trajectory {traj} at step {step} (under {traj_key!r} and {step_key!r}). "
    "Trajectory-step pairs must be unique in the live storage: give each episode its own id (an id reused with "
    "its step count restarting at 0 collides with its older steps still held).",
)
FRAGMENTED_TOO_SHORT = TorchRLPhrase(
    RuntimeError,
    "Did not find a single fragmented trajectory run with sufficient length",
    "Did not find a single fragmented trajectory run with sufficient length (length range: {low} - {high} / "
    "required={need}). Lower the slice length (or raise num_slices), or pass strict_length=False to also sample "
    "shorter slices.",
)

_STEP_BITS = 32
_STEP_LIMIT = (1 << _STEP_BITS) - 1  # steps below it, ids within 2**30 of the lowest: composite keys
_ID_RANGE = 1 << 30
_EMPTY = np.zeros(0, dtype=np.int64)


def check_fragmented_step_key(fragmented, step_key) -> bool:
    """``fragmented`` checked to be a bool (returned), and, when it is ``True``, a ``step_key`` given: what every
    reader of interleaved trajectories (slice samplers, sample units, HER, queries) asks of its arguments."""
    fragmented = check_bool("fragmented", fragmented, hint="Pass fragmented=True for interleaved steps.")
    if fragmented and step_key is None:
        raise FRAGMENTED_STEP_KEY.error()
    return fragmented


def too_short_error(lengths: torch.Tensor, need: int) -> BaseException:
    """TorchRL's error when no run of ``lengths`` steps holds ``need`` steps (``strict_length=True``)."""
    low, high = (int(lengths.min()), int(lengths.max())) if lengths.numel() else (0, 0)
    return FRAGMENTED_TOO_SHORT.error(low=low, high=high, need=need)


def check_run_length(runs: InterleavedRuns, need: int) -> None:
    """Raises TorchRL's error when no run of ``runs`` holds ``need`` steps (``strict_length=True``)."""
    if runs.longest() < need:
        raise too_short_error(runs.run_length, need)


class InterleavedRuns:
    """The runs of consecutive steps of each trajectory of a storage (see the module docstring for the contract).

    Args:
        traj_key (NestedKey, optional): the entry holding one trajectory id per step; ``None`` probes the storage.
        step_key (NestedKey): the entry holding the step number of each step within its trajectory.
    """

    def __init__(self, traj_key=None, step_key="step_count"):
        self.traj_key = None if traj_key is None else normalize_key(traj_key)
        self.step_key = normalize_key(step_key)
        self._probed = traj_key is None
        self.rebuilds = 0
        self.catch_ups = 0
        self.reset()

    def reset(self) -> None:
        """Forgets the index (the next :meth:`refresh` rebuilds it)."""
        self._storage_id = None
        self._label = None  # (revision, appended) of the content held
        self.version = 0  # bumped at every change: readers key their caches on (id(self), version)
        self.n_rows, self.n_cols, self.ndim, self._last = 0, 1, 1, -1
        self._cell_key = _EMPTY  # per cell: its composite key, -1 when not live (composite mode)
        self._low = 0
        self._composite = True
        self._install(_EMPTY, _EMPTY)

    def __getstate__(self):
        return {"traj_key": None if self._probed else self.traj_key, "step_key": self.step_key}

    def __setstate__(self, state):
        self.__init__(state["traj_key"], state["step_key"])

    # -- reading the storage ---------------------------------------------------------------------------------
    def _resolve(self, storage) -> None:
        self.traj_key = resolve_traj_key(storage, self.traj_key)

    def _read(self, storage, rows: np.ndarray | None, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, steps)`` int64 of the cells of ``rows`` (``None``: the ``n_rows`` filled rows), checked."""
        out = []
        for key in (self.traj_key, self.step_key):
            if isinstance(storage, TensorStorage):
                column = storage.get_entry(key)
                if column is None:
                    raise _missing(key, storage)
                value = column[:n_rows] if rows is None else column[torch.from_numpy(rows).to(column.device)]
            else:
                value = _entry_of_items(storage, key, n_rows if rows is None else rows)
            count = n_rows if rows is None else rows.size
            out.append(entry_values(value, key, count, self.n_cols))
        ids, steps = out
        if steps.size and steps.min() < 0:
            raise FRAGMENTED_NEGATIVE_STEP.error(key=self.step_key, value=int(steps.min()))
        return ids, steps

    # -- keeping up with the storage -------------------------------------------------------------------------
    def refresh(self, storage) -> None:
        """Brings the index up to date with every write to ``storage`` completed before the call."""
        self._resolve(storage)
        state = storage.append_state() if isinstance(storage, TensorStorage) else None
        if state is not None and state[0] is not None and id(storage) == self._storage_id:
            revision, appended, broken = state
            if self._label is not None and revision == self._label[0]:
                return
            if self._label is not None and self._catch_up(storage, state):
                return
        self._rebuild(storage, state)

    def _rebuild(self, storage, state) -> None:
        n_rows, n_cols, _, last_row = ring_layout(storage)
        self.n_cols = n_cols
        ids, steps = self._read(storage, None, n_rows)
        low = int(ids.min()) if ids.size else 0
        composite = not ids.size or (int(ids.max()) - low < _ID_RANGE and int(steps.max()) < _STEP_LIMIT)
        if composite:
            key = ((ids - low) << _STEP_BITS) | steps
            order = np.argsort(key, kind="stable")
            sorted_key = key[order]
            self._check_unique(sorted_key[1:] == sorted_key[:-1], ids[order], steps[order])
            capacity = int(storage.max_size) if isinstance(storage, TensorStorage) else ids.size
            cell_key = np.full(max(capacity, ids.size), -1, dtype=np.int64)
            cell_key[: ids.size] = key
            self._cell_key, self._low = cell_key, low
        else:  # ids too far apart or huge steps: sorted by (id, step) each time
            order = np.lexsort((steps, ids))
            s_ids, s_steps = ids[order], steps[order]
            self._check_unique((s_ids[1:] == s_ids[:-1]) & (s_steps[1:] == s_steps[:-1]), s_ids, s_steps)
            self._cell_key = _EMPTY
        self._composite = composite
        self.n_rows, self.ndim, self._last = n_rows, storage.ndim, last_row
        order = order.astype(np.int64, copy=False)
        if composite:
            self._install(sorted_key, order)
        else:
            self._set_sorted(order, s_ids, s_steps)
        self._storage_id = id(storage)
        self._label = None if state is None or state[0] is None else (state[0], state[1])
        self.rebuilds += 1

    def _catch_up(self, storage, state) -> bool:
        """Applies the rows appended since the label (NOTE [interleaved runs index]); ``False``: rebuild."""
        revision, appended, broken = state
        capacity = int(storage.max_size) // self.n_cols  # rows
        k = appended - self._label[1]
        if not self._composite or broken > self._label[0] or not 0 <= k < capacity:
            return False
        n_rows, n_cols, _, last_row = ring_layout(storage)
        if (
            n_cols != self.n_cols
            or n_rows != min(capacity, self.n_rows + k)
            or last_row != (self._last + k) % capacity
        ):
            return False  # a write in flight, or the layout moved otherwise: read everything
        rows = np.arange(self._last + 1, self._last + 1 + k) % capacity
        cells = (rows[:, None] * n_cols + np.arange(n_cols)).reshape(-1)
        ids, steps = self._read(storage, rows, n_rows)
        if ids.size and (int(ids.min()) < self._low or int(ids.max()) - self._low >= _ID_RANGE):
            return False
        if steps.size and int(steps.max()) >= _STEP_LIMIT:
            return False
        new = ((ids - self._low) << _STEP_BITS) | steps
        old = self._cell_key[cells]
        old = old[old >= 0]
        key = self._key
        gone = np.sort(np.searchsorted(key, old))  # positions of the keys overwritten
        order = np.argsort(new, kind="stable")
        new, new_cells = new[order], cells[order]
        at = np.minimum(np.searchsorted(key, new), max(key.size - 1, 0))
        clash = np.zeros(new.size, dtype=bool)
        clash[1:] = new[1:] == new[:-1]
        if key.size:
            same = key[at] == new
            if same.any():  # a key equal to one being overwritten is no duplicate
                same[same] = ~np.isin(at[same], gone)
            clash |= same
        self._check_unique(clash, ids[order], steps[order])
        # checked: install
        self._cell_key[cells] = ((ids - self._low) << _STEP_BITS) | steps
        self.n_rows, self._last = n_rows, last_row
        self._merge(gone, new, new_cells)
        self._label = (revision, appended)
        self.catch_ups += 1
        return True

    def _check_unique(self, same: np.ndarray, ids: np.ndarray, steps: np.ndarray) -> None:
        hit = np.flatnonzero(same)
        if hit.size:
            i = int(hit[0]) + (1 if same.size < ids.size else 0)
            raise FRAGMENTED_DUPLICATE.error(
                traj=int(ids[i]), step=int(steps[i]), traj_key=self.traj_key, step_key=self.step_key
            )

    # composite mode: NOTE [interleaved runs index], the keys and cells in buffers, [head, tail) in use
    def _install(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Puts sorted composite ``keys`` and their cells in fresh buffers and finds every run."""
        m = keys.size
        self._kbuf = np.empty(max(16, 2 * m), dtype=np.int64)
        self._sbuf = np.empty_like(self._kbuf)
        self._kbuf[:m], self._sbuf[:m] = keys, slots
        self._head, self._tail = 0, m
        self._set_runs(*self._runs_between(0, m))
        self._publish()

    def _runs_between(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of the runs of buffer positions ``[lo, hi)``, cut at ``lo``: a key continues a run
        when it is the previous key plus 1 (the same trajectory, the next step)."""
        key = self._kbuf[lo:hi]
        split = np.ones(hi - lo, dtype=bool)
        if hi - lo > 1:
            np.not_equal(key[1:] - key[:-1], 1, out=split[1:])
        starts = np.flatnonzero(split) + lo
        return starts, np.diff(starts, append=hi)

    def _merge(self, gone: np.ndarray, new: np.ndarray, new_cells: np.ndarray) -> None:
        """Removes the keys at positions ``gone`` (relative to the head, sorted), inserts sorted ``new`` keys with
        their cells, and finds the runs again only where keys moved: the front (overwritten rows are the oldest
        steps, at the front of the oldest trajectories) and the back (new steps, at the back of the newest ones);
        the runs between keep their buffer positions and their serials. ``O(k + moved + runs changed)``; anything
        else costs ``O(M)``."""
        head, tail, kb, sb = self._head, self._tail, self._kbuf, self._sbuf
        full, d_end, a0 = False, -1, -1
        if gone.size:  # survivors of [head, d_end] packed towards d_end: the positions after it do not move
            d_end = head + int(gone[-1])
            keep = np.ones(d_end + 1 - head, dtype=bool)
            keep[gone] = False
            kb[head + gone.size : d_end + 1] = kb[head : d_end + 1][keep]
            sb[head + gone.size : d_end + 1] = sb[head : d_end + 1][keep]
            head += gone.size
        if new.size:
            if tail + new.size > kb.size:  # no room after the tail: re-centred (every position moves)
                m = tail - head
                kb = np.empty(max(kb.size, 2 * (m + new.size)), dtype=np.int64)
                sb = np.empty_like(kb)
                kb[:m], sb[:m] = self._kbuf[head:tail], self._sbuf[head:tail]
                self._kbuf, self._sbuf, head, tail, full = kb, sb, 0, m, True
            at = np.searchsorted(kb[head:tail], new)
            a0 = head + int(at[0])
            at -= a0 - head
            kb[a0 : tail + new.size] = np.insert(kb[a0:tail], at, new)
            sb[a0 : tail + new.size] = np.insert(sb[a0:tail], at, new_cells)
            tail += new.size
        self._head, self._tail = head, tail
        rh, rt, rs = self._rh, self._rt, self._rs
        runs = rs[rh:rt]
        ix = rh if d_end < 0 else rh + int(np.searchsorted(runs, d_end, side="right"))  # first run kept
        iy = rt if a0 < 0 else rh + int(np.searchsorted(runs, a0 - 1, side="right")) - 1  # first run redone
        if full or rh == rt or ix >= rt or (a0 >= 0 and (a0 == head or iy < ix)):
            self._set_runs(*self._runs_between(head, tail))
        else:
            front = self._runs_between(head, int(rs[ix])) if d_end >= 0 else (_EMPTY, _EMPTY)
            back = self._runs_between(int(rs[iy]), tail) if a0 >= 0 else (_EMPTY, _EMPTY)
            self._replace_runs(ix, iy, front, back)
        self._publish()

    # the runs in buffers too: serials [_rh, _rt) hold their starts (buffer positions) and lengths; a run keeps its
    # serial while it is held unchanged, so the runs of at least ``need`` steps are kept as sorted serials
    # (``_sets[need]``: [buffer, head, tail]) updated where runs changed
    def _set_runs(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Puts every run in fresh run buffers and forgets the eligible sets (``O(R)``)."""
        r = starts.size
        self._rs = np.empty(max(16, 2 * r), dtype=np.int64)
        self._rl = np.empty_like(self._rs)
        self._rs[:r], self._rl[:r] = starts, lengths
        self._rh, self._rt = 0, r
        self._sets: dict[int, list] = {}

    def _replace_runs(self, ix: int, iy: int, front: tuple, back: tuple) -> None:
        """Replaces the runs of serials ``[_rh, ix)`` with ``front`` and ``[iy, _rt)`` with ``back`` (``(starts,
        lengths)``), the runs between untouched; the eligible sets follow. ``O(runs changed)``, or ``O(R)`` when
        the buffers have no room left."""
        rs, rl = self._rs, self._rl
        nf, nb = front[0].size, back[0].size
        lo = ix - nf
        if lo < 0 or iy + nb > rs.size:  # no room: every run in fresh buffers
            self._set_runs(
                np.concatenate([front[0], rs[ix:iy], back[0]]), np.concatenate([front[1], rl[ix:iy], back[1]])
            )
            return
        rs[lo:ix], rl[lo:ix] = front
        rs[iy : iy + nb], rl[iy : iy + nb] = back
        self._rh, self._rt = lo, iy + nb
        for need, found in list(self._sets.items()):
            buf, h, t = found
            h += int(np.searchsorted(buf[h:t], ix))  # serials before ix left
            t = h + int(np.searchsorted(buf[h:t], iy))  # serials from iy were redone
            first = np.flatnonzero(front[1] >= need) + lo
            last = np.flatnonzero(back[1] >= need) + iy
            if first.size > h:  # no room before the head (runs split): found again
                del self._sets[need]
                continue
            buf[h - first.size : h] = first
            h -= first.size
            if t + last.size > buf.size:
                live = t - h
                grown = np.empty(max(16, 2 * (live + last.size)), dtype=np.int64)
                grown[:live] = buf[h:t]
                buf, h, t = grown, 0, live
            buf[t : t + last.size] = last
            found[:] = buf, h, t + last.size

    def _eligible_serials(self, need: int) -> np.ndarray:
        """The serials of the runs of at least ``need`` steps, in run order (a view; do not modify)."""
        found = self._sets.get(need)
        if found is None:
            rh, rt = self._rh, self._rt
            serials = np.flatnonzero(self._rl[rh:rt] >= need) + rh
            buf = np.empty(max(16, 2 * serials.size), dtype=np.int64)
            buf[: serials.size] = serials
            found = self._sets[need] = [buf, 0, serials.size]
        buf, h, t = found
        return buf[h:t]

    def _runs_at(self, serials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of the runs ``serials``, starts as positions in ``slots``."""
        return self._rs[serials] - self._base, self._rl[serials]

    def _publish(self) -> None:
        """Exposes the key buffers' ``[head, tail)`` and the runs as the contract's tensors (views)."""
        head, tail = self._head, self._tail
        self._key = self._kbuf[head:tail]
        self._finish(self._sbuf[head:tail], head, None, None)

    def _set_sorted(self, slots: np.ndarray, ids: np.ndarray, steps: np.ndarray) -> None:
        """Installs the sorted live steps of ``ids``/``steps`` (no composite keys) and finds every run."""
        m = slots.size
        split = np.ones(m, dtype=bool)
        if m > 1:
            split[1:] = (ids[1:] != ids[:-1]) | (steps[1:] != steps[:-1] + 1)
        start = np.flatnonzero(split)
        self._key = _EMPTY
        self._set_runs(start, np.diff(start, append=m))
        self._finish(slots, 0, ids[start], (ids, steps))

    def _finish(self, slots, base, run_traj, columns) -> None:
        self.slots_np = slots
        self._base = base  # the buffer position of slots[0]: a run's start in slots is its start less it
        self._columns = columns  # the ids and steps of the slots, decoded on first access when None
        self.slots = torch.from_numpy(slots)
        self.run_length = torch.from_numpy(self._rl[self._rh : self._rt])
        self._run_start = None  # derived on first access after a change
        self._run_traj = None if run_traj is None else torch.from_numpy(run_traj)
        self._longest = None
        self._eligible: dict[int, torch.Tensor] = {}
        self._positions = None  # cell -> position in slots, built by locate() without composite keys
        self.version += 1

    # -- reading the index -----------------------------------------------------------------------------------
    def _decoded(self) -> tuple[np.ndarray, np.ndarray]:
        if self._columns is None:
            self._columns = ((self._key >> _STEP_BITS) + self._low, self._key & _STEP_LIMIT)
        return self._columns

    @property
    def traj(self) -> torch.Tensor:
        """``[M]`` int64: the trajectory id of each entry of ``slots`` (decoded on first access after a change)."""
        return torch.from_numpy(self._decoded()[0])

    @property
    def steps(self) -> torch.Tensor:
        """``[M]`` int64: the step of each entry of ``slots`` (decoded on first access after a change)."""
        return torch.from_numpy(self._decoded()[1])

    @property
    def run_start(self) -> torch.Tensor:
        """``[R]`` int64: the position in ``slots`` of each run's first step (derived on first access after a
        change)."""
        if self._run_start is None:
            self._run_start = torch.from_numpy(self._rs[self._rh : self._rt] - self._base)
        return self._run_start

    @property
    def run_traj(self) -> torch.Tensor:
        """``[R]`` int64: the trajectory id of each run (derived on first access after a change)."""
        if self._run_traj is None:
            first_keys = self._kbuf[self._rs[self._rh : self._rt]]
            self._run_traj = torch.from_numpy((first_keys >> _STEP_BITS) + self._low)
        return self._run_traj

    @property
    def num_runs(self) -> int:
        return self._rt - self._rh

    def longest(self) -> int:
        """The steps of the longest run (``0`` when empty)."""
        if self._longest is None:
            lengths = self._rl[self._rh : self._rt]
            self._longest = int(lengths.max()) if lengths.size else 0
        return self._longest

    def eligible(self, need: int) -> torch.Tensor:
        """The ids of the runs of at least ``need`` steps, in run order (cached until the next change)."""
        found = self._eligible.get(need)
        if found is None:
            found = self._eligible[need] = torch.from_numpy(self._eligible_serials(need) - self._rh)
        return found

    def run_starts_of(self, run_ids: np.ndarray) -> np.ndarray:
        """The positions in ``slots`` of the first steps of runs ``run_ids`` (numpy int64; one gather)."""
        return self._rs[np.asarray(run_ids, dtype=np.int64) + self._rh] - self._base

    def window_slots(self, run_ids: torch.Tensor, offsets: torch.Tensor, length: int) -> torch.Tensor:
        """``[n, length]`` cells of the windows starting ``offsets`` steps into runs ``run_ids`` (one gather).

        A step past the end of its run repeats the run's last cell (mask it with ``offsets + arange(length) <
        run_length[run_ids]``)."""
        steps = offsets.unsqueeze(-1) + torch.arange(length)
        last = self.run_length.index_select(0, run_ids).unsqueeze(-1) - 1
        positions = torch.minimum(steps, last) + self.run_start.index_select(0, run_ids).unsqueeze(-1)
        return self.slots[positions]

    def locate(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(live, run, offset)`` of storage ``cells`` (numpy int64): whether each holds a live step, the run
        holding it and the step's offset in that run (meaningless where not ``live``); a binary search each (a
        table of every cell, built once per change, when ids are too far apart for composite keys)."""
        m = self.slots_np.size
        cells = np.asarray(cells, dtype=np.int64)
        if not m:
            zeros = np.zeros(cells.size, dtype=np.int64)
            return np.zeros(cells.size, dtype=bool), zeros, zeros
        if self._composite:
            inside = (cells >= 0) & (cells < self._cell_key.size)
            key = self._cell_key[np.where(inside, cells, 0)]
            pos = np.minimum(np.searchsorted(self._key, key), m - 1)
            live = inside & (key >= 0) & (self._key[pos] == key) & (self.slots_np[pos] == cells)
        else:
            table = self._positions
            if table is None:
                table = self._positions = np.full(int(self.slots_np.max()) + 1, -1, dtype=np.int64)
                table[self.slots_np] = np.arange(m)
            inside = (cells >= 0) & (cells < table.size)
            pos = table[np.where(inside, cells, 0)]
            live = inside & (pos >= 0)
            pos = np.maximum(pos, 0)
        starts = self._rs[self._rh : self._rt]  # buffer positions: no O(R) shift by the head
        pos = pos + self._base
        run = np.searchsorted(starts, pos, side="right") - 1
        return live, run, pos - starts[run]

    def as_trajectories(self) -> RunTrajectories:
        """The runs as contiguous trajectories in sorted positions (:class:`RunTrajectories`), for slice samplers."""
        return RunTrajectories(self)

    def too_short(self, need: int) -> BaseException:
        """TorchRL's error for ``strict_length=True`` when no run holds ``need`` steps (to raise)."""
        return too_short_error(self.run_length, need)

    def storage_index(self, cells: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``(index tuple for storage.get, cells)``: ``(rows,)`` for 1-D storages, ``(rows, cols)`` for ``ndim=2``."""
        if self.ndim == 1:
            return (cells,), cells
        return (torch.div(cells, self.n_cols, rounding_mode="floor"), cells.remainder(self.n_cols)), cells


def _missing(key, storage) -> BaseException:
    return KeyError(
        f"The storage holds no entry {key!r}, which fragmented trajectories read (one value per step); "
        f"store it, or name the stored entry with traj_key=/step_key=."
    )


def _has_entry(storage, key) -> bool:
    if isinstance(storage, TensorStorage):
        return storage.get_entry(key) is not None
    if not len(storage):
        return False
    data = _items(storage, np.arange(1))
    return data.get(key, None) is not None


def _items(storage, rows):
    if isinstance(storage, ListStorage) and type(storage) is ListStorage:
        raise FRAGMENTED_STORAGE.error(storage=type(storage).__name__, got="a list of items")
    data = storage.get(torch.as_tensor(rows, dtype=torch.long))
    if not (isinstance(data, TensorDictBase) or is_tensorclass(data)):
        raise FRAGMENTED_STORAGE.error(storage=type(storage).__name__, got=type(data).__name__)
    return data


def _entry_of_items(storage, key, rows):
    data = _items(storage, np.arange(rows) if isinstance(rows, int) else rows)
    value = data.get(key, None)
    if value is None:
        raise _missing(key, storage)
    return value


def resolve_traj_key(storage, traj_key):
    """``traj_key``, or the first of ``("collector", "traj_ids")``, ``"episode"`` that ``storage`` holds (TorchRL's
    probe); raises TorchRL's error when it holds neither (done flags alone cannot order interleaved steps)."""
    if traj_key is not None:
        return traj_key
    for key in PROBED_KEYS:
        if _has_entry(storage, key):
            return key
    raise FRAGMENTED_NO_TRAJ.error(tried=list(PROBED_KEYS))


def entry_values(value, key, count: int, n_cols: int = 1) -> np.ndarray:
    """The trajectory ids or steps ``value`` read under ``key`` at ``count`` rows of ``n_cols`` cells, as one int64
    per cell (row-major), checked as TorchRL checks them (a tensor, one integer per step)."""
    if not isinstance(value, torch.Tensor) or is_tensorclass(value):
        raise FRAGMENTED_NOT_TENSOR.error(key=key, got=type(value).__name__)
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise FRAGMENTED_NOT_INTEGER.error(key=key, dtype=value.dtype)
    lead = (count,) if n_cols == 1 else (count, n_cols)
    if value.numel() != count * n_cols or tuple(value.shape[: len(lead)]) != lead:
        per_step = f"[{count}]" if n_cols == 1 else f"[{count}, {n_cols}]"
        raise FRAGMENTED_NOT_SCALAR.error(key=key, per_step=per_step, shape=list(value.shape))
    return value.reshape(-1).cpu().numpy().astype(np.int64, copy=False)


class RunTrajectories:
    """The runs of an :class:`InterleavedRuns` seen as contiguous trajectories, for readers of a
    :class:`~.layout.TrajectoryIndex` (slice samplers): *positions* index the sorted ``slots``, so run ``r`` is
    positions ``starts[r] .. starts[r] + lengths[r] - 1`` in step order, and :meth:`storage_index` maps positions to
    the storage. A view of the index as it is now, valid until the next :meth:`InterleavedRuns.refresh` (which
    makes a new one).

    Args:
        runs (InterleavedRuns): the index, refreshed.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> data = TensorDict(traj=torch.tensor([5, 6, 5, 6]), step_count=torch.tensor([0, 0, 1, 1]), batch_size=[4])
        >>> storage.set(torch.arange(4), data)
        >>> runs = InterleavedRuns("traj", "step_count")
        >>> runs.refresh(storage)
        >>> view = RunTrajectories(runs)
        >>> view.starts.tolist(), view.lengths.tolist(), view.storage_index(torch.tensor([2, 3]))[0]
        ([0, 2], [2, 2], (tensor([1, 3]),))
    """

    offset = 0

    def __init__(self, runs: InterleavedRuns):
        self.runs = runs
        self.lengths = runs.run_length
        self.n_rows, self.n_cols, self.ndim = runs.n_rows, runs.n_cols, runs.ndim

    @property
    def starts(self) -> torch.Tensor:
        """``[R]`` the position of each run's first step (the index's ``run_start``, derived on first access)."""
        return self.runs.run_start

    def eligible_table(self, slice_len: int, strict_length: bool) -> LiveEligible:
        """The runs a slice of ``slice_len`` steps may come from, as a slice sampler's from-scratch table (runs in
        order, the same start ranges and float64 factors, so the same draws), read from the index's eligible
        sets: ``O(1)`` after a catch-up instead of ``O(R)`` (NOTE [interleaved runs index])."""
        return LiveEligible(self, slice_len, 0, 0, strict_length)

    # what LiveEligible reads, as from a TrajectoryEnds: a run's serial is its position in the run buffers
    @property
    def num_trajectories(self) -> int:
        return self.runs.num_runs

    def eligible(self, need: int) -> np.ndarray:
        """The serials of the runs of at least ``need`` steps, in order (a view; do not modify)."""
        return self.runs._eligible_serials(need)

    def all_serials(self) -> tuple[int, int]:
        """``(first serial, number of runs)``."""
        return self.runs._rh, self.runs.num_runs

    def trajectories(self, serials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of the runs ``serials``, starts in sorted positions."""
        return self.runs._runs_at(serials)

    def all_trajectories(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of every run."""
        return self.runs.run_start.numpy(), self.runs.run_length.numpy()

    def storage_index(self, positions: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``(index tuple for storage.get, cells)`` of sorted ``positions``: one gather from ``slots``."""
        return self.runs.storage_index(self.runs.slots[positions])
