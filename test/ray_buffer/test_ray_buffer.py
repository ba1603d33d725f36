"""RayReplayBuffer on a real local Ray cluster: writers and samplers in Ray tasks, prioritized updates through
clients, ``as_dataset`` through spawn workers, dumps/loads through the actor, a killed actor, lifecycle, and
TorchRL's forwarding methods (components, generator and hooks sent to the actor, conditional updates, shutdown).

One local cluster (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off: nothing leaves the
machine) serves the whole module. Ray tasks are started with ``num_cpus=0`` so that they never wait behind the
buffer's actor for a CPU. Every test has a timeout; DataLoaders have one too.
"""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import functools
import inspect
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    RayReplayBuffer,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    tensordict_collate,
)
from torchrl.data.replay_buffers._ray.dataset import RayReplayBufferDataset
from torchrl.data.replay_buffers.ray_buffer import RayReplayBufferClient
from torchrl.envs.transforms import Resize

ray = require("ray")
# Ray's workers cannot import this test module: its functions (Ray tasks, transforms) travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.extras, pytest.mark.multiprocess]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def shared_rb(cluster):
    """One TensorDict buffer (batch size 4) for the tests that only need some buffer: each empties it first.
    Actors are the slow part of these tests (each is a new process that imports torch)."""
    rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 100), batch_size=4,
                         replay_buffer_cls=TensorDictReplayBuffer)
    yield rb
    rb.close()


@pytest.fixture
def make_rb():
    """Builds RayReplayBuffers and closes them at the end of the test, whatever happens."""
    made = []

    def make(**kwargs):
        rb = RayReplayBuffer(**kwargs)
        made.append(rb)
        return rb

    yield make
    for rb in made:
        rb.close()


