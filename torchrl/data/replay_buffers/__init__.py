"""Replay buffers: storages, samplers, writers and the buffers that combine them."""

from torchrl.data.replay_buffers._collate import tensordict_collate
from torchrl.data.replay_buffers.replay_buffers import (
    ReplayBuffer,
    ReplayBufferEnsemble,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import (
    RandomSampler,
    Sampler,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    Storage,
    StorageEnsemble,
    TensorStorage,
)
from torchrl.data.replay_buffers.writers import (
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
    Writer,
    WriterEnsemble,
)

__all__ = [
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "ReplayBufferEnsemble",
    "Storage",
    "ListStorage",
    "TensorStorage",
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "StorageEnsemble",
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "SamplerEnsemble",
    "Writer",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "ImmutableDatasetWriter",
    "TensorDictMaxValueWriter",
    "WriterEnsemble",
    "tensordict_collate",
    "StorageDataset",
    "ReplayBufferDataset",
]

# The DataLoader adapters sit on top of buffers and storages: imported last.
from torchrl.data.replay_buffers.dataloader import ReplayBufferDataset, StorageDataset  # noqa: E402
