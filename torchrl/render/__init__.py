"""torchrl.render: save a trained policy and play it back with the ``rlrender`` console script.

A policy checkpoint is a directory holding the weights (``weights.pt``, tensors only) and a JSON description
of the architecture (``policy.json``); see :mod:`torchrl.render.checkpoint`. ``rlrender CHECKPOINT`` plays it
in gymnasium and can write an animated GIF (:mod:`torchrl.render.cli`). gymnasium, pygame and Pillow are only
imported when a policy is played, so this package imports without them.
"""

from __future__ import annotations

from torchrl.render.checkpoint import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointFormatError,
    PolicyCheckpoint,
    load_policy_checkpoint,
    save_policy_checkpoint,
)
from torchrl.render.policy import ACTIVATIONS, MLPPolicy

__all__ = [
    "ACTIVATIONS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CheckpointFormatError",
    "MLPPolicy",
    "PolicyCheckpoint",
    "load_policy_checkpoint",
    "save_policy_checkpoint",
]
