"""Priority values: :func:`check_priorities` (finite and ``>= 0``), :func:`reduce_priority` (one per item),
the argument checks of the prioritized samplers, how they ravel per-dimension indices and how they keep their
scalars in one (shareable) array.

Kept apart from :mod:`.prioritized` (the sampler and its trees), which re-exports the public helpers.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchrl._validation import check_int, check_positive_int, is_real
from torchrl.data.replay_buffers.samplers.segment_tree import _as_value_array

REDUCTIONS = ("max", "min", "sum", "mean", "median")


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


def _check_max_capacity(max_capacity) -> int:
    return check_positive_int("max_capacity", max_capacity, hint="Pass the storage's max_size.")


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


def _scalar_property(slot: int, doc: str, cast=float) -> property:
    """A property stored at ``slot`` of the owner's ``_scalar_array`` (a float64 array, shareable)."""

    def get(self):
        return cast(self._scalar_array[slot])

    def set(self, value) -> None:
        self._scalar_array[slot] = value

    return property(get, set, doc=doc)
