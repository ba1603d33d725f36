"""The tensor storages, at TorchRL's module path ``storages.tensor``: :class:`TensorStorage` (preallocated
tensors, :mod:`.tensor_storage`), :class:`LazyTensorStorage` (allocated at the first write, :mod:`.lazy_tensor`) and
:class:`LazyMemmapStorage` (memory-mapped files, :mod:`.memmap`).

Each class has its own file; the lazy ones derive from :class:`TensorStorage`, so its file cannot import them back,
and this module gathers the family under the path TorchRL users import it from.
"""

from torchrl.data.replay_buffers.storages.lazy_tensor import LazyTensorStorage
from torchrl.data.replay_buffers.storages.memmap import LazyMemmapStorage
from torchrl.data.replay_buffers.storages.tensor_storage import TensorStorage

__all__ = ["TensorStorage", "LazyTensorStorage", "LazyMemmapStorage"]
