"""Vectorized sum and min segment trees over float64 leaves (numpy; compiled loops with the ``numba`` extra).

A segment tree keeps a reduction (sum or min) of every aligned block of its leaves, so that a range
reduction and, for sums, a prefix-sum search cost ``O(log capacity)`` instead of ``O(capacity)``. The
prioritized sampler uses a :class:`SumSegmentTree` to draw indices in proportion to their priorities and a
:class:`MinSegmentTree` to normalize importance weights.

Data model: the tree is one flat float64 array of ``2 * size`` slots, ``size`` the smallest power of two
``>= capacity``. The children of slot ``i`` are ``2 * i`` and ``2 * i + 1``, leaf ``j`` lives in slot
``size + j`` and level ``k`` (``2 ** k`` slots) starts at slot ``2 ** k``. Leaves past ``capacity`` and leaves
never written hold the reduction's identity (``0`` for sums, ``+inf`` for mins). Viewing the array as
complex128 puts the two children of slot ``i`` in one element ``i``, so one 1-D gather reads both.

The tree is kept from the leaves up to the "flat level" of ``2 ** 11`` slots (the whole tree when it is
smaller); the levels above it are not stored: a query ends with one contiguous reduction of at most 2048
slots of the flat level and a search starts with one ``cumsum`` + ``searchsorted`` over it, which costs less
than maintaining 11 more levels on every update. Every operation takes a batch and runs a fixed number of
numpy calls per level, never a Python loop over items.

A :class:`MinSegmentTree` keeps only its leaves and the flat level (the same slots, so the array and its
pickles keep the layout above): flat slot ``2 ** f + b`` is the minimum of the block ``b`` of
``size >> f`` leaves. An update lowers the minimum of its block or, when the leaf that held it grew,
recomputes that block from its leaves (one scan per block, however many of its leaves grew), so
that an update touches one leaf and one flat slot instead of a slot per level. A range minimum scans the
leaves of its partial blocks at both ends.

With the ``numba`` extra installed, the per-level loops of updates and searches run compiled instead, with
bit-identical results (see :mod:`._tree_kernels` and its NOTE [identical draws]); ``kernel="numpy"`` or
``TORCHRL_SEGMENT_TREE_KERNEL=numpy`` keeps the numpy calls.

Trees as torch tensors on any device (the ``torch`` kernel, with TorchRL's tree API and names,
``SumSegmentTreeFp32`` and its siblings) live in :mod:`.tensor_segment_tree`.

The array can move to shared memory (:meth:`~_SegmentTree.share_memory_`), so that DataLoader workers sample
from the tree the main process updates; the tree itself takes no lock (the prioritized samplers do).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from torchrl._validation import check_int, check_positive_int, is_int
from torchrl.data.replay_buffers._shared.arrays import SharedArray
from torchrl.data.replay_buffers.samplers._tree_kernels import compiled_kernels, resolve_kernel

# Levels from the root whose slots ``update`` recomputes whole and ``scan_lower_bound`` searches with one
# cumsum: 2 ** 11 slots is where a contiguous pass becomes cheaper than per-level scattered gathers.
_FLAT_LEVEL = 11


def _as_index_array(index, name: str = "index") -> np.ndarray:
    """A 1-D int64 array from an int, a 1-D tensor/ndarray or a sequence of ints."""
    is_mask = isinstance(index, (torch.Tensor, np.ndarray)) and index.dtype in (torch.bool, np.bool_)
    if isinstance(index, bool) or is_mask:
        raise TypeError(f"`{name}` must hold integer positions, got a boolean {type(index).__name__}.")
    if isinstance(index, (int, np.integer)):
        return np.array([index], dtype=np.int64)
    if isinstance(index, torch.Tensor):
        if index.is_floating_point() or index.is_complex():
            raise TypeError(f"`{name}` must hold integer positions, got a tensor of dtype {index.dtype}.")
        array = index.detach().cpu().numpy()
    else:
        try:
            array = np.asarray(index)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"`{name}` must be an int or a 1-D sequence of ints, got {type(index).__name__} {index!r}."
            ) from err
        if array.size == 0:
            return np.empty(0, dtype=np.int64)
        if not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"`{name}` must hold integer positions, got an array of dtype {array.dtype}.")
    if array.ndim > 1:
        raise ValueError(f"`{name}` must be an int or a 1-D index, got shape {list(array.shape)}.")
    return array.reshape(-1).astype(np.int64, copy=False)


def _as_value_array(value, count: int | None = None, name: str = "value") -> np.ndarray:
    """A 1-D float64 array from a number, a real tensor or a sequence (broadcast to ``count``); complex and
    boolean values are refused (a complex value cast to float would silently lose its imaginary part)."""
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"`{name}` must hold real numbers, got a tensor of dtype {value.dtype}.")
        array = value.detach().to("cpu", torch.float64).numpy()
    else:
        if isinstance(value, complex) or np.iscomplexobj(value):
            shown = value if np.ndim(value) == 0 else np.asarray(value).reshape(-1)[:3].tolist()
            raise TypeError(
                f"`{name}` must hold real numbers, got complex values ({shown}): pass real ones, e.g. their "
                f"magnitude (abs(x)). Nothing was changed."
            )
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"`{name}` must be a number, a tensor or a sequence of numbers, got {type(value).__name__}."
            ) from err
    array = array.reshape(-1)
    if count is not None and array.size != count:
        if array.size != 1:
            raise ValueError(
                f"`{name}` has {array.size} entries for {count} indices: pass one value per index or a "
                f"single value for all of them."
            )
        array = np.full(count, array[0])
    return array


def _last_wins(
    index: np.ndarray, value: np.ndarray, *, repeated: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Drops all but the last occurrence of every repeated index (numpy does not order repeated writes).

    ``repeated=True`` skips the check for repeats (a caller that found some): the result is sorted by index.
    """
    if index.size < 2:
        return index, value
    if repeated is None:
        ordered = np.sort(index)
        if not (ordered[1:] == ordered[:-1]).any():
            return index, value
    order = np.argsort(index, kind="stable")
    ordered = index[order]
    keep = np.empty(ordered.size, dtype=bool)
    keep[-1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[:-1])
    return ordered[keep], value[order[keep]]


