"""Stateful samplers in DataLoader workers: prioritized and without-replacement state in shared memory (issue 13).

Every multi-process test gives its DataLoader a ``timeout`` and itself a ``pytest.mark.timeout``, so that a
deadlock fails instead of hanging. Data is small; spawn/forkserver workers cost seconds each, so the grid over
worker counts, storage sizes and ``drop_last`` runs under fork, and spawn/forkserver run a few cases (the rest
are ``slow``).
"""

from __future__ import annotations

import copy
import math
import multiprocessing as mp
import os
import pickle
import signal
import time

import numpy as np
import pytest
import torch
from helpers.factories import make_buffer, make_data
from tensordict import TensorDict
from torch.utils.data import DataLoader, get_worker_info

from torchrl.data import (
    EpochEnded,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBufferEnsemble,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    SliceSamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers.samplers.segment_tree import SumSegmentTree
from torchrl.envs.transforms import Transform

TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging


def wor_buffer(size: int, batch_size: int = 4, drop_last: bool = False, **kwargs) -> TensorDictReplayBuffer:
    sampler = SamplerWithoutReplacement(drop_last=drop_last)
    return make_buffer(cls=TensorDictReplayBuffer, capacity=64, sampler=sampler, batch_size=batch_size,
                       data=make_data(size), **kwargs)  # fmt: skip


def prioritized_buffer(size: int, capacity: int = 64, batch_size: int = 8, **kwargs) -> TensorDictPrioritizedReplayBuffer:
    kwargs.setdefault("alpha", 0.7)
    kwargs.setdefault("beta", 0.5)
    return make_buffer(cls=TensorDictPrioritizedReplayBuffer, capacity=capacity, batch_size=batch_size,
                       data=make_data(size), **kwargs)  # fmt: skip


def loader(dataset, num_workers: int, start_method: str = "fork", **kwargs) -> DataLoader:
    if num_workers:
        kwargs.update(num_workers=num_workers, multiprocessing_context=start_method, timeout=TIMEOUT)
    return DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, **kwargs)


def epoch_ids(dl) -> list[list[int]]:
    return [batch["idx"].tolist() for batch in dl]


def assert_exactly_once(batches: list[list[int]], size: int, batch_size: int, drop_last: bool) -> None:
    seen = [i for b in batches for i in b]
    assert len(seen) == len(set(seen)), "an index was drawn twice in one epoch"
    if drop_last:
        assert len(seen) == size - size % batch_size and set(seen) <= set(range(size))
        assert all(len(b) == batch_size for b in batches)
    else:
        assert sorted(seen) == list(range(size))
        assert sorted(len(b) for b in batches)[1:] == [batch_size] * (len(batches) - 1)  # one short at most


def release(err_info) -> None:
    """Drops the traceback of a DataLoader error, so its workers are freed now (see test_dataloader.py)."""
    err_info.value.__traceback__ = None


# -- sharing, in one process ----------------------------------------------------------------------------------------
def test_sharing_a_prioritized_sampler_keeps_its_state_and_a_pickled_copy_is_private():
    rb = prioritized_buffer(20)
    rb.update_priority(torch.arange(20), torch.arange(20).float())
    before = rb.sampler.state_dict()
    assert not rb.sampler.is_shared
    assert rb.sampler.share_memory_() is rb.sampler and rb.sampler.is_shared
    after = rb.sampler.state_dict()
    for key in ("_priority",):
        assert torch.equal(before[key].nan_to_num(-1), after[key].nan_to_num(-1))
    assert torch.equal(before["_sum_tree"]["values"], after["_sum_tree"]["values"])
    assert before["_max_priority"] == after["_max_priority"] == (19.0, 19)
    for copied in (pickle.loads(pickle.dumps(rb.sampler)), copy.deepcopy(rb.sampler)):
        assert not copied.is_shared  # by value: private
        copied.update_priority(torch.tensor([0]), torch.tensor([100.0]))
        assert rb.sampler.state_dict()["_max_priority"][0] == 19.0
        assert copied.share_memory_().is_shared  # a private copy can be shared again
    rb.sampler.beta = 0.25  # configuration lives in the shared scalars too
    assert rb.sampler.beta == 0.25 and rb.sampler.state_dict()["_beta"] == 0.25


