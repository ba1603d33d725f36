"""The replay buffer: a storage, a writer, a sampler and transforms behind one object.

Write path: ``extend(data)`` -> inverse transforms -> (``flow.insert(n)``: a rate limiter that gates inserts,
only when there is one) -> ``writer.extend`` (which calls ``storage.set`` and then ``storage.mark_update`` ->
``self.mark_update`` -> ``sampler.mark_update``) -> ``sampler.extend(index)``.
Sample path, one route through the stages: ``sample(batch_size)`` -> the prefetcher (when it samples ahead) ->
``flow.draw`` (counts, waits, rate limiter) -> ``_sample``: ``sampler.sample(storage, batch_size)`` ->
``storage.get(index)`` (one gather) -> ``collate_fn`` -> forward transforms. Sampling and writing hold one
re-entrant lock around the storage, so a thread can extend while another samples (``prefetch=k`` samples ahead in
a thread pool: see NOTE [prefetch epochs] in ``_prefetch.py``).

State: ``state_dict()``, the checkpoint part (``dumps``/``loads``) and pickling are the buffer's own fields
plus its children's (storage, sampler, writer, transforms). Pickling (``pickle``, ``torch.save``, DataLoader
workers) drops the locks and the thread pool and rebuilds them; the batches already prefetched travel with the
buffer, as in TorchRL (``_prefetch.py``), but never with a dataset built over the buffer (``rb.as_dataset()``,
whose workers do not prefetch); the generator state travels as ``bytes``.

Other concepts live in their packages, and the methods here delegate to them: the Hugging Face exchange
(:mod:`~torchrl.data.replay_buffers.hf`), the DataLoader adapter
(:mod:`~torchrl.data.replay_buffers.replay_buffers.dataset`), the checks of arguments and components
(``_checks.py``), the service backends (``_service_backend.py``). The buffer owns two stage objects, each with its
state: the :class:`~torchrl.data.replay_buffers.replay_buffers._prefetch.Prefetcher` (batches sampled ahead) and
the :class:`~torchrl.data.replay_buffers.replay_buffers._readiness.FlowControl` (counters, waits, rate limiter).
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import functools
import numbers
import threading
import weakref
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

import torchrl.data.replay_buffers.hf.export as _hf_export
import torchrl.data.replay_buffers.hf.importer as _hf_import
from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_int
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers._checkpoint.parts import (
    PartContext,
    check_class,
    check_part,
    dump_part,
    load_part,
    qualname,
)
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
from torchrl.data.replay_buffers.errors import CheckpointError, DrawOverwrittenError
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.loading.pinning import pin_host_memory
from torchrl.data.replay_buffers.query import query_replay_buffer
from torchrl.data.replay_buffers.replay_buffers._batch_layout import (
    items_in,
    move_dim_to_front,
    next_row,
    priorities_per_item,
)
from torchrl.data.replay_buffers.replay_buffers._checks import (
    built,
    check_compat_keywords,
    check_component,
    check_consuming_buffer,
    check_data_parallel_owner,
    check_drop_last,
    check_sample_batch_size,
    check_sampler_fits_storage,
    component_or_factory,
    consuming_sampler_for,
    default_writer_for,
    share_transform_write_state,
)
from torchrl.data.replay_buffers.replay_buffers._prefetch import DRAW_TURNS, Prefetcher
from torchrl.data.replay_buffers.replay_buffers._readiness import (
    FlowControl,
    check_counter_state,
    check_wait_args,
)
from torchrl.data.replay_buffers.replay_buffers._service_backend import (
    ServiceBackendMeta,
    check_direct_transport,
)
from torchrl.data.replay_buffers.replay_buffers.conditional_update import (
    ConditionalUpdateResult,
    conditional_update,
)
from torchrl.data.replay_buffers.replay_buffers.dataset import (
    ReplayBufferDataset,
    unshared_stateful_component,
)
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import RateLimiter
from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler
from torchrl.data.replay_buffers.samplers.prioritized import (
    PrioritizedSampler,
    check_priorities,
)
from torchrl.data.replay_buffers.storages import ListStorage, Storage, TensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter, Writer
from torchrl.envs.transforms.transforms import Compose, _InvertTransform, as_transform

ADD_BATCHED = TorchRLPhrase(
    UserWarning,
    r"Using `add\(\)` with a TensorDict that has batch_size",
    "Using `add()` with a TensorDict that has batch_size {batch_size}: the whole TensorDict is stored as one "
    "item. Use `extend()` to store its {n} elements as separate items.",
)
SAMPLE_WITHOUT_BATCH_SIZE = TorchRLPhrase(
    RuntimeError,
    "batch_size not specified",
    "batch_size not specified: neither sample() nor the buffer got one. Call rb.sample(batch_size), or build "
    "the buffer with batch_size=...",
)
ITERATE_WITHOUT_BATCH_SIZE = TorchRLPhrase(
    RuntimeError,
    "Cannot iterate over the replay buffer. Batch_size was not specified",
    "Cannot iterate over the replay buffer. Batch_size was not specified when the buffer was built, so an "
    "iteration does not know how much to draw. Build the buffer with batch_size=..., or call "
    "rb.sample(batch_size) in a loop.",
)
PREFETCH_SHARED = TorchRLPhrase(
    ValueError,
    "Cannot share prefetched replay buffers.*prefetch=0.*shared=False",
    "Cannot share prefetched replay buffers (got prefetch={prefetch}, shared=True): prefetched batches are "
    "drawn in one process and cannot be split between processes. Pass prefetch=0 to share the buffer, or "
    "shared=False to prefetch.",
)

# the iterator behind ReplayBuffer.next(), per buffer: kept out of the buffer's __dict__ (never pickled)
_NEXT_ITERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the fields made by _make_runtime_state: never pickled
_RUNTIME_STATE = ("_replay_lock", "_first_stage")
# the children of a buffer's checkpoint part, in the order they are saved; the small ones are loaded before the
# storage and put back if a later load raises
_CHECKPOINT_ROLES = ("storage", "sampler", "writer", "transforms")
_SMALL_CHILDREN = ("sampler", "writer", "transforms")


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
        pin_memory (bool): pin the host leaves of sampled batches, before the forward transforms, so that a device
            cast among them (:class:`~torchrl.envs.transforms.DeviceCastTransform`) copies without blocking
            (only when CUDA is available). Defaults to ``False``.
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
            shared). A :class:`~torchrl.data.ListStorage` or a :class:`~torchrl.data.TensorDictMaxValueWriter`
            cannot be written by several processes: ``RuntimeError`` (TorchRL's). See :ref:`shared-writes`.
            Defaults to ``False``.
        sample_unit (SampleUnit, optional): what one drawn position reads, e.g.
            :class:`~torchrl.data.Sequence` windows (see :mod:`~torchrl.data.replay_buffers.sample_units`).
            Defaults to ``None`` (one item per position, like :class:`~torchrl.data.Transition`).
        transform_factory (callable, optional): a zero-argument callable returning the transform; exclusive
            with ``transform`` (TypeError). With it, the buffer is built at its first write unless
            ``delayed_init=False``. Defaults to ``None``.
        consume_after_n_samples (int, optional): draw each item at most this many times until it is
            overwritten: the default sampler becomes ``ConsumingSampler(consume_after_n_samples)`` (see
            :class:`~torchrl.data.ConsumingSampler`; another sampler raises a ``ValueError``). Defaults to ``None``.
        compilable (bool, optional): write and draw without locks, waits or background threads, so that
            ``torch.compile(fullgraph=True)`` traces ``extend`` and ``sample`` into one graph (with a compilable
            tensor storage); passed to the default storage and writer. Not with ``shared``, ``prefetch`` or
            ``rate_limiter`` (``ValueError``), nor ``sample(wait=...)``. See the "On the GPU and under
            torch.compile" docs page. Defaults to ``None``.
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
            ``"auto"`` or ``"ray"`` for a Ray one. TorchRL's ``"distributed"`` (tensor channels over gloo / NCCL)
            raises an error naming what to use here: ``shared=True`` (or :meth:`share`) for processes of this
            machine, ``service_backend="ray"`` across machines (see :ref:`distributed-replay`). Defaults to
            ``"auto"``.
        transport_options (dict, optional): options of TorchRL's tensor-channel transport; anything but ``None``
            or ``{}`` is refused (``ValueError``), as no transport here takes options. Defaults to ``None``.
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

    Subclass contract: a subclass changes what a draw or a write does through these protected hooks; it may read
    the fields the buffer sets (``_storage``, ``_sampler``, ``_writer``, ``_transform``, ``_batch_size``,
    ``_dim_extend``, ``_sample_unit``, ``_rng``, ``_replay_lock``, ``_flow``) and changes them only through the
    methods:

    - ``_sample(batch_size, transform=True) -> (batch, info)``: one draw (sampler, storage read, collate,
      forward transforms unless ``transform=False``); every route of :meth:`sample`, :meth:`sample_raw` and the
      prefetch tasks ends here. Override it to change a batch after the draw (HER relabels goals, an ensemble
      draws from its members), calling ``super()._sample`` for the draw itself.
    - ``_as_stored_batch(data)``: written data through the inverse transforms, items first (``None``: all
      dropped); ``_write_batch(batch, priority=None, timeout=None)`` and ``_write_item(data, priority=None,
      timeout=None)``: a batch (of ``_as_stored_batch``) or one item written with its priorities, behind the
      flow control and under the buffer's locks (a TensorDict buffer reads the priorities from the data).
    - ``_default_writer(compilable)``: the writer of a buffer built without one.

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
        transport: str = "auto",
        transport_options: dict | None = None,
    ) -> None:
        # ``cls(...)`` reads the transport keywords before __init__ (ServiceBackendMeta); a subclass's super().__init__
        # call may still pass them, and this buffer runs in this process: only the in-process transports.
        check_direct_transport(type(self).__name__, transport, transport_options)
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(
                f"`rate_limiter` must be a RateLimiter (MinSize, SampleToInsertRatio) or None, got "
                f"{type(rate_limiter).__name__}."
            )
        transform, compilable, sample_unit, delay = check_compat_keywords(
            transform=transform, transform_factory=transform_factory, consume_after_n_samples=consume_after_n_samples,
            compilable=compilable, delayed_init=delayed_init, sample_unit=sample_unit,
        )  # fmt: skip
        batch_size = None if batch_size is None else check_sample_batch_size(batch_size)
        check_int("prefetch", prefetch, minimum=0, allow_none=True, type_error=False)
        if prefetch and shared:
            raise PREFETCH_SHARED.error(prefetch=prefetch)
        if compilable:  # what a traced write or draw cannot do (see the "On the GPU" docs page)
            refused = {"shared": shared, "prefetch": prefetch, "rate_limiter": rate_limiter}
            for name, value in refused.items():
                if value:
                    raise ValueError(
                        f"A buffer built with compilable=True writes and draws without locks, waits or background "
                        f"threads, so that torch.compile traces them: `{name}` is not supported with it (got "
                        f"{name}={value!r}). Build the buffer with compilable=False to use `{name}`."
                    )
        consuming = consume_after_n_samples is not None or getattr(sampler, "consumes_items", False)
        if prefetch and batch_size is None and not consuming:  # consuming: refused when built, as in TorchRL
            raise ValueError("`prefetch` samples ahead with the buffer's `batch_size`: pass batch_size too.")
        check_int("dim_extend", dim_extend, minimum=0, allow_none=True, type_error=False)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}.")
        storage = component_or_factory("storage", storage, Storage)
        sampler = component_or_factory("sampler", sampler, Sampler)
        writer = component_or_factory("writer", writer, Writer)
        if delay and isinstance(sampler, Sampler):  # a delayed buffer checks what it can at construction
            check_drop_last(sampler, batch_size)
        self._compilable, self._sample_unit, self._batch_size = compilable, sample_unit, batch_size
        self._flow = FlowControl(limiter=rate_limiter)  # the stages: readiness, rate limiting, prefetching
        self._prefetcher = Prefetcher(int(prefetch or 0), batch_size, self._flow)
        args = dict(
            collate_fn=collate_fn, pin_memory=pin_memory, dim_extend=dim_extend, generator=generator, shared=shared,
            consume_after_n_samples=consume_after_n_samples, checkpointer=checkpointer,
        )  # fmt: skip
        if delay:  # TorchRL's delayed init: the components are built by the first write (see _ready)
            self._initialized = False
            self._init_storage, self._init_sampler, self._init_writer = storage, sampler, writer
            self._init_transform, self._init_args = transform, args
            self._init_transform_factory = transform_factory
            self._rng = None
            self._make_runtime_state()
            return
        self._initialized = True
        self._build(*_built_components(storage, sampler, writer, transform, None), **args)

    def _build(
        self, storage, sampler, writer, transform, *, collate_fn, pin_memory, dim_extend, generator, shared,
        consume_after_n_samples, checkpointer,
    ) -> None:  # fmt: skip
        """Builds and wires the components (at construction, or at the first write of a delayed buffer): the
        defaults for the ``None`` ones (``ListStorage(1000)``, ``_default_writer``, :class:`RandomSampler` or the
        consuming sampler), checked together; ``checkpointer`` (TorchRL's keyword, the storage's dumps/loads
        layout) is set on the storage when given."""
        compilable = self._compilable
        storage = ListStorage(1000, compilable=compilable) if storage is None else storage
        writer = default_writer_for(storage, self._default_writer, compilable) if writer is None else writer
        storage = check_component("storage", storage, Storage)
        sampler = consuming_sampler_for(sampler, consume_after_n_samples)
        sampler = check_component("sampler", sampler if sampler is not None else RandomSampler(), Sampler)
        writer = check_component("writer", writer, Writer)
        check_sampler_fits_storage(sampler, storage)
        check_consuming_buffer(sampler, storage, writer, self._prefetcher.capacity)
        check_drop_last(sampler, self._batch_size)
        if shared:  # a storage or writer that other processes cannot write is refused before anything is wired
            storage.check_shareable()
            writer.check_shareable()
        if checkpointer is not None:
            storage.checkpointer = checkpointer
        self._storage, self._sampler, self._writer = storage, sampler, writer
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
        self._flow.bind(self, self._sampler, self._storage, self._writer)
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
        with self._replay_lock:
            if self._initialized:
                return
            components = _built_components(self._init_storage, self._init_sampler, self._init_writer,
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

    # -- construction helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _default_writer(compilable: bool = False) -> Writer:
        return RoundRobinWriter(compilable=compilable)

    def _default_collate(self):
        return _identity if isinstance(self._storage, TensorStorage) else stack_samples

    @staticmethod
    def _as_compose(transform) -> Compose:
        """``transform`` as the buffer's :class:`~torchrl.envs.transforms.Compose` (empty for ``None``)."""
        if transform is None:
            return Compose()
        if isinstance(transform, Compose):
            return transform
        return Compose(as_transform(transform))

    def _make_runtime_state(self) -> None:
        """The lock, and the first stage of :meth:`sample` (the prefetcher when it samples ahead, else the flow
        control): never pickled, rebuilt in every copy (the prefetcher rebuilds its own thread pool and queue)."""
        self._replay_lock = threading.RLock()
        self._first_stage = self._prefetcher if self._prefetcher.capacity else self._flow

    # TorchRL's buffer fields of its prefetch queue, kept as views of the prefetcher's (code written for TorchRL
    # reads them)
    @property
    def _prefetch_queue(self) -> collections.abc.Sequence:
        return self._prefetcher.queue

    @property
    def _prefetch_executor(self):
        return self._prefetcher.executor

    @property
    def _futures_lock(self):
        return self._prefetcher.lock

    @_futures_lock.setter
    def _futures_lock(self, lock) -> None:
        self._prefetcher.lock = lock

    def _set_batch_size(self, batch_size: int | None) -> None:
        self._batch_size = self._prefetcher.batch_size = batch_size

    def share(self, shared: bool = True) -> ReplayBuffer:
        """Prepares the buffer to be written from several processes.

        Tensor storages move to shared memory (content, length, write lock), and so does the writer's cursor,
        and the sampler's state when it has state it can share (priorities, an epoch, a free list: see
        ``can_share_state`` on :class:`~torchrl.data.replay_buffers.Sampler`), so that a priority set or an
        item written in one process is seen by the others. Call it (or build the buffer with ``shared=True``)
        before starting the other processes, after a first write when the storage is lazy.

        Transforms that declare ``requires_shared_write_state = True`` get their ``share_memory_()`` called; one
        without that method raises a ``RuntimeError`` (as in TorchRL), before anything is shared. So do a storage
        that lives in one process's memory (a :class:`~torchrl.data.ListStorage`: "Cannot share a storage of
        type ...") and a :class:`~torchrl.data.TensorDictMaxValueWriter` ("... cannot be shared between
        processes"), with TorchRL's errors (see ``check_shareable`` on the storage and the writer).
        """
        self._ready()
        if shared:
            self._storage.check_shareable()
            self._writer.check_shareable()
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
    def replay_lock(self):
        """The buffer's re-entrant lock, held around every read and write of its components in this process; a
        reader of several buffers at once (:class:`~torchrl.data.ReplayBufferEnsemble`) holds each member's.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> with rb.replay_lock:  # no other thread of this process writes or draws meanwhile
            ...     rb.extend(torch.arange(3)).tolist(), len(rb)
            ([0, 1, 2], 3)
        """
        return self._replay_lock

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
        return self._write_item(data, None, timeout)

    def _write_item(self, data, priority=None, timeout=None) -> Any:
        """Writes one item and its ``priority`` if given (a hook: see the class docstring), behind the flow
        control: a rate limiter's permission first (``timeout``: see :meth:`extend`), the waiting readers woken
        after."""
        flow = self._flow
        if timeout is None and not flow.gates_inserts:
            index = self._add_now(data, priority)
            if flow.waiters:
                flow.notify()
            return index
        with flow.insert(1, timeout):
            return self._add_now(data, priority)

    def _add_now(self, data, priority) -> Any:
        if isinstance(data, TensorDictBase) and data.batch_dims >= self._storage.ndim:  # a row of ndim=2: fine
            ADD_BATCHED.warn(stacklevel=3, batch_size=list(data.batch_size), n=data.batch_size[0])
        if len(self._transform):  # one item through the inverse transforms; dropped: nothing written
            if isinstance(data, TensorDictBase):  # unsqueeze gives a new TensorDict: the caller's is untouched
                data = self._transform.inv(data.unsqueeze(0))
                if data is None or (data.batch_dims and data.batch_size[0] == 0):
                    return torch.zeros((0, self._storage.ndim), dtype=torch.long)
                data = data.squeeze(0)
            else:
                data = self._transform.inv(data)
            if data is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        sampler, writer = self._sampler, self._writer
        with self._replay_lock, self._storage.write_lock:
            if sampler.consumes_items:  # consumed slots first (the writer was checked at construction)
                index = writer.add_free_first(data, sampler.free_slots)
            else:
                index = writer.add(data)
            if index is not None:  # None: a top-k writer rejected the item
                sampler.add(index)
                if priority is not None:
                    self.update_priority(index, priority)
        return index

    def extend(self, data, *, update_priority=None, timeout: float | None = None) -> torch.Tensor:
        """Writes a batch (first dim = items, or ``dim_extend``) and returns the written indices.

        The batch is validated before anything is stored (keys and shapes of the stored data, values the stored
        dtypes can hold): a bad batch raises and leaves the buffer unchanged. On a shared buffer the write holds
        the storage's :attr:`write_lock` (see :ref:`shared-writes`).

        Keyword Args:
            update_priority (tensor, sequence or number, optional): the priorities of the written items, set with
                the write in one locked step (a prioritized sampler only: ``NotImplementedError`` otherwise, the
                type TorchRL raises). One per item, in the layout of ``data`` (items along ``dim_extend``; trailing
                dims are reduced with the sampler's ``reduction``), or one number for all. Checked before anything
                is written: a NaN, infinite or negative priority (``ValueError``) or a count that does not match
                the items (``ValueError``) leaves the buffer unchanged. Defaults to ``None`` (the sampler's
                default priority).
            timeout (float, optional): with a ``rate_limiter`` that blocks inserts
                (:class:`~torchrl.data.SampleToInsertRatio`), how long to wait for its permission before a
                ``TimeoutError`` (which names the side that waited and the counters). Defaults to ``None``
                (as long as it takes).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer
            >>> rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(10))
            >>> rb.extend(torch.arange(3), update_priority=torch.tensor([0.0, 0.0, 5.0]))
            tensor([0, 1, 2])
            >>> rb.sample(4).tolist()  # only item 2 has weight (up to the sampler's eps)
            [2, 2, 2, 2]
        """
        if not self._initialized:
            self._ready()
        if update_priority is not None:
            return self._extend_with_priority(data, update_priority, timeout)
        data = self._as_stored_batch(data)
        if data is None:  # the transforms dropped the whole batch (e.g. a MultiStepTransform holding steps back)
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        return self._write_batch(data, timeout=timeout)

    def _extend_with_priority(self, data, priority, timeout) -> torch.Tensor:
        """``extend(data, update_priority=priority)``: the priorities checked against the batch before anything
        (the transforms included) runs, then written with the items by ``_write_batch``."""
        sampler, ndim = self._sampler, self._storage.ndim
        if not isinstance(sampler, PrioritizedSampler):
            raise NotImplementedError(
                f"extend(update_priority=...) sets the priorities of the written items, and this buffer's sampler "
                f"is a {type(sampler).__name__}, which is not prioritized. Use a PrioritizedSampler (e.g. "
                f"PrioritizedReplayBuffer), or call extend() without update_priority. Nothing was written."
            )
        if isinstance(priority, bool):
            raise TypeError(
                f"`update_priority`={priority!r}: this buffer's extend() takes the priorities of the written items "
                f"(a tensor, a sequence or a number), not a flag (the flag of TensorDictReplayBuffer.extend). "
                f"Nothing was written."
            )

        fix = "pass finite priorities >= 0 (e.g. td_error.abs(), with NaN replaced). Nothing was written."
        layout = {"ndim": ndim, "dim_extend": self._dim_extend, "reduction": sampler.reduction}
        values = priorities_per_item(priority, data, dim=self._dim_extend, **layout)
        check_priorities(values, "update_priority", fix=fix)  # before any transform runs
        batch = self._as_stored_batch(data)
        if batch is None:
            return torch.zeros((0, ndim), dtype=torch.long)
        values = priorities_per_item(priority, batch, dim=0, **layout)
        values = check_priorities(values, "update_priority", fix=fix)  # what the transforms kept
        return self._write_batch(batch, values, timeout)

    def _as_stored_batch(self, data):
        """``data`` through the inverse transforms, items first; ``None`` when the transforms dropped it (a hook:
        see the class docstring)."""
        if isinstance(data, (range, tuple, set, collections.abc.Iterator)) and isinstance(self._storage, ListStorage):
            data = list(data)  # a list storage takes any iterable of items, e.g. rb.extend(range(2000))
        transform = self._transform
        if len(transform.transforms):  # (Compose's list: no call into Compose on the write path)
            if isinstance(data, TensorDictBase):
                data = data.clone(False)  # transforms edit the structure in place, not the caller's TensorDict
            data = transform.inv(data)
            if data is None:
                return None
        if self._dim_extend > 0:
            data = move_dim_to_front(data, self._dim_extend)
        return data

    def _write_batch(self, data, priority=None, timeout=None) -> torch.Tensor:
        """Writes a batch laid out as the storage expects, and its ``priority`` if given, in one locked step (a
        hook: see the class docstring).

        A rate limiter's permission is obtained first, outside every lock (``timeout``: see :meth:`extend`). The
        writer's :meth:`~torchrl.data.Writer.prepare` (validation) runs before the storage's write lock, so writer
        processes overlap it; cursor, rows, counters, sampler and priorities change under the lock. The waiting
        readers are woken after the write.
        """
        if self._compilable:  # no lock, no flow control: one traceable write (see the "On the GPU" docs page)
            index = self._writer.extend(data)
            self._sampler.extend(index)
            if priority is not None:
                self._sampler.update_priority(index, priority, storage=self._storage)
            return index
        flow = self._flow
        if timeout is None and not flow.gates_inserts:
            index = self._write_now(data, priority)
            if flow.waiters:
                flow.notify()
            return index
        with flow.insert(items_in(data), timeout):
            return self._write_now(data, priority)

    def _write_now(self, data, priority) -> torch.Tensor:
        sampler, writer, storage = self._sampler, self._writer, self._storage
        with self._replay_lock:
            if sampler.consumes_items:  # consumed slots first (the writer was checked at construction)
                with storage.write_lock:
                    index = writer.extend_free_first(data, sampler.free_slots)
                    sampler.extend(index)
                return index
            data = writer.prepare(data)
            with storage.write_lock:
                index = writer.extend(data)
                sampler.extend(index)
                if priority is not None and index.numel():
                    self.update_priority(index, priority)
        return index

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
        if self._compilable:  # no lock: traceable (see the "On the GPU" docs page)
            self._sampler.update_priority(index, priority, storage=self._storage)
            return
        with self._replay_lock, self._storage.write_lock:
            self._sampler.update_priority(index, priority, storage=self._storage)

    def empty(self, empty_write_count: bool = True) -> None:
        """Removes every item; the sampler and writer start over."""
        self._ready()
        self._prefetcher.clear()
        with self._replay_lock, self._storage.write_lock:
            self._writer._empty(empty_write_count=empty_write_count)
            self._sampler._empty()
            self._storage._empty()
        self._flow.reset(samples=empty_write_count)  # a new write count: the sample counts start over with it

    # -- reads --------------------------------------------------------------------------------------------------
    def _resolve_batch_size(self, batch_size) -> int:
        if batch_size is None:
            if self._batch_size is None:
                own = self._sampler.default_batch_size if self._initialized else None
                if own is not None:  # a sampler that fixes its own count (GroupSampler(num_groups))
                    return own
                raise SAMPLE_WITHOUT_BATCH_SIZE.error()
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
        # one route through the stages: the prefetcher (when it samples ahead), the flow control (counters, waits,
        # rate limiter), then one draw (_sample); every line here runs on each sample
        if not self._initialized:
            self._ready()
        bs = self._batch_size if batch_size is None and self._batch_size is not None else (
            self._resolve_batch_size(batch_size))  # fmt: skip
        if self._compilable:  # one traceable route: no stage, no lock (see the "On the GPU" docs page)
            if wait is not False or timeout is not None or cancel_event is not None:
                raise ValueError(
                    f"A buffer built with compilable=True draws at once: wait, timeout and cancel_event are not "
                    f"supported (got wait={wait!r}, timeout={timeout!r}, cancel_event={cancel_event!r}). Check "
                    f"rb.can_sample() before sampling, or build the buffer with compilable=False to wait for data."
                )
            data, info = self._sample(bs)
        else:
            data, info = self._first_stage.draw(bs, wait, timeout, cancel_event, self._sample)
        return (data, info) if return_info else data

    def query(self, predicate=None, *, trajectory_key=None, fragmented=False, step_key="step_count") -> list:
        """The stored trajectories that ``predicate`` accepts, oldest first (TorchRL's ``ReplayBuffer.query``).

        Reads the storage once under the buffer's lock; see
        :func:`~torchrl.data.replay_buffers.query.query_replay_buffer` for the splitting signal, the
        transforms and the ``traj`` predicates, and for ``fragmented=True`` (interleaved trajectories, each
        gathered in ``step_key`` order).

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
            return query_replay_buffer(self, predicate, trajectory_key=trajectory_key, fragmented=fragmented,
                                       step_key=step_key)

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
        return self._flow.can_sample(self._resolve_batch_size(batch_size))

    def _sample_data_parallel(self, batch_size: int, *args, **kwargs):
        """One data-parallel rank's share (``batch_size`` items), drawn for a
        :class:`~torchrl.data.DataParallelReplayBufferClient` (TorchRL's owner-side contract): :meth:`sample`, refused
        (``RuntimeError``) when this buffer prefetches."""
        check_data_parallel_owner(self._prefetcher.capacity)
        return self.sample(batch_size, *args, **kwargs)

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
            check_wait_args(wait, timeout, cancel_event)
        data, info = self._flow.draw(self._resolve_batch_size(batch_size), wait, timeout, cancel_event,
                                     functools.partial(self._sample, transform=False))  # fmt: skip
        return (data, info) if return_info else data

    def _sample(self, batch_size: int, transform: bool = True):
        """One draw: ``(batch, info)``, through the forward transforms unless ``transform=False`` (a hook: see the
        class docstring).

        A prefetch task (or the prefetcher's draw made at once) waits for its turn and records whether its draw
        ended the sampler's epoch (NOTE [prefetch epochs] in ``_prefetch.py``). Under the buffer's lock:
        ``sampler.sample(storage, B)`` -> ``(index, info)`` -> the sample unit's expansion, if any ->
        ``info["index"]`` (and ``"index_generation"`` for a writer that tracks generations) -> one
        ``storage.read_rows`` (``storage.get`` for samplers that do not draw in bounds); then, outside the lock,
        ``collate_fn`` (unless one item was read) -> ``pin_memory`` (when asked and CUDA is available) -> the
        forward transforms. A buffer built with ``compilable=True`` takes neither lock nor turn.
        """
        if self._compilable:  # no lock, no turn: one traceable draw (see the "On the GPU" docs page)
            index, info = self._sampler.sample(self._storage, batch_size)
            return self._deliver(*self._read_drawn(index, info), transform)
        turn = getattr(DRAW_TURNS, "turn", None)
        if turn is not None:  # draw after the task submitted before this one
            turn.wait_previous()
        sampler = self._sampler
        with self._replay_lock:
            try:
                index, info = sampler.sample(self._storage, batch_size)
                if turn is not None:
                    turn.ran_out = sampler.ran_out
            finally:
                if turn is not None:
                    turn.release()
            try:
                data, info = self._read_drawn(index, info)
            except DrawOverwrittenError:  # another process overwrote the draw before its read: draw again
                data, info = self._draw_again(batch_size)
        return self._deliver(data, info, transform)

    def _draw_again(self, batch_size: int, attempts: int = 8) -> tuple:
        """A new draw and read, after a read that another process's write tore (:class:`DrawOverwrittenError`,
        NOTE [packed reads] in ``storages/packed_sequence.py``): at most ``attempts`` draws, then the last error."""
        for attempt in range(attempts):
            index, info = self._sampler.sample(self._storage, batch_size)
            try:
                return self._read_drawn(index, info)
            except DrawOverwrittenError:
                if attempt == attempts - 1:
                    raise

    def _read_drawn(self, index, info: dict) -> tuple:
        """``(items, info)`` for what a sampler drew at ``index``: the sample unit's expansion, if any, then one
        read of the storage; ``info`` gets ``"index"`` (and ``"index_generation"``)."""
        storage = self._storage
        unit = self._sample_unit
        if unit is not None:  # see torchrl.data.replay_buffers.sample_units
            index, info = unit.expand(index, info, storage)
        info["index"] = index
        if self._writer.tracks_generations:
            info["index_generation"] = self._writer.generations_of(index)
        if unit is not None:
            return unit.read(storage, index), info
        # a draw of this package's samplers is in bounds: read without the check (a host sync)
        if self._sampler.draws_in_bounds:
            return storage.read_rows(index), info
        data = storage.get(index)
        if type(index) is torch.Tensor and index.ndim > 1 and storage.ndim == 1:  # windows [B, W], as TorchRL
            data = data.reshape(index.shape)  # (GeometricTrajectoryWindowSampler): the storage reads them flat
        return data, info

    def _deliver(self, data, info: dict, transform: bool):
        """``(batch, info)`` from the items read: collated (unless one item was read), pinned when asked and CUDA
        is available (its host leaves), then through the forward transforms unless ``transform=False``."""
        index = info["index"]
        collate = self._collate_fn
        if collate is not _identity and not isinstance(index, int):
            data = collate(data)
        if self._pin_memory:  # before the transforms: a device cast then copies from pinned memory, non-blocking
            data = pin_host_memory(data)
        if transform and len(self._transform.transforms):  # (Compose's list: no call into Compose per draw)
            data = self._transform(data)
            if self._pin_memory:  # what the transforms made on the host (pinned leaves come back as they are)
                data = pin_host_memory(data)
        return data, info

    def __iter__(self):
        """Yields batches of ``batch_size`` until the sampler runs out (endless for samplers that never do)."""
        self._ready()
        if self._batch_size is None:
            raise ITERATE_WITHOUT_BATCH_SIZE.error()
        self._sampler.ran_out = False
        if self._sampler.consumes_items and not len(self):  # everything consumed: no batch
            return
        prefetcher = self._prefetcher
        while True:
            prefetcher.epoch_ended = None
            yield self.sample()
            ended = prefetcher.epoch_ended  # from a prefetched batch: see NOTE [prefetch epochs] in _prefetch.py
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
        storage = self._storage
        with self._replay_lock, storage.write_lock:
            if isinstance(storage, TensorStorage) and len(storage) and storage.shares_memory_with(value):
                value = value.clone()  # a read of the storage written back: source and destination overlap
            storage.set_in_layout(index, value, self._dim_extend)
            if isinstance(index, slice):
                index = torch.arange(*index.indices(storage.rows_written()))
            if not isinstance(index, tuple):  # overwritten items are new items for the sampler
                storage.mark_update(index)
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
            "prefetch_queue_size": len(self._prefetcher.queue),
            "initialized": self._initialized,
        }
        capacity = getattr(storage, "max_size", None) if isinstance(storage, Storage) else None
        if capacity is not None and capacity < torch.iinfo(torch.int64).max:
            out["capacity"] = int(capacity)
            out["utilization"] = len(self) / capacity if capacity else 0.0
        out.update(self._flow.stats())
        return out

    # -- in-place edits of the stored data (TorchRL's set_, set_at_, update_, update_if_present) ----------------
    def _edit_rows(self, index, edit) -> None:
        self._ready()
        storage = self._storage
        with self._replay_lock, storage.write_lock:
            if index is None:
                index = torch.arange(storage.rows_written())
            data = storage.get(index)
            if not isinstance(data, TensorDictBase):
                raise TypeError(
                    f"In-place edits need a storage of TensorDicts; this buffer's storage returned "
                    f"{type(data).__name__}. Write the new values with rb[index] = value instead."
                )
            edit(data)
            storage.set(index, data, set_cursor=False)

    def set_(self, key, value) -> None:
        """Sets entry ``key`` of every stored item to ``value`` (shaped like the stored rows)."""
        self._edit_rows(None, lambda data: data.set_(key, value))

    def set_at_(self, key, value, index) -> None:
        """Sets entry ``key`` of the stored items at ``index`` (rows) to ``value``."""
        self._edit_rows(torch.as_tensor(index, dtype=torch.long), lambda data: data.set_(key, value))

    def update_(self, input_dict_or_td, clone: bool = False, *, keys_to_update=None) -> None:
        """Updates the stored items in place with the entries of ``input_dict_or_td`` (a TensorDict or a dict
        ``{key: tensor}``, nested dicts for nested keys; values shaped like the stored rows).

        Args:
            input_dict_or_td (TensorDictBase or dict): the new values of existing entries.
            clone (bool): copy the values first (when they are views of the storage). Defaults to ``False``.

        Keyword Args:
            keys_to_update (sequence of NestedKey, optional): only these entries. Defaults to ``None`` (all).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = rb.extend(TensorDict(obs=torch.zeros(3), r=torch.zeros(3), batch_size=[3]))
            >>> rb.update_({"obs": torch.tensor([1.0, 2.0, 3.0])})
            >>> rb[:]["obs"].tolist()
            [1.0, 2.0, 3.0]
        """
        if not isinstance(input_dict_or_td, (TensorDictBase, collections.abc.Mapping)):
            raise TypeError(
                f"`input_dict_or_td` must be a TensorDict or a dict {{key: tensor}} of the new values, got "
                f"{type(input_dict_or_td).__name__}."
            )
        src = input_dict_or_td
        if clone:
            src = src.clone() if isinstance(src, TensorDictBase) else TensorDict(src).clone()
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
        """Registers ``hook(data, path=path)`` on the storage (:meth:`Storage.register_save_hook
        <torchrl.data.Storage.register_save_hook>`, as in TorchRL): :meth:`dumps` runs it on the stored items and
        saves its return value (TorchRL's save hooks; the buffer itself is unchanged).

        Before the call, a hook that has the attributes ``shift`` and ``is_full`` gets ``shift`` set to the row
        after the last one written and ``is_full`` to whether the storage is full. The hook must return the
        items with their stored layout (the checkpoint format stays tensor files plus JSON). The hooks belong to
        the storage: ``storage.dumps`` runs them too, and a storage swapped in by :meth:`set_storage` has its own.

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
        self._storage.register_save_hook(hook)

    def register_load_hook(self, hook) -> None:
        """Forwarded to the storage, which refuses hooks (``NotImplementedError``: loading runs no code)."""
        self._ready()
        self._storage.register_load_hook(hook)

    # -- swapping components (set_storage, set_writer, set_sampler) and shutdown --------------------------------
    def _swap(self, attribute: str, component, wire) -> object:
        """Replaces ``self.<attribute>`` by ``component`` once no prefetch task runs (the batches sampled ahead
        from the component being replaced are dropped), then calls ``wire(previous)``."""
        self._ready()
        with self._prefetcher.paused(clear=True):  # before the replay lock, which prefetch tasks take
            with self._replay_lock, self._storage.write_lock:
                previous = getattr(self, attribute)
                setattr(self, attribute, component)
                wire(previous)
                self._flow.bind(self, self._sampler, self._storage, self._writer)
        return previous

    def _check_swap(self, role: str, component) -> None:
        """Checks the buffer that swapping its ``role`` component (``"storage"``, ``"writer"`` or ``"sampler"``)
        for ``component`` would give, before anything changes."""
        parts = {"storage": self._storage, "sampler": self._sampler, "writer": self._writer, role: component}
        check_component(role, component, {"storage": Storage, "sampler": Sampler, "writer": Writer}[role])
        if role != "writer":
            check_sampler_fits_storage(parts["sampler"], parts["storage"])
        check_consuming_buffer(parts["sampler"], parts["storage"], parts["writer"], self._prefetcher.capacity)
        if role == "sampler":
            check_drop_last(component, self._batch_size)

    @staticmethod
    def _announce_items(sampler, storage) -> None:
        """Tells ``sampler`` of the items ``storage`` holds (a prioritized sampler gives them its default priority)."""
        if len(storage):
            sampler.mark_update(torch.arange(len(storage)), storage=storage)

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
        self._check_swap("storage", storage)

        def wire(previous: Storage) -> None:
            writer = self._writer
            previous.detach(self)
            storage.attach(self)
            writer.register_storage(storage)
            if getattr(storage, "writable", True):  # the writer starts after the rows the new storage holds
                writer._empty(empty_write_count=False)
                if len(storage):
                    with contextlib.suppress(AttributeError):  # a writer that keeps no cursor
                        writer._cursor = next_row(storage)
            if self._shared and hasattr(storage, "share_memory_"):
                storage.share_memory_()
            self._collate_fn = collate_fn if collate_fn is not None else self._default_collate()
            self._dim_extend = min(self._dim_extend, storage.ndim - 1)
            self.set_rng(self._rng)  # routes the buffer's generator to the new storage
            self._announce_items(self._sampler, storage)

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
        self._check_swap("writer", writer)

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
        self._check_swap("sampler", sampler)

        def wire(previous: Sampler) -> None:
            self.set_rng(self._rng)
            if self._shared and sampler.requires_shared_state and sampler.can_share_state:
                sampler.share_memory_()
            self._announce_items(sampler, self._storage)

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
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
        ):
            raise ValueError(f"`timeout` must be None or a non-negative number of seconds, got {timeout!r}.")
        self._shut_down = True
        self._first_stage = self._flow
        self._flow.close()  # waiting samples and writes end (RuntimeError), in every process sharing the buffer
        self._prefetcher.stop(timeout)

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of every component; as in TorchRL, ``"_prefetch_state"`` holds the batches sampled ahead
        (``prefetch``) and not returned yet, so that a restored buffer returns the same next batches."""
        self._ready()
        prefetched = self._prefetcher.state_dict()  # after the tasks in flight: they moved the sampler and generator
        return {
            "_prefetch_state": prefetched,
            "_storage": self._storage.state_dict(),
            "_sampler": self._sampler.state_dict(),
            "_writer": self._writer.state_dict(),
            "_transforms": self._transform.state_dict(),
            "_batch_size": self._batch_size,
            "_rng": generator_to_state(self._rng),
            "_readiness": self._flow.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state of :meth:`state_dict`, prefetched batches included.

        The saved prefetch queue is checked first: one saved by a buffer of another ``prefetch`` capacity raises
        a ``RuntimeError`` (a ``ValueError`` too) and leaves this buffer, its queue included, unchanged. The
        prefetch tasks in flight finish (holding the buffer's futures lock, so that no new one starts) before
        the components are loaded: a draw made after the load would move the restored sampler and generator.
        """
        self._ready()
        prefetched = self._prefetcher.checked(state_dict.get("_prefetch_state"))
        readiness = state_dict.get("_readiness")
        if readiness is not None:
            check_counter_state(readiness, "state_dict['_readiness']")
        validate = getattr(self._sampler, "validate_state_dict", None)
        if validate is not None:  # a crafted sampler state is refused before the storage changes
            validate(state_dict["_sampler"])
        with self._prefetcher.paused():  # before the replay lock, which prefetch tasks take
            with self._replay_lock, self._storage.write_lock:
                self._storage.load_state_dict(state_dict["_storage"])
                self._sampler.load_state_dict(state_dict["_sampler"])
                self._writer.load_state_dict(state_dict["_writer"])
                self._transform.load_state_dict(state_dict["_transforms"])
                self._set_batch_size(state_dict.get("_batch_size", self._batch_size))
                rng = generator_from_state(state_dict.get("_rng"))
                if rng is not None:
                    self.set_rng(rng)
                if readiness is not None:
                    self._flow.load_state_dict(readiness)
            # the components hold the state the saved batches were drawn from: they replace the queue
            self._prefetcher.replace(prefetched)

    def __getstate__(self):
        # the fields less the runtime state; the generator state as bytes (never a tensor: design.md, "Sharing
        # with worker processes"); the prefetcher pickles its batches itself (not into a process being started
        # nor into a dataset's copy)
        with self._prefetcher.paused():  # after the tasks in flight: their draws moved the generator
            state = dict(self.__dict__)
            for name in _RUNTIME_STATE:
                state.pop(name, None)
            state["_rng"] = generator_to_state(self._rng, as_bytes=True)
            state["_prefetcher"] = self._prefetcher.to_pickle()
        return state

    def __setstate__(self, state):
        rng = generator_from_state(state.pop("_rng", None))
        self.__dict__.update(state)
        self._make_runtime_state()
        if self._initialized:  # a buffer with delayed init builds its components at its first write
            self._storage.attach(self)
            self._writer.register_storage(self._storage)
            self._flow.bind(self, self._sampler, self._storage, self._writer)
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
        with self._prefetcher.paused():  # before the replay lock, which prefetch tasks take
            with self._replay_lock, self._storage.saving(path):  # the storage's save hooks: register_save_hook
                dump_component(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a buffer saved by :meth:`dumps` into this one (built with the same configuration).

        Everything is checked before anything is loaded; a refused checkpoint leaves the buffer, its prefetch
        queue included, unchanged (prefetched batches of another ``prefetch`` capacity: ``RuntimeError``).
        """
        self._ready()
        with self._prefetcher.paused():  # before the replay lock, which prefetch tasks take
            with self._replay_lock, self._storage.write_lock:
                load_component(self, path)

    # TorchRL's aliases, with its signatures
    def dump(self, *args, **kwargs) -> None:
        """Alias of :meth:`dumps`."""
        self.dumps(*args, **kwargs)

    def save(self, *args, **kwargs) -> None:
        """Alias of :meth:`dumps`."""
        self.dumps(*args, **kwargs)

    def load(self, *args, **kwargs) -> None:
        """Alias of :meth:`loads`."""
        self.loads(*args, **kwargs)

    # -- checkpoint part (the protocol of _checkpoint/parts.py) ---------------------------------------------------
    # The part: {"class": ..., "batch_size": int | null, "rng": null | {"device": str, "state": "<prefix>rng/state"},
    # "parts": {"storage": <wrapped part>, "sampler": ..., "writer": ..., "transforms": ...}, "readiness": {...},
    # "prefetch": ...} ("prefetch" only when batches were sampled ahead: the Prefetcher's part). The storage's
    # tensors sit under the buffer's own prefix (storage/...), the other children's under sampler/, writer/ and
    # transforms/. Every part is checked, storage first, before any is loaded; the small parts (sampler, writer,
    # transforms) are loaded before the storage and put back if a later load raises.
    checkpoint_role = "replay buffer"

    def _checkpoint_children(self) -> dict[str, Any]:
        return {"storage": self._storage, "sampler": self._sampler, "writer": self._writer, "transforms": self._transform}

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        """The buffer's part: its children's, its batch size, generator, readiness counters and prefetched
        batches (as in TorchRL)."""
        self._ready()
        prefetch_tensors, prefetch = self._prefetcher.checkpoint_part(ctx)  # JSON + tensors, see _prefetch.py
        children = self._checkpoint_children()
        tensors, parts = {}, {}
        for role in _CHECKPOINT_ROLES:
            child_tensors, parts[role] = dump_part(children[role], _child_ctx(ctx, role))
            tensors.update(child_tensors)
        rng = generator_to_state(self._rng)
        if rng is not None:
            tensors[ctx.name("rng/state")] = rng["state"]
            rng = {"device": rng["device"], "state": ctx.name("rng/state")}
        doc = {"class": qualname(self), "batch_size": self._batch_size, "rng": rng, "parts": parts,
               "readiness": self._flow.state_dict()}  # fmt: skip
        if prefetch is not None:
            tensors.update(prefetch_tensors)
            doc["prefetch"] = prefetch
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        """Checks a part of :meth:`checkpoint_part` and its children's before anything is loaded."""
        self._ready()
        check_class(self, doc, "replay buffer")
        if set(doc["parts"]) != set(_CHECKPOINT_ROLES):
            raise ValueError(
                f"The checkpoint's buffer parts are {sorted(doc['parts'])}, expected {list(_CHECKPOINT_ROLES)}."
            )
        children = self._checkpoint_children()
        for role in _CHECKPOINT_ROLES:
            check_part(children[role], doc["parts"][role], tensors, _child_ctx(ctx, role))
        where = f"The {type(self).__name__} description in the checkpoint {ctx.path!r}"
        if doc["batch_size"] is not None:
            check_int_field(doc["batch_size"], "batch_size", where, 1, fix="It is a positive JSON integer, or null.")
        _saved_generator(doc, tensors, where)
        self._prefetcher.check_checkpoint_part(doc.get("prefetch"), tensors, ctx.path)
        self._flow.check_checkpoint_part(doc.get("readiness", {}), where)

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        """Loads a checked part: the children (put back if one raises), then the buffer's own fields."""
        self._ready()
        children = self._checkpoint_children()
        before = {role: copy.deepcopy(children[role].state_dict()) for role in _SMALL_CHILDREN}
        try:
            for role in (*_SMALL_CHILDREN, "storage"):
                load_part(children[role], doc["parts"][role], tensors, _child_ctx(ctx, role))
        except BaseException:
            for role in _SMALL_CHILDREN:
                children[role].load_state_dict(before[role])
            raise
        self._set_batch_size(doc["batch_size"])
        rng = _saved_generator(doc, tensors, ctx.path)
        if rng is not None:
            self.set_rng(rng)
        self._flow.load_state_dict(doc.get("readiness", {}))  # a checkpoint without counters: they start at 0
        self._prefetcher.load_checkpoint_part(doc.get("prefetch"), tensors)  # the saved batches replace the queue

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
        self._prefetcher.disable()
        self._make_runtime_state()
        self._pin_memory = False  # a worker's pinned batch is not pinned in the main process: the loader pins there
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
            video_codec (str, optional): ``"lerobot"`` export of an :class:`~torchrl.data.EncodedFrameStorage`
                (its pixel entries become video files): the codec (``"h264"`` or ``"av1"``) of the frames that
                cannot be copied as they are (e.g. from FFV1 segments). Defaults to ``None``: ``"h264"``.
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
            video (str): the video features of a LeRobot directory: ``"decode"`` (every frame decoded into uint8
                rows) or ``"keep"`` (each episode's frames stay in the video files as segments of an
                :class:`~torchrl.data.EncodedFrameStorage`, decoded when read; see :doc:`/video`). Defaults to
                ``"decode"``.
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


# -- module helpers of the class: construction and the checkpoint part ---------------------------------------------
def _built_components(storage, sampler, writer, transform, transform_factory) -> tuple:
    """``(storage, sampler, writer, transform)`` with the zero-argument factories called (checked), at
    construction or, with delayed init, at the first write (``transform_factory``: called when given)."""
    storage = built("storage", storage, Storage)
    sampler = built("sampler", sampler, Sampler)
    writer = built("writer", writer, Writer)
    if transform_factory is not None:
        transform = transform_factory()
    return storage, sampler, writer, transform


def _child_ctx(ctx: PartContext, role: str) -> PartContext:
    """The part context of a buffer's child: the storage's tensors sit under the buffer's own prefix."""
    return ctx if role == "storage" else ctx.sub(role)


def _saved_generator(doc: dict, tensors, where: str) -> torch.Generator | None:
    """The generator saved in a buffer part (``None`` if none was); ``CheckpointError`` if it is malformed."""
    rng = doc["rng"]
    if rng is None:
        return None
    if not isinstance(rng, dict) or rng.get("state") not in tensors:
        raise CheckpointError(
            f"{where}: `rng` is {rng!r:.200}, expected null or {{'device': ..., 'state': <name of a tensor of "
            f"the checkpoint>}}. Save the buffer again with `dumps`. Nothing was loaded."
        )
    try:
        return generator_from_state({"device": rng.get("device"), "state": tensors[rng["state"]]})
    except ValueError as err:
        raise CheckpointError(f"{where}: `rng`: {err} Save the buffer again with `dumps`. Nothing was loaded.") from None