def _int64(array: np.ndarray) -> np.ndarray:
    """``array`` as a contiguous int64 array (no copy when it is one): what the compiled loops take."""
    if array.dtype != np.int64 or not array.flags.c_contiguous:
        return np.ascontiguousarray(array, dtype=np.int64)
    return array


def _float64(array: np.ndarray) -> np.ndarray:
    """``array`` as a contiguous float64 array (no copy when it is one)."""
    if array.dtype != np.float64 or not array.flags.c_contiguous:
        return np.ascontiguousarray(array, dtype=np.float64)
    return array


class _SegmentTree:
    """Shared machinery of the sum and min trees (``_ufunc``/``_reduce_two``/``identity`` vary)."""

    identity: float
    _ufunc: np.ufunc
    _compiled_update: str  # the name of the compiled update loop in compiled_kernels()

    def __init__(self, capacity: int, *, kernel: str | None = None) -> None:
        self._capacity = check_positive_int("capacity", capacity)
        self._depth = (self._capacity - 1).bit_length()
        self._size = 1 << self._depth
        self._flat_level = min(self._depth, _FLAT_LEVEL)
        self._kernel = resolve_kernel(kernel)
        self._store = SharedArray(np.full(2 * self._size, self.identity, dtype=np.float64))
        self._make_views()

    def _make_views(self) -> None:
        # _pairs[i] holds slots (2i, 2i+1), the children of slot i; _leaves is the last level.
        self._tree = self._store.array
        self._pairs = self._tree.view(np.complex128)
        self._leaves = self._tree[self._size :]
        self._jit = compiled_kernels() if self._kernel == "numba" else None
        if self._jit is None:
            self._kernel = "numpy"

    # -- public API -----------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """The number of leaves."""
        return self._capacity

    @property
    def values(self) -> np.ndarray:
        """The ``capacity`` leaf values: a read-only float64 view (no copy) that follows later updates."""
        view = self._leaves[: self._capacity]
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return self._capacity

    @property
    def kernel(self) -> str:
        """How the per-level loops run: ``"numba"`` (compiled) or ``"numpy"``; both give identical results."""
        return self._kernel

    @property
    def is_shared(self) -> bool:
        """Whether the tree lives in shared memory (see :meth:`share_memory_`)."""
        return self._store.is_shared

    def share_memory_(self) -> _SegmentTree:
        """Moves the tree to shared memory, in place: processes that receive it afterwards (fork, spawn,
        forkserver) read and write the same slots. Callers order concurrent access themselves (the prioritized
        samplers hold their state lock). A no-op when the tree is shared already."""
        self._store.share_memory_()
        self._make_views()
        return self

    def reset(self) -> None:
        """Sets every leaf back to the identity (``0`` for sums, ``+inf`` for mins), in place."""
        self._tree.fill(self.identity)

    def update(self, index, value) -> None:
        """Sets the leaves at ``index`` to ``value`` and re-reduces their ancestors.

        Args:
            index (int, 1-D tensor, ndarray or sequence of ints): leaf positions in ``[0, capacity)``.
                When a position repeats, the last value given for it wins.
            value (number, tensor or sequence): one value per index, or a single value for all of them.
        """
        index = self._checked_index(index)
        value = _as_value_array(value, index.size)
        self._check_values(value)
        if index.size:
            self._update_unique(*_last_wins(index, value))

    __setitem__ = update

    def update_unique(self, index: np.ndarray, value: np.ndarray) -> None:
        """:meth:`update` for a caller that already holds checked arrays: nothing is validated.

        Args:
            index (ndarray): int64 leaf positions in ``[0, capacity)``, without repeats.
            value (ndarray): float64 values, one per position, valid for the tree (for a sum tree finite and
                ``>= 0``; never NaN).
        """
        self._update_unique(index, value)

    def set_all(self, values) -> None:
        """Replaces every leaf at once (``capacity`` values) and rebuilds the tree: ``O(capacity)``."""
        values = _as_value_array(values, name="values")
        if values.size != self._capacity:
            raise ValueError(f"`values` has {values.size} entries, expected one per leaf ({self._capacity}).")
        self._check_values(values)
        self._leaves[: self._capacity] = values
        self._rebuild()

    def reduce_all(self) -> float:
        """The reduction of every leaf in one pass over the top kept level.

        Equals ``query()`` (for a sum tree, up to float rounding: the terms are added in another order).
        """
        return self._flat_total()

    def __getitem__(self, index):
        """Leaf values: a float for an int, a float64 tensor for a tensor, an ndarray otherwise."""
        if isinstance(index, slice):
            return self._leaves[: self._capacity][index].copy()
        if is_int(index):
            return float(self._leaves[self._checked_index(index)[0]])
        values = self._leaves[self._checked_index(index)]
        return torch.from_numpy(values) if isinstance(index, torch.Tensor) else values

    def query(self, start: int = 0, end: int | None = None) -> float:
        """The reduction of the leaves in ``[start, end)``; the identity for an empty range.

        Args:
            start (int): first leaf of the range. Defaults to ``0``.
            end (int, optional): one past the last leaf. Defaults to ``capacity``.
        """
        end = self._capacity if end is None else end
        for name, bound in (("start", start), ("end", end)):
            check_int(name, bound)
        if not 0 <= start <= end <= self._capacity:
            raise ValueError(
                f"`start`={start} and `end`={end} must satisfy 0 <= start <= end <= capacity "
                f"({self._capacity})."
            )
        tree, reduce_two = self._tree, self._reduce_two
        result = self.identity
        lo, hi = int(start) + self._size, int(end) + self._size
        for _ in range(self._depth - self._flat_level):  # partial blocks at both ends, level by level
            if lo >= hi:
                return result
            if lo & 1:
                result = reduce_two(result, float(tree[lo]))
                lo += 1
            if hi & 1:
                hi -= 1
                result = reduce_two(result, float(tree[hi]))
            lo >>= 1
            hi >>= 1
        if lo < hi:  # the rest is a contiguous run of the flat level
            result = reduce_two(result, float(self._ufunc.reduce(tree[lo:hi])))
        return result

    def state_dict(self) -> dict[str, Any]:
        """``{"capacity": int, "values": float64 tensor of the leaves}``; the inner levels are derived."""
        return {"capacity": self._capacity, "values": torch.from_numpy(self._leaves[: self._capacity].copy())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the leaves saved by :meth:`state_dict` and rebuilds the inner levels.

        Raises:
            ValueError: the state was saved from a tree of another capacity, or holds invalid values.
        """
        values = self._values_from_state(state_dict)
        self._leaves[: self._capacity] = values
        self._rebuild()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self._capacity})"

    def __getstate__(self):
        state = self.__dict__.copy()
        for view in ("_tree", "_pairs", "_leaves", "_jit"):  # views of the store (which travels) and compiled code
            state.pop(view, None)
        return state

    def __setstate__(self, state) -> None:
        if "_store" not in state:  # pickled before the store existed: the array itself travelled
            state["_store"] = SharedArray(state.pop("_tree"))
        # pickled before the kernel choice, or by a process with numba: re-resolved here (identical results)
        state["_kernel"] = resolve_kernel(state.get("_kernel", None))
        self.__dict__.update(state)
        self._make_views()

    # -- internals ------------------------------------------------------------------------------------------
    def _values_from_state(self, state_dict: dict[str, Any]) -> np.ndarray:
        """Validated leaf values of ``state_dict`` (nothing is modified)."""
        if not isinstance(state_dict, dict) or not {"capacity", "values"} <= state_dict.keys():
            raise ValueError(
                f"`state_dict` must be a dict with 'capacity' and 'values' (from {type(self).__name__}."
                f"state_dict()), got {type(state_dict).__name__} with keys "
                f"{sorted(state_dict) if isinstance(state_dict, dict) else None}."
            )
        capacity = int(state_dict["capacity"])
        if capacity != self._capacity:
            raise ValueError(
                f"`state_dict` was saved from a {type(self).__name__} of capacity {capacity}, this one has "
                f"capacity {self._capacity}: create the tree with capacity={capacity} to load it."
            )
        values = _as_value_array(state_dict["values"], name="state_dict['values']")
        if values.size != capacity:
            raise ValueError(
                f"`state_dict['values']` has {values.size} entries, expected one per leaf ({capacity})."
            )
        self._check_values(values)
        return values

    def _checked_index(self, index) -> np.ndarray:
        index = _as_index_array(index)
        if index.size:
            lo, hi = index.min(), index.max()
            if lo < 0 or hi >= self._capacity:
                bad = lo if lo < 0 else hi
                raise IndexError(
                    f"`index` {bad} is out of range for a {type(self).__name__} of capacity "
                    f"{self._capacity}: pass positions in [0, {self._capacity})."
                )
        return index

    def _check_values(self, value: np.ndarray) -> None:
        if value.size and np.isnan(value).any():
            raise ValueError(f"`value` must not contain NaN, got {value[np.isnan(value)][:3]}.")

    def _update_unique(self, index: np.ndarray, value: np.ndarray) -> None:
        """Writes leaves (``index`` in range, without repeats) and re-reduces their ancestors."""
        if self._jit is not None:
            self._jit[self._compiled_update](
                self._tree, self._depth, self._flat_level, _int64(index), _float64(value)
            )
            return
        tree, pairs, ufunc = self._tree, self._pairs, self._ufunc
        node = index + self._size
        tree[node] = value
        for _ in range(self._depth - self._flat_level):
            node >>= 1
            children = pairs[node]
            tree[node] = ufunc(children.real, children.imag)

    def _flat_total(self) -> float:
        """The reduction of every leaf (unwritten ones hold the identity): one pass over the flat level."""
        lo = 1 << self._flat_level
        return float(self._ufunc.reduce(self._tree[lo : 2 * lo]))

    def _rebuild(self) -> None:
        """Recomputes every kept level from the leaves."""
        tree, pairs, ufunc = self._tree, self._pairs, self._ufunc
        self._leaves[self._capacity :] = self.identity
        for level in range(self._depth - 1, self._flat_level - 1, -1):
            lo = 1 << level
            children = pairs[lo : 2 * lo]
            ufunc(children.real, children.imag, out=tree[lo : 2 * lo])


class SumSegmentTree(_SegmentTree):
    """A segment tree of sums over ``capacity`` non-negative float64 leaves.

    Sums are float64 whatever the precision of the values written. Besides range sums it answers batched
    prefix-sum searches (:meth:`scan_lower_bound`), the primitive of proportional sampling: drawing ``v``
    uniformly in ``(0, total]`` and searching it picks leaf ``i`` with probability ``leaf_i / total``.

    Args:
        capacity (int): the number of leaves; all start at ``0``.

    Keyword Args:
        kernel (str, optional): ``"numba"`` (compiled loops; falls back to numpy when the package is missing),
            ``"numpy"`` or ``"auto"``; both give bit-identical results. Defaults to ``None``: the process default
            (``numba`` when installed, unless ``TORCHRL_SEGMENT_TREE_KERNEL=numpy``).

    Examples:
        >>> import numpy as np
        >>> tree = SumSegmentTree(5)
        >>> tree.update(np.array([0, 2, 4]), np.array([1.0, 2.0, 3.0]))
        >>> tree.query(0, 5), tree.query(1, 3)
        (6.0, 2.0)
        >>> tree.scan_lower_bound(np.array([0.5, 1.0, 1.5, 6.0, 7.0])).tolist()
        [0, 0, 2, 4, 5]
    """

    identity = 0.0
    _ufunc = np.add
    _compiled_update = "update_sum"
    _reduce_two = staticmethod(operator.add)

    @property
    def total(self) -> float:
        """The sum of all leaves."""
        return self.query()

    def scan_lower_bound(self, values):
        """For each ``v``, the first leaf index whose inclusive prefix sum is ``>= v``.

        Leaves holding ``0`` are never returned for ``v > 0`` (a partial sum rounded past the last
        non-zero leaf steps back to it). ``v <= 0`` gives ``0``; ``v`` above the total gives ``capacity``.

        Args:
            values (number, tensor, ndarray or sequence): the prefix sums to search.

        Returns:
            int64 positions: a tensor for a tensor input, an ndarray otherwise.
        """
        v = _as_value_array(values, name="values")
        if not v.size:
            found = np.empty(0, dtype=np.int64)
        else:
            found = self._scan(v)
            total = self.query()
            # Fast path: every v in (0, total] and no zero leaf reached; NaN fails the first test.
            if not (v.max() <= total and v.min() > 0 and self._leaves[found].min() > 0):
                if np.isnan(v).any():
                    raise ValueError("`values` must not contain NaN.")
                above = v > total
                stray = (v > 0) & ~above & (self._leaves[found] <= 0)
                if stray.any():
                    found[stray] = self._last_positive_at_or_before(found[stray], self._capacity)
                found[above] = self._capacity
                found[v <= 0] = 0
        return torch.from_numpy(found) if isinstance(values, torch.Tensor) else found

    def draw(self, uniform: np.ndarray, end: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Proportional draws among the leaves before ``end``: the primitive of prioritized sampling.

        Each ``u`` becomes ``v = (1 - u) * S`` in ``(0, S]``, ``S`` the sum of those leaves, and selects the
        first leaf whose inclusive prefix sum reaches ``v``: leaf ``i`` is drawn with probability
        ``leaf_i / S`` and a leaf holding ``0`` never (a partial sum rounded past the last positive leaf
        steps back to it).

        Args:
            uniform (ndarray): float64 draws in ``[0, 1)``.
            end (int, optional): one past the last leaf that may be drawn. ``None`` (all leaves) is the
                fast path, right whenever every leaf from some ``end`` on holds ``0``. Defaults to ``None``.

        Returns:
            ``(positions, leaf values)``, an int64 and a float64 array of ``uniform``'s size, or ``None``
            when ``S`` is not positive (nothing can be drawn).
        """
        if end is None and self._jit is not None and "_scan" not in self.__dict__:  # one compiled call
            index = np.empty(uniform.size, dtype=np.int64)
            found = np.empty(uniform.size)
            total, clean = self._jit["draw"](
                self._tree, self._depth, self._flat_level, _float64(uniform), self._capacity, index, found
            )
            if not total > 0:
                return None
            if not clean:
                index, found = self._repaired(index, found, self._capacity)
            return index, found
        if end is None:  # (an instance that replaced _scan, as tests of the repair do, takes this path)
            prefix = self._flat_prefix()
            total, limit = float(prefix[-1]), self._capacity
        else:
            prefix, total, limit = None, self.query(0, end), end
        if not total > 0:
            return None
        index = self._scan((1.0 - uniform) * total, prefix)
        leaves = self._leaves
        found = leaves[index]
        if not (index.max() < limit and found.min() > 0):  # partial sums rounded past the last positive leaf
            index, found = self._repaired(index, found, limit)
        return index, found

    def _repaired(self, index: np.ndarray, found: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Moves the positions at or past ``limit`` or on a zero leaf (rounding overshoots) back to the closest
        positive leaf before them; returns the positions and their leaf values."""
        stray = (index >= limit) | (found <= 0)
        index[stray] = self._last_positive_at_or_before(index[stray], limit)
        return index, self._leaves[index]

    def _check_values(self, value: np.ndarray) -> None:
        if value.size and not (value.min() >= 0 and value.max() < np.inf):
            bad = value[~((value >= 0) & (value < np.inf))][:3]
            raise ValueError(
                f"`value` of a SumSegmentTree must be finite and >= 0 (sums of negative values cannot be "
                f"searched), got {bad.tolist()}."
            )

    def _flat_prefix(self) -> np.ndarray:
        """``prefix[j]`` = the sum of the first ``j`` slots of the flat level; ``prefix[-1]`` is the total."""
        lo = 1 << self._flat_level
        prefix = np.empty(lo + 1)
        prefix[0] = 0.0
        np.cumsum(self._tree[lo : 2 * lo], out=prefix[1:])
        return prefix

    def _scan(self, v: np.ndarray, prefix: np.ndarray | None = None) -> np.ndarray:
        """Raw batched descent: leaf positions in ``[0, size)`` (no handling of rounding or ``v > total``).

        ``prefix`` is :meth:`_flat_prefix` when the caller already computed it (for the total).
        """
        level = self._flat_level
        lo = 1 << level
        if prefix is None:
            prefix = self._flat_prefix()
        if self._jit is not None:
            node = np.empty(v.size, dtype=np.int64)
            self._jit["scan"](self._tree, self._depth, level, prefix, _float64(v), node)
            return node
        # In increasing order of v: a binary search of sorted keys mispredicts fewer branches (2x faster on 256
        # random draws) and the descent reads the tree in increasing order; each v gives the same leaf either way.
        order = np.argsort(v) if v.size > 16 else None
        if order is not None:
            v = v[order]
        node = np.searchsorted(prefix[1:], v, side="left")
        np.minimum(node, lo - 1, out=node)
        rest = v - prefix[node]
        node += lo
        tree = self._tree
        for _ in range(self._depth - level):
            node <<= 1  # left child
            left = tree[node]
            go_right = rest > left
            rest -= left * go_right
            node += go_right
        node -= self._size
        if order is None:
            return node
        out = np.empty_like(node)
        out[order] = node
        return out

    def _last_positive_at_or_before(self, index: np.ndarray, limit: int) -> np.ndarray:
        """For each position, the closest leaf ``<= position`` and ``< limit`` holding a value ``> 0``.

        Used only to repair rare rounding overshoots, so an O(limit) pass is fine.
        """
        positive = np.flatnonzero(self._leaves[:limit] > 0)
        if not positive.size:
            return np.zeros_like(index)
        k = np.searchsorted(positive, np.minimum(index, limit - 1), side="right") - 1
        return positive[np.maximum(k, 0)]


class MinSegmentTree(_SegmentTree):
    """A segment tree of minimums over ``capacity`` float64 leaves.

    Leaves never written hold ``+inf`` (the identity of ``min``), so a range minimum only sees values that
    were set.

    Args:
        capacity (int): the number of leaves; all start at ``+inf``.

    Keyword Args:
        kernel (str, optional): as for :class:`SumSegmentTree`. Defaults to ``None`` (the process default).

    Examples:
        >>> tree = MinSegmentTree(4)
        >>> tree.update([1, 3], [5.0, 2.0])
        >>> tree.query(), tree.query(0, 2), tree.query(0, 1)
        (2.0, 5.0, inf)
    """

    identity = math.inf
    _ufunc = np.minimum
    _compiled_update = "update_min"
    _reduce_two = staticmethod(min)

    # Only the leaves and the flat level are kept (see the module's data model): flat slot ``lo + b`` holds the
    # minimum of the block of ``2 ** (depth - flat_level)`` leaves ``b``.
    def query(self, start: int = 0, end: int | None = None) -> float:
        end = self._capacity if end is None else end
        for name, bound in (("start", start), ("end", end)):
            check_int(name, bound)
        if not 0 <= start <= end <= self._capacity:
            raise ValueError(
                f"`start`={start} and `end`={end} must satisfy 0 <= start <= end <= capacity "
                f"({self._capacity})."
            )
        start, end = int(start), int(end)
        if start == end:
            return self.identity
        shift = self._depth - self._flat_level
        first, last = -((-start) >> shift), end >> shift  # the whole blocks inside [start, end)
        leaves = self._leaves
        if first >= last:
            return float(leaves[start:end].min())
        lo = 1 << self._flat_level
        result = float(self._tree[lo + first : lo + last].min())
        if start < first << shift:
            result = min(result, float(leaves[start : first << shift].min()))
        if last << shift < end:
            result = min(result, float(leaves[last << shift : end].min()))
        return result

    def _update_unique(self, index: np.ndarray, value: np.ndarray) -> None:
        """Writes leaves (``index`` in range, without repeats) and keeps their blocks' minimums: a lower value
        lowers its block's minimum; a block whose minimum was held by a leaf that grew is recomputed from its
        leaves, once per block however many of its leaves grew."""
        if self._jit is not None:
            self._jit["update_min"](self._tree, self._depth, self._flat_level, _int64(index), _float64(value))
            return
        shift = self._depth - self._flat_level
        leaves, tree = self._leaves, self._tree
        if not shift:  # the leaves are the flat level
            leaves[index] = value
            return
        lo = 1 << self._flat_level
        slot = index >> shift
        slot += lo
        old = leaves[index]
        before = tree[slot]
        leaves[index] = value
        np.minimum.at(tree, slot, value)  # unbuffered: leaves sharing a block all lower its minimum
        # recomputed from their leaves: the blocks whose minimum was held by a leaf that grew
        redo = old <= before
        redo &= value > old
        if redo.any():  # each block once, however many of its leaves grew (a block holds up to 8192 leaves)
            blocks = slot[redo]
            if blocks.size > 1:  # sorted, repeats dropped (np.unique costs ~15 us on 256 ints, this ~2 us)
                blocks.sort()
                blocks = blocks[np.concatenate(([True], blocks[1:] != blocks[:-1]))]
            tree[blocks] = leaves.reshape(-1, 1 << shift)[blocks - lo].min(axis=1)

    def _rebuild(self) -> None:
        self._leaves[self._capacity :] = self.identity
        lo = 1 << self._flat_level
        self._tree[lo : 2 * lo] = self._leaves.reshape(lo, -1).min(axis=1)


def draw_with_min(sum_tree: SumSegmentTree, min_tree: MinSegmentTree, uniform: np.ndarray):
    """:meth:`SumSegmentTree.draw` over every leaf of ``sum_tree`` and :meth:`~_SegmentTree.reduce_all` of
    ``min_tree``, read together (one compiled call when both trees are compiled): ``(positions, leaf values,
    smallest leaf of min_tree)``, or ``None`` when nothing can be drawn. The two trees of a prioritized sampler.

    Examples:
        >>> import numpy as np
        >>> sums, mins = SumSegmentTree(4), MinSegmentTree(4)
        >>> update_sum_and_min(sums, mins, np.array([1, 2]), np.array([1.0, 3.0]))
        >>> index, found, smallest = draw_with_min(sums, mins, np.array([0.9, 0.1]))
        >>> index.tolist(), found.tolist(), smallest
        ([1, 2], [1.0, 3.0], 1.0)
    """
    jit = sum_tree._jit
    if jit is not None and min_tree._jit is not None and "_scan" not in sum_tree.__dict__:
        index = np.empty(uniform.size, dtype=np.int64)
        found = np.empty(uniform.size)
        total, clean, smallest = jit["draw_pair"](
            sum_tree._tree, min_tree._tree, sum_tree._depth, sum_tree._flat_level, min_tree._flat_level,
            _float64(uniform), sum_tree._capacity, index, found,
        )  # fmt: skip
        if not total > 0:
            return None
        if not clean:
            index, found = sum_tree._repaired(index, found, sum_tree._capacity)
        return index, found, smallest
    drawn = sum_tree.draw(uniform)
    if drawn is None:
        return None
    return (*drawn, min_tree.reduce_all())


def update_sum_and_min(sum_tree: SumSegmentTree, min_tree: MinSegmentTree, index: np.ndarray, value: np.ndarray) -> None:
    """Writes ``value`` into ``sum_tree`` and, where positive (``+inf`` elsewhere), into ``min_tree``: the
    two trees of a prioritized sampler (one compiled call when both are compiled). Nothing is validated: as
    :meth:`~_SegmentTree.update_unique`, for callers holding checked arrays (``index`` int64 positions in range,
    without repeats; ``value`` finite float64 ``>= 0``); both trees of the same capacity.

    Examples:
        >>> import numpy as np
        >>> sums, mins = SumSegmentTree(4), MinSegmentTree(4)
        >>> update_sum_and_min(sums, mins, np.array([0, 2]), np.array([0.0, 3.0]))
        >>> sums.query(), mins.query(), mins.query(0, 1)
        (3.0, 3.0, inf)
    """
    jit = sum_tree._jit
    if jit is not None and min_tree._jit is not None:
        jit["update_pair"](
            sum_tree._tree, min_tree._tree, sum_tree._depth, sum_tree._flat_level, min_tree._flat_level,
            _int64(index), _float64(value),
        )  # fmt: skip
        return
    sum_tree._update_unique(index, value)
    min_tree._update_unique(index, np.where(value > 0, value, np.inf))


def compiled_ranges(tree: _SegmentTree, index: np.ndarray, value: np.ndarray):
    """With ``tree``'s compiled loops, ``(smallest, largest)`` of the int64 ``index`` and of the float64
    ``value`` in one pass (the largest value is NaN when one is); ``None`` for a numpy tree."""
    jit = tree._jit
    return None if jit is None else jit["ranges"](index, value)


def write_priorities(
    sum_tree: SumSegmentTree, min_tree: MinSegmentTree, priority: np.ndarray, index: np.ndarray, raw: np.ndarray,
    value: np.ndarray, *, float32: bool = False,
) -> tuple[float, int]:  # fmt: skip
    """A prioritized sampler's update in one compiled call (both trees compiled): ``raw`` into the float64 array
    ``priority`` and ``value`` into ``sum_tree`` and, where positive (``+inf`` elsewhere), ``min_tree``, in the
    order given (a repeated position keeps its last write), as :func:`update_sum_and_min` after dropping all but
    the last write of each position. With ``float32``, ``value`` is first clamped to float32's largest finite
    value and rounded to float32, in place. Nothing is validated (int64 ``index`` in range, ``value >= 0``).

    Returns ``(top, where)``: the largest raw priority now held by a written position and that position (the
    first in ``index`` holding it; the smallest one when positions repeat, as the numpy path finds it).
    """
    return sum_tree._jit["write_priorities"](
        sum_tree._tree, min_tree._tree, priority, sum_tree._depth, sum_tree._flat_level, min_tree._flat_level,
        index, raw, value, float32,
    )  # fmt: skip