def test_sharing_a_sampler_without_replacement_mid_epoch_continues_that_epoch():
    private, shared = wor_buffer(10, generator=torch.Generator().manual_seed(0)), None
    first = private.sample()["idx"].tolist()
    shared = pickle.loads(pickle.dumps(private))  # the same state, to compare with
    shared.sampler.share_memory_()
    assert shared.sampler.is_shared and not private.sampler.is_shared
    assert shared.sampler._sample_list.tolist() == private.sampler._sample_list.tolist()
    rest = [private.sample()["idx"].tolist() for _ in range(2)]
    assert [shared.sample()["idx"].tolist() for _ in range(2)] == rest
    assert sorted(first + sum(rest, [])) == list(range(10)) and shared.sampler.ran_out


def test_shared_without_replacement_state_dict_round_trips_and_loads_a_larger_permutation_after_sharing():
    rb = wor_buffer(12)
    rb.sampler.share_memory_()
    rb.sample()
    state = rb.sampler.state_dict()
    assert state["len_storage"] == 12 and len(state["_sample_list"]) == 8  # 4 drawn
    fresh = wor_buffer(12)
    fresh.sampler.load_state_dict(state)  # into a private sampler
    rest = [fresh.sample()["idx"] for _ in range(2)]
    assert torch.cat(rest).tolist() == state["_sample_list"].tolist()
    assert state["_seed"] is not None  # a shared epoch is a seed: another shared sampler loads it as such
    other = SamplerWithoutReplacement().share_memory_()
    other.load_state_dict(state)
    assert torch.equal(other.state_dict()["_sample_list"], state["_sample_list"]) and other.state_dict()["_seed"] == state["_seed"]
    private = wor_buffer(12)
    private.sample()
    private_state = private.sampler.state_dict()  # an explicit permutation (no seed)
    assert private_state["_seed"] is None
    small = SamplerWithoutReplacement().share_memory_()  # shared with no epoch: the array grows for it
    small.load_state_dict(private_state)
    assert torch.equal(small.state_dict()["_sample_list"], private_state["_sample_list"]) and small.is_shared
    stale = pickle.loads(pickle.dumps(rb.sampler))  # by value: private, loads anything
    stale.load_state_dict(private_state)
    fits = wor_buffer(12)
    fits.sample()
    fits.sampler.share_memory_()  # shared mid-epoch: room for a permutation of 12
    fits.sampler.load_state_dict(private_state)
    assert torch.equal(fits.sampler.state_dict()["_sample_list"], private_state["_sample_list"])


def test_stateful_component_skips_a_shared_sampler_and_sharing_a_stateless_one_is_a_no_op():
    rb = wor_buffer(8)
    assert rb.stateful_component()[0] == "sampler"
    rb.sampler.share_memory_()
    assert rb.stateful_component() is None
    assert RandomSampler().share_memory_().is_shared is False  # nothing to share


class _PrivateStateSampler(RandomSampler):
    """A stateful sampler that cannot share its state (the default for samplers that do not declare it)."""

    requires_shared_state = True
    can_share_state = False


def test_a_sampler_that_cannot_share_raises_naming_the_ones_that_can():
    with pytest.raises(RuntimeError, match="can_share_state=False.*PrioritizedSampler.*SamplerWithoutReplacement"):
        _PrivateStateSampler().share_memory_()
    ensemble = SamplerEnsemble(SamplerWithoutReplacement(), _PrivateStateSampler())
    assert not ensemble.can_share_state
    with pytest.raises(RuntimeError, match="_PrivateStateSampler"):
        ensemble.share_memory_()
    assert not ensemble[0].is_shared  # nothing was shared
    both = SamplerEnsemble(SamplerWithoutReplacement(), PrioritizedSampler(8, 0.5, 0.5), RandomSampler())
    assert both.can_share_state and not both.is_shared
    assert both.share_memory_().is_shared and both[0].is_shared and both[1].is_shared


