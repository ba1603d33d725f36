"""Writers: where a replay buffer puts new data."""

from torchrl.data.replay_buffers.writers.base import Writer
from torchrl.data.replay_buffers.writers.ensemble import WriterEnsemble
from torchrl.data.replay_buffers.writers.immutable import ImmutableDatasetWriter
from torchrl.data.replay_buffers.writers.max_value import TensorDictMaxValueWriter
from torchrl.data.replay_buffers.writers.round_robin import RoundRobinWriter
from torchrl.data.replay_buffers.writers.tensordict_round_robin import TensorDictRoundRobinWriter

__all__ = [
    "Writer",
    "ImmutableDatasetWriter",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "TensorDictMaxValueWriter",
    "WriterEnsemble",
]

for _cls in (
    Writer,
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    TensorDictMaxValueWriter,
    WriterEnsemble,
):
    _cls.__module__ = __name__
