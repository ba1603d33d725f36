"""``ReplayBuffer(..., service_backend=...)``: TorchRL's service keywords on every buffer class.

``service_backend="direct"`` (the default) builds the class in this process, with TorchRL's transport rules;
``"ray"`` returns a :class:`~torchrl.data.RayReplayBuffer` hosting the class, which passes ``isinstance`` checks
for it (and its clients too). The argument checks run without Ray; the round trips use one local cluster for the
module (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off: nothing leaves the machine), with
actors that reserve no CPU so that none waits for another.
"""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import functools
import inspect
import pickle
import warnings

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict
from torch.utils.data import IterableDataset

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    RandomSampler,
    RayReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.ray_buffer import RayReplayBufferClient
from torchrl.data.replay_buffers.replay_buffers import _service_backend

STORAGE = functools.partial(LazyTensorStorage, 100)
CLASSES = {
    ReplayBuffer: {},
    TensorDictReplayBuffer: {},
    PrioritizedReplayBuffer: {"alpha": 0.7, "beta": 0.5},
    TensorDictPrioritizedReplayBuffer: {"alpha": 0.7, "beta": 0.5},
}


# -- the direct backend and the argument checks (no Ray) -----------------------------------------------------
@pytest.mark.parametrize("cls", list(CLASSES), ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("transport", ["auto", "direct"])
def test_direct_backend_builds_the_class_in_this_process(cls, transport):
    rb = cls(**CLASSES[cls], storage=LazyTensorStorage(10), batch_size=2, service_backend="direct",
             service_backend_options=None, transport=transport, transport_options=None)
    assert type(rb) is cls
    assert rb.service_backend == "direct" and rb.is_alive
    assert rb.client() is rb and rb.start() is rb
    rb.extend(TensorDict(obs=torch.arange(4), batch_size=[4]) if issubclass(cls, TensorDictReplayBuffer)
              else torch.arange(4))
    assert len(rb) == 4


@pytest.mark.parametrize("value", ["grpc", "Ray", "", 3])
def test_unknown_service_backend_is_refused_naming_the_value_and_the_choices(value):
    with pytest.raises(ValueError, match=rf"`service_backend` must be one of 'direct', 'ray', got {value!r}"):
        TensorDictReplayBuffer(service_backend=value)


def test_a_known_backend_that_is_not_registered_names_the_module_to_import(monkeypatch):
    monkeypatch.delitem(_service_backend._FACTORIES, "ray")
    with pytest.raises(ValueError, match=r"'ray' is implemented by torchrl.data.replay_buffers.ray_buffer"):
        ReplayBuffer(service_backend="ray")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"transport": "ray"}, r"`transport`='ray' is a transport to a service.*transport='auto' or 'direct'"),
        ({"transport": "distributed"}, r"`transport`='distributed'.*service_backend='ray'"),
        ({"transport_options": {"backend": "gloo"}}, r"`transport_options`=\{'backend': 'gloo'\}.*leave"),
        ({"service_backend_options": {"remote_config": {}}}, r"`service_backend_options`=.*service_backend='ray'"),
    ],
)
def test_direct_backend_refuses_service_transports_and_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayBuffer(**kwargs)
    with pytest.raises(ValueError, match=match.replace("ReplayBuffer", "TensorDictReplayBuffer")):
        TensorDictReplayBuffer(service_backend="direct", **kwargs)


