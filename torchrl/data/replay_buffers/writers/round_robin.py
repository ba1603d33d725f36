"""The ring-buffer writers, at TorchRL's module path ``writers.round_robin``: :class:`RoundRobinWriter`
(:mod:`.round_robin_writer`) and its TensorDict form :class:`TensorDictRoundRobinWriter`, which also stores where
each item went (:mod:`.tensordict_round_robin`).

Each class has its own file; the TensorDict form derives from :class:`RoundRobinWriter`, so its file cannot
import it back, and this module gathers them under the path TorchRL users import them from.
"""

from torchrl.data.replay_buffers.writers.round_robin_writer import RoundRobinWriter
from torchrl.data.replay_buffers.writers.tensordict_round_robin import TensorDictRoundRobinWriter

__all__ = ["RoundRobinWriter", "TensorDictRoundRobinWriter"]
