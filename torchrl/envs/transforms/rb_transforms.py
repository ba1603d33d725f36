"""Replay-buffer transforms: MultiStepTransform, NextStateReconstructor, PolicyAgeFilter. TorchRL's module path.

Each class lives in its own module (``multi_step``, ``next_state``, ``policy_age``); this module is where TorchRL
users import them from, and the classes carry its name as their ``__module__``.

NOTE [deferred torchrl.data imports]: these modules import from ``torchrl.data`` (``MultiStep``, the TED key
names) inside the functions that use them, never at module level. ``torchrl.data``'s
replay buffers import ``torchrl.envs.transforms``; importing ``torchrl.envs`` first would otherwise start
``torchrl.data`` while ``torchrl.envs.transforms`` is half-initialized, and the buffers' ``from
torchrl.envs.transforms import Transform`` would fail.
"""

from __future__ import annotations

from torchrl.envs.transforms.multi_step import MultiStepTransform
from torchrl.envs.transforms.next_state import NextStateReconstructor
from torchrl.envs.transforms.policy_age import PolicyAgeFilter

__all__ = ["MultiStepTransform", "NextStateReconstructor", "PolicyAgeFilter"]

for _cls in (MultiStepTransform, NextStateReconstructor, PolicyAgeFilter):
    _cls.__module__ = __name__
