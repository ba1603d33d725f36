"""Uniform samplers: RandomSampler and SamplerWithoutReplacement, on storages and through buffers."""

from __future__ import annotations

import copy
import inspect
import pickle

import numpy as np
import pytest
import torch
from helpers.factories import STORAGES, filled_storage, make_storage
from tensordict import TensorDict

from torchrl.data import (
    EpochEnded,
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    Sampler,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers.base import _REPLACEMENT_DISPATCH, check_batch_size

storages = pytest.mark.parametrize("storage", STORAGES)


def _epoch(sampler, storage, batch_size):
    """The batches of one epoch (until ``ran_out``), as lists."""
    batches = []
    for _ in range(100):
        index, info = sampler.sample(storage, batch_size)
        assert info == {}
        batches.append(index.tolist())
        if sampler.ran_out:
            return batches
    raise AssertionError("the sampler never ran out")


# -- RandomSampler --------------------------------------------------------------------------------------------


@storages
def test_random_sampler_draws_valid_indices(storage):
    s = filled_storage(storage, "tensor", 7, capacity=20)
    index, info = RandomSampler().sample(s, 500)
    assert info == {} and index.dtype == torch.long and index.shape == (500,)
    assert index.min() >= 0 and index.max() < 7
    assert set(index.tolist()) == set(range(7))  # 500 draws over 7 items hit all of them


def test_random_sampler_returns_per_dim_indices_for_ndim2():
    s = LazyTensorStorage(20, ndim=2)
    s.set(torch.arange(3), torch.zeros(3, 4))
    rows, envs = RandomSampler().sample(s, 200)[0]
    assert rows.max() < 3 and envs.max() < 4
    assert set((rows * 4 + envs).tolist()) == set(range(12))


def test_statefulness_flags():
    assert RandomSampler.requires_shared_state is False
    assert SamplerWithoutReplacement.requires_shared_state is True
    assert Sampler.requires_shared_state is True  # unknown samplers are assumed stateful
    assert RandomSampler().ran_out is False
    assert RandomSampler().state_dict() == {}


# -- SamplerWithoutReplacement --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,batch_size,drop_last,sizes",
    [
        (10, 3, False, [3, 3, 3, 1]),
        (10, 3, True, [3, 3, 3]),
        (9, 3, False, [3, 3, 3]),
        (9, 3, True, [3, 3, 3]),
        (5, 5, False, [5]),
        (4, 10, False, [4]),
    ],
)
@storages
def test_each_index_is_visited_once_per_epoch(storage, n, batch_size, drop_last, sizes):
    s = filled_storage(storage, "tensor", n, capacity=20)
    sampler = SamplerWithoutReplacement(drop_last=drop_last)
    for _ in range(3):  # three consecutive epochs
        batches = _epoch(sampler, s, batch_size)
        assert [len(b) for b in batches] == sizes
        seen = [i for b in batches for i in b]
        assert len(seen) == len(set(seen))
        if not drop_last:
            assert sorted(seen) == list(range(n))
        else:
            assert set(seen) <= set(range(n)) and len(seen) == n - n % batch_size


