"""The replay buffer: a storage, a writer, a sampler and transforms behind one object.

Write path: ``extend(data)`` -> inverse transforms -> ``writer.extend`` (which calls ``storage.set`` and then
``storage.mark_update`` -> ``self.mark_update`` -> ``sampler.mark_update``) -> ``sampler.extend(index)``.
Sample path: ``sample(batch_size)`` -> ``sampler.sample(storage, batch_size)`` -> ``storage.get(index)`` (one
gather) -> ``collate_fn`` -> forward transforms. Sampling and writing hold one re-entrant lock around the
storage, so a thread can extend while another samples (``prefetch=k`` samples ahead in a thread pool: see
NOTE [prefetch epochs] in ``_prefetch.py``).

State: ``state_dict()``, the checkpoint part (``dumps``/``loads``) and pickling are the buffer's own fields
plus its children's (storage, sampler, writer, transforms). Pickling (``pickle``, ``torch.save``, DataLoader
workers) drops the locks and the thread pool and rebuilds them; the batches already prefetched travel with the
buffer, as in TorchRL (``_prefetch.py``), but never with a dataset built over the buffer (``rb.as_dataset()``,
whose workers do not prefetch); the generator state travels as ``bytes``.

Other concepts live in their packages, and the methods here delegate to them: the Hugging Face exchange
(:mod:`~torchrl.data.replay_buffers.hf`), the DataLoader adapter
(:mod:`~torchrl.data.replay_buffers.replay_buffers.dataset`), the checks of arguments and components
(``_checks.py``), the service backends (``_service_backend.py``); and, in private modules beside this one, the
construction and delayed init (``_construction.py``), the write and sample paths (``_writing.py``,
``_batch_layout.py``, ``_sampling.py``), component swaps (``_swapping.py``), the state dict and pickled state
(``_buffer_state.py``) and the checkpoint part (``_buffer_part.py``).
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.hf.export as _hf_export
import torchrl.data.replay_buffers.hf.importer as _hf_import
import torchrl.data.replay_buffers.replay_buffers._buffer_part as _part
import torchrl.data.replay_buffers.replay_buffers._buffer_state as _state
import torchrl.data.replay_buffers.replay_buffers._construction as _construction
import torchrl.data.replay_buffers.replay_buffers._prefetch as _prefetch
import torchrl.data.replay_buffers.replay_buffers._readiness as _readiness
import torchrl.data.replay_buffers.replay_buffers._sampling as _sampling
import torchrl.data.replay_buffers.replay_buffers._swapping as _swapping
import torchrl.data.replay_buffers.replay_buffers._writing as _writing
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state
from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
from torchrl.data.replay_buffers.errors import torchrl_error, torchrl_warning
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.query import query_replay_buffer
from torchrl.data.replay_buffers.replay_buffers._batch_layout import items_in
from torchrl.data.replay_buffers.replay_buffers._checks import (
    check_sample_batch_size,
    share_transform_write_state,
)
from torchrl.data.replay_buffers.replay_buffers._save_hooks import check_save_hook, dump_with_save_hooks
from torchrl.data.replay_buffers.replay_buffers._service_backend import ServiceBackendMeta
from torchrl.data.replay_buffers.replay_buffers.conditional_update import (
    ConditionalUpdateResult,
    conditional_update,
)
from torchrl.data.replay_buffers.replay_buffers.dataset import (
    ReplayBufferDataset,
    unshared_stateful_component,
)
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import RateLimiter
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter, Writer
from torchrl.envs.transforms.transforms import Compose, _InvertTransform, as_transform

# the iterator behind ReplayBuffer.next(), per buffer: kept out of the buffer's __dict__ (never pickled)
_NEXT_ITERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the fields made by _make_runtime_state (and the prefetch chain's last turn): never pickled
_RUNTIME_STATE = ("_replay_lock", "_futures_lock", "_prefetch_queue", "_prefetch_executor", "_last_draw_turn")


def _identity(x):
    return x


class ReplayBuffer(metaclass=ServiceBackendMeta):
    """A replay buffer: writes go through a writer into a storage; samples are drawn by a sampler.

    Keyword Args:
        storage (Storage, optional): where the data lives. Defaults to ``ListStorage(1000)``.
        sampler (Sampler, optional): how batches are drawn. Defaults to :class:`RandomSampler`.
        writer (Writer, optional): where new data goes. Defaults to :class:`RoundRobinWriter`.
            ``storage``, ``sampler`` and ``writer`` may also be zero-argument callables returning one (e.g.
            ``functools.partial(LazyTensorStorage, 100)``), called when the buffer is built.
        collate_fn (callable, optional): turns what ``storage.get`` returns into a batch. Defaults to the
            identity for tensor storages and :func:`~torchrl.data.tensordict_collate` (stacking) for others.
        pin_memory (bool): pin sampled batches (only when CUDA is available). Defaults to ``False``.
        prefetch (int, optional): how many batches to sample ahead in a thread pool. Needs ``batch_size``.
            Prefetched batches are drawn in order, so iterating the buffer still yields exactly one epoch of
            a without-replacement sampler (batches drawn past its end open the next epoch). As in TorchRL, the
            batches sampled ahead are part of ``state_dict()``, ``dumps()`` and pickling, so a restored buffer
            returns the same next batches (a pickled ``rb.as_dataset()``, what DataLoader workers get, leaves
            them out). Defaults to ``None``.
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
            with ``transform`` (TypeError). With it, the buffer is built at its first write unless
            ``delayed_init=False``. Defaults to ``None``.
        consume_after_n_samples (int, optional): draw each item at most this many times until it is
            overwritten: the default sampler becomes ``ConsumingSampler(consume_after_n_samples)`` (see
            :class:`~torchrl.data.ConsumingSampler`; another sampler raises a ``ValueError``). Defaults to ``None``.
        compilable (bool, optional): accepted for TorchRL compatibility and passed to the default storage
            and writer; no effect here (see :class:`~torchrl.data.Storage`). Defaults to ``None``.
        delayed_init (bool, optional): build the components at the first write rather than at construction
            (TorchRL's delayed init; see :attr:`initialized`). Defaults to ``None``: delayed when
            ``transform_factory`` is given, else built at once.
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
        rate_limiter (RateLimiter, optional): a Reverb-style limiter (:class:`~torchrl.data.MinSize`,
            :class:`~torchrl.data.SampleToInsertRatio`) consulted by every sample and write: a sample it does not
            permit raises (``wait=False``) or waits (``wait=True``), and an insert it does not permit waits
            (``extend(data, timeout=...)``). Shared with the processes that share the buffer (see
            :ref:`collectors-and-learners`). Defaults to ``None``.

    Readiness: ``sample(wait=True)`` waits until the sampler can draw the batch (:meth:`can_sample`), woken by
    writes of this process and, within a few milliseconds, of other processes writing into the shared storage;
    ``stats()`` holds the cumulative counters ``write_count``, ``sample_calls`` and ``samples_returned``, which
    checkpoints keep.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
        >>> rb.extend(torch.arange(10))
        tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        >>> rb.sample().shape, len(rb)
        (torch.Size([4]), 10)
    """

    # class defaults of fields added with TorchRL's keywords: a buffer pickled before they existed still unpickles
    _sample_unit = None
    _compilable = False
    _shut_down = False  # set by shutdown(): is_alive is then False
    _initialized = True  # False until a buffer built with delayed init is built (_ready)
    _limiter: RateLimiter | None = None  # the rate limiter (rate_limiter=, RateLimitedReplayBuffer's budget)

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
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        checked = _construction.check_arguments(
            rate_limiter=rate_limiter, transform=transform, transform_factory=transform_factory,
            consume_after_n_samples=consume_after_n_samples, compilable=compilable, delayed_init=delayed_init,
            sample_unit=sample_unit, batch_size=batch_size, prefetch=prefetch, shared=shared, storage=storage,
            sampler=sampler, writer=writer, dim_extend=dim_extend, generator=generator,
        )  # fmt: skip
        self._limiter = rate_limiter
        self._flow = _readiness.FlowState()
        transform, self._compilable, self._sample_unit = checked.transform, checked.compilable, checked.sample_unit
        self._batch_size, storage, sampler, writer = checked.batch_size, checked.storage, checked.sampler, checked.writer
        self._prefetch = int(prefetch or 0)
        args = dict(
            collate_fn=collate_fn, pin_memory=pin_memory, dim_extend=dim_extend, generator=generator, shared=shared,
            consume_after_n_samples=consume_after_n_samples, checkpointer=checkpointer,
        )  # fmt: skip
        if checked.delay:  # TorchRL's delayed init: the components are built by the first write (see _ready)
            self._initialized = False
            self._init_storage, self._init_sampler, self._init_writer = storage, sampler, writer
            self._init_transform, self._init_args = transform, args
            self._init_transform_factory = transform_factory
            self._rng = None
            self._make_runtime_state()
            return
        self._initialized = True
        self._build(*_construction.built_components(storage, sampler, writer, transform, None), **args)

    def _build(
        self, storage, sampler, writer, transform, *, collate_fn, pin_memory, dim_extend, generator, shared,
        consume_after_n_samples, checkpointer,
    ) -> None:  # fmt: skip
        """Builds and wires the components (at construction, or at the first write of a delayed buffer); the
        defaults and checks are ``_construction.py``'s."""
        self._storage, self._sampler, self._writer = _construction.checked_components(
            storage, sampler, writer, compilable=self._compilable, default_writer=self._default_writer,
            consume_after_n_samples=consume_after_n_samples, prefetch=self._prefetch, batch_size=self._batch_size,
            checkpointer=checkpointer,
        )  # fmt: skip
        self._storage.attach(self)
        self._writer.register_storage(self._storage)
        self._collate_fn = collate_fn if collate_fn is not None else self._default_collate()
        self._transform = self._as_compose(transform)
        self._pin_memory = bool(pin_memory)
        self._dim_extend = self._storage.ndim - 1 if dim_extend is None else dim_extend
        self._shared = bool(shared)
        self._rng: torch.Generator | None = None
        if not hasattr(self, "_replay_lock"):
            self._make_runtime_state()
        if shared:
            self.share(True)
        self.set_rng(generator)
        if len(self._storage):  # items already stored: the sampler learns of them (e.g. default priorities)
            self._sampler.mark_update(torch.arange(len(self._storage)), storage=self._storage)

    def _ready(self) -> None:
        """Builds the components of a buffer built with delayed init (TorchRL's ``delayed_init``/
        ``transform_factory``), once: called by the methods that use them, the first write in particular."""
        if self._initialized:
            return
        with self._futures_lock:
            if self._initialized:
                return
            components = _construction.built_components(self._init_storage, self._init_sampler, self._init_writer,
                                                          self._init_transform, self._init_transform_factory)  # fmt: skip
            self._initialized = True  # the methods _build calls (share, set_rng) must not build again
            try:
                self._build(*components, **self._init_args)
            except BaseException:
                self._initialized = False
                raise
            for name in ("_init_storage", "_init_sampler", "_init_writer", "_init_transform", "_init_args",
                         "_init_transform_factory"):
                delattr(self, name)

    # -- construction helpers (the defaults are _construction.py's) ---------------------------------------------
    @staticmethod
    def _default_writer(compilable: bool = False) -> Writer:
        return RoundRobinWriter(compilable=compilable)

    def _default_collate(self):
        return _identity if isinstance(self._storage, TensorStorage) else stack_samples

    @staticmethod
    def _as_compose(transform) -> Compose:
        return _construction.as_compose(transform)

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

        Transforms that declare ``requires_shared_write_state = True`` get their ``share_memory_()`` called; one
        without that method raises a ``RuntimeError`` (as in TorchRL), before anything is shared.
        """
        self._ready()
        if shared:
            share_transform_write_state(self._transform)
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
        self._ready()
        self._writer.share_memory_()
        self._flow.share_memory_()  # the readiness counters and the limiter's reservations: NOTE [readiness and waiting]
        return self

    @property
    def write_lock(self):
        """The storage's write lock (cross-process once the storage is shared), held around every write."""
        self._ready()
        return self._storage.write_lock

    # -- properties ---------------------------------------------------------------------------------------------
    @property
    def storage(self) -> Storage:
        self._ready()
        return self._storage

    @property
    def sampler(self) -> Sampler:
        self._ready()
        return self._sampler

    @property
    def writer(self) -> Writer:
        self._ready()
        return self._writer

    @property
    def collate_fn(self):
        """The function that turns what ``storage.get`` returns into a batch."""
        self._ready()
        return self._collate_fn

    @property
    def transform(self) -> Compose:
        self._ready()
        return self._transform

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def dim_extend(self) -> int:
        self._ready()
        return self._dim_extend

    @property
    def write_count(self) -> int:
        return getattr(self._writer, "write_count", 0) if self._initialized else 0

    @property
    def sample_unit(self):
        """The :class:`~torchrl.data.replay_buffers.sample_units.SampleUnit` that turns drawn positions into
        the positions read (``None``: one item per position)."""
        return self._sample_unit

    @property
    def initialized(self) -> bool:
        """Whether the components (storage, sampler, writer, transforms) are built.

        ``True`` from construction, except for a buffer built with ``delayed_init=True``, or with a
        ``transform_factory`` and ``delayed_init`` left to ``None`` (TorchRL's delayed init): its components
        are built by the first write (or any other use of them), from the instances or zero-argument
        callables it was given; until then ``_init_storage``, ``_init_sampler`` and ``_init_writer`` hold
        them, and :meth:`stats` reports ``initialized: False`` without building anything.

        Examples:
            >>> import torch
            >>> from functools import partial
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=partial(LazyTensorStorage, 10), transform_factory=lambda: (lambda x: x))
            >>> rb.initialized
            False
            >>> _ = rb.extend(torch.arange(3))
            >>> rb.initialized, type(rb.storage).__name__
            (True, 'LazyTensorStorage')
        """
        return self._initialized

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Routes every random draw (sampler, storage, writer) through ``generator``."""
        if not self._initialized:  # delayed init: given to the components when they are built
            self._init_args["generator"] = generator
            return
        self._rng = generator
        for component in (self._storage, self._sampler, self._writer):
            component._rng = generator

    def __len__(self) -> int:
        """The number of stored items (cells for ``ndim > 1``); with a sampler that consumes items
        (:class:`~torchrl.data.ConsumingSampler`), the number of items that can still be drawn."""
        if not self._initialized:
            return 0
        if self._sampler.consumes_items:
            return self._sampler.num_sampleable(self._storage)
        return len(self._storage)

    def __repr__(self) -> str:
        if not self._initialized:
            return f"{type(self).__name__}(initialized=False, storage={self._init_storage!r}, batch_size={self._batch_size})"
        return (
            f"{type(self).__name__}(storage={self._storage!r}, sampler={self._sampler!r}, "
            f"writer={self._writer!r}, batch_size={self._batch_size}, transform={self._transform!r})"
        )

    # -- writes -------------------------------------------------------------------------------------------------
    def add(self, data, *, timeout: float | None = None) -> Any:
        """Writes one item and returns its index.

        A TensorDict with a batch dimension is written as one item (TorchRL warns about it, and so do we, with
        a UserWarning): use :meth:`extend` to write a batch of items. ``timeout``: see :meth:`extend`.
        """
        self._ready()
        with self._insert_gate(1, timeout):
            return self._add_now(data)

    def _add_now(self, data) -> Any:
        if isinstance(data, TensorDictBase) and data.batch_dims >= self._storage.ndim:  # a row of ndim=2: fine
            torchrl_warning("add_batched", batch_size=list(data.batch_size), n=data.batch_size[0])
        if len(self._transform):
            data = self._inv_transform_item(data)
            if data is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        with self._replay_lock, self._storage.write_lock:
            return _writing.add_locked(data, self._writer, self._sampler)

    def _insert_gate(self, n: int, timeout):
        """Around a write of ``n`` items: a rate limiter's permission first, the waiting readers woken after
        (``_writing.insert_gate``)."""
        return _writing.insert_gate(self, self._flow, self._limiter, n, timeout)

    def _inv_transform_item(self, data):
        return _writing.inv_transform_item(self._transform, data)

    def extend(self, data, *, timeout: float | None = None) -> torch.Tensor:
        """Writes a batch (first dim = items, or ``dim_extend``) and returns the written indices.

        The batch is validated before anything is stored (keys and shapes of the stored data, values the stored
        dtypes can hold): a bad batch raises and leaves the buffer unchanged. On a shared buffer the write holds
        the storage's :attr:`write_lock` (see :ref:`shared-writes`).

        Keyword Args:
            timeout (float, optional): with a ``rate_limiter`` that blocks inserts
                (:class:`~torchrl.data.SampleToInsertRatio`), how long to wait for its permission before a
                ``TimeoutError`` (which names the side that waited and the counters). Defaults to ``None``
                (as long as it takes).
        """
        self._ready()
        data = self._as_stored_batch(data)
        if data is None:  # the transforms dropped the whole batch (e.g. a MultiStepTransform holding steps back)
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        return self._write_batch(data, timeout=timeout)

    def _as_stored_batch(self, data):
        """``data`` through the inverse transforms, items first; ``None`` when the transforms dropped it."""
        return _writing.as_stored_batch(data, self._storage, self._transform, self._dim_extend)

    def _write_batch(self, data, priority=None, timeout=None) -> torch.Tensor:
        """Writes a batch laid out as the storage expects, and its ``priority`` if given, in one locked step.

        The writer's :meth:`~torchrl.data.Writer.prepare` (validation) runs before the write lock, so writer
        processes overlap it; cursor, rows, counters, sampler and priorities change under the lock. A rate
        limiter's permission is obtained first, outside every lock (``timeout``: see :meth:`extend`).
        """
        with self._insert_gate(items_in(data), timeout):
            return self._write_batch_now(data, priority)

    def _write_batch_now(self, data, priority) -> torch.Tensor:
        with self._replay_lock:
            return _writing.write_locked(data, priority, self._storage, self._writer, self._sampler, self.update_priority)

    def mark_update(self, index) -> None:
        """Called by the writer after a write; forwards ``index`` to the sampler."""
        self._ready()
        self._sampler.mark_update(index, storage=self._storage)

    def update_priority(self, index, priority) -> None:
        """Sets the priority of the items at ``index`` (prioritized samplers only).

        Positions not written yet (``>= len(rb)``) raise an ``IndexError`` and NaN, infinite or negative
        priorities a ``ValueError``; a refused call changes no priority.
        """
        self._ready()
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)
        with self._replay_lock, self._storage.write_lock:
            self._sampler.update_priority(index, priority, storage=self._storage)

    def empty(self, empty_write_count: bool = True) -> None:
        """Removes every item; the sampler and writer start over."""
        self._ready()
        with self._futures_lock:
            self._prefetch_queue.clear()
        with self._replay_lock, self._storage.write_lock:
            self._writer._empty(empty_write_count=empty_write_count)
            self._sampler._empty()
            self._storage._empty()
        self._flow.reset(samples=empty_write_count)  # a new write count: the sample counts start over with it

    # -- reads --------------------------------------------------------------------------------------------------
    def _resolve_batch_size(self, batch_size) -> int:
        if batch_size is None:
            if self._batch_size is None:
                raise torchrl_error("sample_without_batch_size")
            return self._batch_size
        return check_sample_batch_size(batch_size)

    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        *,
        wait: bool = False,
        timeout: float | None = None,
        cancel_event=None,
    ):
        """Draws a batch; with ``return_info=True`` returns ``(batch, info)`` where ``info["index"]`` holds
        the sampled positions (and prioritized/slice samplers add their entries).

        Args:
            batch_size (int, optional): the number of items. Defaults to the buffer's ``batch_size``.
            return_info (bool): also return the info dict. Defaults to ``False``.

        Keyword Args:
            wait (bool): wait until the buffer can serve the batch (:meth:`can_sample`; with a rate limiter,
                until it permits the sample) instead of failing. Writes of this process wake the wait at once,
                writes of other processes into the shared storage within a few milliseconds. An advisory gate:
                another reader may take the data first. Defaults to ``False`` (no check: the sampler's own error
                when it cannot draw; a limiter's refusal raises a ``RuntimeError``).
            timeout (float, optional): the longest wait in seconds before a ``TimeoutError`` that says what
                to do. Defaults to ``None`` (as long as it takes).
            cancel_event (optional): any object with ``is_set()`` (``threading.Event``,
                ``multiprocessing.Event``): once set, the wait ends with a ``RuntimeError``. :meth:`shutdown`
                ends it too. Defaults to ``None``.

        Examples:
            >>> import threading, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
            >>> rb.can_sample()
            False
            >>> writer = threading.Timer(0.01, rb.extend, args=(torch.arange(4),))
            >>> writer.start()
            >>> rb.sample(wait=True, timeout=10.0).shape
            torch.Size([4])
            >>> writer.join()
            >>> rb.stats()["sample_calls"], rb.stats()["samples_returned"]
            (1, 4)
        """
        # every line here runs on each sample; readiness must cost nothing measurable beside the draw when
        # nothing waits (issue 27: benchmarks/readiness_cost.py), so the common cases are written out
        if not self._initialized:
            self._ready()
        bs = self._batch_size if batch_size is None and self._batch_size is not None else (
            self._resolve_batch_size(batch_size))  # fmt: skip
        waits = wait is not False or timeout is not None or cancel_event is not None
        if waits and (wait is not True or timeout is not None or cancel_event is not None):
            timeout = _readiness.check_wait_args(wait, timeout, cancel_event)
        limiter = self._limiter
        if self._prefetch and bs == self._batch_size:
            if waits or limiter is not None:
                data, info = self._gated_sample(bs, wait, timeout, cancel_event)
            else:
                data, info = self._sample_prefetched(bs, self._counted_draw)
        elif limiter is not None:  # reserve, draw, commit (shut down: raises)
            data, info = _readiness.limited_draw(
                self, self._flow, limiter, bs, wait, timeout, cancel_event, self._sample, self._sampler,
                self._storage, self._writer,
            )  # fmt: skip
        else:
            if wait and (cancel_event is not None or not self._sampler.can_sample(self._storage, bs)):
                _readiness.wait_for_data(self, self._flow, bs, timeout=timeout, cancel_event=cancel_event)
            data, info = self._sample(bs)
            self._flow.count_batch(info, bs)
        return (data, info) if return_info else data

    def query(self, predicate=None, *, trajectory_key=None) -> list:
        """The stored trajectories that ``predicate`` accepts, oldest first (TorchRL's ``ReplayBuffer.query``).

        Reads the storage once under the buffer's lock; see
        :func:`~torchrl.data.replay_buffers.query.query_replay_buffer` for the splitting signal, the
        transforms and the ``traj`` predicates.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, traj
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> rb.extend(TensorDict(episode=torch.tensor([0, 0, 0, 1, 1]), reward=torch.ones(5), batch_size=[5]))
            tensor([0, 1, 2, 3, 4])
            >>> [t.length for t in rb.query(traj.total_reward > 2)]
            [3]
        """
        self._ready()
        with self._replay_lock:
            return query_replay_buffer(self, predicate, trajectory_key=trajectory_key)

    def can_sample(self, batch_size: int | None = None) -> bool:
        """Whether :meth:`sample` can serve a batch of ``batch_size`` (default: the buffer's) now: the sampler
        can draw it (:meth:`Sampler.can_sample <torchrl.data.replay_buffers.Sampler.can_sample>`: non-empty,
        enough items left to consume, ...), and a rate limiter, if any, permits it.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
            >>> rb.can_sample(), rb.extend(torch.arange(2)).numel(), rb.can_sample()
            (False, 2, True)
        """
        return _readiness.can_sample(self, self._flow, self._limiter, self._resolve_batch_size(batch_size))

    def _gated_sample(self, bs: int, wait, timeout, cancel_event):
        """:meth:`sample` through the prefetch queue with a wait, a timeout, a cancel event or a rate limiter
        (see ``_readiness.py``); ``timeout`` is checked already."""
        now = functools.partial(_readiness.gated_draw, self, self._flow, self._limiter, wait=wait, timeout=timeout,
                                cancel_event=cancel_event, draw=self._sample)  # fmt: skip
        return self._sample_prefetched(bs, now)

    def _counted_draw(self, bs: int, transform: bool = True):
        """One draw, counted in ``sample_calls`` and ``samples_returned`` (the fast path of :meth:`sample`)."""
        data, info = self._sample(bs, transform)
        self._flow.count_batch(info, bs)
        return data, info

    def sample_raw(self, batch_size: int | None = None, return_info: bool = False, *, wait: bool = False,
                   timeout: float | None = None, cancel_event=None):  # fmt: skip
        """:meth:`sample` without the forward transforms (and without the prefetch queue), for a reader that
        runs the transforms itself: a :class:`~torchrl.data.RayReplayBuffer` actor sends raw batches to
        DataLoader workers, which transform them. Takes the buffer's locks as :meth:`sample` does, so it is
        safe from several threads; counted like a sample, and a rate limiter's refusal raises (``wait``,
        ``timeout`` and ``cancel_event`` as in :meth:`sample`).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, transform=lambda x: x * 10)
            >>> _ = rb.extend(torch.arange(10))
            >>> bool((rb.sample_raw() < 10).all()), bool((rb.sample() % 10 == 0).all())
            (True, True)
        """
        self._ready()
        if wait is not False or timeout is not None or cancel_event is not None:
            timeout = _readiness.check_wait_args(wait, timeout, cancel_event)
        data, info = _readiness.gated_draw(
            self, self._flow, self._limiter, self._resolve_batch_size(batch_size), wait=wait, timeout=timeout,
            cancel_event=cancel_event, draw=functools.partial(self._sample, transform=False),
        )  # fmt: skip
        return (data, info) if return_info else data

    def _sample_prefetched(self, bs: int, now):
        """The next batch of the prefetch queue (``now(bs)`` draws one when it is empty), then tops the queue up.

        With a rate limiter, a batch is only prefetched when the limiter permits it at once: its records are
        reserved when the task is queued and counted when it draws, so batches sampled ahead count against the
        budget (a cancelled task releases its reservation)."""
        with self._futures_lock:  # see NOTE [prefetch epochs] in _prefetch.py
            result, ended, self._last_draw_turn = _sampling.next_prefetched(
                self, self._prefetch_queue, bs, now, capacity=self._prefetch, executor=self._prefetch_executor,
                sampler=self._sampler, limiter=self._limiter, flow=self._flow, counted_draw=self._counted_draw,
                sample=self._sample, previous=getattr(self, "_last_draw_turn", None),
            )  # fmt: skip
        self._epoch_ended = ended
        return result

    def _sample(self, batch_size: int, transform: bool = True):
        """One draw: ``(batch, info)``, through the forward transforms unless ``transform=False`` (see
        ``_sampling.py``); subclasses extend it (e.g. HER relabels the batch)."""
        turn = _sampling.wait_for_turn()  # a prefetch task: draw after the task submitted before it
        with self._replay_lock:
            data, info = _sampling.read_drawn(self._sampler, self._storage, self._writer, batch_size,
                                              unit=self._sample_unit, turn=turn)  # fmt: skip
        return _sampling.finish_batch(data, info, self._collate_fn, self._transform if transform else None,
                                      self._pin_memory)  # fmt: skip

    def __iter__(self):
        """Yields batches of ``batch_size`` until the sampler runs out (endless for samplers that never do)."""
        self._ready()
        if self._batch_size is None:
            raise torchrl_error("iterate_without_batch_size")
        self._sampler.ran_out = False
        if self._sampler.consumes_items and not len(self):  # everything consumed: no batch
            return
        while True:
            self._epoch_ended = None
            yield self.sample()
            ended = self._epoch_ended  # from a prefetched batch: see NOTE [prefetch epochs] in _prefetch.py
            if self._sampler.ran_out if ended is None else ended:
                return

    def __getitem__(self, index):
        self._ready()
        if isinstance(index, str) or (isinstance(index, tuple) and index and isinstance(index[0], str)):
            return self[:][index]
        with self._replay_lock:
            data = self._storage.get_in_layout(index, self._dim_extend)  # [envs, time] for ndim=2
        if not isinstance(index, int):
            data = self._collate_fn(data)
        if len(self._transform):
            data = self._transform(data)
        return data

    def __setitem__(self, index, value) -> None:
        """Writes ``value`` at ``index`` of the storage (through the inverse transforms).

        ``value`` may be a view of the stored data (e.g. what :meth:`read_all_in_order` returned, plus a new
        entry, which becomes a stored entry): it is cloned first when its memory overlaps the storage's.
        """
        self._ready()
        if len(self._transform):
            if isinstance(value, TensorDictBase):
                value = value.clone(False)
            value = self._transform.inv(value)
        with self._replay_lock, self._storage.write_lock:
            _writing.set_rows(self._storage, index, value, self._dim_extend)
        self._flow.notify()

    # -- transforms ---------------------------------------------------------------------------------------------
    def append_transform(self, transform, *, invert: bool = False) -> ReplayBuffer:
        """Adds a transform at the end of the sample path (``invert=True``: run ``inv`` on samples).

        On a shared buffer, a transform with ``requires_shared_write_state = True`` gets its ``share_memory_()``
        called; one without that method raises a ``RuntimeError`` (as in TorchRL) and is not added.
        """
        self._ready()
        transform = as_transform(transform)
        if self._shared:
            share_transform_write_state(transform)
        self._transform.append(_InvertTransform(transform) if invert else transform)
        return self

    def insert_transform(self, index: int, transform, *, invert: bool = False) -> ReplayBuffer:
        """Inserts a transform at position ``index`` of the sample path (a shared buffer checks and shares its
        write state as :meth:`append_transform` does)."""
        self._ready()
        transform = as_transform(transform)
        if self._shared:
            share_transform_write_state(transform)
        self._transform.insert(index, _InvertTransform(transform) if invert else transform)
        return self

    # -- statistics ---------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``{"size", "write_count", "prefetch_queue_size", "initialized"}``, plus ``"capacity"`` and
        ``"utilization"`` (size / capacity) for a storage of finite capacity, the cumulative readiness counters
        ``"sample_calls"`` and ``"samples_returned"`` (records drawn, prefetched batches included), and
        ``"sampleable_size"``; a rate limiter adds its entries (``"samples_per_insert"`` observed,
        ``"target_samples_per_insert"``, ``"reserved_samples"``, ``"sample_wait_count"``, ...). A buffer built with delayed init
        (see :attr:`initialized`) is not built by this call: it reports ``initialized: False``, size 0, and the
        capacity of the storage it was given (when it was given an instance).

        Examples:
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), delayed_init=True)
            >>> stats = rb.stats()
            >>> stats["initialized"], stats["size"], stats["capacity"], rb.initialized
            (False, 0, 10, False)
        """
        storage = self._storage if self._initialized else self._init_storage
        out = {
            "size": len(self),
            "write_count": self.write_count,
            "prefetch_queue_size": len(self._prefetch_queue),
            "initialized": self._initialized,
        }
        capacity = getattr(storage, "max_size", None) if isinstance(storage, Storage) else None
        if capacity is not None and capacity < torch.iinfo(torch.int64).max:
            out["capacity"] = int(capacity)
            out["utilization"] = len(self) / capacity if capacity else 0.0
        out.update(_readiness.flow_stats(self, self._flow, self._limiter))
        return out

    # -- in-place edits of the stored data (TorchRL's set_, set_at_, update_, update_if_present) ----------------
    def _edit_rows(self, index, edit) -> None:
        self._ready()
        with self._replay_lock, self._storage.write_lock:
            _writing.edit_rows(self._storage, index, edit)

    def set_(self, key, value) -> None:
        """Sets entry ``key`` of every stored item to ``value`` (shaped like the stored rows)."""
        self._edit_rows(None, lambda data: data.set_(key, value))

    def set_at_(self, key, value, index) -> None:
        """Sets entry ``key`` of the stored items at ``index`` (rows) to ``value``."""
        self._edit_rows(torch.as_tensor(index, dtype=torch.long), lambda data: data.set_(key, value))

    def update_(self, tensordict: TensorDictBase, clone: bool = False, *, keys_to_update=None) -> None:
        """Updates the stored items in place with the entries of ``tensordict`` (shaped like the stored rows)."""
        src = tensordict.clone() if clone else tensordict
        self._edit_rows(None, lambda data: data.update_(src, keys_to_update=keys_to_update))

    def read_all_in_order(self, end: int | None = None):
        """The stored items in storage order, up to ``end`` (``rb[:end]``)."""
        return self[:end]

    def write_all(self, data, end: int | None = None) -> None:
        """Overwrites the stored items up to ``end`` (``rb[:end] = data``)."""
        self[:end] = data

    def update_if_present(
        self, *, index, generation, patch, version_key=None, version=None, require_newer=False
    ) -> ConditionalUpdateResult:
        """Writes ``patch`` into the records at ``index`` that were not overwritten since they were read.

        ``generation`` is what ``info["index_generation"]`` held when the records were sampled (or
        ``writer.generations_of(index)`` after ``extend``); a record whose generation changed since
        (overwritten or emptied) is left alone. ``patch`` is a dict ``{str or tuple key: tensor}`` or a
        TensorDict; each value is reshaped to ``(n_records, *stored feature shape)``. With ``version_key``, a
        record is also left alone when its stored version is newer than ``version`` (or not older, with
        ``require_newer=True``); written records get ``version`` in that entry. Everything is checked before
        anything is written. Needs a tensor storage and a writer built with ``track_generations=True``. See
        :func:`~torchrl.data.replay_buffers.replay_buffers.conditional_update.conditional_update`.

        Returns:
            ConditionalUpdateResult: the ``updated`` and ``version_rejected`` masks over ``index``, and counts.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter
            >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
            ...                             writer=TensorDictRoundRobinWriter(track_generations=True))
            >>> index = rb.extend(TensorDict(obs=torch.zeros(3), v=torch.zeros(3), batch_size=[3]))
            >>> result = rb.update_if_present(index=index, generation=rb.writer.generations_of(index),
            ...                               patch={"obs": torch.ones(3)}, version_key="v",
            ...                               version=torch.tensor([1.0, 1.0, -1.0]))
            >>> result.updated.tolist(), result.version_rejected_count, rb[:3]["obs"].tolist()
            ([True, True, False], 1, [1.0, 1.0, 0.0])
        """
        self._ready()
        return conditional_update(
            self._storage, self._writer, self._replay_lock, index=index, generation=generation, patch=patch,
            version_key=version_key, version=version, require_newer=require_newer,
        )  # fmt: skip

    # -- persistent iteration (next) and TorchRL's checkpoint hooks ---------------------------------------------
    def next(self):
        """One batch of a persistent iteration over the buffer (see ``__iter__``); ``None`` once the sampler
        ran out, after which the next call starts a new pass."""
        self._ready()
        iterator = _NEXT_ITERATORS.get(self)
        if iterator is None:
            iterator = _NEXT_ITERATORS[self] = iter(self)
        try:
            return next(iterator)
        except StopIteration:
            _NEXT_ITERATORS.pop(self, None)
            return None

    def register_save_hook(self, hook) -> None:
        """Registers ``hook(data, path=path)``, run by :meth:`dumps` on the stored items: its return value is
        what is saved (TorchRL's save hooks; the buffer itself is unchanged).

        Before the call, a hook that has the attributes ``shift`` and ``is_full`` gets ``shift`` set to the row
        after the last one written and ``is_full`` to whether the storage is full. The hook must return the
        items with their stored layout (the checkpoint format stays tensor files plus JSON). Needs a tensor
        storage (``TypeError`` otherwise).

        Examples:
            >>> import tempfile, torch
            >>> from torchrl.data import LazyMemmapStorage, ReplayBuffer
            >>> class Double:
            ...     shift = is_full = None
            ...     def __call__(self, data, path=None):
            ...         return data * 2
            >>> rb = ReplayBuffer(storage=LazyMemmapStorage(10))
            >>> _ = rb.extend(torch.arange(5))
            >>> hook = Double()
            >>> rb.register_save_hook(hook)
            >>> with tempfile.TemporaryDirectory() as d:
            ...     rb.dumps(d + "/ckpt")
            ...     fresh = ReplayBuffer(storage=LazyMemmapStorage(10))
            ...     fresh.loads(d + "/ckpt")
            >>> hook.shift, hook.is_full, fresh[:].tolist(), rb[:].tolist()
            (5, False, [0, 2, 4, 6, 8], [0, 1, 2, 3, 4])
        """
        self._ready()
        check_save_hook(hook, self._storage)
        self.__dict__.setdefault("_save_hooks", []).append(hook)

    def register_load_hook(self, hook) -> None:
        """Forwarded to the storage's checkpointer, which refuses hooks (see :meth:`register_save_hook`)."""
        self._ready()
        self._storage.checkpointer.register_load_hook(hook)

    # -- swapping components (set_storage, set_writer, set_sampler) and shutdown --------------------------------
    def _swap(self, attribute: str, component, wire) -> object:
        """Replaces ``self.<attribute>`` by ``component`` once no prefetch task runs, then calls ``wire()``."""
        self._ready()
        with self._futures_lock:
            _prefetch.wait(self._prefetch_queue)  # before the replay lock, which prefetch tasks take
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
        _swapping.check_swap("storage", storage=storage, sampler=self._sampler, writer=self._writer,
                             prefetch=self._prefetch, batch_size=self._batch_size)  # fmt: skip

        def wire(previous: Storage) -> None:
            _swapping.move_to_storage(self, previous, storage, self._writer, shared=self._shared)
            self._collate_fn = collate_fn if collate_fn is not None else self._default_collate()
            self._dim_extend = min(self._dim_extend, storage.ndim - 1)
            self.set_rng(self._rng)  # routes the buffer's generator to the new storage
            _swapping.announce_items(self._sampler, storage)

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
        _swapping.check_swap("writer", storage=self._storage, sampler=self._sampler, writer=writer,
                             prefetch=self._prefetch, batch_size=self._batch_size)  # fmt: skip

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
        _swapping.check_swap("sampler", storage=self._storage, sampler=sampler, writer=self._writer,
                             prefetch=self._prefetch, batch_size=self._batch_size)  # fmt: skip

        def wire(previous: Sampler) -> None:
            self.set_rng(self._rng)
            if self._shared and sampler.requires_shared_state and sampler.can_share_state:
                sampler.share_memory_()
            _swapping.announce_items(sampler, self._storage)

        return self._swap("_sampler", sampler, wire)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the threads that sample ahead (``prefetch``): waits up to ``timeout`` seconds (``None``: as long
        as it takes) for the batches in flight, drops them, and samples without prefetching from then on. A
        buffer without prefetching has nothing to stop; :attr:`is_alive` is ``False`` from then on, and a second
        call does nothing. (TorchRL's service API: on a
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
        timeout = _sampling.check_shutdown_timeout(timeout)
        with self._futures_lock:
            pending, executor = list(self._prefetch_queue), self._prefetch_executor
            self._prefetch_queue.clear()
            self._prefetch_executor, self._prefetch = None, 0
            self._shut_down = True
        self._flow.close()  # waiting samples and writes end (RuntimeError), in every process sharing the buffer
        _sampling.stop_prefetching(pending, executor, timeout)

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of every component; as in TorchRL, ``"_prefetch_state"`` holds the batches sampled ahead
        (``prefetch``) and not returned yet, so that a restored buffer returns the same next batches."""
        self._ready()
        with self._futures_lock:  # after the tasks in flight: their draws moved the sampler and the generator
            prefetched = _prefetch.capture(self._prefetch_queue, self._prefetch)
        return _state.buffer_state_dict(prefetched, self._checkpoint_children(), batch_size=self._batch_size,
                                        rng=self._rng, flow=self._flow)  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state of :meth:`state_dict`, prefetched batches included.

        The saved prefetch queue is checked first: one saved by a buffer of another ``prefetch`` capacity raises
        a ``RuntimeError`` (a ``ValueError`` too) and leaves this buffer, its queue included, unchanged. The
        prefetch tasks in flight finish (holding the buffer's futures lock, so that no new one starts) before
        the components are loaded: a draw made after the load would move the restored sampler and generator.
        """
        self._ready()
        prefetched, readiness = _state.check_state_dict(state_dict, self._sampler, self._prefetch)
        with self._futures_lock:
            _prefetch.wait(self._prefetch_queue)  # before the replay lock, which prefetch tasks take
            with self._replay_lock, self._storage.write_lock:
                _state.load_children_state(state_dict, self._checkpoint_children())
                self._batch_size = state_dict.get("_batch_size", self._batch_size)
                rng = generator_from_state(state_dict.get("_rng"))
                if rng is not None:
                    self.set_rng(rng)
                if readiness is not None:
                    self._flow.load_state_dict(readiness)
            # the components hold the state the saved batches were drawn from: they replace the queue
            self._prefetch_queue.clear()
            self._prefetch_queue.extend(prefetched)

    def __getstate__(self):
        prefetched = None
        if _state.keeps_prefetched():  # a process being started, or a dataset's copy, never gets the batches
            with self._futures_lock:
                prefetched = _prefetch.capture(self._prefetch_queue, self._prefetch)
        return _state.pickled_state(self.__dict__, _RUNTIME_STATE, rng=self._rng, prefetched=prefetched)

    def __setstate__(self, state):
        rng, prefetched = _state.unpickled_extras(state)
        self.__dict__.update(state)
        if "_flow" not in self.__dict__:  # pickled before readiness existed
            self._flow = _readiness.FlowState()
        self._make_runtime_state()
        self._prefetch_queue.extend(_prefetch.restore(prefetched, self._prefetch))
        if self._initialized:  # a buffer with delayed init builds its components at its first write
            self._storage.attach(self)
            self._writer.register_storage(self._storage)
            self.set_rng(rng)

    # -- persistence: dumps/loads -------------------------------------------------------------------------------
    def dumps(self, path, **kwargs) -> None:
        """Saves the buffer (storage, writer, sampler, transforms, generator) to the directory ``path``.

        The format is memory-mapped tensor files plus JSON metadata, without pickle, written atomically (a
        crash leaves the previous checkpoint at ``path``); see :mod:`torchrl.data.replay_buffers.checkpointers`.
        Keyword arguments (``fsync=True``, ``progress=None``) go to
        :func:`~torchrl.data.replay_buffers.checkpointers.dump_component`.

        Examples:
            >>> import tempfile, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
            >>> _ = rb.extend(torch.arange(4))
            >>> with tempfile.TemporaryDirectory() as d:
            ...     rb.dumps(d + "/ckpt")
            ...     fresh = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
            ...     fresh.loads(d + "/ckpt")
            >>> fresh[:]
            tensor([0, 1, 2, 3])
        """
        self._ready()
        with self._futures_lock:
            _prefetch.wait(self._prefetch_queue)  # before the replay lock, which prefetch tasks take
            with self._replay_lock:
                hooks = self.__dict__.get("_save_hooks")
                if hooks:  # see register_save_hook
                    with self._storage.write_lock:
                        dump_with_save_hooks(self._storage, hooks, path, lambda: dump_component(self, path, **kwargs))
                else:
                    dump_component(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a buffer saved by :meth:`dumps` into this one (built with the same configuration).

        Everything is checked before anything is loaded; a refused checkpoint leaves the buffer, its prefetch
        queue included, unchanged (prefetched batches of another ``prefetch`` capacity: ``RuntimeError``).
        """
        self._ready()
        with self._futures_lock:
            _prefetch.wait(self._prefetch_queue)  # before the replay lock, which prefetch tasks take
            with self._replay_lock, self._storage.write_lock:
                load_component(self, path)

    dump = dumps
    save = dumps
    load = loads

    # -- checkpoint part (the protocol of _checkpoint/parts.py; the part's layout: _buffer_part.py) -------------
    checkpoint_role = "replay buffer"

    def _checkpoint_children(self) -> dict[str, Any]:
        return {"storage": self._storage, "sampler": self._sampler, "writer": self._writer, "transforms": self._transform}

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        """The buffer's part: its children's, its batch size, generator, readiness counters and prefetched
        batches (as in TorchRL); see ``_buffer_part.py``."""
        self._ready()
        with self._futures_lock:  # the prefetched batches, as in TorchRL (JSON + tensors, see _prefetch.py)
            prefetched = _prefetch.capture(self._prefetch_queue, self._prefetch)
        return _part.dump_buffer_part(self, self._checkpoint_children(), ctx, batch_size=self._batch_size,
                                      rng=self._rng, flow=self._flow, prefetched=prefetched)  # fmt: skip

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        """Checks a part of :meth:`checkpoint_part` and its children's before anything is loaded."""
        self._ready()
        _part.check_buffer_part(self, self._checkpoint_children(), doc, tensors, ctx, prefetch=self._prefetch)

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        """Loads a checked part: the children (put back if one raises), then the buffer's own fields."""
        self._ready()
        _part.load_children(self._checkpoint_children(), doc, tensors, ctx)
        self._batch_size = doc["batch_size"]
        rng = _part.saved_generator(doc, tensors, ctx.path)
        if rng is not None:
            self.set_rng(rng)
        self._flow.load_state_dict(doc.get("readiness", {}))  # a checkpoint without counters: they start at 0
        prefetched = _prefetch.from_part(doc.get("prefetch"), tensors)
        with self._futures_lock:  # the saved batches replace the queue
            self._prefetch_queue.clear()
            self._prefetch_queue.extend(_prefetch.restore(prefetched, self._prefetch))

    # -- TorchRL's service API, in this process (service_backend="direct") --------------------------------------
    # Code written for a buffer hosted by a service (a RayReplayBuffer) runs unchanged on a direct buffer. The
    # metaclass (_service_backend.py) reads the service keywords of the constructor.
    @property
    def service_backend(self) -> str:
        """``"direct"``: the buffer lives in this process (``"ray"`` on a :class:`~torchrl.data.RayReplayBuffer`)."""
        return "direct"

    @property
    def is_alive(self) -> bool:
        """``True`` until :meth:`shutdown` (as TorchRL's service API says of a service), ``False`` after it.

        Examples:
            >>> from torchrl.data import ReplayBuffer
            >>> rb = ReplayBuffer()
            >>> rb.is_alive, rb.start() is rb
            (True, True)
            >>> rb.shutdown(); rb.shutdown()  # the second call does nothing
            >>> rb.is_alive
            False
        """
        return not self._shut_down

    def start(self):
        """Returns the buffer (there is nothing to start in this process)."""
        return self

    def client(self):
        """Returns the buffer: in this process, the buffer is its own client."""
        return self

    # -- DataLoader adapters: as_dataset and the hooks ReplayBufferDataset calls --------------------------------
    def as_dataset(
        self,
        *,
        num_batches: int | None = None,
        transport: str = "ring",
        share_sampler: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> ReplayBufferDataset:
        """An iterable :class:`torch.utils.data.IterableDataset` of sampled batches, for DataLoader workers.

        Read it with ``rb.as_dataset(...).loader(num_workers=...)``
        (:meth:`ReplayBufferDataset.loader <torchrl.data.ReplayBufferDataset.loader>`), which builds
        ``DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, num_workers=...)``: each item
        already is a batch, so a DataLoader built by hand needs ``batch_size=None`` and
        ``collate_fn=tensordict_collate`` too.

        See :class:`~torchrl.data.ReplayBufferDataset` for ``num_batches``, ``transport`` (how worker
        processes send batches back: ``"ring"``, ``"consolidated"`` or ``"torch"``), ``share_sampler``
        (a stateful sampler's state moves to shared memory, see :ref:`stateful-samplers-in-workers`) and
        ``rank``/``world_size`` (data-parallel ranks; read from :mod:`torch.distributed` when not given), and
        ``wait``/``timeout`` (each draw waits for data or a rate limiter's permission).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
            >>> _ = rb.extend(torch.arange(10))
            >>> dataset = rb.as_dataset(num_batches=2)
            >>> len(dataset), [batch.shape for batch in dataset.loader(num_workers=0)]
            (2, [torch.Size([4]), torch.Size([4])])
        """
        self._ready()
        return ReplayBufferDataset(
            self, num_batches=num_batches, transport=transport, share_sampler=share_sampler, rank=rank,
            world_size=world_size, wait=wait, timeout=timeout,
        )

    def stateful_component(self) -> tuple[str, Any] | None:
        """The first component whose state a copy of the buffer in another process would duplicate, if any.

        ``("sampler", sampler)`` or ``("storage", storage)`` when that component declares
        ``requires_shared_state = True`` (an epoch permutation, priorities, a stream position) and its state
        is not in shared memory already (``can_share_state`` and ``is_shared``, see
        :meth:`Sampler.share_memory_ <torchrl.data.replay_buffers.Sampler.share_memory_>`), else ``None``.
        A dataset read by DataLoader workers holds one copy of the buffer per worker: it shares such a
        component's state if it can, else refuses the buffer (:class:`~torchrl.data.ReplayBufferDataset`) or
        warns about it.

        Examples:
            >>> from torchrl.data import ReplayBuffer, SamplerWithoutReplacement
            >>> ReplayBuffer().stateful_component() is None
            True
            >>> ReplayBuffer(sampler=SamplerWithoutReplacement()).stateful_component()[0]
            'sampler'
        """
        self._ready()
        return unshared_stateful_component((("sampler", self._sampler), ("storage", self._storage)))

    def pin_epoch(self, key: int | None = None, readers: int = 1) -> None:
        """Pins the sampler's draws in this process to its epoch in progress (samplers without replacement):
        once that epoch ended, in this process or another one sharing the sampler, :meth:`sample` raises
        :class:`~torchrl.data.EpochEnded` until :meth:`unpin_epoch`. A no-op for
        samplers that never run out. :class:`~torchrl.data.ReplayBufferDataset` pins each DataLoader iteration
        with ``num_batches=None``; see :meth:`Sampler.pin_epoch <torchrl.data.replay_buffers.Sampler.pin_epoch>`
        for ``key`` and ``readers``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
            >>> from torchrl.data import EpochEnded
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(), batch_size=4)
            >>> _ = rb.extend(torch.arange(8))
            >>> rb.pin_epoch()
            >>> epoch = [rb.sample(), rb.sample()]
            >>> try:
            ...     rb.sample()
            ... except EpochEnded:
            ...     print("one epoch:", sorted(torch.cat(epoch).tolist()))
            one epoch: [0, 1, 2, 3, 4, 5, 6, 7]
            >>> rb.unpin_epoch()
        """
        self._ready()
        self._sampler.pin_epoch(key, readers)

    def unpin_epoch(self) -> None:
        """Ends :meth:`pin_epoch`."""
        self._sampler.unpin_epoch()

    def prepare_worker_copy(self, seed: int) -> None:
        """Readies this object, a copy of the buffer held by a DataLoader worker, to sample in that worker.

        Turns prefetching off, gives the copy fresh locks and an empty prefetch queue, and reseeds its
        ``torch.Generator`` (if it was built with one) from ``seed``. Call it once per worker, before the first
        sample, with ``torch.utils.data.get_worker_info().seed``: workers then draw distinct streams, epochs
        differ, and a DataLoader with a fixed ``generator`` reproduces them. Never call it on the buffer the
        main process uses.

        Args:
            seed (int): the worker's seed (reduced modulo ``2**63``).

        Examples:
            >>> import pickle, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, generator=torch.Generator())
            >>> _ = rb.extend(torch.arange(10))
            >>> copy = pickle.loads(pickle.dumps(rb))  # what a DataLoader worker holds
            >>> copy.prepare_worker_copy(seed=7)
            >>> first = copy.sample()
            >>> copy.prepare_worker_copy(seed=7)
            >>> torch.equal(first, copy.sample())
            True
        """
        self._ready()
        self._prefetch = 0
        self._make_runtime_state()
        if self._rng is not None:
            self._rng.manual_seed(int(seed) % (2**63))

    # -- Hugging Face datasets (the logic is in hf/) ------------------------------------------------------------
    def export_hf(self, path=None, **kwargs):
        """Writes the stored items as a Hugging Face dataset (``save_to_disk`` format) and returns it.

        Each tensor entry becomes a column: nested keys are joined by ``"."`` (``("next", "reward")`` ->
        ``"next.reward"``), scalars are ``Value`` columns, 1-D items fixed-length ``List`` columns, 2- to 5-D
        items ``Array2D`` ... ``Array5D`` columns (other shapes are stored flat and reshaped on import), items of
        a :class:`~torchrl.data.ListStorage` that differ in shape a variable-length ``List`` plus a
        ``<column>__shape`` column. ``torchrl_export.json`` records the key, dtype and shape behind every column,
        so that :meth:`from_hf` gives back the stored items bit for bit. Rows are read and written in chunks
        (bounded memory); the directory is written aside and switched into place atomically, so an error or a
        crash leaves the previous export at ``path`` (or nothing), never a partial one. Transforms are not
        applied: the export holds what the storage holds.

        Args:
            path (str or path-like, optional): the directory to write: a new path (missing parents are
                created), an empty directory or an earlier export (replaced). ``None`` writes into a new
                temporary directory, removed when the process exits. Defaults to ``None``.

        Keyword Args:
            layout (str): ``"flat"`` (rows in storage order), ``"trajectories"`` (rows in the order they were
                written, plus ``episode_index`` and ``frame_index`` columns) or ``"lerobot"`` (the LeRobot v3.0 file
                set that ``LeRobotDataset(repo_id, root=path)`` opens: ``meta/info.json``, the tasks and
                episodes tables, ``meta/stats.json`` and ``data/chunk-*/file-*.parquet``; see
                :ref:`exchanging-datasets`). Defaults to ``"flat"``.
            exclude_keys (sequence of keys): entries to leave out (e.g. non-tensor data). Defaults to ``()``.
            traj_key (key, optional): the trajectory-id entry of the trajectory layouts. Defaults to ``None``
                (``"episode"`` or ``("collector", "traj_ids")`` when stored).
            end_key (key, optional): the end-of-trajectory flag of the trajectory layouts. Defaults to ``None``
                (``("next", "done")`` or ``("next", "truncated")`` when stored).
            fps (float): frames per second, for the ``timestamp`` column of the ``"lerobot"`` layout
                (``frame_index / fps``; a whole number there). Defaults to ``1.0``.
            task (str, optional): ``"lerobot"``: the task of every frame. Defaults to ``None``.
            task_key (key, optional): ``"lerobot"``: the string entry holding each frame's task. Defaults to
                ``None`` (``"task"`` or ``"language_instruction"`` when stored, else the task ``""``).
            names (mapping, optional): ``"lerobot"``: key or column -> list of str, the feature ``names`` of
                ``info.json``. Defaults to ``None``.
            robot_type (str, optional): ``"lerobot"``: the ``robot_type`` of ``info.json``. Defaults to ``None``.
            chunk_bytes (int): about how many bytes of rows to read and convert at once. Defaults to 64 MiB.
            shard_bytes (int, optional): about how many bytes per Arrow file (500 MiB, as ``save_to_disk``), or
                per parquet data file of the ``"lerobot"`` layout (100 MiB, whole episodes per file). Defaults
                to ``None`` (those sizes).
            fsync (bool): flush files and directories to the disk before the switch. Defaults to ``True``.

        Returns:
            datasets.Dataset: the export, read back (memory-mapped) from ``path``; for ``"lerobot"``, the parquet
            frames read into memory.

        .. note:: Export while nothing writes to the buffer: the rows are read in several chunks, and a write
            between two chunks would mix old and new rows in the export.

        Raises:
            TypeError: an entry's dtype has no Arrow type (``bfloat16``, complex) or holds non-tensor data.
            ValueError: a bad argument, an empty storage, or a trajectory layout without trajectory metadata.
            FileExistsError: ``path`` is a file, or a non-empty directory that is not an export.

        Examples:
            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(TensorDict(obs=torch.randn(10, 4), next=TensorDict(reward=torch.ones(10, 1),
            ...                          batch_size=[10]), batch_size=[10]))
            >>> ds = rb.export_hf(tempfile.mkdtemp() + "/export")
            >>> sorted(ds.column_names), ds.num_rows
            (['next.reward', 'obs'], 10)
        """
        self._ready()
        return _hf_export.export_hf(self, path, **kwargs)

    def extend_from_hf(self, source, **kwargs) -> int:
        """Extends the buffer with the rows of a Hugging Face dataset, in chunks; returns how many were written.

        See :meth:`from_hf` for the arguments. The rows go through :meth:`extend` (the writer, the inverse
        transforms, the sampler), so a ring buffer smaller than the dataset keeps its newest rows.

        Examples:
            >>> import tempfile, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(torch.arange(4))
            >>> path = tempfile.mkdtemp() + "/export"
            >>> _ = rb.export_hf(path)
            >>> rb.extend_from_hf(path), rb[:]
            (4, tensor([0, 1, 2, 3, 0, 1, 2, 3]))
        """
        self._ready()
        return _hf_import.extend_from_hf(self, source, **kwargs)

    @classmethod
    def from_hf(cls, source, **kwargs):
        """A new buffer holding the rows of a Hugging Face dataset (an export of :meth:`export_hf`, or any
        dataset of numeric columns).

        An export of this library comes back bit for bit: the same keys, dtypes and item shapes (the columns
        the export derived, ``episode_index`` and ``frame_index``, are skipped unless named in ``columns``).
        Any other dataset is read column by column: ``"a.b"`` becomes the key ``("a", "b")``; numbers and bools
        become tensors, fixed-length lists and ``ArrayND`` columns tensors of their shape; string or image
        columns raise (leave them out with ``columns``).

        Args:
            source (str, path-like or datasets.Dataset): a directory written by :meth:`export_hf` or
                ``save_to_disk``, a LeRobot v3.0 dataset directory (read with TorchRL's
                ``LeRobotExperienceReplay`` keys, ``[N, 1]`` rewards and flags, the task text as
                ``"language_instruction"``), or a ``datasets.Dataset`` (one split of a ``DatasetDict``).

        Keyword Args:
            storage (Storage, optional): where to put the rows; it must hold at least ``len(source)`` items.
                Defaults to ``None``: a :class:`~torchrl.data.LazyTensorStorage` of ``len(source)`` items, or a
                :class:`~torchrl.data.ListStorage` when items differ in shape or were exported from one.
            columns (list of str or mapping, optional): the columns to import, or a mapping column -> key to
                rename them (a str key is split on ``"."``, a tuple is taken as is). Defaults to ``None`` (every
                column).
            ignore_metadata (bool): read an export as a plain dataset (column types as Arrow has them).
                Defaults to ``False``.
            chunk_bytes (int): about how many bytes of rows to convert at once. Defaults to 64 MiB.
            **kwargs: the other arguments of the buffer class (``sampler``, ``batch_size``, ...).

        Raises:
            FileNotFoundError: ``source`` is not a directory, or an export lacks its metadata file.
            ValueError: unknown columns, a storage too small, or a dataset that does not match its metadata.
            TypeError: a column that does not make a tensor (strings, images, nulls).

        Examples:
            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> data = TensorDict(obs=torch.randn(10, 2, 3), done=torch.rand(10, 1) > 0.5, batch_size=[10])
            >>> _ = rb.extend(data)
            >>> path = tempfile.mkdtemp() + "/export"
            >>> _ = rb.export_hf(path)
            >>> copy = ReplayBuffer.from_hf(path, storage=LazyMemmapStorage(10), batch_size=4)
            >>> (copy[:] == data).all()
            True
        """
        return _hf_import.buffer_from_hf(cls, source, **kwargs)
