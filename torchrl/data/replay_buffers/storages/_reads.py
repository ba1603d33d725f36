"""Batch reads of a tensor storage: one gather per leaf, and re-reads of rows a concurrent write touched.

A mixin of :class:`~torchrl.data.TensorStorage` (it uses the storage's ``_storage`` backing, ``_codec``,
``_versions`` and ``ndim``). With row versions (a storage shared between processes, ``consistent_reads``),
a gather that a write overlapped reads the rows that write stamped again; see
:class:`~torchrl.data.replay_buffers._shared.row_versions.RowVersions`.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds


class RowReads:
    """Gathers of rows and cells for :class:`~torchrl.data.TensorStorage`."""

    def _select(self, backing: TensorDictBase, index: torch.Tensor):
        """The rows ``index`` of ``backing``: a tensor for tensor data, else a TensorDict (not decoded)."""
        if self._codec.kind == "tensor":
            return backing.get("_tensor").index_select(0, index)
        n = index.numel()
        return backing.apply(
            lambda t: t.index_select(0, index), batch_size=[n, *backing.batch_size[1:]], device=backing.device
        )

    def _gather(self, backing: TensorDictBase, index: torch.Tensor):
        out = self._select(backing, index)
        return out if self._codec.kind == "tensor" else self._codec.decode(out)

    def _gather_consistent(self, backing: TensorDictBase, index: torch.Tensor, rows: np.ndarray):
        """:meth:`_gather`, reading again the rows that a write touched during the read (see ``RowVersions``)."""
        versions = self._versions
        snapshot = versions.snapshot()
        out = self._select(backing, index)
        torn = versions.torn(snapshot, rows)
        attempt, started = 0, None
        while torn is not None and torn.any():
            if started is None:
                started = time.monotonic()
            positions = np.flatnonzero(torn)
            versions.wait(attempt, started, rows[positions])
            attempt += 1
            snapshot = versions.snapshot()
            where = torch.from_numpy(positions)
            out[where] = self._select(backing, index[where])
            sub_torn = versions.torn(snapshot, rows[positions])
            if sub_torn is None:
                break
            torn = np.zeros(rows.shape, dtype=bool)
            torn[positions[sub_torn]] = True
        return out if self._codec.kind == "tensor" else self._codec.decode(out)

    def _gather_cells(self, index: tuple, rows: int):
        """Reads cells given per-dimension index tensors (ndim > 1) through one flat gather."""
        shape = self._storage.batch_size[: self.ndim]
        parts = []
        for d, idx in enumerate(index):
            size = rows if d == 0 else shape[d]
            parts.append(check_bounds(as_index_tensor(idx, device=self._storage.device), size))
        flat = torch.zeros_like(parts[0])
        for d, idx in enumerate(parts):
            flat = flat * shape[d] + idx
        flat_backing = self._storage.reshape(-1, *self._storage.batch_size[self.ndim :])
        if self._versions is not None and self.consistent_reads:
            return self._gather_consistent(flat_backing, flat, parts[0].numpy())
        return self._gather(flat_backing, flat)
