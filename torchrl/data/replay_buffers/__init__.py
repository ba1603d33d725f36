"""Replay buffers: storages, samplers, writers and the buffers that combine them."""

from torchrl.data.replay_buffers._collate import tensordict_collate
from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    RandomSampler,
    Sampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    Storage,
    TensorStorage,
)
from torchrl.data.replay_buffers.writers import (
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    Writer,
)

__all__ = [
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "Storage",
    "ListStorage",
    "TensorStorage",
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "Writer",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "ImmutableDatasetWriter",
    "tensordict_collate",
    "StorageDataset",
    "ReplayBufferDataset",
]

# The DataLoader adapters sit on top of buffers and storages: imported last.
from torchrl.data.replay_buffers.dataloader import ReplayBufferDataset, StorageDataset  # noqa: E402
