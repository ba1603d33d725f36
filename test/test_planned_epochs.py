"""Draws by number (``SamplerWithoutReplacement.planned_draw``), in one process: what makes DataLoader workers
without replacement deterministic (NOTE [planned epochs] in ``samplers/_shared_epoch.py``). The multi-process
behaviour (exactly once, identical seeded runs, exact resume) is tested in test_shared_samplers.py and
test_resume.py.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import EpochEnded, LazyTensorStorage, SamplerWithoutReplacement, TensorDictReplayBuffer


def _planned(sampler, storage, key, number, total=None, count=4):
    with sampler.planned_draw(key, number, total):
        return sampler.sample(storage, count)[0].tolist()


def _storage(n: int) -> LazyTensorStorage:
    storage = LazyTensorStorage(64)
    storage.set(torch.arange(n), torch.arange(n))
    return storage


def test_a_planned_draw_depends_on_its_number_only():
    storage = _storage(10)
    a, b = SamplerWithoutReplacement().share_memory_(), SamplerWithoutReplacement().share_memory_()
    forward = [_planned(a, storage, 5, g) for g in range(3)]
    backward = {g: _planned(b, storage, 5, g) for g in (2, 1, 0)}  # another order, another sampler: same batches
    assert forward == [backward[g] for g in range(3)]
    assert sorted(sum(forward, [])) == list(range(10)) and [len(x) for x in forward] == [4, 4, 2]
    assert a.ran_out  # batch 2 is the last of its epoch
    with pytest.raises(EpochEnded):  # a one-epoch iteration ends at the same number for every reader
        _planned(a, storage, 5, 3)
    assert _planned(a, storage, 5, 0) == forward[0]  # drawn again by number: the same


def test_planned_draws_over_several_epochs_and_the_next_iteration_starts_after_them():
    storage = _storage(12)
    sampler = SamplerWithoutReplacement().share_memory_()
    batches = [_planned(sampler, storage, 1, g, total=7) for g in range(7)]  # 3 per epoch: epochs 0, 1, part of 2
    for epoch in (batches[0:3], batches[3:6]):
        assert sorted(sum(epoch, [])) == list(range(12))
    assert batches[0:3] != batches[3:6]  # each epoch its own permutation
    rest = [_planned(sampler, storage, 2, g, total=2) for g in range(2)]  # a new key: after batch 6
    assert sorted(sum(batches[6:] + rest, [])) == list(range(12))
    with pytest.raises(EpochEnded):  # the key of a superseded iteration is retired
        _planned(sampler, storage, 1, 7, total=9)


def test_the_main_process_cursor_draws_after_the_planned_batches():
    storage = _storage(12)
    sampler = SamplerWithoutReplacement().share_memory_()
    planned = [_planned(sampler, storage, 3, g, total=2) for g in range(2)]
    cursor = sampler.sample(storage, 4)[0].tolist()  # the rest of that epoch
    assert sorted(sum(planned, []) + cursor) == list(range(12)) and sampler.ran_out
    assert _planned(sampler, storage, 3, 1, total=2) == planned[1]  # the iteration's readers go on
    one_epoch = SamplerWithoutReplacement().share_memory_()  # a one-epoch iteration: the cursor starts the next
    first = _planned(one_epoch, storage, 3, 0)
    assert len(first) == 4 and sorted(one_epoch.sample(storage, 12)[0].tolist()) == list(range(12))


def test_the_plan_is_saved_and_a_loaded_sampler_continues_it():
    storage = _storage(10)
    sampler = SamplerWithoutReplacement().share_memory_()
    expected = [_planned(sampler, storage, 9, g, total=8) for g in range(8)]
    state = sampler.state_dict()
    assert state["_plan"]["key"] == 9 and state["_plan"]["total"] == 8 and state["_pos"] == 0
    for fresh in (SamplerWithoutReplacement().share_memory_(), SamplerWithoutReplacement()):
        fresh.load_state_dict(state)
        fresh.share_memory_()  # a private sampler hands the plan over when it is shared
        assert [_planned(fresh, storage, 9, g, total=8) for g in (7, 5, 6)] == [expected[g] for g in (7, 5, 6)]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=SamplerWithoutReplacement(), batch_size=4)
    rb.extend(TensorDict(idx=torch.arange(10), batch_size=[10]))
    rb.sampler.load_state_dict(state)
    assert rb.sampler.state_dict()["_plan"]["key"] == 9  # kept while private
    rb.empty()
    assert rb.sampler.state_dict()["_plan"] is None


def test_planned_draw_errors():
    storage = _storage(8)
    with pytest.raises(RuntimeError, match=r"planned_draw\(\) needs the sampler's epoch in shared memory"):
        _planned(SamplerWithoutReplacement(), storage, 1, 0)
    sampler = SamplerWithoutReplacement().share_memory_()
    for kwargs, match in (({"key": -1, "number": 0}, r"`key` must be a non-negative int, got -1"),
                          ({"key": 1, "number": 1.5}, r"`number` must be a non-negative int, got 1.5"),
                          ({"key": 1, "number": 0, "total": -2}, r"`total` must be a non-negative int or None")):
        with pytest.raises(ValueError, match=match):
            with sampler.planned_draw(**kwargs):
                pass
    assert sampler.sample(storage, 8)[0].numel() == 8  # nothing planned: the cursor
