"""Samplers: how a replay buffer picks the indices of a batch."""

from torchrl.data.replay_buffers.errors import EpochEnded
from torchrl.data.replay_buffers.samplers.base import Sampler
from torchrl.data.replay_buffers.samplers.consuming import ConsumingSampler
from torchrl.data.replay_buffers.samplers.ensemble import SamplerEnsemble
from torchrl.data.replay_buffers.samplers.geometric import GeometricTrajectoryWindowSampler
from torchrl.data.replay_buffers.samplers.group import GroupSampler
from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
from torchrl.data.replay_buffers.samplers.prompt_group import PromptGroupSampler
from torchrl.data.replay_buffers.samplers.random import RandomSampler
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.samplers.slice_without_replacement import SliceSamplerWithoutReplacement
from torchrl.data.replay_buffers.samplers.staleness import StalenessAwareSampler
from torchrl.data.replay_buffers.samplers.streaming_slice import StreamingSliceSampler
from torchrl.data.replay_buffers.samplers.tensor_segment_tree import (
    CudaMinSegmentTreeFp32,
    CudaMinSegmentTreeFp64,
    CudaSumSegmentTreeFp32,
    CudaSumSegmentTreeFp64,
    MinSegmentTreeFp32,
    MinSegmentTreeFp64,
    SumSegmentTreeFp32,
    SumSegmentTreeFp64,
)
from torchrl.data.replay_buffers.samplers.without_replacement import SamplerWithoutReplacement

__all__ = [
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
    "StreamingSliceSampler",
    "PromptGroupSampler",
    "GroupSampler",
    "GeometricTrajectoryWindowSampler",
    # TorchRL's segment-tree names (torch tensors here: any device)
    "SumSegmentTreeFp32",
    "SumSegmentTreeFp64",
    "MinSegmentTreeFp32",
    "MinSegmentTreeFp64",
    "CudaSumSegmentTreeFp32",
    "CudaSumSegmentTreeFp64",
    "CudaMinSegmentTreeFp32",
    "CudaMinSegmentTreeFp64",
]

for _cls in (
    Sampler,
    EpochEnded,
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    SamplerEnsemble,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    ConsumingSampler,
    StalenessAwareSampler,
    StreamingSliceSampler,
    PromptGroupSampler,
    GroupSampler,
    GeometricTrajectoryWindowSampler,
):
    _cls.__module__ = __name__
