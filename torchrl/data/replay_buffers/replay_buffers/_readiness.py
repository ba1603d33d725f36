"""Readiness and flow control of a replay buffer: the cumulative counters, waiting for data, reserving budget.

NOTE [readiness and waiting]: every buffer owns one :class:`FlowState`: cumulative int64 counters
(``sample_calls``, ``samples_returned``, the reservations of a limiter and its wait counts) in a
:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters`, and the lock that orders changes to them (a
``threading.RLock``, or a cross-process :class:`~torchrl.data.replay_buffers._shared.lock.ProcessLock` once the
buffer is shared). ``rb.sample(wait=True)`` and a limited ``extend`` wait in :func:`wait_until`: a
``threading.Condition`` wakes them at once on a write of this process (writers call :meth:`FlowState.notify`,
which costs a read of the waiter count when nobody waits), and a poll with a short backoff (0.5 ms doubling to
:data:`MAX_POLL_S`) sees a write made by another process into the shared storage (its length and the writer's
write count live in shared memory). ``shutdown()`` and a ``cancel_event`` end a wait with a ``RuntimeError``.

A limiter (``RateLimitedReplayBuffer``'s budget, ``rate_limiter=MinSize(...)`` / ``SampleToInsertRatio(...)``)
is consulted through :meth:`FlowState.try_reserve`: under the lock, it reads the counters and, when the request
is permitted, adds it to ``reserved_samples`` / ``reserved_inserts``; a finished draw moves its reservation
to ``samples_returned`` in one locked step (:meth:`FlowState.commit_samples`), and a finished write releases its
reservation after the writer counted it, so the counters a limiter reads are never ahead of what happened:
every process and DataLoader worker sharing the buffer draws from one budget and none over-draws it.

What this costs a sample that nobody waits for is kept to a few reads and writes of the counters' memory (a
memoryview, :attr:`SharedCounters.cells <torchrl.data.replay_buffers._shared.counters.SharedCounters.cells>`)
under one lock acquisition per step (issue 27; ``benchmarks/readiness_cost.py``): ``rb.sample()`` counts under
the thread lock, a shared buffer in a per-process slot without the cross-process lock (NOTE [draw counts of a
shared buffer] in :class:`FlowState`), and a permitted limited sample in :func:`limited_draw` checks and counts
its records as returned in one acquisition of the flow lock, before the draw (the limiter sees the same sum of
returned and reserved records as with a reservation); a draw that raises, or returns fewer records, gives the
difference back (:meth:`FlowState.give_back`). A sample that waited keeps the reservation and commit.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from torchrl.data.replay_buffers._shared.cleanup import pid_is_gone
from torchrl.data.replay_buffers._shared.counters import SharedCounters
from torchrl.data.replay_buffers._shared.lock import ProcessLock
from torchrl.data.replay_buffers.errors import torchrl_error

__all__ = [
    "FlowState",
    "MAX_POLL_S",
    "check_wait_args",
    "gated_draw",
    "records_in",
    "reserved_draw",
    "wait_until",
]

#: The longest sleep between two looks at the counters while waiting (the cross-process wake latency).
MAX_POLL_S = 0.005
_FIRST_POLL_S = 0.0005

#: The counters of a buffer's flow state, in order.
COUNTERS = (
    "sample_calls",
    "samples_returned",
    "reserved_samples",
    "reserved_inserts",
    "sample_wait_count",
    "insert_wait_count",
    "closed",  # set by shutdown(): the waits of every process sharing the buffer end
)

_pid = [os.getpid()]  # this process's id (os.getpid() is a system call; a fork updates it: _after_fork)


def _after_fork() -> None:
    _pid[0] = os.getpid()


os.register_at_fork(after_in_child=_after_fork)

# positions in COUNTERS, for the hot paths that read and write the counters' memoryview (SharedCounters.cells)
CELL_SAMPLE_CALLS, CELL_SAMPLES_RETURNED, CELL_RESERVED_SAMPLES, CELL_CLOSED = 0, 1, 2, 6
#: How many processes (FlowState objects) of a shared buffer count their draws in slots of their own
#: (NOTE [draw counts of a shared buffer]); the others count under the cross-process lock.
SLOTS = 64
# the slot table: the number of slots claimed, then per slot: its owner's pid, a version, sample_calls and
# samples_returned
_SLOT_FIELDS = ("owner", "version", "calls", "returned")
_SLOT_NAMES = ("claimed", *(f"{field}{i}" for i in range(SLOTS) for field in _SLOT_FIELDS))
#: The counters a checkpoint keeps (reservations belong to calls in flight: they restart at 0).
SAVED_COUNTERS = ("sample_calls", "samples_returned", "sample_wait_count", "insert_wait_count")


class FlowState:
    """The readiness counters of one buffer, their lock and the condition its waiters sleep on.

    Keyword Args:
        shared (bool): put the counters in shared memory and order them with a cross-process lock now.
            Defaults to ``False`` (see :meth:`share_memory_`).

    Attributes (read by the buffer's hot paths; change them only through the methods):
        lock: the lock that orders changes to the counters: a ``ProcessLock`` once shared, else a thread lock.
        cells: the counters as a memoryview, in the order of :data:`COUNTERS`.
        slot_cells: the slot table of a shared buffer as a memoryview (``None`` while private): NOTE [draw
            counts of a shared buffer].
        waiters: how many threads of this process wait in :func:`wait_until`.
        checked_request: the ``(limiter, batch size)`` that last passed ``check_sample_request`` (a
            request's check depends on them alone), or ``None``.

    NOTE [draw counts of a shared buffer]: ``sample_calls`` and ``samples_returned`` are counted on every
    draw; a cross-process lock there costs two ``flock`` calls per sample. So once shared, each process (each
    ``FlowState`` object in it) counts the draws it makes without a limiter in a slot of its own, in a second
    shared table (:data:`SLOTS` slots, claimed once under the lock, a slot of a dead process taken over),
    under this process's thread lock only: a slot has one writer, so no update is lost, and a version made odd
    while its two counts change lets readers take the pair as one. A counter's value is its cell in the
    counters plus the sum of the slots (:meth:`get`, :meth:`as_dict`): exact at every moment. Resets and loads
    set the cells so that the sums come out right; draws behind a limiter are counted in the cells, with
    their reservation, under the lock.

    Examples:
        >>> from torchrl.data.replay_buffers.replay_buffers._readiness import FlowState
        >>> state = FlowState()
        >>> state.count_draw(4)
        >>> state.get("sample_calls"), state.get("samples_returned")
        (1, 4)
        >>> state.state_dict()["samples_returned"]
        4
    """

    def __init__(self, *, shared: bool = False) -> None:
        self._counters = SharedCounters(COUNTERS)
        self._process_lock: ProcessLock | None = None
        self._slots: SharedCounters | None = None  # the draw counts of each process, once shared
        self._make_runtime()
        self._attach()
        if shared:
            self.share_memory_()

    def _make_runtime(self) -> None:
        self._thread_lock = threading.RLock()  # re-entrant: try_reserve's check may read the counters
        self._cond = threading.Condition(threading.Lock())
        self.waiters = 0
        self._wakeups = 0
        self.checked_request = None
        self._slot_pid = None  # the process _slot_at holds for (a copy made by fork claims its own slot)
        self._slot_at = -1  # where this object's slot starts in the slot table; -1: none (count under lock)

    def _attach(self) -> None:
        """Sets what the hot paths read (the attributes of the class docstring)."""
        self.cells = self._counters.cells
        self.slot_cells = None if self._slots is None else self._slots.cells
        self.lock = self._process_lock if self._process_lock is not None else self._thread_lock

    # -- sharing ---------------------------------------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        """Whether the counters live in shared memory (then ordered by a cross-process lock)."""
        return self._process_lock is not None

    def share_memory_(self) -> FlowState:
        """Moves the counters to shared memory and creates their cross-process lock (a no-op when shared)."""
        if self._process_lock is None:
            with self._thread_lock:
                self._counters.share_memory_()
                self._slots = SharedCounters(_SLOT_NAMES, shared=True)
                self._process_lock = ProcessLock()
                self._attach()
        return self

    # -- the slots of a shared buffer's draw counts: NOTE [draw counts of a shared buffer] ------------------
    def _claim_slot(self) -> int:
        """This object's slot in this process (claimed now, under the lock), or -1: every slot is taken."""
        pid = _pid[0] = os.getpid()
        slots = self.slot_cells
        at = -1
        if slots is not None:
            with self._process_lock:
                claimed = slots[0]
                for i in range(claimed):  # a dead process's slot first: its counts stay in the sums
                    owner = 1 + 4 * i
                    if _is_dead(slots[owner]):
                        at = owner
                        break
                if at < 0 and claimed < SLOTS:
                    at = 1 + 4 * claimed
                    slots[0] = claimed + 1
                if at >= 0:
                    slots[at] = pid
                    if slots[at + 1] & 1:  # its owner died while counting: even again
                        slots[at + 1] += 1
        self._slot_pid, self._slot_at = pid, at
        return at

    def slot_sums(self) -> tuple[int, int]:
        """``(sample_calls, samples_returned)`` counted in the slots (``(0, 0)`` while private)."""
        slots = self.slot_cells
        if slots is None:
            return 0, 0
        calls = returned = 0
        for at in range(1, 1 + 4 * slots[0], 4):
            for _ in range(1000):  # a pair changes within a few instructions; a writer killed meanwhile never
                # ends its change: then the pair as it is
                version = slots[at + 1]
                c, r = slots[at + 2], slots[at + 3]
                if not version & 1 and slots[at + 1] == version:
                    break
                os.sched_yield()
            calls += c
            returned += r
        return calls, returned

    def _returned_and_reserved(self) -> int:
        """``samples_returned + reserved_samples``: what a limiter counts as sampled (read under the lock)."""
        cells = self.cells
        samples = cells[CELL_SAMPLES_RETURNED] + cells[CELL_RESERVED_SAMPLES]
        return samples if self.slot_cells is None else samples + self.slot_sums()[1]

    def _totals(self) -> dict[str, int]:
        """Every counter (the slots added in), without taking the lock."""
        values = self._counters.as_dict()
        if self.slot_cells is not None:
            calls, returned = self.slot_sums()
            values["sample_calls"] += calls
            values["samples_returned"] += returned
        return values

    def _set_totals(self, values: dict[str, int]) -> None:
        """Sets counters to ``values`` (under the lock), their cells less what the slots hold."""
        in_slots = dict(zip(("sample_calls", "samples_returned"), self.slot_sums()))
        for name, value in values.items():
            self._counters[name] = value - in_slots.get(name, 0)

    # -- counters --------------------------------------------------------------------------------------------
    def get(self, name: str) -> int:
        """The value of counter ``name`` (one of :data:`COUNTERS`)."""
        if self.slot_cells is not None and name in ("sample_calls", "samples_returned"):
            return self._totals()[name]
        return self._counters[name]

    def as_dict(self) -> dict[str, int]:
        """Every counter, read under the lock (one consistent view)."""
        with self.lock:
            return self._totals()

    def add(self, name: str, n: int) -> None:
        """Adds ``n`` to counter ``name`` under the lock."""
        with self.lock:
            self._counters[name] = self._counters[name] + n

    def count_draw(self, records: int) -> None:
        """Counts one draw of ``records`` records (``sample_calls`` += 1, ``samples_returned`` += records)."""
        # the hot path of rb.sample(): the lock is taken with acquire/release, cheaper than a with statement
        slots = self.slot_cells
        if slots is not None:  # shared: in this process's slot, without the cross-process lock
            at = self._slot_at if self._slot_pid == _pid[0] else self._claim_slot()
            if at >= 0:
                lock = self._thread_lock
                lock.acquire()
                try:
                    version = slots[at + 1]
                    slots[at + 1] = version + 1
                    slots[at + 2] += 1
                    slots[at + 3] += records
                    slots[at + 1] = version + 2
                finally:
                    lock.release()
                return
        cells = self.cells
        lock = self.lock
        lock.acquire()
        try:
            cells[CELL_SAMPLE_CALLS] += 1
            cells[CELL_SAMPLES_RETURNED] += records
        finally:
            lock.release()

    def count_batch(self, info: dict, batch_size: int) -> None:
        """:meth:`count_draw` of the records a draw returned (:func:`records_in` of ``info["index"]``)."""
        self.count_draw(records_in(info.get("index"), batch_size))

    def commit_samples(self, reserved: int, records: int | None) -> None:
        """Ends a reserved draw: ``records`` (``None``: the draw failed) become returned and the reservation of
        ``reserved`` is released, in one locked step; then wakes the waiters."""
        cells = self.cells
        with self.lock:
            if records is not None:
                cells[CELL_SAMPLE_CALLS] += 1
                cells[CELL_SAMPLES_RETURNED] += records
            left = cells[CELL_RESERVED_SAMPLES] - reserved
            cells[CELL_RESERVED_SAMPLES] = left if left > 0 else 0
        if self.waiters:
            self.notify()

    def give_back(self, calls: int, records: int) -> None:
        """Takes back ``calls`` sample calls and ``records`` records counted ahead of a draw that raised or
        returned fewer records (:func:`limited_draw`), in one locked step; then wakes the waiters."""
        cells = self.cells
        with self.lock:
            cells[CELL_SAMPLE_CALLS] -= calls
            cells[CELL_SAMPLES_RETURNED] -= records
        self.notify()

    def release_inserts(self, reserved: int) -> None:
        """Ends a reserved write (after the writer counted it) and wakes the waiters."""
        with self.lock:
            self._counters["reserved_inserts"] = max(0, self._counters["reserved_inserts"] - reserved)
        self.notify()

    def try_reserve(self, side: str, n: int, permitted: Callable[[dict[str, int]], bool]) -> bool:
        """Under the lock: if ``permitted(counters)`` says yes, reserves ``n`` on ``side`` (``"sample"`` or
        ``"insert"``) and returns ``True``. ``permitted`` receives the counters read under the lock."""
        name = "reserved_samples" if side == "sample" else "reserved_inserts"
        with self.lock:
            if not permitted(self._totals()):
                return False
            self._counters[name] = self._counters[name] + n
        return True

    def reset(self, *, samples: bool) -> None:
        """Zeroes the reservations, and with ``samples=True`` the sample counters too (``rb.empty()``, which
        zeroes the write count: the ratio of samples to inserts starts over)."""
        with self.lock:
            names = [n for n in COUNTERS if n != "closed"] if samples else ("reserved_samples", "reserved_inserts")
            self._set_totals(dict.fromkeys(names, 0))
        self.notify()

    # -- shutdown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Marks the buffer shut down for every process sharing these counters, and wakes this one's waiters."""
        self._counters["closed"] = 1
        if self.waiters:
            with self._cond:
                self._wakeups += 1
                self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called, in this process or another one sharing the counters."""
        return self.cells[CELL_CLOSED] != 0

    # -- waking ----------------------------------------------------------------------------------------------
    def notify(self) -> None:
        """Wakes the threads of this process waiting in :func:`wait_until` (nothing to do when none waits)."""
        if self.waiters:
            with self._cond:
                self._wakeups += 1
                self._cond.notify_all()

    def _sleep(self, seconds: float) -> None:
        with self._cond:
            seen = self._wakeups
            self._cond.wait_for(lambda: self._wakeups != seen, timeout=seconds)

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """The counters a checkpoint keeps (:data:`SAVED_COUNTERS`)."""
        values = self.as_dict()
        return {name: values[name] for name in SAVED_COUNTERS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` (missing names: 0); the reservations restart at 0."""
        values = check_counter_state(state, "the readiness state")
        with self.lock:
            self._set_totals({name: values.get(name, 0) for name in COUNTERS if name != "closed"})
        self.notify()

    def __getstate__(self):
        return {"counters": self._counters, "process_lock": self._process_lock, "slots": self._slots}

    def __setstate__(self, state) -> None:
        self._counters = state["counters"]
        self._process_lock = state["process_lock"]
        # a state saved before the slots existed: the draws are counted under the lock
        self._slots = state.get("slots") if self._process_lock is not None else None
        self._make_runtime()
        self._attach()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._totals()}, shared={self.is_shared})"


