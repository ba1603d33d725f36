"""torchrl.objectives: training losses (for now :class:`BCLoss`, used by the behaviour cloning example)."""

from __future__ import annotations

from torchrl.objectives.bc import BCLoss

__all__ = ["BCLoss"]
