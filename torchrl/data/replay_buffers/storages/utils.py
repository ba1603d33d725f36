"""TorchRL's private collate helpers at ``storages.utils``, mapped onto this package's storages.

TorchRL's buffers pick a default ``collate_fn`` from their storage with ``_get_default_collate``; code written
against TorchRL sometimes imports these helpers. Our buffers make the same choice in
:class:`~torchrl.data.ReplayBuffer` (``collate_fn``); this module gives the helpers' names and behaviour:

- ``_collate_id(x)``: ``x`` unchanged (storages whose reads are already a batch);
- ``_collate_list_tensordict(x)``: ``torch.stack(x, 0)``;
- ``_stack_anything(x)``: a list of samples stacked (TensorDicts densely, or lazily when ragged; tensors,
  mappings and tuples element-wise);
- ``_get_default_collate(storage)``: ``_collate_id`` for tensor storages and :class:`LazyStackStorage`,
  :func:`tensordict.lazy_stack` for :class:`CompressedListStorage`, ``_stack_anything`` for
  :class:`ListStorage` and :class:`StorageEnsemble`; ``NotImplementedError`` for any other storage.

Examples:
    >>> import torch
    >>> from torchrl.data import LazyTensorStorage, ListStorage
    >>> from torchrl.data.replay_buffers.storages.utils import _get_default_collate
    >>> _get_default_collate(LazyTensorStorage(4)).__name__, _get_default_collate(ListStorage(4)).__name__
    ('_collate_id', '_stack_anything')
    >>> _get_default_collate(ListStorage(4))([torch.zeros(2), torch.ones(2)])
    tensor([[0., 0.],
            [1., 1.]])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import lazy_stack

from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.data.replay_buffers.storages.compressed import CompressedListStorage
from torchrl.data.replay_buffers.storages.ensemble import StorageEnsemble
from torchrl.data.replay_buffers.storages.list_storage import ListStorage
from torchrl.data.replay_buffers.storages.stack import LazyStackStorage
from torchrl.data.replay_buffers.storages.tensor_storage import TensorStorage

__all__: list[str] = []  # private helpers only, as in TorchRL


def _collate_id(x: Any) -> Any:
    return x


def _collate_list_tensordict(x: Sequence) -> Any:
    return torch.stack(list(x), 0)


def _stack_anything(x: Sequence) -> Any:
    return stack_samples(list(x))


def _get_default_collate(storage: Storage, _is_tensordict: bool = False) -> Callable[[Any], Any]:
    # `_is_tensordict` is TorchRL's keyword; its choice does not depend on it either.
    if isinstance(storage, (TensorStorage, LazyStackStorage)):
        return _collate_id
    if isinstance(storage, CompressedListStorage):
        return lazy_stack
    if isinstance(storage, (ListStorage, StorageEnsemble)):
        return _stack_anything
    raise NotImplementedError(
        f"No default collate_fn for a storage of type {type(storage).__name__}: pass collate_fn=... to the "
        f"replay buffer (e.g. collate_fn=lambda x: x when the storage's get() already returns a batch)."
    )
