"""Issue 27 (readiness cost): what ``rb.sample()`` pays for readiness and rate limiting, kept exact.

- a shared buffer counts each process's draws in a slot of its own (NOTE [draw counts of a shared buffer]
  in ``replay_buffers/_readiness.py``): no cross-process lock per sample, the counts exact across forked and
  spawned processes and threads, a dead process's slot taken over, a full slot table counted under the lock;
- a rate-limited sample takes the flow lock twice (reserve, commit) and still checks every request;
- the waiting keywords keep their checks and their meaning on the fast paths;
- ``MixedReplayBuffer.sample(wait=...)`` and ``as_dataset(wait=..., timeout=...)`` wait as a replay buffer does.

Speed itself is measured by ``benchmarks/readiness_cost.py``, not here.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import threading

import pytest
import torch
from helpers.factories import make_buffer

import torchrl.data.replay_buffers._shared.lock as lock_module
import torchrl.data.replay_buffers.replay_buffers._readiness as readiness
from torchrl.data import (
    LazyTensorStorage,
    MixedReplayBuffer,
    RateLimitedReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
)
from torchrl.data.replay_buffers.replay_buffers._readiness import FlowControl
from torchrl.data.replay_buffers.replay_buffers.rate_limiters import SampleBudget

BS = 4


def _shared_buffer(cls=ReplayBuffer, **kwargs):
    return make_buffer(cls=cls, capacity=32, batch_size=BS, shared=True, data=torch.arange(32), **kwargs)


def _counting_flock(monkeypatch) -> list[int]:
    """Counts the exclusive flock calls of every ProcessLock from now on."""
    calls = []
    real = lock_module._file_lock

    def counted(fd, op):
        if op & lock_module.fcntl.LOCK_EX:
            calls.append(fd)
        return real(fd, op)

    monkeypatch.setattr(lock_module, "_file_lock", counted)
    return calls


def _counts(rb) -> tuple[int, int]:
    stats = rb.stats()
    return stats["sample_calls"], stats["samples_returned"]


# -- a shared buffer's draw counts: one slot per process ---------------------------------------------------
def test_a_shared_sample_takes_no_cross_process_lock(monkeypatch):
    rb = _shared_buffer()
    rb.sample()  # claims this process's slot (under the lock, once)
    flocks = _counting_flock(monkeypatch)
    for _ in range(10):
        rb.sample()
    assert flocks == []
    assert _counts(rb) == (11, 11 * BS)


def test_a_rate_limited_shared_sample_takes_the_flow_lock_once(monkeypatch):
    rb = _shared_buffer(RateLimitedReplayBuffer, samples_per_insert=100.0)
    rb.sample()
    flocks = _counting_flock(monkeypatch)
    for _ in range(5):
        rb.sample()
    assert len(flocks) == 5  # the check and the count in one acquisition per sample
    stats = rb.stats()
    assert (stats["sample_calls"], stats["samples_returned"], stats["reserved_samples"]) == (6, 6 * BS, 0)
    assert stats["sample_budget"] == 32 * 100 - 6 * BS


def _sample_in_threads(rb, n: int, threads: int) -> None:
    workers = [threading.Thread(target=lambda: [rb.sample() for _ in range(n)]) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)


def _child_samples(rb, n: int, threads: int) -> None:
    _sample_in_threads(rb, n, threads)
    os._exit(0)


def _run_children(target, args, count: int, method: str = "fork") -> None:
    ctx = mp.get_context(method)
    children = [ctx.Process(target=target, args=args) for _ in range(count)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_counts_are_exact_across_forked_processes_and_threads():
    rb = _shared_buffer()
    rb.sample()
    _run_children(_child_samples, (rb, 30, 2), count=3)
    _sample_in_threads(rb, 20, 2)
    total = 1 + 3 * 2 * 30 + 2 * 20
    assert _counts(rb) == (total, total * BS)
    state = rb.state_dict()
    rb.empty()  # the write count restarts: so do the sample counts, the slots included
    assert _counts(rb) == (0, 0)
    rb.extend(torch.arange(8))
    rb.sample()
    assert _counts(rb) == (1, BS)
    fresh = ReplayBuffer(storage=LazyTensorStorage(32), batch_size=BS, shared=True)
    fresh.load_state_dict(state)
    assert _counts(fresh) == (total, total * BS)
    rb.load_state_dict(state)  # loaded over slots that hold counts
    assert _counts(rb) == (total, total * BS)
    rb.sample()
    assert _counts(rb) == (total + 1, (total + 1) * BS)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_dead_process_slot_is_taken_over_with_its_counts():
    rb = _shared_buffer()
    rb.sample()
    _run_children(_child_samples, (rb, 5, 1), count=1)
    _run_children(_child_samples, (rb, 7, 1), count=1)
    flow = rb._flow
    assert flow._slots["claimed"] == 2  # this process's slot, and the one the second child took over
    assert _counts(rb) == (13, 13 * BS)


def _child_dies_mid_count(flow) -> None:
    flow.count_draw(3)  # claims a slot
    flow.slot_cells[flow._slot_at + 1] += 1  # the version made odd, as by a kill inside count_draw
    os._exit(0)


def _child_counts(flow) -> None:
    flow.count_draw(5)
    os._exit(0)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_slot_left_mid_count_is_read_and_taken_over():
    flow = FlowControl(shared=True)
    _run_children(_child_dies_mid_count, (flow,), count=1)
    assert flow.get("sample_calls") == 1 and flow.as_dict()["samples_returned"] == 3  # the read ends
    _run_children(_child_counts, (flow,), count=1)
    assert flow._slots["claimed"] == 1
    assert flow._slots["version0"] % 2 == 0
    assert (flow.get("sample_calls"), flow.get("samples_returned")) == (2, 8)


def test_a_full_slot_table_counts_under_the_lock(monkeypatch):
    monkeypatch.setattr(readiness, "SLOTS", 0)
    rb = _shared_buffer()
    flocks = _counting_flock(monkeypatch)
    for _ in range(3):
        rb.sample()
    assert len(flocks) == 1 + 3  # the slot claim that found none, then one acquisition per count
    assert _counts(rb) == (3, 3 * BS)


def _spawned_samples(rb, n: int) -> None:
    for _ in range(n):
        rb.sample()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_spawned_process_counts_into_the_same_buffer():
    rb = _shared_buffer()
    rb.sample()
    _run_children(_spawned_samples, (rb, 6), count=1, method="spawn")
    assert _counts(rb) == (7, 7 * BS)


def test_a_pickled_copy_keeps_the_counts_of_the_slots():
    rb = _shared_buffer()
    for _ in range(3):
        rb.sample()
    copy = pickle.loads(pickle.dumps(rb._flow))
    assert (copy.get("sample_calls"), copy.get("samples_returned")) == (3, 3 * BS)
    old = FlowControl()  # a state saved before the slots existed still loads
    old.__setstate__({"counters": copy._counters, "process_lock": None})
    assert old.get("sample_calls") == copy._counters["sample_calls"]


# -- rate limiters -----------------------------------------------------------------------------------------
def test_every_batch_size_is_checked_against_the_limiter():
    limiter = SampleToInsertRatio(1.0, 1, 8.0)
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=2, rate_limiter=limiter)
    rb.extend(torch.arange(4))
    assert rb.sample().shape == (2,)
    with pytest.raises(ValueError, match="can never be permitted"):
        rb.sample(batch_size=50)
    assert rb.sample().shape == (2,)
    assert _counts(rb) == (2, 4)


def test_a_refused_or_shut_down_rate_limited_sample_raises_and_counts_nothing():
    rb = RateLimitedReplayBuffer(samples_per_insert=0.5, storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(torch.arange(4))
    rb.sample()
    with pytest.raises(RuntimeError):
        rb.sample()  # the budget is spent
    assert rb.stats()["reserved_samples"] == 0
    rb.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        rb.sample()
    assert _counts(rb) == (1, 2)


@pytest.mark.parametrize("spi", [1e-3, 0.1, 0.3, 1 / 3, 0.7, 1.0, 2.5, 7.1])
def test_the_sample_budget_rule_is_the_floor_of_inserts_times_the_ratio(spi):
    budget = SampleBudget(spi)
    for inserts in range(0, 40):
        for samples in range(0, 12):
            for n in (1, 2, 5):
                expected = math.floor(inserts * spi) - samples >= n
                assert budget.sample_permitted(inserts=inserts, samples=samples, size=0, n=n) is expected


# -- the waiting keywords on the fast paths ----------------------------------------------------------------
def test_wait_on_a_ready_buffer_with_a_set_cancel_event_raises():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(torch.arange(4))
    event = threading.Event()
    event.set()
    with pytest.raises(RuntimeError):
        rb.sample(wait=True, cancel_event=event)
    assert rb.sample(wait=False, cancel_event=event).shape == (2,)  # without wait the event plays no part
    assert _counts(rb) == (1, 2)


def test_the_waiting_keywords_are_checked_on_the_fast_paths():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    with pytest.raises(TimeoutError):
        rb.sample(wait=True, timeout=0)
    rb.extend(torch.arange(4))
    assert rb.sample(wait=True, timeout=0).shape == (2,)
    with pytest.raises(ValueError, match="timeout"):
        rb.sample(wait=True, timeout=-1.0)
    with pytest.raises(ValueError, match="timeout"):
        rb.sample(wait=True, timeout=float("nan"))
    with pytest.raises(TypeError, match="wait"):
        rb.sample(wait=1)
    with pytest.raises(TypeError, match="cancel_event"):
        rb.sample(wait=True, cancel_event=object())
    assert _counts(rb) == (1, 2)


# -- MixedReplayBuffer: sample(wait=...) and as_dataset(wait=..., timeout=...) ---------------------------------
def _mixer(**kwargs):
    a = ReplayBuffer(storage=LazyTensorStorage(16))
    b = ReplayBuffer(storage=LazyTensorStorage(16))
    return a, b, MixedReplayBuffer([a, b], [1, 1], batch_size=4, **kwargs)


def test_a_mixer_sample_waits_for_an_empty_member():
    a, b, mixer = _mixer(skip_empty=False)
    a.extend(torch.zeros(8))
    with pytest.raises(RuntimeError, match="empty"):
        mixer.sample()  # without wait: the member's emptiness raises at once
    writer = threading.Timer(0.05, b.extend, args=(torch.ones(8),))
    writer.start()
    try:
        batch, info = mixer.sample(wait=True, timeout=30.0, return_info=True)
    finally:
        writer.join()
    assert batch.tolist() == [0.0, 0.0, 1.0, 1.0] and info["counts"] == [2, 2]


def test_a_mixer_sample_waits_for_any_data_with_skip_empty():
    a, b, mixer = _mixer()
    writer = threading.Timer(0.05, b.extend, args=(torch.ones(8),))
    writer.start()
    try:
        assert mixer.sample(wait=True, timeout=30.0).tolist() == [1.0] * 4
    finally:
        writer.join()


def test_a_mixer_wait_times_out_is_cancelled_and_checks_its_keywords():
    a, b, mixer = _mixer(skip_empty=False)
    a.extend(torch.zeros(8))
    with pytest.raises(TimeoutError, match="MixedReplayBuffer could not serve a batch of 4"):
        mixer.sample(wait=True, timeout=0.02)
    event = threading.Event()
    event.set()
    with pytest.raises(RuntimeError, match="cancelled"):
        mixer.sample(wait=True, cancel_event=event)
    with pytest.raises(TypeError, match="wait"):
        mixer.sample(wait="yes")
    with pytest.raises(ValueError, match="timeout"):
        mixer.sample(wait=True, timeout=-1)
    b.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        mixer.sample(wait=True, timeout=5.0)


def test_a_mixer_waits_for_a_rate_limited_members_budget():
    a = ReplayBuffer(storage=LazyTensorStorage(16))
    b = RateLimitedReplayBuffer(samples_per_insert=1.0, storage=LazyTensorStorage(16))
    mixer = MixedReplayBuffer([a, b], [1, 1], batch_size=4)
    a.extend(torch.zeros(8))
    b.extend(torch.ones(2))
    assert mixer.sample(wait=True, timeout=5.0).tolist() == [0.0, 0.0, 1.0, 1.0]  # b's budget: spent
    with pytest.raises(TimeoutError):
        mixer.sample(wait=True, timeout=0.02)
    assert b.stats()["sample_calls"] == 1 and a.stats()["sample_calls"] == 1  # the refused batch drew nothing
    writer = threading.Timer(0.05, b.extend, args=(torch.ones(2),))
    writer.start()
    try:
        assert mixer.sample(wait=True, timeout=30.0).tolist() == [0.0, 0.0, 1.0, 1.0]
    finally:
        writer.join()


def test_a_mixer_dataset_waits_in_each_draw():
    a, b, mixer = _mixer(skip_empty=False)
    a.extend(torch.zeros(8))
    dataset = mixer.as_dataset(num_batches=2, wait=True, timeout=30.0)
    assert dataset.wait is True and dataset.timeout == 30.0
    writer = threading.Timer(0.05, b.extend, args=(torch.ones(8),))
    writer.start()
    try:
        batches = [batch.tolist() for batch in dataset.loader(num_workers=0)]
    finally:
        writer.join()
    assert batches == [[0.0, 0.0, 1.0, 1.0]] * 2
    with pytest.raises(TypeError, match="wait"):
        mixer.as_dataset(wait=1)
