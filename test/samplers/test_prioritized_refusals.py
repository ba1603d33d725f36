"""PrioritizedSampler refuses what it cannot hold, before anything changes (issue 40's residue)."""

from __future__ import annotations

import pytest
import torch
from helpers.assertions import assert_same_state

from torchrl.data import LazyTensorStorage, PrioritizedSampler


def _filled() -> tuple[PrioritizedSampler, LazyTensorStorage]:
    storage = LazyTensorStorage(8)
    storage.set(torch.arange(4), torch.zeros(4))
    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0)
    sampler.extend(torch.arange(4))
    return sampler, storage


@pytest.mark.parametrize("priority", [torch.tensor([3 + 4j]), torch.tensor([True])], ids=["complex", "bool"])
def test_complex_and_boolean_priority_tensors_are_refused(priority):
    sampler, storage = _filled()
    before = sampler.state_dict()
    with pytest.raises(TypeError, match="must hold real numbers"):
        sampler.update_priority(torch.tensor([0]), priority, storage=storage)
    assert_same_state(before, sampler.state_dict())


def test_a_capacity_whose_trees_exceed_the_memory_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"`max_capacity`=10000000000000 needs .* GiB for the priority trees"):
        PrioritizedSampler(10**13, alpha=0.7, beta=0.5)
    PrioritizedSampler(10**5, alpha=0.7, beta=0.5)  # a capacity that fits is built
