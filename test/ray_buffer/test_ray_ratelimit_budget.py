"""Issue 27 item 2 over Ray: one sample budget (``RateLimitedReplayBuffer``, ``rate_limiter=``) in the actor for
every client, and readiness (``sample(wait=..., timeout=..., cancel_event=...)``, ``can_sample``, a limited
``extend(timeout=...)``) through clients that wait in their own process, never in the actor.

One local cluster for the module (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off:
nothing leaves the machine); actors reserve no CPU, so none waits for another. The actors are the slow part
(each is a process that imports torch): each kind is built once per module and emptied by the tests.
"""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import functools
import pickle
import sys
import threading
import time

import pytest
import torch
from helpers.extras import require

from torchrl.data import (
    LazyTensorStorage,
    RateLimitedReplayBuffer,
    RayReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
)

ray = require("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Ray task below travels by value

pytestmark = [pytest.mark.extras, pytest.mark.multiprocess]

STORAGE = functools.partial(LazyTensorStorage, 64)
NO_CPU = {"remote_config": {"num_cpus": 0}}
PHRASE_NOT_PERMITTED = "Replay readiness or the sample-to-insert ratio does not currently permit this sample."


# -- arguments checked before any actor starts (no cluster) ---------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"samples_per_insert": 0.0}, ValueError, "samples_per_insert must be a finite positive number."),
        ({"samples_per_insert": True}, TypeError, "samples_per_insert must be a finite positive number."),
        ({}, TypeError, "missing the keyword argument `samples_per_insert`"),
        ({"samples_per_insert": 1.0, "rate_limiter": SampleToInsertRatio(1.0, 1, 4.0)}, TypeError,
         "its own rate limiter"),
    ],
)
def test_a_bad_argument_of_a_hosted_rate_limited_buffer_raises_before_ray_starts(kwargs, error, match):
    was_running = ray.is_initialized()
    with pytest.raises(error, match=match):
        RateLimitedReplayBuffer(storage=STORAGE, service_backend="ray", **kwargs)
    assert ray.is_initialized() == was_running


# -- the cluster and the actors -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def limited_actor(cluster):
    rb = RateLimitedReplayBuffer(samples_per_insert=1.0, storage=STORAGE, batch_size=2, service_backend="ray",
                                 service_backend_options=NO_CPU)
    yield rb
    rb.close()


@pytest.fixture
def limited(limited_actor):
    limited_actor.empty()  # the data and the counters (the budget starts over)
    return limited_actor


@pytest.fixture(scope="module")
def plain(cluster):
    rb = ReplayBuffer(storage=STORAGE, batch_size=2, service_backend="ray", service_backend_options=NO_CPU)
    yield rb
    rb.close()


def _local(**kwargs) -> RateLimitedReplayBuffer:
    return RateLimitedReplayBuffer(samples_per_insert=1.0, storage=LazyTensorStorage(64), batch_size=2, **kwargs)


def _raised(call) -> BaseException:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the test compares what was raised
        return err
    raise AssertionError("nothing was raised")


# -- one budget for every client ------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_every_client_draws_from_the_one_budget_in_the_actor(limited):
    assert type(limited) is RayReplayBuffer and isinstance(limited, RateLimitedReplayBuffer)
    writer, learner_a, learner_b = (pickle.loads(pickle.dumps(c)) for c in limited.clients(3))
    assert isinstance(learner_a, RateLimitedReplayBuffer)
    assert not learner_a.can_sample()
    writer.extend(torch.arange(4))
    assert learner_a.can_sample() and learner_b.can_sample(4)
    assert learner_a.sample().shape == (2,)
    assert learner_b.sample(wait=False).shape == (2,)
    assert not learner_a.can_sample() and not learner_b.can_sample(1)
    with pytest.raises(RuntimeError, match=PHRASE_NOT_PERMITTED):
        learner_b.sample()
    stats = learner_a.stats()
    assert stats["sample_budget"] == 0 and stats["samples_returned"] == 4 and stats["sample_calls"] == 2
    assert stats["target_samples_per_insert"] == 1.0 and stats["samples_per_insert"] == 1.0
    assert stats["reserved_samples"] == 0 and stats["sample_wait_count"] == 0
    assert learner_b.state_dict()["_rate_limit"] == {"samples_per_insert": 1.0, "sample_wait_count": 0}


