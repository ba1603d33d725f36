"""A storage backed by a Python list: :class:`ListStorage`.

Items are kept as written (tensors, TensorDicts, tensorclasses, pytrees, or any object), so items of
different shapes can live side by side. Reads of an index batch return a Python list; the buffer's default
collate stacks it. The list is process-local: a forked DataLoader worker sees a snapshot, which it can read but
not write (a write there would be lost to the process that forked it), and sending the storage to a spawned
process, or sharing a buffer over it (``shared=True``), is refused with TorchRL's error and what to use instead.
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDictBase, is_tensorclass

import torchrl.data.replay_buffers.storages._checkpoint as _ckpt
from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers.checkpointers import ListStorageCheckpointer
from torchrl.data.replay_buffers.errors import IndexRuntimeError
from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds, check_int, is_int
from torchrl.data.replay_buffers.storages.base import Storage

_UNBOUNDED = torch.iinfo(torch.int64).max

STORAGE_SPAWN_LIST = TorchRLPhrase(
    RuntimeError,
    "Cannot share a storage of type",
    "Cannot share a storage of type {cls} between processes. It lives in one process's memory and cannot be "
    "shared with a spawned process. Use LazyTensorStorage or LazyMemmapStorage (shared with workers), or use "
    "the 'fork' start method (workers then see a snapshot), or num_workers=0.",
)
STORAGE_SHARE_LIST = TorchRLPhrase(
    RuntimeError,
    "Cannot share a storage of type",
    "Cannot share a storage of type {cls} between processes (the buffer got shared=True or share()): it keeps "
    "its items in this process's memory, so the writes of other processes would go to their own copies and be "
    "lost. Nothing was shared. Use LazyTensorStorage or LazyMemmapStorage for a buffer written by several "
    "processes, or build the buffer with shared=False.",
)
STORAGE_FORKED_LIST = TorchRLPhrase(
    RuntimeError,
    "Cannot share a storage of type",
    "Cannot share a storage of type {cls} between processes: this process (pid {pid}) holds the copy of it made "
    "when process {parent} forked, and a write here would be lost to that process (the list lives in one "
    "process's memory). The copy can be read (a snapshot), not written. Write from process {parent}, or use "
    "LazyTensorStorage or LazyMemmapStorage with shared=True for a buffer written by several processes.",
)

# NOTE [list storages after a fork]: a forked child holds a copy of every list storage of its parent. Its reads
# see the snapshot (a forked DataLoader worker samples from it); its writes would change the copy only, so they
# are refused. The check costs nothing on the write path: in the child, the at-fork hook gives each copy an
# instance attribute `set` (which shadows the method) that raises; storages built in the child are untouched.
_LIVE_LIST_STORAGES: weakref.WeakSet = weakref.WeakSet()  # the list storages of this process
_PID = [os.getpid()]


def _refuse_forked_write(cls_name: str, parent: int, *args, **kwargs) -> None:
    raise STORAGE_FORKED_LIST.error(cls=cls_name, pid=os.getpid(), parent=parent)


def _after_fork_in_child() -> None:
    parent, _PID[0] = _PID[0], os.getpid()
    for storage in list(_LIVE_LIST_STORAGES):
        storage.__dict__["set"] = functools.partial(_refuse_forked_write, type(storage).__name__, parent)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _split_batch(data, n: int) -> list:
    """The ``n`` items of a batch (tensor, TensorDict, tensorclass, list or pytree of batched tensors)."""
    if isinstance(data, (list, range)):
        items = list(data)
    elif isinstance(data, (torch.Tensor, TensorDictBase)) or is_tensorclass(data):
        items = list(data.unbind(0))
    elif isinstance(data, (dict, tuple)):
        items = [pytree.tree_map(lambda t, i=i: t[i], data) for i in range(n)]
    else:
        raise TypeError(
            f"Cannot split {type(data).__name__} into items: extend a ListStorage with a list, a tensor, a "
            f"TensorDict, a tensorclass or a pytree of batched tensors."
        )
    if len(items) != n:
        raise ValueError(f"{n} positions were given for a batch of {len(items)} items.")
    return items


def _check_write_position(pos: int, size: int, max_size: int) -> None:
    """Refuses a write position that is neither an existing item nor the next free one, or is past the capacity
    (an ``IndexError`` that is also the ``RuntimeError`` TorchRL raises there)."""
    if pos < 0 or pos > size or pos >= max_size:
        beyond = f", beyond max_size={max_size}" if pos >= max_size else ""
        raise IndexRuntimeError(
            f"Cannot write at position {pos} of a list storage holding {size} items (capacity {max_size}"
            f"{beyond}): positions must be existing items or the next free one."
        )


class ListStorage(Storage):
    """A storage that keeps items in a Python list.

    Args:
        max_size (int, optional): the capacity. ``None`` means unbounded. Defaults to ``None``.

    Keyword Args:
        device (torch.device or str, optional): if given, tensors are moved there when written.
        compilable (bool): accepted for TorchRL compatibility (see :class:`~torchrl.data.Storage`).
            Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from torchrl.data import ListStorage
        >>> storage = ListStorage(10)
        >>> storage.set(0, torch.zeros(3))
        >>> storage.set([1, 2], [torch.ones(2), "any object"])
        >>> len(storage), storage.get(2)
        (3, 'any object')
    """

    _default_checkpointer = ListStorageCheckpointer

    def __init__(self, max_size: int | None = None, *, compilable: bool = False, device=None):
        super().__init__(_UNBOUNDED if max_size is None else max_size, compilable=compilable)
        self.device = None if device is None else torch.device(device)
        self._storage: list[Any] = []
        _LIVE_LIST_STORAGES.add(self)  # NOTE [list storages after a fork]

    def _to_device(self, item):
        if self.device is None:
            return item
        return (
            pytree.tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t, item)
            if not (isinstance(item, TensorDictBase) or is_tensorclass(item))
            else item.to(self.device)
        )

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Writes one item at an int ``cursor`` (at most ``len(self)``), or a batch at a list of positions."""
        if is_int(cursor):
            self._set_one(int(cursor), self._to_device(data), len(self._storage))
            return
        if isinstance(cursor, slice):
            cursor = range(*cursor.indices(len(self._storage)))
        positions = as_index_tensor(cursor).tolist()
        items = _split_batch(data, len(positions))
        # a ring-buffer write may wrap ([3, ..., 9, 0, 1, 2]): write in position order, the last item wins
        by_position = dict(zip(positions, items))
        size = len(self._storage)
        for pos in sorted(by_position):  # validate everything before the first write
            _check_write_position(pos, size, self.max_size)
            size = max(size, pos + 1)
        for pos in sorted(by_position):
            self._set_one(pos, self._to_device(by_position[pos]), len(self._storage))

    def _set_one(self, pos: int, item, size: int) -> None:
        _check_write_position(pos, size, self.max_size)
        if pos == size:
            self._storage.append(item)
        else:
            self._storage[pos] = item

    def get(self, index):
        """One item for an int, a list of items for a slice or an index."""
        n = len(self._storage)
        if isinstance(index, tuple):
            if len(index) != 1:
                raise IndexError(
                    f"A ListStorage is indexed along one dimension; got a tuple of {len(index)}."
                )
            index = index[0]
        if is_int(index):
            return self._storage[check_int(index, n)]
        if isinstance(index, slice):
            return self._storage[index]
        index = check_bounds(as_index_tensor(index), n)
        return [self._storage[i] for i in index.tolist()]

    def __len__(self) -> int:
        return len(self._storage)

    def _empty(self) -> None:
        self._storage = []

    def state_dict(self) -> dict[str, Any]:
        return {"_storage": list(self._storage)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        items = state_dict["_storage"]
        if not isinstance(items, list):
            raise TypeError(f"`state_dict['_storage']` must be a list, got {type(items).__name__}.")
        self._storage = [
            item.clone() if isinstance(item, (torch.Tensor, TensorDictBase)) or is_tensorclass(item) else item
            for item in items
        ]

    # -- checkpoint part (the protocol of torchrl.data.replay_buffers._checkpoint.parts) ------------------------------
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        return _ckpt.list_storage_part(self, list(self._storage), ctx)

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        _ckpt.check_list_storage_part(self, doc, tensors, ctx)

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self.load_state_dict({"_storage": _ckpt.list_storage_items(doc, tensors)})

    def check_shareable(self) -> None:
        """Raises TorchRL's ``RuntimeError``: the items live in this process's memory."""
        raise STORAGE_SHARE_LIST.error(cls=type(self).__name__)

    def __getstate__(self):
        if is_spawning():
            raise STORAGE_SPAWN_LIST.error(cls=type(self).__name__)
        state = super().__getstate__()
        state.pop("set", None)  # a copy by value is writable: NOTE [list storages after a fork]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        _LIVE_LIST_STORAGES.add(self)
