"""Prioritized experience replay: :class:`PrioritizedSampler`, with the :func:`reduce_priority` and
:func:`check_priorities` helpers (defined in :mod:`._priorities`).

Each stored item ``i`` has a raw priority ``p_i`` (a learner sets it, e.g. from the TD error; a new item
gets the largest priority seen so far). The sampler stores ``q_i = (p_i + eps) ** alpha`` in a sum tree and
a min tree (:mod:`.segment_tree`; sums in float64, leaves rounded to float32 unless ``dtype=torch.float64``, as
TorchRL's float32 trees hold them) and draws item ``i`` with probability ``q_i / sum_j q_j``. The trees have one
leaf per position below the next power of two strictly above ``max_capacity`` (TorchRL's tree capacity), so a
storage a little larger than ``max_capacity`` (a capacity rounded up) still has a priority for every item. The
importance weight returned with it is ``(q_i / min_j q_j) ** -beta``: the usual
``(N * P(i)) ** -beta`` divided by its largest possible value, so weights lie in ``(0, 1]`` and equal ``1``
for the least likely item. Positions index storage cells in row-major order (``ndim > 1`` storages are
raveled with their shape) and only the first ``len(storage)`` of them are ever sampled.

State: the two trees, the raw priorities and a few scalars (``alpha``, ``beta``, ``eps``, the max priority and
where it is, one past the last position holding a priority). :meth:`PrioritizedSampler.share_memory_` moves
all of it to shared memory (a dataset read by DataLoader workers does it), guarded by a
:class:`~torchrl.data.replay_buffers._shared.arrays.StateGuard`: see NOTE [prioritized consistency]
in the class docstring. With the ``torch`` kernel (a device, a compilable storage, or
``TORCHRL_SEGMENT_TREE_KERNEL=torch``: NOTE [prioritized kernels] in the class docstring) the same state lives in
tensors (:mod:`._tensor_priorities`).
"""

from __future__ import annotations

import json
import os
import weakref
from typing import Any

import numpy as np
import torch

from torchrl._files import write_file_atomically
from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._shared.arrays import SharedArray, StateGuard
from torchrl.data.replay_buffers.samplers._priorities import (
    REDUCTIONS,
    SCHEMA_VERSION,
    _check_alpha,
    _check_dtype,
    _check_exponent,
    _check_max_capacity,
    _check_max_pending,
    _check_reduction,
    _ravel_coords,
    _scalar_property,
    check_priorities,
    check_tree_device,
    reduce_priority,
    tensor_positions,
    tensor_priority,
    tree_capacity,
    validated_prioritized_state,
)
from torchrl.data.replay_buffers.samplers._stable_items import unstable_items_error
from torchrl.data.replay_buffers.samplers._tensor_priorities import (
    TensorPriorities,
    initial_tensor_device,
    tensor_device_for,
)
from torchrl.data.replay_buffers.samplers.base import (
    Sampler,
    check_batch_size,
    check_has_rows,
    check_not_empty,
    unravel,
)
from torchrl.data.replay_buffers.samplers.segment_tree import (
    MinSegmentTree,
    SumSegmentTree,
    _as_index_array,
    _as_value_array,
    _float64,
    _int64,
    _last_wins,
    compiled_ranges,
    draw_with_min,
    update_sum_and_min,
    write_priorities,
)
from torchrl.data.replay_buffers.samplers.tensor_segment_tree import (
    CudaMinSegmentTreeFp32,
    CudaMinSegmentTreeFp64,
    CudaSumSegmentTreeFp32,
    CudaSumSegmentTreeFp64,
    MinSegmentTreeFp32,
    MinSegmentTreeFp64,
    SumSegmentTreeFp32,
    SumSegmentTreeFp64,
)

ALPHA_LEAVES_ZERO = TorchRLPhrase(
    UserWarning,
    "away from 0",
    "alpha moves away from 0 (to {alpha!r}) while the sampler holds priorities: they were stored as 1.0 "
    "under alpha=0 and stay 1.0 until their next update_priority().",
)

__all__ = [
    "PrioritizedSampler",
    "REDUCTIONS",
    "check_priorities",
    "reduce_priority",
    # TorchRL's tree names (its compiled extension's), re-exported here as in TorchRL
    "SumSegmentTreeFp32",
    "SumSegmentTreeFp64",
    "MinSegmentTreeFp32",
    "MinSegmentTreeFp64",
    "CudaSumSegmentTreeFp32",
    "CudaSumSegmentTreeFp64",
    "CudaMinSegmentTreeFp32",
    "CudaMinSegmentTreeFp64",
]

