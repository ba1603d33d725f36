"""Replay buffers: storages, samplers, writers and the buffers that combine them."""

from torchrl.data.replay_buffers._cleanup import cleanup_stale_scratch_dirs
from torchrl.data.replay_buffers._collate import tensordict_collate
from torchrl.data.replay_buffers._shared import TornReadError
from torchrl.data.replay_buffers.replay_buffers import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferEnsemble,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
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
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
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
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "Writer",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "ImmutableDatasetWriter",
    "TensorDictMaxValueWriter",
    "WriterEnsemble",
    "tensordict_collate",
    "cleanup_stale_scratch_dirs",
    "TornReadError",
    "StorageDataset",
    "ReplayBufferDataset",
]

# The DataLoader adapters sit on top of buffers and storages: imported last.
from torchrl.data.replay_buffers.dataloader import ReplayBufferDataset, StorageDataset  # noqa: E402
