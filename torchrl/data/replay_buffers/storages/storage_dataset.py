"""A storage read through :mod:`torch.utils.data`: :class:`StorageDataset` (``storage.as_dataset()``).

Map-style: the DataLoader's sampler picks indices in the main process; a worker reads each index batch with
ONE ``storage.get`` call (``__getitems__``). The storage content is shared with the workers, not copied (shared
memory, memory-mapped files, shared length counters). This module imports no storage class: it reads a storage
through its public contract (``get``, ``len``, ``ndim``, ``shape``, ``is_ensemble``, ``share_memory_``), so that
:meth:`Storage.as_dataset <torchrl.data.Storage.as_dataset>` can build it without an import cycle.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDictBase, is_tensorclass
from torch.utils.data import Dataset

from torchrl.data.replay_buffers.loading.worker_threads import WorkerThreadCheck
from torchrl.data.replay_buffers.loading.worker_transport import (
    DEFAULT_TRANSPORT,
    check_transport,
    prepare_batch,
)

__all__ = ["StorageDataset"]

_STATE_FORMAT = "torchrl-storage-dataset-state"


def _check_storage(storage) -> None:
    if not (callable(getattr(storage, "get", None)) and hasattr(type(storage), "__len__")
            and hasattr(type(storage), "ndim")):
        raise TypeError(
            f"`storage` must be a Storage (an object with get(index), len() and ndim), got "
            f"{type(storage).__name__}."
        )
    if getattr(storage, "is_ensemble", False):
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


class StorageDataset(Dataset):
    """A map-style :class:`~torch.utils.data.Dataset` over a 1-D storage.

    ``__getitems__(indices)`` reads a whole index batch with one ``storage.get`` call (one vectorized gather
    for tensor storages), which is what a DataLoader with automatic batching calls; ``__getitem__(i)`` reads
    one item; ``len()`` is the storage's current length.

    TensorDict and tensorclass batches are returned as one batch, which both
    :func:`~torchrl.data.tensordict_collate` and torch's default collate pass through. Tensor and pytree
    batches are returned as a list of per-item views of the gathered batch, so torch's default collate stacks
    them as it expects; ``tensordict_collate`` does the same.

    Args:
        storage (Storage): a 1-D storage holding data.

    Keyword Args:
        share_memory (bool): move a CPU tensor storage to shared memory (in place), so that DataLoader workers
            share it instead of holding a copy, and see rows written after they started. Memory-mapped
            storages are always shared. Defaults to ``True``.
        transport (str): how a worker process sends a batch to the main process: ``"ring"`` (a per-worker
            ring of reusable shared-memory slots), ``"consolidated"`` (one new shared-memory segment per
            batch) or ``"torch"`` (torch's own, one segment per tensor). The ring carries dense CPU TensorDict
            batches that the collate function returns unchanged; anything else travels torch's way. See
            :ref:`dataloader-transport`. Defaults to ``"ring"``.

    Several ranks (data-parallel, :mod:`torch.distributed`): give the DataLoader a
    :class:`~torch.utils.data.distributed.DistributedSampler` (or torchdata's resumable
    ``StatefulDistributedSampler``) instead of ``shuffle=True``. Each rank then reads a disjoint shard of the
    storage per epoch (padded by repeating a few items so that shards have equal length, unless
    ``drop_last=True``), and its workers read that shard's index batches. Call ``sampler.set_epoch(epoch)``
    before each epoch: without it, every epoch repeats the first epoch's order. The storage must hold the same
    content on every rank, e.g. a :class:`~torchrl.data.LazyMemmapStorage` over one shared directory, which
    every rank re-opens (see :ref:`distributed-torch`)::

        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2,
                            collate_fn=tensordict_collate)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                ...

    Resuming: the dataset holds no position (the DataLoader's sampler does, and torchdata's
    ``StatefulDataLoader`` saves it). Its :meth:`state_dict` records the storage's length, which
    :meth:`load_state_dict` checks: a shuffled order resumed over a storage of another length would differ.

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

    def __init__(self, storage, *, share_memory: bool = True, transport: str = DEFAULT_TRANSPORT):
        _check_storage(storage)
        self.storage = storage
        self.share_memory = bool(share_memory)
        self.transport = check_transport(transport)
        if self.share_memory and hasattr(storage, "share_memory_"):
            storage.share_memory_()
        self._thread_check = WorkerThreadCheck()  # see NOTE [forked workers and OpenMP] in loading/worker_threads.py

    def __len__(self) -> int:
        return len(self.storage)

    # -- resume (torchdata's StatefulDataLoader protocol) ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"format": "torchrl-storage-dataset-state", "length": len(storage)}``: the position lives in the
        DataLoader's sampler; the length lets :meth:`load_state_dict` refuse another storage.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(4), torch.zeros(4, 2))
            >>> storage.as_dataset().state_dict()["length"]
            4
        """
        return {"format": _STATE_FORMAT, "length": len(self.storage)}

    def check_state_dict(self, state_dict: dict[str, Any], *, buffer_length: int | None = None, **_) -> None:
        """Raises the ``ValueError`` of :meth:`load_state_dict` without changing anything (``buffer_length``
        replaces the storage's current length: the length it will have once its checkpoint is loaded)."""
        if not isinstance(state_dict, dict) or state_dict.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"`state_dict` is not a StorageDataset state (a dict with format {_STATE_FORMAT!r}); got "
                f"{state_dict!r:.200}."
            )
        length = len(self.storage) if buffer_length is None else buffer_length
        if state_dict.get("length") != length:
            raise ValueError(
                f"Cannot resume this StorageDataset: the loader state was saved over a storage of length "
                f"{state_dict.get('length')!r}, and this storage holds {length} items. Load the storage saved "
                f"with the state first (torchrl.data.load_training_state does both)."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Checks a state saved by :meth:`state_dict` against this storage (``ValueError`` if its length
        differs); there is nothing else to restore."""
        self.check_state_dict(state_dict)

    def __getitem__(self, index: int):
        self._thread_check.check(self)
        return self.storage.get(index)

    def __getitems__(self, indices: list[int]):
        self._thread_check.check(self)
        batch = self.storage.get(indices)
        if isinstance(batch, list):
            return batch
        if isinstance(batch, TensorDictBase) or is_tensorclass(batch):
            return prepare_batch(batch, self.transport)
        if isinstance(batch, torch.Tensor):
            return list(batch.unbind(0))
        return _split_pytree(batch, len(indices))

    def __repr__(self) -> str:
        return f"StorageDataset(storage={self.storage!r}, transport={self.transport!r})"


def _split_pytree(batch, n: int) -> list:
    leaves, spec = pytree.tree_flatten(batch)
    columns = [leaf.unbind(0) for leaf in leaves]
    return [pytree.tree_unflatten([col[i] for col in columns], spec) for i in range(n)]
