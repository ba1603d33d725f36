"""Index normalization shared by the storages: turns what users pass into ints, slices or long tensors."""

from __future__ import annotations

import numpy as np
import torch

from torchrl._validation import is_int as _is_int_value


def is_int(index) -> bool:
    """Whether ``index`` designates one item: an int, a numpy integer or a 0-d integer tensor/ndarray."""
    if isinstance(index, (torch.Tensor, np.ndarray)):
        return index.ndim == 0 and not _is_bool(index)
    return _is_int_value(index)


def _is_bool(index) -> bool:
    dtype = index.dtype
    return dtype == torch.bool or dtype == np.bool_


def as_index_tensor(index, device=None, mask_sizes: tuple[int, ...] | None = None) -> torch.Tensor:
    """A 1-D int64 tensor from a tensor, list, range or ndarray index (boolean masks become positions).

    An empty list or tuple is an empty index (numpy would make it float64); an explicitly floating tensor or
    ndarray is refused, empty or not. With ``mask_sizes``, a boolean mask must be 1-D and have one of these
    lengths (the rows it selects from), else ``IndexError``: a shorter mask is not read as a prefix.
    """
    if isinstance(index, range):
        return torch.arange(index.start, index.stop, index.step, device=device)
    if not isinstance(index, torch.Tensor):
        try:
            array = np.asarray(index)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"Cannot index a storage with {type(index).__name__} {index!r}: pass an int, a slice, a 1-D "
                f"tensor/list/ndarray of ints or a boolean mask."
            ) from err
        if array.dtype.kind not in "biufc":  # None, strings, objects: numpy keeps them as object/str arrays
            raise TypeError(
                f"Cannot index a storage with {type(index).__name__} {index!r:.80}: pass an int, a slice, a 1-D "
                f"tensor/list/ndarray of ints or a boolean mask (`None` adds no dimension to a storage read; "
                f"use [:] for every item)."
            )
        if not array.size and not isinstance(index, np.ndarray):
            array = array.astype(
                np.int64
            )  # numpy makes an empty list float64; as in numpy, [] selects nothing
        index = torch.as_tensor(array)
    if index.dtype == torch.bool:
        if mask_sizes is not None and (index.ndim != 1 or index.shape[0] not in mask_sizes):
            sizes = " or ".join(str(n) for n in dict.fromkeys(mask_sizes))
            raise IndexError(
                f"A boolean mask of shape {list(index.shape)} cannot select rows of a storage holding {sizes} "
                f"rows: pass a 1-D mask of length {sizes} (one flag per row), or the positions as ints."
            )
        index = index.nonzero().squeeze(-1)
    elif index.is_floating_point() or index.is_complex():
        raise TypeError(f"Storage indices must be integers, got a tensor of dtype {index.dtype}.")
    if index.ndim != 1:
        index = index.reshape(-1)
    if index.dtype != torch.long:
        index = index.long()
    if device is not None and index.device != torch.device(device):
        index = index.to(device)
    return index


def check_bounds(index: torch.Tensor, size: int, name: str = "index") -> torch.Tensor:
    """Checks ``-size <= index < size`` and maps negative positions to positive ones."""
    if not index.numel():
        return index
    lo, hi = index.aminmax()
    lo, hi = int(lo), int(hi)
    if hi >= size or lo < -size:
        bad = hi if hi >= size else lo
        raise IndexError(
            f"{name} {bad} is out of range for a storage holding {size} rows; valid positions are "
            f"0..{size - 1} (or -{size}..-1)."
        )
    if lo < 0:
        index = torch.where(index < 0, index + size, index)
    return index


def check_int(index, size: int, name: str = "index") -> int:
    index = int(index)
    if not -size <= index < size:
        raise IndexError(
            f"{name} {index} is out of range for a storage holding {size} rows; valid positions are "
            f"0..{size - 1} (or -{size}..-1)."
        )
    return index % size if size else index


def layout_index(index: tuple, ndim: int, dim_extend: int) -> tuple[tuple, int | None]:
    """Translates a per-dimension ``index`` given in the layout of the data a buffer's ``extend`` receives
    (rows along dim ``dim_extend``: ``[envs, time]`` for an ``ndim=2`` storage with ``dim_extend=1``) into the
    storage's own layout (rows first: ``[time, envs]``).

    Returns ``(backing_index, position)``: ``position`` is where the rows dim of a read of ``backing_index`` goes
    back to in the caller's layout (``None``: the result keeps the storage's order, e.g. the rows entry is an
    int). Raises ``IndexError`` for what has no unambiguous translation (``...``, ``None``, several index
    tensors mixed with slices, more entries than ``ndim``).

    Examples:
        >>> layout_index((0, slice(3, 4)), ndim=2, dim_extend=1)  # env 0, steps 3:4
        ((slice(3, 4, None), 0), 0)
        >>> layout_index((slice(None), slice(7, 8)), ndim=2, dim_extend=1)
        ((slice(7, 8, None), slice(None, None, None)), 1)
    """
    if any(i is Ellipsis or i is None for i in index) or len(index) > ndim:
        raise IndexError(
            f"Cannot index a {ndim}-dim buffer with {index!r}: pass at most {ndim} entries, each an int, a slice "
            f"or an index tensor (no `...` or `None`)."
        )
    index = tuple(index) + (slice(None),) * (dim_extend + 1 - len(index))
    backing = (index[dim_extend], *index[:dim_extend], *index[dim_extend + 1 :])
    kept = [not is_int(i) for i in index]
    advanced = [not isinstance(i, slice) and k for i, k in zip(index, kept)]
    if not kept[dim_extend]:
        return backing, None
    if sum(advanced) > 1:
        if all(a or not k for a, k in zip(advanced, kept)):
            return backing, None  # index tensors broadcast together into one dim
        raise IndexError(
            f"Cannot index a {ndim}-dim buffer with {index!r}: several index tensors mixed with slices have no "
            f"unambiguous layout. Index with one tensor and slices, or read rb[:] and index the result."
        )
    return backing, sum(kept[:dim_extend])
