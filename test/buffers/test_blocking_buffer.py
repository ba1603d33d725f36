"""BlockingReplayBuffer: producers wait for consumed slots; a write is admitted whole or not at all.

Every wait in these tests has a timeout (the buffer's ``timeout=``, a thread ``join`` timeout, and the module's
``pytest.mark.timeout``), so a deadlock fails instead of hanging. Checks that a producer is still blocked look at
the buffer's content, never at how long something took.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import threading

import pytest
import torch
from helpers.factories import make_buffer

from torchrl.data import (
    BlockingReplayBuffer,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    SampleToInsertRatio,
)
from torchrl.envs.transforms import Compose

pytestmark = pytest.mark.timeout(120)

JOIN_S = 30.0


def _blocking(capacity: int = 4, **kwargs) -> BlockingReplayBuffer:
    return make_buffer(cls=BlockingReplayBuffer, storage=LazyTensorStorage(capacity), **kwargs)


class _Producer(threading.Thread):
    """Runs ``rb.extend(data, **kwargs)`` (or ``rb.add``) in a thread and keeps its result or error."""

    def __init__(self, rb, data, method: str = "extend", **kwargs):
        super().__init__(daemon=True)
        self.rb, self.data, self.method, self.kwargs = rb, data, method, kwargs
        self.done = threading.Event()
        self.result = self.error = None

    def run(self) -> None:
        try:
            self.result = getattr(self.rb, self.method)(self.data, **self.kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            self.error = err
        finally:
            self.done.set()

    def finish(self):
        self.join(JOIN_S)
        assert not self.is_alive(), "the producer never returned"
        return self.result


def _stored(rb) -> list[int]:
    return sorted(rb.storage[: len(rb.storage)].tolist())


# -- blocking and waking ----------------------------------------------------------------------------------------
def test_a_producer_waits_on_a_full_buffer_until_a_consumer_samples():
    rb = _blocking(4, batch_size=2, data=torch.arange(4))
    producer = _Producer(rb, torch.tensor([10, 11]), timeout=JOIN_S)
    producer.start()
    assert not producer.done.wait(0.2)  # still waiting: nothing of its batch is stored
    assert _stored(rb) == [0, 1, 2, 3] and len(rb) == 4
    drawn = rb.sample()  # consumes two items: their slots take the producer's batch
    index = producer.finish()
    assert producer.error is None
    assert sorted(index.tolist()) == sorted(
        i for i in range(4) if rb.storage[i].item() in (10, 11)
    )
    assert len(rb) == 4
    assert sorted(rb.sample(4).tolist() + drawn.tolist()) == [0, 1, 2, 3, 10, 11]


def test_add_waits_for_one_free_slot():
    rb = _blocking(2, batch_size=1, data=torch.arange(2))
    producer = _Producer(rb, torch.tensor(7), method="add", timeout=JOIN_S)
    producer.start()
    assert not producer.done.wait(0.2)
    first = rb.sample()
    producer.finish()
    assert producer.error is None
    assert sorted(first.tolist() + rb.sample(2).tolist()) == [0, 1, 7]


def test_a_batch_is_admitted_whole_once_enough_slots_are_free():
    rb = _blocking(4, batch_size=1, data=torch.arange(4))
    producer = _Producer(rb, torch.tensor([10, 11, 12]), timeout=JOIN_S)
    producer.start()
    rb.sample()
    rb.sample()  # two slots free, the batch needs three: nothing of it is written
    assert not producer.done.wait(0.2)
    assert len(rb) == 2 and not {10, 11, 12} & set(_stored(rb))
    rb.sample()
    producer.finish()
    assert producer.error is None
    assert len(rb) == 4 and {10, 11, 12} <= set(_stored(rb))


def test_every_item_written_is_consumed_exactly_once_with_two_producers():
    """Two producers and one consumer over 5 slots: no item is overwritten before it was drawn."""
    rb = _blocking(5, batch_size=2)
    batches = [torch.arange(start, start + 3) for start in range(0, 60, 3)]
    producers = [
        threading.Thread(target=lambda part=part: [rb.extend(b, timeout=JOIN_S) for b in part], daemon=True)
        for part in (batches[0::2], batches[1::2])
    ]
    for p in producers:
        p.start()
    drawn: list[int] = []
    while len(drawn) < 60:
        drawn += rb.sample(wait=True, timeout=JOIN_S).tolist()
    for p in producers:
        p.join(JOIN_S)
        assert not p.is_alive()
    assert sorted(drawn) == list(range(60))
    assert len(rb) == 0


def test_items_drawn_fewer_times_than_the_count_keep_their_slot():
    rb = _blocking(2, batch_size=2, consume_after_n_samples=2, data=torch.arange(2))
    rb.sample()  # one draw each: not consumed yet
    with pytest.raises(TimeoutError):
        rb.extend(torch.tensor([5]), timeout=0.05)
    rb.sample()  # the second draw consumes both
    assert rb.extend(torch.tensor([5, 6]), timeout=JOIN_S).numel() == 2


def test_writing_into_free_slots_does_not_wait():
    rb = _blocking(4, batch_size=2, data=torch.arange(2))
    assert rb.extend(torch.arange(2, 4), timeout=0).numel() == 2  # the storage had two empty rows
    assert len(rb) == 4


# -- timeouts, cancellation, shutdown ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["extend", "add"])
def test_a_write_that_finds_no_room_in_time_raises_and_writes_nothing(method):
    rb = _blocking(3, batch_size=1, data=torch.arange(3))
    data = torch.tensor([9]) if method == "extend" else torch.tensor(9)
    with pytest.raises(TimeoutError, match="Replay buffer did not obtain write capacity within 0.05 seconds."):
        getattr(rb, method)(data, timeout=0.05)
    assert _stored(rb) == [0, 1, 2] and len(rb) == 3
    rb.sample()
    assert torch.as_tensor(getattr(rb, method)(data, timeout=0)).numel() == 1  # the refused write left no reservation behind


def test_setting_the_cancel_event_ends_the_wait_and_writes_nothing():
    rb = _blocking(2, data=torch.arange(2))
    cancel = threading.Event()
    producer = _Producer(rb, torch.tensor([5]), timeout=JOIN_S, cancel_event=cancel)
    producer.start()
    assert not producer.done.wait(0.2)
    cancel.set()
    producer.finish()
    assert isinstance(producer.error, RuntimeError)
    assert "Replay-buffer writing was cancelled." in str(producer.error)
    assert _stored(rb) == [0, 1]


def test_a_cancel_event_already_set_refuses_even_a_write_that_fits():
    rb = _blocking(4)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RuntimeError, match="Replay-buffer writing was cancelled."):
        rb.extend(torch.arange(2), cancel_event=cancel)
    assert len(rb) == 0


def test_shutdown_ends_a_waiting_write():
    rb = _blocking(2, data=torch.arange(2))
    producer = _Producer(rb, torch.tensor([5]), timeout=JOIN_S)
    producer.start()
    assert not producer.done.wait(0.2)
    rb.shutdown()
    producer.finish()
    assert isinstance(producer.error, RuntimeError) and "shut down" in str(producer.error)
    with pytest.raises(RuntimeError, match="shut down"):
        rb.extend(torch.tensor([6]))


def test_a_batch_larger_than_the_storage_is_refused_at_once():
    rb = _blocking(4)
    with pytest.raises(ValueError, match="got 5 items and the storage holds 4"):
        rb.extend(torch.arange(5))
    assert len(rb) == 0 and len(rb.storage) == 0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"timeout": -1.0}, ValueError),
        ({"timeout": float("nan")}, ValueError),
        ({"timeout": "1"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"cancel_event": object()}, TypeError),
        ({"update_priority": torch.ones(1)}, NotImplementedError),
    ],
)
def test_bad_write_keywords_are_refused_before_anything_is_written(kwargs, error):
    rb = _blocking(4)
    with pytest.raises(error):
        rb.extend(torch.arange(1), **kwargs)
    assert len(rb) == 0


# -- construction -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sampler": RandomSampler()}, "does not support `sampler`"),
        ({"compilable": True}, "does not support `compilable`"),
        ({"transform": Compose()}, "does not support `transform`"),
        ({"transform_factory": Compose}, "does not support `transform_factory`"),
        ({"service_backend": "ray"}, "does not support `service_backend`"),
        ({"use_ray_service": True}, "does not support `service_backend`"),
        ({"rate_limiter": SampleToInsertRatio(1.0, 1, 4.0)}, "does not support `rate_limiter`"),
        ({"delayed_init": True}, "does not support `delayed_init`"),
        ({"consume_after_n_samples": None}, "does not support `consume_after_n_samples`"),
        ({"storage": ListStorage()}, "finite int max_size"),
        ({"prefetch": 2, "batch_size": 2}, "Prefetching is not supported"),
        ({"storage": LazyTensorStorage(8, ndim=2)}, "1-dimensional storages"),
    ],
)
def test_what_the_buffer_cannot_honour_is_refused_at_construction(kwargs, match):
    kwargs.setdefault("storage", LazyTensorStorage(4))
    with pytest.raises(ValueError, match=match):
        BlockingReplayBuffer(**kwargs)


@pytest.mark.parametrize("count", [0, -1])
def test_a_consumption_count_below_one_is_refused(count):
    with pytest.raises(ValueError, match="consume_after_n_samples"):
        BlockingReplayBuffer(consume_after_n_samples=count)


def test_a_storage_factory_is_checked_once_built():
    rb = BlockingReplayBuffer(storage=functools.partial(LazyTensorStorage, 3), batch_size=1)
    rb.extend(torch.arange(3))
    with pytest.raises(TimeoutError):
        rb.extend(torch.arange(1), timeout=0)
    with pytest.raises(ValueError, match="finite int max_size"):
        BlockingReplayBuffer(storage=ListStorage)


def test_the_default_storage_is_a_bounded_list():
    rb = BlockingReplayBuffer(batch_size=2)
    assert rb.storage.max_size == 1000 and isinstance(rb.storage, ListStorage)
    rb.extend([{"a": 1}, {"a": 2}])
    assert len(rb) == 2


# -- processes sharing the buffer -------------------------------------------------------------------------------
def _produce(rb, n: int, batch: int) -> None:
    """Child: writes ``0 .. n - 1`` in batches, each write waiting for the parent's draws."""
    for start in range(0, n, batch):
        rb.extend(torch.arange(start, min(start + batch, n)), timeout=60.0)


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_producer_process_waits_for_the_draws_of_the_consumer_process(method):
    rb = BlockingReplayBuffer(storage=LazyTensorStorage(4, shared_init=True), batch_size=2, shared=True)
    child = mp.get_context(method).Process(target=_produce, args=(rb, 24, 3))
    child.start()
    drawn: list[int] = []
    try:
        while len(drawn) < 24:
            drawn += rb.sample(wait=True, timeout=60.0).tolist()
    finally:
        child.join(60.0)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert sorted(drawn) == list(range(24))  # nothing overwritten before it was drawn, nothing drawn twice


# -- state ------------------------------------------------------------------------------------------------------
def test_a_checkpoint_round_trip_keeps_what_is_consumed(tmp_path):
    rb = _blocking(4, batch_size=2, data=torch.arange(4))
    rb.sample()  # two slots free
    rb.dumps(tmp_path / "rb")
    loaded = _blocking(4, batch_size=2)
    loaded.loads(tmp_path / "rb")
    assert len(loaded) == 2
    assert loaded.extend(torch.tensor([7, 8]), timeout=0).numel() == 2  # the two consumed slots
    with pytest.raises(TimeoutError):
        loaded.extend(torch.tensor([9]), timeout=0)