def td(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(obs=ids, value=ids.float() + 0.5, batch_size=[n])


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


# -- installation and arguments (no actor) ----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_importing_torchrl_data_does_not_import_ray():
    out = run_python("""
        import sys, torchrl.data
        assert torchrl.data.RayReplayBuffer is not None
        print("ray" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.timeout(120)
def test_ray_missing_raises_import_error_naming_the_ray_extra():
    out = run_python("""
        import functools, sys
        sys.modules["ray"] = None  # what an environment without Ray looks like to `import ray`
        from torchrl.data import LazyTensorStorage, RayReplayBuffer
        try:
            RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 10))
        except ImportError as err:
            print(err)
    """)
    assert out.returncode == 0, out.stderr
    assert "torchrl[ray]" in out.stdout and "`ray` extra" in out.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"storage": LazyTensorStorage(10)}, r"`storage`.*needs a constructor, got a LazyTensorStorage instance"),
        ({"sampler": RandomSampler()}, r"`sampler`.*RandomSampler instance.*two places"),
        ({"transform": Resize(8)}, r"`transform`.*Resize instance"),
        ({"storage": LazyTensorStorage}, r"`storage`.*called with no arguments.*functools.partial"),
        ({"writer": 3}, r"`writer`.*needs a constructor.*got 3"),
        ({"replay_buffer_cls": dict}, r"`replay_buffer_cls` must be a ReplayBuffer class"),
        ({"ray_init_config": "local"}, r"`ray_init_config` must be a dict"),
    ],
)
def test_bad_arguments_raise_type_errors_naming_them(kwargs, match):
    with pytest.raises(TypeError, match=match):
        RayReplayBuffer(**kwargs)


def test_the_dataset_needs_a_client():
    with pytest.raises(TypeError, match=r"`client` must be a RayReplayBufferClient \(rb.client\(\)\), got list"):
        RayReplayBufferDataset([])


def test_bad_transport_is_refused():
    with pytest.raises(ValueError, match="`transport` must be 'auto' or 'ray', got 'tcp'"):
        RayReplayBuffer(transport="tcp")
    with pytest.raises(NotImplementedError, match="transport='ray'"):
        RayReplayBuffer(transport="distributed")


# -- the buffer in its actor -------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_buffer_constructor_error_is_raised_as_the_buffer_raises_it():
    with pytest.raises(ValueError, match="`max_size` must be a positive int, got -1"):
        RayReplayBuffer(storage=functools.partial(LazyTensorStorage, -1))


@pytest.mark.timeout(60)
def test_forwarded_methods_and_properties(shared_rb):
    rb = shared_rb
    rb.empty()
    assert torch.equal(rb.extend(td(0, 10)), torch.arange(10))
    assert rb.add(td(10, 1)[0]) == 10
    assert len(rb) == 11 and rb.write_count == 11 and rb.batch_size == 4 and rb.dim_extend == 0
    batch = rb.sample()
    assert batch.batch_size == (4,) and torch.equal(batch["obs"], batch["index"])
    assert rb.sample(7).batch_size == (7,)
    assert torch.equal(rb[2:5]["obs"], torch.arange(2, 5))
    assert rb.append_transform(lambda x: x.set("double", x["obs"] * 2)) is rb  # returns the handle, not a copy
    batch = rb.sample()
    assert torch.equal(batch["double"], batch["obs"] * 2)
    assert rb.stats()["size"] == 11  # any public method of the buffer is forwarded
    assert type(rb.sampler).__name__ == "RandomSampler"  # and any property, read by value
    with pytest.raises(AttributeError, match=r"TensorDictReplayBuffer hosted by Ray actor .* no attribute 'nope'"):
        getattr(rb, "nope")  # noqa: B009
    with pytest.raises(ValueError, match="batch_size"):  # the buffer's own errors arrive as they were raised
        rb.sample(-1)
    rb.empty()
    assert len(rb) == 0


@pytest.mark.timeout(90)
def test_writers_in_two_ray_tasks_and_a_sampler_in_a_third(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 200), sampler=SamplerWithoutReplacement,
                 batch_size=10, replay_buffer_cls=TensorDictReplayBuffer)

    @ray.remote(num_cpus=0)
    def write(client, start):
        for chunk in range(5):
            client.extend(td(start + 10 * chunk, 10))
        return client.write_count

    @ray.remote(num_cpus=0)
    def read_one_epoch(client, expected):
        deadline = time.monotonic() + 60
        while len(client) < expected:  # the writers run at the same time
            assert time.monotonic() < deadline, "the writers did not finish"
            time.sleep(0.05)
        return torch.cat([batch["obs"] for batch in client]).tolist()

    writer_a, writer_b, reader = rb.clients(3)
    reading = read_one_epoch.remote(reader, 100)
    counts = ray.get([write.remote(writer_a, 0), write.remote(writer_b, 50)], timeout=60)
    assert max(counts) == 100
    assert sorted(ray.get(reading, timeout=60)) == list(range(100))  # one epoch: every item exactly once


@pytest.mark.timeout(90)
def test_prioritized_sampling_follows_priorities_set_through_clients_and_the_dataset_loop(make_rb):
    rb = make_rb(alpha=1.0, beta=1.0, storage=functools.partial(LazyTensorStorage, 16), batch_size=32,
                 replay_buffer_cls=TensorDictPrioritizedReplayBuffer, transform_factory=pid_transform_factory())
    rb.extend(td(0, 16))

    @ray.remote(num_cpus=0)
    def learner(client, favourite):
        batch = client.sample()
        batch.set("td_error", (batch["index"] == favourite).float() * 1000.0)
        client.update_tensordict_priority(batch)  # TorchRL's learner loop, through a client
        client.update_priority(torch.arange(16), (torch.arange(16) == favourite).float() * 1000.0)
        return client.sample()["index"].tolist()

    indices = ray.get(learner.remote(rb.client(), 5), timeout=60)
    others = ray.get(learner.remote(rb.client(), 5), timeout=60)
    # every other item has priority 0 (plus the sampler's eps): item 5 is (almost) always drawn
    assert indices.count(5) + others.count(5) >= 0.9 * (len(indices) + len(others))
    weights = rb.sample()["priority_weight"]
    assert weights.shape == (32,)

    # as_dataset in the main process: the transform runs here, the priority updates go to the actor
    loader = DataLoader(rb.as_dataset(num_batches=3), batch_size=None, collate_fn=tensordict_collate)
    for batch in loader:
        assert (batch["pid"] == os.getpid()).all()
        batch.set("td_error", (batch["index"] == 3).float() * 1e4)
        rb.update_tensordict_priority(batch)  # the training loop's update
    rb.update_priority(torch.arange(16), (torch.arange(16) == 3).float() * 1e4)
    assert (rb.sample()["index"] == 3).float().mean() > 0.9


@pytest.mark.timeout(90)
def test_dumps_from_the_actor_loads_into_a_local_buffer(make_rb, tmp_path):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 40), sampler=SamplerWithoutReplacement,
                 batch_size=4, replay_buffer_cls=TensorDictReplayBuffer)
    rb.extend(td(0, 25))
    rb.sample()
    rb.dumps(tmp_path / "ckpt")  # written by the actor, pickle-free
    local = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=SamplerWithoutReplacement(), batch_size=4)
    local.loads(tmp_path / "ckpt")
    assert len(local) == 25 and local.write_count == 25
    assert torch.equal(local[:]["obs"], rb[:]["obs"]) and torch.equal(local[:]["value"], rb[:]["value"])
    # state_dict() comes back by value, and the actor loads its own checkpoint
    local_copy = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=SamplerWithoutReplacement(),
                                        batch_size=4)
    local_copy.load_state_dict(rb.state_dict())
    assert torch.equal(local_copy[:]["obs"], torch.arange(25))
    rb.empty()
    rb.loads(tmp_path / "ckpt")
    assert len(rb) == 25 and torch.equal(rb[:]["obs"], torch.arange(25))
    with pytest.raises(FileNotFoundError):  # a path the actor cannot read
        rb.loads(tmp_path / "missing")
    assert len(rb) == 25


# -- as_dataset -----------------------------------------------------------------------------------------------------
def pid_transform_factory():
    """A ``transform_factory`` whose transform stamps the pid of the process running it."""

    def factory():
        def stamp(batch):
            return batch.set("pid", torch.full(batch.shape, os.getpid()))

        return stamp

    return factory


@pytest.mark.timeout(150)
def test_as_dataset_two_spawn_workers_read_a_without_replacement_epoch_exactly_once(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 100), sampler=SamplerWithoutReplacement,
                 batch_size=6, replay_buffer_cls=TensorDictReplayBuffer, transform_factory=pid_transform_factory())
    rb.extend(td(0, 60))
    loader = DataLoader(rb.as_dataset(num_batches=10), batch_size=None, collate_fn=tensordict_collate,
                        num_workers=2, multiprocessing_context="spawn", timeout=120)
    batches = list(loader)
    assert len(batches) == 10
    assert sorted(torch.cat([b["obs"] for b in batches]).tolist()) == list(range(60))  # exactly once
    pids = {int(p) for b in batches for p in b["pid"].unique()}
    assert len(pids) == 2 and os.getpid() not in pids  # the transform ran in the two workers, not the actor
    assert rb.sample()["pid"].unique().numel() == 1  # rb.sample() still transforms in the actor


@pytest.mark.timeout(120)
def test_as_dataset_refuses_forked_workers(shared_rb):
    shared_rb.empty()
    shared_rb.extend(td(0, 20))
    loader = DataLoader(shared_rb.as_dataset(num_batches=2), batch_size=None, collate_fn=tensordict_collate,
                        num_workers=1, multiprocessing_context="fork", timeout=60)
    with pytest.raises(RuntimeError, match="forked.*multiprocessing_context='spawn'"):
        list(loader)


@pytest.mark.timeout(60)
def test_as_dataset_refuses_a_prefetching_buffer(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 20), batch_size=4, prefetch=2)
    with pytest.raises(ValueError, match="prefetch=None"):
        rb.as_dataset()


# -- lifecycle and failures -----------------------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_killed_actor_raises_an_error_naming_the_actor_instead_of_hanging(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 20), batch_size=4,
                 replay_buffer_cls=TensorDictReplayBuffer)
    rb.extend(td(0, 8))
    client = pickle.loads(pickle.dumps(rb.client()))
    ray.kill(ray.get_actor(rb.actor_name, namespace=rb.namespace), no_restart=True)
    deadline = time.monotonic() + 30
    while rb.is_alive:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for handle in (rb, client):
        with pytest.raises(RuntimeError, match=rf"actor '{rb.actor_name}'.*is dead.*dumps\(\).*new RayReplayBuffer"):
            handle.sample()
    late = pickle.loads(pickle.dumps(client))  # a client unpickled after the death cannot find the actor
    with pytest.raises(RuntimeError, match=rf"'{rb.actor_name}'.*is dead"):
        len(late)
    rb.close()  # closing a dead buffer is fine


@pytest.mark.timeout(60)
def test_clients_have_no_lifecycle_rights_and_a_closed_buffer_refuses_calls(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 20))
    with pytest.raises(ValueError, match=r"RayReplayBuffer\(..., batch_size=N\)"):
        rb.as_dataset()  # it yields batches of the buffer's batch size, and there is none
    client = pickle.loads(pickle.dumps(rb))  # a pickled owner travels as a client
    assert type(client) is RayReplayBufferClient and not hasattr(client, "close")
    with pytest.raises(ValueError, match="`num_clients` must be a non-negative int"):
        rb.clients(-1)
    rb.close()
    assert rb.closed and not rb.is_alive and ray.is_initialized()  # Ray was started by the fixture: left running
    with pytest.raises(RuntimeError, match="closed"):
        rb.sample()
    rb.close()


@pytest.mark.timeout(150)
def test_ray_is_started_and_shut_down_by_the_buffers_that_started_it():
    out = run_python("""
        import functools, ray
        from torchrl.data import LazyTensorStorage, RayReplayBuffer
        first = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 10),
                                ray_init_config={"num_cpus": 1, "log_to_driver": False}, remote_config={"num_cpus": 0})
        second = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 10), remote_config={"num_cpus": 0})
        first.close()
        print(ray.is_initialized())
        second.close()
        print(ray.is_initialized())
    """, timeout=140)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]



# -- the fast path of as_dataset: pipelining, several batches per call, numpy wire ------------------------------------
def test_wire_round_trip_keeps_every_batch_kind_and_dtype():
    from tensordict import LazyStackedTensorDict, NonTensorData

    from torchrl.data.replay_buffers._ray.wire import decode, encode

    nested = TensorDict(obs=torch.arange(6.0).reshape(3, 2), done=torch.tensor([True, False, True]),
                        half=torch.arange(3, dtype=torch.bfloat16),
                        sub=TensorDict(steps=torch.ones(3, 4, dtype=torch.uint8), batch_size=[3, 4]),
                        batch_size=[3])
    for batch in (nested, nested.clone().lock_(), torch.arange(5), torch.zeros(2, dtype=torch.float8_e4m3fn)):
        kind, _ = encoded = encode(batch)
        assert kind != "object"
        back = decode(pickle.loads(pickle.dumps(encoded, protocol=5)))
        if isinstance(batch, TensorDict):
            assert type(back) is TensorDict and back.batch_size == batch.batch_size
            assert back["sub"].batch_size == (3, 4) and back.is_locked == batch.is_locked
            assert back["half"].dtype == torch.bfloat16 and (back == batch).all()
        else:
            assert back.dtype == batch.dtype and torch.equal(back.view(torch.uint8), batch.view(torch.uint8))
    text = TensorDict(obs=torch.arange(2), batch_size=[2])
    text.set("name", NonTensorData("a", batch_size=[2]))
    lazy = LazyStackedTensorDict(TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(3)))
    grad = torch.ones(2, requires_grad=True)
    for other in (text, lazy, grad, [1, 2], None):  # what cannot travel as arrays travels as it is
        kind, payload = encode(other)
        assert kind == "object" and payload is other and decode((kind, payload)) is other


@pytest.mark.timeout(60)
def test_sample_travels_as_arrays_and_keeps_info(shared_rb):
    rb = shared_rb
    rb.empty()
    rb.extend(td(0, 10))
    batch, info = rb.sample(6, return_info=True)
    assert type(batch) is TensorDict and batch.batch_size == (6,)
    assert torch.equal(batch["obs"], info["index"]) and torch.equal(batch["value"], batch["obs"] + 0.5)
    pending = [rb.request_raw(3, 2), rb.request_raw(None, 1)]  # in flight together, answered in order
    batches = [b for p in pending for b in p.result()]
    assert [b.batch_size for b in batches] == [(3,), (3,), (4,)]
    assert all(torch.equal(b["value"], b["obs"] + 0.5) for b in batches)
    with pytest.raises(ValueError, match="`count` must be a positive int, got 0"):
        rb.request_raw(3, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"prefetch": -1}, ValueError, r"`prefetch` must be a non-negative int, got -1"),
        ({"prefetch": 1.5}, TypeError, r"`prefetch` must be a non-negative int, got 1.5"),
        ({"batches_per_call": 0}, ValueError, r"`batches_per_call` must be a positive int, got 0"),
    ],
)
def test_as_dataset_pipelining_arguments_are_checked(shared_rb, kwargs, error, match):
    with pytest.raises(error, match=match):
        shared_rb.as_dataset(**kwargs)


@pytest.mark.timeout(90)
def test_pipelining_never_requests_past_the_readers_share(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 100), sampler=SamplerWithoutReplacement,
                 batch_size=5, replay_buffer_cls=TensorDictReplayBuffer)
    rb.extend(td(0, 35))
    ds = rb.as_dataset(num_batches=7, prefetch=2, batches_per_call=3)
    source = ds.replay_buffer
    seen, in_flight = [], []
    for batch in ds:  # in this process: 7 draws
        seen.append(batch["obs"])
        in_flight.append(source.in_flight)
    assert sorted(torch.cat(seen).tolist()) == list(range(35))  # one epoch, exactly once
    # never more requested than the draws left: 6 left after the first, ..., 0 after the last
    assert all(n <= 7 - i - 1 for i, n in enumerate(in_flight)) and in_flight[-1] == 0
    # the actor drew exactly 7 batches: the next 7 are exactly the next epoch
    assert sorted(torch.cat([rb.sample()["obs"] for _ in range(7)]).tolist()) == list(range(35))


@pytest.mark.timeout(150)
def test_pipelined_spawn_workers_read_a_without_replacement_epoch_exactly_once(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 100), sampler=SamplerWithoutReplacement,
                 batch_size=6, replay_buffer_cls=TensorDictReplayBuffer, transform_factory=pid_transform_factory())
    rb.extend(td(0, 66))
    # 11 batches: 6 and 5 per worker, each asked for 4 at a time with 3 more in flight
    loader = DataLoader(rb.as_dataset(num_batches=11, prefetch=3, batches_per_call=4), batch_size=None,
                        collate_fn=tensordict_collate, num_workers=2, multiprocessing_context="spawn", timeout=120)
    batches = list(loader)
    assert len(batches) == 11
    assert sorted(torch.cat([b["obs"] for b in batches]).tolist()) == list(range(66))  # exactly once
    assert len({int(p) for b in batches for p in b["pid"].unique()}) == 2
    # no batch was drawn ahead and dropped: the actor's next 11 batches are one whole epoch
    nxt = torch.cat([rb.sample()["obs"] for _ in range(11)])
    assert sorted(nxt.tolist()) == list(range(66))


class RawSamplingBuffer(TensorDictReplayBuffer):
    """A buffer class that samples without transforms itself (the seam ``BufferHost.sample_raw`` prefers)."""

    def sample_raw(self, batch_size=None):
        saved = self.transform.transforms
        batch = super().sample(batch_size)
        assert self.transform.transforms is saved  # nothing emptied for the other threads
        return batch.set("own_raw", torch.ones(batch.shape, dtype=torch.bool))


class NoRawBuffer(TensorDictReplayBuffer):
    """A buffer class without ``sample_raw`` (as a user's own buffer class may be)."""

    sample_raw = None


@pytest.mark.timeout(90)
def test_threaded_actor_needs_a_buffer_that_samples_raw_itself(make_rb):
    threaded = {"max_concurrency": 2, "num_cpus": 0}  # the module's cluster has 2 CPUs, shared_rb holds one
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 20), batch_size=4, remote_config=threaded,
                 replay_buffer_cls=NoRawBuffer)
    with pytest.raises(ValueError, match="max_concurrency=2: leave max_concurrency at 1"):
        rb.as_dataset()
    builtin = make_rb(storage=functools.partial(LazyTensorStorage, 20), batch_size=4, remote_config=threaded,
                      replay_buffer_cls=TensorDictReplayBuffer, transform_factory=pid_transform_factory())
    builtin.extend(td(0, 8))  # ReplayBuffer.sample_raw: a threaded actor is fine
    assert all((b["pid"] == os.getpid()).all() for b in builtin.as_dataset(num_batches=2, batches_per_call=2))
    own = make_rb(storage=functools.partial(LazyTensorStorage, 20), batch_size=4, remote_config=threaded,
                  replay_buffer_cls=RawSamplingBuffer, transform_factory=pid_transform_factory())
    own.extend(td(0, 8))
    batches = list(own.as_dataset(num_batches=3, batches_per_call=2))
    assert all(b["own_raw"].all() and (b["pid"] == os.getpid()).all() for b in batches)


