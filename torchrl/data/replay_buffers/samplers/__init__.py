"""Samplers: how a replay buffer picks the indices of a batch."""

from torchrl.data.replay_buffers.samplers.base import Sampler
from torchrl.data.replay_buffers.samplers.random import RandomSampler, SamplerWithoutReplacement

__all__ = ["Sampler", "RandomSampler", "SamplerWithoutReplacement"]

for _cls in (Sampler, RandomSampler, SamplerWithoutReplacement):
    _cls.__module__ = __name__
