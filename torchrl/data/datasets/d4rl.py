"""D4RLExperienceReplay over local D4RL-layout HDF5 files."""

from __future__ import annotations

__all__: list[str] = []