@pytest.mark.timeout(60)
def test_a_failed_call_drops_the_calls_in_flight_and_the_next_iteration_recovers(shared_rb):
    rb = shared_rb
    rb.empty()
    ds = rb.as_dataset(num_batches=4, prefetch=2, batches_per_call=1)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        next(iter(ds))
    assert ds.replay_buffer.in_flight == 0  # the calls sent with the failed one are dropped, not raised later
    rb.extend(td(0, 10))
    assert [b.batch_size for b in ds] == [(4,)] * 4


@pytest.mark.timeout(90)
def test_an_actor_that_cannot_start_raises_naming_the_resources(monkeypatch):
    import torchrl.data.replay_buffers.ray_buffer as ray_buffer

    monkeypatch.setattr(ray_buffer, "ACTOR_START_TIMEOUT", 3.0)
    with pytest.raises(RuntimeError, match=r"did not start within 3 s.*remote_config=\{'num_cpus': 64"):
        RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 10), remote_config={"num_cpus": 64})


# -- TorchRL's forwarding methods ---------------------------------------------------------------------------------
NO_CPU = {"num_cpus": 0}  # these actors never wait for the module's other actors on the 2-CPU cluster
# The methods TorchRL's RayReplayBuffer forwards, with the hosted ReplayBuffer method's signature here; ``extend``
# takes ``*args, **kwargs`` (as in TorchRL) because the hosted classes' ``extend`` differ.
SAME_SIGNATURE = [
    "add", "sample", "update_priority", "append_transform", "insert_transform", "load", "loads", "dumps", "empty",
    "share", "set_storage", "set_writer", "set_sampler", "set_rng", "update_if_present", "register_save_hook",
    "register_load_hook", "shutdown", "mark_update", "can_sample", "state_dict", "load_state_dict",
]


