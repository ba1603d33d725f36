"""Storages: where a replay buffer keeps its data."""

from torchrl.data.replay_buffers.storages._registry import _MEMMAP_STORAGE_REGISTRY  # noqa: F401 (TorchRL path)
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.data.replay_buffers.storages.ensemble import StorageEnsemble
from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.memmap import LazyMemmapStorage
from torchrl.data.replay_buffers.storages.tensor import LazyTensorStorage, TensorStorage

__all__ = ["Storage", "ListStorage", "TensorStorage", "LazyTensorStorage", "LazyMemmapStorage", "StorageEnsemble"]

for _cls in (Storage, ListStorage, TensorStorage, LazyTensorStorage, LazyMemmapStorage, StorageEnsemble):
    _cls.__module__ = __name__
