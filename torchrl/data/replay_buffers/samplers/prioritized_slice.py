"""Trajectory slices whose starts are drawn by priority: :class:`PrioritizedSliceSampler`."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from tensordict import NestedKey

from torchrl.data.replay_buffers.samplers._slice_args import SliceArgs
from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
from torchrl.data.replay_buffers.samplers.slice import _BELOW_ONE, SliceSampler, _Boundaries, _Eligible


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
    with the same consistency; the trajectory boundaries are derived from the storage content in each process.
    Like :class:`PrioritizedSampler` and :class:`SliceSampler`, :meth:`sample` raises ``TypeError`` for a storage
    declaring ``stable_items = False`` (a :class:`~torchrl.data.DatasetStorage`).

    Args:
        max_capacity, alpha, beta, eps, dtype, reduction: as in :class:`PrioritizedSampler`.

    Keyword Args:
        num_slices, slice_len, end_key, end_keys, traj_key, ends, trajectories, cache_values,
            truncated_key, strict_length: as in :class:`SliceSampler` (``info`` holds the same entries,
            ``"is_init"`` included).
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

    # -- sampling --------------------------------------------------------------------------------------------
    def _start_cells(self, bounds: _Boundaries, elig: _Eligible, slice_len: int):
        """Every step that can start a slice: ``(trajectory in elig, offset, storage cell)`` (cached)."""
        key = ("prioritized_starts", slice_len)
        cached = bounds.extra.get(key)
        if cached is None:
            count = elig.count  # offsets 0 .. count - 1 (no left span)
            owner = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
            first = torch.cumsum(count, 0) - count
            offsets = torch.arange(owner.numel(), device=count.device) - first.index_select(0, owner)
            flat = elig.starts.index_select(0, owner) + offsets
            _, cells = bounds.index.storage_index(flat)
            cached = bounds.extra[key] = (owner, offsets, cells.cpu().numpy())
        return cached

    def _uses_live_index(self) -> bool:
        # the draw is a cumulative sum over every step that can start a slice (O(N) whatever the index), so
        # the boundaries come from the cached full read (as before the live index)
        return False

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
        _, _, cells = self._start_cells(bounds, self._eligible(bounds, slice_len), slice_len)
        with self._guard.read(self._repair_state):
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
        elig = self._eligible(bounds, slice_len)
        owner, offsets, cells = self._start_cells(bounds, elig, slice_len)
        with self._guard.read(self._repair_state):  # one view of the tree: see NOTE [prioritized consistency]
            q = self._sum_tree.values[cells]
            q_min, beta = self._stored_min(n), self._beta
        cumulative = np.cumsum(q)
        total = float(cumulative[-1])
        if not total > 0:
            raise RuntimeError(
                f"Every one of the {cells.size} steps that can start a slice of {slice_len} steps has "
                f"priority zero (or none was set): tell the sampler about written steps "
                f"(sampler.extend(index), done by the replay buffer) or set positive priorities with "
                f"update_priority()."
            )
        u = self._uniform(num_slices, torch.device("cpu")).numpy()
        pick = np.searchsorted(cumulative, u * (total * _BELOW_ONE), side="right")
        np.minimum(pick, cells.size - 1, out=pick)
        weight = torch.from_numpy(np.power(q[pick] / q_min, -beta)).to(self._dtype)
        pick = torch.from_numpy(pick).to(owner.device)
        return self._build_slices(
            bounds,
            elig,
            owner.index_select(0, pick),
            offsets.index_select(0, pick),
            slice_len,
            per_slice={"priority_weight": weight.to(owner.device)},
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
