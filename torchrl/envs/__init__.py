"""torchrl.envs: only the transforms used on the replay-buffer sample path live here.

As in TorchRL, ``MultiStepTransform``, ``CatFrames``, ``DeviceCastTransform`` and ``Reward2GoTransform`` are
re-exported here; ``NextStateReconstructor`` and ``PolicyAgeFilter`` are importable from
:mod:`torchrl.envs.transforms` only.
"""

from torchrl.envs import transforms
from torchrl.envs.transforms import Compose, Transform

_REEXPORTED = ("MultiStepTransform", "CatFrames", "DeviceCastTransform", "Reward2GoTransform")
globals().update({name: getattr(transforms, name) for name in _REEXPORTED if hasattr(transforms, name)})

__all__ = ["Compose", "Transform", *(name for name in _REEXPORTED if name in globals())]
