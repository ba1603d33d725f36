"""SamplerWithoutReplacement behaves as TorchRL's where user code depends on it (behaviour facts §4): the
``drop_last`` batch error, the ``_sample_list`` state entry, and a bool ``drop_last``."""

from __future__ import annotations

import pytest
import torch

from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement


def _storage(n: int) -> LazyTensorStorage:
    storage = LazyTensorStorage(16)
    storage.set(torch.arange(n), torch.arange(n))
    return storage


def test_drop_last_batch_larger_than_the_storage_is_refused_with_torchrl_phrase():
    sampler = SamplerWithoutReplacement(drop_last=True)
    with pytest.raises(ValueError, match="The batch size .* is greater than the storage capacity"):
        sampler.sample(_storage(10), 11)
    assert sampler._sample_list is None  # nothing was drawn


def test_state_dict_sample_list_holds_the_positions_not_drawn_yet():
    storage = _storage(10)
    sampler = SamplerWithoutReplacement()
    sampler._rng = torch.Generator().manual_seed(0)
    assert sampler.state_dict()["_sample_list"] is None  # before the first draw
    drawn = sampler.sample(storage, 4)[0]
    state = sampler.state_dict()
    rest = state["_sample_list"]
    assert isinstance(rest, torch.Tensor) and state["len_storage"] == 10
    assert sorted(drawn.tolist() + rest.tolist()) == list(range(10))
    assert torch.equal(rest, sampler._sample_list)
    assert not state["drop_last"] and not state["_ran_out"]


def test_load_state_dict_clones_the_sample_list():
    storage = _storage(10)
    source = SamplerWithoutReplacement()
    source._rng = torch.Generator().manual_seed(1)
    source.sample(storage, 3)
    state = source.state_dict()
    expected = state["_sample_list"].clone()
    fresh = SamplerWithoutReplacement()
    fresh.load_state_dict(state)
    state["_sample_list"].zero_()  # mutating the source dict later has no effect
    assert torch.equal(fresh._sample_list, expected)
    assert torch.cat([fresh.sample(storage, 4)[0] for _ in range(2)]).tolist()[:7] == expected.tolist()
    assert fresh.ran_out


@pytest.mark.parametrize("shared", [False, True])
def test_a_loaded_epoch_continues_where_the_saved_one_stopped(shared):
    storage = _storage(9)
    source = SamplerWithoutReplacement()
    source._rng = torch.Generator().manual_seed(2)
    first = source.sample(storage, 4)[0]
    fresh = SamplerWithoutReplacement()
    if shared:
        fresh.share_memory_()
    fresh.load_state_dict(source.state_dict())
    rest = [fresh.sample(storage, 4)[0] for _ in range(2)]
    assert sorted(torch.cat([first, *rest]).tolist()) == list(range(9)) and fresh.ran_out


@pytest.mark.parametrize("name", ["drop_last", "shuffle"])
@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_non_bool_options_are_refused(name, bad):
    with pytest.raises(TypeError, match=f"`{name}` must be a bool"):
        SamplerWithoutReplacement(**{name: bad})
