"""Reading storages and replay buffers through :mod:`torch.utils.data`.

Two adapters sit on top of storages and buffers (which know nothing of them):

- :class:`StorageDataset` (``storage.as_dataset()``): a map-style dataset. The DataLoader's sampler picks
  indices in the main process; a worker reads the whole index batch with ONE ``storage.get`` call
  (``__getitems__``). Use ``DataLoader(ds, batch_size=B, shuffle=True, collate_fn=tensordict_collate)``.
- :class:`ReplayBufferDataset` (``rb.as_dataset()``): an iterable dataset whose items are ``rb.sample()``
  batches; the sampler, the collate function and the transforms run in the worker. Use
  ``DataLoader(ds, batch_size=None, num_workers=N, collate_fn=tensordict_collate)``.

Sharing model: each worker holds a copy of the storage/buffer object, but the storage CONTENT is shared, not
copied: CPU tensor storages are moved to shared memory, memory-mapped storages re-open their files, and the
length/cursor counters live in shared memory, so workers see rows written after they started (fork, spawn
and forkserver). A :class:`~torchrl.data.ListStorage` is a snapshot under fork and refused under spawn.
Everything else (sampler, writer, transforms) is copied per worker, so a buffer whose sampler (or storage)
declares ``requires_shared_state`` is refused when ``num_workers > 0``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensorclass
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_convert

from torchrl.data.replay_buffers._collate import tensordict_collate
from torchrl.data.replay_buffers._shared import is_spawning
from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.storages import Storage

__all__ = ["StorageDataset", "ReplayBufferDataset", "tensordict_collate"]


def _is_collection(data) -> bool:
    return isinstance(data, TensorDictBase) or is_tensorclass(data)


class StorageDataset(Dataset):
    """A map-style :class:`~torch.utils.data.Dataset` over a 1-D storage.

    ``__getitems__(indices)`` reads a whole index batch with one ``storage.get`` call (one vectorized gather
    for tensor storages), which is what a DataLoader with automatic batching calls; ``__getitem__(i)`` reads
    one item; ``len()`` is the storage's current length.

    TensorDict and tensorclass batches are returned as one batch, which both :func:`tensordict_collate` and
    torch's default collate pass through. Tensor and pytree batches are returned as a list of per-item views
    of the gathered batch, so torch's default collate stacks them as it expects; ``tensordict_collate`` does
    the same.

    Args:
        storage (Storage): a 1-D storage holding data.

    Keyword Args:
        share_memory (bool): move a CPU tensor storage to shared memory (in place), so that DataLoader workers
            share it instead of holding a copy, and see rows written after they started. Memory-mapped
            storages are always shared. Defaults to ``True``.

    .. note:: Rows written after the workers started are visible to them, but the DataLoader's sampler draws
        indices in ``range(len(dataset))`` as measured when each epoch starts.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torch.utils.data import DataLoader
        >>> from torchrl.data import LazyTensorStorage, tensordict_collate
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(torch.arange(64), TensorDict(obs=torch.randn(64, 3), batch_size=[64]))
        >>> loader = DataLoader(storage.as_dataset(), batch_size=32, shuffle=True, collate_fn=tensordict_collate)
        >>> next(iter(loader)).batch_size
        torch.Size([32])
    """

    def __init__(self, storage: Storage, *, share_memory: bool = True):
        if not isinstance(storage, Storage):
            raise TypeError(f"`storage` must be a Storage, got {type(storage).__name__}.")
        if getattr(storage, "_is_ensemble", False):
            raise TypeError(
                "A StorageEnsemble is not a flat dataset (its items live in several storages with their own "
                "indices). Build one dataset per member, `member.as_dataset()`, and combine them with "
                "torch.utils.data.ConcatDataset, or sample the ensemble buffer with `rb.as_dataset()`."
            )
        if storage.ndim > 1:
            raise ValueError(
                f"StorageDataset reads 1-D storages; this storage has ndim={storage.ndim} (shape "
                f"{list(storage.shape)}). Use `storage.flatten().as_dataset()` to read its cells as items."
            )
        self.storage = storage
        self.share_memory = bool(share_memory)
        if self.share_memory and hasattr(storage, "share_memory_"):
            storage.share_memory_()

    def __len__(self) -> int:
        return len(self.storage)

    def __getitem__(self, index: int):
        return self.storage.get(index)

    def __getitems__(self, indices: list[int]):
        batch = self.storage.get(indices)
        if isinstance(batch, list) or _is_collection(batch):
            return batch
        if isinstance(batch, torch.Tensor):
            return list(batch.unbind(0))
        return _split_pytree(batch, len(indices))

    def __repr__(self) -> str:
        return f"StorageDataset(storage={self.storage!r})"


def _split_pytree(batch, n: int) -> list:
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten(batch)
    columns = [leaf.unbind(0) for leaf in leaves]
    return [pytree.tree_unflatten([col[i] for col in columns], spec) for i in range(n)]


def _stateful_component(rb: ReplayBuffer) -> tuple[str, Any] | None:
    """The first component of ``rb`` whose state a per-worker copy would duplicate, if any."""
    for name in ("sampler", "storage"):
        component = getattr(rb, name)
        if getattr(component, "requires_shared_state", False):
            return name, component
    return None


def _stateful_message(rb: ReplayBuffer, where: str) -> str:
    name, component = _stateful_component(rb)
    return (
        f"ReplayBufferDataset cannot be read by DataLoader workers ({where}): the buffer's {name} "
        f"{type(component).__name__} requires shared state (requires_shared_state=True), and each worker "
        f"would hold its own copy of it (e.g. its own epoch permutation or priorities), silently duplicating "
        f"or skipping samples. Either use num_workers=0, or build the buffer with a stateless sampler "
        f"(RandomSampler or SliceSampler)."
    )


def _check_collate_of_caller(batch) -> None:
    """Fails with the fix when a DataLoader is about to pass a TensorDict batch to ``default_convert``.

    With ``batch_size=None`` and no ``collate_fn``, torch calls ``default_convert`` on each item; it treats a
    TensorDict as a mapping, iterates it (which yields sub-TensorDicts, not keys) and fails deep inside torch
    with "Multiple dispatch failed for 'torch.Tensor.__getitem__'". The DataLoader's fetcher is the frame
    that called ``next()`` on our generator: we read its ``collate_fn`` and fail early with the fix instead.
    """
    if not _is_collection(batch):
        return
    try:
        caller = sys._getframe(2).f_locals.get("self")
        collate_fn = getattr(caller, "collate_fn", None)
    except (AttributeError, ValueError):  # pragma: no cover - other interpreters
        return
    if collate_fn is default_convert:
        raise TypeError(
            "DataLoader(rb.as_dataset(), batch_size=None) without a collate_fn passes each TensorDict batch to "
            "torch's default_convert, which cannot handle it. Pass collate_fn=tensordict_collate "
            "(from torchrl.data import tensordict_collate)."
        )


class ReplayBufferDataset(IterableDataset):
    """An :class:`~torch.utils.data.IterableDataset` whose items are batches sampled from a replay buffer.

    Each item is ``rb.sample()``: the sampler, the collate function and the transforms run where the dataset
    is iterated, i.e. in the DataLoader workers. Use it with ``batch_size=None`` (the items already are
    batches) and ``collate_fn=tensordict_collate``::

        DataLoader(rb.as_dataset(num_batches=1000), batch_size=None, num_workers=2,
                   collate_fn=tensordict_collate)

    Without that ``collate_fn``, torch passes each TensorDict batch to ``default_convert``, which fails; the
    dataset detects it and raises a ``TypeError`` that names the fix.

    Workers: each worker holds a copy of the buffer object over the same storage content (see the module
    docstring). A buffer built with a ``torch.Generator`` is reseeded once per worker from
    ``get_worker_info().seed``, so workers draw different batches, epochs differ, and a DataLoader with a fixed
    ``generator`` reproduces the same stream. Prefetching is turned off in worker copies (the prefetch queue
    is never sent to a worker). A buffer whose sampler or storage has ``requires_shared_state=True`` is
    refused with ``num_workers > 0``: when the DataLoader sends the dataset to spawn/forkserver workers, and
    at the first iteration in a forked worker.

    Args:
        replay_buffer (ReplayBuffer): the buffer; it must have a ``batch_size``.

    Keyword Args:
        num_batches (int, optional): the number of batches per epoch, in total over all workers (worker ``i``
            of ``N`` yields ``len(range(i, num_batches, N))``). ``None`` streams forever. Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, tensordict_collate
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(torch.arange(100))
        >>> loader = DataLoader(rb.as_dataset(num_batches=3), batch_size=None, collate_fn=tensordict_collate)
        >>> [batch.shape for batch in loader]
        [torch.Size([8]), torch.Size([8]), torch.Size([8])]
    """

    #: Whether a buffer with a stateful component is refused with workers (subclasses may only warn).
    _refuse_stateful: bool = True

    def __init__(self, replay_buffer: ReplayBuffer, *, num_batches: int | None = None):
        if not isinstance(replay_buffer, ReplayBuffer):
            raise TypeError(f"`replay_buffer` must be a ReplayBuffer, got {type(replay_buffer).__name__}.")
        if num_batches is not None and (
            isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches <= 0
        ):
            raise ValueError(f"`num_batches` must be a positive int or None (endless), got {num_batches!r}.")
        self._check_batch_size(replay_buffer)
        self.replay_buffer = replay_buffer
        self.num_batches = num_batches
        self._seeded_worker: int | None = None
        storage = replay_buffer.storage
        if hasattr(storage, "share_memory_"):  # a lazy storage then allocates in shared memory at its first write
            storage.share_memory_()

    @staticmethod
    def _check_batch_size(replay_buffer: ReplayBuffer) -> None:
        if replay_buffer.batch_size is None:
            raise ValueError(
                "rb.as_dataset() yields rb.sample() batches and needs the buffer's batch size: build the buffer "
                "with ReplayBuffer(..., batch_size=N)."
            )

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("This ReplayBufferDataset is endless (num_batches=None): it has no length.")
        return self.num_batches

    def _batches_for_this_process(self) -> int | None:
        info = get_worker_info()
        if self.num_batches is None:
            return None
        if info is None:
            return self.num_batches
        return len(range(info.id, self.num_batches, info.num_workers))

    def _prepare_worker_copy(self) -> None:
        """Runs in a worker once: refuses stateful buffers, resets runtime state, reseeds the generator."""
        info = get_worker_info()
        if info is None or self._seeded_worker == info.id:
            return
        if self._refuse_stateful and _stateful_component(self.replay_buffer) is not None:
            raise RuntimeError(_stateful_message(self.replay_buffer, "in a forked worker"))
        rb = self.replay_buffer
        rb._prefetch = 0
        rb._make_runtime_state()
        if rb._rng is not None:
            rb._rng.manual_seed(info.seed % (2**63))
        self._seeded_worker = info.id

    def _draw(self):
        """One sampling call (subclasses may sample another batch size)."""
        return self.replay_buffer.sample()

    def _items(self, batch):
        """What one sampling call yields (subclasses may split the batch into items)."""
        yield batch

    def __iter__(self):
        self._prepare_worker_copy()
        remaining = self._batches_for_this_process()
        first = True
        while remaining is None or remaining > 0:
            batch = self._draw()
            if first:
                _check_collate_of_caller(batch)
                first = False
            yield from self._items(batch)
            if remaining is not None:
                remaining -= 1

    def __getstate__(self):
        if is_spawning() and self._refuse_stateful and _stateful_component(self.replay_buffer) is not None:
            raise RuntimeError(_stateful_message(self.replay_buffer, "sent to a spawn/forkserver worker"))
        state = self.__dict__.copy()
        state["_seeded_worker"] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}, num_batches={self.num_batches})"
