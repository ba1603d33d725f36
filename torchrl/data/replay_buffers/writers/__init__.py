"""Writers: where a replay buffer puts new data."""

from torchrl.data.replay_buffers.writers.base import ImmutableDatasetWriter, Writer
from torchrl.data.replay_buffers.writers.ensemble import WriterEnsemble
from torchrl.data.replay_buffers.writers.group_writer import GroupWriter, reward_variance_above
from torchrl.data.replay_buffers.writers.max_value import TensorDictMaxValueWriter
from torchrl.data.replay_buffers.writers.round_robin import RoundRobinWriter, TensorDictRoundRobinWriter

__all__ = [
    "Writer",
    "ImmutableDatasetWriter",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "TensorDictMaxValueWriter",
    "WriterEnsemble",
    "GroupWriter",
    "reward_variance_above",
]

for _cls in (
    Writer,
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    TensorDictMaxValueWriter,
    WriterEnsemble,
    GroupWriter,
):
    _cls.__module__ = __name__
