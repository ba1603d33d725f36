"""Transforms applied to replay-buffer samples (``forward``) and writes (``inv``)."""

from torchrl.envs.transforms import _observation, rb_transforms
from torchrl.envs.transforms._observation import *  # noqa: F401,F403
from torchrl.envs.transforms.device_cast import DeviceCastTransform
from torchrl.envs.transforms.rb_transforms import *  # noqa: F401,F403
from torchrl.envs.transforms.reward_to_go import Reward2GoTransform
from torchrl.envs.transforms.transforms import Compose, Resize, Transform

__all__ = [
    "Compose", "DeviceCastTransform", "Resize", "Reward2GoTransform", "Transform",
    *_observation.__all__, *rb_transforms.__all__,
]  # fmt: skip