_NUMPY_DTYPES = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The JSON file :meth:`PrioritizedSampler.dumps` writes beside the checkpoint (TorchRL's name and keys).
_SAMPLER_METADATA = "sampler_metadata.json"

# Slots of the scalar array (float64; positions and ends are exact integers far below 2 ** 53).
_ALPHA, _BETA, _EPS, _MAX_PRIORITY, _MAX_INDEX, _WRITTEN_END = range(6)


class PrioritizedSampler(Sampler):
    """Samples items in proportion to their priority (Schaul et al., 2015, "Prioritized Experience Replay").

    Item ``i`` with priority ``p_i`` is drawn with probability ``(p_i + eps) ** alpha / sum_j (p_j + eps)
    ** alpha`` (with replacement); ``info["priority_weight"]`` holds the importance weights
    ``(q_i / q_min) ** -beta`` of the drawn items, ``q = (p + eps) ** alpha``, in ``(0, 1]``. Written items
    (``mark_update``/``extend``/``add``) get :attr:`default_priority`, the largest priority seen, so they are
    sampled at least once soon; learners then call :meth:`update_priority`. The sums live in a float64
    segment tree: sampling and updating a batch cost ``O(batch * log(max_capacity))``, in compiled loops when
    the ``numba`` extra is installed (identical draws either way; ``TORCHRL_SEGMENT_TREE_KERNEL=numpy`` forces
    the numpy loops); ``python benchmarks/per_tree.py`` compares it with a uniform draw on your machine.

    Stateful (priorities), so a private DataLoader worker copy would sample from stale priorities
    (``requires_shared_state = True``); it can share its state (``can_share_state = True``):
    :meth:`share_memory_` moves the trees, the raw priorities and the scalars (``alpha``, ``beta``, the max
    priority) to shared memory, which ``rb.as_dataset()`` does, so that the main process and every DataLoader
    worker sample and update one copy.

    NOTE [prioritized consistency]: once shared, every read of the state (a draw, :meth:`state_dict`) and every
    write (:meth:`update_priority`, :meth:`extend`/:meth:`mark_update`, :meth:`load_state_dict`, ``alpha``)
    holds one cross-process lock (an ``flock``, released by the kernel if its holder dies), only for the tree
    work, never around reading the storage. So a batch drawn during an update reflects the tree entirely
    before or entirely after it: its positions and its importance weights come from one view of the tree.
    Positions are drawn among the first ``len(storage)`` items as read before the draw, and new items get a
    priority only after they are stored, so a drawn position always holds data. A writer killed in the middle
    of an update leaves a flag that makes the next holder of the lock rebuild the trees from the raw
    priorities.

    Args:
        max_capacity (int): the number of items the storage can hold (its ``max_size``; cells for
            ``ndim > 1`` storages).
        alpha (float): how strongly priorities shape sampling; ``0`` is uniform sampling. A one-element
            tensor is accepted (parameter schedulers set it that way) and stored as a float. Changing it
            later from ``0`` to another value warns (UserWarning), as TorchRL does.
        beta (float): the importance-sampling correction exponent; ``0`` gives weights of ``1``. A
            one-element tensor is accepted, as for ``alpha``.
        eps (float): added to every priority so that no item has probability zero. Defaults to ``1e-8``.
        dtype (torch.dtype): the dtype of ``info["priority_weight"]`` and the precision of the tree leaves
            (float64 for ``torch.float64``, float32 otherwise, so that ``(1 + 1e-8) ** 0.7`` is stored as
            ``1.0`` as in TorchRL); sums are float64 regardless. Defaults to ``torch.float``.
        reduction (str): how a TensorDict buffer reduces a priority entry with extra dims per item (see
            :func:`reduce_priority`); :meth:`update_priority` applies it to priorities of shape ``[N, ...]``.
            Defaults to ``"max"``.
        max_priority_within_buffer (bool): if ``True``, :attr:`default_priority` is the largest priority of
            the items currently stored (overwriting the item that holds it lowers it); if ``False``, the
            largest ever set. Defaults to ``False``.
        device (torch.device or str, optional): where the trees live (see NOTE [prioritized kernels] below).
            ``None``: the CPU, until a ``sample``/``update_priority``/``mark_update`` passes a storage on another
            device (the trees then move there, with their priorities); ``"cpu"``: the CPU always; another device
            (``"cuda"``): torch tensors there. Defaults to ``None``.
        max_pending (int): how many ``mark_update``/``extend`` calls may wait before their priorities are
            written, on the torch kernel (one batched write instead of many small ones): they are written before
            any read (``sample``, ``update_priority``, ``alpha``, ``state_dict``, ``dumps``, pickling), and when a
            call finds more than ``max_pending`` waiting; ``0`` writes every call at once. The numpy and numba
            kernels write at once (a write there costs microseconds). Defaults to ``64``.

    NOTE [prioritized kernels]: the trees are numpy arrays (numba loops when installed; shareable with DataLoader
    workers) or, with the ``torch`` kernel, torch tensors on any device (:mod:`._tensor_priorities`): the
    kernel is ``torch`` with a ``device`` other than the CPU, when a storage given to ``sample``/
    ``update_priority``/``mark_update`` is on another device (``device=None``) or ``compilable``, and with
    ``TORCHRL_SEGMENT_TREE_KERNEL=torch``. Its ``sample``, ``update_priority`` and ``mark_update`` make no host
    sync and trace under ``torch.compile(fullgraph=True)``; in exchange (as TorchRL's CUDA trees) they do not
    check positions or priorities (bad ones are skipped or stored as given), and its state is not shared with
    worker processes (:meth:`share_memory_` raises).

    Without a generator (``sampler._rng``, the buffer's ``generator=``), draws come from numpy's global generator,
    as in TorchRL: ``np.random.seed(0)`` makes them reproducible.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.storages import LazyTensorStorage
        >>> from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
        >>> storage = LazyTensorStorage(8)
        >>> storage.set(torch.arange(4), torch.arange(4))
        >>> sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0)
        >>> sampler.extend(torch.arange(4))
        >>> sampler.update_priority(torch.arange(4), torch.tensor([0.0, 0.0, 1.0, 3.0]))
        >>> sampler._rng = torch.Generator().manual_seed(0)
        >>> index, info = sampler.sample(storage, 1000)
        >>> sorted(index.unique().tolist())
        [2, 3]
        >>> sorted(info["priority_weight"].unique().tolist())
        [0.3333333432674408, 1.0]
    """

    requires_shared_state = True
    can_share_state = True
    draws_in_bounds = True  # positions below len(storage) by construction (clamped on the torch kernel)

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: torch.device | str | None = None,
        max_pending: int = 64,
    ) -> None:
        self._max_capacity = _check_max_capacity(max_capacity)
        alpha = _check_alpha(alpha)
        beta = _check_exponent("beta", beta)
        eps = _check_exponent("eps", eps)
        self._dtype = _check_dtype(dtype)
        self._device = check_tree_device(device)
        self._max_pending = _check_max_pending(max_pending)
        self._reduction = _check_reduction(reduction)
        self._max_priority_within_buffer = bool(max_priority_within_buffer)
        self._storage_shape: tuple[int, ...] | None = None
        self._guard = StateGuard()
        self._scalars = SharedArray(np.zeros(6))
        self._capacity = tree_capacity(self._max_capacity)  # positions that can hold a priority
        self._tensors: TensorPriorities | None = None  # the torch kernel's state (NOTE [prioritized kernels])
        tensor_device = self._initial_tensor_device()
        if tensor_device is None:
            self._sum_tree = SumSegmentTree(self._capacity)
            # Zero priorities are stored as +inf in the min tree: such items are never drawn, so the weight
            # normalization uses the smallest positive priority.
            self._min_tree = MinSegmentTree(self._capacity)
            self._priority_store = SharedArray(np.full(self._capacity, np.nan))  # raw priorities; NaN = never set
        else:  # the torch kernel from the start: no numpy trees
            self._sum_tree = self._min_tree = None
            self._priority_store = SharedArray(np.full(0, np.nan))
        self._attach_arrays()
        self._alpha, self._beta, self._eps = alpha, beta, eps
        if tensor_device is not None:
            self._tensors = self._new_tensors(tensor_device)
        self._reset_state()

    #: Whether this class may keep its trees as torch tensors (a subclass that reads the numpy trees says False).
    _tensor_kernel_ok = True

    def _initial_tensor_device(self) -> torch.device | None:
        """The device of the torch kernel at construction, or ``None`` for numpy trees."""
        return initial_tensor_device(self._device) if self._tensor_kernel_ok else None

    def _new_tensors(self, device: torch.device) -> TensorPriorities:
        return TensorPriorities(
            self._max_capacity, self._dtype, device, alpha=self._alpha, beta=self._beta, eps=self._eps,
            max_pending=self._max_pending, within_buffer=self._max_priority_within_buffer,
        )  # fmt: skip

    def _tensors_for(self, storage) -> TensorPriorities | None:
        """The torch kernel's state, switching to it first when ``storage`` asks for it (NOTE [prioritized
        kernels])."""
        if self._tensors is not None or storage is None or not self._tensor_kernel_ok:
            return self._tensors
        kept = self._numpy_storage
        if kept is not None and kept() is storage:  # checked already: a storage keeps its device and flag
            return None
        device = tensor_device_for(self._device, storage)
        if device is not None:
            return self._switch_to_tensors(device)
        try:
            self._numpy_storage = weakref.ref(storage)
        except TypeError:  # (a storage that takes no weak reference is checked every time)
            pass
        return None

    #: A weak reference to the last storage found to keep the numpy trees (see :meth:`_tensors_for`).
    _numpy_storage: weakref.ref | None = None

    def _switch_to_tensors(self, device: torch.device) -> TensorPriorities:
        """Moves the state to the torch kernel on ``device``, priorities included (TorchRL drops them)."""
        if self._guard.is_shared:
            raise RuntimeError(
                f"This PrioritizedSampler shares its state with worker processes (numpy trees in shared memory), so "
                f"it cannot move its trees to {device} for a storage there: build it with device='cpu' to keep "
                f"numpy trees, or do not share it (num_workers=0)."
            )
        tensors = self._new_tensors(device)
        with self._guard.write(self._repair_state):
            tensors.load(self._priority, self._sum_tree.values, self._min_tree.values, self._max_priority,
                         self._max_priority_index)  # fmt: skip
        self._tensors = tensors
        return tensors

    def _attach_arrays(self) -> None:
        """Fetches the numpy views of the stores (after they moved to shared memory or were unpickled)."""
        self._scalar_array = self._scalars.array
        self._priority = self._priority_store.array

    def _reset_state(self) -> None:
        """Forgets every priority, in place (the arrays stay where they are, shared or not)."""
        if self._tensors is not None:
            self._tensors.reset()
        if self._sum_tree is not None:
            self._sum_tree.reset()
            self._min_tree.reset()
        self._priority.fill(np.nan)
        self._max_priority = None
        self._max_priority_index = -1
        # One past the highest position ever given a priority: while it is <= len(storage), the whole-tree
        # total and minimum are those of the stored items (no range query needed when sampling).
        self._written_end = 0

    # -- state kept in the scalar array (shared with the trees) ---------------------------------------------
    _alpha = _scalar_property(_ALPHA, "The exponent applied to priorities.")
    _beta = _scalar_property(_BETA, "The importance-sampling exponent.")
    _eps = _scalar_property(_EPS, "Added to every priority.")
    _max_priority_index = _scalar_property(_MAX_INDEX, "Where the max priority is (-1: unknown).", int)
    _written_end = _scalar_property(_WRITTEN_END, "One past the last position holding a priority.", int)

    @property
    def _max_priority(self) -> float | None:
        """The largest priority seen (``None`` before any)."""
        value = float(self._scalar_array[_MAX_PRIORITY])
        return None if value != value else value

    @_max_priority.setter
    def _max_priority(self, value: float | None) -> None:
        self._scalar_array[_MAX_PRIORITY] = np.nan if value is None else value

    # -- sharing with DataLoader workers -------------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        """Whether the sampler's state lives in shared memory (see :meth:`share_memory_`)."""
        return self._guard.is_shared

    def share_memory_(self) -> PrioritizedSampler:
        """Moves the priorities, both trees and the scalars to shared memory, in place.

        Processes that receive the sampler afterwards (DataLoader workers under fork, spawn or forkserver)
        sample from and update the same state, under one cross-process lock (see NOTE [prioritized
        consistency] in the class docstring). ``rb.as_dataset()`` calls it; a no-op when shared already.
        ``pickle``/``torch.save``/``copy.deepcopy`` still give a private copy.

        Examples:
            >>> sampler = PrioritizedSampler(8, alpha=0.7, beta=0.5)
            >>> sampler.share_memory_().is_shared
            True
        """
        if self._tensors is not None:
            raise RuntimeError(
                f"This PrioritizedSampler keeps its trees as torch tensors on {self._tensors.device} (the torch "
                f"kernel: see NOTE [prioritized kernels] in its docstring), which are not shared with worker "
                f"processes: use num_workers=0, or a sampler with numpy trees (device=None or 'cpu' over a "
                f"storage that is neither compilable nor on an accelerator, without TORCHRL_SEGMENT_TREE_KERNEL=torch)."
            )
        if not self._guard.is_shared:  # private until now: no other process to exclude
            for store in (self._scalars, self._priority_store):
                store.share_memory_()
            self._sum_tree.share_memory_()
            self._min_tree.share_memory_()
            self._attach_arrays()
            self._guard.share_memory_()
        return self

    def _repair_state(self) -> None:
        """Rebuilds the trees and the scalars from the raw priorities (a writer died in the middle of a write)."""
        self._reexpress()
        self._written_end = self._end_of_written()
        known = self._priority[~np.isnan(self._priority)]
        if known.size and (self._max_priority is None or known.max() > self._max_priority):
            self._recompute_max()

    def __getstate__(self):
        state = super().__getstate__()
        for view in ("_scalar_array", "_priority"):  # views of the stores, which travel (shared or by value)
            state.pop(view, None)
        state.pop("_numpy_storage", None)
        return state

    def __setstate__(self, state) -> None:
        state.setdefault("_device", torch.device("cpu"))
        state.setdefault("_max_pending", 64)
        state.setdefault("_tensors", None)
        if "_capacity" not in state:  # pickled before the trees held the positions up to a power of two
            state["_capacity"] = state["_sum_tree"].capacity
        if "_scalars" not in state:  # pickled by a version that kept plain attributes: private arrays
            max_priority = state.pop("_max_priority", None)
            scalars = [
                state.pop("_alpha"),
                state.pop("_beta"),
                state.pop("_eps"),
                np.nan if max_priority is None else max_priority,
                state.pop("_max_priority_index", -1),
                state.pop("_written_end", 0),
            ]
            state["_scalars"] = SharedArray(np.array(scalars, dtype=np.float64))
            state["_priority_store"] = SharedArray(state.pop("_priority"))
            state["_guard"] = StateGuard()
        self.__dict__.update(state)
        self._attach_arrays()

    # -- configuration --------------------------------------------------------------------------------------
    @property
    def max_capacity(self) -> int:
        return self._max_capacity

    max_size = max_capacity

    @property
    def device(self) -> torch.device:
        """Where the trees live now (see the ``device`` argument).

        Examples:
            >>> PrioritizedSampler(8, alpha=0.7, beta=0.5).device
            device(type='cpu')
        """
        return torch.device("cpu") if self._tensors is None else self._tensors.device

    @property
    def max_pending(self) -> int:
        """How many ``mark_update`` calls may wait before their write (see the ``max_pending`` argument)."""
        return self._max_pending

    @property
    def kernel(self) -> str:
        """How the trees run: ``"torch"`` (tensors on :attr:`device`), ``"numba"`` or ``"numpy"``.

        Examples:
            >>> PrioritizedSampler(8, alpha=0.7, beta=0.5, device="cpu").kernel in ("numpy", "numba", "torch")
            True
        """
        return "torch" if self._tensors is not None else self._sum_tree.kernel

    @property
    def alpha(self) -> float:
        """The exponent applied to priorities. Setting it re-expresses the stored priorities with the new
        exponent, except when it leaves ``0``: as in TorchRL, the items stored under ``alpha=0`` keep the value
        ``1.0`` until their next :meth:`update_priority` (a UserWarning says so when there are such items).

        Raises:
            ValueError: a negative value.

        Examples:
            >>> import torch
            >>> sampler = PrioritizedSampler(8, alpha=0.0, beta=0.5)
            >>> sampler.alpha = 0.7  # no priority yet: no warning
            >>> sampler.extend(torch.arange(4))
            >>> sampler.alpha = 0.5
            >>> round(sampler._sum_tree.query(0, 4), 6)  # re-expressed: (1 + 1e-8) ** 0.5 each, in float32
            4.0
        """
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        value = _check_alpha(value)
        with self._guard.write(self._repair_state):
            self._set_alpha(value)

    def _set_alpha(self, value: float) -> None:
        tensors = self._tensors
        if tensors is not None:
            tensors.flush()
        if value == self._alpha:
            return
        if self._alpha == 0:
            # as TorchRL: the priorities written so far were stored as (p + eps) ** 0 = 1 and keep that value
            if tensors is not None:
                held = tensors.has_priorities()
            else:
                held = self._written_end > 0 and not np.isnan(self._priority[: self._written_end]).all()
            if held:
                ALPHA_LEAVES_ZERO.warn(alpha=value, stacklevel=4)
            self._set_exponents(alpha=value)
            return
        self._set_exponents(alpha=value)
        if tensors is not None:
            tensors.reexpress()
        else:
            self._reexpress()

    def _set_exponents(self, **values: float) -> None:
        """Sets ``alpha``/``beta``/``eps`` in the scalar array and, on the torch kernel, its copies (plain floats)."""
        for name, value in values.items():
            setattr(self, f"_{name}", value)
            if self._tensors is not None:
                setattr(self._tensors, name, float(value))

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._set_exponents(beta=_check_exponent("beta", value))

    @property
    def reduction(self) -> str:
        """How a priority with extra dims per item is reduced (see :func:`reduce_priority`)."""
        return self._reduction

    @reduction.setter
    def reduction(self, value: str) -> None:
        self._reduction = _check_reduction(value)

    @property
    def eps(self) -> float:
        return self._eps

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def max_priority_within_buffer(self) -> bool:
        return self._max_priority_within_buffer

    @property
    def default_priority(self) -> float:
        """The raw priority given to written items: the largest priority seen, ``1.0`` before any."""
        if self._tensors is not None:
            return float(self._tensors.default_priority())
        return 1.0 if self._max_priority is None else self._max_priority

    # -- sampling -------------------------------------------------------------------------------------------
    def can_sample(self, storage, batch_size: int) -> bool:
        """``True`` once ``storage`` holds an item and the stored items' priorities sum to more than zero."""
        tensors = self._tensors_for(storage)
        if tensors is not None:
            tensors.flush()
            return storage.has_rows and tensors.total() > 0
        return len(storage) > 0 and self._sum_tree.total > 0

    def sample(self, storage, batch_size: int) -> tuple[Any, dict[str, torch.Tensor]]:
        """Draws ``batch_size`` positions of ``storage`` in proportion to their priorities.

        Returns:
            ``(index, {"priority_weight": weights})``: ``index`` is a 1-D int64 tensor for 1-D storages and a
            tuple of per-dimension tensors for ``ndim > 1`` storages.

        Raises:
            RuntimeError: the storage is empty, or every stored item has a priority of zero.
            TypeError: the storage declares ``stable_items = False`` (a :class:`~torchrl.data.DatasetStorage`):
                a priority belongs to an index, not to the item a read of it realised. Sample such a storage
                with :class:`~torchrl.data.RandomSampler` or :class:`~torchrl.data.SamplerWithoutReplacement`.

        A storage holding more than ``max_capacity`` items is accepted, as in TorchRL: the trees hold a
        priority for every position below the next power of two strictly above ``max_capacity``; items past
        those positions have none and are never drawn. Without a generator the draws come from numpy's global
        generator (``np.random.seed`` reproduces them), as in TorchRL.
        """
        tensors = self._tensors if self._tensors is not None else self._tensors_for(storage)
        if tensors is not None:
            return self._sample_tensors(tensors, storage, batch_size)
        if not getattr(storage, "stable_items", True):
            raise unstable_items_error(self, storage)
        batch_size = check_batch_size(batch_size)
        n = check_not_empty(storage)
        # A storage larger than the trees (as TorchRL accepts it): only the items with a position in the trees
        # have a priority, and only they are drawn.
        if n > self._capacity:
            n = self._capacity
        ndim = storage.ndim
        if ndim > 1:
            self._remember_shape(storage)
        u = self._uniform_draws(batch_size)
        with self._guard.read(self._repair_state):  # one view of the tree: see NOTE [prioritized consistency]
            drawn = self._draw_locked(storage, u, n)
        if drawn is None:
            raise RuntimeError(
                f"Every one of the {n} stored items has priority zero (or none was set): tell the sampler "
                f"about written items (sampler.extend(index)) or set positive priorities with "
                f"update_priority()."
            )
        index, q, q_min, beta = drawn
        # (q / q_min) ** -beta, in place (the leaf values drawn are a fresh array)
        np.divide(q, q_min, out=q)
        weight = np.power(q, -beta, out=q)
        numpy_dtype = _NUMPY_DTYPES.get(self._dtype)
        if numpy_dtype is not None:
            weight = torch.from_numpy(weight.astype(numpy_dtype, copy=False))
        else:
            weight = torch.from_numpy(weight).to(self._dtype)
        index = torch.from_numpy(index)
        return (index if ndim == 1 else unravel(index, storage)), {"priority_weight": weight}

    def priority_mass(self, storage) -> tuple[float, float]:
        """``(sum, min)`` of ``q = (p + eps) ** alpha`` over the items a :meth:`sample` of ``storage`` draws from
        now (``min`` over the positive ones; ``(0.0, inf)`` when none): the weight of this sampler's items in a
        draw over several buffers (a :class:`~torchrl.data.ShardedRayReplayBuffer`'s two-level draw) and the
        minimum its importance weights divide by. Read from one view of the trees, as a draw reads them."""
        tensors = self._tensors if self._tensors is not None else self._tensors_for(storage)
        n = min(len(storage), self._capacity)
        if tensors is not None:
            tensors.flush()
            if n == 0:
                return 0.0, float("inf")
            smallest = float(tensors.min_tree.query(0, n))
            return float(tensors.sum_tree.query(0, n)), (
                float("inf") if smallest >= tensors.min_tree.identity_element else smallest
            )
        if n == 0:
            return 0.0, float("inf")
        with self._guard.read(self._repair_state):
            if int(self._scalar_array[_WRITTEN_END]) <= n:  # the draw's fast path: the whole tree
                return float(self._sum_tree.total), float(self._min_tree.reduce_all())
            return float(self._sum_tree.query(0, n)), float(self._stored_min(n))

    def _sample_tensors(self, tensors: TensorPriorities, storage, batch_size: int):
        """:meth:`sample` on the torch kernel: no host sync, one ``torch.compile`` graph (NOTE [tensor priorities
        without a host sync] in :mod:`._tensor_priorities`). The length is ``storage.len_tensor()``; the index and
        the weights come back on the storage's device."""
        if not getattr(storage, "stable_items", True):
            raise unstable_items_error(self, storage)
        batch_size = check_batch_size(batch_size)
        n = check_has_rows(storage)
        tensors.flush()
        where = getattr(storage, "device", None)
        where = torch.device(where) if isinstance(where, (str, torch.device)) else tensors.device
        index, weight = tensors.sample(batch_size, n, self._rng, dtype=self._dtype, device=where)
        if storage.ndim > 1:
            self._remember_shape(storage)
            return unravel(index, storage), {"priority_weight": weight}
        return index, {"priority_weight": weight}

    def _draw_locked(self, storage, u: np.ndarray, n: int):
        """``(positions, leaf values, smallest stored leaf, beta)`` drawn from one view of the trees (call it
        holding the guard), or ``None`` when every stored item has priority zero."""
        scalars = self._scalar_array
        written_end = int(scalars[_WRITTEN_END])
        # No priority past the stored items: the whole tree is searched (its fast path). Otherwise priorities
        # were set past len(storage) (a standalone sampler: update_priority without storage).
        if written_end <= n:
            drawn = draw_with_min(self._sum_tree, self._min_tree, u)
            if drawn is None:
                return None
            return (*drawn, float(scalars[_BETA]))
        drawn = self._sum_tree.draw(u, end=n)
        if drawn is None:
            # items written (and given priorities) since len(storage) was read, as another process may
            # have done before this one took the lock: they are stored, so they may be drawn
            n = min(len(storage), self._capacity)
            drawn = self._sum_tree.draw(u, end=None if written_end <= n else n)
            if drawn is None:
                return None
        return (*drawn, self._stored_min(n), float(scalars[_BETA]))

    def _uniform_draws(self, count: int) -> np.ndarray:
        """``count`` float64 draws in ``[0, 1)``: from the sampler's generator, or without one from numpy's
        global generator (TorchRL's source, which its users seed with ``np.random.seed``)."""
        rng = self._rng
        if rng is None:
            return np.random.random_sample(count)
        if rng.device.type == "cpu":
            return torch.rand(count, generator=rng, dtype=torch.float64).numpy()
        return torch.rand(count, generator=rng, dtype=torch.float64, device=rng.device).cpu().numpy()

    # -- priorities -----------------------------------------------------------------------------------------
    def update_priority(self, index, priority, *, storage=None) -> None:
        """Sets the raw priorities of the items at ``index``.

        Args:
            index: an int, a 1-D tensor/sequence of flat positions, or for ``ndim > 1`` storages a tuple of
                per-dimension tensors or an ``[N, ndim]`` tensor. Entries equal to ``-1`` (items a writer
                did not insert) are skipped; when a position repeats, the last priority wins.
            priority: a number, or one priority per index (tensor of any real dtype, ndarray or sequence);
                a tensor of shape ``[N, ...]`` is first reduced with ``reduction``. Must be finite and
                ``>= 0`` (see :func:`check_priorities`); complex values are refused.

        Keyword Args:
            storage (Storage, optional): the storage indexed, needed to ravel per-dimension indices of
                ``ndim > 1`` storages (remembered once seen). When given, only written positions (below
                ``len(storage)``) are accepted; without it (a standalone sampler), any position the trees hold
                (below the next power of two strictly above ``max_capacity``). Defaults to ``None``.

        Raises:
            IndexError: a position is out of range, or (with ``storage``) was never written: a priority
                there would raise the default priority of the next written items.
            ValueError: a priority is NaN, infinite or negative.
            TypeError: a priority is not a real number (a complex or boolean value).

        A refused call changes nothing. On the torch kernel nothing is checked (see NOTE [prioritized kernels]).
        """
        tensors = self._tensors if self._tensors is not None else self._tensors_for(storage)
        if tensors is not None:
            tensors.flush()
            flat = self._flat_tensor(index, storage, tensors.device)
            priority = tensor_priority(priority, flat.shape[0], self.reduction, tensors.raw.dtype, tensors.device)
            tensors.write(flat, priority)
            return
        flat = self._flat_index(index, storage)
        values = self._priority_values(priority, flat.size)
        if not flat.size:
            return
        if self._compiled_update(flat, values, storage):
            return
        # One sort gives the range of the positions and whether some repeat (the common case: in range, no -1).
        ordered = np.sort(flat)
        lo, hi = int(ordered[0]), int(ordered[-1])
        if 0 <= lo and hi < self._capacity:
            end, repeated = hi + 1, bool((ordered[1:] == ordered[:-1]).any())
        else:  # -1 entries to skip, or a position out of range (which raises)
            keep, end = self._kept_positions(flat)
            if keep is not None:
                flat, values = flat[keep], values[keep]
            if not flat.size:
                return
            repeated = None  # unknown: _last_wins checks
        if storage is not None and end > len(storage):
            self._refuse_unwritten(flat, len(storage))
        top = values.max()
        if not (top < np.inf and values.min() >= 0):  # NaN fails the first test
            check_priorities(values)  # raises, naming the bad values
        kept = values
        if repeated is not False:
            flat, kept = _last_wins(flat, values, repeated=repeated)
            if kept is not values:  # repeated positions: only the last value of each counts
                top = kept.max()
        with self._guard.write(self._repair_state):
            self._write(flat, kept, end)
            self._track_max(flat, kept, float(top))

    def _compiled_update(self, flat: np.ndarray, values: np.ndarray, storage) -> bool:
        """:meth:`update_priority` in two compiled calls when both trees are compiled and the update is valid (in
        range, written, finite priorities ``>= 0``, no ``-1`` entry); ``False`` (nothing done) otherwise, for the
        checking path to raise or filter. Same result as that path (repeated positions: the last write wins)."""
        sums, mins = self._sum_tree, self._min_tree
        if mins.kernel != "numba":
            return False
        flat = _int64(flat)
        values = _float64(values)
        ranges = compiled_ranges(sums, flat, values)
        if ranges is None:
            return False
        lo, hi, smallest, top = ranges
        if not (0 <= lo and hi < self._capacity and top < np.inf and smallest >= 0):  # NaN fails `top < inf`
            return False
        if storage is not None and hi >= len(storage):
            return False
        q = values + self._eps  # (raw + eps) ** alpha, rounded to float32 in the compiled write (see _expressed)
        np.power(q, self._alpha, out=q)
        with self._guard.write(self._repair_state):
            self._compiled_write(flat, values, q, hi + 1)
        return True

    def _compiled_write(self, flat: np.ndarray, raw: np.ndarray, q: np.ndarray, end: int) -> None:
        scalars = self._scalar_array  # _written_end, _max_priority and its index, without the properties
        if end > scalars[_WRITTEN_END]:
            scalars[_WRITTEN_END] = end
        float32 = self._dtype is not torch.float64
        top, where = write_priorities(self._sum_tree, self._min_tree, self._priority, flat, raw, q, float32=float32)
        if not top < scalars[_MAX_PRIORITY]:  # top >= the max priority, or none yet (NaN)
            scalars[_MAX_PRIORITY], scalars[_MAX_INDEX] = top, where
        elif self._max_priority_within_buffer and (flat == self._max_priority_index).any():
            self._recompute_max()

    def mark_update(self, index, *, storage=None) -> None:
        """Gives the written items at ``index`` the :attr:`default_priority` (``-1`` entries skipped).

        Items written past the positions of the trees (a storage larger than the sampler, as TorchRL accepts)
        get no priority: they are never drawn. On the torch kernel the write may wait (see ``max_pending``).
        """
        tensors = self._tensors if self._tensors is not None else self._tensors_for(storage)
        if tensors is not None:
            tensors.mark(self._flat_tensor(index, storage, tensors.device))
            return
        flat = self._flat_index(index, storage)
        if flat.size and flat.max() >= self._capacity:
            flat = flat[flat < self._capacity]
        keep, end = self._kept_positions(flat)
        if keep is not None:
            flat = flat[keep]
        if not flat.size:
            return
        with self._guard.write(self._repair_state):
            if self._max_priority_within_buffer and self._max_priority_index >= 0:
                if (flat == self._max_priority_index).any():  # the item holding the max is overwritten
                    self._recompute_max(exclude=flat)
            self._write(flat, np.full(flat.size, self.default_priority), end)
            if self._max_priority is None:
                self._max_priority, self._max_priority_index = self.default_priority, int(flat[0])

    def extend(self, index) -> None:
        """Called after a batch was written at ``index``: same as :meth:`mark_update`."""
        self.mark_update(index)

    def add(self, index) -> None:
        """Called after one item was written at ``index``: same as :meth:`mark_update`."""
        self.mark_update(index)

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The sampler's state, in TorchRL's public layout plus the raw priorities.

        - ``_schema_version`` (``1``), ``_alpha``, ``_beta``, ``_eps``;
        - ``_max_priority``: the raw-domain pair ``(value, index)`` (``(None, -1)`` before any priority);
        - ``_sum_tree``, ``_min_tree``: the trees' leaves, as their ``state_dict()`` (``{"capacity", "values"}``,
          copies: mutating them does not change the sampler); :meth:`load_state_dict` also takes the trees
          themselves (TorchRL's state holds copies of its trees, which a checkpoint could not store without
          pickle);
        - ``_max_capacity``; ``_priority``: the raw priority of each tree position (NaN: never set), which
          re-expresses them when ``alpha`` changes (TorchRL keeps none).

        A shared sampler is copied under its lock: a consistent snapshot even while workers sample.

        Examples:
            >>> import torch
            >>> sampler = PrioritizedSampler(5, alpha=0.7, beta=0.5)
            >>> sampler.extend(torch.arange(8))  # positions up to 7: the trees hold 8
            >>> state = sampler.state_dict()
            >>> state["_schema_version"], state["_max_priority"], float(state["_sum_tree"]["values"].sum())
            (1, (1.0, 0), 8.0)
        """
        with self._guard.read(self._repair_state):
            if self._tensors is not None:  # the torch kernel's state, in the same layout
                snap = self._tensors.snapshot()
                top = (snap["max_priority"], snap["max_index"])
                sums, mins = ({"capacity": self._capacity, "values": torch.from_numpy(snap[k])} for k in ("sum", "min"))
                priority = torch.from_numpy(snap["priority"])
            else:
                top = (self._max_priority, self._max_priority_index)
                sums, mins = self._sum_tree.state_dict(), self._min_tree.state_dict()
                priority = torch.from_numpy(self._priority.copy())
            return {
                "_schema_version": SCHEMA_VERSION,
                "_alpha": self._alpha,
                "_beta": self._beta,
                "_eps": self._eps,
                "_max_priority": top,
                "_sum_tree": sums,
                "_min_tree": mins,
                "_max_capacity": self._max_capacity,
                "_priority": priority,
            }

    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Checks a state saved by :meth:`state_dict` (TorchRL's layout, with or without ``_schema_version``, or
        the ``max_capacity``/``alpha``/``priority``/``sum_tree`` layout of earlier versions) against this sampler:
        the capacity, the exponents, finite non-negative tree values, the max priority. See
        :func:`~torchrl.data.replay_buffers.samplers._priorities.validated_prioritized_state`."""
        return validated_prioritized_state(state, type(self).__name__, self._max_capacity, self._capacity)

    def _apply_state(self, state: dict[str, Any]) -> None:
        tensors = self._tensors
        if tensors is not None:  # the torch kernel: its tensors replaced in place (pending writes dropped)
            self._set_exponents(alpha=state["alpha"], beta=state["beta"], eps=state["eps"])
            tensors.load(state["priority"], state["sum"], state["min"], state["max_priority"], state["max_index"])
            if state["max_priority"] is None and state["recompute_max"]:
                tensors.recompute_max()
            return
        with self._guard.write(self._repair_state):  # in place: a shared state stays shared
            self._alpha, self._beta, self._eps = state["alpha"], state["beta"], state["eps"]
            self._priority[:] = state["priority"]
            self._sum_tree.set_all(state["sum"])
            self._min_tree.set_all(state["min"])
            self._written_end = self._end_of_written()
            if state["max_priority"] is None and state["recompute_max"]:
                self._recompute_max()
            else:
                self._max_priority, self._max_priority_index = state["max_priority"], state["max_index"]

    def dumps(self, path, **kwargs) -> None:
        """Saves the sampler to the checkpoint directory ``path`` (see :meth:`Component.dumps`), and beside it
        ``sampler_metadata.json``, TorchRL's summary: ``_schema_version``, ``_alpha``, ``_beta``, ``_eps``,
        ``_max_capacity`` and ``_max_priority`` as ``[value, index]``. :meth:`loads` reads the checkpoint only.

        Examples:
            >>> import json, os, tempfile, torch
            >>> sampler = PrioritizedSampler(8, alpha=0.7, beta=0.5)
            >>> sampler.extend(torch.arange(3))
            >>> with tempfile.TemporaryDirectory() as d:
            ...     sampler.dumps(d + "/s")
            ...     meta = json.load(open(os.path.join(d, "s", "sampler_metadata.json")))
            >>> meta["_schema_version"], meta["_max_priority"]
            (1, [1.0, 0])
        """
        super().dumps(path, **kwargs)
        state = self.state_dict()
        meta = {key: state[key] for key in ("_schema_version", "_alpha", "_beta", "_eps", "_max_capacity")}
        meta["_max_priority"] = list(state["_max_priority"])
        raw = json.dumps(meta).encode()  # beside the checkpoint, replaced atomically (loads does not read it)
        write_file_atomically(
            os.path.join(os.fspath(path), _SAMPLER_METADATA),
            lambda f: f.write(raw),
            fsync=kwargs.get("fsync", True),
        )

    def _empty(self) -> None:
        with self._guard.write(self._repair_state):
            self._reset_state()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self._alpha}, "
            f"beta={self._beta}, eps={self._eps}, reduction={self.reduction!r})"
        )

    # -- the index and priority arguments of updates ------------------------------------------------------
    # update_priority and mark_update accept an int, a 1-D sequence of flat positions, per-dimension coordinates
    # of an ndim > 1 storage (a tuple of tensors or an [N, ndim] tensor), -1 entries for items a writer skipped,
    # and priorities of any real dtype (reduced with `reduction` when they carry extra dims per item). These turn
    # them into flat int64 positions and float64 values, refusing positions out of range or never written, before
    # the trees are touched.
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
        if lo < 0 or hi >= self._capacity:
            bad = lo if lo < 0 else hi
            raise IndexError(
                f"`index` {bad} is out of range for a PrioritizedSampler of max_capacity {self._max_capacity}, "
                f"whose trees hold positions [0, {self._capacity}): pass positions in that range (or -1 to skip "
                f"an entry), or build the sampler with the storage's max_size."
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

    def _flat_tensor(self, index, storage, device: torch.device) -> torch.Tensor:
        """:meth:`_flat_index` as an int64 tensor on ``device``, by tensor ops only for tensor indices (flat
        positions, per-dimension coordinates, ``[N, ndim]`` rows): no host sync, nothing checked."""
        if storage is not None and storage.ndim > 1:
            self._remember_shape(storage)
        flat = tensor_positions(index, self._storage_shape, device)
        if flat is None:  # other forms (ints, sequences, arrays): checked on the host
            flat = torch.from_numpy(self._flat_index(index, storage)).to(device)
        return flat

    def _ravel(self, coords: list[np.ndarray]) -> np.ndarray:
        return _ravel_coords(coords, self._storage_shape)

    def _priority_values(self, priority, count: int) -> np.ndarray:
        if isinstance(priority, torch.Tensor) and priority.ndim == 1 and priority.numel() == count:
            if priority.is_cpu and priority.dtype in (torch.float32, torch.float64):  # the common case
                return priority.detach().numpy().astype(np.float64, copy=False)  # read-only from here on
            if not (priority.is_complex() or priority.dtype == torch.bool):  # those are refused below
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

    # -- internals ------------------------------------------------------------------------------------------
    def _write(self, flat: np.ndarray, raw: np.ndarray, end: int) -> None:
        """Stores raw priorities at unique in-range positions (all ``< end``) and their transforms."""
        scalars = self._scalar_array  # (_written_end, read and set without the property: a hot path)
        if end > scalars[_WRITTEN_END]:
            scalars[_WRITTEN_END] = end
        self._priority[flat] = raw
        update_sum_and_min(self._sum_tree, self._min_tree, flat, self._expressed(raw))

    def _expressed(self, raw: np.ndarray) -> np.ndarray:
        """``(raw + eps) ** alpha`` at the precision of the leaves: float64 for ``dtype=torch.float64``, else
        rounded to float32 (clamped to its largest finite value), as TorchRL's float32 trees store it."""
        scalars = self._scalar_array  # (_eps and _alpha, read without the properties: a hot path)
        q = raw + float(scalars[_EPS])
        np.power(q, float(scalars[_ALPHA]), out=q)
        if self._dtype is torch.float64:
            return q
        np.minimum(q, _FLOAT32_MAX, out=q)
        return q.astype(np.float32).astype(np.float64)

    def _track_max(self, flat: np.ndarray, values: np.ndarray, top: float) -> None:
        """Updates the max priority after ``values`` (largest: ``top``) were written at ``flat``."""
        if self._max_priority is None or top >= self._max_priority:
            self._max_priority, self._max_priority_index = top, int(flat[int(values.argmax())])
        elif self._max_priority_within_buffer and (flat == self._max_priority_index).any():
            self._recompute_max()

    def _recompute_max(self, exclude: np.ndarray | None = None) -> None:
        """The max over the stored raw priorities (minus ``exclude``); ``None`` (-> 1.0) if there are none."""
        raw = self._priority
        if exclude is not None:
            raw = raw.copy()
            raw[exclude] = np.nan
        if np.isnan(raw).all():
            self._max_priority, self._max_priority_index = None, -1
            return
        k = int(np.nanargmax(raw))
        self._max_priority, self._max_priority_index = float(raw[k]), k

    def _reexpress(self) -> None:
        """Recomputes every stored ``(p + eps) ** alpha`` (after ``alpha`` changed)."""
        known = ~np.isnan(self._priority)
        q = np.zeros(self._capacity)
        q[known] = self._expressed(self._priority[known])
        self._sum_tree.set_all(q)
        self._min_tree.set_all(np.where(q > 0, q, np.inf))

    def _stored_min(self, n: int) -> float:
        """The smallest transformed priority among the first ``n`` positions (``+inf`` if none is positive)."""
        if self._written_end <= n:  # nothing set past them: one pass over the flat level
            return self._min_tree.reduce_all()
        return self._min_tree.query(0, n)

    def _end_of_written(self) -> int:
        """One past the highest position holding a priority (``0`` if none)."""
        held = np.flatnonzero((self._sum_tree.values != 0) | (self._min_tree.values != np.inf))
        return int(held[-1]) + 1 if held.size else 0
