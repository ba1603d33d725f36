"""LeRobotExperienceReplay over LeRobot v3.0 datasets."""

from __future__ import annotations

__all__: list[str] = []
