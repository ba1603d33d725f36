"""The replay buffer: a storage, a writer, a sampler and transforms behind one object.

Write path: ``extend(data)`` -> inverse transforms -> ``writer.extend`` (which calls ``storage.set`` and then
``storage.mark_update`` -> ``self.mark_update`` -> ``sampler.mark_update``) -> ``sampler.extend(index)``.
Sample path: ``sample(batch_size)`` -> ``sampler.sample(storage, batch_size)`` -> ``storage.get(index)`` (one
gather) -> ``collate_fn`` -> forward transforms. Sampling and writing hold one re-entrant lock around the
storage, so a thread can extend while another samples (``prefetch=k`` samples ahead in a thread pool).

Pickling (``pickle``, ``torch.save``, DataLoader workers) drops the locks and the thread pool and rebuilds
them; the batches already prefetched travel with the buffer, as in TorchRL (see ``_prefetch_state``), and a
DataLoader worker's copy drops them; the generator state travels as ``bytes``.
"""

from __future__ import annotations

import collections
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensorclass

from torchrl._validation import check_int, check_positive_int
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.replay_buffers._buffer_state import BufferStateMixin
from torchrl.data.replay_buffers.replay_buffers._capabilities import (
    check_component,
    check_drop_last,
    check_sampler_fits_storage,
    default_writer_for,
)
from torchrl.data.replay_buffers.replay_buffers._compat import (
    BufferCompatMixin,
    check_compat_keywords,
    check_consuming_buffer,
    consuming_sampler_for,
)
from torchrl.data.replay_buffers.replay_buffers._component_setters import ComponentSettersMixin
from torchrl.data.replay_buffers.replay_buffers._hf_methods import HFExchangeMixin
from torchrl.data.replay_buffers.replay_buffers._prefetch_order import current_turn, submit_in_order
from torchrl.data.replay_buffers.replay_buffers._service_backend import (
    ServiceBackendMeta,
    ServiceMethodsMixin,
)
from torchrl.data.replay_buffers.replay_buffers._worker_hooks import WorkerHooksMixin
from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler
from torchrl.data.replay_buffers.storages import ListStorage, Storage, TensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter, Writer
from torchrl.envs.transforms.transforms import Compose, _InvertTransform, as_transform


def _identity(x):
    return x


