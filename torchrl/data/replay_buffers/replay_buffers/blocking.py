"""BlockingReplayBuffer: producers wait until consumed slots free up (TorchRL's ``BlockingReplayBuffer``).

Data model: a consuming buffer (``consume_after_n_samples=N``, a :class:`~torchrl.data.ConsumingSampler`) whose
capacity is its storage's ``max_size``. ``len(rb)`` counts the *live* items (stored, not consumed yet). A write of
``n`` items is admitted when ``live + admitted + n <= capacity``, ``admitted`` being the items of the writes
admitted and not finished yet: a reservation in the buffer's flow control (``reserved_inserts``, NOTE [readiness
and waiting] in ``_readiness.py``), taken under the flow lock, so two producers never both take the last free
slots, and released once the write is done. The writer fills consumed slots first and the storage's empty rows
next (``RoundRobinWriter.extend_free_first``), so an admitted write never overwrites a live item. A draw consumes
items and wakes the waiting producers of this process; producers of other processes sharing the buffer poll the
shared counters (a few milliseconds).
"""

from __future__ import annotations

import contextlib
import numbers
import time
from typing import Any

import torch

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.replay_buffers._batch_layout import items_in
from torchrl.data.replay_buffers.replay_buffers._readiness import check_wait_args, wait_until
from torchrl.data.replay_buffers.replay_buffers._service_backend import ServiceBackendMeta
from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer

__all__ = ["BlockingReplayBuffer"]

BLOCKING_TIMEOUT = TorchRLPhrase(
    TimeoutError,
    "Replay buffer did not obtain write capacity within {timeout} seconds.",
    "Replay buffer did not obtain write capacity within {timeout} seconds. A write of {n} items waited for "
    "{n} free slots ({detail}); only draws free slots (each item is consumed after {count} draws). Sample from "
    "the buffer (rb.sample, in this or another process sharing it), pass a larger timeout, or timeout=None to "
    "wait as long as it takes. Nothing was written.",
)
BLOCKING_CANCELLED = TorchRLPhrase(
    RuntimeError,
    "Replay-buffer writing was cancelled.",
    "Replay-buffer writing was cancelled. The `cancel_event` passed to {method}() was set while the write of {n} "
    "items waited for free slots; nothing was written. Clear the event (or pass another one) to write again.",
)

# the largest max_size that is a real capacity: ListStorage(None) stands for an unbounded list with int64's max
_UNBOUNDED = 2**63 - 1


def _refused(name: str, value, why: str, instead: str) -> ValueError:
    return ValueError(
        f"BlockingReplayBuffer does not support `{name}` (got {name}={value!r}): {why}. {instead}"
    )


class _DirectServiceOnly(ServiceBackendMeta):
    """:class:`ServiceBackendMeta` that refuses every ``service_backend`` but ``"direct"`` before the service
    keywords are read: a producer blocked inside a hosted buffer would block the only thread that can sample."""

    def __call__(cls, *args, **kwargs):
        backend = kwargs.get("service_backend")
        if kwargs.get("use_ray_service") is True:
            backend = "ray"
        if backend is not None and backend != "direct":
            raise _refused(
                "service_backend", backend,
                "a write that waits inside a buffer hosted by a service would hold the only thread that can "
                "sample and free its slots",
                "Build it in this process (service_backend='direct', the default) and share it with the other "
                "processes (shared=True), or use a RayReplayBuffer without blocking writes.",
            )  # fmt: skip
        return super().__call__(*args, **kwargs)