def test_share_sampler_must_be_a_bool():
    with pytest.raises(TypeError, match=r"`share_sampler` must be a bool, got 'yes'"):
        wor_buffer(8).as_dataset(share_sampler="yes")
    rb = wor_buffer(8)
    rb.as_dataset(share_sampler=False)
    assert not rb.sampler.is_shared
    rb.as_dataset()
    assert rb.sampler.is_shared


def _pinned_wor_buffer(share: bool) -> TensorDictReplayBuffer:
    """10 items without replacement, the epoch pinned; the sampler's state in shared memory with ``share``."""
    rb = wor_buffer(10)
    if share:
        rb.sampler.share_memory_()
    rb.pin_epoch()
    return rb


@pytest.mark.parametrize("share", [False, True], ids=["private", "shared"])
def test_a_pinned_epoch_ends_at_its_last_batch_and_keeps_its_length_when_the_storage_grows(share):
    rb = _pinned_wor_buffer(share)
    first = rb.sample()["idx"].tolist()
    rb.extend(make_data(4, start=10))  # written during the epoch: joins the next one
    rest = [rb.sample()["idx"].tolist() for _ in range(2)]
    assert sorted(first + sum(rest, [])) == list(range(10))
    with pytest.raises(EpochEnded):
        rb.sample()
    rb.unpin_epoch()
    nxt = [rb.sample()["idx"].tolist() for _ in range(4)]
    assert sorted(sum(nxt, [])) == list(range(14))  # the next epoch covers the new items


@pytest.mark.parametrize("share", [False, True], ids=["private", "shared"])
def test_a_pinned_epoch_ends_when_the_storage_shrinks_under_it(share):
    rb = _pinned_wor_buffer(share)
    rb.sample()
    rb.empty()
    rb.extend(make_data(6))
    with pytest.raises(EpochEnded):
        rb.sample()


def test_num_batches_none_is_one_epoch_without_workers_and_endless_for_prioritized():
    rb = wor_buffer(10)
    assert_exactly_once(epoch_ids(loader(rb.as_dataset(), 0)), 10, 4, False)
    assert_exactly_once(epoch_ids(loader(rb.as_dataset(), 0)), 10, 4, False)
    assert rb.sample().shape == (4,)  # unpinned after the iteration: draws run on
    prb = prioritized_buffer(10)
    it = iter(loader(prb.as_dataset(), 0))
    assert len([next(it) for _ in range(20)]) == 20


# -- a writer dying in the middle of a write --------------------------------------------------------------------
def _die_mid_write_prioritized(sampler) -> None:
    guard = sampler._guard
    guard.acquire(sampler._repair_state)
    guard.begin_write()
    sampler._priority[:4] = 5.0  # raw priorities written, trees not: what a writer killed mid-update leaves
    os._exit(0)


