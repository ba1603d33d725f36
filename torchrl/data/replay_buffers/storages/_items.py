"""Batches a tensor storage accepts besides one tensor, TensorDict, tensorclass or pytree.

As in TorchRL, a Python ``list`` written into a tensor storage is a batch of items (TensorDicts,
tensorclasses, tensors or pytrees of one structure), stacked into one batch before the write; a ``tuple`` stays
a pytree. A lazily stacked TensorDict is written as the dense batch it stands for; when its entries are ragged
(members of different shapes) no tensor storage can hold it, and the error names the storages that can.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from tensordict.utils import is_tensorclass

from torchrl.data.replay_buffers.errors import torchrl_error
from torchrl.data.replay_buffers.storages._casts import check_cast


def as_batch(data):
    """``data`` as one batch: a list of items stacked, a lazy stack of items of different shapes refused
    (``ValueError``). A lazy stack along an inner dim (each item a lazy stack of the same members) is kept."""
    if isinstance(data, list):
        return _stack_items(data)
    if isinstance(data, LazyStackedTensorDict) and data.stack_dim == 0:
        _check_not_ragged(data)
    return data


def _unstackable(detail: str) -> Exception:
    return torchrl_error("storage_unstackable_list", detail=detail)


def _stack_items(items: list):
    if not items:
        raise ValueError("Cannot write an empty list of items into a tensor storage: pass at least one item.")
    first = items[0]
    if isinstance(first, (torch.Tensor, TensorDictBase)) or is_tensorclass(first):
        for item in items:
            if isinstance(item, LazyStackedTensorDict) and item.stack_dim == 0:
                _check_not_ragged(item)
        try:
            return torch.stack(items)
        except (RuntimeError, TypeError, ValueError) as err:
            raise _unstackable(f"{type(err).__name__}: {err}") from None
    leaves, spec = pytree.tree_flatten(first)
    columns = [[leaf] for leaf in leaves]
    for i, item in enumerate(items[1:], start=1):
        item_leaves, item_spec = pytree.tree_flatten(item)
        if item_spec != spec:
            raise _unstackable(f"item 0 and item {i} have different structures: {spec} and {item_spec}")
        for column, leaf in zip(columns, item_leaves):
            column.append(leaf)
    try:
        return pytree.tree_unflatten([torch.stack(column) for column in columns], spec)
    except (RuntimeError, TypeError) as err:
        raise _unstackable(f"{type(err).__name__}: {err}") from None


def _check_not_ragged(td: LazyStackedTensorDict) -> None:
    for key in td.keys(include_nested=True, leaves_only=True):
        try:
            td.get(key)
        except RuntimeError:
            raise ValueError(
                f"Cannot write this batch into a tensor storage: entry {key!r} of the lazily stacked TensorDict "
                f"is ragged along its items, and a tensor storage holds items of one shape (a lazy stack along "
                f"an inner dim, whose members each hold one shape, is accepted). Use ListStorage for items of "
                f"different shapes, or pad them to one shape."
            ) from None


def is_ragged_stack(td) -> bool:
    """Whether ``td`` is a lazy stack one of whose entries differs in shape between members."""
    if not isinstance(td, LazyStackedTensorDict):
        return False
    for key in td.keys(include_nested=True, leaves_only=True):
        try:
            td.get(key)
        except RuntimeError:
            return True
    return False


def check_member_write(backing: LazyStackedTensorDict, td, batch: tuple) -> None:
    """Raises unless ``td``, a write of ``batch`` rows (``()``: one row) into the lazily stacked ``backing``,
    holds for each member of ``backing`` the same keys, shapes (past the rows) and castable values."""
    if not isinstance(td, TensorDictBase):
        raise TypeError(
            f"This storage holds lazily stacked TensorDicts (items whose members differ in shape); got "
            f"{type(td).__name__}. Write TensorDicts laid out like the first write."
        )
    expected = torch.Size([*batch, *backing.batch_size[1:]])
    if td.batch_size != expected:
        raise ValueError(
            f"The data written has batch size {list(td.batch_size)}; the storage expects {list(expected)} "
            f"({'one item' if not batch else f'{batch[0]} items'} of batch size {list(backing.batch_size[1:])}). "
            f"Nothing was written."
        )
    dim = backing.stack_dim - 1 + len(batch)
    if isinstance(td, LazyStackedTensorDict) and td.stack_dim == dim:
        members = td.tensordicts
    else:
        try:
            members = td.unbind(dim)
        except RuntimeError as err:
            raise ValueError(
                f"The data written cannot be split into the {len(backing.tensordicts)} members the storage "
                f"stacks along dim {dim} ({err}). Write a lazy stack laid out like the first write. Nothing was "
                f"written."
            ) from None
    for j, (stored, given) in enumerate(zip(backing.tensordicts, members)):
        stored_keys = set(stored.keys(include_nested=True, leaves_only=True))
        given_keys = set(given.keys(include_nested=True, leaves_only=True))
        if stored_keys != given_keys:
            raise ValueError(
                f"Member {j} of the data written has keys {sorted(map(str, given_keys))}; the storage holds "
                f"{sorted(map(str, stored_keys))} there. Write data with the keys of the first write. Nothing was "
                f"written."
            )
        for key in stored_keys:
            dst, src = stored.get(key), given.get(key)
            want = torch.Size([*batch, *dst.shape[1:]])
            if src.shape != want:
                raise ValueError(
                    f"Entry {key!r} of member {j} of the data written has shape {list(src.shape)}; the storage "
                    f"expects {list(want)}. Nothing was written."
                )
            if src.dtype != dst.dtype:
                check_cast(src, dst.dtype, f"Entry {key!r} of member {j} of the data written")


def move_dim(td: TensorDictBase, src: int, dst: int) -> TensorDictBase:
    """``td`` with batch dim ``src`` of every leaf moved to ``dst`` (its batch size permuted alike when it
    covers both dims, else cleared)."""
    if src == dst:
        return td
    batch = list(td.batch_size)
    if len(batch) > max(src, dst):
        batch.insert(dst, batch.pop(src))
    else:
        batch = []
    return td.apply(lambda t: t.movedim(src, dst), batch_size=batch)


def broadcast_leaves(td: TensorDictBase, shapes: dict, batch) -> TensorDictBase:
    """``td`` with each leaf ``key`` broadcast to ``shapes[key]`` (``ValueError`` naming the key if it cannot)."""
    out = TensorDict(batch_size=batch, device=td.device)
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        want = shapes.get(key if isinstance(key, tuple) else (key,))
        if want is None:
            out.set(key, leaf)
            continue
        try:
            out.set(key, leaf.expand(want))
        except RuntimeError:
            raise ValueError(
                f"Entry {key!r} of the value assigned has shape {list(leaf.shape)}, which does not broadcast to "
                f"the {list(want)} cells selected. Nothing was written."
            ) from None
    return out


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
