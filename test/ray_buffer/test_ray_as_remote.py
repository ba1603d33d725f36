"""TorchRL's ``ReplayBuffer.as_remote(remote_config)``: the buffer class as a Ray actor class, on a real local Ray
cluster (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off: nothing leaves the machine)."""

from __future__ import annotations

import inspect
import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers import ray_buffer

ray = require("ray")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_as_remote_is_torchrl_s_module_level_classmethod_on_every_buffer_class():
    assert isinstance(ray_buffer.as_remote, classmethod)
    assert ReplayBuffer.__dict__["as_remote"] is ray_buffer.as_remote
    assert TensorDictReplayBuffer.as_remote.__func__ is ray_buffer.as_remote.__func__


@pytest.mark.timeout(180)
def test_a_buffer_built_from_the_actor_class_runs_in_the_actor():
    signatures = {name: inspect.signature(getattr(TensorDictReplayBuffer, name)) for name in ("extend", "sample")}
    remote_cls = TensorDictReplayBuffer.as_remote({"num_cpus": 1})
    assert remote_cls.is_remote is True
    # Ray adds a tracing keyword to the methods of the class it wraps: the buffer class itself keeps its own
    assert {name: inspect.signature(getattr(TensorDictReplayBuffer, name)) for name in signatures} == signatures
    handle = remote_cls.remote(storage=LazyTensorStorage(10), batch_size=4)
    try:
        ray.get(handle.extend.remote(TensorDict(obs=torch.arange(6), batch_size=[6])), timeout=120)
        assert ray.get(handle.__len__.remote(), timeout=60) == 6
        batch = ray.get(handle.sample.remote(), timeout=60)
        assert batch["obs"].shape == (4,) and set(batch["obs"].tolist()) <= set(range(6))
    finally:
        ray.kill(handle)


def test_the_default_actor_options_are_torchrl_s():
    config = ray_buffer.default_remote_class_config()
    assert config == {"num_cpus": 1, "num_gpus": 0.2 if torch.cuda.is_available() else None,
                      "memory": 2 * 1024**3}


def test_remote_config_must_be_a_dict():
    with pytest.raises(TypeError, match=r"`remote_config` must be a dict of Ray actor options .* got \[1\]"):
        ReplayBuffer.as_remote([1])
