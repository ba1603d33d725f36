"""Issue 27 item 2: ``RateLimitedReplayBuffer`` (TorchRL's budget rule, errors, stats keys and state), with
prefetching, and shared by DataLoader workers that never over-draw one budget."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading
import time

import pytest
import torch
from helpers.factories import make_buffer

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    RateLimitedReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SampleToInsertRatio,
)
from torchrl.data.replay_buffers.replay_buffers import _service_backend
from torchrl.data.replay_buffers.training_state import load_training_state, save_training_state


def _rb(spi: float = 1.0, **kwargs) -> RateLimitedReplayBuffer:
    kwargs.setdefault("batch_size", 2)
    return make_buffer(cls=RateLimitedReplayBuffer, capacity=64, samples_per_insert=spi, **kwargs)


# -- construction ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spi", [True, "1", None])
def test_samples_per_insert_of_a_wrong_type(spi):
    with pytest.raises(TypeError, match="samples_per_insert must be a finite positive number."):
        RateLimitedReplayBuffer(samples_per_insert=spi)


@pytest.mark.parametrize("spi", [0, -1.0, float("inf"), float("nan")])
def test_samples_per_insert_not_finite_positive(spi):
    with pytest.raises(ValueError, match="samples_per_insert must be a finite positive number."):
        RateLimitedReplayBuffer(samples_per_insert=spi)


def test_a_backend_that_does_not_forward_the_waits_is_refused(monkeypatch):
    # "ray" is accepted (test/ray_buffer/test_ray_ratelimit_budget.py); a backend registered elsewhere is not.
    built = []
    monkeypatch.setitem(_service_backend._FACTORIES, "elsewhere", lambda cls, *a, **k: built.append(cls))
    with pytest.raises(ValueError, match="does not support service_backend="):
        RateLimitedReplayBuffer(samples_per_insert=1.0, service_backend="elsewhere")
    assert built == []
    ReplayBuffer(service_backend="elsewhere")  # the backend itself works for buffers that need no readiness
    assert built == [ReplayBuffer]


def test_a_rate_limiter_keyword_is_refused():
    with pytest.raises(TypeError, match="its own rate limiter"):
        RateLimitedReplayBuffer(samples_per_insert=1.0, rate_limiter=SampleToInsertRatio(1.0, 1, 4.0))


def test_samples_per_insert_is_required():
    with pytest.raises(TypeError):
        RateLimitedReplayBuffer()


# -- the budget rule ------------------------------------------------------------------------------------------------
def test_the_budget_is_floor_of_inserts_times_ratio_minus_samples():
    rb = _rb(0.5)
    rb.extend(torch.arange(5))  # floor(2.5) = 2 records
    assert rb.can_sample() and rb.stats()["sample_budget"] == 2
    rb.sample()
    assert not rb.can_sample() and rb.stats()["sample_budget"] == 0
    with pytest.raises(
        RuntimeError,
        match="Replay readiness or the sample-to-insert ratio does not currently permit this sample. Pass wait=True",
    ):
        rb.sample()
    rb.extend(torch.arange(1))  # floor(3.0) - 2 = 1: still short of a batch of 2
    assert not rb.can_sample() and rb.can_sample(1)


def test_torchrl_doc_example():
    rb = _rb(1.0, storage=LazyTensorStorage(10))
    rb.extend(torch.arange(2))
    assert rb.sample(wait=True, timeout=1.0).shape == (2,)
    assert not rb.can_sample()


def test_waiting_past_the_deadline_raises_the_budget_timeout():
    rb = _rb()
    rb.extend(torch.arange(2))
    rb.sample()
    with pytest.raises(TimeoutError, match=r"Replay buffer did not obtain sample-ratio budget within 0.05 seconds."):
        rb.sample(wait=True, timeout=0.05)
    stats = rb.stats()
    assert stats["sample_wait_count"] == 1 and stats["reserved_samples"] == 0 and stats["samples_returned"] == 2


def test_a_write_of_another_thread_gives_budget_to_a_waiting_sample():
    rb = _rb()
    threading.Timer(0.05, rb.extend, args=(torch.arange(2),)).start()
    assert rb.sample(wait=True, timeout=30.0).shape == (2,)
    assert rb.stats()["sample_wait_count"] == 1


def test_shut_down_and_cancelled_buffers_refuse_to_sample():
    rb = _rb()
    rb.extend(torch.arange(4))
    event = threading.Event()
    event.set()
    with pytest.raises(RuntimeError, match="Replay-buffer sampling was cancelled."):
        rb.sample(cancel_event=event)
    rb.shutdown()
    assert not rb.can_sample()
    with pytest.raises(RuntimeError, match="A shut down replay buffer cannot be sampled."):
        rb.sample()


def test_stats_keys():
    rb = _rb(2.0)
    assert rb.stats()["samples_per_insert"] == 0.0  # before any write
    rb.extend(torch.arange(2))
    rb.sample()
    stats = rb.stats()
    assert stats["target_samples_per_insert"] == 2.0 and stats["samples_per_insert"] == 1.0
    assert (stats["sample_budget"], stats["reserved_samples"], stats["sample_wait_count"]) == (2, 0, 0)


def test_a_failed_draw_releases_its_reservation():
    rb = _rb(storage=LazyTensorStorage(8), transform=lambda x: 1 / 0)
    rb.extend(torch.arange(4))
    with pytest.raises(ZeroDivisionError):
        rb.sample()
    stats = rb.stats()
    assert stats["reserved_samples"] == 0 and stats["sample_budget"] == 4
    assert stats["sample_calls"] == stats["samples_returned"] == 0  # counted before the draw, given back


def test_a_draw_of_fewer_records_counts_only_those():
    rb = _rb(2.0, storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(drop_last=False), batch_size=4)
    rb.extend(torch.arange(5))
    assert rb.sample().shape == (4,) and rb.sample().shape == (1,)  # the epoch's last, partial batch
    stats = rb.stats()
    assert (stats["sample_calls"], stats["samples_returned"], stats["sample_budget"]) == (2, 5, 10 - 5)


def test_the_counters_are_cumulative_after_the_ring_wraps():
    rb = _rb(1.0, storage=LazyTensorStorage(4))
    rb.extend(torch.arange(10))
    assert rb.stats()["sample_budget"] == 10 and len(rb) == 4


# -- prefetch (beyond TorchRL) ---------------------------------------------------------------------------------------
def test_prefetched_batches_count_against_the_budget():
    rb = _rb(1.0, prefetch=2)
    rb.extend(torch.arange(8))  # 8 records: exactly 4 batches
    got = []
    for _ in range(4):
        got.append(rb.sample())
        stats = rb.stats()
        assert stats["samples_returned"] + stats["reserved_samples"] <= 8
    with pytest.raises(RuntimeError, match="does not currently permit this sample"):
        rb.sample()
    assert len(got) == 4 and rb.stats()["samples_returned"] == 8
    rb.extend(torch.arange(2))
    assert rb.sample(wait=True, timeout=30.0).shape == (2,)
    rb.shutdown()
    assert rb.stats()["reserved_samples"] == 0


# -- state ----------------------------------------------------------------------------------------------------------
def _used() -> RateLimitedReplayBuffer:
    rb = _rb(0.5, storage=LazyTensorStorage(16))
    rb.extend(torch.arange(9))  # floor(4.5) = 4
    rb.sample()
    with pytest.raises(TimeoutError):
        rb.sample(4, wait=True, timeout=0.01)
    return rb


def _budget(rb) -> tuple:
    stats = rb.stats()
    return stats["write_count"], stats["samples_returned"], stats["sample_budget"], stats["sample_wait_count"]


def test_state_dict_carries_the_rate_limit():
    rb = _used()
    state = rb.state_dict()
    assert state["_rate_limit"] == {"samples_per_insert": 0.5, "sample_wait_count": 1}
    fresh = _rb(3.0, storage=LazyTensorStorage(16))
    fresh.load_state_dict(state)
    assert _budget(fresh) == _budget(rb) == (9, 2, 2, 1) and fresh.samples_per_insert == 0.5
    del state["_rate_limit"]
    with pytest.raises(KeyError, match="_rate_limit"):
        fresh.load_state_dict(state)


def test_budget_survives_dumps_loads(tmp_path):
    rb = _used()
    rb.dumps(tmp_path / "ckpt")
    fresh = _rb(0.5, storage=LazyTensorStorage(16))
    fresh.loads(tmp_path / "ckpt")
    assert _budget(fresh) == (9, 2, 2, 1)


def test_budget_survives_save_training_state(tmp_path):
    rb = _used()
    save_training_state(tmp_path / "run", rb=rb, fsync=False)
    fresh = _rb(0.5, storage=LazyTensorStorage(16))
    load_training_state(tmp_path / "run", rb=fresh)
    assert _budget(fresh) == (9, 2, 2, 1)
    assert fresh.sample(2).shape == (2,) and not fresh.can_sample()


# -- DataLoader workers and writer processes share one budget ---------------------------------------------------------
def _collector(rb, chunks: int, size: int, pause: float) -> None:
    for i in range(chunks):
        rb.extend(torch.full((size,), i))
        time.sleep(pause)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_dataloader_workers_never_over_draw_the_budget(tmp_path):
    spi, batch = 0.5, 2
    rb = RateLimitedReplayBuffer(
        samples_per_insert=spi, storage=LazyMemmapStorage(256, scratch_dir=tmp_path / "s"), batch_size=batch,
        shared=True,
    )
    rb.extend(torch.zeros(4, dtype=torch.long))  # floor(2) = 2 records to start with
    ctx = mp.get_context("fork")
    writer = ctx.Process(target=_collector, args=(rb, 9, 4, 0.02))  # 36 more: 40 in all, 20 records
    loader = rb.as_dataset(num_batches=10, wait=True, timeout=120.0).loader(
        num_workers=2, multiprocessing_context="fork"
    )
    writer.start()
    seen = 0
    try:
        for batch_data in loader:
            seen += batch_data.numel()
            stats = rb.stats()
            assert stats["samples_returned"] <= math.floor(stats["write_count"] * spi)  # never over-drawn
    finally:
        writer.join(60)
    stats = rb.stats()
    assert seen == stats["samples_returned"] == 20 and stats["write_count"] == 40
    assert stats["sample_budget"] == 0 and stats["reserved_samples"] == 0 and not rb.can_sample()
