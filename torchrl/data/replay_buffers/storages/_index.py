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


def as_index_tensor(index, device=None) -> torch.Tensor:
    """A 1-D int64 tensor from a tensor, list, range or ndarray index (boolean masks become positions).

    An empty list or tuple is an empty index (numpy would make it float64); an explicitly floating tensor or
    ndarray is refused, empty or not.
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
        if not array.size and not isinstance(index, np.ndarray):
            array = array.astype(np.int64)  # numpy makes an empty list float64; as in numpy, [] selects nothing
        index = torch.as_tensor(array)
    if index.dtype == torch.bool:
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
