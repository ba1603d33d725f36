"""A replay buffer of TensorDicts that writes sampling info into the batch: :class:`TensorDictReplayBuffer`."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.samplers.prioritized import PrioritizedSampler, reduce_priority
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter, Writer


def _info_value(value, like: TensorDictBase):
    if isinstance(value, tuple):
        value = torch.stack([torch.as_tensor(v) for v in value], -1)
    value = torch.as_tensor(value, device=like.device)
    batch = like.batch_size
    if value.shape[: len(batch)] != batch and value.numel() == batch.numel():
        value = value.reshape(batch)
    while value.ndim < len(batch):
        value = value.unsqueeze(-1)
    return value


class TensorDictReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` of TensorDicts.

    Differences from :class:`ReplayBuffer`: the default writer is :class:`TensorDictRoundRobinWriter` (each
    written TensorDict gets its ``"index"``), sampled batches carry the sampler's info (``"index"``, and
    ``"priority_weight"`` or slice flags from other samplers), and writes read priorities from
    ``priority_key`` when the sampler is prioritized.

    Keyword Args:
        priority_key (NestedKey): the entry holding priorities (e.g. TD errors). Defaults to ``"td_error"``.
        **kwargs: the arguments of :class:`ReplayBuffer`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(TensorDict(obs=torch.randn(20, 3), batch_size=[20]))
        >>> batch = rb.sample()
        >>> batch["obs"].shape, batch["index"].shape
        (torch.Size([8, 3]), torch.Size([8]))
    """

    def __init__(self, *, priority_key="td_error", **kwargs) -> None:
        self.priority_key = priority_key
        super().__init__(**kwargs)

    @staticmethod
    def _default_writer() -> Writer:
        return TensorDictRoundRobinWriter()

    def _check_td(self, data, method: str) -> None:
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__}.{method}() takes a TensorDict, got {type(data).__name__}. Wrap the data in a "
                f"TensorDict, or use ReplayBuffer for tensors, tensorclasses and pytrees."
            )

    def add(self, data):
        self._check_td(data, "add")
        index = super().add(data)
        if index is not None:
            self._update_priority_from(data, index, batched=False)
        return index

    def extend(self, tensordicts, *, update_priority: bool | None = None) -> torch.Tensor:
        self._check_td(tensordicts, "extend")
        index = super().extend(tensordicts)
        if update_priority is not False:
            self._update_priority_from(tensordicts, index, batched=True)
        return index

    def _update_priority_from(self, data: TensorDictBase, index, *, batched: bool) -> None:
        """Sets the priorities of freshly written items from ``data[priority_key]``, when present."""
        if not isinstance(self._sampler, PrioritizedSampler):
            return
        priority = data.get(self.priority_key, None)
        if priority is None:
            return
        priority = torch.as_tensor(priority)
        if batched and self._dim_extend > 0:
            priority = priority.transpose(0, self._dim_extend)  # the extend dim first, as the data was written
        item_dims = self._storage.ndim if batched else self._storage.ndim - 1
        priority = reduce_priority(priority, self._sampler.reduction, batch_dims=item_dims)
        self.update_priority(index, priority.reshape(-1))

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Reads ``data["index"]`` and ``data[priority_key]`` and updates the sampler's priorities."""
        self._check_td(data, "update_tensordict_priority")
        if not isinstance(self._sampler, PrioritizedSampler):
            return
        index = data.get("index", None)
        if index is None:
            raise KeyError(
                "update_tensordict_priority() needs the 'index' entry written by sample(); the data has none."
            )
        priority = data.get(self.priority_key, None)
        if priority is None:
            priority = torch.full(index.shape[:1], self._sampler.default_priority)
        else:
            batch_dims = index.ndim if self._storage.ndim == 1 else index.ndim - 1
            priority = reduce_priority(priority, self._sampler.reduction, batch_dims=batch_dims)
        self.update_priority(index, priority)

    def _sample(self, batch_size: int):
        data, info = super()._sample(batch_size)
        if isinstance(data, TensorDictBase):
            locked = data.is_locked
            if locked:
                data.unlock_()
            for key, value in info.items():
                if value is None:
                    continue
                data.set(key, _info_value(value, data))
            if locked:
                data.lock_()
        return data, info
