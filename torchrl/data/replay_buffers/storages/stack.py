"""A list storage whose reads are lazy stacks: :class:`LazyStackStorage`, for items of different shapes.

Items are TensorDicts (or tensorclasses) kept as written in a Python list, as in
:class:`~torchrl.data.ListStorage`. A read of several items returns them as one
:class:`~tensordict.LazyStackedTensorDict` (:func:`tensordict.lazy_stack`), which holds the items without
copying them, so their entries may differ in shape (token sequences of different lengths, images of
different sizes). Every item must have the same number of batch dimensions, which the write checks.

Checkpoints (``dumps``) save each entry as one flat buffer of all the items' values plus per-item offsets and
shapes (:mod:`torchrl.data.replay_buffers.storages._ragged`): no pickle, one file per entry.
"""

from __future__ import annotations

from typing import Any

from tensordict import LazyStackedTensorDict, TensorDictBase, is_tensorclass, lazy_stack

import torchrl.data.replay_buffers.storages._ragged as _ragged
from torchrl._validation import check_int
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._codec import DataCodec
from torchrl.data.replay_buffers.storages._index import as_index_tensor, is_int
from torchrl.data.replay_buffers.storages.list_storage import ListStorage, _split_batch

__all__ = ["LazyStackStorage"]

_KINDS = ("tensordict", "tensorclass")


def _batch_ndim(item) -> int:
    return len(item.batch_size)


