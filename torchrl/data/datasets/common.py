"""BaseDatasetExperienceReplay: offline datasets as read-only replay buffers."""

from __future__ import annotations

__all__: list[str] = []