class BlockingReplayBuffer(ReplayBuffer, metaclass=_DirectServiceOnly):
    """A consuming replay buffer whose writes wait for free slots instead of overwriting unconsumed items.

    Each item is drawn at most ``consume_after_n_samples`` times (a :class:`~torchrl.data.ConsumingSampler`),
    after which its slot is free. :meth:`add` and :meth:`extend` wait until the whole write fits in the free
    slots (``len(rb) + n <= storage.max_size``, ``len(rb)`` counting the items not consumed yet) and then write
    it at once: a write never overwrites an unconsumed item and is admitted whole or not at all. Every draw
    wakes the waiting producers. This gives a producer/consumer queue with back-pressure: collectors wait for
    the learner instead of dropping data it has not seen.

    Threads of one process share the buffer as it is. Processes share it once it is shared (``shared=True`` or
    :meth:`~torchrl.data.ReplayBuffer.share`, over a tensor or memory-mapped storage): the admission counters,
    the consumed slots and the storage then live in shared memory under cross-process locks, and a producer of
    one process sees the draws of another within a few milliseconds. A :class:`~torchrl.data.ListStorage`
    lives in one process only: use it with threads.

    Not supported (``ValueError`` at construction): a custom ``sampler`` (the buffer builds its own consuming
    sampler), ``compilable=True`` (a traced write cannot wait), ``transform``/``transform_factory`` (a write
    path that changes the number of items would break the admission), a ``service_backend`` other than
    ``"direct"``, and beyond TorchRL a ``rate_limiter`` (the buffer is its own) and ``delayed_init=True`` (the
    capacity must be known). As for every consuming buffer, ``prefetch`` and storages with ``ndim > 1`` are
    refused too. The storage needs a finite ``max_size`` (a ``ListStorage()`` without one is refused).

    Keyword Args:
        consume_after_n_samples (int): how many draws consume an item (``>= 1``). Defaults to ``1``.
        **kwargs: the other keywords of :class:`~torchrl.data.ReplayBuffer` (``storage``, ``batch_size``,
            ``shared``, ``generator``, ...). Defaults to ``ListStorage(1000)`` for the storage.

    Raises:
        ValueError: one of the refused keywords above; a storage without a finite ``max_size``.

    Examples:
        >>> import threading, torch
        >>> from torchrl.data import BlockingReplayBuffer, LazyTensorStorage
        >>> rb = BlockingReplayBuffer(storage=LazyTensorStorage(4), batch_size=2)
        >>> _ = rb.extend(torch.arange(4))  # full: the next write waits for a draw
        >>> try:
        ...     rb.extend(torch.arange(4, 6), timeout=0.01)
        ... except TimeoutError as err:
        ...     print("waited:", "did not obtain write capacity" in str(err))
        waited: True
        >>> producer = threading.Thread(target=rb.extend, args=(torch.arange(4, 6),), kwargs={"timeout": 10.0})
        >>> producer.start()
        >>> first = rb.sample()  # consumes two items: the producer's write goes in
        >>> producer.join(10.0)
        >>> len(rb), sorted(torch.cat([first, rb.sample(4)]).tolist())
        (4, [0, 1, 2, 3, 4, 5])
    """

    def __init__(self, *, consume_after_n_samples: int = 1, **kwargs: Any) -> None:
        self._check_own_arguments(consume_after_n_samples, kwargs)
        storage = kwargs.get("storage")
        if storage is not None and not callable(storage):  # an instance: checked before anything is built
            _capacity_of(storage)
        super().__init__(consume_after_n_samples=consume_after_n_samples, **kwargs)
        self._capacity = _capacity_of(self.storage)  # a storage built from a factory: checked now

    @staticmethod
    def _check_own_arguments(consume_after_n_samples, kwargs: dict) -> None:
        if consume_after_n_samples is None:
            raise _refused(
                "consume_after_n_samples", None, "its writes wait for consumed slots, so items must be consumed",
                "Pass an int >= 1 (the draws that consume an item; 1 by default).",
            )
        if kwargs.get("sampler") is not None:
            raise _refused(
                "sampler", kwargs["sampler"],
                "it builds its own ConsumingSampler(max_sample_count=consume_after_n_samples), whose free slots "
                "its writes wait for",
                "Leave `sampler` out and pass consume_after_n_samples=n.",
            )
        if kwargs.get("compilable"):
            raise _refused(
                "compilable", kwargs["compilable"], "a write traced by torch.compile cannot wait for free slots",
                "Leave compilable out (or pass compilable=False).",
            )
        for name in ("transform", "transform_factory"):
            if kwargs.get(name) is not None:
                raise _refused(
                    name, kwargs[name],
                    "a write-path transform may change the number of items written after the free slots were "
                    "counted",
                    "Apply the transform to the data before rb.extend, or to the batches rb.sample returns.",
                )
        if kwargs.get("rate_limiter") is not None:
            raise _refused(
                "rate_limiter", kwargs["rate_limiter"], "it is its own limiter (writes wait for consumed slots)",
                "Leave `rate_limiter` out, or use a ReplayBuffer with that limiter.",
            )
        if kwargs.get("delayed_init"):
            raise _refused(
                "delayed_init", kwargs["delayed_init"],
                "its writes are admitted against the storage's capacity, which must be known at construction",
                "Leave delayed_init out (or pass delayed_init=False).",
            )

    # -- writes: admitted whole once the free slots hold them -------------------------------------------------
    def add(self, data, *, timeout: float | None = None, cancel_event=None) -> Any:
        """Writes one item once a slot is free (see :meth:`extend`); returns its index.

        Keyword Args:
            timeout (float, optional): the longest wait in seconds. Defaults to ``None`` (as long as it takes).
            cancel_event (optional): an object with ``is_set()``; once set, the wait ends. Defaults to ``None``.
        """
        timeout = check_wait_args(False, timeout, cancel_event)
        with self._admitted(1, timeout, cancel_event, "add"):
            return self._write_item(data)

    def extend(self, data, *, update_priority=None, timeout: float | None = None, cancel_event=None) -> torch.Tensor:
        """Writes a batch once the free slots hold all of it, and returns the written indices.

        The write waits until ``len(rb) + n <= storage.max_size`` (``n`` items, ``len(rb)`` the items not
        consumed yet), woken by every draw, then writes the whole batch at once into free slots: no unconsumed
        item is overwritten, and no part of the batch is written before the rest fits.

        Keyword Args:
            update_priority: TorchRL's keyword; must be ``None`` (the consuming sampler keeps no priorities).
            timeout (float, optional): the longest wait in seconds (``>= 0``), then a ``TimeoutError``. Defaults to
                ``None`` (as long as it takes).
            cancel_event (optional): any object with ``is_set()`` (``threading.Event``,
                ``multiprocessing.Event``): once set, the wait ends with a ``RuntimeError``. Defaults to ``None``.

        Raises:
            ValueError: a batch larger than the storage's ``max_size`` (it could never fit); a negative or NaN
                ``timeout``.
            NotImplementedError: an ``update_priority`` (as a plain buffer's ``extend`` without priorities).
            TypeError: a ``timeout`` that is not a number; a ``cancel_event`` without ``is_set()``.
            TimeoutError: no room for the batch within ``timeout`` seconds (nothing written).
            RuntimeError: ``cancel_event`` was set, or the buffer was shut down (:meth:`shutdown`), during the
                wait (nothing written).
        """
        timeout = check_wait_args(False, timeout, cancel_event)
        if update_priority is not None:  # the base buffer's type for a sampler without priorities
            raise NotImplementedError(
                f"BlockingReplayBuffer.extend() got update_priority={update_priority!r}, and its "
                f"ConsumingSampler keeps no priorities (it draws uniformly among the unconsumed items). Leave "
                f"update_priority out. Nothing was written."
            )
        data = self._as_stored_batch(data)
        if data is None:
            return torch.zeros((0, self.storage.ndim), dtype=torch.long)
        with self._admitted(items_in(data), timeout, cancel_event, "extend"):
            return self._write_batch(data)

    @contextlib.contextmanager
    def _admitted(self, n: int, timeout: float | None, cancel_event, method: str):
        """Holds room for ``n`` items for the time of a write: waits for it, reserves it, releases it after."""
        self._reserve_room(n, timeout, cancel_event, method)
        wrote = False
        try:
            yield
            wrote = True
        finally:
            self._flow.release_inserts(n, wrote=wrote)

    def _reserve_room(self, n: int, timeout: float | None, cancel_event, method: str) -> None:
        capacity, flow = self._capacity, self._flow
        if n > capacity:
            raise ValueError(
                f"BlockingReplayBuffer.{method}() got {n} items and the storage holds {capacity} "
                f"(max_size): the write could never fit. Write at most {capacity} items at a time, or use a larger "
                f"storage."
            )
        deadline = None if timeout is None else time.monotonic() + timeout

        def alive() -> bool:  # checked before each look at the room: our errors, not the sample side's
            if not self.is_alive or flow.closed:
                raise RuntimeError(
                    f"The replay buffer was shut down (rb.shutdown()) while {method}() waited for free slots: "
                    f"nothing was written. Build a new buffer to write again."
                )
            if cancel_event is not None and cancel_event.is_set():
                raise BLOCKING_CANCELLED.error(method=method, n=n)
            return True

        sampler = self.sampler

        def room(counters: dict[str, int]) -> bool:  # NOTE [live count without the storage] below
            return sampler.num_sampleable() + counters["reserved_inserts"] + n <= capacity

        alive()
        if flow.try_reserve("insert", n, room, deadline):
            return
        flow.add("insert_wait_count", 1, deadline)

        def timed_out() -> BaseException:
            detail = (
                f"{len(self)} unconsumed items and {flow.get('reserved_inserts')} admitted in other writes, of "
                f"{capacity} slots"
            )
            return BLOCKING_TIMEOUT.error(
                timeout=timeout, n=n, detail=detail, count=self.sampler.max_sample_count
            )

        wait_until(
            flow, lambda: flow.try_reserve("insert", n, room, deadline), timeout=timeout, cancel_event=None,
            is_alive=alive, on_timeout=timed_out, deadline=deadline,
        )  # fmt: skip

    # -- draws: consuming items frees slots ------------------------------------------------------------------
    def _sample(self, batch_size: int, transform: bool = True):
        # NOTE [draws beside writes of other processes]: a write holds the storage's write lock (cross-process once
        # shared) from its first row to the sampler learning of its slots; a draw holding it too never takes rows
        # written and not announced yet, which the end of that write would make drawable again (drawn twice)
        with self._replay_lock, self._storage.write_lock:
            out = super()._sample(batch_size, transform)
        flow = self._flow
        if flow.waiters:  # producers of this process waiting for the slots this draw freed
            flow.notify()
        return out


def _capacity_of(storage) -> int:
    """The storage's ``max_size`` as the buffer's capacity; ``ValueError`` unless it is a finite int ``>= 1``."""
    max_size = getattr(storage, "max_size", None)
    if (
        isinstance(max_size, bool)
        or not isinstance(max_size, numbers.Integral)
        or not 1 <= max_size < _UNBOUNDED
    ):
        shown = "unbounded" if isinstance(max_size, numbers.Integral) and max_size >= _UNBOUNDED else repr(max_size)
        raise ValueError(
            f"BlockingReplayBuffer needs a storage with a finite int max_size >= 1 (its writes wait for free "
            f"slots of it); got {type(storage).__name__} with max_size {shown}. Pass a bounded storage, e.g. "
            f"LazyTensorStorage(1000) or ListStorage(1000)."
        )
    return int(max_size)

