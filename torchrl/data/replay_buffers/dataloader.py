"""Former home of the :mod:`torch.utils.data` adapters, kept so that imports of it keep working.

:class:`~torchrl.data.StorageDataset` now lives with the storages
(:mod:`torchrl.data.replay_buffers.storages.dataset`), :class:`~torchrl.data.ReplayBufferDataset` with the
buffers (:mod:`torchrl.data.replay_buffers.replay_buffers.dataset`) and :func:`~torchrl.data.tensordict_collate`
in :mod:`torchrl.data.replay_buffers._collate`; import them from :mod:`torchrl.data`.
"""

from __future__ import annotations

from torchrl.data.replay_buffers._collate import tensordict_collate
from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset
from torchrl.data.replay_buffers.storages.dataset import StorageDataset

__all__ = ["StorageDataset", "ReplayBufferDataset", "tensordict_collate"]
