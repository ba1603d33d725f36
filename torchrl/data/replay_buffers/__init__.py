"""Replay buffers: storages, samplers, writers and the buffers that combine them."""

from torchrl.data.replay_buffers._cleanup import cleanup_stale_scratch_dirs
from torchrl.data.replay_buffers._collate import tensordict_collate
from torchrl.data.replay_buffers._shared import TornReadError
from torchrl.data.replay_buffers.checkpointers import (
    ListStorageCheckpointer,
    StorageCheckpointerBase,
    StorageEnsembleCheckpointer,
    TensorStorageCheckpointer,
)
from torchrl.data.replay_buffers.replay_buffers import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferEnsemble,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset
from torchrl.data.replay_buffers.replay_buffers.remote import RemoteTensorDictReplayBuffer
from torchrl.data.replay_buffers.sample_units import SampleUnit, Sequence, Transition
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
from torchrl.data.replay_buffers.storages.dataset import StorageDataset
from torchrl.data.replay_buffers.utils import (
    DEFAULT_DONE_KEYS,
    Flat2TED,
    H5Combine,
    H5Split,
    Nested2TED,
    TED2Flat,
    TED2Nested,
    find_start_stop_traj,
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
    # TorchRL drop-in names (sample units, TED layouts, rpc buffer)
    "RemoteTensorDictReplayBuffer",
    "SampleUnit",
    "Sequence",
    "Transition",
    "DEFAULT_DONE_KEYS",
    "find_start_stop_traj",
    "TED2Flat",
    "Flat2TED",
    "TED2Nested",
    "Nested2TED",
    "H5Split",
    "H5Combine",
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
    "StorageCheckpointerBase",
    "TensorStorageCheckpointer",
    "ListStorageCheckpointer",
    "StorageEnsembleCheckpointer",
    "StorageDataset",
    "ReplayBufferDataset",
]
