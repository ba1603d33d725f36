"""Swapping a buffer's components and stopping its prefetching: :class:`ComponentSettersMixin`.

TorchRL's buffers offer ``set_storage``, ``set_writer`` and ``set_sampler`` (each returns the component it
replaces) and ``shutdown``. Here a swap is checked like a constructor argument before anything changes, waits
for the batches sampled ahead (then drops them: they came from the old component), and wires the new component
as the constructor does: the writer registered with the storage, the buffer attached to the storage, a shared
buffer's new component shared, the buffer's generator routed to it, and a new sampler told of the items already
stored. Unlike TorchRL's ``set_storage``, the writer is registered with the new storage (TorchRL leaves it
writing to the old one).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import numbers

import torch

import torchrl.data.replay_buffers.replay_buffers._prefetch_state as _prefetch_state
from torchrl.data.replay_buffers.replay_buffers._capabilities import (
    check_component,
    check_drop_last,
    check_sampler_fits_storage,
)
from torchrl.data.replay_buffers.replay_buffers._compat import check_consuming_buffer
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import Writer


def _next_row(storage) -> int:
    """The row after the last one written in ``storage`` (its fill level when it is not known), modulo its rows."""
    capacity = storage._max_size_along_dim0()
    last = getattr(storage, "last_written_row", None)
    if isinstance(last, int) and last >= 0:
        return (last + 1) % capacity
    return len(storage) % capacity


class ComponentSettersMixin:
    """``set_storage``/``set_writer``/``set_sampler`` and ``shutdown`` of :class:`~torchrl.data.ReplayBuffer`."""

    def _swap(self, attribute: str, component, wire) -> object:
        """Replaces ``self.<attribute>`` by ``component`` once no prefetch task runs, then calls ``wire()``."""
        with self._futures_lock:
            _prefetch_state.wait(self._prefetch_queue)  # before the replay lock, which prefetch tasks take
            self._prefetch_queue.clear()  # sampled from the component being replaced
            with self._replay_lock, self._storage.write_lock:
                previous = getattr(self, attribute)
                setattr(self, attribute, component)
                wire(previous)
        return previous

    def set_storage(self, storage: Storage, collate_fn=None) -> Storage:
        """Replaces the storage and returns the previous one.

        The writer writes to the new storage from now on, after the rows it already holds (its write count is
        kept; a :class:`~torchrl.data.TensorDictMaxValueWriter` starts its ranking over). The sampler keeps its
        state and is told of the items the new storage holds, and the collate function becomes ``collate_fn`` or
        the default for that storage. A shared buffer shares the new storage.

        Raises:
            TypeError: ``storage`` is not a :class:`~torchrl.data.replay_buffers.Storage`, or the sampler cannot
                draw from it (see :class:`~torchrl.data.DatasetStorage`).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=ListStorage(10))
            >>> _ = rb.extend([1, 2])
            >>> old = rb.set_storage(LazyTensorStorage(10))
            >>> _ = rb.extend(torch.arange(3))
            >>> type(old).__name__, len(old), rb[:]
            ('ListStorage', 2, tensor([0, 1, 2]))
        """
        check_component("storage", storage, Storage)
        check_sampler_fits_storage(self._sampler, storage)
        check_consuming_buffer(self._sampler, storage, self._writer, self._prefetch)

        def wire(previous: Storage) -> None:
            previous.detach(self)
            storage.attach(self)
            self._writer.register_storage(storage)
            if getattr(storage, "writable", True):  # the writer starts after the rows the new storage holds
                self._writer._empty(empty_write_count=False)
                if len(storage):
                    with contextlib.suppress(AttributeError):  # a writer that keeps no cursor
                        self._writer._cursor = _next_row(storage)
            self._collate_fn = collate_fn if collate_fn is not None else self._default_collate()
            if self._dim_extend >= storage.ndim:
                self._dim_extend = storage.ndim - 1
            if self._shared and hasattr(storage, "share_memory_"):
                storage.share_memory_()
            self.set_rng(self._rng)  # routes the buffer's generator to the new storage
            if len(storage):
                self._sampler.mark_update(torch.arange(len(storage)), storage=storage)

        return self._swap("_storage", storage, wire)

    def set_writer(self, writer: Writer) -> Writer:
        """Replaces the writer and returns the previous one. The new writer is registered with the storage
        and starts at its own cursor; a shared buffer shares its cursor.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = rb.extend(torch.arange(3))
            >>> type(rb.set_writer(RoundRobinWriter())).__name__
            'RoundRobinWriter'
            >>> _ = rb.extend(torch.tensor([7]))  # the new writer starts at row 0
            >>> rb[:]
            tensor([7, 1, 2])
        """
        check_component("writer", writer, Writer)
        check_consuming_buffer(self._sampler, self._storage, writer, self._prefetch)

        def wire(previous: Writer) -> None:
            writer.register_storage(self._storage)
            self.set_rng(self._rng)
            if self._shared:
                writer.share_memory_()

        return self._swap("_writer", writer, wire)

    def set_sampler(self, sampler: Sampler) -> Sampler:
        """Replaces the sampler and returns the previous one. The new sampler is told of the items already
        stored (a prioritized sampler gives them its default priority); a shared buffer shares its state when
        it can.

        Raises:
            TypeError: ``sampler`` is not a :class:`~torchrl.data.replay_buffers.Sampler`, or cannot draw from
                the storage.
            ValueError: a sampler that consumes items with a writer that cannot refill them, or
                ``drop_last=True`` on a buffer without ``batch_size``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=5)
            >>> _ = rb.extend(torch.arange(10))
            >>> type(rb.set_sampler(SamplerWithoutReplacement())).__name__
            'RandomSampler'
            >>> sorted(torch.cat([rb.sample(), rb.sample()]).tolist()) == list(range(10))
            True
        """
        check_component("sampler", sampler, Sampler)
        check_sampler_fits_storage(sampler, self._storage)
        check_consuming_buffer(sampler, self._storage, self._writer, self._prefetch)
        check_drop_last(sampler, self._batch_size)

        def wire(previous: Sampler) -> None:
            self.set_rng(self._rng)
            if self._shared and sampler.requires_shared_state and sampler.can_share_state:
                sampler.share_memory_()
            if len(self._storage):
                sampler.mark_update(torch.arange(len(self._storage)), storage=self._storage)

        return self._swap("_sampler", sampler, wire)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the threads that sample ahead (``prefetch``): waits up to ``timeout`` seconds (``None``: as long
        as it takes) for the batches in flight, drops them, and samples without prefetching from then on. A
        buffer without prefetching has nothing to stop. (TorchRL's service API: on a
        :class:`~torchrl.data.RayReplayBuffer`, :meth:`~torchrl.data.RayReplayBuffer.close` ends the actor.)

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
            >>> _ = rb.extend(torch.arange(10))
            >>> _ = rb.sample()
            >>> rb.shutdown(timeout=5.0)
            >>> rb.stats()["prefetch_queue_size"], rb.sample().shape
            (0, torch.Size([2]))
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
        ):
            raise ValueError(f"`timeout` must be None or a non-negative number of seconds, got {timeout!r}.")
        with self._futures_lock:
            pending, executor = list(self._prefetch_queue), self._prefetch_executor
            self._prefetch_queue.clear()
            self._prefetch_executor, self._prefetch = None, 0
        if pending:
            concurrent.futures.wait(pending, timeout=timeout)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
