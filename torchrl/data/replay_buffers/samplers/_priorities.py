"""Priority values: :func:`check_priorities` (finite and ``>= 0``), :func:`reduce_priority` (one per item),
the argument checks of the prioritized samplers, their tree capacity (:func:`tree_capacity`), the check of a saved
state (:func:`validated_prioritized_state`), how they ravel per-dimension indices and how they keep their scalars
in one (shareable) array.

Kept apart from :mod:`.prioritized` (the sampler and its trees), which re-exports the public helpers.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_int, check_positive_int, is_int, is_real
from torchrl.data.replay_buffers.samplers.base import state_int
from torchrl.data.replay_buffers.samplers.segment_tree import _as_value_array, _SegmentTree

ALPHA_NEGATIVE = TorchRLPhrase(
    ValueError,
    "alpha must be greater or equal",
    "alpha must be greater or equal to 0, got alpha={alpha!r}. Pass 0 for uniform sampling or a positive "
    "exponent (0.6 or 0.7 are common).",
)

REDUCTIONS = ("max", "min", "sum", "mean", "median")
#: The version of :meth:`PrioritizedSampler.state_dict`'s layout (TorchRL's ``_schema_version``).
SCHEMA_VERSION = 1


def tree_capacity(max_capacity: int) -> int:
    """The positions a prioritized sampler's trees hold: the next power of two strictly above ``max_capacity``
    (TorchRL's segment-tree capacity), so that a storage whose capacity was rounded up still fits.

    Examples:
        >>> tree_capacity(5), tree_capacity(8), tree_capacity(149)
        (8, 16, 256)
    """
    return 1 << int(max_capacity).bit_length()


def _check_alpha(value) -> float:
    """``alpha`` as :func:`_check_exponent` checks it; a negative value raises TorchRL's ValueError."""
    if (
        is_real(value)
        and value < 0
        or isinstance(value, torch.Tensor)
        and value.numel() == 1
        and bool(value < 0)
    ):
        raise ALPHA_NEGATIVE.error(alpha=float(value))
    return _check_exponent("alpha", value)


def check_tree_device(device, name: str = "device") -> torch.device | None:
    """The trees' device as asked in argument ``name``: ``None`` (the CPU, or the device of the storage sampled:
    see :class:`PrioritizedSampler`) or a device that holds data (not ``"meta"``); a CUDA device needs CUDA."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as err:
        raise TypeError(f"`{name}` must be a torch.device, a str or None, got {device!r}.") from err
    if device.type == "meta":
        raise ValueError(
            f"`{name}`={str(device)!r} holds no data, so it cannot hold priority trees: pass {name}=None (the CPU, "
            f"or the device of the storage), 'cpu' or an accelerator such as 'cuda'."
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"CUDA prioritized replay buffers require a CUDA device, and torch sees none (`{name}`={str(device)!r}, "
            f"torch.cuda.is_available() is False): pass {name}=None or 'cpu', or install a CUDA build of torch on "
            f"a machine with a GPU."
        )
    return device


def _check_max_pending(max_pending) -> int:
    """``max_pending`` as an int ``>= 0`` (TorchRL's ValueError for a negative value)."""
    if isinstance(max_pending, bool) or not is_int(max_pending):
        raise TypeError(
            f"`max_pending` must be an int >= 0 (how many mark_update calls may wait before their write), got "
            f"{max_pending!r} ({type(max_pending).__name__})."
        )
    if max_pending < 0:
        raise ValueError(
            f"max_pending must be greater or equal to 0, got max_pending={max_pending!r}: pass 0 to write every "
            f"mark_update at once, or a positive count (TorchRL's default is 64)."
        )
    return int(max_pending)


def _check_reduction(reduction) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {list(REDUCTIONS)}, got {reduction!r}.")
    return reduction


def reduce_priority(priority, reduction: str = "max", *, batch_dims: int = 1) -> torch.Tensor:
    """Reduces a priority tensor to one value per item over its trailing dims.

    A TensorDict buffer reads priorities from an entry of the batch (e.g. ``"td_error"``) whose shape may
    carry extra dims per item (a time axis, several critics); prioritized sampling needs one number per
    item, obtained with ``reduction`` over every dim after the ``batch_dims`` leading ones.

    Args:
        priority (tensor, ndarray, sequence or number): the priorities, items along the leading dims.
        reduction (str): one of ``"max"``, ``"min"``, ``"sum"``, ``"mean"``, ``"median"`` (the lower
            median, as :func:`torch.median`). Defaults to ``"max"``.

    Keyword Args:
        batch_dims (int): how many leading dims index items. Defaults to ``1``.

    Returns:
        a tensor of shape ``priority.shape[:batch_dims]`` (``priority`` itself when it has no extra dim);
        integer priorities are reduced as float64.

    Examples:
        >>> import torch
        >>> reduce_priority(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), "max")
        tensor([3., 2.])
        >>> reduce_priority(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), "mean")
        tensor([2., 1.])
    """
    _check_reduction(reduction)
    check_int("batch_dims", batch_dims, minimum=0, type_error=False)
    priority = torch.as_tensor(priority)
    if priority.ndim <= batch_dims:
        return priority
    if not priority.is_floating_point():
        priority = priority.to(torch.float64)
    flat = priority.reshape(*priority.shape[:batch_dims], -1)
    if reduction == "max":
        return flat.amax(-1)
    if reduction == "min":
        return flat.amin(-1)
    if reduction == "sum":
        return flat.sum(-1)
    if reduction == "mean":
        return flat.mean(-1)
    return flat.median(-1).values


def _check_exponent(name: str, value) -> float:
    """A finite float ``>= 0``; a 0-d (one-element) tensor is accepted, as parameter schedulers set one."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype is not torch.bool:
        value = value.item()
    if not is_real(value):
        raise TypeError(f"`{name}` must be a real number >= 0, got {value!r} ({type(value).__name__}).")
    value = float(value)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value}.")
    return value


def tree_bytes(max_capacity: int) -> int:
    """The memory a prioritized sampler's state takes: a sum and a min tree of ``2 * tree_capacity`` float64
    nodes, and one float64 raw priority per item."""
    return 2 * 2 * tree_capacity(max_capacity) * 8 + 8 * max_capacity


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system that reports it
        return None


def _check_max_capacity(max_capacity) -> int:
    """``max_capacity`` as a positive int whose trees fit in this machine's memory (a ``ValueError`` that says
    how much they need otherwise, before anything is allocated)."""
    max_capacity = check_positive_int("max_capacity", max_capacity, hint="Pass the storage's max_size.")
    needed, memory = tree_bytes(max_capacity), _physical_memory()
    if memory is not None and needed > memory:
        raise ValueError(
            f"`max_capacity`={max_capacity} needs {needed / 2**30:.1f} GiB for the priority trees, more than this "
            f"machine's {memory / 2**30:.1f} GiB of memory: pass the max_size of the storage sampled (the trees "
            f"hold one priority per item, about 40 bytes each)."
        )
    return max_capacity


def check_priorities(priority, name: str = "priority", *, fix: str | None = None) -> np.ndarray:
    """Checks that every priority is a finite number ``>= 0`` and returns them as a 1-D float64 array.

    Prioritized sampling draws item ``i`` with probability ``(p_i + eps) ** alpha / sum_j ...``: a NaN, an
    infinite or a negative ``p_i`` would poison the sums of every later draw, so priorities are refused before
    anything is stored. :meth:`PrioritizedSampler.update_priority` and the TensorDict buffers (which read
    priorities from their ``priority_key`` entry at ``extend``/``add``) both use this check.

    Args:
        priority (tensor, ndarray, sequence or number): the priorities.
        name (str): how the error names them: an argument (``"priority"``) or a data entry (``"td_error"``).
            Defaults to ``"priority"``.

    Keyword Args:
        fix (str, optional): what the error says to do instead. Defaults to a generic remedy.

    Raises:
        TypeError: ``priority`` is not real numbers (e.g. a bool or complex tensor).
        ValueError: some priority is NaN, infinite or negative (the message shows up to 3 of them).

    Examples:
        >>> check_priorities([0.5, 2])
        array([0.5, 2. ])
        >>> check_priorities([1.0, float("nan"), -3.0], "td_error")
        Traceback (most recent call last):
        ...
        ValueError: `td_error` must be finite and >= 0, got [nan, -3.0] (2 of 3 values): ...
    """
    values = _as_value_array(priority, name=name)
    if values.size and not (values.min() >= 0 and values.max() < np.inf):  # NaN fails both tests
        bad = values[~((values >= 0) & (values < np.inf))]
        if fix is None:
            fix = "pass finite priorities >= 0 (e.g. td_error.abs(), with NaN replaced). Nothing was changed."
        raise ValueError(
            f"`{name}` must be finite and >= 0, got {bad[:3].tolist()} ({bad.size} of {values.size} values): "
            f"{fix}"
        )
    return values


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"`dtype` must be a floating-point torch.dtype, got {dtype!r} ({type(dtype).__name__})."
        )
    if not dtype.is_floating_point:
        raise ValueError(f"`dtype` must be a floating-point torch.dtype (e.g. torch.float), got {dtype}.")
    return dtype


def _ravel_coords(coords: list[np.ndarray], shape: tuple[int, ...] | None) -> np.ndarray:
    """Flat positions of per-dimension coordinates of a storage of ``shape`` (``-1`` entries stay ``-1``)."""
    if shape is None or len(shape) != len(coords):
        raise ValueError(
            f"A per-dimension index with {len(coords)} dims needs the shape of an ndim={len(coords)} "
            f"storage: pass `storage=` (the sampler knows {shape})."
        )
    if len({c.size for c in coords}) > 1:
        raise ValueError(f"The per-dimension index tensors differ in length: {[c.size for c in coords]}.")
    skipped = np.zeros(coords[0].size, dtype=bool)
    flat = np.zeros(coords[0].size, dtype=np.int64)
    for c, size in zip(coords, shape):
        skipped |= c == -1
        if c.size and ((c < -1).any() or (c >= size).any()):
            raise IndexError(
                f"`index` entries {c[(c < -1) | (c >= size)][:3].tolist()} are out of range for a "
                f"storage of shape {list(shape)}: pass coordinates in [0, size) per dim (or -1 to skip "
                f"an entry)."
            )
        flat = flat * size + c
    flat[skipped] = -1
    return flat


def tensor_positions(index, shape: tuple[int, ...] | None, device: torch.device) -> torch.Tensor | None:
    """Flat int64 positions on ``device`` from tensor indices, by tensor ops only (no host sync, nothing checked):
    a 1-D tensor (or a 1-tuple of one), per-dimension coordinates of a storage of ``shape`` (a tuple of tensors or
    an ``[N, ndim]`` tensor; an entry with a ``-1`` coordinate becomes ``-1``). ``None`` for other forms.

    Examples:
        >>> import torch
        >>> tensor_positions((torch.tensor([0, 2, -1]), torch.tensor([1, 3, 0])), (3, 4), torch.device("cpu"))
        tensor([ 1, 11, -1])
    """
    if isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], torch.Tensor):
        index = index[0]
    coords = None
    if isinstance(index, tuple) and index and all(isinstance(i, torch.Tensor) for i in index):
        coords = list(index)
    elif isinstance(index, torch.Tensor) and index.ndim == 2 and index.shape[-1] > 1:
        coords = list(index.unbind(-1))
    if coords is None:
        if not isinstance(index, torch.Tensor) or index.is_floating_point() or index.dtype == torch.bool:
            return None
        return index.reshape(-1).to(device, torch.long, non_blocking=True)
    if shape is None or len(shape) != len(coords):
        raise ValueError(
            f"A per-dimension index with {len(coords)} dims needs the shape of an ndim={len(coords)} storage: "
            f"pass `storage=` (the sampler knows {shape})."
        )
    coords = [c.reshape(-1).to(device, torch.long, non_blocking=True) for c in coords]
    flat = torch.zeros_like(coords[0])
    skipped = torch.zeros_like(coords[0], dtype=torch.bool)
    for c, size in zip(coords, shape):
        flat = flat * size + c
        skipped = skipped | (c < 0)
    return torch.where(skipped, -1, flat)


def tensor_priority(priority, count: int, reduction: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One raw priority per index as a ``dtype`` tensor on ``device`` (reduced with ``reduction`` when it has
    extra dims per item): tensor ops only for a tensor (no host sync, values not checked).

    Examples:
        >>> import torch
        >>> tensor_priority(torch.tensor([[1.0, 3.0], [2.0, 0.0]]), 2, "max", torch.float64, torch.device("cpu"))
        tensor([3., 2.], dtype=torch.float64)
    """
    if not isinstance(priority, torch.Tensor) or priority.is_complex() or priority.dtype == torch.bool:
        priority = torch.from_numpy(_as_value_array(priority, count, name="priority"))
    if priority.ndim > 1 and priority.numel() != count:
        if priority.shape[0] != count:
            raise ValueError(
                f"`priority` of shape {list(priority.shape)} does not match the {count} indices: pass one "
                f"priority per index (shape [{count}] or [{count}, ...], reduced with reduction={reduction!r})."
            )
        priority = reduce_priority(priority, reduction)
    priority = priority.reshape(-1).to(device, dtype, non_blocking=True)
    if priority.shape[0] == count:
        return priority
    if priority.shape[0] == 1:
        return priority.expand(count)
    raise ValueError(
        f"`priority` has {priority.shape[0]} entries for {count} indices: pass one value per index or a single "
        f"value for all of them."
    )


def _scalar_property(slot: int, doc: str, cast=float) -> property:
    """A property stored at ``slot`` of the owner's ``_scalar_array`` (a float64 array, shareable)."""

    def get(self):
        return cast(self._scalar_array[slot])

    def set(self, value) -> None:
        self._scalar_array[slot] = value

    return property(get, set, doc=doc)


# -- a saved state (NOTE [sampler state validation] in samplers/base.py) ----------------------------------------
def _tree_leaves(value, key: str, who: str, sizes: tuple[int, ...]) -> np.ndarray:
    """The leaf values of a saved tree: a tree, its ``state_dict()`` or a 1-D array of leaves, of a size in
    ``sizes``."""
    if isinstance(value, _SegmentTree):
        leaves = np.array(value.values, dtype=np.float64)
    elif isinstance(value, dict) and "values" in value:
        leaves = _as_value_array(value["values"], name=f"state_dict[{key!r}]['values']")
    elif isinstance(value, (torch.Tensor, np.ndarray)):
        leaves = _as_value_array(value, name=f"state_dict[{key!r}]")
    else:
        raise TypeError(
            f"{who} state_dict[{key!r}] must be a segment tree (as state_dict() saves it), its state_dict() or a "
            f"tensor of leaf values, got {type(value).__name__}. Nothing was changed."
        )
    if leaves.size not in sizes:
        raise ValueError(
            f"{who} state_dict[{key!r}] has {leaves.size} leaves; this sampler's trees hold {sizes[0]} positions: "
            f"build the sampler with the max_capacity of the saved one. Nothing was changed."
        )
    return leaves


def _padded(values: np.ndarray, size: int, fill: float) -> np.ndarray:
    out = np.full(size, fill)
    out[: values.size] = values
    return out


def _check_leaves(who: str, priority: np.ndarray, sums: np.ndarray, mins: np.ndarray) -> None:
    """Raw priorities finite and ``>= 0`` (NaN: never set); sum leaves finite and ``>= 0``, each min leaf the sum
    leaf where it is positive and ``+inf`` elsewhere; no sum leaf without a raw priority."""
    known = ~np.isnan(priority)
    problems = []
    if not (np.isfinite(priority[known]).all() and (priority[known] >= 0).all()):
        problems.append("raw priorities must be finite and >= 0 (NaN where never set)")
    if not (np.isfinite(sums).all() and (sums >= 0).all()):
        problems.append("the sum tree's leaves must be finite and >= 0")
    positive = sums > 0
    if np.isnan(mins).any() or not (
        np.array_equal(mins[positive], sums[positive]) and np.isinf(mins[~positive]).all()
    ):
        problems.append(
            "the min tree's leaves must equal the sum tree's where positive and be +inf elsewhere"
        )
    if (positive & ~known).any():
        problems.append("a position holds a value in the trees but no raw priority")
    if problems:
        raise ValueError(f"{who} state_dict is inconsistent: {'; '.join(problems)}. Nothing was changed.")


def _raw_from_trees(sums: np.ndarray, alpha: float, eps: float, fallback: float) -> np.ndarray:
    """Raw priorities recovered from the sum-tree leaves ``(p + eps) ** alpha`` (NaN where the leaf is 0; with
    ``alpha=0``, where every leaf is 1, ``fallback``)."""
    priority = np.full(sums.size, np.nan)
    positive = sums > 0
    if alpha > 0:
        priority[positive] = np.maximum(np.power(sums[positive], 1.0 / alpha) - eps, 0.0)
    else:
        priority[positive] = fallback
    return priority


def validated_prioritized_state(state: dict, who: str, max_capacity: int, capacity: int) -> dict:
    """A saved :class:`PrioritizedSampler` state checked against a sampler of ``max_capacity`` whose trees hold
    ``capacity`` positions, as ``{"alpha", "beta", "eps", "priority", "sum", "min", "max_priority", "max_index",
    "recompute_max"}`` (arrays of ``capacity`` entries). Raises ``TypeError``/``ValueError``; changes nothing.

    Three layouts are read: TorchRL's (``_schema_version`` = 1, ``_max_priority`` a raw ``(value, index)``
    pair); the same without ``_schema_version`` (an older TorchRL layout, whose max priority is recomputed from the
    trees); and this package's earlier one (``max_capacity``, ``alpha``, ..., ``priority``, ``sum_tree``,
    ``min_tree``, trees of ``max_capacity`` leaves).
    """
    old = "_alpha" not in state and "alpha" in state
    prefix = "" if old else "_"
    missing = [
        f"{prefix}{k}"
        for k in ("alpha", "beta", "eps", "sum_tree", "min_tree")
        if f"{prefix}{k}" not in state
    ]
    if missing:
        raise ValueError(
            f"{who} state_dict is missing {missing}: pass what {who}.state_dict() returned. Nothing was changed."
        )
    if not old and "_schema_version" in state:
        version = state_int(state, "_schema_version", who, 1)
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"{who} state_dict['_schema_version'] is {version}: this version reads schema {SCHEMA_VERSION}. "
                f"Save it again with this version. Nothing was changed."
            )
    saved_capacity = state.get("max_capacity" if old else "_max_capacity")
    if saved_capacity is not None and (not is_int(saved_capacity) or int(saved_capacity) != max_capacity):
        raise ValueError(
            f"{who} state_dict was saved by a sampler with max_capacity={saved_capacity!r}, this one has "
            f"max_capacity={max_capacity}: build the sampler with max_capacity={saved_capacity!r} to load it. "
            f"Nothing was changed."
        )
    alpha = _check_alpha(state[f"{prefix}alpha"])
    beta = _check_exponent("beta", state[f"{prefix}beta"])
    eps = _check_exponent("eps", state[f"{prefix}eps"])
    sizes = (capacity, max_capacity)
    sums = _tree_leaves(state[f"{prefix}sum_tree"], f"{prefix}sum_tree", who, sizes)
    mins = _tree_leaves(state[f"{prefix}min_tree"], f"{prefix}min_tree", who, (sums.size,))
    max_priority, max_index, recompute = None, -1, False
    if old:
        max_priority, max_index = state.get("max_priority"), state.get("max_priority_index", -1)
    elif "_schema_version" in state:
        pair = state.get("_max_priority", (None, -1))
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{who} state_dict['_max_priority'] must be a raw (value, index) pair, got {pair!r}. Nothing was "
                f"changed."
            )
        max_priority, max_index = pair
    else:
        recompute = True  # the older TorchRL layout held the max in another domain: recomputed from the trees
    if max_priority is not None:
        max_priority = _check_exponent("max_priority", max_priority)
    if not (is_int(max_index) and -1 <= max_index < capacity):
        raise ValueError(
            f"{who} state_dict: the index of the max priority must be an int in [-1, {capacity}), got "
            f"{max_index!r}. Nothing was changed."
        )
    raw = state.get("priority" if old else "_priority")
    if raw is None:
        priority = _raw_from_trees(sums, alpha, eps, 1.0 if max_priority is None else max_priority)
    else:
        priority = _as_value_array(raw, name=f"state_dict[{'priority' if old else '_priority'!r}]")
        if priority.size != sums.size:
            raise ValueError(
                f"{who} state_dict holds {priority.size} raw priorities for trees of {sums.size} leaves. Nothing "
                f"was changed."
            )
    sums, mins = _padded(sums, capacity, 0.0), _padded(mins, capacity, np.inf)
    priority = _padded(priority, capacity, np.nan)
    _check_leaves(who, priority, sums, mins)
    return {
        "alpha": alpha,
        "beta": beta,
        "eps": eps,
        "priority": priority,
        "sum": sums,
        "min": mins,
        "max_priority": max_priority,
        "max_index": -1 if max_priority is None else int(max_index),
        "recompute_max": recompute,
    }
