"""torchrl: replay buffers for PyTorch reinforcement learning.

This distribution holds TorchRL's data module (``torchrl.data``) and the few pieces around it that its
examples need (``torchrl.envs.transforms``, ``torchrl.objectives.BCLoss``, ``torchrl.render``).
"""

from __future__ import annotations

__version__ = "0.16.0.dev0"
