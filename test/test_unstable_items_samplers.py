"""Prioritized and trajectory samplers used directly on a storage with ``stable_items = False``.

A buffer refuses these samplers over a :class:`~torchrl.data.DatasetStorage` when it is built; a sampler used on
its own (``sampler.sample(storage, n)``) must refuse it too, with the same message, instead of failing later with
an unrelated error (e.g. "every priority is zero").
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import TensorDataset

from torchrl.data import (
    DatasetStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)


def dataset_storage(n: int = 10) -> DatasetStorage:
    return DatasetStorage(TensorDataset(torch.arange(n, dtype=torch.float32)))


SAMPLERS = {
    "prioritized": lambda: PrioritizedSampler(10, alpha=0.7, beta=0.5),
    "prioritized-slice": lambda: PrioritizedSliceSampler(10, alpha=0.7, beta=0.5, slice_len=2, traj_key="ep"),
    "slice": lambda: SliceSampler(slice_len=2, traj_key="ep"),
    "slice-without-replacement": lambda: SliceSamplerWithoutReplacement(slice_len=2, traj_key="ep"),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_sampler_used_directly_refuses_an_unstable_storage(name):
    sampler = SAMPLERS[name]()
    sampler.extend(torch.arange(10))  # what a buffer would do after a write: the priorities are not zero
    storage = dataset_storage()
    with pytest.raises(TypeError) as info:
        sampler.sample(storage, 4)
    message = str(info.value)
    assert f"DatasetStorage cannot be sampled by {type(sampler).__name__}" in message
    assert "RandomSampler() or SamplerWithoutReplacement()" in message


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_the_direct_and_the_buffer_refusals_say_the_same(name):
    with pytest.raises(TypeError) as at_build:
        ReplayBuffer(storage=dataset_storage(), sampler=SAMPLERS[name]())
    sampler = SAMPLERS[name]()
    sampler.extend(torch.arange(10))
    with pytest.raises(TypeError) as at_sample:
        sampler.sample(dataset_storage(), 4)
    assert str(at_build.value) == str(at_sample.value)


@pytest.mark.parametrize("sampler", [RandomSampler(), SamplerWithoutReplacement()], ids=["random", "without"])
def test_uniform_samplers_still_sample_an_unstable_storage(sampler):
    index, _ = sampler.sample(dataset_storage(), 4)
    assert index.shape == (4,) and bool(((index >= 0) & (index < 10)).all())


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_the_same_samplers_still_sample_a_stable_storage(name):
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(10), TensorDict(ep=torch.arange(10) // 5, obs=torch.arange(10.0), batch_size=[10]))
    sampler = SAMPLERS[name]()
    sampler.extend(torch.arange(10))
    index, _ = sampler.sample(storage, 4)
    flat = index[0] if isinstance(index, tuple) else index
    assert flat.numel() == 4
