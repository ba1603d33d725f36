"""Replay buffers: storages, samplers, writers and the buffers that combine them."""

from torchrl.data._torchrl_names import REPLAY_BUFFER_NAMES, not_provided_getattr
from torchrl.data.replay_buffers._shared.cleanup import cleanup_stale_scratch_dirs
from torchrl.data.replay_buffers.checkpointers import (
    ListStorageCheckpointer,
    StorageCheckpointerBase,
    StorageEnsembleCheckpointer,
    TensorStorageCheckpointer,
)
from torchrl.data.replay_buffers.checkpointers_ted import (
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    NestedStorageCheckpointer,
)
from torchrl.data.replay_buffers.errors import TornReadError
from torchrl.data.replay_buffers.loading.collate import tensordict_collate
from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer  # Ray itself is imported on use
from torchrl.data.replay_buffers.replay_buffers import (
    ConditionalUpdateResult,
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
    ConsumingSampler,
    EpochEnded,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    PromptGroupSampler,
    RandomSampler,
    Sampler,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StalenessAwareSampler,
    StreamingSliceSampler,
)
from torchrl.data.replay_buffers.scheduler import (
    LambdaScheduler,
    LinearScheduler,
    ParameterScheduler,
    SchedulerList,
    StepScheduler,
)
from torchrl.data.replay_buffers.storages import (
    CompressedListStorage,
    DatasetStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    Storage,
    StorageEnsemble,
    TensorStorage,
)
from torchrl.data.replay_buffers.storages.compressed import CompressedListStorageCheckpointer
from torchrl.data.replay_buffers.storages.storage_dataset import StorageDataset
from torchrl.data.replay_buffers.training_state import load_training_state, save_training_state
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
    "ConditionalUpdateResult",
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "Storage",
    "ListStorage",
    "TensorStorage",
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "StorageEnsemble",
    "Sampler",
    "EpochEnded",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "SamplerEnsemble",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "ConsumingSampler",
    "StalenessAwareSampler",
    "ParameterScheduler",
    "LambdaScheduler",
    "LinearScheduler",
    "StepScheduler",
    "SchedulerList",
    "StreamingSliceSampler",
    "PromptGroupSampler",
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
    "FlatStorageCheckpointer",
    "NestedStorageCheckpointer",
    "H5StorageCheckpointer",
    "LazyStackStorage",
    "CompressedListStorage",
    "CompressedListStorageCheckpointer",
    "StorageDataset",
    "save_training_state",
    "load_training_state",
    "DatasetStorage",
    "ReplayBufferDataset",
    "RayReplayBuffer",
]

# TorchRL's replay-buffer names that this package does not implement: importing one raises an ImportError that
# says so (see _torchrl_names); implemented names never reach this hook.
__getattr__ = not_provided_getattr(__name__, REPLAY_BUFFER_NAMES)
