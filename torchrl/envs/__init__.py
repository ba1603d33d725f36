"""torchrl.envs: only the transforms used on the replay-buffer sample path live here."""

from torchrl.envs.transforms import Compose, Transform

__all__ = ["Compose", "Transform"]
