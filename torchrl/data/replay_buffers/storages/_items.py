"""Batches a tensor storage accepts besides one tensor, TensorDict, tensorclass or pytree.

As in TorchRL, a Python ``list`` written into a tensor storage is a batch of items (TensorDicts,
tensorclasses, tensors or pytrees of one structure), stacked into one batch before the write; a ``tuple`` stays
a pytree. A lazily stacked TensorDict is written as the dense batch it stands for; when its entries are ragged
(members of different shapes) no tensor storage can hold it, and the error names the storages that can.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from tensordict import LazyStackedTensorDict, TensorDictBase
from tensordict.utils import is_tensorclass


def as_batch(data):
    """``data`` as one batch: a list of items stacked, a ragged lazy stack refused (``ValueError``)."""
    if isinstance(data, list):
        return _stack_items(data)
    if isinstance(data, LazyStackedTensorDict):
        _check_not_ragged(data)
    return data


def _stack_items(items: list):
    if not items:
        raise ValueError("Cannot write an empty list of items into a tensor storage: pass at least one item.")
    first = items[0]
    if isinstance(first, (torch.Tensor, TensorDictBase)) or is_tensorclass(first):
        if isinstance(first, LazyStackedTensorDict) or any(
            isinstance(i, LazyStackedTensorDict) for i in items
        ):
            for item in items:
                if isinstance(item, LazyStackedTensorDict):
                    _check_not_ragged(item)
        try:
            return torch.stack(items)
        except RuntimeError as err:
            raise ValueError(_ragged_message(f"the items of the list do not stack ({err})")) from None
    leaves, spec = pytree.tree_flatten(first)
    columns = [[leaf] for leaf in leaves]
    for item in items[1:]:
        item_leaves, item_spec = pytree.tree_flatten(item)
        if item_spec != spec:
            raise ValueError(
                f"The items of the list written have different structures ({spec} and {item_spec}): a list is a "
                f"batch of items of one structure. Use ListStorage for items of different structures."
            )
        for column, leaf in zip(columns, item_leaves):
            column.append(leaf)
    try:
        return pytree.tree_unflatten([torch.stack(column) for column in columns], spec)
    except RuntimeError as err:
        raise ValueError(_ragged_message(f"the items of the list do not stack ({err})")) from None


def _check_not_ragged(td: LazyStackedTensorDict) -> None:
    for key in td.keys(include_nested=True, leaves_only=True):
        try:
            td.get(key)
        except RuntimeError:
            raise ValueError(
                _ragged_message(f"entry {key!r} of the lazily stacked TensorDict is ragged")
            ) from None


def _ragged_message(what: str) -> str:
    return (
        f"Cannot write this batch into a tensor storage: {what}, and a tensor storage holds items of one shape. "
        f"Use ListStorage for items of different shapes, or pad them to one shape."
    )


def leading_shape(td: TensorDictBase) -> torch.Size:
    """The batch size of ``td``, or the shape of its first leaf when the batch size is empty."""
    if td.batch_dims:
        return td.batch_size
    for value in td.values(include_nested=True, leaves_only=True):
        return value.shape
    return torch.Size([])


def with_batch(td: TensorDictBase, batch) -> TensorDictBase:
    """A shallow copy of ``td`` with the batch size ``batch``."""
    out = td.copy()
    out.batch_size = torch.Size(batch)
    return out
