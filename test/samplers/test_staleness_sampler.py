"""StalenessAwareSampler: weights by policy staleness, the max_staleness gate, consumer_version (issue 14)."""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip, assert_same_state, chi2, chi2_crit
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    StalenessAwareSampler,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers.scheduler import StepScheduler

TIMEOUT = 60


def fresh_only(staleness: torch.Tensor) -> torch.Tensor:
    """A module-level weight function (picklable): only items of the current version."""
    return (staleness == 0).double()


def data(versions, start=0, key="policy_version") -> TensorDict:
    versions = torch.as_tensor(versions)
    n = versions.numel()
    td = TensorDict(obs=torch.arange(start, start + n), batch_size=[n])
    td.set(key, versions)
    return td


def stale_rb(versions, consumer_version, batch_size=1, seed=0, capacity=16, **kwargs):
    sampler = StalenessAwareSampler(**kwargs)
    rb = make_buffer(cls=TensorDictReplayBuffer, capacity=capacity, sampler=sampler, batch_size=batch_size, seed=seed,
                     data=data(versions))  # fmt: skip
    sampler.consumer_version = consumer_version
    return rb


def weights_of(versions, consumer_version) -> torch.Tensor:
    w = 1.0 / (consumer_version - torch.as_tensor(versions, dtype=torch.float64) + 1.0)
    return w / w.sum()


# -- what is drawn ------------------------------------------------------------------------------------------------
def test_single_draws_follow_the_default_weights():
    versions = [0, 1, 2, 3, 3]
    rb = stale_rb(versions, consumer_version=3, seed=1)
    obs = torch.cat([rb.sample()["obs"] for _ in range(6000)])
    counts = torch.bincount(obs, minlength=5).double()
    assert chi2(counts, weights_of(versions, 3)) < chi2_crit(4)
    assert chi2(counts, torch.full((5,), 0.2, dtype=torch.float64)) > 10 * chi2_crit(4)


def test_a_batch_larger_than_the_drawable_items_is_drawn_with_replacement():
    versions = [0, 1, 2, 3]
    rb = stale_rb(versions, consumer_version=3, batch_size=12, seed=2)
    obs = torch.cat([rb.sample()["obs"] for _ in range(500)])
    counts = torch.bincount(obs, minlength=4).double()
    assert chi2(counts, weights_of(versions, 3)) < chi2_crit(3)


def test_a_batch_holds_distinct_items_drawn_as_successive_weighted_draws():
    versions = [0, 1, 2, 3]
    rb = stale_rb(versions, consumer_version=3, batch_size=2, seed=3)
    w = weights_of(versions, 3)
    pairs = list(itertools.combinations(range(4), 2))
    expected = torch.tensor([float(w[i] * w[j] * (1 / (1 - w[i]) + 1 / (1 - w[j]))) for i, j in pairs],
                            dtype=torch.float64)
    counts = torch.zeros(len(pairs), dtype=torch.float64)
    for _ in range(4000):
        i, j = sorted(rb.sample()["obs"].tolist())
        counts[pairs.index((i, j))] += 1
    assert abs(float(expected.sum()) - 1) < 1e-9
    assert chi2(counts, expected) < chi2_crit(len(pairs) - 1)


def test_heavy_weights_fall_back_to_multinomial_and_stay_exact():
    def skewed(staleness):
        return torch.where(staleness == 0, torch.tensor(1e6, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))

    rb = stale_rb([5, 0, 0, 0], consumer_version=5, batch_size=3, seed=4, staleness_weight_fn=skewed)
    left_out = torch.zeros(4, dtype=torch.float64)
    for _ in range(1500):
        obs = rb.sample()["obs"]
        assert obs.unique().numel() == 3 and 0 in obs.tolist()
        left_out[sorted(set(range(4)) - set(obs.tolist()))[0]] += 1
    assert left_out[0] == 0
    assert chi2(left_out[1:], torch.full((3,), 1 / 3, dtype=torch.float64)) < chi2_crit(2)


def test_info_and_the_batch_hold_the_staleness():
    rb = stale_rb([0, 2, 4], consumer_version=4, batch_size=3)
    batch, info = rb.sample(return_info=True)
    expected = {0: 4, 1: 2, 2: 0}
    assert info["staleness"].tolist() == [expected[o] for o in batch["obs"].tolist()]
    assert batch["staleness"].tolist() == info["staleness"].tolist()


def test_max_staleness_gates_stale_items_and_follows_consumer_version():
    rb = stale_rb([0, 1, 2, 3], consumer_version=3, batch_size=2, max_staleness=1)
    drawn = set(torch.cat([rb.sample()["obs"] for _ in range(50)]).tolist())
    assert drawn == {2, 3}
    rb.sampler.increment_consumer_version()  # 4: only version 3 is within the gate
    assert set(torch.cat([rb.sample()["obs"] for _ in range(20)]).tolist()) == {3}
    assert rb.sampler.increment_consumer_version() == 5
    with pytest.raises(RuntimeError, match=r"No stored item can be drawn with `max_staleness`=1.*consumer_version`=5"):
        rb.sample()
    rb.sampler.max_staleness = -1  # a setter, e.g. for a scheduler
    assert len(rb.sample()) == 2