class FixedKeywordsBuffer(ReplayBuffer):
    """A hosted class whose constructor takes no ``delayed_init``."""

    def __init__(self, *, batch_size=None):
        super().__init__(batch_size=batch_size)


class DoubleOnSave:
    """A save hook (see ReplayBuffer.register_save_hook): saves the items doubled, and records ``shift``."""

    shift = is_full = None

    def __call__(self, data, path=None):
        return data * 2


class LockedHook(DoubleOnSave):
    """A hook that holds a lock, which cannot be pickled for the actor."""

    def __init__(self):
        self.lock = threading.Lock()


def test_forwarding_methods_have_the_hosted_buffers_signatures():
    for name in SAME_SIGNATURE:
        ours, hosted = inspect.signature(getattr(RayReplayBuffer, name)), inspect.signature(getattr(ReplayBuffer, name))
        assert ours == hosted, (name, ours, hosted)
    extend = list(inspect.signature(RayReplayBuffer.extend).parameters.values())[1:]
    assert [p.kind for p in extend] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
    init = inspect.signature(RayReplayBuffer).parameters
    assert init["transport"].default == "auto" and init["transport_options"].default is None
    assert init["delayed_init"].default is False
    assert list(inspect.signature(RayReplayBuffer.clients).parameters) == ["self", "num_clients"]
    assert RayReplayBuffer.hosted_class is ReplayBuffer  # the class whose signatures these are


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"transport": "gloo"}, NotImplementedError,
         r"transport='gloo'\): TorchRL's transport='distributed'.*gloo or NCCL.*Pass transport='ray' or 'auto'.*"
         r"shared=True"),
        ({"transport": "distributed"}, NotImplementedError, r"transport='distributed'.*not implemented here"),
        ({"transport_options": {"backend": "gloo"}}, ValueError,
         r"`transport_options`=\{'backend': 'gloo'\} configure TorchRL's transport='distributed'.*Leave"),
        ({"transport_options": "gloo"}, TypeError, r"`transport_options` must be a dict or None, got 'gloo'"),
        ({"delayed_init": "yes"}, TypeError, r"`delayed_init` must be a bool, got 'yes'"),
        ({"delayed_init": True, "replay_buffer_cls": FixedKeywordsBuffer}, TypeError,
         r"delayed_init=True\) passes `delayed_init` to replay_buffer_cls, and FixedKeywordsBuffer does not take it"),
    ],
)
def test_transport_and_delayed_init_are_checked_before_any_actor_starts(kwargs, error, match):
    before = ray.util.list_named_actors(all_namespaces=True)
    with pytest.raises(error, match=match):
        RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 10), **kwargs)
    assert ray.util.list_named_actors(all_namespaces=True) == before


