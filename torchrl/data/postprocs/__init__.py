"""Post-processing of collected batches before they are written to a replay buffer."""

from torchrl.data.postprocs.postprocs import MultiStep

__all__ = ["MultiStep"]

MultiStep.__module__ = __name__