@pytest.mark.timeout(120)
def test_a_waiting_client_leaves_the_actor_free_for_the_writer(limited):
    learner, writer = limited.clients(2)
    got = {}

    def learn():
        start = time.monotonic()
        got["batch"] = learner.sample(wait=True, timeout=30.0)
        got["waited"] = time.monotonic() - start

    thread = threading.Thread(target=learn)
    thread.start()
    time.sleep(0.3)
    start = time.monotonic()
    assert writer.stats()["sample_calls"] == 0  # the actor answers while the learner waits
    writer.extend(torch.arange(10, 12))
    assert time.monotonic() - start < 5.0
    thread.join(30)
    assert not thread.is_alive()
    assert sorted(got["batch"].tolist()) in ([10, 10], [10, 11], [11, 11]) and got["waited"] < 10.0
    stats = writer.stats()
    assert stats["sample_wait_count"] == 1  # one waiting call, counted once however many attempts it sent
    assert stats["sample_budget"] == 0 and stats["samples_returned"] == 2


def _consume(client, batches: int) -> list:
    return [client.sample(wait=True, timeout=60.0).tolist() for _ in range(batches)]


@pytest.mark.timeout(180)
def test_clients_in_other_processes_never_over_draw_the_budget(limited, cluster):
    remote = cluster.remote(num_cpus=0)(_consume).remote(limited.client(), 3)  # a client in another process
    local = {}
    thread = threading.Thread(target=lambda: local.setdefault("batches", _consume(limited.client(), 3)))
    thread.start()
    for start in range(0, 12, 2):  # 12 inserts pay for 12 records: the 6 batches of 2, not one more
        limited.extend(torch.arange(start, start + 2))
        stats = limited.stats()
        assert stats["samples_returned"] <= stats["write_count"] and stats["sample_budget"] >= 0
        time.sleep(0.05)
    thread.join(60)
    batches = cluster.get(remote, timeout=60) + local["batches"]
    assert len(batches) == 6 and all(len(batch) == 2 for batch in batches)
    stats = limited.stats()
    assert stats["samples_returned"] == 12 and stats["sample_budget"] == 0 and not limited.can_sample()


# -- the errors of a local buffer -----------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_wait_past_its_timeout_raises_the_local_message(limited):
    local = _local()
    for rb in (limited, local):
        rb.extend(torch.arange(2))
        rb.sample()
    start = time.monotonic()
    remote_err = _raised(lambda: limited.sample(wait=True, timeout=0.3))
    assert 0.3 <= time.monotonic() - start < 5.0
    local_err = _raised(lambda: local.sample(wait=True, timeout=0.3))
    assert type(remote_err) is type(local_err) is TimeoutError
    assert str(remote_err) == str(local_err)
    assert "Replay buffer did not obtain sample-ratio budget within 0.3 seconds." in str(remote_err)
    assert limited.stats()["sample_wait_count"] == local.stats()["sample_wait_count"] == 1
    zero = _raised(lambda: limited.sample(wait=True, timeout=0))
    assert isinstance(zero, TimeoutError) and "within 0.0 seconds" in str(zero)