@pytest.mark.timeout(120)
def test_components_and_generator_sent_with_the_set_methods_are_copies_the_actor_uses(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 8), batch_size=4, remote_config=NO_CPU,
                 transform_factory=lambda: (lambda x: x))  # fmt: skip
    assert rb.initialized  # delayed_init=False (the default) builds the hosted buffer when the actor starts
    rb.extend(torch.arange(8))
    new_storage = LazyTensorStorage(20)
    previous = rb.set_storage(new_storage)
    assert type(previous) is LazyTensorStorage and len(previous) == 8  # the actor's previous storage, copied back
    rb.extend(data=torch.arange(100, 110))  # the hosted extend's keywords travel too
    assert len(rb) == 10 and len(new_storage) == 0  # the actor writes into its copy, not into the object passed

    generator = torch.Generator().manual_seed(7)
    state = generator.get_state()
    rb.set_rng(generator)
    first = rb.sample()
    rb.set_rng(generator)
    assert torch.equal(rb.sample(), first)  # the actor drew twice from a copy of the same state
    assert torch.equal(generator.get_state(), state)  # and this generator did not advance
    with pytest.raises(TypeError, match="`generator` must be a torch.Generator or None, got int"):
        rb.set_rng(7)

    assert type(rb.set_sampler(SamplerWithoutReplacement())) is RandomSampler
    assert sorted(torch.cat(list(rb)).tolist()) == list(range(100, 110))  # one epoch of the new sampler
    assert isinstance(rb.set_writer(RoundRobinWriter()), RoundRobinWriter)
    rb.extend(torch.tensor([-1]))  # the new writer starts at its own cursor: row 0
    assert rb[0].item() == -1 and len(rb) == 10


