"""The writer contract and the read-only writer, at TorchRL's module path ``writers.base``: :class:`Writer`
(:mod:`.writer`) and :class:`ImmutableDatasetWriter` (:mod:`.immutable`).

Each class has its own file; the read-only writer derives from :class:`Writer`, so its file cannot import it back,
and this module gathers them under the path TorchRL users import them from.
"""

from torchrl.data.replay_buffers.writers.immutable import ImmutableDatasetWriter
from torchrl.data.replay_buffers.writers.writer import Writer

__all__ = ["Writer", "ImmutableDatasetWriter"]
