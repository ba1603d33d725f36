"""Post-processing of collected batches before they are written to a replay buffer."""

from torchrl.data.postprocs import densify
from torchrl.data.postprocs.densify import *  # noqa: F401,F403
from torchrl.data.postprocs.postprocs import MultiStep

__all__ = ["MultiStep", *densify.__all__]

MultiStep.__module__ = __name__
