"""Sum and min segment trees stored as one torch tensor, on any device, with TorchRL's tree API.

Data model: a tree of ``size`` leaves holds ``capacity`` = the smallest power of two strictly greater than
``size`` (TorchRL's rule: 5 -> 8, 16 -> 32) and keeps every level in one tensor of ``2 * capacity`` slots of the
tree's dtype (float32 or float64): the root in slot ``1``, the children of slot ``i`` in ``2 * i`` and
``2 * i + 1``, leaf ``j`` in slot ``capacity + j``. Unwritten leaves hold the identity (``0`` for sums, the
dtype's largest finite value for minimums, as TorchRL's trees). The loops are :mod:`._tree_kernels`' torch
kernel: a fixed number of tensor ops per level, never a Python loop over items, no host sync when indices and
values are tensors on the tree's device.

TorchRL's semantics are kept, odd ones included (its trees come from a compiled extension, ours are tensors):

- no bounds checks: positions in ``[size, capacity)`` are real leaves that count in the root, positions in
  ``[capacity, 2 * capacity)`` alias leaf ``position - capacity`` (a leaf is addressed as ``position | capacity``);
- ``query(l, r)`` reduces ``[l, r)``, and returns the root (every leaf) whenever ``l <= 0 and r >= size``;
- ``scan_lower_bound(v)`` (sum trees) is the first leaf whose inclusive prefix sum is ``>= v``, ``size`` when
  ``v`` exceeds the total;
- Python numbers in, Python numbers out (a read of one value); tensors in, tensors out on the tree's device
  (no host sync); numpy arrays in, numpy arrays out;
- pickling keeps the first ``size`` leaves and the device.

:class:`TensorSumSegmentTree` / :class:`TensorMinSegmentTree` take ``dtype`` and ``device``; the TorchRL names
fix them: ``SumSegmentTreeFp32``, ``SumSegmentTreeFp64``, ``MinSegmentTreeFp32``, ``MinSegmentTreeFp64`` (CPU)
and ``CudaSumSegmentTreeFp32``, ... (a CUDA device, ``device=torch.device("cuda")`` by default).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from torchrl._validation import check_int
from torchrl.data.replay_buffers.samplers._tree_kernels import (
    torch_last_writes,
    torch_lower_bound,
    torch_range,
    torch_rebuild,
    torch_write,
)

__all__ = [
    "TensorSumSegmentTree",
    "TensorMinSegmentTree",
    "SumSegmentTreeFp32",
    "SumSegmentTreeFp64",
    "MinSegmentTreeFp32",
    "MinSegmentTreeFp64",
    "CudaSumSegmentTreeFp32",
    "CudaSumSegmentTreeFp64",
    "CudaMinSegmentTreeFp32",
    "CudaMinSegmentTreeFp64",
]

_DTYPE_NAMES = {torch.float32: "Float", torch.float64: "Double"}


def _check_tree_dtype(dtype) -> torch.dtype:
    if dtype not in _DTYPE_NAMES:
        raise NotImplementedError(
            f"`dtype`={dtype!r} is not supported by the segment trees: pass torch.float32 or torch.float64."
        )
    return dtype


def _cuda_device(device) -> torch.device:
    """``device`` as a CUDA device; a clear error without a CUDA build or device."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(
            f"`device`={str(device)!r}: the Cuda* segment trees live on a CUDA device. Pass a CUDA device, or use "
            f"SumSegmentTreeFp32/MinSegmentTreeFp32 (and the Fp64 ones) on the CPU."
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "CUDA segment trees need a CUDA device, and torch sees none (torch.cuda.is_available() is False): use "
            "the CPU classes (SumSegmentTreeFp32, MinSegmentTreeFp32, ...), or install a CUDA build of torch on a "
            "machine with a GPU."
        )
    return device