def _is_dead(pid: int) -> bool:
    """Whether process ``pid`` is certainly gone (its slot may be taken over)."""
    if pid <= 0:
        return True
    if pid == os.getpid():
        return False  # another FlowState of this process: never share a slot between two thread locks
    return pid_is_gone(pid)


def check_counter_state(state, where: str) -> dict[str, int]:
    """The saved counters of ``state`` as ints; ``ValueError`` naming ``where`` for a bad value."""
    if not isinstance(state, dict):
        raise ValueError(f"{where} must be a dict of counters {list(SAVED_COUNTERS)}, got {state!r:.200}.")
    out = {}
    for name in SAVED_COUNTERS:
        value = state.get(name, 0)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 2**63:
            raise ValueError(
                f"{where}: counter {name!r} is {value!r:.100}, expected an int in [0, 2**63). Save the buffer "
                f"again (state_dict or dumps)."
            )
        out[name] = int(value)
    return out


def check_wait_args(wait, timeout, cancel_event) -> float | None:
    """Validates the waiting keywords of ``sample``/``extend``; returns ``timeout`` as a float (or ``None``)."""
    if not isinstance(wait, bool):
        raise TypeError(f"`wait` must be a bool, got {wait!r}. Pass wait=True to wait for data, or False.")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"`timeout` must be None or a number of seconds, got {timeout!r}.")
        if not timeout >= 0 or math.isnan(timeout):
            raise ValueError(f"`timeout` must be None (no limit) or >= 0 seconds, got {timeout!r}.")
        timeout = float(timeout)
    if cancel_event is not None and not callable(getattr(cancel_event, "is_set", None)):
        raise TypeError(
            f"`cancel_event` must be None or an object with is_set() (threading.Event, multiprocessing.Event), "
            f"got {type(cancel_event).__name__}."
        )
    return timeout


