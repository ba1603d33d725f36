"""Reverb-style rate limiters (MinSize, SampleToInsertRatio) for ``rate_limiter=``."""

from __future__ import annotations

__all__: list[str] = []
