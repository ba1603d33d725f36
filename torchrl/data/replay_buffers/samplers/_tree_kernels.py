"""Compiled loops of the segment trees (the optional ``numba`` extra), and which implementation a tree uses.

The trees of :mod:`.segment_tree` run a batch through a fixed number of numpy calls per level. With ``numba``
installed, the same loops run compiled instead: one call per batch, level by level over the whole batch (the
loads of one level are independent, so their cache misses overlap as in the numpy gathers).

NOTE [identical draws]: a compiled loop performs the same float64 operations, in the same order, as the numpy
path it replaces (sequential prefix sums, ``rest > left`` then ``rest - left`` per level, ``left + right`` and
``min(left, right)`` per parent), so both give bit-identical trees and draws for the same uniform numbers; only
the speed differs. Whatever is not a tree loop or a plain copy, comparison or max (the generator draws,
``(p + eps) ** alpha``, the importance weights, the repair of rounding overshoots) stays in numpy on both paths:
a compiled ``pow`` may round differently. A prioritized sampler's update runs two compiled calls
(:func:`_ranges` for its checks, :func:`_write_priorities` for the raw priorities, both trees and the max
priority), with the same result as the numpy path's (which first keeps the last write of each position).

Choice, once per process at import: ``TORCHRL_SEGMENT_TREE_KERNEL`` = ``auto`` (``numba`` when the package is
installed, else ``numpy``; the default), ``numba``, ``numpy`` (forces the numpy loops) or ``torch`` (the
prioritized samplers keep their trees as torch tensors: see below; trees of numpy arrays then use ``auto``). Any
other value raises a ``ValueError`` naming the variable when a tree is first built. A tree built with
``kernel=...`` overrides it. ``numba`` itself is imported, and each loop compiled (cached on disk), only when
a tree first needs it.

The third kernel, ``torch`` (:func:`torch_lower_bound`, :func:`torch_write`, :func:`torch_range`,
:func:`torch_last_writes`), works on a tree stored as one torch tensor on any device: ``2 * capacity`` slots,
the root in slot ``1``, the children of slot ``i`` in ``2 * i`` and ``2 * i + 1``, leaf ``j`` in slot
``capacity + j`` (slot ``0`` is unused). Every level is kept. Each function runs a fixed number of tensor ops
per level (a search, an update) or in all (a range query), whatever the batch: no Python loop over items, no
``.item()``, no ``nonzero``/``unique`` (nothing that reads a value back to the host), so the same code runs on a
GPU without a sync and traces into one ``torch.compile`` graph. The descent compares ``rest > left`` and
subtracts as the numpy loops do, so for the same masses and exactly representable sums it finds the same leaves
(the numpy kernel starts from prefix sums of a flat level: other sums may round apart).
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import numpy as np
import torch

__all__ = []

#: The environment variable that picks the implementation of the tree loops.
KERNEL_ENV = "TORCHRL_SEGMENT_TREE_KERNEL"
#: The values ``TORCHRL_SEGMENT_TREE_KERNEL`` takes.
ENV_CHOICES = ("auto", "numba", "numpy", "torch")
#: The kernels a tree of numpy arrays takes (``kernel=``); ``torch`` trees are :mod:`.tensor_segment_tree`'s.
KERNELS = ("auto", "numba", "numpy")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def numba_available() -> bool:
    """Whether the ``numba`` package can be imported (found on the path; not imported here)."""
    return importlib.util.find_spec("numba") is not None


def _array_kernel() -> str:
    return "numba" if numba_available() else "numpy"


def environment_error(value: str) -> ValueError:
    """The error for an unknown ``TORCHRL_SEGMENT_TREE_KERNEL`` value."""
    return ValueError(
        f"{KERNEL_ENV}={value!r} is not a segment-tree kernel: set it to one of {list(ENV_CHOICES)} (or unset it "
        f"for 'auto')."
    )


def default_kernel() -> str:
    """The process default: ``"numba"``, ``"numpy"`` or ``"torch"`` (see the module doc).

    Raises:
        ValueError: ``TORCHRL_SEGMENT_TREE_KERNEL`` holds an unknown value (named in the message, with the choices).
    """
    if DEFAULT_KERNEL is None:
        raise environment_error(_ENV_VALUE)
    return DEFAULT_KERNEL


def resolve_kernel(kernel: str | None) -> str:
    """``"numba"`` or ``"numpy"`` for a requested kernel of a tree of numpy arrays (``None``: the process default,
    see the module doc; with ``TORCHRL_SEGMENT_TREE_KERNEL=torch``, ``auto``).

    ``"numba"`` without the package installed falls back to ``"numpy"`` (the draws are identical either way).
    """
    if kernel is None:
        kernel = default_kernel()
        return _array_kernel() if kernel == "torch" else kernel
    if kernel not in KERNELS:
        raise ValueError(
            f"`kernel` must be one of {list(KERNELS)} or None (the process default, {DEFAULT_KERNEL!r}), got "
            f"{kernel!r}. Trees of torch tensors (any device) are SumSegmentTreeFp32 and its siblings, or "
            f"TORCHRL_SEGMENT_TREE_KERNEL=torch for the prioritized samplers."
        )
    if kernel == "numpy":
        return "numpy"
    return _array_kernel()


def _default_from_environment() -> str | None:
    """The kernel the environment asks for, or ``None`` for an unknown value (raised when a tree is built)."""
    wanted = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if wanted not in ENV_CHOICES:
        return None
    if wanted == "torch":
        return "torch"
    if wanted == "numba" and not numba_available():
        warnings.warn(
            f"{KERNEL_ENV}=numba but the numba package is not installed (pip install 'torchrl[numba]'): the "
            f"segment trees use their numpy loops.",
            RuntimeWarning,
            stacklevel=2,
        )
    return "numpy" if wanted == "numpy" or not numba_available() else "numba"


_ENV_VALUE = os.environ.get(KERNEL_ENV, "auto")
#: The implementation trees use when built without ``kernel=``: ``"numba"``, ``"numpy"`` or ``"torch"`` (the
#: prioritized samplers' trees as torch tensors); ``None`` when the variable holds an unknown value.
DEFAULT_KERNEL = _default_from_environment()


# -- the loops, in plain Python (compiled by compiled_kernels()) ------------------------------------------------
def _scan(tree, depth, flat_level, prefix, v, out):
    """The descent of ``SumSegmentTree._scan``: leaf positions in ``[0, size)`` for the prefix sums ``v``.

    Every loop runs over the whole batch, one step of the search (or one level of the tree) at a time, and a
    comparison is stored as an integer before a second loop uses it: the compiler would otherwise turn it into
    a branch, mispredicted half of the time on random draws (10x slower on 256 draws).
    """
    lo = 1 << flat_level
    size = 1 << depth
    n = v.shape[0]
    base = np.zeros(n, np.int64)
    step = np.empty(n, np.int64)
    width = lo
    while width > 1:  # np.searchsorted(prefix[1:], v, side="left"): a lower bound, one halving per pass
        half = width >> 1
        for i in range(n):
            step[i] = prefix[base[i] + half] < v[i]  # prefix[1 + (base + half - 1)]
        for i in range(n):
            base[i] += step[i] * half
        width -= half
    for i in range(n):
        step[i] = prefix[base[i] + 1] < v[i]
    rest = np.empty(n)
    for i in range(n):  # clamped to the flat level
        a = min(base[i] + step[i], lo - 1)
        rest[i] = v[i] - prefix[a]
        out[i] = a + lo
    left = np.empty(n)
    for _ in range(depth - flat_level):  # level by level over the batch: the loads of a level overlap
        for i in range(n):
            node = out[i] << 1
            out[i] = node
            left[i] = tree[node]
        for i in range(n):
            step[i] = rest[i] > left[i]
        for i in range(n):  # as numpy's `rest -= left * go_right`
            rest[i] = rest[i] - left[i] * step[i]
            out[i] += step[i]
    for i in range(n):
        out[i] -= size


def _draw(tree, depth, flat_level, uniform, limit, index, found):
    """``SumSegmentTree.draw`` over every leaf: the flat prefix sums (as np.cumsum), ``v = (1 - u) * total``,
    :func:`_scan`, the leaf values. Returns ``(total, clean)``, ``clean`` False when a position reached a zero
    leaf or one at or past ``limit`` (a rounding overshoot the caller repairs); nothing is drawn when
    ``total`` is not positive."""
    lo = 1 << flat_level
    prefix = np.empty(lo + 1)
    prefix[0] = 0.0
    acc = tree[lo]
    prefix[1] = acc
    for j in range(1, lo):
        acc = acc + tree[lo + j]
        prefix[j + 1] = acc
    return _draw_after(tree, depth, flat_level, prefix, uniform, limit, index, found)


def _draw_after(tree, depth, flat_level, prefix, uniform, limit, index, found):
    """:func:`_draw` once the flat prefix sums are known."""
    total = prefix[1 << flat_level]
    if not total > 0:
        return total, True
    v = np.empty(uniform.shape[0])
    for i in range(uniform.shape[0]):
        v[i] = (1.0 - uniform[i]) * total
    _scan(tree, depth, flat_level, prefix, v, index)
    size = 1 << depth
    clean = True
    for i in range(index.shape[0]):
        leaf = tree[size + index[i]]
        found[i] = leaf
        if index[i] >= limit or not leaf > 0:
            clean = False
    return total, clean


def _draw_pair(sum_tree, min_tree, depth, flat_level, min_flat_level, uniform, limit, index, found):
    """:func:`_draw` on ``sum_tree`` and the smallest slot of ``min_tree``'s flat level (its smallest leaf):
    ``(total, clean, smallest)``. With flat levels of one size (the trees of a sampler), one pass reads both:
    the comparisons run beside the chain of additions of the prefix sums, for free."""
    lo = 1 << min_flat_level
    smallest = min_tree[lo]
    if min_flat_level != flat_level:
        for j in range(lo + 1, 2 * lo):
            smallest = min(smallest, min_tree[j])
        total, clean = _draw(sum_tree, depth, flat_level, uniform, limit, index, found)
        return total, clean, smallest
    prefix = np.empty(lo + 1)
    prefix[0] = 0.0
    acc = sum_tree[lo]
    prefix[1] = acc
    for j in range(1, lo):
        acc = acc + sum_tree[lo + j]
        prefix[j + 1] = acc
        smallest = min(smallest, min_tree[lo + j])
    total, clean = _draw_after(sum_tree, depth, flat_level, prefix, uniform, limit, index, found)
    return total, clean, smallest


def _update_sum(tree, depth, flat_level, index, value):
    """Writes the leaves and re-adds their ancestors down to the flat level (last write wins on repeats)."""
    size = 1 << depth
    n = index.shape[0]
    node = np.empty(n, np.int64)
    for i in range(n):
        p = index[i] + size
        tree[p] = value[i]
        node[i] = p
    for _ in range(depth - flat_level):
        for i in range(n):
            p = node[i] >> 1
            tree[p] = tree[2 * p] + tree[2 * p + 1]
            node[i] = p


def _update_min(tree, depth, flat_level, index, value):
    """``MinSegmentTree._update_unique``: leaves and the block minimums of the flat level (exact either way).
    A block whose minimum was held by a leaf that grew is rescanned once after all the writes."""
    size = 1 << depth
    lo = 1 << flat_level
    shift = depth - flat_level
    n = index.shape[0]
    grew = np.zeros(n, np.int64)
    count = 0
    for i in range(n):
        leaf = index[i]
        slot = lo + (leaf >> shift)
        old, new = tree[size + leaf], value[i]
        tree[size + leaf] = new
        if new < tree[slot]:
            tree[slot] = new
        elif old <= tree[slot] and new > old:  # the leaf held its block's minimum and grew
            grew[count] = slot
            count += 1
    if count > 1:  # each block once, however many of its leaves grew (a block holds up to 8192 leaves)
        grew[:count] = np.sort(grew[:count])
    width = 1 << shift
    for k in range(count):
        if k and grew[k] == grew[k - 1]:
            continue
        first = size + ((grew[k] - lo) << shift)
        m = tree[first]
        for j in range(first + 1, first + width):
            if tree[j] < m:
                m = tree[j]
        tree[grew[k]] = m


def _update_pair(sum_tree, min_tree, depth, sum_flat_level, min_flat_level, index, value):
    """A prioritized sampler's write: ``value`` into the sum tree, ``value`` where positive (``+inf``
    elsewhere) into the min tree."""
    positive = np.empty(value.shape[0])
    for i in range(value.shape[0]):
        positive[i] = value[i] if value[i] > 0 else np.inf
    _update_sum(sum_tree, depth, sum_flat_level, index, value)
    _update_min(min_tree, depth, min_flat_level, index, positive)


def _ranges(index, value):
    """``(smallest, largest)`` of ``index`` and of ``value`` in one pass; the largest value is NaN when one is."""
    lo = hi = index[0]
    vmin = vmax = value[0]
    nan = False
    for i in range(index.shape[0]):
        p = index[i]
        lo = min(lo, p)
        hi = max(hi, p)
        x = value[i]
        nan |= x != x
        vmin = min(vmin, x)
        vmax = max(vmax, x)
    return lo, hi, vmin, np.nan if nan else vmax


def _write_priorities(sum_tree, min_tree, priority, depth, sum_flat_level, min_flat_level, index, raw, value,
                      float32):  # fmt: skip
    """A prioritized sampler's update, in the order given (a repeated position keeps its last write): ``raw``
    into ``priority``, ``value`` into both trees (:func:`_update_pair`), first clamped to float32's largest
    finite value and rounded to float32 (in place) when ``float32``. Returns ``(top, where)``: the largest
    raw priority now held by a written position, and that position as the numpy path picks it (which first
    keeps the last write of each position): the first in ``index`` holding ``top``, or the smallest position
    holding it when positions repeat."""
    n = index.shape[0]
    for i in range(n):
        priority[index[i]] = raw[i]
    if float32:  # as numpy's np.minimum(value, max, out=value).astype(np.float32).astype(np.float64)
        for i in range(n):
            value[i] = np.float64(np.float32(min(value[i], _FLOAT32_MAX)))
    _update_pair(sum_tree, min_tree, depth, sum_flat_level, min_flat_level, index, value)
    top = priority[index[0]]
    for i in range(1, n):
        top = max(top, priority[index[i]])
    first = smallest = -1
    ties = False
    for i in range(n):
        p = index[i]
        if priority[p] == top:
            if first < 0:
                first = smallest = p
            elif p != first:
                ties = True
                smallest = min(smallest, p)
    if ties:  # several positions hold the top: the pick depends on whether some position repeats
        ordered = np.sort(index)
        for i in range(1, n):
            if ordered[i] == ordered[i - 1]:
                return top, smallest
    return top, first


_COMPILED: dict | None = None
_IMPORT_FAILED = False


def compiled_kernels() -> dict | None:
    """The loops above by name without their underscore (``{"scan", "draw", "draw_pair", "update_sum", ...}``),
    compiled with ``numba.njit`` (imported here, on first use; each loop compiles on its first call and is cached
    on disk), or ``None`` when numba cannot be imported (the trees then use their numpy loops)."""
    global _COMPILED, _IMPORT_FAILED
    if _COMPILED is None and not _IMPORT_FAILED:
        try:
            import numba
        except ImportError:  # found on the path but not importable (a broken install, a hidden package)
            _IMPORT_FAILED = True
            return None
        jit = numba.njit(cache=True, nogil=True)
        # Each loop calls the loops listed before it, which numba resolves as globals when it compiles (on its
        # first call): the compiled ones replace the Python ones in this module's globals.
        compiled = {}
        for name in ("scan", "update_sum", "update_min", "draw_after", "draw", "update_pair", "draw_pair", "ranges",
                     "write_priorities"):  # fmt: skip
            compiled[name] = jit(globals()[f"_{name}"])
        globals().update({f"_{name}": loop for name, loop in compiled.items()})
        _COMPILED = compiled
    return _COMPILED


# -- the torch kernel: a tree as one tensor (see the module doc) -------------------------------------------------
def torch_lower_bound(tree: torch.Tensor, depth: int, mass: torch.Tensor) -> torch.Tensor:
    """For each mass ``v``, the first leaf whose inclusive prefix sum is ``>= v`` (a sum tree; ``depth`` levels below
    the root): ``depth`` gather steps over the whole batch. ``v <= 0`` gives leaf ``0``; ``v`` above the total
    gives the last leaf (callers compare with the root). Returns int64 leaf positions of ``mass``'s shape."""
    node = torch.ones(mass.shape, dtype=torch.long, device=tree.device)
    rest = mass
    for _ in range(depth):
        node = node * 2
        left = tree[node]
        right = rest > left
        rest = torch.where(right, rest - left, rest)
        node = node + right
    return node - (1 << depth)


