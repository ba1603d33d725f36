"""A replay buffer of TensorDicts that writes sampling info into the batch: :class:`TensorDictReplayBuffer`."""

from __future__ import annotations

import warnings
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
from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter, TensorDictRoundRobinWriter, Writer
from torchrl.data.replay_buffers.writers.max_value import MAX_VALUE_WRITER_DATA


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


def _rows_of(value) -> int | None:
    """The leading size of an info value (a tensor, or the tuple of a multi-dim index); ``None`` if it has none."""
    if isinstance(value, tuple):
        value = value[0] if value else None
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else None


def _aligned_info(info: Mapping, data: TensorDictBase) -> Mapping:
    """The entries of ``info`` that can be written into the sampled batch ``data``.

    All of them, unless a forward transform dropped rows (e.g. :class:`~torchrl.envs.transforms.PolicyAgeFilter`):
    when ``data``'s first dim no longer matches the number of drawn rows (the leading size of ``info["index"]``),
    the entries with one value per drawn row can no longer be matched to the rows kept, and are left out. The
    ``"index"`` a :class:`~torchrl.data.TensorDictRoundRobinWriter` stores with each row travels with it anyway.
    """
    drawn = _rows_of(info.get("index"))
    if drawn is None or data.batch_dims == 0 or data.batch_size[0] == drawn:
        return info
    return {key: value for key, value in info.items() if _rows_of(value) != drawn}


def _write_info(data: TensorDictBase, info: Mapping) -> TensorDictBase:
    """``set_entries(data, _aligned_info(info, data), _info_value)``, with a direct path for the common case: an
    unlocked 1-D batch and info tensors of its shape and device, which those functions would write unchanged."""
    batch = data.batch_size
    if len(batch) == 1 and not data.is_locked:
        device = data.device
        for value in info.values():
            if (
                type(value) is not torch.Tensor
                or value.shape != batch
                or (device is not None and value.device != device)
            ):
                break
        else:
            for key, value in info.items():
                data.set(key, value)
            return data
    return set_entries(data, _aligned_info(info, data), _info_value)


class TensorDictReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` of TensorDicts.

    Differences from :class:`ReplayBuffer`: the default writer is :class:`TensorDictRoundRobinWriter` (each
    written TensorDict gets its ``"index"``), sampled batches carry the sampler's info (``"index"``, and
    ``"priority_weight"`` or slice flags from other samplers), and writes read priorities from
    ``priority_key`` when the sampler is prioritized.

    .. note:: A forward transform that drops rows of the sampled batch (e.g.
        :class:`~torchrl.envs.transforms.PolicyAgeFilter`) leaves the info entries with one value per drawn row
        out of that batch, since they no longer match its rows; the ``"index"`` the default writer stores with
        each row stays, and ``sample(return_info=True)`` still returns the whole info.

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
            writer = getattr(self, "_writer", None)
            if isinstance(writer, TensorDictMaxValueWriter) and method in ("add", "extend"):  # TorchRL's phrase
                raise MAX_VALUE_WRITER_DATA.error(cls=type(writer).__name__, got=type(data).__name__)
            raise TypeError(
                f"{type(self).__name__}.{method}() takes a TensorDict, got {type(data).__name__}. Wrap the data in a "
                f"TensorDict, or use ReplayBuffer for tensors, tensorclasses and pytrees."
            )

    def add(self, data, *, timeout: float | None = None):
        """Writes one TensorDict and returns its index.

        With a prioritized sampler, the item's priority is read from ``data[priority_key]`` when present and
        checked before anything is written: a NaN, infinite or negative priority raises a ``ValueError`` that
        names the entry, and leaves the buffer unchanged. ``timeout``: see :meth:`extend`.
        """
        self._ready()
        self._check_td(data, "add")
        priority = self._priorities_of(data, batched=False)
        return self._write_item(data, priority, timeout)  # the item and its priority land together

    def extend(
        self, tensordicts, *, update_priority: bool | None = None, timeout: float | None = None
    ) -> torch.Tensor:
        """Writes a batch of TensorDicts and returns the written indices.

        With a prioritized sampler, the priorities of the new items are read from
        ``tensordicts[priority_key]`` when present (reduced per item with the sampler's ``reduction``) and
        checked before anything is written: a NaN, infinite or negative priority raises a ``ValueError`` that
        names the entry, and nothing is written (length, content, writer cursor and priorities unchanged).

        Keyword Args:
            update_priority (bool, optional): ``False`` ignores the ``priority_key`` entry (the new items get
                the sampler's default priority). Defaults to ``None`` (read it when present).
            timeout (float, optional): with a ``rate_limiter`` that blocks inserts, how long to wait for its
                permission (see :meth:`ReplayBuffer.extend <torchrl.data.ReplayBuffer.extend>`). Defaults to
                ``None`` (as long as it takes).
        """
        if not self._initialized:
            self._ready()
        self._check_td(tensordicts, "extend")
        read = update_priority is not False
        # bad values are refused before any transform runs
        priority = self._priorities_of(tensordicts, batched=True) if read else None
        batch = self._as_stored_batch(tensordicts)
        if batch is None:  # the transforms dropped the whole batch
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        if read and batch is not tensordicts:  # the priorities of what is written: the inverse transforms may
            priority = self._priorities_of(batch, batched=True, stored=True)  # hold rows back or drop them
        return self._write_batch(batch, priority, timeout)  # items and priorities land together, under the lock

    def _priorities_of(self, data: TensorDictBase, *, batched: bool, stored: bool = False) -> np.ndarray | None:
        """The checked priorities of the items of ``data`` (from ``data[priority_key]``), before a write.

        ``None`` when the sampler is not prioritized or the entry is absent. ``stored``: ``data`` is the batch as
        it is written (through the inverse transforms, its extend dim already first).
        """
        if not isinstance(self._sampler, PrioritizedSampler):
            return None
        key = self.priority_key
        priority = data.get(key, None)
        if priority is None:
            return None
        priority = torch.as_tensor(priority)
        if batched and self._dim_extend > 0 and not stored:
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
        """Reads ``data["index"]`` and ``data[priority_key]`` and updates the sampler's priorities.

        Priorities with trailing dims are reduced per item with the sampler's ``reduction``; without a
        ``priority_key`` entry the items get the sampler's default priority. Does nothing when the sampler is
        not prioritized.

        With a sample unit such as :class:`~torchrl.data.Sequence`, only the windows' anchors are updated (read
        from ``data["anchor_index"]``): each anchor gets the max priority over its valid records (those of
        ``data["validity_mask"]``), the records of several windows on one anchor reduced together (see
        :meth:`Sequence.anchor_priorities`). On an ``ndim=2`` storage the anchor ``(t, env)`` is the item
        ``t * n_envs + env``.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, Sequence, TensorDictPrioritizedReplayBuffer
            >>> rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(10),
            ...     sample_unit=Sequence(4), batch_size=2)
            >>> done = torch.zeros(10, 1, dtype=torch.bool)
            >>> done[8] = True
            >>> _ = rb.extend(TensorDict({"obs": torch.arange(10), ("next", "done"): done}, batch_size=[10]))
            >>> batch = TensorDict(anchor_index=torch.tensor([7] * 8),  # two windows on anchor 7
            ...     validity_mask=torch.tensor([True, True, False, False] * 2),
            ...     td_error=torch.tensor([1.0, 2.0, 30.0, 40.0, 3.0, 4.0, 50.0, 60.0]), batch_size=[8])
            >>> rb.update_tensordict_priority(batch)  # anchor 7 gets 4.0, the max of its valid records
            >>> [round(float(rb.sampler._sum_tree[i]), 4) for i in (6, 7)]
            [1.0, 4.0]
        """
        self._check_td(data, "update_tensordict_priority")
        self._ready()
        if not isinstance(self._sampler, PrioritizedSampler):
            return
        unit = self._sample_unit
        if unit is not None:  # e.g. Sequence windows: one priority per drawn anchor
            priority = data.get(self.priority_key, None)
            if priority is None:
                priority = torch.full(data.batch_size, self._sampler.default_priority)
            else:
                priority = reduce_priority(priority, self._sampler.reduction, batch_dims=max(data.batch_dims, 1))
            anchor, priority = unit.anchor_priorities(data, priority)
            self.update_priority(anchor, priority)
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

    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        include_info: bool | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
        cancel_event=None,
    ):
        """Draws a batch of TensorDicts that carries the sampler's info (``"index"``, and e.g.
        ``"priority_weight"``) as entries, each expanded to the batch's shape (``[B, T]`` for trajectory items).

        Args:
            batch_size (int, optional): the number of items. Defaults to the buffer's ``batch_size``.
            return_info (bool): also return the info dict: ``(batch, info)``. Defaults to ``False``.
            include_info (bool, optional): deprecated (as in TorchRL; warns with a ``UserWarning`` when given):
                ``False`` leaves the info entries out of the batch (entries the storage holds, such as the
                writer's ``"index"``, stay); ``True`` and ``None`` write them. Defaults to ``None``.

        Keyword Args:
            wait, timeout, cancel_event: wait for data (or a rate limiter's permission); see
                :meth:`ReplayBuffer.sample <torchrl.data.ReplayBuffer.sample>`.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
            >>> rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(10), batch_size=4)
            >>> _ = rb.extend(TensorDict(obs=torch.randn(10, 3), batch_size=[10]))
            >>> "priority_weight" in rb.sample().keys()
            True
            >>> import warnings
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore")
            ...     "priority_weight" in rb.sample(include_info=False).keys()
            False
        """
        if include_info is not None:
            warnings.warn(
                f"`include_info` is deprecated (as in TorchRL), got include_info={include_info!r}: sampled "
                f"TensorDicts carry the sampler's info entries. Leave the argument out, and use "
                f"sample(return_info=True) to read the info beside the batch.",
                UserWarning,
                stacklevel=2,
            )
        data, info = super().sample(
            batch_size, return_info=True, wait=wait, timeout=timeout, cancel_event=cancel_event
        )
        if include_info is not False and isinstance(data, TensorDictBase):
            _write_info(data, info)
        return (data, info) if return_info else data

    def sample_raw(self, batch_size: int | None = None, return_info: bool = False, *, wait: bool = False,
                   timeout: float | None = None, cancel_event=None):  # fmt: skip
        """:meth:`ReplayBuffer.sample_raw`, with the sampler's info written into the batch as :meth:`sample`
        writes it."""
        data, info = super().sample_raw(
            batch_size, return_info=True, wait=wait, timeout=timeout, cancel_event=cancel_event
        )
        if isinstance(data, TensorDictBase):
            _write_info(data, info)
        return (data, info) if return_info else data
