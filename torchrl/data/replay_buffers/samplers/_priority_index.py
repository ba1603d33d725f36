"""How the prioritized samplers read the ``index`` and ``priority`` arguments of their updates.

:meth:`~torchrl.data.PrioritizedSampler.update_priority` and ``mark_update`` accept an int, a 1-D sequence of
flat positions, per-dimension coordinates of an ``ndim > 1`` storage (a tuple of tensors or an ``[N, ndim]``
tensor), ``-1`` entries for items a writer skipped, and priorities of any real dtype (reduced with the sampler's
``reduction`` when they carry extra dims per item). :class:`PriorityArguments` turns these into flat int64
positions and float64 values, refusing positions out of range or never written, before the sampler touches its
trees. Kept apart from :mod:`.prioritized` (the sampler, its trees and its state), which mixes it in.
"""

from __future__ import annotations

import numpy as np
import torch

from torchrl.data.replay_buffers.samplers._priorities import _ravel_coords, reduce_priority
from torchrl.data.replay_buffers.samplers.segment_tree import _as_index_array, _as_value_array

__all__ = ["PriorityArguments"]


class PriorityArguments:
    """The argument handling of :class:`~torchrl.data.PrioritizedSampler` (a mixin, no state of its own).

    Reads the sampler's ``_max_capacity``, ``_storage_shape`` (the shape of an ``ndim > 1`` storage, once seen)
    and ``reduction``.
    """

    _max_capacity: int
    _storage_shape: tuple[int, ...] | None
    reduction: str

    def _kept_positions(self, flat: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Checks the positions; returns the mask of the entries other than ``-1`` (``None``: all) and one
        past the largest kept position."""
        if not flat.size:
            return None, 0
        keep = None
        lo, hi = flat.min(), flat.max()
        if lo == -1:
            keep = flat != -1
            kept = flat[keep]
            lo, hi = (kept.min(), kept.max()) if kept.size else (0, 0)
        if lo < 0 or hi >= self._max_capacity:
            bad = lo if lo < 0 else hi
            raise IndexError(
                f"`index` {bad} is out of range for a PrioritizedSampler of max_capacity "
                f"{self._max_capacity}: pass positions in [0, {self._max_capacity}) (or -1 to skip an entry)."
            )
        return keep, int(hi) + 1

    def _refuse_unwritten(self, flat: np.ndarray, n: int) -> None:
        """Raises for the positions at or past ``n`` (the stored items): they hold no data yet."""
        bad = flat[flat >= n]
        shown = bad[:3].tolist()
        shape = self._storage_shape
        if shape is not None and len(shape) > 1:  # cells of an ndim > 1 storage: show coordinates too
            coords = np.stack(np.unravel_index(bad[:3], shape), -1).tolist()
            shown = f"{coords} (flat positions {shown})"
        raise IndexError(
            f"`index` holds {bad.size} position(s) never written, e.g. {shown}: the storage holds {n} items "
            f"(len(rb) == {n}). Priorities can only be set for stored items: pass positions in [0, {n}) (or -1 "
            f"to skip an entry), e.g. the 'index' of a sampled batch. Nothing was changed."
        )

    def _remember_shape(self, storage) -> None:
        if storage is not None and storage.ndim > 1:
            try:
                self._storage_shape = tuple(storage.shape)
            except RuntimeError:  # a lazy storage before its first write has no shape yet
                pass

    def _flat_index(self, index, storage) -> np.ndarray:
        """Flat int64 positions (``-1`` kept for skipped entries) from any accepted index form."""
        if storage is not None:
            self._remember_shape(storage)
        if isinstance(index, torch.Tensor) and index.ndim == 1 and index.dtype == torch.long and index.is_cpu:
            return index.numpy()  # the common case, read-only from here on
        if isinstance(index, tuple) and len(index) == 1 and not isinstance(index[0], (int, np.integer)):
            index = index[0]  # a per-dimension index of a 1-D storage
        ndim = storage.ndim if storage is not None else len(self._storage_shape or (None,))
        per_dim = isinstance(index, tuple) and (
            ndim > 1 or any(isinstance(i, (torch.Tensor, np.ndarray)) for i in index)
        )
        if per_dim:
            return self._ravel([_as_index_array(i, "index") for i in index])
        if isinstance(index, torch.Tensor):
            if index.ndim != 2:
                return _as_index_array(index)
            index = index.detach().cpu().numpy()
        elif not isinstance(index, (np.ndarray, list)) or np.ndim(index) != 2:
            return _as_index_array(index)
        rows = np.asarray(index)  # [N, ndim] coordinates
        if rows.shape[-1] == 1:
            return _as_index_array(rows.reshape(-1))
        return self._ravel([_as_index_array(rows[:, d]) for d in range(rows.shape[-1])])

    def _ravel(self, coords: list[np.ndarray]) -> np.ndarray:
        return _ravel_coords(coords, self._storage_shape)

    def _priority_values(self, priority, count: int) -> np.ndarray:
        if isinstance(priority, torch.Tensor) and priority.ndim == 1 and priority.numel() == count:
            if priority.is_cpu and priority.dtype in (torch.float32, torch.float64):  # the common case
                return priority.detach().numpy().astype(np.float64, copy=False)  # read-only from here on
            return priority.detach().to("cpu", torch.float64).numpy()
        if isinstance(priority, torch.Tensor) and priority.ndim > 1 and priority.numel() != count:
            if priority.shape[0] != count:
                raise ValueError(
                    f"`priority` of shape {list(priority.shape)} does not match the {count} indices: pass "
                    f"one priority per index (shape [{count}] or [{count}, ...], reduced with "
                    f"reduction={self.reduction!r})."
                )
            priority = reduce_priority(priority, self.reduction)
        return _as_value_array(priority, count, name="priority")
