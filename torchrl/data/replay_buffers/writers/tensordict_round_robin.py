"""The ring-buffer writer of TensorDict buffers: :class:`TensorDictRoundRobinWriter`, which also stores where each
item went."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from torchrl.data.replay_buffers.writers.round_robin_writer import RoundRobinWriter


class TensorDictRoundRobinWriter(RoundRobinWriter):
    """A :class:`RoundRobinWriter` that also stores each item's position in its ``"index"`` entry.

    The ``"index"`` entry is set on the written TensorDict in place, so the caller sees where each item went.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictRoundRobinWriter
        >>> writer = TensorDictRoundRobinWriter()
        >>> writer.register_storage(LazyTensorStorage(10))
        >>> td = TensorDict(obs=torch.zeros(3, 2), batch_size=[3])
        >>> _ = writer.extend(td)
        >>> td["index"]
        tensor([0, 1, 2])
    """

    def _prepare(self, data, index):
        if isinstance(data, TensorDictBase):
            if index is None:  # before the write lock: a placeholder that _place fills in
                data.set("index", torch.zeros(data.batch_size, dtype=torch.long, device=data.device))
                return data
            data.set("index", self._index_entry(data, index))
        return data

    def _place(self, data, index) -> None:
        if isinstance(data, TensorDictBase):
            data.get("index").copy_(self._index_entry(data, index))

    @staticmethod
    def _index_entry(data: TensorDictBase, index) -> torch.Tensor:
        index = torch.as_tensor(index, dtype=torch.long, device=data.device)
        if data.batch_dims > index.ndim:
            index = index.reshape(*index.shape, *([1] * (data.batch_dims - index.ndim)))
        return index.expand(data.batch_size).clone()