class _TensorSegmentTree:
    """The tensor, the addressing and TorchRL's read/write API shared by the sum and min trees."""

    _combine: str  # "sum" or "min"

    def __init__(self, size: int, *, dtype: torch.dtype = torch.float32, device="cpu") -> None:
        size = check_int("size", size, minimum=1, type_error=True)
        self._size = int(size)
        self._dtype = _check_tree_dtype(dtype)
        self._device = torch.device(device)
        self._depth = self._size.bit_length()  # capacity = 2 ** depth > size
        self._capacity = 1 << self._depth
        self._tree = torch.full((2 * self._capacity,), self.identity_element, dtype=dtype, device=self._device)

    # -- properties -----------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """The number of leaves asked for."""
        return self._size

    @property
    def capacity(self) -> int:
        """The number of leaves held: the smallest power of two strictly greater than :attr:`size`."""
        return self._capacity

    @property
    def identity_element(self) -> float:
        """What an unwritten leaf holds: ``0`` for sums, the dtype's largest finite value for minimums."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """Where the tree's tensor lives."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def leaves(self) -> torch.Tensor:
        """The ``capacity`` leaves: a view of the tree's tensor (read it; write through :meth:`update`)."""
        return self._tree[self._capacity :]

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size}, device={str(self._device)!r})"

    # -- reads ----------------------------------------------------------------------------------------------
    def at(self, index):
        """Leaf values: a float for an int, a tensor (same shape, on the tree's device) for an int64 tensor, an
        ndarray for an integer ndarray."""
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            return float(self._tree[int(index) | self._capacity])
        if isinstance(index, np.ndarray):
            return self.at(torch.from_numpy(np.asarray(index, dtype=np.int64))).cpu().numpy()
        index = self._index_tensor(index)
        return self._tree.index_select(0, (index | self._capacity).reshape(-1)).reshape(index.shape)

    __getitem__ = at

    def query(self, start, end):
        """The reduction of the leaves in ``[start, end)``; the root when ``start <= 0 and end >= size``.

        Ints give a float; tensors (or ndarrays) of bounds give elementwise results of their broadcast shape, as a
        tensor on the tree's device (or an ndarray), without a host sync.
        """
        if all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in (start, end)):
            if start <= 0 and end >= self._size:
                return float(self._tree[1])
            lo, hi = (min(max(int(b), 0), self._capacity) for b in (start, end))
            if lo >= hi:
                return self.identity_element
            return float(self._range(torch.tensor(lo, device=self._device), torch.tensor(hi, device=self._device)))
        as_numpy = isinstance(start, np.ndarray) or isinstance(end, np.ndarray)
        start, end = (self._bound_tensor(b) for b in (start, end))
        start, end = torch.broadcast_tensors(start, end)
        whole = (start <= 0) & (end >= self._size)
        result = torch.where(whole, self._tree[1], self._range(start.clamp(0, self._capacity),
                                                               end.clamp(0, self._capacity)))  # fmt: skip
        return result.cpu().numpy() if as_numpy else result

    def _range(self, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        return torch_range(self._tree, self._depth, start, end, self._combine, self.identity_element)

    # -- writes ---------------------------------------------------------------------------------------------
    def update(self, index, value) -> None:
        """Sets leaves and recomputes their ancestors: ``(int, number)``, ``(indices, number)`` or ``(indices,
        values of the same shape)``; indices an int64 tensor or ndarray, values a tensor of the tree's dtype (or a
        number / ndarray, converted). When a position repeats, the last value given for it wins.

        Raises:
            RuntimeError: a value tensor of another dtype ("expected scalar type ... but found ..."), or an index
                tensor that is not an integer one.
        """
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            index = torch.tensor([int(index)], device=self._device)
        elif isinstance(index, np.ndarray):
            index = torch.from_numpy(np.asarray(index, dtype=np.int64)).to(self._device)
        else:
            index = self._index_tensor(index)
        index = index.reshape(-1)
        value = self._value_tensor(value, index.shape[0])
        if index.shape[0] == 0:
            return
        positions, winner, _ = torch_last_writes(index & (self._capacity - 1))
        self.update_unique(positions, value[winner])

    __setitem__ = update

    def update_unique(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """:meth:`update` for callers holding checked tensors: nothing is validated or converted.

        Args:
            index (Tensor): 1-D int64 leaf positions in ``[0, capacity)`` on the tree's device; a position may
                repeat only with the same value each time (see
                :func:`~torchrl.data.replay_buffers.samplers._tree_kernels.torch_last_writes`).
            value (Tensor): one value of the tree's dtype per position, on the tree's device.
        """
        torch_write(self._tree, self._depth, index, value, self._combine)

    def set_all(self, values: torch.Tensor) -> None:
        """Replaces the ``capacity`` leaves at once and rebuilds every level (``O(capacity)``)."""
        if values.shape != (self._capacity,):
            raise ValueError(
                f"`values` of shape {list(values.shape)}: pass one value per leaf, shape [{self._capacity}] "
                f"(the capacity of a tree of size {self._size})."
            )
        self._tree[self._capacity :] = values.to(self._device, self._dtype)
        torch_rebuild(self._tree, self._depth, self._combine)

    def reset(self) -> None:
        """Sets every slot back to the identity, in place."""
        self._tree.fill_(self.identity_element)

    # -- pickling (TorchRL keeps the first ``size`` leaves and the device) -----------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "size": self._size,
            "dtype": self._dtype,
            "device": str(self._device),
            "values": self._tree[self._capacity : self._capacity + self._size].cpu(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        _TensorSegmentTree.__init__(self, state["size"], dtype=state["dtype"], device=state["device"])
        self._tree[self._capacity : self._capacity + self._size] = state["values"].to(self._device)
        torch_rebuild(self._tree, self._depth, self._combine)

    # -- argument conversion --------------------------------------------------------------------------------
    def _index_tensor(self, index) -> torch.Tensor:
        if not isinstance(index, torch.Tensor):
            raise TypeError(
                f"`index` must be an int, an int64 tensor or an int64 ndarray, got {type(index).__name__}."
            )
        if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
            raise RuntimeError(f"index must be an int64 tensor, got dtype {index.dtype}.")
        return index.to(self._device, torch.long)

    def _bound_tensor(self, bound) -> torch.Tensor:
        if isinstance(bound, np.ndarray):
            bound = torch.from_numpy(np.asarray(bound, dtype=np.int64))
        elif not isinstance(bound, torch.Tensor):
            bound = torch.tensor(int(bound))
        return self._index_tensor(bound)

    def _value_tensor(self, value, count: int) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.dtype != self._dtype:
                expected, found = _DTYPE_NAMES[self._dtype], _DTYPE_NAMES.get(value.dtype, str(value.dtype))
                raise RuntimeError(
                    f"expected scalar type {expected} but found {found}: value has an unexpected dtype for "
                    f"{type(self).__name__} (pass value.to({self._dtype}))."
                )
            value = value.to(self._device)
        else:
            value = torch.as_tensor(np.asarray(value, dtype=np.float64), device=self._device).to(self._dtype)
        value = value.reshape(-1)
        if value.shape[0] == count:
            return value
        if value.shape[0] == 1:
            return value.expand(count)
        raise ValueError(f"`value` has {value.shape[0]} entries for {count} indices: pass one per index or one in all.")


class TensorSumSegmentTree(_TensorSegmentTree):
    """A sum segment tree as one torch tensor (see the module doc), with prefix-sum searches.

    Args:
        size (int): the number of leaves (``capacity``, the next power of two above it, are held).

    Keyword Args:
        dtype (torch.dtype): ``torch.float32`` or ``torch.float64``. Defaults to ``torch.float32``.
        device (torch.device or str): where the tensor lives. Defaults to ``"cpu"``.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.samplers.tensor_segment_tree import TensorSumSegmentTree
        >>> tree = TensorSumSegmentTree(5, dtype=torch.float64)
        >>> tree.update(torch.arange(5), torch.arange(1.0, 6.0, dtype=torch.float64))
        >>> tree.query(0, 5), tree.query(1, 3)
        (15.0, 5.0)
        >>> tree.scan_lower_bound(torch.tensor([0.0, 1.0, 1.0001, 3.0, 3.5, 15.0, 15.0001], dtype=torch.float64))
        tensor([0, 0, 1, 1, 2, 4, 5])
    """

    _combine = "sum"

    @property
    def identity_element(self) -> float:
        return 0.0

    def scan_lower_bound(self, value):
        """The first leaf whose inclusive prefix sum is ``>= value``; ``size`` where ``value`` exceeds the total.

        A number gives an int; a tensor (on the tree's device, without a host sync) or an ndarray gives int64
        positions of the same shape.
        """
        if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
            mass = torch.tensor(float(value), dtype=self._dtype, device=self._device)
            return int(self._lower_bound(mass))
        if isinstance(value, np.ndarray):
            mass = torch.from_numpy(np.asarray(value, dtype=np.float64)).to(self._device, self._dtype)
            return self._lower_bound(mass).cpu().numpy()
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"`value` must be a number, a tensor or an ndarray, got {type(value).__name__}.")
        return self._lower_bound(value.to(self._device, self._dtype))

    def _lower_bound(self, mass: torch.Tensor) -> torch.Tensor:
        found = torch_lower_bound(self._tree, self._depth, mass)
        return torch.where(mass > self._tree[1], self._size, found)


class TensorMinSegmentTree(_TensorSegmentTree):
    """A min segment tree as one torch tensor (see the module doc); unwritten leaves hold the dtype's largest
    finite value.

    Args, Keyword Args: as :class:`TensorSumSegmentTree`.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.samplers.tensor_segment_tree import TensorMinSegmentTree
        >>> tree = TensorMinSegmentTree(4)
        >>> tree.update(torch.tensor([1, 3]), torch.tensor([5.0, 2.0]))
        >>> tree.query(0, 4), tree.query(0, 2), tree.query(2, 3)
        (2.0, 5.0, 3.4028234663852886e+38)
    """

    _combine = "min"

    @property
    def identity_element(self) -> float:
        return float(torch.finfo(self._dtype).max)


class SumSegmentTreeFp32(TensorSumSegmentTree):
    """TorchRL's CPU float32 sum tree: :class:`TensorSumSegmentTree` on the CPU.

    Examples:
        >>> from torchrl.data.replay_buffers.samplers import SumSegmentTreeFp32
        >>> tree = SumSegmentTreeFp32(5)
        >>> tree.size, tree.capacity, len(tree), tree.identity_element
        (5, 8, 5, 0.0)
    """

    def __init__(self, size: int) -> None:
        super().__init__(size, dtype=torch.float32, device="cpu")


class SumSegmentTreeFp64(TensorSumSegmentTree):
    """TorchRL's CPU float64 sum tree: :class:`TensorSumSegmentTree` on the CPU.

    Examples:
        >>> from torchrl.data.replay_buffers.samplers import SumSegmentTreeFp64
        >>> tree = SumSegmentTreeFp64(5)
        >>> tree[2] = 3.0
        >>> tree[2], tree.query(0, 5)
        (3.0, 3.0)
    """

    def __init__(self, size: int) -> None:
        super().__init__(size, dtype=torch.float64, device="cpu")


class MinSegmentTreeFp32(TensorMinSegmentTree):
    """TorchRL's CPU float32 min tree: :class:`TensorMinSegmentTree` on the CPU.

    Examples:
        >>> from torchrl.data.replay_buffers.samplers import MinSegmentTreeFp32
        >>> MinSegmentTreeFp32(5).query(0, 5)
        3.4028234663852886e+38
    """

    def __init__(self, size: int) -> None:
        super().__init__(size, dtype=torch.float32, device="cpu")


class MinSegmentTreeFp64(TensorMinSegmentTree):
    """TorchRL's CPU float64 min tree: :class:`TensorMinSegmentTree` on the CPU.

    Examples:
        >>> from torchrl.data.replay_buffers.samplers import MinSegmentTreeFp64
        >>> tree = MinSegmentTreeFp64(5)
        >>> tree.update(3, 2.5)
        >>> tree.query(0, 5), tree.query(0, 3)
        (2.5, 1.7976931348623157e+308)
    """

    def __init__(self, size: int) -> None:
        super().__init__(size, dtype=torch.float64, device="cpu")


class CudaSumSegmentTreeFp32(TensorSumSegmentTree):
    """TorchRL's CUDA float32 sum tree: :class:`TensorSumSegmentTree` on a CUDA device.

    Raises:
        RuntimeError: torch sees no CUDA device (use :class:`SumSegmentTreeFp32`, or a CUDA build of torch).
    """

    def __init__(self, size: int, device=torch.device("cuda")) -> None:  # noqa: B008 (TorchRL's default)
        super().__init__(size, dtype=torch.float32, device=_cuda_device(device))


class CudaSumSegmentTreeFp64(TensorSumSegmentTree):
    """TorchRL's CUDA float64 sum tree (see :class:`CudaSumSegmentTreeFp32`)."""

    def __init__(self, size: int, device=torch.device("cuda")) -> None:  # noqa: B008
        super().__init__(size, dtype=torch.float64, device=_cuda_device(device))


class CudaMinSegmentTreeFp32(TensorMinSegmentTree):
    """TorchRL's CUDA float32 min tree (see :class:`CudaSumSegmentTreeFp32`)."""

    def __init__(self, size: int, device=torch.device("cuda")) -> None:  # noqa: B008
        super().__init__(size, dtype=torch.float32, device=_cuda_device(device))


class CudaMinSegmentTreeFp64(TensorMinSegmentTree):
    """TorchRL's CUDA float64 min tree (see :class:`CudaSumSegmentTreeFp32`)."""

    def __init__(self, size: int, device=torch.device("cuda")) -> None:  # noqa: B008
        super().__init__(size, dtype=torch.float64, device=_cuda_device(device))
