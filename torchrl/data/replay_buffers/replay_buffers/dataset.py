"""A replay buffer read through :mod:`torch.utils.data`: :class:`ReplayBufferDataset` (``rb.as_dataset()``).

An iterable dataset whose items are ``rb.sample()`` batches: the sampler, the collate function and the
transforms run where the dataset is iterated, i.e. in the DataLoader workers. This module imports no buffer
class: it uses a buffer through the public methods below, so that :meth:`ReplayBuffer.as_dataset
<torchrl.data.ReplayBuffer.as_dataset>` can build it without an import cycle, and so that any object offering
them (a buffer hosted elsewhere, a user's own buffer) can be read the same way:

- ``sample()`` and ``batch_size``: what :meth:`ReplayBufferDataset.draw` calls by default;
- ``storage``: moved to shared memory (if it can be) so that workers share its content;
- ``stateful_component()``: the component whose state a worker copy would duplicate, if any;
- ``prepare_worker_copy(seed)``: readies the worker's copy of the buffer and reseeds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from torchrl.data.replay_buffers._shared import is_spawning
from torchrl.data.replay_buffers._worker_transport import DEFAULT_TRANSPORT, check_transport, prepare_batch

__all__ = ["ReplayBufferDataset"]

_BUFFER_METHODS = ("sample", "stateful_component", "prepare_worker_copy")


def _check_replay_buffer(replay_buffer) -> None:
    missing = [name for name in _BUFFER_METHODS if not callable(getattr(replay_buffer, name, None))]
    if missing or not hasattr(replay_buffer, "storage"):
        raise TypeError(
            f"`replay_buffer` must be a ReplayBuffer (an object with storage, sample(), stateful_component() "
            f"and prepare_worker_copy(seed)), got {type(replay_buffer).__name__}."
        )


def _check_num_batches(num_batches) -> int | None:
    if num_batches is not None and (
        isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches <= 0
    ):
        raise ValueError(f"`num_batches` must be a positive int or None (endless), got {num_batches!r}.")
    return num_batches


def stateful_message(replay_buffer, where: str) -> str:
    """Why a buffer with a component that requires shared state cannot be read by DataLoader workers."""
    name, component = replay_buffer.stateful_component()
    return (
        f"ReplayBufferDataset cannot be read by DataLoader workers ({where}): the buffer's {name} "
        f"{type(component).__name__} requires shared state (requires_shared_state=True), and each worker "
        f"would hold its own copy of it (e.g. its own epoch permutation or priorities), silently duplicating "
        f"or skipping samples. Either use num_workers=0, or build the buffer with a stateless sampler "
        f"(RandomSampler or SliceSampler)."
    )


class ReplayBufferDataset(IterableDataset):
    """An :class:`~torch.utils.data.IterableDataset` whose items are batches sampled from a replay buffer.

    Each item is ``rb.sample()``: the sampler, the collate function and the transforms run where the dataset
    is iterated, i.e. in the DataLoader workers. Use it with ``batch_size=None`` (the items already are
    batches) and ``collate_fn=tensordict_collate``::

        DataLoader(rb.as_dataset(num_batches=1000), batch_size=None, num_workers=2,
                   collate_fn=tensordict_collate)

    Without that ``collate_fn``, torch passes each TensorDict batch to ``default_convert``, which fails.

    Workers: each worker holds a copy of the buffer object over the same storage content. At its first
    iteration in a worker, the dataset calls ``replay_buffer.prepare_worker_copy(get_worker_info().seed)``
    (fresh locks, prefetching off, the generator reseeded), so workers draw different batches, epochs differ,
    and a DataLoader with a fixed ``generator`` reproduces the same stream. A buffer whose
    ``stateful_component()`` is not ``None`` (a sampler or storage with ``requires_shared_state=True``) is
    refused with ``num_workers > 0`` when :attr:`refuse_stateful` is true: when the DataLoader sends the
    dataset to spawn/forkserver workers, and at the first iteration in a forked worker.

    Subclasses change what is yielded through two hooks, :meth:`draw` (one sampling call) and :meth:`items`
    (what one sampling call yields), and the refusal through :attr:`refuse_stateful`.

    Args:
        replay_buffer (ReplayBuffer): the buffer; it must have a ``batch_size`` unless a subclass overrides
            :meth:`draw`.

    Keyword Args:
        num_batches (int, optional): the number of sampling calls per epoch, in total over all workers
            (worker ``i`` of ``N`` makes ``len(range(i, num_batches, N))``). ``None`` streams forever.
            Defaults to ``None``.
        transport (str): how a worker process sends a batch to the main process: ``"ring"`` (a per-worker
            ring of reusable shared-memory slots), ``"consolidated"`` (one new shared-memory segment per
            batch) or ``"torch"`` (torch's own, one segment per tensor). The ring carries dense CPU TensorDict
            batches that the collate function returns unchanged; anything else travels torch's way. See
            :ref:`dataloader-transport`. Defaults to ``"ring"``.

    Examples:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, tensordict_collate
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(torch.arange(100))
        >>> loader = DataLoader(rb.as_dataset(num_batches=3), batch_size=None, collate_fn=tensordict_collate)
        >>> [batch.shape for batch in loader]
        [torch.Size([8]), torch.Size([8]), torch.Size([8])]

        A subclass that yields single items from batches of 4 (``draw`` and ``items`` are the hooks):

        >>> from torchrl.data import ReplayBufferDataset
        >>> class Items(ReplayBufferDataset):
        ...     def draw(self):
        ...         return self.replay_buffer.sample(4)
        ...     def items(self, batch):
        ...         yield from batch.unbind(0)
        >>> len(list(Items(rb, num_batches=2)))
        8
    """

    #: Whether a buffer with a stateful component is refused with DataLoader workers (``True``). A subclass
    #: that sets it to ``False`` takes the responsibility for such buffers (e.g. warns instead).
    refuse_stateful: bool = True

    def __init__(self, replay_buffer, *, num_batches: int | None = None, transport: str = DEFAULT_TRANSPORT):
        _check_replay_buffer(replay_buffer)
        self.num_batches = _check_num_batches(num_batches)
        self.transport = check_transport(transport)
        if type(self).draw is ReplayBufferDataset.draw and getattr(replay_buffer, "batch_size", None) is None:
            raise ValueError(
                "rb.as_dataset() yields rb.sample() batches and needs the buffer's batch size: build the buffer "
                "with ReplayBuffer(..., batch_size=N)."
            )
        self.replay_buffer = replay_buffer
        self._seeded_worker: int | None = None
        storage = replay_buffer.storage
        if hasattr(storage, "share_memory_"):  # a lazy storage then allocates in shared memory at its first write
            storage.share_memory_()

    # -- hooks for subclasses ---------------------------------------------------------------------------------
    def draw(self) -> Any:
        """One sampling call: ``replay_buffer.sample()``. Override it to sample differently (another batch
        size, ``return_info=True``, a check of what was sampled)."""
        return self.replay_buffer.sample()

    def items(self, batch) -> Iterator[Any]:
        """What one sampling call yields: the batch itself. Override it to split the batch into items, or to
        reshape what is yielded; each yielded object goes through the dataset's transport."""
        yield batch

    # -- iteration ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("This ReplayBufferDataset is endless (num_batches=None): it has no length.")
        return self.num_batches

    def _batches_for_this_process(self) -> int | None:
        info = get_worker_info()
        if self.num_batches is None or info is None:
            return self.num_batches
        return len(range(info.id, self.num_batches, info.num_workers))

    def _prepare_worker_copy(self) -> None:
        """Runs once per worker: refuses stateful buffers, then lets the buffer ready its copy and reseed."""
        info = get_worker_info()
        if info is None or self._seeded_worker == info.id:
            return
        if self.refuse_stateful and self.replay_buffer.stateful_component() is not None:
            raise RuntimeError(stateful_message(self.replay_buffer, "in a forked worker"))
        self.replay_buffer.prepare_worker_copy(info.seed)
        self._seeded_worker = info.id

    def __iter__(self):
        self._prepare_worker_copy()
        remaining = self._batches_for_this_process()
        while remaining is None or remaining > 0:
            for item in self.items(self.draw()):
                yield prepare_batch(item, self.transport)
            if remaining is not None:
                remaining -= 1

    def __getstate__(self):
        if is_spawning() and self.refuse_stateful and self.replay_buffer.stateful_component() is not None:
            raise RuntimeError(stateful_message(self.replay_buffer, "sent to a spawn/forkserver worker"))
        state = self.__dict__.copy()
        state["_seeded_worker"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}, "
            f"num_batches={self.num_batches}, transport={self.transport!r})"
        )
