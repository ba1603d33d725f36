"""How written data is laid out for a storage: the item dim first, how many items a batch holds, and where a
writer resumes in a storage it is given.

Functions of the values they read (tensors, TensorDicts, tensorclasses, pytrees of tensors); used by
:class:`~torchrl.data.ReplayBuffer`'s writes and :meth:`~torchrl.data.ReplayBuffer.set_storage`.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, is_tensorclass


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


def next_row(storage) -> int:
    """The row after the last one written in ``storage`` (its fill level when it is not known), modulo its rows."""
    capacity = storage._max_size_along_dim0()
    last = getattr(storage, "last_written_row", None)
    if isinstance(last, int) and last >= 0:
        return (last + 1) % capacity
    return len(storage) % capacity