@pytest.mark.timeout(120)
def test_a_cancel_event_ends_the_wait_in_the_client(limited):
    event = threading.Event()
    threading.Timer(0.2, event.set).start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Replay-buffer sampling was cancelled."):
        limited.sample(wait=True, timeout=30.0, cancel_event=event)
    assert time.monotonic() - start < 10.0
    limited.extend(torch.arange(4))  # data and budget: a set event still refuses, as in a local buffer
    for wait in (True, False):
        with pytest.raises(RuntimeError, match="Replay-buffer sampling was cancelled."):
            limited.sample(wait=wait, cancel_event=event)
    assert limited.sample(cancel_event=threading.Event()).shape == (2,)  # an unset event: sampled


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kwargs",
    [{"wait": "yes"}, {"wait": True, "timeout": -1.0}, {"wait": True, "timeout": True},
     {"wait": True, "cancel_event": object()}],
    ids=["wait", "negative-timeout", "bool-timeout", "cancel-event"],
)
def test_waiting_arguments_are_refused_as_a_local_buffer_refuses_them(limited, kwargs):
    remote_err = _raised(lambda: limited.sample(**kwargs))
    local_err = _raised(lambda: _local().sample(**kwargs))
    assert type(remote_err) is type(local_err) and str(remote_err) == str(local_err)


@pytest.mark.timeout(120)
def test_a_buffer_without_limiter_waits_for_data_through_its_client(plain):
    plain.empty()
    local = ReplayBuffer(storage=LazyTensorStorage(64), batch_size=2)
    assert not plain.can_sample() and not local.can_sample()
    remote_err = _raised(lambda: plain.sample(wait=True, timeout=0.2))
    local_err = _raised(lambda: local.sample(wait=True, timeout=0.2))
    assert isinstance(remote_err, TimeoutError) and str(remote_err) == str(local_err)
    assert "could not serve a batch of 2 within 0.2 seconds" in str(remote_err)
    threading.Timer(0.2, plain.client().extend, args=(torch.arange(3),)).start()
    batch, info = plain.sample(wait=True, timeout=30.0, return_info=True)
    assert batch.shape == (2,) and info["index"].shape == (2,)
    assert plain.can_sample() and plain.can_sample(8)  # drawn with replacement: any size once non-empty
    stats = plain.stats()
    assert stats["sample_calls"] == 1 and stats["samples_returned"] == 2


# -- a Reverb limiter: the writer waits in its client too -----------------------------------------------------
@pytest.mark.timeout(120)
def test_a_sample_to_insert_ratio_makes_the_writer_wait_in_its_client(cluster):
    def limiter():
        return SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=4.0)

    rb = ReplayBuffer(storage=STORAGE, batch_size=2, rate_limiter=limiter(), service_backend="ray",
                      service_backend_options=NO_CPU)
    local = ReplayBuffer(storage=LazyTensorStorage(64), batch_size=2, rate_limiter=limiter())
    try:
        writer, learner = rb.clients(2)
        for buffer in (writer, local):
            buffer.extend(torch.arange(6))  # offset 2 + error 4: six inserts ahead is the limit
            buffer.sample()
            buffer.extend(torch.arange(2))
        start = time.monotonic()
        remote_err = _raised(lambda: writer.extend(torch.arange(1), timeout=0.2))
        assert 0.2 <= time.monotonic() - start < 5.0
        local_err = _raised(lambda: local.extend(torch.arange(1), timeout=0.2))
        assert isinstance(remote_err, TimeoutError) and str(remote_err) == str(local_err)
        assert "the insert side waited 0.2 seconds" in str(remote_err)
        with pytest.raises(TypeError, match="`timeout` must be None or a number of seconds"):
            writer.add(torch.tensor(1), timeout="soon")
        assert len(rb) == 8  # nothing was written by the refused calls
        threading.Timer(0.3, learner.sample).start()  # the learner catches up: the writer may go on
        assert int(writer.add(torch.tensor(100), timeout=30.0)) == 8
        stats = learner.stats()
        assert stats["insert_wait_count"] == 2 and stats["write_count"] == 9 and stats["reserved_inserts"] == 0
        assert learner.sample(wait=True, timeout=5.0).shape == (2,)
    finally:
        rb.close()


# -- as_dataset(wait=True): DataLoader readers wait for the budget in their own process -------------------------
def _drain(dataset, out: dict) -> None:
    out["batches"] = [batch.tolist() for batch in dataset]


