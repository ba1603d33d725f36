"""DensifyReward: reward-to-go over trajectory segments."""

from __future__ import annotations

__all__: list[str] = []
