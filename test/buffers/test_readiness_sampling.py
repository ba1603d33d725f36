"""Issue 27 item 1: readiness on every buffer, in one process (threads): ``sample(wait=...)``, ``can_sample``,
every sampler's ``can_sample``, the cumulative counters in ``stats()`` and in every checkpoint."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PromptGroupSampler,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    StalenessAwareSampler,
    StorageEnsemble,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import ConsumingSampler
from torchrl.data.replay_buffers.training_state import load_training_state, save_training_state


def _rb(**kwargs) -> ReplayBuffer:
    return make_buffer(capacity=32, batch_size=4, **kwargs)


def _write_later(rb, data, delay: float = 0.05) -> threading.Timer:
    timer = threading.Timer(delay, rb.extend, args=(data,))
    timer.start()
    return timer


# -- can_sample of every sampler ---------------------------------------------------------------------------------
def _storage(n: int, **entries) -> LazyTensorStorage:
    storage = LazyTensorStorage(16)
    if n:
        storage.set(torch.arange(n), TensorDict({"obs": torch.arange(n), **entries}, [n]))
    return storage


def test_sampler_base_can_sample_needs_one_item():
    assert not RandomSampler().can_sample(_storage(0), 4)
    assert RandomSampler().can_sample(_storage(1), 4)  # with replacement: any batch size


def test_without_replacement_can_sample_with_and_without_drop_last():
    assert not SamplerWithoutReplacement().can_sample(_storage(0), 4)
    assert SamplerWithoutReplacement().can_sample(_storage(2), 4)  # a short batch
    assert not SamplerWithoutReplacement(drop_last=True).can_sample(_storage(3), 4)
    assert SamplerWithoutReplacement(drop_last=True).can_sample(_storage(4), 4)


def test_consuming_can_sample_counts_items_left():
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=ConsumingSampler(1), batch_size=2)
    rb.extend(torch.arange(3))
    assert rb.sampler.can_sample(rb.storage, 2) and rb.can_sample()
    rb.sample()
    assert not rb.can_sample() and rb.can_sample(1)  # one item left


def test_prioritized_can_sample_needs_positive_priorities():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(8), batch_size=2)
    assert not rb.can_sample()
    index = rb.extend(TensorDict(obs=torch.arange(2), batch_size=[2]))
    assert rb.can_sample()
    assert index.numel() == 2
    untold = PrioritizedSampler(max_capacity=8, alpha=1.0, beta=1.0)  # items it was never told about
    assert not untold.can_sample(rb.storage, 2)


def test_staleness_can_sample_waits_for_fresh_items():
    sampler = StalenessAwareSampler(max_staleness=1)
    storage = _storage(3, policy_version=torch.zeros(3, dtype=torch.long))
    assert sampler.can_sample(storage, 2)
    sampler.consumer_version = 5
    assert not sampler.can_sample(storage, 2)
    assert not sampler.can_sample(_storage(0), 2)


def test_prompt_group_can_sample_needs_whole_groups():
    sampler = PromptGroupSampler(samples_per_group=2, group_key="obs")
    assert not sampler.can_sample(_storage(0), 4)
    assert sampler.can_sample(_storage(4), 4)
    assert not sampler.can_sample(_storage(4), 3)


@pytest.mark.parametrize(
    "kwargs, ready",
    [
        ({"sample_from_all": True}, False),  # one member is empty
        ({}, True),  # any member
        ({"p": [1.0, 0.0]}, False),  # the only ready member has probability 0
        ({"p": [0.0, 1.0]}, True),
    ],
)
def test_ensemble_can_sample_follows_the_choice_rule(kwargs, ready):
    ensemble = SamplerEnsemble(RandomSampler(), RandomSampler(), **kwargs)
    storage = StorageEnsemble(_storage(0), _storage(3))
    assert ensemble.can_sample(storage, 4) is ready
    assert not ensemble.can_sample(storage, 3)  # not a multiple of num_buffer_sampled


def test_buffer_ensemble_can_sample_and_counters():
    a, b = _rb(), _rb()
    ens = ReplayBufferEnsemble(a, b, batch_size=4, sample_from_all=True)
    a.extend(torch.arange(4))
    assert not ens.can_sample()
    b.extend(torch.arange(4))
    assert ens.can_sample()
    ens.sample(wait=True, timeout=5.0)
    assert ens.stats()["sample_calls"] == 1 and ens.state_dict()["_readiness"]["sample_calls"] == 1


# -- sample(wait=True) in one process -------------------------------------------------------------------------------
def test_wait_wakes_on_a_write_of_another_thread():
    rb = _rb()
    timer = _write_later(rb, torch.arange(4) + 10)
    out = rb.sample(wait=True, timeout=30.0)
    timer.join()
    assert set(out.tolist()) <= {10, 11, 12, 13} and rb.stats()["sample_calls"] == 1


def test_wait_without_data_times_out_naming_the_fix():
    rb = _rb()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0.05 seconds.*Write data first \(rb.extend"):
        rb.sample(wait=True, timeout=0.05)
    assert time.monotonic() - start < 10
    assert rb.stats()["sample_calls"] == 0  # nothing was drawn


def test_without_wait_the_sampler_error_is_unchanged():
    with pytest.raises(RuntimeError, match="add data first"):
        _rb().sample()


def test_cancel_event_ends_the_wait():
    rb, event = _rb(), threading.Event()
    threading.Timer(0.05, event.set).start()
    with pytest.raises(RuntimeError, match="Replay-buffer sampling was cancelled."):
        rb.sample(wait=True, timeout=30.0, cancel_event=event)


def test_shutdown_wakes_a_waiting_sample():
    rb = _rb()
    threading.Timer(0.05, rb.shutdown).start()
    with pytest.raises(RuntimeError, match="A shut down replay buffer cannot be sampled."):
        rb.sample(wait=True, timeout=30.0)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"wait": 1}, TypeError),
        ({"wait": True, "timeout": True}, TypeError),
        ({"wait": True, "timeout": "1"}, TypeError),
        ({"wait": True, "timeout": -1.0}, ValueError),
        ({"wait": True, "timeout": float("nan")}, ValueError),
        ({"wait": True, "cancel_event": object()}, TypeError),
    ],
)
def test_bad_waiting_arguments_raise_before_anything(kwargs, error):
    rb = _rb()
    rb.extend(torch.arange(4))
    with pytest.raises(error):
        rb.sample(**kwargs)
    assert rb.stats()["sample_calls"] == 0


def test_wait_for_a_consuming_buffer_waits_for_a_full_batch():
    rb = ReplayBuffer(storage=LazyTensorStorage(16), sampler=ConsumingSampler(1), batch_size=4)
    rb.extend(torch.arange(2))
    timer = _write_later(rb, torch.arange(2) + 2)
    out = rb.sample(wait=True, timeout=30.0)
    timer.join()
    assert sorted(out.tolist()) == [0, 1, 2, 3]


def test_tensordict_buffer_passes_the_waiting_keywords():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    timer = _write_later(rb, TensorDict(obs=torch.arange(2), batch_size=[2]))
    out = rb.sample(wait=True, timeout=30.0)
    timer.join()
    assert "index" in out.keys() and rb.stats()["samples_returned"] == 2


def test_wait_with_prefetch():
    rb = ReplayBuffer(storage=LazyTensorStorage(16), batch_size=2, prefetch=2)
    timer = _write_later(rb, torch.arange(8))
    assert rb.sample(wait=True, timeout=30.0).shape == (2,)
    timer.join()
    rb.sample()
    assert rb.stats()["sample_calls"] >= 2  # prefetched batches are counted when drawn
    rb.shutdown()


def test_delayed_init_buffer_is_not_ready_and_not_built_by_can_sample():
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=2, delayed_init=True)
    assert rb.stats()["sample_calls"] == 0 and not rb.initialized
    timer = _write_later(rb, torch.arange(2))
    rb.sample(wait=True, timeout=30.0)
    timer.join()


# -- counters --------------------------------------------------------------------------------------------------------
def test_counters_are_cumulative_and_count_records():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=3)
    rb.extend(torch.arange(10))  # wraps: write_count keeps counting
    rb.sample()
    rb.sample(2)
    rb.sample_raw()
    stats = rb.stats()
    assert (stats["write_count"], stats["sample_calls"], stats["samples_returned"]) == (10, 3, 8)
    assert stats["sampleable_size"] == 4
    rb.empty()
    assert (rb.stats()["sample_calls"], rb.stats()["samples_returned"], rb.write_count) == (0, 0, 0)


def _used_buffer(storage=None) -> ReplayBuffer:
    rb = make_buffer(storage=LazyTensorStorage(8) if storage is None else storage, batch_size=3, data=torch.arange(5))
    rb.sample()
    rb.sample(2)
    return rb


def _counters(rb) -> tuple:
    stats = rb.stats()
    return stats["write_count"], stats["sample_calls"], stats["samples_returned"]


def test_counters_survive_state_dict():
    rb = _used_buffer()
    fresh = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=3)
    fresh.load_state_dict(rb.state_dict())
    assert _counters(fresh) == _counters(rb) == (5, 2, 5)


def test_counters_survive_dumps_loads(tmp_path):
    rb = _used_buffer(LazyMemmapStorage(8, scratch_dir=tmp_path / "a"))
    rb.dumps(tmp_path / "ckpt")
    fresh = ReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=tmp_path / "b"), batch_size=3)
    fresh.loads(tmp_path / "ckpt")
    assert _counters(fresh) == (5, 2, 5)


def test_counters_survive_save_training_state(tmp_path):
    rb = _used_buffer()
    save_training_state(tmp_path / "run", rb=rb, fsync=False)
    fresh = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=3)
    load_training_state(tmp_path / "run", rb=fresh)
    assert _counters(fresh) == (5, 2, 5)


def test_a_corrupt_counter_in_a_state_dict_is_refused_before_loading():
    rb = _used_buffer()
    state = rb.state_dict()
    state["_readiness"]["samples_returned"] = -3
    fresh = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=3)
    with pytest.raises(ValueError, match="samples_returned"):
        fresh.load_state_dict(state)
    assert len(fresh) == 0


def test_counters_survive_pickling():
    import pickle

    rb = _used_buffer()
    assert _counters(pickle.loads(pickle.dumps(rb))) == (5, 2, 5)
