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
installed, else ``numpy``; the default), ``numba`` or ``numpy`` (forces the numpy loops). A tree built with
``kernel=...`` overrides it. ``numba`` itself is imported, and each loop compiled (cached on disk), only when
a tree first needs it.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import numpy as np

__all__ = []

#: The environment variable that picks the implementation of the tree loops.
KERNEL_ENV = "TORCHRL_SEGMENT_TREE_KERNEL"
KERNELS = ("auto", "numba", "numpy")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def numba_available() -> bool:
    """Whether the ``numba`` package can be imported (found on the path; not imported here)."""
    return importlib.util.find_spec("numba") is not None


def resolve_kernel(kernel: str | None) -> str:
    """``"numba"`` or ``"numpy"`` for a requested kernel (``None``: the process default, see the module doc).

    ``"numba"`` without the package installed falls back to ``"numpy"`` (the draws are identical either way).
    """
    if kernel is None:
        return DEFAULT_KERNEL
    if kernel not in KERNELS:
        raise ValueError(
            f"`kernel` must be one of {list(KERNELS)} or None (the process default, {DEFAULT_KERNEL!r}), got "
            f"{kernel!r}."
        )
    if kernel == "numpy":
        return "numpy"
    return "numba" if numba_available() else "numpy"


def _default_from_environment() -> str:
    wanted = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if wanted not in KERNELS:
        warnings.warn(
            f"{KERNEL_ENV}={wanted!r} is not one of {list(KERNELS)}: using 'auto'.", RuntimeWarning, stacklevel=2
        )
        wanted = "auto"
    if wanted == "numba" and not numba_available():
        warnings.warn(
            f"{KERNEL_ENV}=numba but the numba package is not installed (pip install 'torchrl[numba]'): the "
            f"segment trees use their numpy loops.",
            RuntimeWarning,
            stacklevel=2,
        )
    return "numpy" if wanted == "numpy" or not numba_available() else "numba"


#: The implementation trees use when built without ``kernel=``: ``"numba"`` or ``"numpy"``.
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
