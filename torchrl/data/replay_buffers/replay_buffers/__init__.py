"""Replay buffers: storage + writer + sampler + transforms behind one object."""

from torchrl.data.replay_buffers.replay_buffers import rate_limited, rate_limiters  # noqa: E402
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.blocking import BlockingReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.conditional_update import ConditionalUpdateResult
from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset
from torchrl.data.replay_buffers.replay_buffers.deprecated import InPlaceSampler, stack_tensors
from torchrl.data.replay_buffers.replay_buffers.ensemble import ReplayBufferEnsemble
from torchrl.data.replay_buffers.replay_buffers.prioritized import (
    PrioritizedReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
)
from torchrl.data.replay_buffers.replay_buffers.rate_limited import *  # noqa: F401,F403
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import *  # noqa: F401,F403
from torchrl.data.replay_buffers.replay_buffers.remote import RemoteTensorDictReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.tensordict import TensorDictReplayBuffer

__all__ = [
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "ReplayBufferEnsemble",
    "RemoteTensorDictReplayBuffer",
    "ConditionalUpdateResult",
    "ReplayBufferDataset",
    "InPlaceSampler",  # TorchRL keeps these two for old code (deprecated.py)
    "stack_tensors",
    "BlockingReplayBuffer",
    *rate_limited.__all__,
    *rate_limiters.__all__,
]

for _cls in (
    ReplayBuffer,
    TensorDictReplayBuffer,
    PrioritizedReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    ReplayBufferEnsemble,
    RemoteTensorDictReplayBuffer,
    ConditionalUpdateResult,
):
    _cls.__module__ = __name__