def test_use_ray_service_is_deprecated_and_checked():
    with pytest.warns(DeprecationWarning, match=r"`use_ray_service` is deprecated.*service_backend='direct'"):
        rb = ReplayBuffer(use_ray_service=False)
    assert type(rb) is ReplayBuffer
    with pytest.raises(ValueError, match=r"`use_ray_service`=True contradicts `service_backend`='direct'"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ReplayBuffer(use_ray_service=True, service_backend="direct")
    with pytest.raises(TypeError, match=r"`use_ray_service` must be a bool, got 'yes'"):
        ReplayBuffer(use_ray_service="yes")


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer], ids=lambda cls: cls.__name__)
@pytest.mark.parametrize(
    "component, match",
    [
        ({"storage": LazyTensorStorage(100)}, r"`storage`.*needs a constructor, got a LazyTensorStorage instance"),
        ({"sampler": RandomSampler()}, r"`sampler`.*needs a constructor, got a RandomSampler instance"),
    ],
)
def test_ray_backend_refuses_component_instances_naming_service_backend(cls, component, match):
    with pytest.raises(TypeError, match=rf'{cls.__name__}\(\.\.\., service_backend="ray"\) builds the buffer in a '
                                        rf"Ray actor.*{match}.*functools.partial"):
        cls(service_backend="ray", **component)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"service_backend_options": {"batch_size": 4}}, TypeError,
         r"`service_backend_options` of service_backend='ray' take 'ray_init_config', 'remote_config', "
         r"'transport'; got 'batch_size'"),
        ({"service_backend_options": "local"}, TypeError, r"`service_backend_options` must be a dict.*'local'"),
        ({"transport_options": {"backend": "gloo"}}, ValueError, r"`transport_options`=.*not implemented here"),
        ({"transport": "ray", "service_backend_options": {"transport": "auto"}}, ValueError,
         r"`transport`='ray' contradicts service_backend_options\['transport'\]='auto'"),
        ({"remote_config": {}, "service_backend_options": {"remote_config": {}}}, TypeError,
         r"'remote_config' passed both to the buffer and in `service_backend_options`"),
    ],
)
def test_ray_backend_checks_its_options_before_starting_anything(kwargs, error, match):
    with pytest.raises(error, match=match):
        ReplayBuffer(storage=STORAGE, service_backend="ray", **kwargs)


def test_isinstance_answers_for_the_hosted_class_and_issubclass_is_unchanged():
    client = RayReplayBufferClient("some-actor", None, None, service_cls=TensorDictReplayBuffer)
    for handle in (client, pickle.loads(pickle.dumps(client))):
        assert isinstance(handle, ReplayBuffer) and isinstance(handle, TensorDictReplayBuffer)
        assert not isinstance(handle, PrioritizedReplayBuffer)
        assert not isinstance(handle, TensorDictPrioritizedReplayBuffer)
        assert handle.service_backend == "ray" and handle.transport_kind == "ray"
    assert not isinstance(RayReplayBufferClient("some-actor", None, None), ReplayBuffer)  # hosts nothing known
    assert not issubclass(RayReplayBuffer, ReplayBuffer) and not issubclass(RayReplayBufferClient, ReplayBuffer)
    assert issubclass(TensorDictPrioritizedReplayBuffer, ReplayBuffer)
    assert not isinstance(ReplayBuffer(), TensorDictReplayBuffer)
    assert isinstance(TensorDictReplayBuffer(), ReplayBuffer)
    assert not isinstance(object(), ReplayBuffer) and not isinstance(TensorDict(), ReplayBuffer)


def test_code_that_needs_a_buffer_in_this_process_still_refuses_a_ray_client():
    """An ensemble reads its members' components, and TorchRLBufferDataset samples in the reading process: a
    client passes ``isinstance`` but holds none of them, so both keep refusing it."""
    from torchrl.data import ReplayBufferEnsemble
    from torchrl.modules.llm import TorchRLBufferDataset

    client = RayReplayBufferClient("some-actor", None, None, service_cls=TensorDictReplayBuffer)
    assert isinstance(client, ReplayBuffer)
    with pytest.raises(TypeError, match="Member 0 .*ReplayBuffer.*RayReplayBufferClient"):
        ReplayBufferEnsemble(client)
    with pytest.raises(TypeError, match="in this process.*RayReplayBufferClient.*as_dataset"):
        TorchRLBufferDataset(client, 4)