def test_new_writes_and_ring_wrap_overwrites_change_the_weights():
    rb = stale_rb([0, 0, 0, 0], consumer_version=1, batch_size=4, capacity=4, max_staleness=0)
    with pytest.raises(RuntimeError, match="No stored item"):
        rb.sample()
    rb.extend(data([1, 1], start=10))  # overwrites slots 0 and 1 (the ring wraps)
    assert sorted(rb.sample(8)["obs"].unique().tolist()) == [10, 11]


def test_custom_weight_function():
    rb = stale_rb([0, 1, 2], consumer_version=2, batch_size=5, staleness_weight_fn=fresh_only)
    assert set(rb.sample()["obs"].tolist()) == {2}


def test_other_layouts_list_storage_nested_key_and_ndim_2(seed):  # seeded: 4 draws from {1, 2} miss one 1 in 8
    items = [data([v], start=i)[0] for i, v in enumerate([0, 3, 3])]
    rb = ReplayBuffer(storage=ListStorage(10), sampler=StalenessAwareSampler(max_staleness=0), batch_size=4)
    rb.extend(items)
    rb.sampler.consumer_version = 3
    assert set(torch.stack([x["obs"] for x in rb.sample()]).tolist()) == {1, 2}

    nested = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2,
                                    sampler=StalenessAwareSampler(max_staleness=0, version_key=("meta", "v")))
    nested.extend(data([0, 1, 1], key=("meta", "v")))
    nested.sampler.consumer_version = 1
    assert sorted(nested.sample()["obs"].tolist()) == [1, 2]

    grid = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=3,
                                  sampler=StalenessAwareSampler(max_staleness=0))
    td = TensorDict(obs=torch.arange(6).reshape(2, 3), policy_version=torch.tensor([[0, 0, 0], [1, 1, 1]]),
                    batch_size=[2, 3])
    grid.extend(td)  # [envs, time]
    grid.sampler.consumer_version = 1
    batch, info = grid.sample(return_info=True)
    assert sorted(batch["obs"].tolist()) == [3, 4, 5] and isinstance(info["index"], tuple)


# -- errors -----------------------------------------------------------------------------------------------------------
def test_a_missing_version_key_names_it_and_how_to_write_it():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=StalenessAwareSampler(), batch_size=2)
    rb.extend(TensorDict(obs=torch.arange(3), batch_size=[3]))
    with pytest.raises(KeyError, match=r"'policy_version'.*data\['policy_version'\] = torch.full.*version_key="):
        rb.sample()
    plain = ReplayBuffer(storage=LazyTensorStorage(8), sampler=StalenessAwareSampler(), batch_size=2)
    plain.extend(torch.arange(3))
    with pytest.raises(KeyError, match="policy_version"):
        plain.sample()
    listed = ReplayBuffer(storage=ListStorage(8), sampler=StalenessAwareSampler(version_key="v"), batch_size=2)
    listed.extend([TensorDict(obs=torch.tensor(0))])
    with pytest.raises(KeyError, match="'v'.*some stored items do not have it"):
        listed.sample()


def test_data_newer_than_the_consumer_is_refused_with_the_fix():
    rb = stale_rb([0, 4], consumer_version=2)
    with pytest.raises(ValueError, match=r"newer than `consumer_version`=2 \(up to 4\).*increment_consumer_version"):
        rb.sample()


def test_a_weight_function_returning_bad_weights_is_refused():
    rb = stale_rb([0, 1], consumer_version=1, staleness_weight_fn=lambda s: -s.double())
    with pytest.raises(ValueError, match="`staleness_weight_fn` must return finite weights >= 0"):
        rb.sample()
    rb = stale_rb([0, 1], consumer_version=1, staleness_weight_fn=lambda s: torch.ones(5))
    with pytest.raises(ValueError, match="shaped like its input"):
        rb.sample()


def test_arguments_are_validated():
    with pytest.raises(ValueError, match=r"`max_staleness` must be -1 \(no limit\) or an int >= 0, got -2"):
        StalenessAwareSampler(max_staleness=-2)
    with pytest.raises(TypeError, match="`max_staleness` must be an int"):
        StalenessAwareSampler(max_staleness=1.5)
    with pytest.raises(TypeError, match="`staleness_weight_fn` must map"):
        StalenessAwareSampler(staleness_weight_fn=3)
    with pytest.raises(TypeError, match="`version_key` must be the name of an entry"):
        StalenessAwareSampler(version_key=3)
    sampler = StalenessAwareSampler()
    with pytest.raises(TypeError, match="`consumer_version` must be an int"):
        sampler.consumer_version = 1.5
    sampler.consumer_version = torch.tensor(7)
    assert sampler.consumer_version == 7
    with pytest.raises(RuntimeError, match="empty storage"):
        sampler.sample(LazyTensorStorage(4), 2)


