"""The dataset registry: load_dataset / register_dataset."""

from __future__ import annotations

__all__: list[str] = []
