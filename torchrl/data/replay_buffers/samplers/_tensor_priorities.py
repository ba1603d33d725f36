"""A prioritized sampler's state as torch tensors on one device: the ``torch`` kernel of
:class:`~torchrl.data.replay_buffers.samplers.prioritized.PrioritizedSampler`.

Data model (the same as the numpy state of :mod:`.prioritized`, in tensors): a sum tree and a min tree
(:mod:`.tensor_segment_tree`, float64 for ``dtype=torch.float64``, float32 otherwise, as TorchRL's trees) over the
``capacity`` positions, holding ``q = (p + eps) ** alpha``; the min tree holds its identity (the dtype's largest
finite value) where ``q`` is ``0``; the raw priorities ``p`` (NaN: never set; float64 where the device has it); the
largest raw priority and its position as 0-d tensors (NaN / ``-1``: none yet); and the writes that
:meth:`TensorPriorities.mark` deferred (``max_pending``).

NOTE [tensor priorities without a host sync]: every method used per batch (:meth:`~TensorPriorities.draw`,
:meth:`~TensorPriorities.write`, :meth:`~TensorPriorities.mark`, :meth:`~TensorPriorities.flush`) runs tensor ops
only: no ``.item()``, no ``nonzero``/``unique``/boolean-mask indexing, no Python branch on a tensor value, so that
a GPU never waits and ``torch.compile(fullgraph=True)`` traces them into one graph. What that costs, as on
TorchRL's CUDA path: no check of the values (a negative or NaN priority is stored as given), positions
outside ``[0, capacity)`` and ``-1`` entries are skipped without an error, and a draw that a float rounding
carries onto a zero leaf is not moved back to a positive one (it is only clamped below ``len(storage)``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from torchrl.data.replay_buffers.samplers._tree_kernels import default_kernel, torch_last_writes
from torchrl.data.replay_buffers.samplers.tensor_segment_tree import (
    TensorMinSegmentTree,
    TensorSumSegmentTree,
)

__all__ = []


def initial_tensor_device(requested: torch.device | None) -> torch.device | None:
    """Where a prioritized sampler built with ``device=requested`` keeps torch trees from the start, or ``None`` for
    numpy trees: a device other than the CPU, or the CPU with ``TORCHRL_SEGMENT_TREE_KERNEL=torch``."""
    if requested is not None and requested.type != "cpu":
        return requested
    return torch.device("cpu") if default_kernel() == "torch" else None


def tensor_device_for(requested: torch.device | None, storage) -> torch.device | None:
    """Where a prioritized sampler with numpy trees (built with ``device=requested``) moves them as torch trees for
    ``storage``, or ``None`` to keep them: a storage on an accelerator when ``requested`` is ``None`` (there), a
    compilable storage (on ``requested`` or the storage's device).

    Examples:
        >>> from torchrl.data import LazyTensorStorage
        >>> tensor_device_for(None, LazyTensorStorage(4)), tensor_device_for(None, LazyTensorStorage(4, compilable=True))
        (None, device(type='cpu'))
    """
    where = getattr(storage, "device", None)  # (run per numpy-kernel call: cheap checks first)
    if isinstance(where, str):
        try:
            where = torch.device(where)
        except RuntimeError:  # not a device name (e.g. "auto": the data's, not known yet)
            where = None
    elif not isinstance(where, torch.device):
        where = None
    if getattr(storage, "compilable", False):
        return requested if requested is not None else where or torch.device("cpu")
    if requested is None and where is not None and where.type not in ("cpu", "meta"):
        return where
    return None


def _raw_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # (MPS has no float64)


class TensorPriorities:
    """The tensors of a prioritized sampler on ``device`` (see the module doc), and its per-batch operations.

    Args:
        max_capacity (int): the sampler's ``max_capacity``; the trees hold the next power of two above it.
        dtype (torch.dtype): the sampler's ``dtype``: float64 trees for ``torch.float64``, float32 otherwise.
        device (torch.device): where every tensor lives.

    Keyword Args:
        alpha, beta, eps (float): the sampler's exponents (plain floats: what ``torch.compile`` guards on).
        max_pending (int): how many :meth:`mark` calls may wait before they are written (``0``: none wait).
        within_buffer (bool): the sampler's ``max_priority_within_buffer``.

    Examples:
        >>> import torch
        >>> state = TensorPriorities(8, torch.float64, torch.device("cpu"), alpha=1.0, beta=1.0, eps=0.0)
        >>> state.write(torch.tensor([0, 1, 2]), torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64))
        >>> index, weight = state.draw(torch.tensor([0.9, 0.1], dtype=torch.float64), torch.tensor(3))
        >>> index.tolist(), weight.tolist()
        ([0, 2], [1.0, 0.3333333333333333])
    """

    def __init__(
        self, max_capacity: int, dtype: torch.dtype, device: torch.device, *, alpha: float, beta: float,
        eps: float, max_pending: int = 0, within_buffer: bool = False,
    ) -> None:  # fmt: skip
        tree_dtype = torch.float64 if dtype is torch.float64 else torch.float32
        self.device = device
        self.sum_tree = TensorSumSegmentTree(max_capacity, dtype=tree_dtype, device=device)
        self.min_tree = TensorMinSegmentTree(max_capacity, dtype=tree_dtype, device=device)
        self.capacity = self.sum_tree.capacity
        raw = _raw_dtype(device)
        self.raw = torch.full((self.capacity,), math.nan, dtype=raw, device=device)
        self.max_priority = torch.full((), math.nan, dtype=raw, device=device)
        self.max_index = torch.full((), -1, dtype=torch.long, device=device)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.max_pending = int(max_pending)
        self.within_buffer = bool(within_buffer)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._zero = torch.zeros((), dtype=torch.long, device=device)

    # -- per batch (NOTE [tensor priorities without a host sync]) -----------------------------------------------
    def default_priority(self) -> torch.Tensor:
        """The raw priority of written items: the largest seen, ``1.0`` before any (a 0-d tensor)."""
        return torch.where(self.max_priority.isnan(), torch.ones_like(self.max_priority), self.max_priority)

    def draw(self, uniform: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions among the first ``n`` (a 0-d int64 tensor, ``1 <= n``) drawn in proportion to their ``q``,
        one per ``u`` in ``uniform`` (``[0, 1)``; the mass searched is ``(1 - u) * total``, as the numpy kernel),
        and their importance weights ``(q / q_min) ** -beta`` in the trees' dtype."""
        n = n.to(self.device).clamp(max=self.capacity)
        total = self.sum_tree.query(self._zero, n)
        smallest = self.min_tree.query(self._zero, n)
        mass = ((1.0 - uniform.to(self.device)) * total.to(uniform.dtype)).to(total.dtype)
        index = torch.minimum(self.sum_tree.scan_lower_bound(mass), n - 1)
        q = self.sum_tree.at(index)
        weight = torch.pow(q / smallest, -self.beta)
        return index, weight

    def sample(self, batch_size: int, n: torch.Tensor, generator: torch.Generator | None, *, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """:meth:`draw` of ``batch_size`` uniforms from ``generator`` (torch's default one when ``None``): the index
        and the ``dtype`` weights, on ``device``."""
        uniform_dtype = torch.float32 if self.device.type == "mps" else torch.float64
        if generator is None:
            uniform = torch.rand(batch_size, device=self.device, dtype=uniform_dtype)
        else:
            uniform = torch.rand(batch_size, generator=generator, device=generator.device, dtype=uniform_dtype)
        index, weight = self.draw(uniform, n)
        weight = weight.to(dtype)
        if device != self.device:
            index, weight = index.to(device, non_blocking=True), weight.to(device, non_blocking=True)
        return index, weight

    def expressed(self, raw: torch.Tensor) -> torch.Tensor:
        """``(raw + eps) ** alpha`` at the trees' precision (float32 trees: clamped to float32's largest value)."""
        q = torch.pow(raw + self.eps, self.alpha)
        dtype = self.sum_tree.dtype
        if dtype != q.dtype:
            q = q.clamp(max=torch.finfo(dtype).max).to(dtype)
        return q

    def write(self, index: torch.Tensor, raw: torch.Tensor, *, defaults: bool = False) -> None:
        """Sets raw priorities (``raw``, one per entry of the 1-D int64 ``index``, on the device) and their ``q`` in
        both trees; the last write of a repeated position wins; entries outside ``[0, capacity)`` (``-1``) are
        skipped. Then tracks the max priority (``defaults``: the values are the default priority, which moves the
        max only when there was none, as the numpy kernel)."""
        if index.shape[0] == 0:
            return
        positions, won, raw_now = self._last_writes(index, raw)
        self._write_positions(positions, won, raw_now)
        if self.within_buffer:
            self.recompute_max()
            return
        top = torch.where(won, raw_now, -math.inf).max(0)
        if defaults:
            larger = (top.values > -math.inf) & self.max_priority.isnan()
        else:
            larger = (top.values > -math.inf) & (self.max_priority.isnan() | (top.values >= self.max_priority))
        self.max_priority.copy_(torch.where(larger, top.values, self.max_priority))
        where = positions.index_select(0, top.indices.reshape(1)).reshape(())  # (a 0-d index would read it back)
        self.max_index.copy_(torch.where(larger, where, self.max_index))

    def mark(self, index: torch.Tensor) -> None:
        """Gives the written positions ``index`` the default priority, now or, with ``max_pending``, at the next
        :meth:`flush` (which runs when more than ``max_pending`` calls wait, and before every read of the state).
        Under ``torch.compile`` the write is immediate (a growing list would recompile)."""
        if self.within_buffer:  # the default excludes the items being overwritten: written at once
            if index.shape[0] == 0:
                return
            positions, won, _ = self._last_writes(index, torch.zeros(index.shape, dtype=self.raw.dtype,
                                                                     device=self.device))  # fmt: skip
            held = self.raw.clone()
            held.index_put_((positions,), torch.where(won, math.nan, held[positions]))
            self.recompute_max(held)
            self.write(index, self.default_priority().expand(index.shape[0]))
            return
        if self.max_pending == 0 or torch.compiler.is_compiling():
            self.write(index, self.default_priority().expand(index.shape[0]), defaults=True)
            return
        self.pending.append((index, self.default_priority()))
        if len(self.pending) > self.max_pending:
            self.flush()

    def flush(self) -> None:
        """Writes the deferred :meth:`mark` calls, in order, as one batch (the last write of a position wins)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        index = torch.cat([i for i, _ in pending])
        raw = torch.cat([p.expand(i.shape[0]) for i, p in pending])
        self.write(index, raw, defaults=True)

    # -- whole-state operations (not per batch: they may read values back) --------------------------------------
    def reexpress(self) -> None:
        """Recomputes every ``q`` from the raw priorities (after ``alpha`` changed)."""
        known = ~self.raw.isnan()
        q = torch.where(known, self.expressed(torch.where(known, self.raw, 0.0)), 0.0).to(self.sum_tree.dtype)
        self.sum_tree.set_all(q)
        self.min_tree.set_all(torch.where(q > 0, q, self.min_tree.identity_element))

    def has_priorities(self) -> bool:
        """Whether some position holds a raw priority (reads one value back)."""
        return bool((~self.raw.isnan()).any())

    def total(self) -> float:
        return float(self.sum_tree.query(0, self.capacity))

    def reset(self) -> None:
        self.pending = []
        self.sum_tree.reset()
        self.min_tree.reset()
        self.raw.fill_(math.nan)
        self.max_priority.fill_(math.nan)
        self.max_index.fill_(-1)

    def snapshot(self) -> dict[str, Any]:
        """The state as numpy float64 arrays in the numpy kernel's layout: ``priority`` (NaN: never set), ``sum``,
        ``min`` (``+inf`` where ``q`` is ``0``), ``max_priority`` (float or ``None``), ``max_index`` (int)."""
        self.flush()
        mins = self.min_tree.leaves.double().cpu().numpy().copy()
        mins[mins >= self.min_tree.identity_element] = np.inf
        top = float(self.max_priority)
        return {
            "priority": self.raw.double().cpu().numpy().copy(),
            "sum": self.sum_tree.leaves.double().cpu().numpy().copy(),
            "min": mins,
            "max_priority": None if top != top else top,
            "max_index": int(self.max_index),
        }

    def load(self, priority: np.ndarray, sums: np.ndarray, mins: np.ndarray, max_priority, max_index: int) -> None:
        """Replaces the state with checked arrays in the layout of :meth:`snapshot` (pending writes dropped)."""
        self.pending = []
        self.raw.copy_(torch.from_numpy(np.array(priority, dtype=np.float64)).to(self.raw.dtype))
        self.sum_tree.set_all(torch.from_numpy(np.array(sums, dtype=np.float64)))
        mins = np.where(np.isinf(mins), self.min_tree.identity_element, mins)
        self.min_tree.set_all(torch.from_numpy(mins))
        self.max_priority.fill_(math.nan if max_priority is None else float(max_priority))
        self.max_index.fill_(-1 if max_priority is None else int(max_index))

    # -- internals ------------------------------------------------------------------------------------------
    def _last_writes(self, index: torch.Tensor, raw: torch.Tensor):
        """``(positions, won, raw value at each)``: see :func:`torch_last_writes`; a position whose entries were all
        skipped keeps its current raw value."""
        index = index.to(self.device, torch.long)
        keep = (index >= 0) & (index < self.capacity)
        positions, winner, won = torch_last_writes(torch.where(keep, index, 0), keep)
        raw_now = torch.where(won, raw.to(self.device, self.raw.dtype)[winner], self.raw[positions])
        return positions, won, raw_now

    def _write_positions(self, positions: torch.Tensor, won: torch.Tensor, raw_now: torch.Tensor) -> None:
        self.raw.index_put_((positions,), raw_now)
        q = self.expressed(torch.where(raw_now.isnan(), 0.0, raw_now))
        q = torch.where(won, q, self.sum_tree.leaves[positions])  # skipped entries keep their leaves
        self.sum_tree.update_unique(positions, q)
        ident = self.min_tree.identity_element
        self.min_tree.update_unique(positions, torch.where(won, torch.where(q > 0, q, ident),
                                                           self.min_tree.leaves[positions]))  # fmt: skip

    def recompute_max(self, raw: torch.Tensor | None = None) -> None:
        """The max priority and its position from ``raw`` (default: the raw priorities), NaN / ``-1`` if none."""
        raw = self.raw if raw is None else raw
        held = torch.where(raw.isnan(), -math.inf, raw)
        top = held.max(0)
        some = top.values > -math.inf
        self.max_priority.copy_(torch.where(some, top.values, math.nan))
        self.max_index.copy_(torch.where(some, top.indices, -1))

    def __getstate__(self) -> dict[str, Any]:
        self.flush()
        state = self.__dict__.copy()
        for name in ("sum_tree", "min_tree"):  # every leaf (a tree pickles only its first `size` leaves)
            state[name] = (state[name], state[name].leaves.cpu().clone())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in ("sum_tree", "min_tree"):
            tree, leaves = state[name]
            tree.set_all(leaves)
            state[name] = tree
        self.__dict__.update(state)
