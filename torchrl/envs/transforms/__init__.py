"""Transforms applied to replay-buffer samples (``forward``) and writes (``inv``)."""

from torchrl.envs.transforms.transforms import Compose, Resize, Transform

__all__ = ["Compose", "Resize", "Transform"]
