"""Hindsight experience replay (HERReplayBuffer, HindsightStrategy). TorchRL's module path."""

from __future__ import annotations

__all__: list[str] = []