@pytest.mark.timeout(120)
def test_a_waiting_dataset_reads_what_the_budget_pays_for_and_no_more(limited):
    reader = {}
    thread = threading.Thread(target=_drain, args=(limited.as_dataset(num_batches=6, wait=True, timeout=60.0), reader))
    thread.start()
    for start in range(0, 12, 2):  # 12 inserts pay for the 6 batches of 2
        time.sleep(0.05)
        limited.extend(torch.arange(start, start + 2))
        stats = limited.stats()
        assert stats["samples_returned"] <= stats["write_count"] and stats["sample_budget"] >= 0
    thread.join(60)
    assert not thread.is_alive() and len(reader["batches"]) == 6
    assert all(len(batch) == 2 for batch in reader["batches"])
    stats = limited.stats()
    assert stats["samples_returned"] == 12 and stats["sample_budget"] == 0 and stats["sample_wait_count"] >= 1


@pytest.mark.timeout(180)
def test_two_spawned_workers_of_a_waiting_dataset_never_over_draw_the_budget(limited):
    from torch.utils.data import DataLoader

    def write() -> None:  # once a worker waits: 16 inserts pay for the 8 batches of 2, 2 at a time
        deadline = time.monotonic() + 90
        while limited.stats()["sample_wait_count"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        for start in range(0, 16, 2):
            limited.extend(torch.arange(start, start + 2))
            time.sleep(0.1)

    loader = DataLoader(limited.as_dataset(num_batches=8, wait=True, timeout=90.0, batches_per_call=2),
                        batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120)  # fmt: skip
    writer = threading.Thread(target=write)
    writer.start()
    got = []
    for batch in loader:
        got.append(batch.tolist())
        stats = limited.stats()
        assert stats["samples_returned"] <= stats["write_count"], stats
    writer.join(60)
    assert len(got) == 8 and all(len(batch) == 2 for batch in got)
    stats = limited.stats()
    assert stats["samples_returned"] == 16 and stats["sample_budget"] == 0 and stats["sample_wait_count"] >= 1


@pytest.mark.timeout(120)
def test_a_waiting_dataset_past_its_timeout_raises_the_local_message(limited):
    limited.extend(torch.arange(2))
    limited.sample()  # the budget is spent
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"Replay buffer did not obtain sample-ratio budget within 0.3 seconds."):
        next(iter(limited.as_dataset(num_batches=1, wait=True, timeout=0.3)))
    assert 0.3 <= time.monotonic() - start < 10.0
    with pytest.raises(RuntimeError, match=PHRASE_NOT_PERMITTED):  # without wait: the refusal, at once
        next(iter(limited.as_dataset(num_batches=1)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kwargs, error, match",
    [({"wait": "yes"}, TypeError, "`wait` must be a bool"), ({"wait": True, "timeout": -1.0}, ValueError,
     "`timeout` must be None or a number of seconds >= 0, got -1.0")],
    ids=["wait", "negative-timeout"],
)
def test_a_waiting_dataset_checks_its_arguments(limited, kwargs, error, match):
    with pytest.raises(error, match=match):
        limited.as_dataset(**kwargs)


@pytest.mark.timeout(120)
def test_poll_raw_checks_its_count_and_timeout_before_calling_the_actor(limited):
    limited.extend(torch.arange(4))
    with pytest.raises(ValueError, match="`count` must be a positive int, got 0"):
        limited.poll_raw(2, 0)
    with pytest.raises(ValueError, match=r"`timeout` must be None \(no limit\) or >= 0 seconds"):
        limited.poll_raw(2, 1, timeout=-1.0)
    assert limited.stats()["samples_returned"] == 0  # nothing was drawn by the refused calls
    batches = limited.poll_raw(2, 8)  # up to 8 asked: the 4 inserts pay for 2 batches of 2
    assert [len(b) for b in batches] == [2, 2] and limited.stats()["samples_returned"] == 4