# -- state, checkpoints, pickling -------------------------------------------------------------------------------------
def _continue(rb, steps=4):
    out = []
    for i in range(steps):
        out.append(rb.sample()["obs"].tolist())
        if i == 1:
            rb.sampler.increment_consumer_version()
            rb.extend(data([rb.sampler.consumer_version] * 2, start=100 + i))
    return out


def test_state_dict_round_trip_mid_stream_continues_identically():
    rb = stale_rb([0, 1, 2, 2, 3], consumer_version=3, batch_size=3, seed=5, max_staleness=2)
    rb.sample()
    state = rb.state_dict()
    assert state["_sampler"] == {"consumer_version": 3, "max_staleness": 2}
    fresh = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=StalenessAwareSampler(), batch_size=3,
                                   generator=torch.Generator().manual_seed(42))
    fresh.load_state_dict(state)
    assert fresh.sampler.consumer_version == 3 and fresh.sampler.max_staleness == 2
    assert _continue(fresh) == _continue(rb)


def test_dumps_round_trip_mid_stream_continues_identically(tmp_path):
    rb = stale_rb([0, 1, 2, 2, 3], consumer_version=3, batch_size=3, seed=6, max_staleness=2)
    rb.sample()
    rb.dumps(tmp_path / "rb")
    fresh = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=StalenessAwareSampler(), batch_size=3)
    fresh.loads(tmp_path / "rb")
    assert _continue(fresh) == _continue(rb)
    assert_checkpoint_round_trip(rb.sampler, StalenessAwareSampler, tmp_path / "sampler")


def test_an_invalid_state_is_refused():
    sampler = StalenessAwareSampler()
    with pytest.raises(TypeError, match="consumer_version"):
        sampler.load_state_dict({"consumer_version": "3", "max_staleness": -1})
    with pytest.raises(ValueError, match="max_staleness"):
        sampler.load_state_dict({"consumer_version": 3, "max_staleness": -5})
    assert sampler.state_dict() == {"consumer_version": 0, "max_staleness": -1}


def test_pickling_keeps_the_state_and_continues_identically():
    rb = stale_rb([0, 1, 2, 3], consumer_version=3, batch_size=2, seed=7, staleness_weight_fn=fresh_only)
    rb.sample()
    copy = pickle.loads(pickle.dumps(rb))
    assert copy.sampler.consumer_version == 3 and copy.sampler.staleness_weight_fn is fresh_only
    assert_same_state(_continue(copy), _continue(rb))


# -- DataLoader workers ------------------------------------------------------------------------------------------------
def test_share_memory_shares_the_state_and_a_pickle_is_private():
    sampler = StalenessAwareSampler(max_staleness=2)
    assert not sampler.is_shared
    assert sampler.share_memory_() is sampler and sampler.is_shared
    sampler.consumer_version = 5
    assert sampler.state_dict() == {"consumer_version": 5, "max_staleness": 2}
    copy = pickle.loads(pickle.dumps(sampler))
    copy.increment_consumer_version()
    assert (copy.consumer_version, sampler.consumer_version, copy.is_shared) == (6, 5, False)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_see_consumer_version_and_a_scheduled_max_staleness_set_in_the_main_process(start_method):
    rb = stale_rb([1, 1, 1, 1], consumer_version=1, batch_size=4, capacity=32, max_staleness=0)
    dataset = rb.as_dataset(num_batches=4)
    assert rb.sampler.is_shared
    loader = DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, num_workers=2,
                        multiprocessing_context=start_method, timeout=TIMEOUT, persistent_workers=True,
                        generator=torch.Generator().manual_seed(0))

    def drawn():
        return set(torch.cat([batch["obs"] for batch in loader]).tolist())

    assert drawn() == {0, 1, 2, 3}
    rb.extend(data([2, 2, 2, 2], start=10))  # a newer policy's data, then the learner moves on
    rb.sampler.increment_consumer_version()
    assert drawn() == {10, 11, 12, 13}  # the old data is too stale now, in every worker
    scheduler = StepScheduler(rb, "max_staleness", gamma=1, mode="additive")
    scheduler.step()  # max_staleness 1: both versions again
    both = drawn()
    assert both <= {0, 1, 2, 3, 10, 11, 12, 13} and {x < 10 for x in both} == {True, False}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_dataset_that_does_not_share_the_sampler_is_refused_with_workers():
    rb = stale_rb([0, 1, 2, 3], consumer_version=3, batch_size=2)
    loader = DataLoader(rb.as_dataset(num_batches=2, share_sampler=False), batch_size=None,
                        collate_fn=tensordict_collate, num_workers=1, multiprocessing_context="fork", timeout=TIMEOUT)
    with pytest.raises(RuntimeError, match=r"StalenessAwareSampler requires shared state.*share_sampler=True") as info:
        list(loader)
    info.value.__traceback__ = None
    assert len(list(DataLoader(rb.as_dataset(num_batches=2), batch_size=None, collate_fn=tensordict_collate))) == 2
