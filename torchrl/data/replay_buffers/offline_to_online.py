"""Offline-to-online fine-tuning: batches that mix a fixed dataset with a growing online buffer. TorchRL's path.

Data model: an :class:`OfflineToOnlineReplayBuffer` composes two buffers, the offline one (a dataset or any
buffer, never written) and the online one (a plain :class:`~torchrl.data.ReplayBuffer` that ``extend`` fills),
through a two-member :class:`~torchrl.data.MixedReplayBuffer`. A batch of ``B`` rows holds exactly
``round(offline_fraction * B)`` offline rows (Python's ``round``, as TorchRL), first, then the online rows.
The general mixer of ``N`` buffers (:class:`~torchrl.data.MixedReplayBuffer`) lives in
``replay_buffers/replay_buffers/mixer.py`` and is re-exported here.
"""

from __future__ import annotations

import math
from typing import Any

from torch.utils.data import Dataset

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_int, check_positive_int, is_real
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers.mixer import (
    INDEX_KEY,
    O2O_SAMPLE_BATCH_SIZE,
    MixedReplayBuffer,
    largest_remainder_counts,
)
from torchrl.data.replay_buffers.storages.base import Storage
from torchrl.data.replay_buffers.storages.dataset_storage import DatasetStorage
from torchrl.data.replay_buffers.storages.lazy_tensor import LazyTensorStorage

O2O_BOTH_ONLINE = TorchRLPhrase(
    ValueError,
    "not both.",
    "Pass online_storage or online_capacity, not both. Got online_storage={storage} and "
    "online_capacity={capacity!r}: keep online_storage to use that storage, or online_capacity=N for a "
    "LazyTensorStorage(N).",
)
O2O_NO_ONLINE = TorchRLPhrase(
    ValueError,
    "Provide one of",
    "Provide one of online_storage (a Storage for the online data) or online_capacity (an int: a "
    "LazyTensorStorage of that size is built); got neither.",
)
O2O_STRING_BATCH_SIZE = TorchRLPhrase(
    ValueError,
    "batch_size must be provided when offline_dataset is a string",
    "batch_size must be provided when offline_dataset is a string (got offline_dataset={dataset!r}): the "
    "dataset is built by load_dataset(offline_dataset, batch_size=batch_size, **dataset_kwargs). Pass "
    "batch_size=N.",
)
O2O_DATASET_KWARGS = TorchRLPhrase(
    ValueError,
    "dataset_kwargs are only forwarded when offline_dataset is a string",
    "dataset_kwargs are only forwarded when offline_dataset is a string (a dataset id for load_dataset); got "
    "{kwargs} with a {cls}. Build that dataset with these arguments yourself, or pass its id string.",
)

__all__ = [
    "OfflineToOnlineReplayBuffer",
    "prefill_replay_buffer",
    "MixedReplayBuffer",
    "largest_remainder_counts",
]


def _load_dataset(dataset_id: str, **kwargs):
    from torchrl.data.datasets.utils import load_dataset  # the datasets package sits above this one

    return load_dataset(dataset_id, **kwargs)


def _check_fraction(value) -> float:
    if not is_real(value):
        raise TypeError(
            f"`offline_fraction` must be a number strictly between 0 and 1, got {value!r} ({type(value).__name__})."
        )
    value = float(value)
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise ValueError(
            f"`offline_fraction` must satisfy 0 < offline_fraction < 1, got {value!r}. Pass e.g. 0.5; to train on "
            f"one side only, sample that buffer directly (rb.offline_buffer or rb.online_buffer)."
        )
    return value