def test_signatures_show_the_service_keywords():
    for cls in CLASSES:
        params = inspect.signature(cls).parameters
        assert params["service_backend"].default == "direct"
        assert params["service_backend_options"].default is None
        assert params["transport"].default == "auto"
        assert params["transport_options"].default is None
        assert all(params[name].kind is inspect.Parameter.KEYWORD_ONLY for name in ("service_backend", "transport"))
    assert list(inspect.signature(PrioritizedReplayBuffer).parameters)[:2] == ["alpha", "beta"]


def test_buffers_still_mix_with_abcs_and_pickle():
    class IterableBuffer(ReplayBuffer, IterableDataset):  # IterableDataset's metaclass is ABCMeta
        pass

    rb = IterableBuffer(storage=LazyTensorStorage(10))
    rb.extend(torch.arange(3))
    copy = pickle.loads(pickle.dumps(TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)))
    assert type(copy) is TensorDictReplayBuffer and len(rb) == 3


# -- the Ray backend on a local cluster ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray():
    ray = require("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


NO_CPU = {"remote_config": {"num_cpus": 0}}  # actors never wait for each other on this small cluster


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_replay_buffer_with_ray_backend_is_a_ray_buffer_hosting_it(ray):
    rb = ReplayBuffer(storage=STORAGE, batch_size=4, service_backend="ray",
                      service_backend_options={"remote_config": {"num_cpus": 0, "name": "service-rb"}})
    try:
        assert type(rb) is RayReplayBuffer and rb.actor_name == "service-rb"
        assert isinstance(rb, ReplayBuffer) and not isinstance(rb, TensorDictReplayBuffer)
        assert rb.service_backend == "ray" and rb.start() is rb and rb.is_alive
        rb.extend(torch.arange(10))
        assert len(rb) == 10
        batch = rb.sample()
        assert batch.shape == (4,) and set(batch.tolist()) <= set(range(10))
        client = pickle.loads(pickle.dumps(rb))
        assert type(client) is RayReplayBufferClient and isinstance(client, ReplayBuffer)
        client.extend(torch.arange(10, 15))
        assert len(rb) == 15 and sorted(rb[:].tolist()) == list(range(15))
    finally:
        rb.close()
    assert not rb.is_alive


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_tensordict_buffer_with_ray_backend_reads_one_epoch_through_the_actor(ray):
    rb = TensorDictReplayBuffer(storage=STORAGE, sampler=SamplerWithoutReplacement, batch_size=5,
                                service_backend="ray", service_backend_options=NO_CPU, transport="ray")
    try:
        assert isinstance(rb, TensorDictReplayBuffer) and isinstance(rb, ReplayBuffer)
        assert not isinstance(rb, TensorDictPrioritizedReplayBuffer) and not isinstance(rb, PrioritizedReplayBuffer)
        client = pickle.loads(pickle.dumps(rb.client()))
        assert isinstance(client, TensorDictReplayBuffer)
        client.extend(TensorDict(obs=torch.arange(20), batch_size=[20]))
        batches = list(rb)
        assert len(batches) == 4 and all("index" in batch.keys() for batch in batches)
        assert sorted(torch.cat([batch["obs"] for batch in batches]).tolist()) == list(range(20))
    finally:
        rb.close()


@pytest.mark.extras
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_use_ray_service_hosts_a_prioritized_buffer_with_its_own_keywords(ray):
    with pytest.warns(DeprecationWarning, match=r"service_backend='ray'"):
        rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=STORAGE, batch_size=8,
                                               use_ray_service=True, service_backend_options=NO_CPU)
    try:
        assert type(rb) is RayReplayBuffer
        assert isinstance(rb, TensorDictPrioritizedReplayBuffer) and isinstance(rb, TensorDictReplayBuffer)
        assert not isinstance(rb, PrioritizedReplayBuffer)
        rb.extend(TensorDict(obs=torch.arange(8), batch_size=[8]))
        rb.update_priority(torch.arange(8), (torch.arange(8) == 3).float() * 100)
        batch = rb.sample()
        assert bool((batch["obs"] == 3).all()) and "priority_weight" in batch.keys()
    finally:
        rb.close()
