"""A rate limiter's reservations belong to the process that took them (NOTE [reservations belong to a process]
in ``replay_buffers/_readiness.py``): a writer SIGKILLed inside its insert reservation, or a sampler SIGKILLed
inside ``sample(wait=True)`` after its reservation, never blocks the others, under each start method; a call's
``timeout`` bounds its wait for the flow lock too; a sample's timeout that only writes could have ended says
what the writer processes did.

The victims pause inside their reservation (``helpers.targets.PausingWriter``, ``PauseOnSample``) and are killed
there, so each case is deterministic; they are left unreaped (zombies) while the others go on.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch
from helpers.targets import (
    PausingWriter,
    child_extend_batches,
    child_extend_paused,
    child_hold_flow_lock,
    child_sample_paused,
)

from torchrl.data import (
    LazyTensorStorage,
    RateLimitedReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
)
from torchrl.data.replay_buffers.replay_buffers import _readiness

METHODS = ["fork", "spawn", "forkserver"]
BATCH = 8  # the learner's batch and the live writers' chunk
BATCHES = 6  # per live writer


def _limiter() -> SampleToInsertRatio:
    # min_diff = 8 - 32 = -24, max_diff = 8 + 32 = 40
    return SampleToInsertRatio(samples_per_insert=1, min_size_to_sample=8, error_buffer=32)


def _shared_buffer(**kwargs) -> ReplayBuffer:
    kwargs.setdefault("rate_limiter", _limiter())
    rb = ReplayBuffer(storage=LazyTensorStorage(512), writer=PausingWriter(), batch_size=BATCH, shared=True,
                      **kwargs)  # fmt: skip
    rb.extend(torch.zeros(1, dtype=torch.long))
    rb.empty()  # allocated before other processes write into it; the counters back at 0
    return rb


def _wait_for(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "the condition was not met in time"
        time.sleep(0.01)


def _learn(rb, records: int) -> int:
    """Samples ``records`` records in batches of BATCH (each waiting 30 s at most); returns the calls made."""
    calls = 0
    while calls * BATCH < records:
        assert rb.sample(wait=True, timeout=30.0).shape == (BATCH,)
        calls += 1
    return calls


def _start_writers(rb, start):
    """Two live writers, forked (the victim alone is started by the method under test: spawned interpreters cost
    seconds each on 2 cores)."""
    ctx = mp.get_context("fork")
    writers = [ctx.Process(target=child_extend_batches, args=(rb, BATCHES, BATCH, start)) for _ in range(2)]
    for w in writers:
        w.start()
    return writers


def _stop(*processes) -> None:
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join(30)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_writer_killed_inside_its_insert_reservation_blocks_no_one(method):
    ctx = mp.get_context(method)
    rb = _shared_buffer()
    paused, start = ctx.Event(), mp.get_context("fork").Event()
    # 40 items: permitted on an empty buffer (0 + 40 - 0 <= max_diff 40), and held, every further insert is
    # refused (the reservation counts as inserted) and no sample is permitted (nothing stored): a deadlock
    victim = ctx.Process(target=child_extend_paused, args=(rb, paused, 40))
    victim.start()
    writers = _start_writers(rb, start)
    try:
        assert paused.wait(60)
        assert rb.stats()["reserved_inserts"] == 40
        os.kill(victim.pid, signal.SIGKILL)  # not reaped: a zombie while the others go on
        _wait_for(lambda: _readiness._is_dead(victim.pid))
        start.set()
        inserts = 2 * BATCHES * BATCH
        calls = _learn(rb, inserts)
        for w in writers:
            w.join(60)
        assert [w.exitcode for w in writers] == [0, 0]
        stats = rb.stats()
        assert stats["reserved_inserts"] == stats["reserved_samples"] == 0
        assert stats["write_count"] == len(rb) == inserts  # the victim wrote nothing
        assert (stats["sample_calls"], stats["samples_returned"]) == (calls, inserts)
    finally:
        _stop(victim, *writers)
    assert victim.exitcode == -signal.SIGKILL


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_sampler_killed_inside_its_sample_reservation_blocks_no_one(method):
    ctx = mp.get_context(method)
    rb = _shared_buffer()
    paused, start = ctx.Event(), mp.get_context("fork").Event()
    victim = ctx.Process(target=child_sample_paused, args=(rb, paused, 32))
    victim.start()
    writers = _start_writers(rb, start)
    try:
        _wait_for(lambda: rb.stats()["sample_wait_count"] == 1)  # the victim waits: nothing stored yet
        rb.extend(torch.arange(BATCH), timeout=30.0)  # 8 inserts: its 32 records are permitted (8 - 32 >= -24)
        assert paused.wait(60)
        assert rb.stats()["reserved_samples"] == 32
        os.kill(victim.pid, signal.SIGKILL)
        _wait_for(lambda: _readiness._is_dead(victim.pid))
        start.set()
        # held, the 32 records would leave the learner 16 records short of the inserts for good
        inserts = BATCH + 2 * BATCHES * BATCH
        calls = _learn(rb, inserts)
        for w in writers:
            w.join(60)
        assert [w.exitcode for w in writers] == [0, 0]
        stats = rb.stats()
        assert stats["reserved_inserts"] == stats["reserved_samples"] == 0
        assert stats["write_count"] == len(rb) == inserts
        assert (stats["sample_calls"], stats["samples_returned"]) == (calls, inserts)  # the victim's: none
    finally:
        _stop(victim, *writers)
    assert victim.exitcode == -signal.SIGKILL


# -- timeout= bounds the wait for the flow lock ------------------------------------------------------------------
def _sample(rb):
    return rb.sample(wait=True, timeout=0.5)


def _extend(rb):
    return rb.extend(torch.arange(BATCH), timeout=0.5)


CALLS = {
    "ratio-sample": (dict(rate_limiter=_limiter()), _sample),
    "ratio-sample-permitted": (dict(rate_limiter=_limiter()), _sample),
    "ratio-extend": (dict(rate_limiter=_limiter()), _extend),
    "no-limiter-sample": (dict(rate_limiter=None), _sample),
}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CALLS))
def test_timeout_bounds_the_wait_for_the_flow_lock(case):
    kwargs, call = CALLS[case]
    rb = _shared_buffer(**kwargs)
    if case == "ratio-sample-permitted":
        rb.extend(torch.arange(BATCH))  # the sample is permitted: only the lock stands in the way
    ctx = mp.get_context("fork")
    held = ctx.Event()
    holder = ctx.Process(target=child_hold_flow_lock, args=(rb, held, 60.0))
    holder.start()
    try:
        assert held.wait(60)
        begin = time.monotonic()
        with pytest.raises(TimeoutError, match="flow lock"):
            call(rb)
        assert time.monotonic() - begin < 1.0  # a behaviour bound (0.5 s asked), not a speed measurement
    finally:
        _stop(holder)
    # the holder gone, the lock is free (the kernel dropped it) and nothing was counted by the call that gave up
    stats = rb.stats()
    assert stats.get("sample_wait_count", 0) == 0 and stats.get("reserved_samples", 0) == 0
    assert rb.extend(torch.arange(BATCH), timeout=5.0).shape[0] == BATCH


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_budget_sample_timeout_bounds_the_wait_for_the_flow_lock():
    rb = RateLimitedReplayBuffer(samples_per_insert=1.0, storage=LazyTensorStorage(64), batch_size=4, shared=True)
    rb.extend(torch.arange(8))
    ctx = mp.get_context("fork")
    held = ctx.Event()
    holder = ctx.Process(target=child_hold_flow_lock, args=(rb, held, 60.0))
    holder.start()
    try:
        assert held.wait(60)
        begin = time.monotonic()
        with pytest.raises(TimeoutError, match="flow lock"):
            rb.sample(wait=True, timeout=0.5)
        assert time.monotonic() - begin < 1.0
    finally:
        _stop(holder)
    assert rb.sample(wait=True, timeout=5.0).shape == (4,)


# -- a sample's timeout that only writes could have ended says what the writers did ------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_sample_timeout_names_the_writer_processes_and_when_they_last_wrote():
    rb = _shared_buffer()
    ctx = mp.get_context("fork")
    start = ctx.Event()
    start.set()
    writer = ctx.Process(target=child_extend_batches, args=(rb, 1, BATCH, start))
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    entry = {w["pid"]: w for w in rb._flow.writers()}[writer.pid]  # (this process wrote the first item)
    assert not entry["alive"] and entry["written"] == BATCH
    for _ in range(4):  # 8 inserts pay for 8 + 24 records (min_diff -24): the fifth batch is refused
        rb.sample(wait=True, timeout=5.0)
    with pytest.raises(TimeoutError) as info:
        rb.sample(wait=True, timeout=0.2)
    message = str(info.value)
    assert "sample side" in message
    assert "no item was written during the wait of 0.2 seconds (write_count stayed at 8)" in message
    assert "only writes can end this wait: the producers meant to write" in message
    assert "are dead, stuck or not started" in message
    assert f"the writer processes: 1 of 2 alive (pid {os.getpid()} alive, last wrote" in message
    assert f"pid {writer.pid} gone, last wrote" in message


def test_a_sample_timeout_of_a_buffer_never_written_says_so():
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    with pytest.raises(TimeoutError, match="nothing was ever written to this buffer, and only writes can end"):
        rb.sample(wait=True, timeout=0.05)


# -- what tells a dead owner --------------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_a_zombie_or_a_reused_pid_is_a_dead_owner():
    parent = os.getppid()
    assert not _readiness._is_dead(parent, _readiness._process_start(parent))
    assert _readiness._is_dead(parent, _readiness._process_start(parent) + 1)  # another process on that pid
    child = mp.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    _wait_for(lambda: _readiness._is_dead(child.pid))  # exited, not reaped: os.kill(pid, 0) still succeeds
    os.kill(child.pid, 0)
    child.join(30)
    assert _readiness._is_dead(child.pid)


def test_a_reservation_taken_before_sharing_is_this_process_s():
    flow = _readiness.FlowControl(limiter=_limiter())
    assert flow.try_reserve("insert", 5, lambda counters: True)
    flow.share_memory_()
    assert flow.give_back_dead() == 0  # this process lives: nothing is taken from it
    flow.release_inserts(5)
    assert flow.get("reserved_inserts") == 0
    [entry] = flow.writers()
    assert entry["pid"] == os.getpid() and entry["alive"] and entry["written"] == 5
