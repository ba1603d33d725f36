"""``SamplerEnsemble(p="sampleable")`` (issue 14): buffers weighed by the items their samplers can draw now."""

from __future__ import annotations

import pickle

import pytest
import torch

from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    SamplerEnsemble,
    StorageEnsemble,
)


def _storages(*lengths: int) -> StorageEnsemble:
    members = []
    for n in lengths:
        storage = LazyTensorStorage(100)
        if n:
            storage.set(torch.arange(n), torch.arange(n))
        members.append(storage)
    return StorageEnsemble(*members)


def test_buffers_are_chosen_in_proportion_to_their_items():
    storage = _storages(10, 30, 0)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler(), p="sampleable", num_buffer_sampled=4)
    sampler._rng = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(1000):
        index, info = sampler.sample(storage, 8)
        counts.index_add_(0, info["buffer_ids"], torch.ones(4))
    assert counts[2] == 0  # an empty member is never chosen
    share = counts[1] / counts.sum()
    assert abs(float(share) - 0.75) < 0.03  # 4000 draws: 3 standard deviations ~ 0.02


def test_the_weights_follow_the_members_as_they_fill():
    storage = _storages(5, 0)
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), p="sampleable", num_buffer_sampled=2)
    assert sampler.sample(storage, 2)[1]["buffer_ids"].tolist() == [0, 0]
    storage[0].set(torch.arange(5), torch.arange(5))  # unchanged length
    storage[1].set(torch.arange(50), torch.arange(50))
    seen = {i for _ in range(50) for i in sampler.sample(storage, 2)[1]["buffer_ids"].tolist()}
    assert seen == {0, 1}


def test_a_member_sampler_with_num_sampleable_sets_its_weight():
    class HalfDrawable(RandomSampler):
        def num_sampleable(self, storage=None):
            return 0  # e.g. a consuming sampler that has consumed everything

    storage = _storages(20, 20)
    sampler = SamplerEnsemble(HalfDrawable(), RandomSampler(), p="sampleable", num_buffer_sampled=2)
    for _ in range(20):
        assert sampler.sample(storage, 4)[1]["buffer_ids"].tolist() == [1, 1]


def test_sampleable_through_a_buffer_ensemble_and_its_accessors():
    rbs = [ReplayBuffer(storage=LazyTensorStorage(10)) for _ in range(2)]
    rbs[0].extend(torch.arange(4))
    ens = ReplayBufferEnsemble(*rbs, p="sampleable", num_buffer_sampled=2, batch_size=4)
    batch = ens.sample()
    assert len(batch) == 2  # two sub-batches, both from the only non-empty member
    assert ens.sampler.p == "sampleable"
    assert "p='sampleable'" in repr(ens.sampler)
    assert pickle.loads(pickle.dumps(ens.sampler)).p == "sampleable"


def test_sampleable_errors():
    sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), p="sampleable")
    with pytest.raises(RuntimeError, match='p="sampleable".*nothing to draw'):
        sampler.sample(_storages(0, 0), 2)
    with pytest.raises(ValueError, match="exclusive"):
        SamplerEnsemble(RandomSampler(), p="sampleable", sample_from_all=True)
    with pytest.raises(TypeError, match='"sampleable"'):
        SamplerEnsemble(RandomSampler(), RandomSampler(), p="uniform")
