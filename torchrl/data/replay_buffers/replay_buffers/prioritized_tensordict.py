"""TorchRL's module path of :class:`TensorDictPrioritizedReplayBuffer`.

The class lives in :mod:`.prioritized`, beside :class:`PrioritizedReplayBuffer`: both build their
:class:`~torchrl.data.PrioritizedSampler` and storage the same way.
"""

from torchrl.data.replay_buffers.replay_buffers.prioritized import TensorDictPrioritizedReplayBuffer

__all__ = ["TensorDictPrioritizedReplayBuffer"]
