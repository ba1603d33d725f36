"""Offline-to-online mixing (OfflineToOnlineReplayBuffer, prefill_replay_buffer). TorchRL's module path."""

from __future__ import annotations

__all__: list[str] = []
