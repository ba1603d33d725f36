"""How written data is laid out for a storage: the item dim first, how many items a batch holds, and where a
writer resumes in a storage it is given.

Functions of the values they read (tensors, TensorDicts, tensorclasses, pytrees of tensors); used by
:class:`~torchrl.data.ReplayBuffer`'s writes (the priorities given with them included) and
:meth:`~torchrl.data.ReplayBuffer.set_storage`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl.data.replay_buffers.samplers.prioritized import reduce_priority


def move_dim_to_front(data, dim: int):
    """``data`` with its dim ``dim`` first (ValueError naming ``dim_extend`` when it has fewer dims)."""
    shape = batch_shape(data)
    if shape is not None and len(shape) <= dim:
        raise ValueError(
            f"extend() writes along dim `dim_extend`={dim} of the data (by default the storage's ndim - 1: an "
            f"ndim=2 storage takes [env, time, ...] batches), but the data has batch shape {list(shape)}. Pass "
            f"data with at least {dim + 1} leading dims (e.g. data.unsqueeze(0) for one env), or use a storage "
            f"with ndim=1 for flat batches."
        )
    if isinstance(data, (torch.Tensor, TensorDictBase)) or hasattr(data, "transpose"):
        return data.transpose(0, dim)
    import torch.utils._pytree as pytree

    return pytree.tree_map(lambda t: t.transpose(0, dim), data)


def items_in(data) -> int:
    """The number of items of a batch laid out as the storage expects (its first dim; a list's length)."""
    shape = batch_shape(data)
    if shape is not None and len(shape):
        return int(shape[0])
    return len(data) if hasattr(data, "__len__") else 1


def batch_shape(data) -> torch.Size | None:
    """The dims of ``data`` that ``extend`` may index (batch size of a TensorDict/tensorclass, shape of a
    tensor, shortest leaf shape of a pytree); ``None`` when unknown."""
    if isinstance(data, TensorDictBase) or is_tensorclass(data):
        return data.batch_size
    if isinstance(data, torch.Tensor):
        return data.shape
    import torch.utils._pytree as pytree

    shapes = [leaf.shape for leaf in pytree.tree_leaves(data) if isinstance(leaf, torch.Tensor)]
    return min(shapes, key=len) if shapes else None


def priorities_per_item(priority, batch, *, dim: int, ndim: int, dim_extend: int, reduction: str) -> torch.Tensor:
    """``priority`` (``extend(update_priority=...)``: a number, or one value per item in the layout of the data)
    as a tensor shaped like the items of ``batch`` (items along its dim ``dim``; the storage's first ``ndim``
    dims), items first, trailing dims reduced with ``reduction``; ``ValueError`` when the count does not match."""
    shape = [len(batch)] if isinstance(batch, list) else batch_shape(batch)
    shape = [items_in(batch)] if shape is None or len(shape) < max(ndim, dim + 1) else list(shape)
    if dim:
        shape[0], shape[dim] = shape[dim], shape[0]
    shape = shape[:ndim]
    values = torch.as_tensor(priority)
    if values.ndim == 0:
        return values.expand(shape)
    if dim_extend and values.ndim > dim_extend:  # given in the layout of the data
        values = values.transpose(0, dim_extend)
    values = reduce_priority(values, reduction, batch_dims=ndim)
    if list(values.shape) != shape:
        raise ValueError(
            f"`update_priority` has shape {list(torch.as_tensor(priority).shape)}, for written items of "
            f"shape {shape} (items first; the items the inverse transforms return, if any): pass one "
            f"priority per item (in the layout of the data, items along dim_extend={dim_extend}), "
            f"or one number for all. Nothing was written."
        )
    return values


def next_row(storage) -> int:
    """The row after the last one written in ``storage`` (its fill level when it is not known), modulo its rows."""
    capacity = storage._max_size_along_dim0()
    last = getattr(storage, "last_written_row", None)
    if isinstance(last, int) and last >= 0:
        return (last + 1) % capacity
    return len(storage) % capacity
