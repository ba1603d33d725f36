"""A replay buffer read through :mod:`torch.utils.data`: :class:`ReplayBufferDataset` (``rb.as_dataset()``).

An iterable dataset whose items are ``rb.sample()`` batches: the sampler, the collate function and the
transforms run where the dataset is iterated, i.e. in the DataLoader workers. This module imports no buffer
class: it uses a buffer through the public methods below, so that :meth:`ReplayBuffer.as_dataset
<torchrl.data.ReplayBuffer.as_dataset>` can build it without an import cycle, and so that any object offering
them (a buffer hosted elsewhere, a user's own buffer) can be read the same way:

- ``sample()`` and ``batch_size``: what :meth:`ReplayBufferDataset.draw` calls by default;
- ``storage``: moved to shared memory (if it can be) so that workers share its content;
- ``stateful_component()``: the component whose state a worker copy would duplicate, if any (a buffer finds it
  with :func:`unshared_stateful_component`); one that can put that state in shared memory (``can_share_state``)
  is shared with ``share_memory_()`` when the dataset is built (``share_sampler=True``);
- ``prepare_worker_copy(seed)``: readies the worker's copy of the buffer and reseeds it;
- ``set_rng(generator)`` and ``len(storage)`` (resume, :meth:`ReplayBufferDataset.state_dict`): the dataset
  gives the worker's copy its own generator, and records the buffer length it was saved with;
- ``pin_epoch(key, readers)``/``unpin_epoch()`` (optional): with ``num_batches=None``, an iteration ends where
  the sampler's epoch ends, in every worker (see NOTE [pinned epochs] in ``samplers/_shared_epoch.py``);
- ``sampler.planned_draw(key, number, total)`` (optional, on the buffer's public ``sampler``): in a DataLoader
  worker, each draw is made by its number in the iteration, so that the batches do not depend on the workers'
  speed (see NOTE [planned epochs] in ``samplers/_shared_epoch.py``); the pins are then not used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torchrl._validation import check_bool
from torchrl.data.replay_buffers._checkpoint.parts import qualname
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers.errors import EpochEnded
from torchrl.data.replay_buffers.loading.collate import tensordict_collate
from torchrl.data.replay_buffers.loading.ranks import (
    Reader,
    current_reader,
    iteration_key,
    reader_quota,
    resolve_rank,
)
from torchrl.data.replay_buffers.loading.resume_state import ReaderPosition, check_reader_state
from torchrl.data.replay_buffers.loading.worker_threads import WorkerThreadCheck
from torchrl.data.replay_buffers.loading.worker_transport import (
    DEFAULT_TRANSPORT,
    check_transport,
    prepare_batch,
)
from torchrl.data.replay_buffers.replay_buffers._prefetch import WithoutQueue

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


def unshared_stateful_component(components) -> tuple[str, Any] | None:
    """The first ``(name, component)`` of ``components`` whose state a copy of the buffer in another process
    would duplicate: one that declares ``requires_shared_state = True`` and whose state is not in shared memory
    already (``can_share_state`` and ``is_shared``). ``None`` when there is none.

    What :meth:`ReplayBuffer.stateful_component <torchrl.data.ReplayBuffer.stateful_component>` returns for
    ``(("sampler", rb.sampler), ("storage", rb.storage))``.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, RandomSampler, SamplerWithoutReplacement
        >>> from torchrl.data.replay_buffers.replay_buffers.dataset import unshared_stateful_component
        >>> storage = LazyTensorStorage(10)
        >>> unshared_stateful_component([("sampler", RandomSampler()), ("storage", storage)]) is None
        True
        >>> unshared_stateful_component([("sampler", SamplerWithoutReplacement()), ("storage", storage)])[0]
        'sampler'
    """
    for name, component in components:
        if getattr(component, "requires_shared_state", False):
            if getattr(component, "can_share_state", False) and component.is_shared:
                continue  # one copy of the state for every process
            return name, component
    return None


#: The samplers whose state can live in shared memory, named by the refusal.
SHAREABLE_SAMPLERS = (
    "PrioritizedSampler, PrioritizedSliceSampler, SamplerWithoutReplacement, SliceSamplerWithoutReplacement, "
    "ConsumingSampler, StalenessAwareSampler, PromptGroupSampler and SamplerEnsembles of them"
)


def stateful_message(replay_buffer, where: str) -> str:
    """Why a buffer with a component that requires shared state cannot be read by DataLoader workers."""
    name, component = replay_buffer.stateful_component()
    if getattr(component, "can_share_state", False):
        why = (
            "the dataset was built with share_sampler=False. Build it with share_sampler=True (the default) "
            "to share that state with the workers"
        )
    else:
        why = f"it cannot put that state in shared memory; the samplers that can are {SHAREABLE_SAMPLERS}"
    return (
        f"ReplayBufferDataset cannot be read by DataLoader workers ({where}): the buffer's {name} "
        f"{type(component).__name__} requires shared state (requires_shared_state=True), and each worker "
        f"would hold its own copy of it (e.g. its own epoch permutation or priorities), silently duplicating "
        f"or skipping samples; {why}. Otherwise use num_workers=0, or build the buffer with a stateless "
        f"sampler (RandomSampler or SliceSampler)."
    )


def _share_stateful_components(replay_buffer) -> None:
    """Moves to shared memory the state of every stateful component that can share it (a sampler's)."""
    shared: set[int] = set()
    stateful = replay_buffer.stateful_component()
    while stateful is not None:
        component = stateful[1]
        if id(component) in shared or not getattr(component, "can_share_state", False):
            return
        component.share_memory_()
        shared.add(id(component))
        stateful = replay_buffer.stateful_component()


def _check_share_sampler(share_sampler) -> bool:
    return check_bool(
        "share_sampler", share_sampler,
        hint="Pass True (the default) to share a stateful sampler with the DataLoader workers, or False to refuse it.",
    )


class ReplayBufferDataset(IterableDataset):
    """An :class:`~torch.utils.data.IterableDataset` whose items are batches sampled from a replay buffer.

    Each item is ``rb.sample()``: the sampler, the collate function and the transforms run where the dataset
    is iterated, i.e. in the DataLoader workers. Read it with :meth:`loader`, which builds the DataLoader that
    yields these batches as they are::

        loader = rb.as_dataset(num_batches=1000).loader(num_workers=2)

    which is ``DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, num_workers=2)``. Build a
    DataLoader yourself with these two arguments: ``batch_size=None`` because the items already are batches (a
    loader ``batch_size``, torch's default of 1 included, stacks them into ``[batch_size, B]``), and
    ``collate_fn=tensordict_collate`` because torch's default passes each TensorDict batch to
    ``default_convert``, which fails.

    Workers: each worker holds a copy of the buffer object over the same storage content. At its first
    iteration in a worker, the dataset calls ``replay_buffer.prepare_worker_copy(get_worker_info().seed)``
    (fresh locks, prefetching off, the generator reseeded), so workers draw different batches, epochs differ,
    and a DataLoader with a fixed ``generator`` reproduces the same stream. A pickled dataset (what spawn and
    forkserver workers receive) leaves out the batches its buffer prefetched (``prefetch=k``): a worker's copy
    never uses them, so ``pickle.dumps(rb.as_dataset())`` is about the size it is without prefetching. The
    buffer pickled on its own keeps them, as in TorchRL.

    Stateful samplers: with ``share_sampler=True`` (the default), building the dataset moves the state of a
    sampler that can share it (prioritized trees, the epoch of a sampler without replacement; see
    :ref:`stateful-samplers-in-workers`) to shared memory, as it does for the storage content: the main
    process and every worker then sample from and update one copy. A buffer whose ``stateful_component()`` is
    still not ``None`` (a sampler or storage with ``requires_shared_state=True`` that cannot share its state, or
    any with ``share_sampler=False``) is refused with ``num_workers > 0`` when :attr:`refuse_stateful` is true:
    when the DataLoader sends the dataset to spawn/forkserver workers, and at the first iteration in a forked
    worker. With ``num_batches=None`` and a sampler that runs out (without replacement), an iteration is one
    epoch of the sampler: every worker stops where that epoch ends.

    Subclasses change what is yielded through two hooks, :meth:`draw` (one sampling call) and :meth:`items`
    (what one sampling call yields), and the refusal through :attr:`refuse_stateful`.

    Args:
        replay_buffer (ReplayBuffer): the buffer; it must have a ``batch_size`` unless a subclass overrides
            :meth:`draw`.

    Keyword Args:
        num_batches (int, optional): the number of sampling calls per epoch, in total over all ranks and
            workers: worker ``i`` of ``N`` in rank ``rank`` (``i = 0``, ``N = 1`` without workers) makes
            ``len(range(i * world_size + rank, num_batches, world_size * N))``, so each rank makes
            ``len(range(rank, num_batches, world_size))``. ``None`` streams forever, or, for
            a sampler that runs out (without replacement), until the end of its epoch. Defaults to ``None``.
        transport (str): how a worker process sends a batch to the main process: ``"ring"`` (a per-worker
            ring of reusable shared-memory slots), ``"consolidated"`` (one new shared-memory segment per
            batch) or ``"torch"`` (torch's own, one segment per tensor). The ring carries dense CPU TensorDict
            batches that the collate function returns unchanged; anything else travels torch's way. See
            :ref:`dataloader-transport`. Defaults to ``"ring"``.
        rank (int, optional): this process's rank among ``world_size`` data-parallel processes. With
            ``world_size``, or neither: then they are read, when the dataset is built, from
            :mod:`torch.distributed`'s default process group if it is initialized, else ``0`` and ``1``.
            Each rank (and each of its workers) draws from its own random stream: a hash of the worker's
            seed (or, without workers, of ``torch.initial_seed()``) and the rank, so ranks seeded alike draw
            different batches. Without workers and with ``world_size > 1``, the first iteration gives the
            buffer a generator seeded that way (``rb.set_rng``). Defaults to ``None``.
        world_size (int, optional): the number of data-parallel processes. Defaults to ``None``.
        share_sampler (bool): move the state of a stateful sampler that can share it to shared memory, so
            that DataLoader workers share it with the main process; ``False`` refuses such a buffer with
            workers instead. Defaults to ``True``.
        wait (bool): each draw is ``replay_buffer.sample(wait=True, timeout=timeout)``: a worker waits for data,
            or for a rate limiter's permission (:class:`~torchrl.data.RateLimitedReplayBuffer`,
            ``rate_limiter=``), instead of failing. Defaults to ``False``.
        timeout (float, optional): the longest wait of one draw with ``wait=True`` (``TimeoutError`` past it).
            Defaults to ``None`` (as long as it takes).

    Readiness counters and rate limits: building the dataset also moves the buffer's readiness counters (and a
    rate limiter's reservations) to shared memory with its writer's cursor (``replay_buffer.share_memory_()``),
    so the workers and the main process count samples in one place and draw from one budget.

    Resuming: :meth:`state_dict` and :meth:`load_state_dict` implement the protocol of torchdata's
    ``StatefulDataLoader``, so that a resumed run yields exactly the batches an uninterrupted one would have;
    see :ref:`resuming-training`.

    Examples:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, tensordict_collate
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(torch.arange(100))
        >>> [batch.shape for batch in rb.as_dataset(num_batches=3).loader()]
        [torch.Size([8]), torch.Size([8]), torch.Size([8])]
        >>> loader = DataLoader(rb.as_dataset(num_batches=3), batch_size=None, collate_fn=tensordict_collate)
        >>> [batch.shape for batch in loader]  # the same DataLoader, built by hand
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

    def __init__(
        self,
        replay_buffer,
        *,
        num_batches: int | None = None,
        transport: str = DEFAULT_TRANSPORT,
        rank: int | None = None,
        world_size: int | None = None,
        share_sampler: bool = True,
        wait: bool = False,
        timeout: float | None = None,
    ):
        _check_replay_buffer(replay_buffer)
        self.wait = check_bool("wait", wait, hint="Pass True to wait for data in each draw, or False.")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"`timeout` must be None or a number of seconds >= 0, got {timeout!r}.")
        self.timeout = timeout
        self.share_sampler = _check_share_sampler(share_sampler)
        self.num_batches = _check_num_batches(num_batches)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._position = ReaderPosition()
        self.transport = check_transport(transport)
        if type(self).draw is ReplayBufferDataset.draw and getattr(replay_buffer, "batch_size", None) is None:
            raise ValueError(
                "rb.as_dataset() yields rb.sample() batches and needs the buffer's batch size: build the buffer "
                "with ReplayBuffer(..., batch_size=N)."
            )
        self.replay_buffer = replay_buffer
        self._seeded_worker: int | None = None
        self._thread_check = WorkerThreadCheck()  # see NOTE [forked workers and OpenMP] in loading/worker_threads.py
        storage = replay_buffer.storage
        if hasattr(storage, "share_memory_"):  # a lazy storage then allocates in shared memory at its first write
            storage.share_memory_()
        share_counters = getattr(replay_buffer, "share_memory_", None)
        if callable(share_counters):  # the writer's count and the readiness counters: one budget for all workers
            share_counters()
        if self.share_sampler:
            _share_stateful_components(replay_buffer)

    # -- hooks for subclasses ---------------------------------------------------------------------------------
    def draw(self) -> Any:
        """One sampling call: ``replay_buffer.sample()``. Override it to sample differently (another batch
        size, ``return_info=True``, a check of what was sampled). With ``wait=True``:
        ``replay_buffer.sample(wait=True, timeout=timeout)``."""
        if self.wait:
            return self.replay_buffer.sample(wait=True, timeout=self.timeout)
        return self.replay_buffer.sample()

    def items(self, batch) -> Iterator[Any]:
        """What one sampling call yields: the batch itself. Override it to split the batch into items, or to
        reshape what is yielded; each yielded object goes through the dataset's transport."""
        yield batch

    # -- the DataLoader ----------------------------------------------------------------------------------------
    def loader(self, **kwargs) -> DataLoader:
        """A :class:`~torch.utils.data.DataLoader` that yields this dataset's batches as they are.

        Returns ``DataLoader(self, batch_size=None, collate_fn=tensordict_collate, **kwargs)``: the items
        already are batches, so the loader batches nothing (``batch_size=None``), and
        :func:`~torchrl.data.tensordict_collate` returns each one unchanged (torch's default would pass a
        TensorDict batch to ``default_convert``, which fails). An iterable dataset is not told the batch size of
        the DataLoader that reads it, so a DataLoader built with a ``batch_size`` (torch's default is 1) silently
        stacks the batches into ``[batch_size, B]``; this method is the way not to get that wrong.

        ``pin_memory=True`` gives batches whose every leaf is in pinned memory, ready for
        ``batch.to("cuda", non_blocking=True)``: torch's pin-memory thread pins each TensorDict batch in the main
        process as it arrives (a worker's batch crosses processes in shared memory, which is not pinned). Without an
        accelerator, torch warns and pins nothing. See :ref:`gpu-and-compile`.

        This is for the default :meth:`items` (one batch per item). A subclass whose items are single items
        (e.g. :class:`~torchrl.modules.llm.TorchRLBufferDataset`) is read by a DataLoader with a batch size of
        its own: build that DataLoader directly.

        Keyword Args:
            **kwargs: the other arguments of :class:`~torch.utils.data.DataLoader`, passed as given:
                ``num_workers``, ``multiprocessing_context``, ``worker_init_fn``, ``generator``,
                ``persistent_workers``, ``prefetch_factor``, ``pin_memory``, ``timeout``, ... ``batch_size`` and
                ``collate_fn`` are refused (``TypeError``): this method sets them.

        Returns:
            torch.utils.data.DataLoader: a new loader over this dataset.

        Raises:
            TypeError: ``batch_size`` or ``collate_fn`` in ``kwargs``; the message says how to get another
                batch size or collate function.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
            >>> _ = rb.extend(torch.arange(100))
            >>> loader = rb.as_dataset(num_batches=2).loader(num_workers=0)
            >>> [batch.shape for batch in loader]
            [torch.Size([8]), torch.Size([8])]
            >>> rb.as_dataset().loader(batch_size=4)
            Traceback (most recent call last):
              ...
            TypeError: ReplayBufferDataset.loader() sets `batch_size`=None itself ...
        """
        if "batch_size" in kwargs:
            raise TypeError(
                f"{type(self).__name__}.loader() sets `batch_size`=None itself: each item of the dataset already is "
                f"a batch of the buffer's batch size (rb.batch_size={getattr(self.replay_buffer, 'batch_size', None)}"
                f"), and a loader batch size would stack several of them (got batch_size={kwargs['batch_size']!r}). "
                f"Change the buffer's batch size instead (ReplayBuffer(..., batch_size=N)), or build "
                f"torch.utils.data.DataLoader(dataset, batch_size=..., collate_fn=tensordict_collate) yourself to "
                f"stack batches."
            )
        if "collate_fn" in kwargs:
            raise TypeError(
                f"{type(self).__name__}.loader() sets `collate_fn`=tensordict_collate itself, which returns each "
                f"batch unchanged (got collate_fn={kwargs['collate_fn']!r}). Apply a per-batch function with a "
                f"transform of the buffer (rb.append_transform(fn)), or build torch.utils.data.DataLoader(dataset, "
                f"batch_size=None, collate_fn=...) yourself."
            )
        return DataLoader(self, batch_size=None, collate_fn=tensordict_collate, **kwargs)

    # -- iteration ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("This ReplayBufferDataset is endless (num_batches=None): it has no length.")
        return self.num_batches

    def _batches_for_this_process(self) -> int | None:
        return reader_quota(self.num_batches, current_reader(self.rank, self.world_size))

    def _prepare_worker_copy(self) -> None:
        """Runs once per worker: refuses stateful buffers, then lets the buffer ready its copy and reseed."""
        info = get_worker_info()
        if info is None or self._seeded_worker == info.id:
            return
        if self.refuse_stateful and self.replay_buffer.stateful_component() is not None:
            raise RuntimeError(stateful_message(self.replay_buffer, "in a forked worker"))
        self.replay_buffer.prepare_worker_copy(info.seed)
        self._seeded_worker = info.id

    def __iter__(self) -> Iterator[Any]:
        # The reader's position starts its iteration here, not at the first batch: a DataLoader worker calls
        # iter() when it (re)starts an iteration, and a persistent worker's state taken then (torchdata takes one at
        # each new iteration) must already be that of the new iteration. See NOTE [ Exact resume of a replay-buffer
        # DataLoader ] in loading/resume_state.py.
        self._thread_check.check(self)
        self._prepare_worker_copy()
        self._position.begin_epoch(self.replay_buffer, current_reader(self.rank, self.world_size))
        return self._iterate(self._position)

    def _iterate(self, position: ReaderPosition) -> Iterator[Any]:
        quota = self._batches_for_this_process()
        plan = self._planned_draws(position.iterations)  # see NOTE [planned epochs] in samplers/_shared_epoch.py
        pinned = quota is None and plan is None and self._pin_epoch()  # see NOTE [pinned epochs] there
        try:
            while quota is None or position.draws < quota:
                skip = position.start_draw()
                try:
                    with contextlib.nullcontext() if plan is None else plan(position.draws):
                        drawn = self.draw()
                except EpochEnded:  # the sampler's epoch ended (in this worker or another): so does this one
                    return
                items = list(self.items(drawn))
                if skip >= len(items):
                    position.draw_was_empty()
                for index in range(skip, len(items)):
                    position.item_yielded(index, len(items))  # before the yield: a state taken now counts it
                    yield prepare_batch(items[index], self.transport)
        finally:
            if pinned:
                self.replay_buffer.unpin_epoch()

    def _planned_draws(self, iteration: int):
        """In a DataLoader worker over a sampler that draws by number (``planned_draw``, shared): a function of
        this worker's draw count giving the context of its next draw, else ``None``.

        Worker ``w`` of ``N`` makes the batches numbered ``w + k * N`` of its rank's iteration (its ``k``-th draw),
        so the workers of a rank number ``0 .. T - 1`` between them, where ``T`` is the rank's share of
        ``num_batches`` (``len(range(rank, num_batches, world_size))``, the split of ``loading/ranks.py``), or one epoch
        with ``num_batches=None``. The key mixes torch's base seed of the iteration (``seed - id``, the same for
        its workers, and restored by ``StatefulDataLoader`` on resume) with the reader's ``iteration`` count
        (persistent workers keep their seed across iterations). Ranks number apart: each rank's buffer holds its
        own sampler state."""
        info = get_worker_info()
        sampler = getattr(self.replay_buffer, "sampler", None)
        planned_draw = getattr(sampler, "planned_draw", None)
        if info is None or not callable(planned_draw) or not getattr(sampler, "is_shared", False):
            return None
        key, worker, workers = iteration_key(info.seed - info.id, iteration), info.id, info.num_workers
        total = None if self.num_batches is None else len(range(self.rank, self.num_batches, self.world_size))
        return lambda draws: planned_draw(key, worker + draws * workers, total)

    def _pin_epoch(self) -> bool:
        """Pins the buffer's sampler to its epoch in progress, with the readers of this DataLoader iteration
        (the workers of one iteration share ``seed - id``, torch's base seed of the iteration)."""
        pin = getattr(self.replay_buffer, "pin_epoch", None)
        if pin is None or not callable(getattr(self.replay_buffer, "unpin_epoch", None)):
            return False
        info = get_worker_info()
        if info is None:
            pin(None, 1)
        else:
            pin(info.seed - info.id, info.num_workers)
        return True

    # -- resume (torchdata's StatefulDataLoader protocol) ------------------------------------------------------------
    def _resume_config(self) -> dict[str, Any]:
        sampler = getattr(self.replay_buffer, "sampler", None)
        return {
            "dataset": type(self).__name__,
            "num_batches": self.num_batches,
            "batch_size": getattr(self.replay_buffer, "batch_size", None),
            "buffer_length": len(self.replay_buffer.storage),
            "sampler": None if sampler is None else qualname(sampler),
        }

    def state_dict(self) -> dict[str, Any]:
        """The state of the reader iterating this dataset in the calling process (a DataLoader worker, or the
        main process with ``num_workers=0``): its position in its share of the epoch and its random stream.

        torchdata's :class:`~torchdata.stateful_dataloader.StatefulDataLoader` calls it in each worker after
        each batch, and :meth:`load_state_dict` in the same worker before a resumed iteration, so that a
        resumed run yields the same batches as an uninterrupted one. The state holds numbers, strings and
        ``bytes`` (no tensors, no pickled objects). The buffer's content and its sampler's state are not in
        it: save them with the buffer (:func:`~torchrl.data.save_training_state` saves both at once). See
        :ref:`resuming-training`.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
            >>> _ = rb.extend(torch.arange(16))
            >>> ds = rb.as_dataset(num_batches=3)
            >>> it = iter(ds)
            >>> _ = next(it)
            >>> ds.state_dict()["draws"]
            1
        """
        return self._position.state_dict(current_reader(self.rank, self.world_size), self._resume_config())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a reader state saved by :meth:`state_dict`; it takes effect when the next iteration starts
        (the per-worker reseed at worker start does not overwrite it).

        Raises:
            ValueError: if the state was saved with another number of workers, ranks, batch size,
                ``num_batches`` or sampler, or with a buffer longer than this one (the message names the
                difference and what to do). Nothing is changed then.
        """
        self._position.load_state_dict(state_dict, current_reader(self.rank, self.world_size), self._resume_config())

    def check_state_dict(
        self, state_dict: dict[str, Any], *, worker: int | None = None, num_workers: int = 0,
        buffer_length: int | None = None,
    ) -> None:
        """Raises the ``ValueError`` :meth:`load_state_dict` would raise in worker ``worker`` of
        ``num_workers`` (``None`` and ``0``: the main process), without changing anything. ``buffer_length``
        replaces the buffer's current length (the length it will have once its checkpoint is loaded).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
            >>> _ = rb.extend(torch.arange(16))
            >>> state = rb.as_dataset(num_batches=3).state_dict()
            >>> rb.as_dataset(num_batches=5).check_state_dict(state)
            Traceback (most recent call last):
              ...
            ValueError: Cannot resume this ReplayBufferDataset: the loader state was saved with num_batches 3, and this run has 5. Build the dataset with the saved num_batches: rb.as_dataset(num_batches=...).
        """
        config = self._resume_config()
        if buffer_length is not None:
            config["buffer_length"] = buffer_length
        check_reader_state(state_dict, Reader(self.rank, self.world_size, worker, num_workers, None), config)

    def __getstate__(self):
        if is_spawning() and self.refuse_stateful and self.replay_buffer.stateful_component() is not None:
            raise RuntimeError(stateful_message(self.replay_buffer, "sent to a spawn/forkserver worker"))
        state = self.__dict__.copy()
        state["_seeded_worker"] = None
        # the worker's copy of the buffer never samples from its parent's prefetch queue: not sent (it unpickles
        # as the buffer itself)
        state["replay_buffer"] = WithoutQueue(self.replay_buffer)
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}, "
            f"num_batches={self.num_batches}, transport={self.transport!r}"
            + (f", rank={self.rank}, world_size={self.world_size})" if self.world_size > 1 else ")")
        )
