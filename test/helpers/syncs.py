"""Counting the ops that force a device-to-host synchronisation, on any device (the CPU included).

On CUDA these ops stall the stream until the device catches up: a Python number read from a tensor
(``.item()``, ``int(t)``, ``bool(t)``, a tensor in an ``if``), an output whose size depends on the data
(``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``, ``repeat_interleave`` without an
``output_size``) and whole-tensor comparisons (``torch.equal``). A :class:`SyncCounter` sees them at the
dispatcher, so a test on the CPU catches what would stall a GPU. It cannot see a tensor turned into a numpy
array (``.numpy()`` does not dispatch): paths that must run on a device keep their state in tensors.

Examples:
    >>> import torch
    >>> from helpers.syncs import SyncCounter
    >>> with SyncCounter() as syncs:
    ...     x = torch.arange(5)
    ...     _ = x[x > 2]  # boolean-mask indexing: the output size is data-dependent
    ...     _ = int(x.sum())
    >>> syncs.count, sorted(set(syncs.ops))
    (2, ['aten._local_scalar_dense.default', 'aten.index.Tensor'])
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# ops that always read data back to the host
ALWAYS = {
    aten._local_scalar_dense.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.argwhere.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
}


def _has_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def is_sync(func, args, kwargs) -> bool:
    """Whether one dispatched op forces a host sync (see the module docstring)."""
    if func in ALWAYS:
        return True
    if func in (aten.index.Tensor,) and len(args) > 1:
        return _has_bool_index(args[1])
    if func in (aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default) and len(args) > 1:
        return _has_bool_index(args[1])
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    if func in (aten.repeat_interleave.self_Tensor,):
        return kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
    return False


class SyncCounter(TorchDispatchMode):
    """A dispatch mode that records each host-sync op run under it (``.count``, ``.ops`` names in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    @property
    def count(self) -> int:
        return len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_sync(func, args, kwargs):
            self.ops.append(str(func))
        return func(*args, **kwargs)


def count_syncs(fn, *args, **kwargs) -> tuple[int, list[str], object]:
    """Runs ``fn(*args, **kwargs)`` under a :class:`SyncCounter`: (count, op names, result)."""
    with SyncCounter() as counter:
        result = fn(*args, **kwargs)
    return counter.count, counter.ops, result
