"""A replay buffer of TensorDicts that writes sampling info into the batch: :class:`TensorDictReplayBuffer`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.samplers.prioritized import (
    PrioritizedSampler,
    check_priorities,
    reduce_priority,
)
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter, Writer


def set_entries(data: TensorDictBase, entries: Mapping, convert: Callable) -> TensorDictBase:
    """Writes each ``key: value`` of ``entries`` (``None`` values skipped) into ``data`` as
    ``convert(value, data)``, even when ``data`` is locked (it is locked again afterwards); returns ``data``.

    How sampled batches get the sampler's info (``"index"``, ``"priority_weight"``, ...): here with
    :func:`_info_value`, and in :class:`~torchrl.data.ReplayBufferEnsemble`'s sub-batches.
    """
    locked = data.is_locked
    if locked:
        data.unlock_()
    try:
        for key, value in entries.items():
            if value is not None:
                data.set(key, convert(value, data))
    finally:
        if locked:
            data.lock_()
    return data


def _info_value(value, like: TensorDictBase):
    if isinstance(value, tuple):
        value = torch.stack([torch.as_tensor(v) for v in value], -1)
    value = torch.as_tensor(value, device=like.device)
    batch = like.batch_size
    if value.shape[: len(batch)] != batch and value.numel() == batch.numel():
        value = value.reshape(batch)
    if value.ndim < len(batch):  # one value per item of a batch of trajectories ([B, T]): one per step
        k = value.ndim
        value = value.reshape(value.shape + (1,) * (len(batch) - k))
        if value.shape[:k] == batch[:k]:
            value = value.expand(batch)  # as TorchRL's expand_as_right
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
    def _default_writer(compilable: bool = False) -> Writer:
        return TensorDictRoundRobinWriter(compilable=compilable)

    def _check_td(self, data, method: str) -> None:
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__}.{method}() takes a TensorDict, got {type(data).__name__}. Wrap the data in a "
                f"TensorDict, or use ReplayBuffer for tensors, tensorclasses and pytrees."
            )

    def add(self, data):
        """Writes one TensorDict and returns its index.

        With a prioritized sampler, the item's priority is read from ``data[priority_key]`` when present and
        checked before anything is written: a NaN, infinite or negative priority raises a ``ValueError`` that
        names the entry, and leaves the buffer unchanged.
        """
        self._check_td(data, "add")
        priority = self._priorities_of(data, batched=False)
        with self._replay_lock, self.write_lock:  # lock order of every write
            index = super().add(data)
            if index is not None and priority is not None:
                self.update_priority(index, priority)
        return index

    def extend(self, tensordicts, *, update_priority: bool | None = None) -> torch.Tensor:
        """Writes a batch of TensorDicts and returns the written indices.

        With a prioritized sampler, the priorities of the new items are read from
        ``tensordicts[priority_key]`` when present (reduced per item with the sampler's ``reduction``) and
        checked before anything is written: a NaN, infinite or negative priority raises a ``ValueError`` that
        names the entry, and nothing is written (length, content, writer cursor and priorities unchanged).

        Keyword Args:
            update_priority (bool, optional): ``False`` ignores the ``priority_key`` entry (the new items get
                the sampler's default priority). Defaults to ``None`` (read it when present).
        """
        self._check_td(tensordicts, "extend")
        priority = self._priorities_of(tensordicts, batched=True) if update_priority is not False else None
        batch = self._as_stored_batch(tensordicts)
        if batch is None:
            return torch.zeros((0,), dtype=torch.long)
        return self._write_batch(batch, priority)  # items and priorities land together, under the write lock

    def _priorities_of(self, data: TensorDictBase, *, batched: bool) -> np.ndarray | None:
        """The checked priorities of the items of ``data`` (from ``data[priority_key]``), before a write.

        ``None`` when the sampler is not prioritized or the entry is absent.
        """
        if not isinstance(self._sampler, PrioritizedSampler):
            return None
        key = self.priority_key
        priority = data.get(key, None)
        if priority is None:
            return None
        priority = torch.as_tensor(priority)
        if batched and self._dim_extend > 0:
            priority = priority.transpose(0, self._dim_extend)  # the extend dim first, as the data is written
        item_dims = self._storage.ndim if batched else self._storage.ndim - 1
        priority = reduce_priority(priority, self._sampler.reduction, batch_dims=item_dims)
        name = key if isinstance(key, str) else ".".join(key) if isinstance(key, tuple) else str(key)
        method = "extend" if batched else "add"
        return check_priorities(
            priority,
            name,
            fix=(
                f"the priorities of the new items are read from the data's {key!r} entry (this buffer's "
                f"`priority_key`). Store finite values >= 0 there (e.g. td_error.abs(), with NaN replaced), "
                f"or call {method}() without that entry"
                f"{', or with update_priority=False,' if batched else ''} to give the new items the default "
                f"priority. Nothing was written."
            ),
        )

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
        if self._storage.ndim == 1 and index.ndim > 1:  # expanded over the steps of trajectory items ([B, T])
            index = index.reshape(index.shape[0], -1)[:, 0]
        priority = data.get(self.priority_key, None)
        if priority is None:
            priority = torch.full(index.shape[:1], self._sampler.default_priority)
        else:
            batch_dims = index.ndim if self._storage.ndim == 1 else index.ndim - 1
            priority = reduce_priority(priority, self._sampler.reduction, batch_dims=batch_dims)
        self.update_priority(index, priority)

    def _sample(self, batch_size: int, transform: bool = True):
        data, info = super()._sample(batch_size, transform)
        if isinstance(data, TensorDictBase):
            set_entries(data, info, _info_value)
        return data, info