def torch_last_writes(index: torch.Tensor, keep: torch.Tensor | None = None):
    """Which entry of a batch of writes wins at each position (the last one given for it), without ``unique``.

    Returns ``(positions, winner, won)``: ``index`` sorted (stable), and for each of its entries the batch entry
    whose value every write of that position carries (the last kept one) and whether there is one (``False``
    where every entry of that position was dropped by ``keep``: the write must keep the current value). Writing
    ``values[winner]`` at ``positions`` then sets each position once in effect: repeats write identical values.
    """
    count = index.shape[0]
    if keep is None:
        order = torch.argsort(index, stable=True)
    else:  # dropped entries sort first among their position's, so a kept one, if any, is last
        order = torch.argsort(index * 2 + keep.long(), stable=True)
    positions = index[order]
    if count == 0:
        return positions, order, torch.ones(0, dtype=torch.bool, device=index.device)
    last = torch.ones(count, dtype=torch.bool, device=index.device)
    last = torch.cat([positions[1:] != positions[:-1], last[:1]])
    slot = torch.arange(count, device=index.device)
    # the sorted slot of the last entry of each run of a position: a reversed running minimum
    run_end = torch.where(last, slot, count).flip(0).cummin(0).values.flip(0)
    winner = order[run_end]
    won = torch.ones(count, dtype=torch.bool, device=index.device) if keep is None else keep[winner]
    return positions, winner, won


