"""Storages: where a replay buffer keeps its data."""

from torchrl.data.replay_buffers._shared.cleanup import cleanup_stale_scratch_dirs
from torchrl.data.replay_buffers._shared.lock import cleanup_stale_lock_files
from torchrl.data.replay_buffers.storages._registry import _MEMMAP_STORAGE_REGISTRY  # noqa: F401 (TorchRL path)
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.data.replay_buffers.storages.compressed import CompressedListStorage
from torchrl.data.replay_buffers.storages.dataset_storage import DatasetStorage
from torchrl.data.replay_buffers.storages.encoded_frames import EncodedFrameStorage
from torchrl.data.replay_buffers.storages.ensemble import StorageEnsemble
from torchrl.data.replay_buffers.storages.lazy_tensor import LazyTensorStorage
from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.memmap import LazyMemmapStorage
from torchrl.data.replay_buffers.storages.packed_sequence import PackedSequenceStorage
from torchrl.data.replay_buffers.storages.stack import LazyStackStorage
from torchrl.data.replay_buffers.storages.storage_dataset import StorageDataset
from torchrl.data.replay_buffers.storages.store import StoreStorage
from torchrl.data.replay_buffers.storages.tensor import TensorStorage

__all__ = ["Storage", "ListStorage", "TensorStorage", "LazyTensorStorage", "LazyMemmapStorage", "StorageEnsemble"]
__all__ += ["LazyStackStorage", "CompressedListStorage"]
__all__ += ["DatasetStorage"]
__all__ += ["StoreStorage"]  # rows on a Redis-compatible server
__all__ += ["PackedSequenceStorage"]  # variable-length sequences packed end to end (language-model rollouts)
__all__ += ["EncodedFrameStorage"]  # uint8 frames kept as video segments
__all__ += ["StorageDataset", "cleanup_stale_scratch_dirs", "cleanup_stale_lock_files"]  # a storage read as a Dataset; scratch clean-up

for _cls in (Storage, ListStorage, TensorStorage, LazyTensorStorage, LazyMemmapStorage, StorageEnsemble,
             LazyStackStorage, CompressedListStorage, DatasetStorage, EncodedFrameStorage,
             PackedSequenceStorage):
    _cls.__module__ = __name__