class LazyStackStorage(ListStorage):
    """A :class:`~torchrl.data.ListStorage` of TensorDicts whose reads are lazy stacks.

    ``get`` of an int returns the item as written; ``get`` of a slice or of an index (a tensor, a list, an
    ndarray) returns the items as a :class:`~tensordict.LazyStackedTensorDict` stacked along ``stack_dim``, so
    items whose entries have different shapes are read together without padding. A replay buffer over this
    storage returns that lazy stack unchanged (its default collate function passes a batch through). Read a
    ragged entry of the stack with ``batch.get(key, as_list=True)``, ``as_nested_tensor=True`` or
    ``as_padded_tensor=True``; entries of one shape stack densely (``batch[key]``).

    Args:
        max_size (int, optional): the capacity. ``None`` means unbounded. Defaults to ``None``.

    Keyword Args:
        compilable (bool): accepted for TorchRL compatibility (see :class:`~torchrl.data.Storage`). Defaults
            to ``False``.
        stack_dim (int): the dimension of the lazy stack along which the items lie. A negative value counts
            from the end of the stack's batch dims (``-1`` with items of batch size ``[T]`` gives a stack of
            batch size ``[T, n]``). Defaults to ``0``.
        device (torch.device or str, optional): if given, items are moved there when written.

    Raises:
        TypeError: on a write of an item that is not a TensorDict or a tensorclass (wrap a tensor:
            ``TensorDict(x=t)``, or use :class:`~torchrl.data.ListStorage`).
        ValueError: on a write of an item whose number of batch dims differs from the stored items', or that
            ``stack_dim`` does not fit. Nothing is written.

    .. note:: As with :class:`~torchrl.data.ListStorage`, the items live in one process's memory: DataLoader
        workers (``storage.as_dataset()``, ``rb.as_dataset()``) see a snapshot taken when they start under the
        ``fork`` start method, and sending the storage to a ``spawn``/``forkserver`` worker is refused.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyStackStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyStackStorage(10), batch_size=3)
        >>> rb.extend([TensorDict(tokens=torch.arange(n)) for n in (2, 5, 3)])
        tensor([0, 1, 2])
        >>> batch = rb.storage.get([0, 1, 2])
        >>> type(batch).__name__, batch.batch_size
        ('LazyStackedTensorDict', torch.Size([3]))
        >>> [t.tolist() for t in batch.get("tokens", as_list=True)]
        [[0, 1], [0, 1, 2, 3, 4], [0, 1, 2]]
    """

    def __init__(
        self, max_size: int | None = None, *, compilable: bool = False, stack_dim: int = 0, device=None
    ):
        super().__init__(max_size, compilable=compilable, device=device)
        self.stack_dim = check_int("stack_dim", stack_dim)

    # -- writes ----------------------------------------------------------------------------------------------
    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Writes one TensorDict at an int ``cursor`` (at most ``len(self)``), or a batch at a list of positions.

        A batch is a list of TensorDicts (of any shapes), a TensorDict or a lazy stack (split along dim 0).
        """
        if is_int(cursor):
            self._check_items([data], {int(cursor)})
        else:
            if isinstance(cursor, slice):
                cursor = range(*cursor.indices(len(self._storage)))
            cursor = as_index_tensor(cursor).tolist()
            if isinstance(data, (TensorDictBase, list, tuple)) or is_tensorclass(data):
                data = _split_batch(list(data) if isinstance(data, tuple) else data, len(cursor))
            self._check_items(data if isinstance(data, list) else [data], set(cursor))
        super().set(cursor, data, set_cursor=set_cursor)

    def _reference_ndim(self, overwritten: set[int]) -> int | None:
        """The batch ndim of a stored item that the write does not replace (``None``: no such item)."""
        for pos in range(len(self._storage)):
            if pos not in overwritten:
                return _batch_ndim(self._storage[pos])
        return None

    def _check_items(self, items: list, overwritten: set[int]) -> None:
        ndim = self._reference_ndim(overwritten)
        for i, item in enumerate(items):
            if not (isinstance(item, TensorDictBase) or is_tensorclass(item)):
                raise TypeError(
                    f"A LazyStackStorage holds TensorDicts or tensorclasses (lazily stacked on read); item {i} "
                    f"of the write is a {type(item).__name__}. Wrap it, e.g. TensorDict(x=tensor), or use "
                    f"ListStorage for other objects. Nothing was written."
                )
            ndim = _batch_ndim(item) if ndim is None else ndim
            if _batch_ndim(item) != ndim:
                raise ValueError(
                    f"Item {i} of the write has batch_size {list(item.batch_size)} ({_batch_ndim(item)} batch "
                    f"dims), while the storage holds items with {ndim} batch dims: a lazy stack needs the same "
                    f"number of batch dims in every item (their sizes may differ). Nothing was written."
                )
        if ndim is not None and not -(ndim + 1) <= self.stack_dim <= ndim:
            raise ValueError(
                f"`stack_dim`={self.stack_dim} does not fit items with {ndim} batch dims: a lazy stack of them "
                f"has {ndim + 1} dims, so pass a stack_dim in [{-(ndim + 1)}, {ndim}]. Nothing was written."
            )

    # -- reads -----------------------------------------------------------------------------------------------
    def _normalized_stack_dim(self, items: list) -> int:
        return self.stack_dim if self.stack_dim >= 0 else self.stack_dim + _batch_ndim(items[0]) + 1

    def get(self, index):
        """One item for an int; a :class:`~tensordict.LazyStackedTensorDict` of the items for a slice or an
        index (an empty lazy stack for an empty index).

        The stack holds a shallow copy of each item (its own keys, the stored tensors): entries set on a sample
        (a buffer's ``"index"``, a transform's output) never reach the stored items, and an item drawn twice is
        two members.
        """
        out = super().get(index)
        if not isinstance(out, list):
            return out
        if not out:
            return LazyStackedTensorDict(stack_dim=0)
        return lazy_stack([item.copy() for item in out], self._normalized_stack_dim(out))

    # -- state -----------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        items = state_dict.get("_storage") if isinstance(state_dict, dict) else None
        if isinstance(items, list):
            previous, self._storage = self._storage, []
            try:
                self._check_items(items, set())
            finally:
                self._storage = previous
        super().load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)}, stack_dim={self.stack_dim})"

    # -- checkpoint part (the protocol of torchrl.data.replay_buffers._checkpoint.parts) --------------------------
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        records = [_record(i, item) for i, item in enumerate(self._storage)]
        tensors, groups = _ragged.ragged_groups(records, ctx, "values")
        doc = {"class": qualname(self), "max_size": self.max_size, "count": len(records), "layout": "ragged",
               "groups": groups}
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        check_class(self, doc, "storage")
        if doc.get("max_size") != self.max_size:
            raise mismatch("the storage max_size", doc.get("max_size"), self.max_size, "Use the same max_size.")
        where = f"The LazyStackStorage description in the checkpoint {ctx.path!r}"
        count = check_int_field(doc.get("count"), "count", where, 0, self.max_size, fix="It counts the items.")
        if doc.get("layout") != "ragged":
            raise CheckpointError(f"{where}: `layout` is {doc.get('layout')!r}, expected 'ragged'. Nothing was loaded.")
        _ragged.check_ragged_groups(doc.get("groups"), tensors, count, where, "values", _KINDS)
        ndims = {group["batch_ndim"] for group in doc["groups"]}
        if len(ndims) > 1:
            raise CheckpointError(f"{where}: the items have different batch ndims {sorted(ndims)}. Nothing was loaded.")
        for ndim in ndims:
            if not -(ndim + 1) <= self.stack_dim <= ndim:
                raise mismatch(
                    "the batch ndim of the items", ndim, f"stack_dim={self.stack_dim}",
                    f"Build the storage with a stack_dim in [{-(ndim + 1)}, {ndim}].",
                )
        ctx.facts["storage_rows"] = self.max_size

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        records = _ragged.ragged_records(doc["groups"], tensors, doc["count"])
        items = [_ragged.build_item(r, lambda leaf: leaf.payload.view(leaf.shape)) for r in records]
        self.load_state_dict({"_storage": items})


def _record(position: int, item) -> _ragged.Record:
    """The checkpoint record of a stored item: its values flattened, per leaf."""
    codec = DataCodec.for_data(item)
    td = _ragged.item_td(codec, item)
    leaves = []
    for key, value in _ragged.td_leaves(td):
        if _ragged.is_json_leaf(value):
            leaves.append(_ragged.Leaf(key, None, None, _ragged.non_tensor_value(value, key, f"item {position}")))
        else:
            leaves.append(_ragged.Leaf(key, value.dtype, tuple(value.shape), value.detach().reshape(-1)))
    return _ragged.Record(codec, tuple(item.batch_size), leaves)