def _as_offline_buffer(dataset):
    """A buffer sampling ``dataset``: a buffer as is; a storage or a map-style dataset wrapped in a ReplayBuffer."""
    if callable(getattr(dataset, "sample", None)) and hasattr(type(dataset), "__len__"):
        return dataset
    if isinstance(dataset, Storage):
        return ReplayBuffer(storage=dataset)
    if isinstance(dataset, Dataset) and hasattr(type(dataset), "__getitem__") and hasattr(type(dataset), "__len__"):
        return ReplayBuffer(storage=DatasetStorage(dataset))
    raise TypeError(
        f"`offline_dataset` must be a dataset id string (e.g. 'minari:mujoco/hopper/expert-v0'), a replay buffer "
        f"or offline dataset (with sample() and len()), a Storage or a map-style torch Dataset; got "
        f"{type(dataset).__name__}."
    )


class OfflineToOnlineReplayBuffer:
    """A fixed offline dataset and a growing online buffer, sampled in a fixed proportion (TorchRL's class).

    Why: offline-to-online fine-tuning (RLPD, Cal-QL, ...) trains on batches that keep a share of the offline
    data while the online data grows; ``anneal`` lowers that share over training. Each batch of ``B`` rows holds
    exactly ``round(offline_fraction * B)`` offline rows (Python's ``round``: ``round(2.5) == 2``), first, and
    the rest online; while the online buffer is empty, or when the offline share rounds to ``B``, all rows are
    offline, and when it rounds to 0, all are online. ``extend`` writes the online buffer only.

    Args:
        offline_dataset: the offline data, never modified: a dataset id string, built with
            :func:`torchrl.data.datasets.load_dataset` (``load_dataset(offline_dataset, batch_size=batch_size,
            **dataset_kwargs)``); or a replay buffer or offline dataset (a :class:`~torchrl.data.ReplayBuffer`,
            :class:`~torchrl.data.TensorDictReplayBuffer`, a buffer from ``ReplayBuffer.from_hf`` or loaded with
            ``loads``, a :class:`~torchrl.data.datasets.MinariExperienceReplay`, ...); or a
            :class:`~torchrl.data.Storage` (e.g. a :class:`~torchrl.data.DatasetStorage`) or a map-style torch
            ``Dataset``, sampled through a :class:`~torchrl.data.ReplayBuffer`.

    Keyword Args:
        online_storage (Storage, optional): the storage of the online buffer. Give it or ``online_capacity``.
            Defaults to ``None``.
        online_capacity (int, optional): builds the online buffer over ``LazyTensorStorage(online_capacity)``.
            Defaults to ``None``.
        offline_fraction (float): the share of offline rows, ``0 < offline_fraction < 1``. Defaults to ``0.5``.
        batch_size (int, optional): the batch size of :meth:`sample` without an argument; also given to
            ``load_dataset`` for a string ``offline_dataset``. Defaults to ``None``.
        transform (callable, optional): applied to each mixed batch. Defaults to ``None``.
        source_key (NestedKey, optional): beyond TorchRL: an ``int64`` entry set on every row, 0 for offline and
            1 for online rows (TensorDict batches). Defaults to ``None``.
        **dataset_kwargs: more arguments of ``load_dataset`` (only with a string ``offline_dataset``).

    The ``"index"`` entry that a dataset (a TensorDictReplayBuffer) adds to its samples is dropped from the mixed
    batch: the online buffer's samples have none, so they could not be concatenated otherwise.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, OfflineToOnlineReplayBuffer, TensorDictReplayBuffer
        >>> offline = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = offline.extend(TensorDict(obs=torch.zeros(100, 3), batch_size=[100]))
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=100, offline_fraction=0.25, batch_size=8)
        >>> _ = rb.extend(TensorDict(obs=torch.ones(10, 3), batch_size=[10]))
        >>> rb.sample()["obs"][:, 0].tolist()
        [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
        >>> rb.anneal(step=500, total_steps=1000)
        >>> rb.offline_fraction
        0.125
        >>> rb
        OfflineToOnlineReplayBuffer(offline=TensorDictReplayBuffer, offline_fraction=0.125, online_size=10, batch_size=8)
    """

    def __init__(
        self,
        offline_dataset,
        *,
        online_storage: Storage | None = None,
        online_capacity: int | None = None,
        offline_fraction: float = 0.5,
        batch_size: int | None = None,
        transform=None,
        source_key=None,
        **dataset_kwargs,
    ):
        if online_storage is not None and online_capacity is not None:
            raise O2O_BOTH_ONLINE.error(storage=type(online_storage).__name__, capacity=online_capacity)
        if online_storage is None and online_capacity is None:
            raise O2O_NO_ONLINE.error()
        if online_storage is not None and not isinstance(online_storage, Storage):
            raise TypeError(
                f"`online_storage` must be a Storage (e.g. LazyTensorStorage(N)), got "
                f"{type(online_storage).__name__}. Or pass online_capacity=N."
            )
        if online_capacity is not None:
            online_capacity = check_positive_int("online_capacity", online_capacity)
        fraction = _check_fraction(offline_fraction)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        if isinstance(offline_dataset, str):
            if batch_size is None:  # (a batch_size keyword is this argument: dataset_kwargs never holds one)
                raise O2O_STRING_BATCH_SIZE.error(dataset=offline_dataset)
            offline = _load_dataset(offline_dataset, **dataset_kwargs, batch_size=batch_size)
        else:
            if dataset_kwargs:
                raise O2O_DATASET_KWARGS.error(
                    kwargs=sorted(dataset_kwargs), cls=type(offline_dataset).__name__
                )
            offline = offline_dataset
        offline = _as_offline_buffer(offline)
        online = ReplayBuffer(
            storage=online_storage if online_storage is not None else LazyTensorStorage(online_capacity)
        )
        self._mixer = MixedReplayBuffer(
            [offline, online], [fraction, 1.0 - fraction], batch_size=batch_size, source_key=source_key,
            transform=transform,
        )
        self._base_fraction = fraction
        self._fraction = fraction
        self._batch_size = batch_size

    # -- what it is ----------------------------------------------------------------------------------------------
    @property
    def offline_fraction(self) -> float:
        """The current share of offline rows (the constructor's value, lowered by :meth:`anneal`)."""
        return self._fraction

    @property
    def base_offline_fraction(self) -> float:
        """The constructor's ``offline_fraction``, from which :meth:`anneal` starts."""
        return self._base_fraction

    @property
    def offline_buffer(self):
        """The offline buffer (a dataset, or the buffer wrapping the given storage)."""
        return self._mixer.buffers[0]

    @property
    def online_buffer(self) -> ReplayBuffer:
        """The online :class:`~torchrl.data.ReplayBuffer`, which :meth:`extend` writes."""
        return self._mixer.buffers[1]

    @property
    def batch_size(self) -> int | None:
        """The batch size of :meth:`sample` without an argument."""
        return self._batch_size

    def __len__(self) -> int:
        """Offline rows plus online rows."""
        return len(self.offline_buffer) + len(self.online_buffer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(offline={type(self.offline_buffer).__name__}, "
            f"offline_fraction={self._fraction:.3f}, online_size={len(self.online_buffer)}, "
            f"batch_size={self._batch_size})"
        )

    # -- writes and samples --------------------------------------------------------------------------------------
    def extend(self, data) -> Any:
        """Writes ``data`` into the online buffer and returns the written indices (the offline data never changes)."""
        return self.online_buffer.extend(data)

    def counts(self, batch_size: int | None = None) -> tuple[int, int]:
        """``(offline rows, online rows)`` of the next batch of ``batch_size`` (default: the buffer's).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, OfflineToOnlineReplayBuffer, ReplayBuffer
            >>> offline = ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = offline.extend(torch.zeros(4))
            >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=4)
            >>> rb.counts(5)  # the online buffer is empty: all offline
            (5, 0)
            >>> _ = rb.extend(torch.ones(2))
            >>> rb.counts(5), rb.counts(7)  # round(2.5) == 2, round(3.5) == 4
            ((2, 3), (4, 3))
        """
        if batch_size is None:
            if self._batch_size is None:
                raise O2O_SAMPLE_BATCH_SIZE.error(cls=type(self).__name__)
            batch_size = self._batch_size
        batch_size = check_positive_int("batch_size", batch_size)
        n_off = round(self._fraction * batch_size)
        if len(self.online_buffer) == 0 or n_off >= batch_size:
            return batch_size, 0
        return n_off, batch_size - n_off

    def sample(self, batch_size: int | None = None):
        """A batch of ``batch_size`` rows (default: the buffer's): the offline rows of :meth:`counts` first.

        Raises:
            ValueError: no batch size here nor in the constructor.
        """
        return self._mixer.sample_counts(list(self.counts(batch_size)))

    def anneal(self, step: int, total_steps: int) -> None:
        """Lowers the offline share linearly: ``base * max(0, 1 - step / total_steps)``, 0 from ``total_steps`` on.

        Args:
            step (int): the current step (frames collected, updates, ...), ``>= 0``.
            total_steps (int): the step at which the offline share reaches 0, ``> 0``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, OfflineToOnlineReplayBuffer, ReplayBuffer
            >>> offline = ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = offline.extend(torch.zeros(4))
            >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=4, offline_fraction=0.5)
            >>> for step in (0, 250, 1000, 2000):
            ...     rb.anneal(step, 1000)
            ...     print(rb.offline_fraction)
            0.5
            0.375
            0.0
            0.0
        """
        step = check_int("step", step, minimum=0)
        total_steps = check_positive_int("total_steps", total_steps)
        fraction = self._base_fraction * max(0.0, 1.0 - step / total_steps)
        self._fraction = fraction
        self._mixer.set_proportions([fraction, 1.0 - fraction])


def prefill_replay_buffer(rb, dataset, n_samples: int | None = None, chunk_size: int = 1000):
    """Copies ``n_samples`` rows sampled from ``dataset`` into ``rb`` (TorchRL's function) and returns ``rb``.

    Why: warm-starting an online buffer with offline data. The rows are ``dataset.sample(...)`` draws, in
    chunks of ``chunk_size``: random rows with replacement, as in TorchRL (duplicates are possible; to copy a
    dataset in order, ``rb.extend(dataset[:])``). The ``"index"`` entry a dataset adds to its samples is not
    copied.

    Args:
        rb: the buffer to fill (anything with ``extend``).
        dataset: a dataset or buffer with ``sample(n)`` and ``len()``, or a dataset id string, built with
            ``load_dataset(dataset, batch_size=chunk_size)``.
        n_samples (int, optional): how many rows, at most ``len(dataset)``. Defaults to ``None``
            (``len(dataset)``).
        chunk_size (int): the rows sampled and written at once. Defaults to ``1000``.

    Returns:
        the same ``rb``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer, prefill_replay_buffer
        >>> dataset = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
        >>> _ = dataset.extend(TensorDict(obs=torch.arange(50), batch_size=[50]))
        >>> rb = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), dataset, n_samples=25,
        ...                            chunk_size=10)
        >>> len(rb), sorted(rb[:].keys())
        (25, ['obs'])
    """
    if not callable(getattr(rb, "extend", None)):
        raise TypeError(f"`rb` must be a replay buffer (with extend()), got {type(rb).__name__}.")
    chunk_size = check_positive_int("chunk_size", chunk_size)
    n_samples = check_int("n_samples", n_samples, minimum=0, allow_none=True)
    if isinstance(dataset, str):
        dataset = _load_dataset(dataset, batch_size=chunk_size)
    if not callable(getattr(dataset, "sample", None)) or not hasattr(type(dataset), "__len__"):
        raise TypeError(
            f"`dataset` must be a dataset or buffer with sample(n) and len(), or a dataset id string; got "
            f"{type(dataset).__name__}."
        )
    total = len(dataset) if n_samples is None else min(n_samples, len(dataset))
    remaining = total
    while remaining > 0:
        n = min(chunk_size, remaining)
        chunk = dataset.sample(n)
        if hasattr(chunk, "exclude") and INDEX_KEY in chunk.keys():
            chunk = chunk.exclude(INDEX_KEY)
        rb.extend(chunk)
        remaining -= n
    return rb
