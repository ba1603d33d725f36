"""Issue 27 item 2: Reverb's limiters (``MinSize``, ``SampleToInsertRatio``) through ``rate_limiter=``: their
construction checks, both sides blocking, the timeout messages, checkpoints, and the ratio kept by two writer
processes and a 2-worker DataLoader reader (a counting invariant)."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    MinSize,
    RateLimiter,
    ReplayBuffer,
    SampleToInsertRatio,
    TensorDictReplayBuffer,
)


# -- construction checks (Reverb's) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("min_size", [0, -3])
def test_min_size_below_one(min_size):
    with pytest.raises(ValueError, match="min_size_to_sample"):
        MinSize(min_size)
    with pytest.raises(ValueError, match="min_size_to_sample"):
        SampleToInsertRatio(1.0, min_size, 10.0)


def test_min_size_of_a_wrong_type():
    with pytest.raises(TypeError, match="min_size_to_sample"):
        MinSize(True)


@pytest.mark.parametrize("error_buffer", [0.5, 0.0, (0.0, 1.5)])
def test_error_buffer_that_could_block_both_sides(error_buffer):
    with pytest.raises(ValueError, match=r"below 2 \* max\(1, samples_per_insert\)"):
        SampleToInsertRatio(1.0, 4, error_buffer)


def test_error_buffer_scaled_by_samples_per_insert():
    with pytest.raises(ValueError, match="could block"):
        SampleToInsertRatio(4.0, 1, 3.0)  # range 6 < 2 * 4
    SampleToInsertRatio(4.0, 1, 4.0)  # range 8: accepted


def test_min_diff_above_the_offset_deadlocks_sampling():
    with pytest.raises(ValueError, match="sampling would deadlock"):
        SampleToInsertRatio(1.0, 2, (3.0, 10.0))  # offset 2


def test_max_diff_below_the_offset_warns():
    with pytest.warns(UserWarning, match="inserts deadlock unless sampling runs concurrently"):
        limiter = SampleToInsertRatio(1.0, 5, (-10.0, 0.0))
    assert (limiter.min_diff, limiter.max_diff) == (-10.0, 0.0)


@pytest.mark.parametrize("error_buffer, error", [(-1.0, ValueError), (float("inf"), ValueError), ("4", TypeError),
                                                 ((1.0, 2.0, 3.0), ValueError)])  # fmt: skip
def test_bad_error_buffer(error_buffer, error):
    with pytest.raises(error, match="error_buffer"):
        SampleToInsertRatio(1.0, 1, error_buffer)


def test_samples_per_insert_checks():
    with pytest.raises(ValueError, match="samples_per_insert must be a finite positive number."):
        SampleToInsertRatio(0.0, 1, 4.0)
    with pytest.raises(TypeError, match="samples_per_insert must be a finite positive number."):
        SampleToInsertRatio("1", 1, 4.0)


def test_the_bounds_follow_reverb():
    limiter = SampleToInsertRatio(2.0, 3, 5.0)
    assert (limiter.min_diff, limiter.max_diff) == (1.0, 11.0)
    assert (MinSize(3).min_size_to_sample, MinSize(3).blocks_inserts) == (3, False)
    assert isinstance(limiter, RateLimiter) and limiter.error_buffer == 5.0


def test_rate_limiter_of_a_wrong_type():
    with pytest.raises(TypeError, match="rate_limiter"):
        ReplayBuffer(rate_limiter=3)


# -- behaviour in one process -------------------------------------------------------------------------------------
def _rb(limiter, **kwargs) -> ReplayBuffer:
    return make_buffer(capacity=256, batch_size=2, rate_limiter=limiter, **kwargs)


def test_min_size_gates_sampling_only():
    rb = _rb(MinSize(4))
    rb.extend(torch.arange(3))
    assert not rb.can_sample()
    with pytest.raises(RuntimeError, match="does not currently permit this sample"):
        rb.sample()
    threading.Timer(0.05, rb.extend, args=(torch.arange(1),)).start()
    assert rb.sample(wait=True, timeout=30.0).shape == (2,)
    for _ in range(5):
        rb.sample()  # no ratio: sampling never waits once the size is reached
    rb.extend(torch.arange(100))  # inserts never wait


def test_sample_side_timeout_names_the_side_and_the_counters():
    rb = _rb(SampleToInsertRatio(1.0, 2, 2.0))  # diff in [0, 4]
    rb.extend(torch.arange(2))
    rb.sample()
    with pytest.raises(TimeoutError, match=r"the sample side waited 0.05 seconds.*write_count=2, samples_returned=2"):
        rb.sample(wait=True, timeout=0.05)


def test_insert_side_blocks_and_its_timeout_names_the_side_and_the_counters():
    rb = _rb(SampleToInsertRatio(1.0, 2, 2.0))  # max_diff 4
    rb.extend(torch.arange(4))  # diff 4
    with pytest.raises(TimeoutError, match=r"the insert side waited 0.05 seconds.*write_count=4, samples_returned=0"):
        rb.extend(torch.arange(1), timeout=0.05)
    assert len(rb) == 4 and rb.stats()["insert_wait_count"] == 1 and rb.stats()["reserved_inserts"] == 0


def test_a_sample_wakes_a_blocked_insert():
    rb = _rb(SampleToInsertRatio(1.0, 2, 2.0))
    rb.extend(torch.arange(4))
    threading.Timer(0.05, rb.sample).start()
    rb.extend(torch.arange(2), timeout=30.0)  # permitted once 2 records were sampled
    assert rb.write_count == 6


def test_shutdown_ends_a_blocked_insert():
    rb = _rb(SampleToInsertRatio(1.0, 2, 2.0))
    rb.extend(torch.arange(4))
    threading.Timer(0.05, rb.shutdown).start()
    with pytest.raises(RuntimeError, match="shut down while a write waited"):
        rb.extend(torch.arange(1), timeout=30.0)
    assert rb.write_count == 4


def test_add_and_tensordict_writes_are_limited_too():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=2,
                                rate_limiter=SampleToInsertRatio(1.0, 1, 2.0))  # fmt: skip  # max_diff 3
    rb.extend(TensorDict(obs=torch.arange(3), batch_size=[3]))
    with pytest.raises(TimeoutError, match="insert side"):
        rb.add(TensorDict(obs=torch.tensor(9), batch_size=[]), timeout=0.02)
    with pytest.raises(TimeoutError, match="insert side"):
        rb.extend(TensorDict(obs=torch.arange(1), batch_size=[1]), timeout=0.02)
    assert "index" in rb.sample(wait=True, timeout=5.0).keys()


def test_requests_no_state_can_permit_are_refused_at_once():
    rb = _rb(SampleToInsertRatio(1.0, 1, 2.0))  # range 4
    rb.extend(torch.arange(2))
    with pytest.raises(ValueError, match="can never be permitted"):
        rb.sample(8, wait=True)
    with pytest.raises(ValueError, match="can never be permitted"):
        rb.extend(torch.arange(8))
    assert rb.write_count == 2


def test_limiter_stats():
    rb = _rb(SampleToInsertRatio(1.0, 2, 4.0))
    rb.extend(torch.arange(4))
    rb.sample()
    stats = rb.stats()
    assert stats["sample_insert_diff"] == 2.0 and stats["samples_per_insert"] == 0.5
    assert stats["target_samples_per_insert"] == 1.0 and stats["rate_limiter"].startswith("SampleToInsertRatio")


def test_limiter_counters_survive_dumps_loads(tmp_path):
    rb = _rb(SampleToInsertRatio(1.0, 2, 2.0))
    rb.extend(torch.arange(4))
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    fresh = _rb(SampleToInsertRatio(1.0, 2, 2.0))
    fresh.loads(tmp_path / "ckpt")
    assert fresh.stats()["sample_insert_diff"] == 2.0
    fresh.extend(torch.arange(2), timeout=5.0)  # diff 4: the limit
    with pytest.raises(TimeoutError, match="insert side"):
        fresh.extend(torch.arange(1), timeout=0.02)


# -- two writer processes and a 2-worker DataLoader reader keep the ratio (counting invariant) --------------------------
def _limited_writer(rb, n: int) -> None:
    for i in range(n):
        rb.extend(torch.tensor([i]), timeout=120.0)


def _run_collectors_and_learner(tmp_path, inserts_per_writer: int) -> dict:
    spi, min_size, error_buffer = 1.0, 10, 50.0
    limiter = SampleToInsertRatio(spi, min_size, error_buffer)
    rb = ReplayBuffer(storage=LazyMemmapStorage(4096, scratch_dir=tmp_path / "s"), batch_size=1,
                      rate_limiter=limiter, shared=True)  # fmt: skip
    rb.extend(torch.tensor([-1]))
    rb.empty()  # allocated (a memmap storage is written once before other processes use it), counters at 0
    inserts = 2 * inserts_per_writer
    samples = inserts  # one sampled record per insert: the writers then always finish
    ctx = mp.get_context("fork")
    writers = [ctx.Process(target=_limited_writer, args=(rb, inserts_per_writer)) for _ in range(2)]
    loader = rb.as_dataset(num_batches=samples, wait=True, timeout=120.0).loader(
        num_workers=2, multiprocessing_context="fork"
    )
    for w in writers:
        w.start()
    low, high, seen = float("inf"), -float("inf"), 0
    try:
        for batch in loader:
            seen += batch.numel()
            diff = rb.stats()["sample_insert_diff"]  # inserts * spi - samples, read in one locked view
            low, high = min(low, diff), max(high, diff)
    finally:
        for w in writers:
            w.join(120)
    assert all(w.exitcode == 0 for w in writers)
    stats = rb.stats()
    assert stats["write_count"] == inserts and stats["samples_returned"] == seen == samples
    # the counting invariant: the observed samples-per-insert never left the error buffer around the target
    assert limiter.min_diff <= low and high <= max(limiter.max_diff, spi * min_size), (low, high)
    assert stats["reserved_samples"] == stats["reserved_inserts"] == 0
    return {"low": low, "high": high, "ops": inserts + samples}


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_writers_and_two_workers_keep_the_ratio(tmp_path):
    assert _run_collectors_and_learner(tmp_path, inserts_per_writer=250)["ops"] == 1000


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_ten_thousand_operations_keep_the_ratio(tmp_path):
    result = _run_collectors_and_learner(tmp_path, inserts_per_writer=2500)
    print(f"\n10,000 operations: inserts*spi - samples stayed in [{result['low']}, {result['high']}]")
    assert result["ops"] == 10_000
