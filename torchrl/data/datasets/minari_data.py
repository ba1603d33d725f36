"""MinariExperienceReplay over local Minari datasets (hdf5 and arrow)."""

from __future__ import annotations

__all__: list[str] = []