@pytest.mark.timeout(120)
def test_a_save_hook_runs_in_the_actor_as_a_copy_and_unpicklable_hooks_are_refused(make_rb, tmp_path):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 10), remote_config=NO_CPU, delayed_init=None,
                 transform_factory=lambda: (lambda x: x))  # fmt: skip
    assert not rb.initialized  # delayed_init=None: the hosted class's default (delayed with a transform_factory)
    rb.extend(torch.arange(5))
    hook = DoubleOnSave()
    rb.register_save_hook(hook)
    rb.dumps(tmp_path / "ckpt")
    local = ReplayBuffer(storage=LazyTensorStorage(10))
    local.load(tmp_path / "ckpt")
    assert local[:].tolist() == [0, 2, 4, 6, 8] and rb[:].tolist() == [0, 1, 2, 3, 4]
    assert hook.shift is None  # the actor set `shift` on its copy of the hook
    with pytest.raises(TypeError, match=r"register_save_hook\(\) sends `hook` to the Ray actor.*by pickling it, "
                                        r"and this LockedHook cannot be pickled"):
        rb.register_save_hook(LockedHook())
    with pytest.raises(TypeError, match="A save hook must be a callable"):
        rb.register_save_hook("double")
    with pytest.raises(NotImplementedError, match=r"register_load_hook\(.*\) is not supported"):
        rb.register_load_hook(hook)  # the hosted storage's checkpointer refuses hooks, as a local one does
    assert rb.stats()["size"] == 5


