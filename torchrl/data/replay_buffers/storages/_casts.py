"""Checks that data written into a tensor storage survives the cast to the stored dtype.

A storage keeps each entry in the dtype of its first write; later writes are cast to it. ``torch`` casts
silently: ``7.9`` becomes ``7`` in an int64 entry, ``NaN`` and ``2**70`` become ``INT64_MIN``, ``300``
becomes ``44`` in a uint8 entry, ``1e300`` becomes ``inf`` in a float32 one. :func:`check_cast` refuses such
writes before anything is stored. Accepted: integral floats into integer entries (``3.0`` -> ``3``), ints
into float entries, floats into float entries (rounding to the stored precision) as long as every value
stays in range, and for bool entries only the values ``0`` and ``1``.

The check costs nothing when the dtypes match (the common case) and is otherwise a few vectorized
reductions over the written values.
"""

from __future__ import annotations

import torch

_SHOWN = 3  # offending values quoted in an error


def _range_of(dtype: torch.dtype) -> tuple[float, float] | None:
    """``(lowest, highest)`` finite value of ``dtype`` (``None`` for bool and complex)."""
    if dtype == torch.bool or dtype.is_complex:
        return None
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min, info.max


def _fits(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every value of ``src`` is representable in ``dst`` up to rounding (no value check needed)."""
    if src == torch.bool:
        return True
    if dst.is_complex:
        return not src.is_complex or torch.finfo(src).max <= torch.finfo(dst).max
    if src.is_complex or dst == torch.bool:
        return False
    if src.is_floating_point and not dst.is_floating_point:
        return False  # fractions, NaN and inf never fit an integer dtype
    lo_src, hi_src = _range_of(src)
    lo_dst, hi_dst = _range_of(dst)
    return lo_dst <= lo_src and hi_src <= hi_dst


def _refuse(what: str, src: torch.dtype, dst: torch.dtype, values: torch.Tensor, problem: str) -> ValueError:
    shown = values.reshape(-1)[:_SHOWN].tolist()
    return ValueError(
        f"{what} holds {problem} for the stored dtype {dst} (data dtype {src}), e.g. {shown} "
        f"({values.numel()} value(s)): the cast would change them silently. Write values that {dst} can hold "
        f"(round or clip them first, e.g. x.round().clamp(lo, hi)), or store them in a wider dtype (the first "
        f"write into a new storage sets it). Nothing was written."
    )


def check_cast(src: torch.Tensor, dst_dtype: torch.dtype, what: str) -> None:
    """Raises ``ValueError`` if casting ``src`` to ``dst_dtype`` would change a value beyond rounding.

    Refused: NaN, infinite or non-integral floats into an integer entry; values outside the range of the
    stored dtype (``300`` or ``-1`` into uint8, ``2**70`` into int64, ``1e300`` into float32); values other
    than ``0``/``1`` into a bool entry; complex values with a non-zero imaginary part into a real entry.

    Args:
        src (torch.Tensor): the values written.
        dst_dtype (torch.dtype): the dtype of the stored entry.
        what (str): the subject of the error, naming the entry (e.g. ``"Entry 'action' of the data"``).

    Examples:
        >>> import torch
        >>> check_cast(torch.tensor([3.0, -2.0]), torch.int64, "Entry 'action'")  # integral: accepted
        >>> check_cast(torch.tensor([7.9]), torch.int64, "Entry 'action'")
        Traceback (most recent call last):
        ...
        ValueError: Entry 'action' holds values that are not integers in [-9223372036854775808, ...
    """
    src_dtype = src.dtype
    if src_dtype == dst_dtype or _fits(src_dtype, dst_dtype) or not src.numel():
        return
    values = src.detach()
    if values.is_complex() and not dst_dtype.is_complex:
        lossy = values.imag != 0
        if lossy.any():
            raise _refuse(what, src_dtype, dst_dtype, values[lossy], "complex values (non-zero imaginary part)")
        values = values.real
    if dst_dtype == torch.bool:
        bad = (values != 0) & (values != 1)
        if bad.any():
            raise _refuse(what, src_dtype, dst_dtype, values[bad], "values other than 0 and 1")
        return
    if dst_dtype.is_floating_point or dst_dtype.is_complex:  # finite values must stay finite
        overflow = ~torch.isfinite(values.to(dst_dtype)) & torch.isfinite(values)
        if overflow.any():
            raise _refuse(what, src_dtype, dst_dtype, values[overflow], "values out of range")
        return
    lo, hi = _range_of(dst_dtype)
    problem = f"values out of range [{lo}, {hi}]"
    if values.is_floating_point():
        # NaN fails every comparison but `!=`; lo (0 or -2**k) and hi + 1 (2**k) are exact as floats
        bad = (values != values.trunc()) | ~(values >= float(lo)) | ~(values < float(hi + 1))
        problem = f"values that are not integers in [{lo}, {hi}] (fractional, NaN, infinite or out of range)"
    else:
        values, wrapped = _as_checkable_int(values)
        if wrapped is not None and wrapped.any():  # uint64 values >= 2**63 fit no other integer dtype
            raise _refuse(what, src_dtype, dst_dtype, src.detach()[wrapped], problem)
        if values.amin().item() >= lo and values.amax().item() <= hi:  # exact comparisons in Python
            return
        bad = _outside_int(values, lo, hi)
    if bad.any():
        raise _refuse(what, src_dtype, dst_dtype, values[bad], problem)


def _as_checkable_int(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``values`` as a dtype with min/max kernels (the wide unsigned dtypes lack them), and for uint64 the
    mask of the values that int64 cannot hold (``None`` otherwise)."""
    if values.dtype in (torch.uint16, torch.uint32):
        return values.to(torch.int64), None
    if values.dtype == torch.uint64:
        signed = values.view(torch.int64)
        return signed, signed < 0
    return values, None


def _outside_int(values: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The mask of integer ``values`` outside ``[lo, hi]``, with bounds clipped to the range of ``values``."""
    own_lo, own_hi = _range_of(values.dtype)
    mask = torch.zeros_like(values, dtype=torch.bool)
    if lo > own_lo:
        mask |= values < lo
    if hi < own_hi:
        mask |= values > hi
    return mask