def wait_until(
    state: FlowState,
    ready: Callable[[], bool],
    *,
    timeout: float | None,
    cancel_event=None,
    is_alive: Callable[[], bool],
    on_timeout: Callable[[], BaseException],
) -> None:
    """Returns once ``ready()`` is true; raises when the buffer shuts down, ``cancel_event`` is set or
    ``timeout`` seconds passed (``on_timeout()`` builds that error).

    ``ready()`` is called at once, after each wake-up of this process's writers, and at least every
    :data:`MAX_POLL_S` seconds (writes of other processes): see NOTE [readiness and waiting].
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = _FIRST_POLL_S
    with state._cond:
        state.waiters += 1
    try:
        while True:
            if not is_alive() or state.closed:
                raise torchrl_error("rate_shut_down")
            if cancel_event is not None and cancel_event.is_set():
                raise torchrl_error("rate_cancelled")
            if ready():
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise on_timeout()
            state._sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 2, MAX_POLL_S)
    finally:
        with state._cond:
            state.waiters -= 1


def records_in(index, batch_size: int) -> int:
    """How many records a draw returned, from the index the sampler gave (the first dim of a tensor or of a
    per-dim tuple); ``batch_size`` when the index does not say (an ensemble's TensorDict)."""
    if isinstance(index, torch.Tensor):
        shape = index.shape
        return shape[0] if shape else 1
    if isinstance(index, tuple) and index and isinstance(index[0], torch.Tensor):
        return int(index[0].shape[0]) if index[0].ndim else 1
    if isinstance(index, int):
        return 1
    return batch_size


# -- the buffer's side: readiness, the limiter's checks and the waits (the buffer's methods delegate here) --------
def sampler_ready(rb, batch_size: int) -> bool:
    """Whether ``rb``'s sampler can draw ``batch_size`` now (``Sampler.can_sample``); ``False`` before the
    delayed init built the components."""
    return rb.initialized and rb.sampler.can_sample(rb.storage, batch_size)


def _view(rb, counters: dict[str, int]) -> dict[str, int]:
    """The limiter's view of the counters (``counters`` read under the lock first, then the write count)."""
    return {
        "inserts": rb.write_count,
        "samples": counters["samples_returned"],
        "reserved_samples": counters["reserved_samples"],
        "reserved_inserts": counters["reserved_inserts"],
        "size": len(rb),
    }


def _sample_permitted(rb, limiter, n: int):
    def permitted(counters: dict[str, int]) -> bool:
        if not sampler_ready(rb, n):
            return False
        v = _view(rb, counters)
        return limiter.sample_permitted(
            inserts=v["inserts"], samples=v["samples"] + v["reserved_samples"], size=v["size"], n=n
        )

    return permitted


def _insert_permitted(rb, limiter, n: int):
    def permitted(counters: dict[str, int]) -> bool:
        v = _view(rb, counters)
        pending = v["reserved_inserts"]
        return limiter.insert_permitted(
            inserts=v["inserts"] + pending, samples=v["samples"], size=v["size"] + pending, n=n
        )

    return permitted


def describe_counters(rb, state: FlowState) -> str:
    """The counters at this moment, for an error message."""
    v = _view(rb, state.as_dict())
    return (
        f"write_count={v['inserts']}, samples_returned={v['samples']}, reserved_samples={v['reserved_samples']}, "
        f"reserved_inserts={v['reserved_inserts']}, size={v['size']}"
    )


def can_sample(rb, state: FlowState, limiter, batch_size: int) -> bool:
    """``rb.can_sample(batch_size)``: the sampler is ready and the limiter (if any) permits the sample."""
    if limiter is None:
        return sampler_ready(rb, batch_size)
    if not rb.is_alive or state.closed:
        return False
    return _sample_permitted(rb, limiter, batch_size)(state.as_dict())


def wait_for_data(rb, state: FlowState, batch_size: int, *, timeout: float | None, cancel_event) -> None:
    """``sample(wait=True)`` of a buffer without a limiter: returns once the sampler can draw the batch."""
    if sampler_ready(rb, batch_size) and (cancel_event is None or not cancel_event.is_set()):
        return
    state.add("sample_wait_count", 1)

    def timed_out() -> BaseException:
        return TimeoutError(
            f"The replay buffer could not serve a batch of {batch_size} within {timeout} seconds: the sample side "
            f"waited ({describe_counters(rb, state)}; sampler {type(rb.sampler).__name__}). Write data first "
            f"(rb.extend, from this or another process sharing the buffer), pass a larger timeout, or "
            f"timeout=None to wait as long as it takes."
        )

    wait_until(
        state, lambda: sampler_ready(rb, batch_size), timeout=timeout, cancel_event=cancel_event,
        is_alive=lambda: rb.is_alive, on_timeout=timed_out,
    )  # fmt: skip


def try_reserve_sample(rb, state: FlowState, limiter, batch_size: int) -> bool:
    """Reserves ``batch_size`` records of the limiter's budget if it permits them now (never waits).

    :meth:`FlowState.try_reserve` with the limiter's check written out: once per reserved sample, in one
    acquisition of the flow lock, reading the counters' memory directly."""
    cells = state.cells
    with state.lock:
        if not (
            sampler_ready(rb, batch_size)
            and limiter.sample_permitted(
                inserts=rb.write_count, samples=state._returned_and_reserved(),
                size=len(rb) if limiter.reads_size else 0, n=batch_size,
            )
        ):  # fmt: skip
            return False
        cells[CELL_RESERVED_SAMPLES] += batch_size
    return True


def limited_draw(rb, state: FlowState, limiter, batch_size: int, wait, timeout, cancel_event, draw, sampler,
                 storage, writer):  # fmt: skip
    """:func:`gated_draw` with a limiter, for ``rb.sample()``: the same checks as :func:`reserve_sample`,
    written out with the buffer's components (``sampler``, ``storage``, ``writer``) passed in, and a permitted
    sample's records counted as returned in the same acquisition of the flow lock (no reservation to commit
    after the draw; a draw that raises or returns fewer records gives the difference back), so that it costs
    one acquisition and a few reads (issue 27: readiness must cost nothing measurable when nothing waits).
    ``timeout`` is checked (:func:`check_wait_args`). A refused sample (or one of a buffer shut down) waits in
    :func:`reserve_sample` (``wait=True``) then draws in :func:`reserved_draw`, or raises there."""
    checked = state.checked_request  # a request's check depends on the limiter and the batch size alone
    if checked is None or checked[0] is not limiter or checked[1] != batch_size:
        limiter.check_sample_request(batch_size)
        state.checked_request = (limiter, batch_size)
    counted = False
    cells = state.cells
    if not cells[CELL_CLOSED] and rb.is_alive and (cancel_event is None or not cancel_event.is_set()):
        lock = state.lock  # try_reserve_sample, written out (acquire/release cost less than a with statement)
        lock.acquire()
        try:
            if sampler.can_sample(storage, batch_size) and limiter.sample_permitted(
                inserts=getattr(writer, "write_count", 0), samples=state._returned_and_reserved(),
                size=len(rb) if limiter.reads_size else 0, n=batch_size,
            ):  # fmt: skip
                # counted as returned at once (one acquisition of the lock per sample); given back below when
                # the draw raises or returns fewer records
                cells[CELL_SAMPLE_CALLS] += 1
                cells[CELL_SAMPLES_RETURNED] += batch_size
                counted = True
        finally:
            lock.release()
    if not counted:  # shut down, cancelled, refused or to wait for: raises, or waits and reserves
        reserve_sample(rb, state, limiter, batch_size, wait=wait, timeout=timeout, cancel_event=cancel_event)
        return reserved_draw(state, draw, batch_size)
    if state.waiters:  # an insert that waited for samples
        state.notify()
    try:
        data, info = draw(batch_size)
    except BaseException:
        state.give_back(1, batch_size)
        raise
    records = records_in(info.get("index"), batch_size)
    if records != batch_size:
        state.give_back(0, batch_size - records)
    return data, info


def reserve_sample(
    rb, state: FlowState, limiter, batch_size: int, *, wait: bool, timeout: float | None, cancel_event
) -> None:
    """Reserves ``batch_size`` records for a draw, waiting with ``wait=True``; the caller commits the reservation
    (``state.commit_samples``) once the draw ended, whatever happened."""
    limiter.check_sample_request(batch_size)
    if state.cells[CELL_CLOSED] or not rb.is_alive:
        raise torchrl_error("rate_shut_down")
    if cancel_event is not None and cancel_event.is_set():
        raise torchrl_error("rate_cancelled")
    if try_reserve_sample(rb, state, limiter, batch_size):
        return
    if not wait:
        raise torchrl_error("rate_not_permitted", detail=f"{limiter!r}; {describe_counters(rb, state)}")
    state.add("sample_wait_count", 1)

    def timed_out() -> BaseException:
        detail = f"{limiter!r}; {describe_counters(rb, state)}"
        if getattr(limiter, "budget", None) is not None:  # TorchRL's RateLimitedReplayBuffer
            return torchrl_error("rate_budget_timeout", timeout=timeout, detail=detail)
        return TimeoutError(
            f"Rate limiter: the sample side waited {timeout} seconds for a batch of {batch_size} without being "
            f"permitted ({detail}). Write more data (collectors extend), sample less often, widen the "
            f"error_buffer, or pass timeout=None to wait as long as it takes."
        )

    wait_until(
        state, lambda: try_reserve_sample(rb, state, limiter, batch_size), timeout=timeout,
        cancel_event=cancel_event, is_alive=lambda: rb.is_alive, on_timeout=timed_out,
    )  # fmt: skip


def reserve_insert(rb, state: FlowState, limiter, n: int, *, timeout: float | None) -> None:
    """Reserves an insert of ``n`` items, waiting while the limiter refuses it; the caller releases it
    (``state.release_inserts(n)``) after the write."""
    limiter.check_insert_request(n)
    permitted = _insert_permitted(rb, limiter, n)
    if state.try_reserve("insert", n, permitted):
        return
    state.add("insert_wait_count", 1)

    def timed_out() -> BaseException:
        return TimeoutError(
            f"Rate limiter: the insert side waited {timeout} seconds to write {n} items without being permitted "
            f"({limiter!r}; {describe_counters(rb, state)}): sampling is behind the target ratio. Sample more (the "
            f"learner's rb.sample()), widen the error_buffer, or pass timeout=None to wait as long as it takes."
        )

    def alive_for_inserts() -> bool:
        if not rb.is_alive or state.closed:
            raise RuntimeError(
                "The replay buffer was shut down while a write waited for the rate limiter: nothing was written."
            )
        return True

    wait_until(
        state, lambda: state.try_reserve("insert", n, permitted), timeout=timeout, cancel_event=None,
        is_alive=alive_for_inserts, on_timeout=timed_out,
    )  # fmt: skip


def flow_stats(rb, state: FlowState, limiter) -> dict[str, Any]:
    """The readiness entries of ``rb.stats()`` (and the limiter's, when there is one)."""
    with state.lock:  # one view: no sample commits between the counters and the write count
        counters = state.as_dict()
        inserts = rb.write_count
    out = {
        "sample_calls": counters["sample_calls"],
        "samples_returned": counters["samples_returned"],
        "sampleable_size": len(rb),
    }
    if limiter is None:
        return out
    out.update(
        samples_per_insert=counters["samples_returned"] / inserts if inserts else 0.0,
        reserved_samples=counters["reserved_samples"],
        sample_wait_count=counters["sample_wait_count"],
    )
    budget = getattr(limiter, "budget", None)
    if budget is not None:
        out["target_samples_per_insert"] = limiter.samples_per_insert
        out["sample_budget"] = budget(
            inserts=inserts, samples=counters["samples_returned"] + counters["reserved_samples"]
        )
    else:
        out.update(
            rate_limiter=repr(limiter),
            target_samples_per_insert=limiter.samples_per_insert,
            reserved_inserts=counters["reserved_inserts"],
            insert_wait_count=counters["insert_wait_count"],
            sample_insert_diff=inserts * limiter.samples_per_insert - counters["samples_returned"],
        )
    return out


# -- draws: counted, reserved, gated (``draw(batch_size) -> (data, info)`` is the buffer's own draw) ------------------
def reserved_draw(state: FlowState, draw, batch_size: int):
    """One draw of ``batch_size`` records reserved from the limiter: the reservation becomes the records returned,
    or is given back when the draw raises."""
    records = None
    try:
        data, info = draw(batch_size)
        records = records_in(info.get("index"), batch_size)
    finally:
        state.commit_samples(batch_size, records)
    return data, info


def gated_draw(rb, state: FlowState, limiter, batch_size: int, *, wait: bool, timeout, cancel_event, draw):
    """A draw behind readiness: waits for data (``wait=True``) without a limiter; with one, reserves the records
    first (waiting with ``wait=True``, else refusing at once), then draws."""
    if limiter is None:
        if wait:
            wait_for_data(rb, state, batch_size, timeout=timeout, cancel_event=cancel_event)
        data, info = draw(batch_size)
        state.count_batch(info, batch_size)
        return data, info
    reserve_sample(rb, state, limiter, batch_size, wait=wait, timeout=timeout, cancel_event=cancel_event)
    records = None  # reserved_draw, written out
    try:
        data, info = draw(batch_size)
        records = records_in(info.get("index"), batch_size)
    finally:
        state.commit_samples(batch_size, records)
    return data, info


def release_if_cancelled(state: FlowState, batch_size: int):
    """A done-callback for a prefetch task holding a reservation: a task cancelled before it ran gives it back."""

    def release(future) -> None:
        if future.cancelled():
            state.commit_samples(batch_size, None)

    return release
