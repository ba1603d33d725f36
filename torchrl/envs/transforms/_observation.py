"""CatFrames: frame stacks built from single stored frames. TorchRL's module path."""

from __future__ import annotations

__all__: list[str] = []