def _die_mid_write_epoch(sampler) -> None:
    state = sampler._epoch_state
    state._guard.acquire(state._restart)
    state._guard.begin_write()
    state._c[3] = 999  # a torn cursor (slot 3: the position in the epoch)
    os._exit(0)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_writer_that_dies_mid_write_is_repaired_by_the_next_holder():
    rb = prioritized_buffer(8, eps=0.0, alpha=1.0)
    rb.sampler.share_memory_()
    child = mp.get_context("fork").Process(target=_die_mid_write_prioritized, args=(rb.sampler,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    _, info = rb.sample(return_info=True)  # repairs first: the trees now hold the raw priorities
    values = rb.sampler.state_dict()["_sum_tree"]["values"]
    assert values[:8].tolist() == [5.0] * 4 + [1.0] * 4
    assert rb.sampler._sum_tree.query(0, 8) == pytest.approx(24.0)
    assert rb.sampler.default_priority == 5.0

    wor = wor_buffer(10)
    wor.sampler.share_memory_()
    wor.sample()
    child = mp.get_context("fork").Process(target=_die_mid_write_epoch, args=(wor.sampler,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    # the torn epoch is dropped: a new one starts and covers every item once
    assert sorted(torch.cat([wor.sample()["idx"] for _ in range(3)]).tolist()) == list(range(10))


# -- without replacement: exactly once per epoch across workers ------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("size", [24, 22], ids=["divides", "does-not-divide"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_without_replacement_exactly_once_per_epoch_fork(num_workers, size, drop_last):
    rb = wor_buffer(size, drop_last=drop_last, generator=torch.Generator().manual_seed(0))
    dl = loader(rb.as_dataset(), num_workers, "fork", generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # two epochs, each exactly once
        assert_exactly_once(epoch_ids(dl), size, 4, drop_last)


SPAWN_CASES = [
    pytest.param("spawn", 2, 22, False, id="spawn-2-22"),
    pytest.param("forkserver", 2, 22, True, id="forkserver-2-22-drop_last"),
    pytest.param("spawn", 1, 24, True, id="spawn-1-24-drop_last", marks=pytest.mark.slow),
    pytest.param("spawn", 3, 22, True, id="spawn-3-22-drop_last", marks=pytest.mark.slow),
    pytest.param("forkserver", 1, 22, False, id="forkserver-1-22", marks=pytest.mark.slow),
    pytest.param("forkserver", 3, 24, False, id="forkserver-3-24", marks=pytest.mark.slow),
]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("start_method,num_workers,size,drop_last", SPAWN_CASES)
def test_without_replacement_exactly_once_per_epoch_spawn_forkserver(start_method, num_workers, size, drop_last):
    rb = wor_buffer(size, drop_last=drop_last)
    # persistent workers: the (slow) start-up happens once for both epochs
    dl = loader(rb.as_dataset(), num_workers, start_method, persistent_workers=True)
    for _ in range(2):
        assert_exactly_once(epoch_ids(dl), size, 4, drop_last)


class _SlowInWorkerZero(Transform):
    """Sleeps in DataLoader worker 0 only: the workers draw at different speeds."""

    def forward(self, td):
        info = get_worker_info()
        if info is not None and info.id == 0:
            time.sleep(0.05)
        return td


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [2, 3])
def test_a_slow_worker_does_not_change_exactly_once(num_workers):
    rb = wor_buffer(30, transform=_SlowInWorkerZero())
    dl = loader(rb.as_dataset(), num_workers, persistent_workers=True)
    for _ in range(2):
        assert_exactly_once(epoch_ids(dl), 30, 4, False)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("slice_sampler", [False, True], ids=["items", "slices"])
def test_two_seeded_runs_with_a_slow_worker_draw_identical_batches(slice_sampler):
    def run():
        if slice_sampler:
            rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8, transform=_SlowInWorkerZero(),
                                        sampler=SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode"))
            rb.extend(TensorDict(episode=torch.arange(60) // 6, idx=torch.arange(60), batch_size=[60]))
        else:
            rb = wor_buffer(30, transform=_SlowInWorkerZero())
        torch.manual_seed(0)  # seeds the DataLoader's base seed, hence the epochs' permutations
        dl = loader(rb.as_dataset(), 2, persistent_workers=True)
        return [epoch_ids(dl) for _ in range(2)]

    first, second = run(), run()
    assert first == second
    if not slice_sampler:
        for epoch in first:
            assert_exactly_once(epoch, 30, 4, False)
        assert first[0] != first[1]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_num_batches_spanning_epochs_with_persistent_workers_is_exactly_once_per_epoch():
    rb = wor_buffer(24, generator=torch.Generator().manual_seed(0))  # 6 batches an epoch
    dl = loader(rb.as_dataset(num_batches=9), 2, persistent_workers=True, generator=torch.Generator().manual_seed(1))
    batches = epoch_ids(dl) + epoch_ids(dl)  # 18 batches: 3 epochs, the second one across the two iterations
    for start in (0, 6, 12):
        assert_exactly_once(batches[start : start + 6], 24, 4, False)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_items_written_mid_epoch_join_the_next_epoch_with_workers():
    rb = wor_buffer(40)
    dl = loader(rb.as_dataset(), 2, persistent_workers=True)
    it = iter(dl)
    batches = [next(it)["idx"].tolist()]
    rb.extend(make_data(8, start=40))  # the storage grows while the workers are in the epoch
    batches += [b["idx"].tolist() for b in it]
    assert_exactly_once(batches, 40, 4, False)  # the epoch in progress covers the 40 items it started with
    assert_exactly_once(epoch_ids(dl), 48, 4, False)  # the next one all 48


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_slice_sampler_without_replacement_gives_each_trajectory_once_per_epoch_with_workers():
    episode = torch.arange(60) // 10  # 6 trajectories of 10 steps
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8,
                                sampler=SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode"))
    rb.extend(TensorDict(episode=episode, idx=torch.arange(60), batch_size=[60]))
    dl = loader(rb.as_dataset(), 2)
    for _ in range(2):
        slices = [b["episode"].view(-1, 4) for b in dl]
        assert all((s == s[:, :1]).all() for s in slices)  # each slice within one trajectory
        assert sorted(torch.cat([s[:, 0] for s in slices]).tolist()) == list(range(6))


# -- prioritized --------------------------------------------------------------------------------------------------
def _chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    """Upper tail of the chi-square statistic (Wilson-Hilferty normal approximation)."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    k = observed.size - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_prioritized_frequencies_match_priorities_with_two_workers():
    n, alpha = 40, 0.7
    rb = prioritized_buffer(n, batch_size=256, alpha=alpha, generator=torch.Generator().manual_seed(0))
    priority = 1.0 + torch.arange(n) % 5
    rb.update_priority(torch.arange(n), priority)
    dl = loader(rb.as_dataset(num_batches=80), 2, generator=torch.Generator().manual_seed(0))
    index = torch.cat([b["index"] for b in dl])
    assert index.numel() == 80 * 256  # >= 20k draws
    observed = np.bincount(index.numpy(), minlength=n).astype(float)
    q = (priority.double() + rb.sampler.eps) ** alpha
    assert _chi_square_p_value(observed, (q / q.sum()).numpy() * index.numel()) > 1e-4
    uniform = np.full(n, index.numel() / n)
    assert _chi_square_p_value(observed, uniform) < 1e-6  # the test tells the two apart


def _expected_weights(index: torch.Tensor, priority: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    q = priority.double() ** alpha
    return ((q[index] / q[q > 0].min()) ** -beta).float()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "start_method", ["fork", pytest.param("spawn", marks=pytest.mark.slow), pytest.param("forkserver", marks=pytest.mark.slow)]
)
def test_priorities_set_in_the_main_process_reach_the_workers(start_method):
    n, alpha, beta, workers, prefetch = 50, 0.7, 0.5, 2, 2
    rb = prioritized_buffer(n, batch_size=16, alpha=alpha, beta=beta, eps=0.0)
    dl = loader(rb.as_dataset(), workers, start_method, prefetch_factor=prefetch)
    it = iter(dl)
    first = [next(it) for _ in range(3)]
    assert len({i for b in first for i in b["index"].tolist()}) > 10
    chosen = torch.arange(0, 50, 5)  # all the mass moves to 10 indices
    priority = torch.zeros(n)
    priority[chosen] = torch.arange(1, 11).float()
    rb.update_priority(torch.arange(n), priority)
    bound = prefetch * workers + workers  # batches already in flight, plus one being drawn per worker
    later = [next(it) for _ in range(bound + 10)]
    for b in later[bound:]:
        assert set(b["index"].tolist()) <= set(chosen.tolist())
        # the weights of a worker's batch follow the single-process formula for the tree the main process set
        assert torch.allclose(b["priority_weight"], _expected_weights(b["index"], priority, alpha, beta))
    del it


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_new_items_written_in_the_main_process_get_the_max_priority_in_the_workers():
    rb = prioritized_buffer(20, batch_size=16, eps=0.0, alpha=1.0)
    rb.update_priority(torch.arange(20), torch.full((20,), 1.0))
    it = iter(loader(rb.as_dataset(), 2, prefetch_factor=2))
    next(it)
    rb.extend(make_data(5, start=20))  # the new items get the max priority seen (1.0)
    rb.update_priority(torch.arange(20), torch.zeros(20))  # nothing old can be drawn any more
    later = [next(it)["index"] for _ in range(16)]
    assert set(torch.cat(later[6:]).tolist()) <= set(range(20, 25))
    del it


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_prioritized_slice_sampler_priorities_reach_the_workers():
    episode = torch.arange(40) // 10
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=16,
                                sampler=PrioritizedSliceSampler(100, alpha=1.0, beta=1.0, eps=0.0, slice_len=4,
                                                                traj_key="episode"))
    rb.extend(TensorDict(episode=episode, idx=torch.arange(40), batch_size=[40]))
    it = iter(loader(rb.as_dataset(), 2, prefetch_factor=2))
    next(it)
    priority = torch.zeros(40)
    priority[[3, 21]] = 1.0
    rb.update_priority(torch.arange(40), priority)
    later = [next(it) for _ in range(12)]
    for b in later[6:]:
        assert set(b["idx"].view(4, 4)[:, 0].tolist()) <= {3, 21}
    del it


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_stress_updates_and_extends_in_the_main_process_while_two_workers_sample():
    capacity = 300
    rb = prioritized_buffer(100, capacity=capacity, batch_size=32, generator=torch.Generator().manual_seed(0))
    it = iter(loader(rb.as_dataset(), 2, prefetch_factor=2))
    written, deadline, steps = 100, time.monotonic() + 4.0, 0
    while time.monotonic() < deadline:
        batch = next(it)
        index, weight = batch["index"], batch["priority_weight"]
        assert ((index >= 0) & (index < len(rb))).all()  # never outside the filled part
        assert torch.isfinite(weight).all() and ((weight > 0) & (weight <= 1 + 1e-6)).all()
        assert (batch["idx"] % capacity == index).all()  # the row read is the row drawn
        rb.update_priority(index, torch.rand(index.numel()) * 10)
        rb.extend(make_data(7, start=written))  # wraps around the ring after a while
        written += 7
        steps += 1
    del it
    assert steps > 10 and written > capacity
    state = rb.sampler.state_dict()
    leaves = state["_sum_tree"]["values"].double()
    assert rb.sampler._sum_tree.query() == pytest.approx(float(leaves.sum()), rel=1e-9)
    assert rb.sampler._min_tree.query() == float(state["_min_tree"]["values"].min())
    reference = SumSegmentTree(leaves.numel())  # the trees hold positions up to a power of two above capacity
    reference.update(torch.arange(leaves.numel()), leaves)
    for end in (1, 17, 150, capacity):  # every level agrees with a tree rebuilt from the leaves
        assert rb.sampler._sum_tree.query(0, end) == pytest.approx(reference.query(0, end), rel=1e-9)
    known = ~torch.isnan(state["_priority"])
    q = (state["_priority"][known].double() + rb.sampler.eps) ** rb.sampler.alpha
    assert torch.allclose(leaves[known], q)  # the tree holds the raw priorities, transformed


class _HoldingSampler(PrioritizedSampler):
    """Worker 0 of a DataLoader, at its third draw (the first one made after the main process took a batch: the
    first two fill its prefetch slots), writes its pid to ``pid_path`` and sleeps inside the locked section of
    ``sample`` (where the trees are read), holding the sampler's lock."""

    pid_path: str | None = None
    draws = 0

    def _draw_locked(self, storage, u, n):
        info = get_worker_info()
        if self.pid_path is not None and info is not None and info.id == 0:
            self.draws += 1
            if self.draws == 3:
                with open(self.pid_path, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(600)
        return super()._draw_locked(storage, u, n)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_worker_killed_while_holding_the_lock_leaves_the_buffer_usable(tmp_path):
    sampler = _HoldingSampler(64, alpha=0.7, beta=0.5)
    sampler.pid_path = str(tmp_path / "pid")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler, batch_size=8)
    rb.extend(make_data(30))
    dl = DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate, num_workers=2,
                    multiprocessing_context="fork", timeout=20, prefetch_factor=2)
    it = iter(dl)
    next(it)  # worker 0 is sent its third index
    deadline = time.monotonic() + 60
    while not os.path.exists(sampler.pid_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the pid is written: the worker sleeps with the lock held
    pid = int(open(sampler.pid_path).read())
    # torch's SIGCHLD handler raises the worker's death wherever the main thread is when the signal arrives,
    # so the kill happens inside the block that expects it
    with pytest.raises(RuntimeError, match="DataLoader worker") as err:
        os.kill(pid, signal.SIGKILL)
        for _ in range(1000):
            next(it)
    release(err)
    del it
    # the kernel released the lock of the dead worker: the main process samples, updates and saves
    _, info = rb.sample(return_info=True)
    rb.update_priority(info["index"], torch.full((8,), 3.0))
    rb.dumps(tmp_path / "ckpt")
    assert rb.sampler.default_priority == 3.0


# -- snapshots while workers run -----------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_state_dict_and_dumps_while_workers_sample_load_into_a_fresh_buffer(tmp_path):
    rb = prioritized_buffer(40)
    it = iter(loader(rb.as_dataset(), 2))
    for _ in range(5):
        batch = next(it)
        rb.update_priority(batch["index"], torch.rand(8) + 0.1)
    state = rb.sampler.state_dict()
    rb.dumps(tmp_path / "prioritized")
    del it
    leaves = state["_sum_tree"]["values"].double()
    known = ~torch.isnan(state["_priority"])
    assert torch.allclose(leaves[known], (state["_priority"][known].double() + state["_eps"]) ** state["_alpha"])
    fresh = prioritized_buffer(0)
    fresh.loads(tmp_path / "prioritized")
    loaded = fresh.sampler.state_dict()
    assert torch.equal(loaded["_priority"].nan_to_num(-1), rb.sampler.state_dict()["_priority"].nan_to_num(-1))
    batches = [b for _, b in zip(range(4), loader(fresh.as_dataset(), 2))]  # shared again, with workers
    assert fresh.sampler.is_shared and all(b["index"].max() < 40 for b in batches)

    wor = wor_buffer(40)
    dl = loader(wor.as_dataset(num_batches=10_000), 2)  # workers run on across epochs
    it = iter(dl)
    next(it)
    snapshot = wor.sampler.state_dict()
    wor.dumps(tmp_path / "wor")
    del it
    rest = snapshot["_sample_list"]
    assert sorted(rest.tolist()) == list(range(40))  # the workers draw by number: the cursor stays at 0
    assert snapshot["_plan"]["total"] == 10_000  # the iteration's plan, which a resumed iteration rejoins
    fresh = wor_buffer(0)
    fresh.loads(tmp_path / "wor")
    assert fresh.sampler.state_dict()["_plan"] == {**snapshot["_plan"], "records": fresh.sampler.state_dict()[
        "_plan"]["records"]}
    # shared again, a new iteration: it starts after the 10_000 planned batches (an epoch boundary), exactly once
    seen = [i for b in epoch_ids(loader(fresh.as_dataset(), 2)) for i in b]
    assert sorted(seen) == list(range(40))


# -- ensembles and refusals --------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_an_ensemble_of_shareable_samplers_is_shared_and_priorities_reach_the_workers():
    a = prioritized_buffer(10, eps=0.0, alpha=1.0, batch_size=4)
    b = prioritized_buffer(10, eps=0.0, alpha=1.0, batch_size=4)
    ensemble = ReplayBufferEnsemble(a, b, batch_size=8, sample_from_all=True)
    dl = loader(ensemble.as_dataset(), 2, prefetch_factor=2)
    assert ensemble.sampler.is_shared and a.sampler.is_shared and b.sampler.is_shared
    it = iter(dl)
    next(it)
    a.update_priority(torch.arange(10), (torch.arange(10) == 7).float())
    later = [next(it) for _ in range(12)]
    for batch in later[6:]:
        assert batch[0]["idx"].unique().tolist() == [7]
    del it


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_refusals_for_the_opt_out_and_for_samplers_that_cannot_share(start_method):
    rb = wor_buffer(20)
    dl = loader(rb.as_dataset(num_batches=2, share_sampler=False), 1, start_method)
    with pytest.raises(RuntimeError, match="SamplerWithoutReplacement.*share_sampler=False.*num_workers=0") as err:
        list(dl)
    release(err)
    private = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=_PrivateStateSampler(), batch_size=4)
    private.extend(make_data(20))
    dl = loader(private.as_dataset(num_batches=2), 1, "fork")
    with pytest.raises(RuntimeError, match="_PrivateStateSampler.*samplers that can are PrioritizedSampler") as err:
        list(dl)
    release(err)
    assert not private.sampler.is_shared
