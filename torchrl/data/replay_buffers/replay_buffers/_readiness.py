"""Flow control of a replay buffer: :class:`FlowControl`, the stage between ``sample()``/``extend()`` and the draw
or write: cumulative counters, waiting for data, a rate limiter's reservations.

NOTE [readiness and waiting]: every buffer owns one :class:`FlowControl`: cumulative int64 counters
(``sample_calls``, ``samples_returned``, the reservations of a limiter and its wait counts) in a
:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters`, and the lock that orders changes to them (a
``threading.RLock``, or a cross-process :class:`~torchrl.data.replay_buffers._shared.lock.ProcessLock` once the
buffer is shared). ``rb.sample(wait=True)`` and a limited ``extend`` wait in :func:`wait_until`: a
``threading.Condition`` wakes them at once on a write of this process (writers call :meth:`FlowControl.notify`,
which costs a read of the waiter count when nobody waits), and a poll with a short backoff (0.5 ms doubling to
:data:`MAX_POLL_S`) sees a write made by another process into the shared storage (its length and the writer's
write count live in shared memory). ``shutdown()`` and a ``cancel_event`` end a wait with a ``RuntimeError``.

A limiter (``RateLimitedReplayBuffer``'s budget, ``rate_limiter=MinSize(...)`` / ``SampleToInsertRatio(...)``)
is consulted through :meth:`FlowControl.try_reserve`: under the lock, it reads the counters and, when the request
is permitted, adds it to ``reserved_samples`` / ``reserved_inserts``; a finished draw moves its reservation
to ``samples_returned`` in one locked step (:meth:`FlowControl.commit_samples`), and a finished write releases its
reservation after the writer counted it, so the counters a limiter reads are never ahead of what happened:
every process and DataLoader worker sharing the buffer draws from one budget and none over-draws it.

What this costs a sample that nobody waits for is kept to a few reads and writes of the counters' memory (a
memoryview, :attr:`SharedCounters.cells <torchrl.data.replay_buffers._shared.counters.SharedCounters.cells>`)
under one lock acquisition per step (``benchmarks/readiness_cost.py``): :meth:`FlowControl.draw` counts under
the thread lock, a shared buffer in a per-process slot without the cross-process lock (NOTE [draw counts of a
shared buffer] in :class:`FlowControl`), and a permitted limited sample checks and counts its records as returned
in one acquisition of the flow lock, before the draw (the limiter sees the same sum of returned and reserved
records as with a reservation); a draw that raises, or returns fewer records, gives the difference back
(:meth:`FlowControl.give_back`). A sample that waited keeps the reservation and commit.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._shared.cleanup import pid_is_gone
from torchrl.data.replay_buffers._shared.counters import SharedCounters
from torchrl.data.replay_buffers._shared.lock import ProcessLock
from torchrl.data.replay_buffers.errors import CheckpointError

__all__ = [
    "FlowControl",
    "MAX_POLL_S",
    "check_wait_args",
    "records_in",
    "wait_until",
]

RATE_SHUT_DOWN = TorchRLPhrase(
    RuntimeError,
    "A shut down replay buffer cannot be sampled.",
    "A shut down replay buffer cannot be sampled. shutdown() ended the wait; build a new buffer (or load a "
    "checkpoint into one) to sample again.",
)
RATE_CANCELLED = TorchRLPhrase(
    RuntimeError,
    "Replay-buffer sampling was cancelled.",
    "Replay-buffer sampling was cancelled. The `cancel_event` passed to sample() was set; clear it (or pass "
    "another one) to sample again.",
)
RATE_NOT_PERMITTED = TorchRLPhrase(
    RuntimeError,
    "Replay readiness or the sample-to-insert ratio does not currently permit this sample. Pass wait=True to "
    "wait.",
    "Replay readiness or the sample-to-insert ratio does not currently permit this sample. Pass wait=True to "
    "wait. ({detail})",
)
RATE_BUDGET_TIMEOUT = TorchRLPhrase(
    TimeoutError,
    "Replay buffer did not obtain sample-ratio budget within {timeout} seconds.",
    "Replay buffer did not obtain sample-ratio budget within {timeout} seconds. The sample side waited; "
    "{detail}. Write more data (each inserted item pays for samples_per_insert records), pass a larger "
    "timeout, or timeout=None to wait as long as it takes.",
)

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
CELL_RESERVED_INSERTS = 3
#: How many processes (FlowControl objects) of a shared buffer count their draws in slots of their own
#: (NOTE [draw counts of a shared buffer]); the others count under the cross-process lock.
SLOTS = 64
# the slot table: the number of slots claimed, then per slot: its owner's pid, a version, sample_calls and
# samples_returned; the owner's start time (/proc/<pid>/stat, to tell a reused pid), the reservations it holds
# (NOTE [reservations belong to a process]), when it last wrote through the limiter (ns since the epoch) and
# how many items
_SLOT_FIELDS = ("owner", "version", "calls", "returned", "start", "held_samples", "held_inserts", "wrote_at",
                "written")  # fmt: skip
_STRIDE = len(_SLOT_FIELDS)
_START, _HELD_SAMPLES, _HELD_INSERTS, _WROTE_AT, _WRITTEN = range(4, _STRIDE)
_SLOT_NAMES = ("claimed", *(f"{field}{i}" for i in range(SLOTS) for field in _SLOT_FIELDS))
#: The counters a checkpoint keeps (reservations belong to calls in flight: they restart at 0).
SAVED_COUNTERS = ("sample_calls", "samples_returned", "sample_wait_count", "insert_wait_count")


class FlowControl:
    """The flow control of one buffer: its readiness counters, their lock, the condition its waiters sleep on,
    and its rate limiter. The buffer's ``sample()`` goes through :meth:`draw`, its writes through :meth:`insert`
    (only when :attr:`gates_inserts` or a ``timeout`` asks for it); :meth:`stats` and :meth:`state_dict` are the
    readiness entries of the buffer's ``stats()`` and state (the ``"readiness"`` entry of its checkpoint part,
    checked by :meth:`check_checkpoint_part`).

    Keyword Args:
        shared (bool): put the counters in shared memory and order them with a cross-process lock now.
            Defaults to ``False`` (see :meth:`share_memory_`).
        limiter (RateLimiter, optional): the rate limiter (:attr:`limiter`). Defaults to ``None``.

    Attributes (read by the buffer's hot paths; change them only through the methods):
        lock: the lock that orders changes to the counters: a ``ProcessLock`` once shared, else a thread lock.
        cells: the counters as a memoryview, in the order of :data:`COUNTERS`.
        slot_cells: the slot table of a shared buffer as a memoryview (``None`` while private): NOTE [draw
            counts of a shared buffer].
        waiters: how many threads of this process wait in :func:`wait_until`.
        checked_request: the ``(limiter, batch size)`` that last passed ``check_sample_request`` (a
            request's check depends on them alone), or ``None``.
        gates_inserts: whether the limiter blocks inserts (writes then go through :meth:`insert`).

    NOTE [draw counts of a shared buffer]: ``sample_calls`` and ``samples_returned`` are counted on every
    draw; a cross-process lock there costs two ``flock`` calls per sample. So once shared, each process (each
    ``FlowControl`` object in it) counts the draws it makes without a limiter in a slot of its own, in a second
    shared table (:data:`SLOTS` slots, claimed once under the lock, a slot of a dead process taken over),
    under this process's thread lock only: a slot has one writer, so no update is lost, and a version made odd
    while its two counts change lets readers take the pair as one. A counter's value is its cell in the
    counters plus the sum of the slots (:meth:`get`, :meth:`as_dict`): exact at every moment. Resets and loads
    set the cells so that the sums come out right; draws behind a limiter are counted in the cells, with
    their reservation, under the lock.

    NOTE [reservations belong to a process]: a limiter's reservation (a waited-for sample between its permission
    and its commit, an insert between its permission and the end of its write) is added to ``reserved_samples``
    / ``reserved_inserts`` and to the ``held_*`` fields of the slot of the process that took it (the slot
    records its owner's pid and start time); its release takes back no more than the slot holds. A process
    killed inside a reservation leaves it in its slot: before a refusal becomes a wait and before each sleep of a
    wait, :meth:`give_back_dead` gives back the reservations of every slot whose owner is
    gone (``os.kill(pid, 0)`` finds no process, ``/proc`` shows a zombie, or the pid now names a process started
    at another time), and a slot taken over gives back what it held. Reserving writes the slot before the
    counter and releasing the counter before the slot, so a kill between the two stores can only let the
    limiter be briefly generous, never hold a reservation that no one gives back. A shared buffer whose slot
    table is full (:data:`SLOTS` live processes) keeps the reservations of further processes untracked. The
    slot also records when its process last wrote through the limiter (:meth:`writers`), which a sample's
    ``TimeoutError`` reports (only writes can end a sample's wait).

    Examples:
        >>> from torchrl.data.replay_buffers.replay_buffers._readiness import FlowControl
        >>> state = FlowControl()
        >>> state.count_draw(4)
        >>> state.get("sample_calls"), state.get("samples_returned")
        (1, 4)
        >>> state.state_dict()["samples_returned"]
        4
    """

    def __init__(self, *, shared: bool = False, limiter=None) -> None:
        self._counters = SharedCounters(COUNTERS)
        self.limiter = limiter
        self.bind(None, None, None, None)
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

    def share_memory_(self) -> FlowControl:
        """Moves the counters to shared memory and creates their cross-process lock (a no-op when shared)."""
        if self._process_lock is None:
            with self._thread_lock:
                self._counters.share_memory_()
                self._slots = SharedCounters(_SLOT_NAMES, shared=True)
                self._process_lock = ProcessLock()
                self._attach()
                cells = self.cells  # reservations of calls in flight: this process's
                if cells[CELL_RESERVED_SAMPLES] or cells[CELL_RESERVED_INSERTS]:
                    at = self._claim_slot()
                    if at >= 0:
                        self.slot_cells[at + _HELD_SAMPLES] = cells[CELL_RESERVED_SAMPLES]
                        self.slot_cells[at + _HELD_INSERTS] = cells[CELL_RESERVED_INSERTS]
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
                    owner = 1 + _STRIDE * i
                    if _is_dead(slots[owner], slots[owner + _START]):
                        at = owner
                        self._give_back_slot(at)  # the reservations it held are no one's now
                        break
                if at < 0 and claimed < SLOTS:
                    at = 1 + _STRIDE * claimed
                    slots[0] = claimed + 1
                if at >= 0:
                    slots[at] = pid
                    slots[at + _START] = _process_start(pid)
                    slots[at + _WROTE_AT] = slots[at + _WRITTEN] = 0
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
        for at in range(1, 1 + _STRIDE * slots[0], _STRIDE):
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
        """Sets counters to ``values`` (under the lock), their cells less what the slots hold; setting a
        reservation counter forgets whose its reservations were (a call in flight then gives back nothing)."""
        in_slots = dict(zip(("sample_calls", "samples_returned"), self.slot_sums()))
        for name, value in values.items():
            self._counters[name] = value - in_slots.get(name, 0)
        slots = self.slot_cells
        if slots is not None:
            for field, name in ((_HELD_SAMPLES, "reserved_samples"), (_HELD_INSERTS, "reserved_inserts")):
                if name in values:
                    for at in range(1, 1 + _STRIDE * slots[0], _STRIDE):
                        slots[at + field] = 0

    # -- reservations, each held by the process that took it: NOTE [reservations belong to a process] ----------
    def _own_slot(self) -> int:
        """This object's slot in this process (claimed now if needed), or -1: private, or the table is full."""
        if self.slot_cells is None:
            return -1
        return self._slot_at if self._slot_pid == _pid[0] else self._claim_slot()

    def _hold(self, cell: int, field: int, n: int) -> None:
        """Under the lock: reserves ``n`` in counter ``cell``, recorded as this process's in its slot first."""
        at = self._own_slot()
        if at >= 0:
            self.slot_cells[at + field] += n
        self.cells[cell] += n

    def _unhold(self, cell: int, field: int, n: int) -> None:
        """Under the lock: gives back ``n`` of this process's reservations in counter ``cell`` (no more than its
        slot holds), the counter first."""
        at = self._own_slot()
        slots = self.slot_cells
        if at >= 0:
            n = min(n, slots[at + field])
        left = self.cells[cell] - n
        self.cells[cell] = left if left > 0 else 0
        if at >= 0:
            slots[at + field] -= n

    def _give_back_slot(self, at: int) -> int:
        """Under the lock: gives back every reservation the slot at ``at`` holds; returns how many."""
        slots, cells, freed = self.slot_cells, self.cells, 0
        for field, cell in ((_HELD_SAMPLES, CELL_RESERVED_SAMPLES), (_HELD_INSERTS, CELL_RESERVED_INSERTS)):
            held = slots[at + field]
            if held:
                cells[cell] = max(0, cells[cell] - held)
                slots[at + field] = 0
                freed += held
        return freed

    def give_back_dead(self, deadline: float | None = None) -> int:
        """Gives back the reservations of the processes that are gone (killed inside a write or a draw): their
        pid is dead or a zombie, or reused by another process. Returns how many records and items came back
        (``0`` at once for a private buffer, or when every holder lives: a read of the slots without the lock).
        ``deadline`` (``time.monotonic()``) bounds the wait for the lock (``TimeoutError``)."""
        slots = self.slot_cells
        if slots is None:
            return 0
        me = _pid[0]
        gone = [
            at for at in range(1, 1 + _STRIDE * slots[0], _STRIDE)
            if (slots[at + _HELD_SAMPLES] or slots[at + _HELD_INSERTS]) and slots[at] != me
            and _is_dead(slots[at], slots[at + _START])
        ]  # fmt: skip
        if not gone:
            return 0
        freed = 0
        self._acquire_by(deadline)
        try:
            for at in gone:  # again under the lock: a slot taken over meanwhile holds its new owner's
                if _is_dead(slots[at], slots[at + _START]):
                    freed += self._give_back_slot(at)
        finally:
            self.lock.release()
        if freed:
            self.notify()
        return freed

    def _acquire_by(self, deadline: float | None) -> None:
        """Takes the flow lock, waiting until ``deadline`` (``time.monotonic()``; ``None``: as long as it takes)
        at most, then ``TimeoutError``: a call's ``timeout`` bounds its wait for the lock too."""
        if deadline is None:
            self.lock.acquire()
        elif not self.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError(
                "The replay buffer's flow lock (the readiness and rate-limiter counters) stayed held by another "
                "process or thread until this call's timeout ran out: nothing was sampled or written. A process "
                "that holds it that long is stuck (stopped in a debugger, suspended, or blocked inside a locked "
                "section); pass a larger timeout, or timeout=None to wait as long as it takes."
            )

    def writers(self) -> list[dict[str, Any]]:
        """The processes that wrote through the rate limiter (slot by slot): ``pid``, ``alive``, ``written``
        (items) and ``wrote_at`` (``time.time()`` of their last write). Empty for a private buffer, and for
        writes that do not wait for a limiter (those are not tracked: they cost nothing extra)."""
        slots = self.slot_cells
        if slots is None:
            return []
        me, out = _pid[0], []
        for at in range(1, 1 + _STRIDE * slots[0], _STRIDE):
            if slots[at + _WRITTEN]:
                pid = slots[at]
                out.append({"pid": pid, "alive": pid == me or not _is_dead(pid, slots[at + _START]),
                            "written": slots[at + _WRITTEN], "wrote_at": slots[at + _WROTE_AT] / 1e9})  # fmt: skip
        return out

    def describe_producers(self, inserts_before: int, waited: float | None) -> str:
        """What the write side did during a sample's wait of ``waited`` seconds that began at write count
        ``inserts_before`` (a clause of a ``TimeoutError``): only writes could have ended that wait."""
        inserts = self._inserts()
        if inserts != inserts_before:
            out = f"{inserts - inserts_before} items were written during the wait, not enough for this sample"
        else:
            out = (
                "nothing was ever written to this buffer" if inserts == 0 else
                f"no item was written during the wait of {waited} seconds (write_count stayed at {inserts})"
            ) + (
                ", and only writes can end this wait: the producers meant to write (collector processes or "
                "threads) are dead, stuck or not started"
            )  # fmt: skip
        writers = self.writers()
        if writers:
            now, alive = time.time(), sum(w["alive"] for w in writers)
            listed = "; ".join(
                f"pid {w['pid']} {'alive' if w['alive'] else 'gone'}, last wrote {now - w['wrote_at']:.1f} s ago"
                for w in writers[:8]
            )
            more = "; ..." if len(writers) > 8 else ""
            out += f"; the writer processes: {alive} of {len(writers)} alive ({listed}{more})"
        return out

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

    def add(self, name: str, n: int, deadline: float | None = None) -> None:
        """Adds ``n`` to counter ``name`` under the lock (taken by ``deadline`` at most: :meth:`_acquire_by`)."""
        self._acquire_by(deadline)
        try:
            self._counters[name] = self._counters[name] + n
        finally:
            self.lock.release()

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

    def commit_samples(self, reserved: int, records: int | None) -> None:
        """Ends a reserved draw: ``records`` (``None``: the draw failed) become returned and the reservation of
        ``reserved`` is released, in one locked step; then wakes the waiters."""
        cells = self.cells
        with self.lock:
            if records is not None:
                cells[CELL_SAMPLE_CALLS] += 1
                cells[CELL_SAMPLES_RETURNED] += records
            self._unhold(CELL_RESERVED_SAMPLES, _HELD_SAMPLES, reserved)
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

    def release_inserts(self, reserved: int, *, wrote: bool = True) -> None:
        """Ends a reserved write (after the writer counted it; ``wrote=False``: the write raised) and wakes the
        waiters. A shared buffer records when this process last wrote (:meth:`writers`)."""
        with self.lock:
            self._unhold(CELL_RESERVED_INSERTS, _HELD_INSERTS, reserved)
            at = self._own_slot() if wrote else -1
            if at >= 0:
                slots = self.slot_cells
                slots[at + _WROTE_AT] = time.time_ns()
                slots[at + _WRITTEN] += reserved
        self.notify()

    def try_reserve(self, side: str, n: int, permitted: Callable[[dict[str, int]], bool],
                    deadline: float | None = None) -> bool:  # fmt: skip
        """Under the lock (taken by ``deadline`` at most): if ``permitted(counters)`` says yes, reserves ``n`` on
        ``side`` (``"sample"`` or ``"insert"``) for this process and returns ``True``. ``permitted`` receives the
        counters read under the lock."""
        cell, field = (CELL_RESERVED_SAMPLES, _HELD_SAMPLES) if side == "sample" else (CELL_RESERVED_INSERTS,
                                                                                       _HELD_INSERTS)  # fmt: skip
        self._acquire_by(deadline)
        try:
            if not permitted(self._totals()):
                return False
            self._hold(cell, field, n)
        finally:
            self.lock.release()
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
        return {"counters": self._counters, "process_lock": self._process_lock, "slots": self._slots,
                "limiter": self._limiter}  # fmt: skip

    def __setstate__(self, state) -> None:
        self._counters = state["counters"]
        self._process_lock = state["process_lock"]
        # a state saved before the slots existed: the draws are counted under the lock
        self._slots = state.get("slots") if self._process_lock is not None else None
        self.limiter = state.get("limiter")
        self.bind(None, None, None, None)  # the buffer attaches itself again (ReplayBuffer.__setstate__)
        self._make_runtime()
        self._attach()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._totals()}, shared={self.is_shared})"

    # -- the buffer's side: what the limiter reads, the gates of sample() and extend() -------------------------
    @property
    def limiter(self):
        """The rate limiter every sample and write consults (``None``: none; :meth:`draw` then only counts)."""
        return self._limiter

    @limiter.setter
    def limiter(self, limiter) -> None:
        self._limiter = limiter
        self.checked_request = None
        self.gates_inserts = limiter is not None and limiter.blocks_inserts

    def bind(self, buffer, sampler, storage, writer) -> None:
        """Binds the flow to the buffer it gates and the components whose readiness it reads (after a build, a
        swap or an unpickle; never pickled): ``len(buffer)``, ``buffer.is_alive``, ``sampler.can_sample``,
        ``writer.write_count``."""
        self.buffer, self.sampler, self.storage, self.writer = buffer, sampler, storage, writer

    def sampler_ready(self, batch_size: int) -> bool:
        """Whether the sampler can draw ``batch_size`` now (``Sampler.can_sample``); ``False`` before the
        delayed init built the components."""
        sampler = self.sampler
        return sampler is not None and sampler.can_sample(self.storage, batch_size)

    def _alive(self) -> bool:
        buffer = self.buffer
        return buffer is None or buffer.is_alive

    def _inserts(self) -> int:
        return getattr(self.writer, "write_count", 0) if self.writer is not None else 0

    def _size(self) -> int:
        return len(self.buffer) if self.buffer is not None else 0

    def _view(self, counters: dict[str, int]) -> dict[str, int]:
        """The limiter's view of the counters (``counters`` read under the lock first, then the write count)."""
        return {
            "inserts": self._inserts(),
            "samples": counters["samples_returned"],
            "reserved_samples": counters["reserved_samples"],
            "reserved_inserts": counters["reserved_inserts"],
            "size": self._size(),
        }

    def describe_counters(self) -> str:
        """The counters at this moment, for an error message (read without the lock, which a stuck process may
        hold)."""
        v = self._view(self._totals())
        return (
            f"write_count={v['inserts']}, samples_returned={v['samples']}, reserved_samples={v['reserved_samples']}, "
            f"reserved_inserts={v['reserved_inserts']}, size={v['size']}"
        )

    def can_sample(self, batch_size: int) -> bool:
        """``rb.can_sample(batch_size)``: the sampler is ready and the limiter (if any) permits the sample."""
        limiter = self._limiter
        if limiter is None:
            return self.sampler_ready(batch_size)
        if not self._alive() or self.closed:
            return False
        if not self.sampler_ready(batch_size):
            return False

        def permitted() -> bool:
            v = self._view(self.as_dict())
            return limiter.sample_permitted(
                inserts=v["inserts"], samples=v["samples"] + v["reserved_samples"], size=v["size"], n=batch_size
            )

        return permitted() or (self.give_back_dead() > 0 and permitted())

    def wait_for_data(self, batch_size: int, *, timeout: float | None, cancel_event,
                      deadline: float | None = None) -> None:  # fmt: skip
        """``sample(wait=True)`` without a limiter: returns once the sampler can draw the batch (``deadline``:
        when ``timeout`` runs out, if it started earlier than this wait)."""
        if self.sampler_ready(batch_size) and (cancel_event is None or not cancel_event.is_set()):
            return
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        inserts_before = self._inserts()
        self.add("sample_wait_count", 1, deadline)

        def timed_out() -> BaseException:
            return TimeoutError(
                f"The replay buffer could not serve a batch of {batch_size} within {timeout} seconds: the sample "
                f"side waited ({self.describe_counters()}; sampler {type(self.sampler).__name__}); "
                f"{self.describe_producers(inserts_before, timeout)}. Write data first (rb.extend, from this or "
                f"another process sharing the buffer), pass a larger timeout, or timeout=None to wait as long as "
                f"it takes."
            )

        wait_until(
            self, lambda: self.sampler_ready(batch_size), timeout=timeout, cancel_event=cancel_event,
            is_alive=self._alive, on_timeout=timed_out, deadline=deadline,
        )  # fmt: skip

    def try_reserve_sample(self, batch_size: int, deadline: float | None = None) -> bool:
        """Reserves ``batch_size`` records of the limiter's budget for this process if it permits them now
        (never waits for the limiter; for the lock until ``deadline`` at most): one acquisition of the flow lock,
        reading the counters' memory directly."""
        limiter = self._limiter
        self._acquire_by(deadline)
        try:
            if not (
                self.sampler_ready(batch_size)
                and limiter.sample_permitted(
                    inserts=self._inserts(), samples=self._returned_and_reserved(),
                    size=self._size() if limiter.reads_size else 0, n=batch_size,
                )
            ):  # fmt: skip
                return False
            self._hold(CELL_RESERVED_SAMPLES, _HELD_SAMPLES, batch_size)
        finally:
            self.lock.release()
        return True

    def draw(self, batch_size: int, wait, timeout, cancel, draw_fn):
        """One draw through the gate: ``draw_fn(batch_size) -> (data, info)``, counted in ``sample_calls`` and
        ``samples_returned``.

        Without a limiter, ``wait=True`` first waits until the sampler can draw the batch. With one, a sample it
        permits now has its records counted as returned in the same acquisition of the flow lock, before the
        draw (a draw that raises, or returns fewer records, gives the difference back: one acquisition and a
        few reads per sample); a refused one raises (``wait=False``) or waits and reserves
        (:meth:`reserve_sample`), then draws in :meth:`reserved_draw`. ``timeout`` and ``cancel`` are checked
        here (:func:`check_wait_args`).
        """
        limiter = self._limiter
        if wait is not False or timeout is not None or cancel is not None:
            if wait is not True or timeout is not None or cancel is not None:
                timeout = check_wait_args(wait, timeout, cancel)
            if limiter is None and wait and (cancel is not None or not self.sampler_ready(batch_size)):
                self.wait_for_data(batch_size, timeout=timeout, cancel_event=cancel)
        if limiter is None:  # the common case: draw, then count (count_draw written out for a private buffer)
            data, info = draw_fn(batch_size)
            index = info.get("index")
            if type(index) is torch.Tensor:
                shape = index.shape
                records = shape[0] if shape else 1
            else:
                records = records_in(index, batch_size)
            if self.slot_cells is not None:
                self.count_draw(records)
                return data, info
            cells = self.cells
            lock = self.lock
            lock.acquire()
            try:
                cells[CELL_SAMPLE_CALLS] += 1
                cells[CELL_SAMPLES_RETURNED] += records
            finally:
                lock.release()
            return data, info
        checked = self.checked_request  # a request's check depends on the limiter and the batch size alone
        if checked is None or checked[0] is not limiter or checked[1] != batch_size:
            limiter.check_sample_request(batch_size)
            self.checked_request = (limiter, batch_size)
        counted = False
        cells = self.cells
        deadline = None if timeout is None else time.monotonic() + timeout  # the lock's wait counts too
        if not cells[CELL_CLOSED] and self._alive() and (cancel is None or not cancel.is_set()):
            lock = self.lock  # try_reserve_sample, written out (acquire/release cost less than a with statement)
            if deadline is None:
                lock.acquire()
            else:
                self._acquire_by(deadline)
            try:
                if self.sampler.can_sample(self.storage, batch_size) and limiter.sample_permitted(
                    inserts=self._inserts(), samples=self._returned_and_reserved(),
                    size=self._size() if limiter.reads_size else 0, n=batch_size,
                ):  # fmt: skip
                    cells[CELL_SAMPLE_CALLS] += 1
                    cells[CELL_SAMPLES_RETURNED] += batch_size
                    counted = True
            finally:
                lock.release()
        if not counted:  # shut down, cancelled, refused or to wait for: raises, or waits and reserves
            self.reserve_sample(batch_size, wait=wait, timeout=timeout, cancel_event=cancel, deadline=deadline)
            return self.reserved_draw(draw_fn, batch_size)
        if self.waiters:  # an insert that waited for samples
            self.notify()
        try:
            data, info = draw_fn(batch_size)
        except BaseException:
            self.give_back(1, batch_size)
            raise
        records = records_in(info.get("index"), batch_size)
        if records != batch_size:
            self.give_back(0, batch_size - records)
        return data, info

    def reserve_sample(self, batch_size: int, *, wait: bool, timeout: float | None, cancel_event,
                       deadline: float | None = None) -> None:  # fmt: skip
        """Reserves ``batch_size`` records for a draw, waiting with ``wait=True`` (until ``deadline``, else
        ``timeout`` seconds from now; the flow lock's wait included); the caller commits the reservation
        (:meth:`commit_samples`) once the draw ended, whatever happened. Reservations of processes that are
        gone are given back before a refusal (:meth:`give_back_dead`)."""
        limiter = self._limiter
        limiter.check_sample_request(batch_size)
        if self.cells[CELL_CLOSED] or not self._alive():
            raise RATE_SHUT_DOWN.error()
        if cancel_event is not None and cancel_event.is_set():
            raise RATE_CANCELLED.error()
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        if self.try_reserve_sample(batch_size, deadline) or (
            self.give_back_dead(deadline) and self.try_reserve_sample(batch_size, deadline)
        ):
            return
        if not wait:
            raise RATE_NOT_PERMITTED.error(detail=f"{limiter!r}; {self.describe_counters()}")
        inserts_before = self._inserts()
        self.add("sample_wait_count", 1, deadline)

        def timed_out() -> BaseException:
            detail = f"{limiter!r}; {self.describe_counters()}; {self.describe_producers(inserts_before, timeout)}"
            if getattr(limiter, "budget", None) is not None:  # TorchRL's RateLimitedReplayBuffer
                return RATE_BUDGET_TIMEOUT.error(timeout=timeout, detail=detail)
            return TimeoutError(
                f"Rate limiter: the sample side waited {timeout} seconds for a batch of {batch_size} without being "
                f"permitted ({detail}). Write more data (collectors extend), sample less often, widen the "
                f"error_buffer, or pass timeout=None to wait as long as it takes."
            )

        wait_until(
            self, lambda: self.try_reserve_sample(batch_size, deadline), timeout=timeout, cancel_event=cancel_event,
            is_alive=self._alive, on_timeout=timed_out, deadline=deadline,
        )  # fmt: skip

    def reserved_draw(self, draw_fn, batch_size: int):
        """One draw of ``batch_size`` records reserved from the limiter: the reservation becomes the records
        returned, or is given back when the draw raises."""
        records = None
        try:
            data, info = draw_fn(batch_size)
            records = records_in(info.get("index"), batch_size)
        finally:
            self.commit_samples(batch_size, records)
        return data, info

    def release_if_cancelled(self, batch_size: int):
        """A done-callback for a prefetch task holding a reservation: a task cancelled before it ran gives it
        back."""

        def release(future) -> None:
            if future.cancelled():
                self.commit_samples(batch_size, None)

        return release

    @contextlib.contextmanager
    def insert(self, n: int, timeout):
        """Around a write of ``n`` items: waits for the limiter's permission (when it blocks inserts; ``timeout``
        seconds at most, checked here), and wakes the waiting readers afterwards. A buffer whose limiter does
        not gate inserts (:attr:`gates_inserts` false) and that got no ``timeout`` skips it: it wakes the
        readers itself (``if flow.waiters: flow.notify()``)."""
        timeout = check_wait_args(False, timeout, None) if timeout is not None else None
        if not self.gates_inserts:
            yield
            self.notify()
            return
        self._reserve_insert(n, timeout=timeout)
        wrote = False
        try:
            yield
            wrote = True
        finally:
            self.release_inserts(n, wrote=wrote)

    def _reserve_insert(self, n: int, *, timeout: float | None) -> None:
        """Reserves an insert of ``n`` items for this process, waiting while the limiter refuses it (``timeout``
        seconds at most, the flow lock's wait included); reservations of processes that are gone are given
        back before a refusal (:meth:`give_back_dead`)."""
        limiter = self._limiter
        deadline = None if timeout is None else time.monotonic() + timeout
        limiter.check_insert_request(n)

        def permitted(counters: dict[str, int]) -> bool:
            v = self._view(counters)
            pending = v["reserved_inserts"]
            return limiter.insert_permitted(
                inserts=v["inserts"] + pending, samples=v["samples"], size=v["size"] + pending, n=n
            )

        if self.try_reserve("insert", n, permitted, deadline) or (
            self.give_back_dead(deadline) and self.try_reserve("insert", n, permitted, deadline)
        ):
            return
        self.add("insert_wait_count", 1, deadline)

        def timed_out() -> BaseException:
            return TimeoutError(
                f"Rate limiter: the insert side waited {timeout} seconds to write {n} items without being permitted "
                f"({limiter!r}; {self.describe_counters()}): sampling is behind the target ratio. Sample more (the "
                f"learner's rb.sample()), widen the error_buffer, or pass timeout=None to wait as long as it takes."
            )

        def alive_for_inserts() -> bool:
            if not self._alive() or self.closed:
                raise RuntimeError(
                    "The replay buffer was shut down while a write waited for the rate limiter: nothing was written."
                )
            return True

        wait_until(
            self, lambda: self.try_reserve("insert", n, permitted, deadline), timeout=timeout, cancel_event=None,
            is_alive=alive_for_inserts, on_timeout=timed_out, deadline=deadline,
        )  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """The readiness entries of ``rb.stats()`` (and the limiter's, when there is one). A read: it changes
        nothing (as in TorchRL), so the reservations of a process that is gone still count here until a refused
        sample or insert gives them back (:meth:`give_back_dead`)."""
        with self.lock:  # one view: no sample commits between the counters and the write count
            counters = self.as_dict()
            inserts = self._inserts()
        out = {
            "sample_calls": counters["sample_calls"],
            "samples_returned": counters["samples_returned"],
            "sampleable_size": self._size(),
        }
        limiter = self._limiter
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

    # -- the checkpoint part: the counters a checkpoint keeps ---------------------------------------------------
    def check_checkpoint_part(self, doc, where: str) -> None:
        """``CheckpointError`` (nothing loaded) unless ``doc`` (the ``"readiness"`` entry of a buffer part) holds
        counters :meth:`load_state_dict` takes."""
        try:
            check_counter_state(doc, f"{where}: `readiness`")
        except ValueError as err:
            raise CheckpointError(f"{err} Nothing was loaded.") from None


def _is_dead(pid: int, start: int = 0) -> bool:
    """Whether process ``pid``, started at ``start`` (:func:`_process_start`; 0: unknown), is certainly gone:
    no such process, a zombie (killed, not yet reaped by its parent), or the pid reused by a process started at
    another time. Its slot may be taken over and its reservations given back."""
    if pid <= 0:
        return True
    if pid == os.getpid():
        return False  # another FlowControl of this process: never share a slot between two thread locks
    if pid_is_gone(pid):
        return True
    state, started = _stat(pid)
    if state is None:  # no /proc here: what os.kill said; or the process ended between the two looks
        return pid_is_gone(pid)
    return state in (b"Z", b"X") or (start > 0 and started != start)


def _stat(pid: int) -> tuple[bytes | None, int]:
    """``(state, start time)`` of process ``pid`` from ``/proc/<pid>/stat`` (``(None, 0)`` when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # the name (field 2) may hold spaces and parentheses
        return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
    except (OSError, IndexError, ValueError):
        return None, 0


def _process_start(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot; 0: unknown): with the pid, its identity."""
    return _stat(pid)[1]


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
    state: FlowControl,
    ready: Callable[[], bool],
    *,
    timeout: float | None,
    cancel_event=None,
    is_alive: Callable[[], bool],
    on_timeout: Callable[[], BaseException],
    deadline: float | None = None,
) -> None:
    """Returns once ``ready()`` is true; raises when the buffer shuts down, ``cancel_event`` is set or
    ``timeout`` seconds passed (``on_timeout()`` builds that error; ``deadline``, a ``time.monotonic()``, ends
    the wait instead when the call's timeout started before this wait).

    ``ready()`` is called at once, after each wake-up of this process's writers, and at least every
    :data:`MAX_POLL_S` seconds (writes of other processes): see NOTE [readiness and waiting]. Before each sleep,
    the reservations of processes that are gone are given back (:meth:`FlowControl.give_back_dead`).
    """
    if deadline is None and timeout is not None:
        deadline = time.monotonic() + timeout
    delay = _FIRST_POLL_S
    with state._cond:
        state.waiters += 1
    try:
        while True:
            if not is_alive() or state.closed:
                raise RATE_SHUT_DOWN.error()
            if cancel_event is not None and cancel_event.is_set():
                raise RATE_CANCELLED.error()
            if ready():
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise on_timeout()
            if state.give_back_dead(deadline):
                continue  # a dead process's reservation came back: look again at once
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