class ReplayBuffer(
    BufferStateMixin, BufferCompatMixin, ComponentSettersMixin, HFExchangeMixin, WorkerHooksMixin,
    ServiceMethodsMixin, metaclass=ServiceBackendMeta,
):
    """A replay buffer: writes go through a writer into a storage; samples are drawn by a sampler.

    Keyword Args:
        storage (Storage, optional): where the data lives. Defaults to ``ListStorage(1000)``.
        sampler (Sampler, optional): how batches are drawn. Defaults to :class:`RandomSampler`.
        writer (Writer, optional): where new data goes. Defaults to :class:`RoundRobinWriter`.
        collate_fn (callable, optional): turns what ``storage.get`` returns into a batch. Defaults to the
            identity for tensor storages and :func:`~torchrl.data.tensordict_collate` (stacking) for others.
        pin_memory (bool): pin sampled batches (only when CUDA is available). Defaults to ``False``.
        prefetch (int, optional): how many batches to sample ahead in a thread pool. Needs ``batch_size``.
            Prefetched batches are drawn in order, so iterating the buffer still yields exactly one epoch of
            a without-replacement sampler (batches drawn past its end open the next epoch). As in TorchRL, the
            batches sampled ahead are part of ``state_dict()``, ``dumps()`` and pickling, so a restored buffer
            returns the same next batches (a DataLoader worker's copy drops them). Defaults to ``None``.
        transform (Transform or callable, optional): applied to each sampled batch (``forward``) and, inverted,
            to written data (``inv``). Defaults to an empty :class:`~torchrl.envs.transforms.Compose`.
        batch_size (int, optional): the default batch size of :meth:`sample`. A sampler built with
            ``drop_last=True`` needs it (ValueError at construction otherwise, as in TorchRL). Defaults to ``None``.
        dim_extend (int, optional): the dim of the data written by :meth:`extend` that indexes items.
            Defaults to ``storage.ndim - 1``.
        generator (torch.Generator, optional): the generator of every random draw. Defaults to ``None``
            (torch's global generator).
        shared (bool): whether the buffer is written from several processes: moves tensor storages (content,
            length and writer cursor) to shared memory, and every write then holds the storage's
            cross-process :attr:`~torchrl.data.TensorStorage.write_lock` (memory-mapped storages are always
            shared). See :ref:`shared-writes`. Defaults to ``False``.
        sample_unit (SampleUnit, optional): what one drawn position reads, e.g.
            :class:`~torchrl.data.Sequence` windows (see :mod:`~torchrl.data.replay_buffers.sample_units`).
            Defaults to ``None`` (one item per position, like :class:`~torchrl.data.Transition`).
        transform_factory (callable, optional): a zero-argument callable returning the transform; exclusive
            with ``transform`` (TypeError). Defaults to ``None``.
        consume_after_n_samples (int, optional): draw each item at most this many times until it is
            overwritten: the default sampler becomes ``ConsumingSampler(consume_after_n_samples)`` (see
            :class:`~torchrl.data.ConsumingSampler`; another sampler raises a ``ValueError``). Defaults to ``None``.
        compilable (bool, optional): accepted for TorchRL compatibility and passed to the default storage
            and writer; no effect here (see :class:`~torchrl.data.Storage`). Defaults to ``None``.
        delayed_init (bool, optional): accepted for TorchRL compatibility; the buffer is always built at once
            (:attr:`initialized` is ``True``). Defaults to ``None``.
        checkpointer (StorageCheckpointerBase, optional): the storage's checkpointer, i.e. the layout that
            :meth:`dumps` writes for the storage (e.g. :class:`~torchrl.data.FlatStorageCheckpointer`); set as
            ``storage.checkpointer``. Defaults to ``None`` (the storage's own).
        service_backend (str): where the buffer runs, read before ``__init__`` by every buffer class (as in
            TorchRL): ``"direct"`` (this process) or ``"ray"``, which returns a
            :class:`~torchrl.data.RayReplayBuffer` whose actor hosts this class (components then passed as
            constructors; see :ref:`distributed-replay`). Defaults to ``"direct"``.
        service_backend_options (dict, optional): the service's keywords (``ray_init_config``,
            ``remote_config`` for ``"ray"``). Defaults to ``None``.
        transport (str): how calls reach the buffer: ``"auto"`` or ``"direct"`` for a direct buffer,
            ``"auto"`` or ``"ray"`` for a Ray one. Defaults to ``"auto"``.
        transport_options (dict, optional): refused (no transport here takes options). Defaults to ``None``.
        use_ray_service (bool, optional): deprecated (warns): ``True`` means ``service_backend="ray"``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
        >>> rb.extend(torch.arange(10))
        tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        >>> rb.sample().shape, len(rb)
        (torch.Size([4]), 10)
    """

    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        collate_fn=None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform=None,
        batch_size: int | None = None,
        dim_extend: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
        sample_unit=None,
        transform_factory=None,
        consume_after_n_samples: int | None = None,
        compilable: bool | None = None,
        delayed_init: bool | None = None,
        checkpointer=None,
    ) -> None:
        transform, self._compilable, self._sample_unit = check_compat_keywords(
            transform=transform, transform_factory=transform_factory, consume_after_n_samples=consume_after_n_samples,
            compilable=compilable, delayed_init=delayed_init, sample_unit=sample_unit,
        )  # fmt: skip
        self._batch_size = check_positive_int("batch_size", batch_size, allow_none=True, type_error=False)
        check_int("prefetch", prefetch, minimum=0, allow_none=True, type_error=False)
        if prefetch and self._batch_size is None:
            raise ValueError("`prefetch` samples ahead with the buffer's `batch_size`: pass batch_size too.")
        if prefetch and shared:
            raise ValueError("A shared buffer cannot prefetch: pass prefetch=None or shared=False.")
        check_int("dim_extend", dim_extend, minimum=0, allow_none=True, type_error=False)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}.")
        storage = ListStorage(1000, compilable=self._compilable) if storage is None else storage
        writer = default_writer_for(storage, self._default_writer, self._compilable) if writer is None else writer
        self._storage = check_component("storage", storage, Storage)
        sampler = consuming_sampler_for(sampler, consume_after_n_samples)
        self._sampler = check_component("sampler", sampler if sampler is not None else RandomSampler(), Sampler)
        self._writer = check_component("writer", writer, Writer)
        check_sampler_fits_storage(self._sampler, self._storage)
        check_consuming_buffer(self._sampler, self._storage, self._writer, prefetch)
        check_drop_last(self._sampler, self._batch_size)
        if checkpointer is not None:  # TorchRL's keyword: the storage's checkpointer (its dumps/loads layout)
            self._storage.checkpointer = checkpointer
        self._storage.attach(self)
        self._writer.register_storage(self._storage)
        self._collate_fn = collate_fn if collate_fn is not None else self._default_collate()
        self._transform = self._as_compose(transform)
        self._pin_memory = bool(pin_memory)
        self._prefetch = int(prefetch or 0)
        self._dim_extend = self._storage.ndim - 1 if dim_extend is None else dim_extend
        self._shared = bool(shared)
        self._rng: torch.Generator | None = None
        self._make_runtime_state()
        if shared:
            self.share(True)
        self.set_rng(generator)
        if len(self._storage):  # items already stored: the sampler learns of them (e.g. default priorities)
            self._sampler.mark_update(torch.arange(len(self._storage)), storage=self._storage)

    # -- construction helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _default_writer(compilable: bool = False) -> Writer:
        return RoundRobinWriter(compilable=compilable)

    def _default_collate(self):
        return _identity if isinstance(self._storage, TensorStorage) else stack_samples

    @staticmethod
    def _as_compose(transform) -> Compose:
        if transform is None:
            return Compose()
        if isinstance(transform, Compose):
            return transform
        return Compose(as_transform(transform))

    def _make_runtime_state(self) -> None:
        """Locks, thread pool and prefetch queue: never pickled, rebuilt empty in every copy."""
        self._replay_lock = threading.RLock()
        self._futures_lock = threading.RLock()
        self._prefetch_queue: collections.deque = collections.deque()
        self._prefetch_executor = ThreadPoolExecutor(max_workers=self._prefetch) if self._prefetch else None

    def share(self, shared: bool = True) -> ReplayBuffer:
        """Prepares the buffer to be written from several processes.

        Tensor storages move to shared memory (content, length, write lock), and so does the writer's cursor,
        and the sampler's state when it has state it can share (priorities, an epoch, a free list: see
        ``can_share_state`` on :class:`~torchrl.data.replay_buffers.Sampler`), so that a priority set or an
        item written in one process is seen by the others. Call it (or build the buffer with ``shared=True``)
        before starting the other processes, after a first write when the storage is lazy.
        """
        self._shared = bool(shared)
        if shared and hasattr(self._storage, "share_memory_"):
            self._storage.share_memory_()
        if shared:
            self.share_memory_()
            if self._sampler.requires_shared_state and self._sampler.can_share_state:
                self._sampler.share_memory_()
        return self

    def share_memory_(self) -> ReplayBuffer:
        """Moves the writer's cursor to shared memory; the storage calls it when it is shared itself."""
        self._writer.share_memory_()
        return self

    @property
    def write_lock(self):
        """The storage's write lock (cross-process once the storage is shared), held around every write."""
        return self._storage.write_lock

    # -- properties ---------------------------------------------------------------------------------------------
    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def writer(self) -> Writer:
        return self._writer

    @property
    def collate_fn(self):
        """The function that turns what ``storage.get`` returns into a batch."""
        return self._collate_fn

    @property
    def transform(self) -> Compose:
        return self._transform

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def dim_extend(self) -> int:
        return self._dim_extend

    @property
    def write_count(self) -> int:
        return getattr(self._writer, "write_count", 0)

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Routes every random draw (sampler, storage, writer) through ``generator``."""
        self._rng = generator
        for component in (self._storage, self._sampler, self._writer):
            component._rng = generator

    def __len__(self) -> int:
        """The number of stored items (cells for ``ndim > 1``); with a sampler that consumes items
        (:class:`~torchrl.data.ConsumingSampler`), the number of items that can still be drawn."""
        if self._sampler.consumes_items:
            return self._sampler.num_sampleable(self._storage)
        return len(self._storage)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(storage={self._storage!r}, sampler={self._sampler!r}, "
            f"writer={self._writer!r}, batch_size={self._batch_size}, transform={self._transform!r})"
        )

    # -- writes -------------------------------------------------------------------------------------------------
    def add(self, data) -> Any:
        """Writes one item and returns its index.

        A TensorDict with a batch dimension is written as one item (TorchRL warns about it, and so do we, with
        a UserWarning): use :meth:`extend` to write a batch of items.
        """
        if isinstance(data, TensorDictBase) and data.batch_dims >= self._storage.ndim:  # a row of ndim=2: fine
            warnings.warn(
                f"add() writes one item, and got a TensorDict with batch_size={list(data.batch_size)}: it is "
                f"stored as a single item. Use extend() to write each element of the batch as an item.",
                UserWarning,
                stacklevel=2,
            )
        if len(self._transform):
            data = self._inv_transform_item(data)
            if data is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        with self._replay_lock, self._storage.write_lock:
            sampler = self._sampler
            if sampler.consumes_items:  # consumed slots first (the writer was checked at construction)
                index = self._writer.add_free_first(data, sampler.free_slots)
            else:
                index = self._writer.add(data)
            if index is not None:  # None: a top-k writer rejected the item
                self._sampler.add(index)
        return index

    def _inv_transform_item(self, data):
        if isinstance(data, TensorDictBase):  # unsqueeze gives a new TensorDict: the caller's is untouched
            out = self._transform.inv(data.unsqueeze(0))
            return None if out is None else out.squeeze(0)
        return self._transform.inv(data)

    def extend(self, data) -> torch.Tensor:
        """Writes a batch (first dim = items, or ``dim_extend``) and returns the written indices.

        The batch is validated before anything is stored (keys and shapes of the stored data, values the stored
        dtypes can hold): a bad batch raises and leaves the buffer unchanged. On a shared buffer the write holds
        the storage's :attr:`write_lock` (see :ref:`shared-writes`).
        """
        data = self._as_stored_batch(data)
        if data is None:
            return torch.zeros((0,), dtype=torch.long)
        return self._write_batch(data)

    def _as_stored_batch(self, data):
        """``data`` through the inverse transforms, items first; ``None`` when the transforms dropped it."""
        if len(self._transform):
            if isinstance(data, TensorDictBase):
                data = data.clone(False)  # transforms edit the structure in place, not the caller's TensorDict
            data = self._transform.inv(data)
            if data is None:
                return None
        if self._dim_extend > 0:
            data = _move_dim_to_front(data, self._dim_extend)
        return data

    def _write_batch(self, data, priority=None) -> torch.Tensor:
        """Writes a batch laid out as the storage expects, and its ``priority`` if given, in one locked step.

        The writer's :meth:`~torchrl.data.Writer.prepare` (validation) runs before the write lock, so writer
        processes overlap it; cursor, rows, counters, sampler and priorities change under the lock.
        """
        with self._replay_lock:
            sampler = self._sampler
            if sampler.consumes_items:  # consumed slots first (the writer was checked at construction)
                with self._storage.write_lock:
                    index = self._writer.extend_free_first(data, sampler.free_slots)
                    sampler.extend(index)
                return index
            data = self._writer.prepare(data)
            with self._storage.write_lock:
                index = self._writer.extend(data)
                self._sampler.extend(index)
                if priority is not None and index.numel():
                    self.update_priority(index, priority)
        return index

    def mark_update(self, index) -> None:
        """Called by the writer after a write; forwards ``index`` to the sampler."""
        self._sampler.mark_update(index, storage=self._storage)

    def update_priority(self, index, priority) -> None:
        """Sets the priority of the items at ``index`` (prioritized samplers only).

        Positions not written yet (``>= len(rb)``) raise an ``IndexError`` and NaN, infinite or negative
        priorities a ``ValueError``; a refused call changes no priority.
        """
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)
        with self._replay_lock, self._storage.write_lock:
            self._sampler.update_priority(index, priority, storage=self._storage)

    def empty(self, empty_write_count: bool = True) -> None:
        """Removes every item; the sampler and writer start over."""
        with self._futures_lock:
            self._prefetch_queue.clear()
        with self._replay_lock, self._storage.write_lock:
            self._writer._empty(empty_write_count=empty_write_count)
            self._sampler._empty()
            self._storage._empty()

    # -- reads --------------------------------------------------------------------------------------------------
    def _resolve_batch_size(self, batch_size) -> int:
        if batch_size is None:
            if self._batch_size is None:
                raise RuntimeError(
                    "No batch size: pass `batch_size` to sample() or to the buffer's constructor "
                    "(ReplayBuffer(..., batch_size=N))."
                )
            return self._batch_size
        return check_positive_int("batch_size", batch_size, type_error=False)

    def sample(self, batch_size: int | None = None, return_info: bool = False):
        """Draws a batch; with ``return_info=True`` returns ``(batch, info)`` where ``info["index"]`` holds
        the sampled positions (and prioritized/slice samplers add their entries)."""
        bs = self._resolve_batch_size(batch_size)
        if self._prefetch and bs == self._batch_size:
            data, info = self._sample_prefetched(bs)
        else:
            data, info = self._sample(bs)
        return (data, info) if return_info else data

    def sample_raw(self, batch_size: int | None = None, return_info: bool = False):
        """:meth:`sample` without the forward transforms (and without the prefetch queue), for a reader that
        runs the transforms itself: a :class:`~torchrl.data.RayReplayBuffer` actor sends raw batches to
        DataLoader workers, which transform them. Takes the buffer's locks as :meth:`sample` does, so it is
        safe from several threads.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, transform=lambda x: x * 10)
            >>> _ = rb.extend(torch.arange(10))
            >>> bool((rb.sample_raw() < 10).all()), bool((rb.sample() % 10 == 0).all())
            (True, True)
        """
        data, info = self._sample(self._resolve_batch_size(batch_size), transform=False)
        return (data, info) if return_info else data

    def _sample_prefetched(self, bs: int):
        with self._futures_lock:  # see NOTE [prefetch epochs] in _prefetch_order
            queue = self._prefetch_queue
            if queue:
                future = queue.popleft()
                result = future.result()
                turn = getattr(future, "draw_turn", None)
                ended = None if turn is None else turn.ran_out
            else:
                result, ended = self._sample(bs), self._sampler.ran_out
            while len(queue) < self._prefetch:
                previous = getattr(self, "_last_draw_turn", None)
                future, self._last_draw_turn = submit_in_order(self._prefetch_executor, self._sample, bs, previous)
                queue.append(future)
        self._epoch_ended = ended
        return result

    def _sample(self, batch_size: int, transform: bool = True):
        turn = current_turn()  # a prefetch task: draw after the task submitted before it
        if turn is not None:
            turn.wait_previous()
        with self._replay_lock:
            try:
                index, info = self._sampler.sample(self._storage, batch_size)
                if turn is not None:
                    turn.ran_out = self._sampler.ran_out
            finally:
                if turn is not None:
                    turn.release()
            unit = self._sample_unit
            if unit is not None:  # see torchrl.data.replay_buffers.sample_units
                index, info = unit.expand(index, info, self._storage)
            info["index"] = index
            if self._writer.tracks_generations:
                info["index_generation"] = self._writer.generations_of(index)
            data = self._storage.get(index) if unit is None else unit.read(self._storage, index)
        if not isinstance(index, int):
            data = self._collate_fn(data)
        if transform and len(self._transform):
            data = self._transform(data)
        if self._pin_memory and torch.cuda.is_available() and hasattr(data, "pin_memory"):
            data = data.pin_memory()
        return data, info

    def __iter__(self):
        """Yields batches of ``batch_size`` until the sampler runs out (endless for samplers that never do)."""
        if self._batch_size is None:
            raise RuntimeError(
                "Iterating a buffer needs its batch size: build it with ReplayBuffer(..., batch_size=N)."
            )
        self._sampler.ran_out = False
        if self._sampler.consumes_items and not len(self):  # everything consumed: no batch
            return
        while True:
            self._epoch_ended = None
            yield self.sample()
            ended = self._epoch_ended  # from a prefetched batch: see NOTE [prefetch epochs]
            if self._sampler.ran_out if ended is None else ended:
                return

    def __getitem__(self, index):
        if isinstance(index, str) or (isinstance(index, tuple) and index and isinstance(index[0], str)):
            return self[:][index]
        with self._replay_lock:
            data = self._storage[index]
        if not isinstance(index, int):
            data = self._collate_fn(data)
        if len(self._transform):
            data = self._transform(data)
        return data

    def __setitem__(self, index, value) -> None:
        if len(self._transform):
            if isinstance(value, TensorDictBase):
                value = value.clone(False)
            value = self._transform.inv(value)
        with self._replay_lock, self._storage.write_lock:
            self._storage[index] = value
            if isinstance(index, slice):
                index = torch.arange(*index.indices(self._storage.rows_written()))
            if not isinstance(index, tuple):  # overwritten items are new items for the sampler
                self._storage.mark_update(index)

    # -- transforms ---------------------------------------------------------------------------------------------
    def append_transform(self, transform, *, invert: bool = False) -> ReplayBuffer:
        """Adds a transform at the end of the sample path (``invert=True``: run ``inv`` on samples)."""
        transform = as_transform(transform)
        self._transform.append(_InvertTransform(transform) if invert else transform)
        return self

    def insert_transform(self, index: int, transform, *, invert: bool = False) -> ReplayBuffer:
        """Inserts a transform at position ``index`` of the sample path."""
        transform = as_transform(transform)
        self._transform.insert(index, _InvertTransform(transform) if invert else transform)
        return self


def _move_dim_to_front(data, dim: int):
    shape = _batch_shape(data)
    if shape is not None and len(shape) <= dim:
        raise ValueError(
            f"extend() writes along dim `dim_extend`={dim} of the data (by default the storage's ndim - 1: an "
            f"ndim=2 storage takes [env, time, ...] batches), but the data has batch shape {list(shape)}. Pass "
            f"data with at least {dim + 1} leading dims (e.g. data.unsqueeze(0) for one env), or use a storage "
            f"with ndim=1 for flat batches."
        )
    if isinstance(data, (torch.Tensor, TensorDictBase)) or hasattr(data, "transpose"):
        return data.transpose(0, dim)
    import torch.utils._pytree as pytree

    return pytree.tree_map(lambda t: t.transpose(0, dim), data)


def _batch_shape(data) -> torch.Size | None:
    """The dims of ``data`` that ``extend`` may index (batch size of a TensorDict/tensorclass, shape of a
    tensor, shortest leaf shape of a pytree); ``None`` when unknown."""
    if isinstance(data, TensorDictBase) or is_tensorclass(data):
        return data.batch_size
    if isinstance(data, torch.Tensor):
        return data.shape
    import torch.utils._pytree as pytree

    shapes = [leaf.shape for leaf in pytree.tree_leaves(data) if isinstance(leaf, torch.Tensor)]
    return min(shapes, key=len) if shapes else None