@pytest.mark.timeout(120)
def test_conditional_updates_share_delayed_init_and_shutdown_through_the_actor(make_rb):
    rb = make_rb(storage=functools.partial(LazyTensorStorage, 4), replay_buffer_cls=TensorDictReplayBuffer,
                 writer=functools.partial(TensorDictRoundRobinWriter, track_generations=True), batch_size=2,
                 delayed_init=True, remote_config=NO_CPU)  # fmt: skip
    assert rb.hosted_class is TensorDictReplayBuffer and rb.client().hosted_class is TensorDictReplayBuffer
    assert not rb.initialized  # built by the first write, in the actor
    index = rb.extend(tensordicts=TensorDict(obs=torch.zeros(3), batch_size=[3]))
    assert rb.initialized
    generation = rb.writer.generations_of(index)
    rb.extend(TensorDict(obs=torch.full((2,), 5.0), batch_size=[2]))  # rows 3 and 0: row 0 is overwritten
    result = rb.update_if_present(index=index, generation=generation, patch={"obs": torch.ones(3)})
    assert result.updated.tolist() == [False, True, True]
    assert rb[:]["obs"].tolist() == [5.0, 1.0, 1.0, 5.0]

    assert rb.share() is rb and len(rb) == 4  # the hosted buffer's share(), in the actor
    with pytest.raises(TypeError, match="`shared` must be a bool, got 'yes'"):
        rb.share("yes")
    with pytest.raises(ValueError, match="`timeout` must be None or a non-negative number of seconds, got -1"):
        rb.shutdown(timeout=-1)
    assert rb.is_alive  # a refused shutdown stops nothing
    client, other = rb.clients(num_clients=2)
    for name in ("shutdown", "close"):  # lifecycle rights stay with the owner
        assert not hasattr(client, name)
    rb.shutdown(timeout=30)
    assert rb.closed and not rb.is_alive
    rb.shutdown(timeout=30)  # a second call does nothing
    with pytest.raises(RuntimeError, match=rf"actor '{rb.actor_name}'.*is dead"):
        other.sample()
