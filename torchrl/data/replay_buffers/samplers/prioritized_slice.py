"""Trajectory slices whose starts are drawn by priority: :class:`PrioritizedSliceSampler`.

NOTE [prioritized slice starts]: a slice starts at a step that is followed by enough steps of its trajectory
(``need - 1``, ``need = slice_len`` less the right span; with ``strict_length=False`` a trajectory's first
step too), drawn with probability ``q / Q``, ``q = (p + eps) ** alpha`` its priority and ``Q`` the sum over
the steps that can start a slice. Instead of a cumulative sum over those steps (``O(N)`` at each draw), starts
are drawn from the whole priority tree (``O(log N)`` each) and a draw that lands on a step that cannot start a
slice is drawn again: the draws kept have exactly that distribution. Whether a step can start a slice comes
from the trajectory index (the live one of :class:`SliceSampler`, NOTE [live trajectory index]: a binary
search among the trajectory ends; with ``fragmented=True`` the interleaved index, NOTE [interleaved runs index]:
binary searches for the step's run; otherwise a table of the start cells, cached with the boundaries). The first
round draws ``1.5 * num_slices + 8`` starts, the next ones as many as the acceptance seen so far needs; after
``_ROUNDS`` rounds (most of the priority mass on steps that cannot start a slice) the slices still missing are
drawn from the cumulative sum. The draws are a function of the generator state and of the content, the same
with the live index as without it.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from tensordict import NestedKey

from torchrl.data.replay_buffers.samplers._slice_args import SliceArgs
from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
from torchrl.data.replay_buffers.samplers.slice import _BELOW_ONE, SliceSampler, _Boundaries, _Eligible
from torchrl.data.replay_buffers.trajectories.interleaved import RunTrajectories

_ROUNDS = 4  # rounds of draws from the whole tree before the slices still missing are drawn exactly
_MIN_RATE = 1.0 / 64  # the acceptance a round is sized for, at worst
_PROBES = (np.arange(64) + 0.5) / 64  # can_sample's draws from the tree (no generator consumed)


class PrioritizedSliceSampler(SliceSampler, PrioritizedSampler):
    """Samples slices of trajectories, each starting at a stored step drawn in proportion to its priority.

    Priorities are per stored step, as in :class:`PrioritizedSampler` (new steps get the largest priority
    seen; learners call :meth:`update_priority` with the batch index and one priority per step). A slice
    start is drawn among the steps that can start a slice (with ``strict_length=True``, the steps followed
    by at least ``slice_len - 1`` steps of the same trajectory, plus ``right`` with a span), with probability
    ``(p + eps) ** alpha`` over the sum of those of all such steps. Slices follow the rules of
    :class:`SliceSampler` (no slice crosses a trajectory boundary, the ring-buffer wrap or an env column).

    ``info["priority_weight"]`` holds, on every step of a slice, the importance weight of its start,
    ``(q_start / q_min) ** -beta`` with ``q = (p + eps) ** alpha`` and ``q_min`` the smallest positive
    ``q`` stored (weights lie in ``(0, 1]``).

    Stateful (priorities): ``requires_shared_state = True``. Its state is that of
    :class:`PrioritizedSampler` and is shared the same way (``can_share_state = True``, :meth:`share_memory_`),
    with the same consistency; the trajectory boundaries are derived from the storage content in each process
    (on a 1-D CPU tensor storage, the index of :class:`SliceSampler`, kept up to date on each write). A draw
    costs ``O(num_slices * log N)`` whatever was written before it: starts are drawn from the priority tree
    and redrawn when they cannot start a slice (NOTE [prioritized slice starts] in ``prioritized_slice.py``),
    so the slices drawn for a generator state differ from those of versions that summed every start's
    priority, with the same distribution.
    Like :class:`PrioritizedSampler` and :class:`SliceSampler`, :meth:`sample` raises ``TypeError`` for a storage
    declaring ``stable_items = False`` (a :class:`~torchrl.data.DatasetStorage`).

    Args:
        max_capacity, alpha, beta, eps, dtype, reduction: as in :class:`PrioritizedSampler`.

    Keyword Args:
        num_slices, slice_len, end_key, end_keys, traj_key, ends, trajectories, cache_values,
            truncated_key, strict_length: as in :class:`SliceSampler` (``info`` holds the same entries,
            ``"is_init"`` included).
        step_key, fragmented: interleaved trajectories, as in :class:`SliceSampler` (TorchRL refuses them here): a
            slice starts at a stored step drawn by priority among those followed by ``slice_len - 1`` consecutive
            steps of their trajectory, wherever they are stored. Defaults to ``"step_count"`` and ``False``.
        compile (bool or dict): accepted for compatibility with TorchRL, without effect, as in
            :class:`SliceSampler`. Defaults to ``False``.
        span (bool, int or (left, right)): as in :class:`SliceSampler`, but only the right side is used: a
            start is a stored step with a priority, so slices cannot start before a trajectory (a left span
            is ignored with a warning, and ``span[0]`` is ``False``). A slice that runs past the end of its
            trajectory stops there, as in TorchRL: it holds fewer than ``slice_len`` steps (its last one marked
            truncated), and the batch is shorter than ``batch_size``, whatever ``strict_length``. Defaults to
            ``False``.
        max_priority_within_buffer (bool): as in :class:`PrioritizedSampler`. Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(torch.arange(40), TensorDict(episode=torch.arange(40) // 10, batch_size=[40]))
        >>> sampler = PrioritizedSliceSampler(
        ...     100, alpha=1.0, beta=1.0, eps=0.0, slice_len=4, traj_key="episode"
        ... )
        >>> sampler.extend(torch.arange(40))  # what a replay buffer does after a write
        >>> priority = torch.zeros(40)
        >>> priority[[3, 21]] = 1.0
        >>> sampler.update_priority(torch.arange(40), priority)
        >>> index, info = sampler.sample(storage, 16)
        >>> sorted(set(index[0].view(4, 4)[:, 0].tolist()) | {3, 21})
        [3, 21]
        >>> info["priority_weight"].shape
        torch.Size([16])
    """

    requires_shared_state = True
    can_share_state = True
    draws_in_bounds = False  # (not PrioritizedSampler's: slices are read with the checked path)
    _tensor_kernel_ok = False  # it reads the numpy trees: the torch kernel is PrioritizedSampler's only

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        end_keys: list[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple = False,
        max_priority_within_buffer: bool = False,
    ):
        PrioritizedSampler.__init__(
            self,
            max_capacity,
            alpha,
            beta,
            eps=eps,
            dtype=dtype,
            reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer,
        )
        self._configure_slices(SliceArgs.from_arguments(locals()))
        if self.span[0] is not False and self.span[0] != 0:
            warnings.warn(
                f"PrioritizedSliceSampler ignores the left part of `span`={span!r}: slices start at a stored "
                f"step drawn by priority, never before a trajectory. Pass span=(0, right) to silence this.",
                UserWarning,
                stacklevel=2,
            )
            self.span = (False, self.span[1])

    # -- sampling: NOTE [prioritized slice starts] (module docstring) --------------------------------------
    def _need(self, slice_len: int) -> int:
        """The steps from a start to its trajectory's end (the start included) that a slice needs:
        ``slice_len`` less the right span."""
        return slice_len - self._span_steps(slice_len)[1]

    def _start_counts(self, lengths: np.ndarray, slice_len: int) -> np.ndarray:
        """How many steps of trajectories of ``lengths`` steps can start a slice (their first ones)."""
        return np.maximum(lengths - (self._need(slice_len) - 1), 0 if self.strict_length else 1)

    def _start_table(self, bounds: _Boundaries, slice_len: int) -> tuple[np.ndarray, ...]:
        """Every step that can start a slice, trajectories oldest first then by offset (``O(N)``; cached with
        from-scratch boundaries): ``(cells, traj, offsets, traj_starts, traj_lengths)``, numpy, one entry per
        start except the last two (one per trajectory of the index; starts in flat positions)."""
        key = ("prioritized_starts", slice_len)
        table = bounds.extra.get(key)
        if table is None:  # numpy: torch's threaded ops stall on a busy machine, numpy's do not
            index = bounds.index
            starts, lengths = index.starts.cpu().numpy(), index.lengths.cpu().numpy()
            counts = self._start_counts(lengths, slice_len)
            traj = np.repeat(np.arange(counts.size), counts)
            first = np.cumsum(counts) - counts
            offsets = np.arange(traj.size) - first[traj]
            flat = torch.from_numpy(starts[traj] + offsets).to(index.starts.device)
            cells = index.storage_index(flat)[1].cpu().numpy()
            table = (cells, traj, offsets, starts, lengths)
            # with an incremental index (live, interleaved) only the exact fallback needs it: not kept (memory)
            if bounds.live is None and not isinstance(index, RunTrajectories):
                bounds.extra[key] = table
        return table

    def _classify(self, bounds: _Boundaries, slice_len: int, cells: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(ok, traj_start, traj_length, offset)`` of drawn tree positions ``cells``: whether each can start
        a slice, and where (values meaningless where not ``ok``); ``O(log T)`` each with the live index."""
        live = bounds.live
        if live is not None:  # the step's trajectory from a binary search among the trajectory ends
            n_rows = live.n_rows
            unrolled = (cells - live.offset) % n_rows
            start, last = live.locate(unrolled)
            ok = last - unrolled >= self._need(slice_len) - 1  # followed by enough steps of its trajectory
            if not self.strict_length:
                ok |= unrolled == start  # a trajectory's first step starts a (shorter) slice
            ok &= cells < n_rows
            return ok, start, last - start + 1, unrolled - start
        if isinstance(bounds.index, RunTrajectories):  # fragmented: the run of each cell by binary searches
            runs = bounds.index.runs
            live, run, offset = runs.locate(cells)
            length = runs.run_length.numpy()[run]
            ok = live & (length - offset >= self._need(slice_len))
            if not self.strict_length:
                ok |= live & (offset == 0)
            return ok, runs.run_starts_of(run), length, offset
        position = bounds.extra.get(("prioritized_positions", slice_len))
        table = self._start_table(bounds, slice_len)
        if position is None:  # tree position -> its row of the start table, -1 where no slice starts
            n_cells = bounds.index.n_rows * bounds.index.n_cols
            position = np.full(n_cells, -1, dtype=np.int64)
            position[table[0]] = np.arange(table[0].size)
            bounds.extra[("prioritized_positions", slice_len)] = position
        inside = cells < position.size
        row = position[np.where(inside, cells, 0)]
        ok = inside & (row >= 0)
        if not table[0].size:  # no step can start a slice
            return ok, row, row, row
        row[~ok] = 0
        _, traj, offsets, traj_starts, traj_lengths = table
        owner = traj[row]
        return ok, traj_starts[owner], traj_lengths[owner], offsets[row]

    def _draw_exactly(self, bounds: _Boundaries, slice_len: int, count: int) -> tuple[np.ndarray, ...]:
        """``count`` starts from the cumulative sum of the priorities of every step that can start a slice
        (``O(N)``: the rounds of :meth:`_draw_starts` left slices to draw). The caller holds the lock."""
        cells, traj, offsets, traj_starts, traj_lengths = self._start_table(bounds, slice_len)
        q = self._sum_tree.values[cells]
        cumulative = np.cumsum(q)
        total = float(cumulative[-1]) if cumulative.size else 0.0
        if not total > 0:
            raise RuntimeError(
                f"Every one of the {cells.size} steps that can start a slice of {slice_len} steps has "
                f"priority zero (or none was set): tell the sampler about written steps "
                f"(sampler.extend(index), done by the replay buffer) or set positive priorities with "
                f"update_priority()."
            )
        u = self._uniform(count, torch.device("cpu")).numpy()
        pick = np.searchsorted(cumulative, u * (total * _BELOW_ONE), side="right")
        np.minimum(pick, cells.size - 1, out=pick)
        owner = traj[pick]
        return traj_starts[owner], traj_lengths[owner], offsets[pick], q[pick]

    def _tree_end(self, bounds: _Boundaries) -> int | None:
        """The ``end`` of the tree draws: ``None`` (the whole tree) unless priorities were set past the cells
        the boundaries describe (as :meth:`PrioritizedSampler.sample` does)."""
        n_cells = bounds.index.n_rows * bounds.index.n_cols
        return None if self._written_end <= n_cells else n_cells

    def _draw_starts(self, bounds: _Boundaries, slice_len: int, num_slices: int) -> tuple[np.ndarray, ...]:
        """``(traj_start, traj_length, offset, q)`` of ``num_slices`` starts drawn by priority among the steps
        that can start a slice (NOTE [prioritized slice starts]). The caller holds the lock."""
        end = self._tree_end(bounds)
        parts, remaining, drawn, kept = [], num_slices, 0, 0
        for _ in range(_ROUNDS):
            if drawn:  # sized by the acceptance seen so far
                rate = max(kept / drawn, _MIN_RATE)
                size = min(int(remaining * 1.5 / rate) + 8, 64 * remaining + 64)
            else:
                size = remaining + remaining // 2 + 8
            found = self._sum_tree.draw(self._uniform(size, torch.device("cpu")).numpy(), end=end)
            if found is None:  # every priority is zero: the exact draw says so
                break
            ok, start, length, offset = self._classify(bounds, slice_len, found[0])
            take = np.flatnonzero(ok)
            drawn, kept = drawn + size, kept + take.size
            take = take[:remaining]
            parts.append((start[take], length[take], offset[take], found[1][take]))
            remaining -= take.size
            if not remaining:
                break
        if remaining:
            parts.append(self._draw_exactly(bounds, slice_len, remaining))
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(column) for column in zip(*parts))

    def _picked(
        self, bounds: _Boundaries, start: np.ndarray, length: np.ndarray, slice_len: int
    ) -> _Eligible:
        """The table of the drawn slices' trajectories, one per slice (slice ``i`` is its entry ``i``)."""
        count = self._start_counts(length, slice_len)
        starts, lengths, count = (torch.from_numpy(a) for a in (start, length, count))
        on_host = bounds.live is not None or isinstance(bounds.index, RunTrajectories)  # (runs: numpy-backed)
        if not on_host and bounds.index.starts.device.type != "cpu":
            device = bounds.index.starts.device
            starts, lengths, count = starts.to(device), lengths.to(device), count.to(device)
        return _Eligible(
            traj=None,
            starts=starts,
            lengths=lengths,
            low=0,
            count=count,
            count_float=count.double() * _BELOW_ONE,
            n_float=starts.numel() * _BELOW_ONE,
            # a start drawn among the steps followed by a full slice: no slice leaves its trajectory
            all_full=self.strict_length and self._span_steps(slice_len)[1] == 0,
        )

    def can_sample(self, storage, batch_size: int) -> bool:
        """Whether :meth:`sample` can draw a batch now: the storage holds steps that can start a slice (see
        :meth:`SliceSampler.can_sample`) and their priorities are not all zero.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler
            >>> storage = LazyTensorStorage(10)
            >>> sampler = PrioritizedSliceSampler(10, alpha=1.0, beta=1.0, slice_len=2, traj_key="episode")
            >>> sampler.can_sample(storage, 4)
            False
            >>> storage.set(torch.arange(4), TensorDict(episode=torch.zeros(4, dtype=torch.long), batch_size=[4]))
            >>> sampler.extend(torch.arange(4))
            >>> sampler.can_sample(storage, 4)
            True
        """
        num_slices, slice_len = self._slice_shape(self._scaled_batch_size(batch_size))
        n = len(storage)
        if n == 0 or n > self._capacity:
            return False
        bounds = self._boundaries(storage)
        if not self._can_draw(bounds, num_slices, slice_len):
            return False
        with self._guard.read(self._repair_state):
            found = self._sum_tree.draw(_PROBES.copy(), end=self._tree_end(bounds))  # no generator consumed
            if found is None:
                return False
            if self._classify(bounds, slice_len, found[0])[0].any():  # a start with a positive priority
                return True
            cells = self._start_table(bounds, slice_len)[0]  # none among the probes: every start (O(N))
            return bool(self._sum_tree.values[cells].sum() > 0)

    def sample(self, storage, batch_size: int) -> tuple[tuple[torch.Tensor, ...], dict]:
        batch_size = self._scaled_batch_size(batch_size)
        num_slices, slice_len = self._slice_shape(batch_size)
        n = len(storage)
        if n > self._capacity:  # the trees hold positions up to the power of two above max_capacity
            raise RuntimeError(
                f"The storage holds {n} items but the sampler was built with `max_capacity`="
                f"{self._max_capacity} (its trees hold {self._capacity} positions): build PrioritizedSliceSampler "
                f"with max_capacity >= the storage's max_size."
            )
        bounds = self._boundaries(storage)  # refuses storages it cannot read before anything is remembered
        self._remember_shape(storage)
        self._eligible(bounds, slice_len)  # raises when no trajectory is long enough (strict_length=True)
        with self._guard.read(self._repair_state):  # one view of the tree: see NOTE [prioritized consistency]
            start, length, offset, q = self._draw_starts(bounds, slice_len, num_slices)
            q_min, beta = self._stored_min(n), self._beta
        picked = self._picked(bounds, start, length, slice_len)
        device = picked.device
        weight = torch.from_numpy(np.power(q / q_min, -beta)).to(self._dtype)
        return self._build_slices(
            bounds,
            picked,
            torch.arange(num_slices, device=device),
            torch.from_numpy(offset).to(device),
            slice_len,
            per_slice={"priority_weight": weight.to(device)},
        )

    def _drops_outside_steps(self) -> bool:
        # As in TorchRL, a slice that a right span lets run past its trajectory's end stops at that end (fewer
        # steps), whatever strict_length: this sampler has no padding.
        return True

    # -- notifications and state -----------------------------------------------------------------------------
    def add(self, index) -> None:
        SliceSampler.add(self, index)
        PrioritizedSampler.add(self, index)

    def extend(self, index) -> None:
        SliceSampler.extend(self, index)
        PrioritizedSampler.extend(self, index)

    def mark_update(self, index, *, storage=None) -> None:
        SliceSampler.mark_update(self, index, storage=storage)
        PrioritizedSampler.mark_update(self, index, storage=storage)

    def _empty(self) -> None:
        SliceSampler._empty(self)
        PrioritizedSampler._empty(self)

    def __repr__(self) -> str:
        return (
            f"{SliceSampler.__repr__(self)[:-1]}, max_capacity={self._max_capacity}, alpha={self._alpha}, "
            f"beta={self._beta}, eps={self._eps})"
        )
