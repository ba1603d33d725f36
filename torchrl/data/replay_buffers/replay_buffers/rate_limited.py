"""RateLimitedReplayBuffer: a sample-to-insert budget over cumulative counters."""

from __future__ import annotations

__all__: list[str] = []
