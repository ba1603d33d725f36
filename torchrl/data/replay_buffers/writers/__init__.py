"""Writers: where a replay buffer puts new data."""

from torchrl.data.replay_buffers.writers.base import ImmutableDatasetWriter, Writer
from torchrl.data.replay_buffers.writers.round_robin import RoundRobinWriter, TensorDictRoundRobinWriter

__all__ = ["Writer", "ImmutableDatasetWriter", "RoundRobinWriter", "TensorDictRoundRobinWriter"]

for _cls in (Writer, ImmutableDatasetWriter, RoundRobinWriter, TensorDictRoundRobinWriter):
    _cls.__module__ = __name__
