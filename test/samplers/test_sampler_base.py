"""What every sampler promises (``samplers/base.py``): the values it derives from the storage content (trajectory
boundaries, weights, groups, listed in ``_derived_state``) are forgotten at every write notification, on
``_empty()`` and in a pickled copy, so that no sampler reads a stale cache after the storage changed."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.factories import episodes
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    PromptGroupSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StalenessAwareSampler,
)


def _slice_storage():
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(40), episodes([10] * 4))
    return storage


def _staleness_storage():
    storage = LazyTensorStorage(16)
    storage.set(torch.arange(8), TensorDict(obs=torch.arange(8), policy_version=torch.arange(8) % 3, batch_size=[8]))
    return storage


def _group_storage():
    storage = LazyTensorStorage(16)
    storage.set(torch.arange(12), TensorDict({"query": torch.arange(12) // 4, ("next", "reward"): torch.rand(12, 1)},
                                             batch_size=[12]))
    return storage


def _staleness_sampler():
    sampler = StalenessAwareSampler()
    sampler.consumer_version = 3
    return sampler


# name: (sampler factory, storage factory, batch size); the write notifications reach each as a buffer sends them
SAMPLERS = {
    "slice": (lambda: SliceSampler(slice_len=5, traj_key="episode", cache_values=True), _slice_storage, 10),
    "slice-without-replacement": (
        lambda: SliceSamplerWithoutReplacement(slice_len=5, traj_key="episode"), _slice_storage, 10,  # always caches
    ),
    "prioritized-slice": (
        lambda: PrioritizedSliceSampler(40, 0.7, 0.5, slice_len=5, traj_key="episode", cache_values=True),
        _slice_storage, 10,
    ),
    "staleness": (_staleness_sampler, _staleness_storage, 4),
    "prompt-group": (lambda: PromptGroupSampler(samples_per_group=4), _group_storage, 8),
}
EVENTS = {
    "add": lambda sampler: sampler.add(0),
    "extend": lambda sampler: sampler.extend(torch.arange(2)),
    "mark_update": lambda sampler: sampler.mark_update(torch.arange(2)),
    "empty": lambda sampler: sampler._empty(),
}


def _sampled(name):
    build, storage_fn, batch_size = SAMPLERS[name]
    sampler, storage = build(), storage_fn()
    sampler.extend(torch.arange(len(storage)))  # what a buffer tells its sampler after the writes
    sampler.sample(storage, batch_size)
    assert sampler._derived_state, f"{name} declares no derived state"
    assert all(getattr(sampler, attr) is not None for attr in sampler._derived_state), "nothing derived"
    return sampler, storage, batch_size


@pytest.mark.parametrize("event", sorted(EVENTS))
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_derived_state_is_forgotten_at_every_write_and_on_empty(name, event):
    sampler, storage, batch_size = _sampled(name)
    EVENTS[event](sampler)
    assert all(getattr(sampler, attr) is None for attr in sampler._derived_state)
    if event != "empty":
        sampler.sample(storage, batch_size)  # derived again from the storage
        assert all(getattr(sampler, attr) is not None for attr in sampler._derived_state)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_a_pickled_sampler_carries_no_derived_state_and_derives_it_again(name):
    sampler, storage, batch_size = _sampled(name)
    copy = pickle.loads(pickle.dumps(sampler))
    assert all(getattr(copy, attr) is None for attr in copy._derived_state)
    assert all(getattr(sampler, attr) is not None for attr in sampler._derived_state)  # the original keeps its own
    copy.sample(storage, batch_size)
    assert all(getattr(copy, attr) is not None for attr in copy._derived_state)