def test_shuffle_false_keeps_storage_order():
    s = filled_storage("lazy", "tensor", 7, capacity=20)
    sampler = SamplerWithoutReplacement(shuffle=False)
    assert _epoch(sampler, s, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert _epoch(sampler, s, 3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_shuffled_epochs_differ():
    s = filled_storage("lazy", "tensor", 20, capacity=20)
    sampler = SamplerWithoutReplacement()
    sampler._rng = torch.Generator().manual_seed(0)
    first, second = _epoch(sampler, s, 20), _epoch(sampler, s, 20)
    assert first != second and sorted(first[0]) == sorted(second[0]) == list(range(20))


def test_a_new_epoch_starts_when_the_storage_grows():
    s = filled_storage("lazy", "tensor", 6, capacity=20)
    sampler = SamplerWithoutReplacement(shuffle=False)
    assert sampler.sample(s, 4)[0].tolist() == [0, 1, 2, 3]
    s.set(torch.arange(6, 8), torch.zeros(2, 3))
    assert sampler.sample(s, 4)[0].tolist() == [0, 1, 2, 3]  # restarted over 8 items
    assert _epoch(sampler, s, 4) == [[4, 5, 6, 7]]


def test_state_dict_resumes_mid_epoch():
    s = filled_storage("lazy", "tensor", 10, capacity=20)
    sampler = SamplerWithoutReplacement()
    sampler._rng = torch.Generator().manual_seed(3)
    first = sampler.sample(s, 4)[0].tolist()
    fresh = SamplerWithoutReplacement()
    fresh.load_state_dict(sampler.state_dict())
    rest_a, rest_b = _epoch(sampler, s, 4), _epoch(fresh, s, 4)
    assert rest_a == rest_b
    assert sorted(first + [i for b in rest_a for i in b]) == list(range(10))


def test_empty_resets_the_epoch():
    s = filled_storage("lazy", "tensor", 6, capacity=20)
    sampler = SamplerWithoutReplacement(shuffle=False)
    sampler.sample(s, 4)
    sampler._empty()
    assert sampler.sample(s, 4)[0].tolist() == [0, 1, 2, 3]


def test_drop_last_with_fewer_items_than_a_batch_is_refused():
    s = filled_storage("lazy", "tensor", 3, capacity=20)
    sampler = SamplerWithoutReplacement(drop_last=True)
    with pytest.raises(ValueError, match=r"The batch size 5 is greater than the storage capacity 3.*drop_last=False"):
        sampler.sample(s, 5)


# -- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RandomSampler, SamplerWithoutReplacement])
@pytest.mark.parametrize("storage", ["list", "lazy"])
def test_sampling_an_empty_storage_says_to_add_data(cls, storage):
    with pytest.raises(RuntimeError, match=r"empty storage: add data first"):
        cls().sample(make_storage(storage, 5, "tensor"), 2)


@pytest.mark.parametrize("cls", [RandomSampler, SamplerWithoutReplacement])
@pytest.mark.parametrize("batch_size", [0, -1, 1.5, None, True, "3"])
def test_bad_batch_size_names_the_argument(cls, batch_size):
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int.*Pass it to sample\(\)"):
        cls().sample(filled_storage("lazy", "tensor", 4, capacity=20), batch_size)


def test_check_batch_size_passes_positive_ints():
    assert check_batch_size(7) == 7


def test_update_priority_on_a_uniform_sampler_warns():
    with pytest.warns(UserWarning, match="not prioritized"):
        RandomSampler().update_priority(torch.tensor([0]), torch.tensor([1.0]))


def test_sampler_base_class_is_abstract():
    with pytest.raises(TypeError):
        Sampler()


# -- randomness -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RandomSampler, SamplerWithoutReplacement])
def test_draws_go_through_the_generator_only(cls):
    s = filled_storage("lazy", "tensor", 15, capacity=20)
    np_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    draws = []
    for _ in range(2):
        sampler = cls()
        sampler._rng = torch.Generator().manual_seed(11)
        draws.append([sampler.sample(s, 4)[0].tolist() for _ in range(6)])
    assert draws[0] == draws[1]
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert np.array_equal(after[1], np_state[1]) and after[2] == np_state[2]


@pytest.mark.parametrize("cls", [RandomSampler, SamplerWithoutReplacement])
def test_without_a_generator_draws_follow_torch_manual_seed(cls):
    s = filled_storage("lazy", "tensor", 15, capacity=20)
    np_state = np.random.get_state()
    draws = []
    for _ in range(2):
        torch.manual_seed(5)
        sampler = cls()
        draws.append([sampler.sample(s, 4)[0].tolist() for _ in range(3)])
    assert draws[0] == draws[1]
    assert np.array_equal(np.random.get_state()[1], np_state[1])


@pytest.mark.parametrize("sampler", ["random", "without_replacement"])
def test_buffers_with_equal_generators_sample_equally(sampler):
    def run(seed):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(50),
            sampler=RandomSampler() if sampler == "random" else SamplerWithoutReplacement(),
            batch_size=6,
            generator=torch.Generator().manual_seed(seed),
        )
        rb.extend(torch.arange(50))
        return [rb.sample().tolist() for _ in range(5)]

    assert run(1) == run(1)
    assert run(1) != run(2)


# -- the `replacement` keyword -------------------------------------------------------------------------------


class _RandomSubclass(RandomSampler):
    """A third-party subclass: not in the dispatch table, so replacement=False cannot be honoured for it."""


class _OwnReplacement(Sampler):
    """A third-party sampler whose constructor takes its own `replacement` argument."""

    def __init__(self, replacement: bool = True):
        self.replacement = replacement

    def sample(self, storage, batch_size):
        return torch.zeros(batch_size, dtype=torch.long), {}


def test_dispatch_table_maps_random_sampler_to_sampler_without_replacement():
    assert _REPLACEMENT_DISPATCH[RandomSampler] is SamplerWithoutReplacement


@pytest.mark.parametrize(
    "kwargs", [{}, {"drop_last": True}, {"shuffle": False}, {"drop_last": True, "shuffle": False}]
)
def test_random_sampler_replacement_false_builds_sampler_without_replacement(kwargs):
    sampler = RandomSampler(replacement=False, **kwargs)
    assert type(sampler) is SamplerWithoutReplacement
    assert sampler.drop_last is kwargs.get("drop_last", False)
    assert sampler.shuffle is kwargs.get("shuffle", True)
    seen = [i for batch in _epoch(sampler, filled_storage("lazy", "tensor", 7, capacity=20), 2) for i in batch]
    assert sorted(seen) == list(range(7 - 7 % 2 if sampler.drop_last else 7))


@pytest.mark.parametrize(
    "build",
    [
        lambda **kw: RandomSampler(**kw),
        lambda **kw: _RandomSubclass(**kw),
        lambda **kw: PrioritizedSampler(10, 1.0, 1.0, **kw),
        lambda **kw: SamplerEnsemble(RandomSampler(), RandomSampler(), **kw),
    ],
    ids=["random", "subclass", "prioritized", "ensemble"],
)
def test_replacement_true_is_a_no_op_on_samplers_with_replacement(build):
    plain, flagged = build(), build(replacement=True)
    assert type(flagged) is type(plain) and repr(flagged) == repr(plain)


@pytest.mark.parametrize("kwargs", [{}, {"drop_last": True, "shuffle": False}])
def test_replacement_false_is_a_no_op_on_samplers_without_replacement(kwargs):
    sampler = SamplerWithoutReplacement(replacement=False, **kwargs)
    assert type(sampler) is SamplerWithoutReplacement
    assert repr(sampler) == repr(SamplerWithoutReplacement(**kwargs))


@pytest.mark.parametrize(
    "build, replacement, match",
    [
        (
            SamplerWithoutReplacement,
            True,
            r"SamplerWithoutReplacement samples without replacement.*Use RandomSampler",
        ),
        (_RandomSubclass, False, r"_RandomSubclass has no without-replacement variant.*use a sampler without replacement"),
        (
            lambda **kw: PrioritizedSampler(10, 1.0, 1.0, **kw),
            False,
            r"PrioritizedSampler has no without-replacement variant.*SamplerWithoutReplacement",
        ),
        (lambda **kw: SamplerEnsemble(RandomSampler(), **kw), False, "SamplerEnsemble has no without-replacement variant"),
    ],
    ids=["contradiction", "subclass", "prioritized", "ensemble"],
)
def test_replacement_that_cannot_be_honoured_says_which_class_to_use(build, replacement, match):
    with pytest.raises(TypeError, match=match):
        build(replacement=replacement)


@pytest.mark.parametrize("cls", [RandomSampler, SamplerWithoutReplacement])
@pytest.mark.parametrize("value", ["no", 0, None, 1.0])
def test_replacement_must_be_a_bool(cls, value):
    with pytest.raises(TypeError, match=r"`replacement` must be a bool, got"):
        cls(replacement=value)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((), {"batch": 3}, r"SamplerWithoutReplacement, which does not take `batch` \(got batch=3\)"),
        ((True, True, True), {}, r"SamplerWithoutReplacement\(drop_last.*too many positional"),
    ],
)
def test_arguments_the_sampler_without_replacement_does_not_take_are_named(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        RandomSampler(*args, replacement=False, **kwargs)


def test_positional_arguments_are_forwarded():
    sampler = RandomSampler(True, False, replacement=False)
    assert (sampler.drop_last, sampler.shuffle) == (True, False)


def test_a_constructor_with_its_own_replacement_argument_receives_it():
    assert _OwnReplacement(replacement=False).replacement is False
    assert type(_OwnReplacement(replacement=True)) is _OwnReplacement


def test_signature_shows_the_constructor_arguments_not_the_dispatch():
    assert list(inspect.signature(SamplerWithoutReplacement).parameters) == ["drop_last", "shuffle"]
    assert list(inspect.signature(RandomSampler).parameters) == []
    assert list(inspect.signature(PrioritizedSampler).parameters)[:3] == ["max_capacity", "alpha", "beta"]


@pytest.mark.parametrize(
    "round_trip",
    [lambda obj: pickle.loads(pickle.dumps(obj)), copy.deepcopy],
    ids=["pickle", "deepcopy"],
)
def test_samplers_built_with_replacement_pickle_and_copy_mid_epoch(round_trip):
    s = filled_storage("lazy", "tensor", 9, capacity=20)
    sampler = RandomSampler(replacement=False, drop_last=True)
    sampler._rng = torch.Generator().manual_seed(4)
    sampler.sample(s, 2)
    clone = round_trip(sampler)
    assert type(clone) is SamplerWithoutReplacement and clone.drop_last is True
    clone._rng = sampler._rng = None  # a buffer re-installs its generator; compare the epoch position only
    assert _epoch(clone, s, 2) == _epoch(sampler, s, 2)
    for plain in (RandomSampler(replacement=True), SamplerWithoutReplacement(replacement=False)):
        assert repr(round_trip(plain)) == repr(plain)


# -- planned draws (SamplerWithoutReplacement.planned_draw), in one process ----------------------------------------
# What makes DataLoader workers without replacement deterministic (NOTE [planned epochs] in
# ``samplers/_shared_epoch.py``). The multi-process behaviour (exactly once, identical seeded runs, exact resume)
# is tested in shared/test_shared_samplers.py and loading/test_resume.py.
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
    assert state["_plan"]["key"] == 9 and state["_plan"]["total"] == 8
    assert len(state["_sample_list"]) == state["len_storage"] == 10  # the cursor stays at 0 while the plan runs
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