def torch_write(tree: torch.Tensor, depth: int, index: torch.Tensor, value: torch.Tensor, combine: str) -> None:
    """Writes ``value`` at the leaves ``index`` (positions in ``[0, capacity)``; repeats must carry identical
    values, see :func:`torch_last_writes`) and recomputes their ancestors level by level (``combine``: ``"sum"``
    or ``"min"``): ``depth`` gather-reduce-scatter steps, only on the ancestors of the written leaves."""
    node = index + (1 << depth)
    tree.index_put_((node,), value)
    pairs = tree.view(-1, 2)  # pairs[i] = slots (2i, 2i + 1): the children of slot i
    for _ in range(depth):
        node = node >> 1
        children = pairs[node]
        parent = children.sum(-1) if combine == "sum" else children.amin(-1)
        tree.index_put_((node,), parent)


def torch_rebuild(tree: torch.Tensor, depth: int, combine: str) -> None:
    """Recomputes every inner slot from the leaves, one level at a time (``depth`` steps)."""
    for level in range(depth - 1, -1, -1):
        lo = 1 << level
        children = tree[2 * lo : 4 * lo].view(-1, 2)
        tree[lo : 2 * lo] = children.sum(-1) if combine == "sum" else children.amin(-1)


def torch_range(tree: torch.Tensor, depth: int, start: torch.Tensor, end: torch.Tensor, combine: str,
                identity: float) -> torch.Tensor:  # fmt: skip
    """The reduction of the leaves in ``[start, end)`` for int64 tensors of bounds (elementwise; ``identity`` for an
    empty range): the slots a bottom-up range walk takes at each level, all levels at once (a fixed number of ops,
    whatever ``depth``). Bounds must lie in ``[0, capacity]``."""
    capacity = 1 << depth
    shifts = torch.arange(depth + 1, device=tree.device)
    # level k of the walk: lo = ceil((start + capacity) / 2^k), hi = floor((end + capacity) / 2^k); the slot lo is
    # taken when odd, the slot hi - 1 when hi is odd, while lo < hi
    lo = ((start.unsqueeze(-1) + (capacity - 1)) >> shifts) + 1
    hi = (end.unsqueeze(-1) + capacity) >> shifts
    live = lo < hi
    take_lo = live & (lo % 2 == 1)
    take_hi = live & (hi % 2 == 1)
    left = tree[lo.clamp(max=2 * capacity - 1)]
    right = tree[(hi - 1).clamp(min=0)]
    fill = torch.full((), identity, dtype=tree.dtype, device=tree.device)
    left = torch.where(take_lo, left, fill)
    right = torch.where(take_hi, right, fill)
    if combine == "sum":
        return (left + right).sum(-1)
    return torch.minimum(left, right).amin(-1)
