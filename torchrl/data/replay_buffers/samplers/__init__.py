"""Samplers: how a replay buffer picks the indices of a batch."""

from torchrl.data.replay_buffers.samplers.base import Sampler
from torchrl.data.replay_buffers.samplers.ensemble import SamplerEnsemble
from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
from torchrl.data.replay_buffers.samplers.random import RandomSampler, SamplerWithoutReplacement
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.samplers.slice_without_replacement import SliceSamplerWithoutReplacement

__all__ = [
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "SamplerEnsemble",
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
]

for _cls in (
    Sampler,
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    SamplerEnsemble,
    PrioritizedSampler,
    PrioritizedSliceSampler,
):
    _cls.__module__ = __name__
