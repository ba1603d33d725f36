"""Replay-buffer transforms: MultiStepTransform, NextStateReconstructor, PolicyAgeFilter. TorchRL's module path."""

from __future__ import annotations

__all__: list[str] = []
