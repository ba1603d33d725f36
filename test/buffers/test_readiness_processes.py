"""Issue 27 item 1: a learner blocked in ``sample(wait=True)`` wakes on a write made by another process.

The wake latency is recorded (printed with ``-s``), not asserted tightly: the checks are that the learner woke,
that it woke after the write (it returns the written rows and its wake time follows the writer's stamp), and that
it woke long before the generous timeout.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, RateLimitedReplayBuffer, ReplayBuffer

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

WRITTEN = 7


def _write_after(rb, stamps, delay: float) -> None:
    """Child: waits, writes one batch of ``WRITTEN``, records when the write returned (wall clock)."""
    time.sleep(delay)
    stamps[0] = time.time()  # before: the learner cannot wake before this
    rb.extend(torch.full((4,), WRITTEN))
    stamps[1] = time.time()


def _learner_wakes(rb, method: str, delay: float) -> float:
    stamps = torch.zeros(2, dtype=torch.float64).share_memory_()
    child = mp.get_context(method).Process(target=_write_after, args=(rb, stamps, delay))
    child.start()
    try:
        out = rb.sample(wait=True, timeout=120.0)
        woke = time.time()
    finally:
        child.join(60)
    assert child.exitcode == 0
    assert out.tolist() == [WRITTEN] * 4  # it returned the rows the other process wrote
    assert stamps[0] > 0 and woke >= stamps[0].item()  # ordering: it woke after the write started
    latency = woke - stamps[1].item()
    print(f"\nwake latency ({method}, {type(rb.storage).__name__}): {latency * 1000:.1f} ms")
    assert latency < 60.0  # woke long before the timeout (the target is < 0.1 s; see the report's numbers)
    return latency


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_learner_wakes_on_a_write_of_another_process(method):
    rb = ReplayBuffer(storage=LazyTensorStorage(16, shared_init=True), batch_size=4, shared=True)
    _learner_wakes(rb, method, delay=0.3)
    assert rb.stats()["sample_calls"] == 1 and rb.stats()["samples_returned"] == 4


@pytest.mark.parametrize("method", ["fork"])
def test_memmap_learner_wakes_on_a_write_of_another_process(method, tmp_path):
    storage = LazyMemmapStorage(16, scratch_dir=tmp_path / "s")
    rb = ReplayBuffer(storage=storage, batch_size=4, shared=True)
    rb.extend(torch.zeros(4, dtype=torch.long))  # a memmap storage is written once before other processes
    rb.empty()
    _learner_wakes(rb, method, delay=0.3)


@pytest.mark.parametrize("method", ["fork"])
def test_rate_limited_learner_wakes_on_a_write_of_another_process(method):
    rb = RateLimitedReplayBuffer(
        samples_per_insert=1.0, storage=LazyTensorStorage(16, shared_init=True), batch_size=4, shared=True
    )
    _learner_wakes(rb, method, delay=0.3)
    assert rb.stats()["sample_budget"] == 0 and rb.stats()["sample_wait_count"] == 1


def _wait_in_child(rb, result) -> None:
    """Child: blocks in sample(wait=True) until the parent shuts the buffer down."""
    try:
        rb.sample(wait=True, timeout=60.0)
        result[0] = 1
    except RuntimeError as err:
        result[0] = 2 if "A shut down replay buffer cannot be sampled." in str(err) else 3


def test_shutdown_in_one_process_ends_the_wait_of_another():
    rb = ReplayBuffer(storage=LazyTensorStorage(16, shared_init=True), batch_size=4, shared=True)
    result = torch.zeros(1, dtype=torch.long).share_memory_()
    child = mp.get_context("fork").Process(target=_wait_in_child, args=(rb, result))
    child.start()
    time.sleep(0.3)
    rb.shutdown()
    child.join(60)
    assert child.exitcode == 0 and result.item() == 2
