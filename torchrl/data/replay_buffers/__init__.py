"""Replay buffers: storages, samplers, writers and the buffers that combine them."""

from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler, SamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    Storage,
    TensorStorage,
)

__all__ = [
    "Storage",
    "ListStorage",
    "TensorStorage",
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
]
