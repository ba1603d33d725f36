"""Trajectory queries over a replay buffer (Trajectory, traj, TrajectoryPredicate, ...). TorchRL's module path."""

from __future__ import annotations

__all__: list[str] = []
