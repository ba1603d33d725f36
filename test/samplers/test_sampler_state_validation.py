"""Crafted sampler states are refused before anything changes (issue 29, item 5; NOTE [sampler state validation]).

Every sampler's ``load_state_dict`` runs ``validate_state_dict`` first, and a checkpoint runs the same check before
any part of the buffer is loaded: after each refusal the sampler (and the buffer, its storage included) is as it
was. Also the sharing promise of ConsumingSampler and StalenessAwareSampler (issue 29, item 7).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers.factories import make_buffer, rewrite_checkpoint_metadata
from tensordict import TensorDict

from torchrl.data import (
    ConsumingSampler,
    LazyTensorStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    StalenessAwareSampler,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.checkpointers import CheckpointError

V1 = Path(__file__).resolve().parents[1] / "data" / "checkpoints_v1" / "without_replacement"


def _storage(n: int = 6) -> LazyTensorStorage:
    storage = LazyTensorStorage(16)
    storage.set(torch.arange(n), torch.arange(n))
    return storage


def _wor(seed: int = 0) -> SamplerWithoutReplacement:
    sampler = SamplerWithoutReplacement()
    sampler._rng = torch.Generator().manual_seed(seed)
    sampler.sample(_storage(), 2)  # an epoch in progress
    return sampler


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if not torch.equal(x.nan_to_num(-1), y.nan_to_num(-1)):  # NaN: a position without a priority
                return False
        elif isinstance(x, dict):
            if not (isinstance(y, dict) and _same(x, y)):
                return False
        elif x != y:
            return False
    return True


def _assert_refused_unchanged(sampler, state, error, match):
    before = sampler.state_dict()
    with pytest.raises(error, match=match):
        sampler.load_state_dict(state)
    assert _same(sampler.state_dict(), before)


# -- SamplerWithoutReplacement ------------------------------------------------------------------------------------
OLD = {"_len_storage": 6, "_ran_out": False, "drop_last": False, "shuffle": True}


@pytest.mark.parametrize(
    "state, error, match",
    [
        ({**OLD, "_perm": torch.tensor([0, 1, 2, 3, 4, 9]), "_pos": 0}, ValueError, r"out of \[0, 6\)"),
        ({**OLD, "_perm": torch.zeros(6, dtype=torch.long), "_pos": 0}, ValueError, "repeats positions"),
        ({**OLD, "_perm": torch.arange(6), "_pos": 10**9}, ValueError, r"'_pos'\] is 1000000000"),
        ({**OLD, "_perm": torch.arange(6), "_pos": -5}, ValueError, r"'_pos'\] is -5"),
        ({**OLD, "_perm": torch.arange(4), "_pos": 0}, ValueError, "4 positions for an epoch of 6"),
        ({**OLD, "_perm": torch.arange(6.0), "_pos": 0}, TypeError, "integer positions"),
        ({"len_storage": 6, "_sample_list": torch.tensor([7]), "_ran_out": False}, ValueError, "out of"),
        (
            {"len_storage": 6, "_sample_list": torch.zeros(4, dtype=torch.long), "_ran_out": False},
            ValueError,
            "repeats",
        ),
        ({"len_storage": -1, "_sample_list": None, "_ran_out": False}, ValueError, "'len_storage'"),
        (
            {"len_storage": 2**40, "_sample_list": torch.tensor([1]), "_ran_out": False},
            ValueError,
            "'len_storage'",
        ),
        ({"len_storage": "6", "_sample_list": None, "_ran_out": False}, TypeError, "'len_storage'"),
        ({"len_storage": 6, "_sample_list": torch.tensor([[1]]), "_ran_out": False}, ValueError, "1-D"),
        ({"len_storage": 6, "_sample_list": None, "_ran_out": "no"}, TypeError, "'_ran_out'"),
        (
            {"len_storage": 6, "_sample_list": None, "_ran_out": False, "drop_last": 1},
            TypeError,
            "'drop_last'",
        ),
        ({"len_storage": 6, "_sample_list": None, "_ran_out": False, "_seed": 2**70}, ValueError, "'_seed'"),
        ({"len_storage": 6, "_sample_list": None}, ValueError, "no '_ran_out'"),
        (
            {"len_storage": 6, "_sample_list": None, "_ran_out": False, "_plan": {"key": -1}},
            TypeError,
            "_plan",
        ),
        ([("len_storage", 6)], TypeError, "`state_dict` must be the dict"),
    ],
)
@pytest.mark.parametrize("shared", [False, True])
def test_crafted_without_replacement_states_are_refused_and_change_nothing(state, error, match, shared):
    sampler = _wor()
    if shared:
        sampler.share_memory_()
    _assert_refused_unchanged(sampler, state, error, match)
    assert sampler.sample(_storage(), 4)[0].numel() == 4  # still usable: the epoch goes on


def test_a_valid_old_layout_state_still_loads():
    sampler = SamplerWithoutReplacement()
    sampler.load_state_dict({**OLD, "_perm": torch.tensor([5, 3, 1, 0, 2, 4]), "_pos": 2})
    assert sampler.state_dict()["_sample_list"].tolist() == [1, 0, 2, 4]
    assert sampler.sample(_storage(), 4)[0].tolist() == [1, 0, 2, 4] and sampler.ran_out


def test_validate_state_dict_returns_without_changing_anything():
    sampler = _wor()
    before = sampler.state_dict()
    checked = sampler.validate_state_dict(_wor(seed=5).state_dict())
    assert isinstance(checked, dict) and _same(sampler.state_dict(), before)


# -- other samplers ---------------------------------------------------------------------------------------------------
def _prioritized() -> PrioritizedSampler:
    sampler = PrioritizedSampler(10, alpha=0.7, beta=0.5)
    sampler.extend(torch.arange(6))
    sampler.update_priority(torch.arange(6), torch.arange(6).float() + 1)
    return sampler


def _prioritized_state(**change) -> dict:
    return {**_prioritized().state_dict(), **change}


@pytest.mark.parametrize(
    "state, error, match",
    [
        (_prioritized_state(_priority=torch.full((16,), float("inf"))), ValueError, "finite"),
        (_prioritized_state(_beta=float("nan")), ValueError, "`beta`"),
        (_prioritized_state(_eps="0"), TypeError, "`eps`"),
        (_prioritized_state(_max_priority=(1.0, 99)), ValueError, "index of the max priority"),
        (_prioritized_state(_max_priority=1.0), TypeError, "pair"),
        (_prioritized_state(_sum_tree="tree"), TypeError, "segment tree"),
        (
            _prioritized_state(_sum_tree={"capacity": 16, "values": torch.full((16,), float("nan"))}),
            ValueError,
            "finite",
        ),
        (_prioritized_state(_priority=torch.full((16,), float("nan"))), ValueError, "no raw priority"),
    ],
)
def test_crafted_prioritized_states_are_refused_and_change_nothing(state, error, match):
    _assert_refused_unchanged(_prioritized(), state, error, match)


@pytest.mark.parametrize(
    "state, error, match",
    [
        ({"max_staleness": 2}, ValueError, "no 'consumer_version'"),
        ({"consumer_version": 1.5, "max_staleness": 2}, TypeError, "`consumer_version`"),
        ({"consumer_version": 3, "max_staleness": -7}, ValueError, "`max_staleness`"),
    ],
)
def test_crafted_staleness_states_are_refused_and_change_nothing(state, error, match):
    sampler = StalenessAwareSampler(max_staleness=4)
    sampler.consumer_version = 2
    _assert_refused_unchanged(sampler, state, error, match)
    assert (sampler.consumer_version, sampler.max_staleness) == (2, 4)


def test_an_ensemble_checks_every_member_state_before_loading_any():
    ensemble = SamplerEnsemble(_wor(1), _wor(2))
    state = ensemble.state_dict()
    state["1"] = {**state["1"], "_sample_list": torch.tensor([0, 0])}
    _assert_refused_unchanged(ensemble, state, ValueError, "repeats")
    good = SamplerEnsemble(SamplerWithoutReplacement(), StalenessAwareSampler())
    good.load_state_dict({"0": _wor(3).state_dict(), "1": {"consumer_version": 4, "max_staleness": -1}})
    assert good._samplers[1].consumer_version == 4 and good._samplers[0]._sample_list is not None


# -- checkpoints ----------------------------------------------------------------------------------------------------
def _wor_buffer() -> ReplayBuffer:
    return make_buffer(capacity=16, sampler=SamplerWithoutReplacement(), batch_size=4)


def _set_sampler_scalar(document: dict, key: str, value) -> None:
    state = document["metadata"]["component"]["doc"]["parts"]["sampler"]["doc"]["state"]["dict"]
    for entry in state:
        if entry[0] == key:
            entry[1] = {"value": value}
            return
    raise KeyError(key)


@pytest.mark.parametrize("pos", [10**9, -5])
def test_an_old_checkpoint_with_a_crafted_cursor_is_refused_before_the_buffer_changes(tmp_path, pos):
    crafted = tmp_path / "crafted"
    shutil.copytree(V1, crafted)
    rewrite_checkpoint_metadata(crafted, lambda doc: _set_sampler_scalar(doc, "_pos", pos))
    rb = _wor_buffer()  # built as the saved one (its storage holds transitions: this one is still empty)
    with pytest.raises(
        CheckpointError, match=r"SamplerWithoutReplacement state in the checkpoint .*\['_pos'\] is"
    ):
        rb.loads(crafted)
    assert len(rb) == 0 and rb.sampler._sample_list is None
    fresh = _wor_buffer()
    fresh.loads(V1)  # the original loads
    assert len(fresh) == 12


@pytest.mark.parametrize("craft", ["zeros", "out_of_range"])
def test_a_checkpoint_with_a_crafted_permutation_is_refused_before_the_buffer_changes(tmp_path, craft):
    source = _wor_buffer()
    source.extend(torch.arange(8))
    source.sample()
    # what a crafted file holds: a permutation the sampler would never save
    source.sampler._perm = torch.zeros(8, dtype=torch.long) if craft == "zeros" else torch.arange(8) + 4
    source.sampler._pos = 0
    source.dumps(tmp_path / "crafted")
    rb = _wor_buffer()
    rb.extend(torch.arange(100, 103))
    rb.sample()
    before = rb.sampler.state_dict()
    with pytest.raises(CheckpointError, match="_sample_list"):
        rb.loads(tmp_path / "crafted")
    assert rb[:].tolist() == [100, 101, 102] and _same(rb.sampler.state_dict(), before)
    source.sampler.dumps(tmp_path / "alone")  # the sampler's own checkpoint: the same check
    alone = _wor()
    before = alone.state_dict()
    with pytest.raises(CheckpointError, match="_sample_list"):
        alone.loads(tmp_path / "alone")
    assert _same(alone.state_dict(), before)


def test_a_checkpoint_with_a_crafted_scalar_is_refused(tmp_path):
    source = _wor_buffer()
    source.extend(torch.arange(8))
    source.sample()
    source.dumps(tmp_path / "ckpt")
    rewrite_checkpoint_metadata(tmp_path / "ckpt", lambda doc: _set_sampler_scalar(doc, "_ran_out", "yes"))
    rb = _wor_buffer()
    with pytest.raises(CheckpointError, match="'_ran_out'"):
        rb.loads(tmp_path / "ckpt")
    assert len(rb) == 0


# -- issue 29, item 7: which samplers share their state with DataLoader workers ----------------------------------
@pytest.mark.parametrize(
    "make", [lambda: ConsumingSampler(1), lambda: StalenessAwareSampler(max_staleness=3)]
)
def test_consuming_and_staleness_samplers_can_share_their_state(make):
    sampler = make()
    assert sampler.requires_shared_state and sampler.can_share_state
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler, batch_size=2)
    rb.extend(
        TensorDict(obs=torch.arange(6), policy_version=torch.zeros(6, dtype=torch.long), batch_size=[6])
    )
    rb.as_dataset()  # shares the sampler (refused for samplers that cannot share)
    assert rb.sampler.is_shared
