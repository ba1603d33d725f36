"""PrioritizedSliceSampler on the live trajectory index (issue 30 item 1).

NOTE [prioritized slice starts] (samplers/prioritized_slice.py): starts are drawn from the whole priority tree
and redrawn when they land on a step that cannot start a slice, the eligibility read from the trajectory index
kept up to date on each write (NOTE [live trajectory index]), so a draw after a write costs no pass over the
storage. The draws for a generator state changed with this (the previous version summed the priorities of
every start), so these tests check the distribution against the priorities (chi-square), including the exact
fallback taken when most of the mass lies on steps that cannot start a slice; that the live index and the
from-scratch table give the same draws; that the index follows appends (wrap-around included) without
rebuilding, in DataLoader workers too; ``can_sample`` without a pass when a probe finds a start; and the state
round trip.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers.assertions import check_slices, chi2, chi2_crit, reference_runs
from helpers.factories import TRUNC, episodes, make_buffer, ring_write
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.utils.data import DataLoader, get_worker_info

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    TensorDictReplayBuffer,
    tensordict_collate,
)

LEVELS = np.array([0.0, 0.5, 1.0, 2.0, 4.0])  # priorities exact in float32: q = p with alpha=1, eps=0


class FromScratch(PrioritizedSliceSampler):
    """The same sampler without the live index: boundaries and start table from a read of the storage."""

    def _uses_live_index(self) -> bool:
        return False


def make(cls=PrioritizedSliceSampler, capacity=64, **kwargs):
    kwargs.setdefault("traj_key", "episode")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a left span is ignored with a warning (tested elsewhere)
        return cls(capacity, alpha=1.0, beta=0.5, eps=0.0, **kwargs)


def ring_storage(lengths, capacity, chunk=7):
    """A storage the episodes of ``lengths`` were written into in chunks, round robin (the ring may wrap)."""
    storage = LazyTensorStorage(capacity)
    data = episodes(lengths)
    cursor = 0
    for start in range(0, data.shape[0], chunk):
        cursor = ring_write(storage, data[start : start + chunk], cursor)
    return storage


def expected_starts(storage, slice_len, right, strict, priority) -> np.ndarray:
    """Brute force: the probability of each storage row to start a slice (its priority over the sum of those
    of every row followed by ``slice_len - right - 1`` steps of its trajectory, or first in it without
    strict)."""
    where = reference_runs(storage, "episode", is_done=False)
    length = {}
    for run, pos in where.values():
        length[run] = max(length.get(run, 0), pos + 1)
    need = slice_len - right
    p = np.zeros(len(storage))
    for (row, _), (run, pos) in where.items():
        if length[run] - pos >= need or (not strict and pos == 0):
            p[row] = priority[row]
    return p / p.sum()


def start_counts(sampler, storage, slice_len, draws, batches=10) -> np.ndarray:
    counts = np.zeros(len(storage))
    for _ in range(batches):
        index, info = sampler.sample(storage, draws // batches * slice_len)
        ends = info[TRUNC].squeeze(-1).nonzero().squeeze(-1)  # a slice's last step (slices may be shorter)
        firsts = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1] + 1])
        np.add.at(counts, index[0][firsts].numpy(), 1)
    return counts


# -- the distribution ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "span, strict, slice_len",
    [(False, True, 4), ((False, 2), True, 4), ((False, True), False, 3), (False, False, 5)],
)
def test_starts_follow_the_priorities_of_the_steps_that_can_start_a_slice(span, strict, slice_len):
    storage = ring_storage([3, 9, 6, 1, 12, 5, 8, 7, 4], 40)  # 55 steps in 40 rows: the ring wrapped
    sampler = make(slice_len=slice_len, span=span, strict_length=strict)
    gen = np.random.default_rng(0)
    priority = LEVELS[gen.integers(0, LEVELS.size, 40)]
    sampler.extend(torch.arange(40))
    sampler.update_priority(torch.arange(40), torch.from_numpy(priority))
    sampler._rng = torch.Generator().manual_seed(1)
    right = {False: 0, (False, 2): 2, (False, True): slice_len - 1}[span]
    p = expected_starts(storage, slice_len, right, strict, priority)
    counts = start_counts(sampler, storage, slice_len, 20000)
    assert (counts[p == 0] == 0).all()  # never a step that cannot start a slice, nor one of priority zero
    keep = p > 0
    assert chi2(counts[keep], p[keep]) < chi2_crit(int(keep.sum()) - 1)
    assert sampler.trajectory_index_stats["rebuilds"] == 1  # the live index, built once


def test_mass_on_steps_that_cannot_start_a_slice_still_gives_the_distribution():
    """The rounds of draws from the whole tree mostly land on the trajectories' last steps (``1e4`` times the
    priority of a start): the slices still missing come from the exact cumulative sum, with the same law."""
    storage = ring_storage([10] * 5, 50)
    sampler = make(capacity=50, slice_len=4)
    priority = np.ones(50)
    priority[np.arange(50) % 10 >= 7] = 1e4  # the steps no slice of 4 can start from
    priority[[0, 11, 22]] = 4.0
    sampler.extend(torch.arange(50))
    sampler.update_priority(torch.arange(50), torch.from_numpy(priority))
    sampler._rng = torch.Generator().manual_seed(2)
    p = expected_starts(storage, 4, 0, True, priority)
    counts = start_counts(sampler, storage, 4, 8000)
    keep = p > 0
    assert (counts[~keep] == 0).all()
    assert chi2(counts[keep], p[keep]) < chi2_crit(int(keep.sum()) - 1)


def test_only_steps_that_cannot_start_a_slice_have_priority():
    storage = ring_storage([10] * 4, 40)
    sampler = make(capacity=40, slice_len=4)
    sampler.extend(torch.arange(40))
    priority = torch.zeros(40)
    priority[torch.arange(40) % 10 >= 7] = 1.0
    sampler.update_priority(torch.arange(40), priority)
    assert not sampler.can_sample(storage, 8)
    with pytest.raises(RuntimeError, match="priority zero"):
        sampler.sample(storage, 8)
    priority[13] = 1e-6  # one start with a tiny share of the mass: the probes miss it, the exact sum does not
    sampler.update_priority(torch.arange(40), priority)
    assert sampler.can_sample(storage, 8)
    index, _ = sampler.sample(storage, 8)
    assert index[0].tolist() == [13, 14, 15, 16] * 2


# -- the live index and the table from scratch give the same draws -------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=16),
    capacity=st.integers(8, 48),
    slice_len=st.integers(1, 5),
    span=st.sampled_from([False, (False, 1), (False, True)]),
    strict=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_live_and_from_scratch_draws_are_the_same(lengths, capacity, slice_len, span, strict, seed):
    storage = ring_storage(lengths, capacity)
    n = len(storage)
    gen = np.random.default_rng(seed)
    priority = torch.from_numpy(LEVELS[gen.integers(0, LEVELS.size, n)])
    priority[int(gen.integers(0, n))] = 1.0
    samplers = [make(cls, capacity=capacity, slice_len=slice_len, span=span, strict_length=strict)
                for cls in (PrioritizedSliceSampler, FromScratch)]  # fmt: skip
    outs = []
    for sampler in samplers:
        sampler.extend(torch.arange(n))
        sampler.update_priority(torch.arange(n), priority)
        sampler._rng = torch.Generator().manual_seed(seed)
        try:
            outs.append([sampler.sample(storage, 6 * slice_len) for _ in range(3)])
        except RuntimeError as err:
            outs.append(str(err))
    live, scratch = outs
    assert type(live) is type(scratch)
    if isinstance(live, str):
        assert live == scratch and ("long enough" in live or "priority zero" in live)
        return
    for (index, info), (index2, info2) in zip(live, scratch):
        assert torch.equal(index[0], index2[0])
        assert info.keys() == info2.keys() and all(torch.equal(info[k], info2[k]) for k in info)
    if strict and span is False:
        check_slices(live[0][0], reference_runs(storage, "episode", is_done=False), slice_len)


def test_the_index_follows_appends_and_wraps_without_a_rebuild():
    """Through a buffer: every extend (200 rows, cutting the oldest trajectory once the ring is full) is
    caught up in O(rows written); the draws stay those of a sampler reading the whole storage."""

    def buffer(cls):
        sampler = make(cls, capacity=1000, slice_len=8)
        rb = make_buffer(cls=TensorDictReplayBuffer, capacity=1000, sampler=sampler, batch_size=64)
        sampler._rng = torch.Generator().manual_seed(0)
        return rb

    rbs = [buffer(PrioritizedSliceSampler), buffer(FromScratch)]
    t = 0
    for step in range(12):
        data = episodes([37, 51, 60, 52], first_episode=4 * step, first_step=t)  # 200 rows
        t += 200
        batches = []
        for rb in rbs:
            rb.extend(data)
            batches.append(rb.sample())
            rb.update_priority(batches[-1]["index"], batches[-1]["t"].double() % 7)
        assert torch.equal(batches[0]["index"], batches[1]["index"])
        assert torch.equal(batches[0]["priority_weight"], batches[1]["priority_weight"])
        t_batch = batches[0]["t"].view(8, 8)
        assert (t_batch.diff(dim=1) == 1).all()  # consecutive steps, never across the ring's seam
        assert (batches[0]["episode"].view(8, 8) == batches[0]["episode"].view(8, 8)[:, :1]).all()
    assert rbs[0].sampler.trajectory_index_stats == {"rebuilds": 1, "catch_ups": 11}


def test_a_draw_after_a_write_reads_no_start_table(monkeypatch):
    """The O(N) table of every start is built only for the exact fallback (and from-scratch boundaries)."""
    calls = []
    table = PrioritizedSliceSampler._start_table
    monkeypatch.setattr(
        PrioritizedSliceSampler, "_start_table", lambda self, *a: calls.append(1) or table(self, *a)
    )
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(500), sampler=make(capacity=500, slice_len=4),
                                batch_size=32)  # fmt: skip
    for step in range(8):
        rb.extend(episodes([30, 40], first_episode=2 * step, first_step=70 * step))
        batch = rb.sample()
        assert can_and_update(rb, batch)
    assert not calls


def can_and_update(rb, batch) -> bool:
    rb.update_priority(batch["index"], torch.rand(batch.shape[0]) + 0.1)
    return rb.can_sample()


# -- state ---------------------------------------------------------------------------------------------------
def test_a_sampler_loaded_from_the_state_draws_what_the_original_draws():
    storage = ring_storage([9, 4, 11, 6, 13, 8], 30)
    sampler = make(capacity=30, slice_len=3, span=(False, 1))
    sampler.extend(torch.arange(30))
    sampler.update_priority(torch.arange(30), torch.arange(30).double() % 5)
    sampler._rng = torch.Generator().manual_seed(3)
    sampler.sample(storage, 12)  # its index is built (and caught up) before the state is taken
    fresh = make(capacity=30, slice_len=3, span=(False, 1))
    fresh.load_state_dict(sampler.state_dict())
    fresh._rng = torch.Generator().manual_seed(4)
    sampler._rng.manual_seed(4)
    a, b = sampler.sample(storage, 30), fresh.sample(storage, 30)
    assert torch.equal(a[0][0], b[0][0]) and torch.equal(a[1]["priority_weight"], b[1]["priority_weight"])


# -- DataLoader workers --------------------------------------------------------------------------------------
def revision(storage) -> int:
    """The storage's revision with no write in flight (a write holds the lock until its counters moved)."""
    with storage.write_lock:
        return storage.write_revision


class ReportingSampler(PrioritizedSliceSampler):
    """Worker copies write into a shared table, per worker: ``[rebuilds, catch_ups, draws, checked, bad]``.

    A draw is checked when it began after the parent zeroed the priorities of every row but its newest
    write's (``reset`` holds the first episode of that write) and no parent write overlapped the draw and the
    read of its rows: its slices then lie in one episode, that one or a later one."""

    table: torch.Tensor | None = None
    reset: torch.Tensor | None = None

    def sample(self, storage, batch_size):
        first = int(self.reset[0]) if self.reset is not None else 0  # the oldest episode with a priority
        before = revision(storage)
        out = super().sample(storage, batch_size)
        worker = get_worker_info()
        if worker is not None and self.table is not None:
            row = self.table[worker.id]
            stats = self.trajectory_index_stats
            row[0], row[1] = stats["rebuilds"], stats["catch_ups"]
            row[2] += 1
            episode = storage.get(out[0][0])["episode"].view(-1, self.slice_len)
            if first and revision(storage) == before:
                row[3] += 1
                row[4] += int(not ((episode == episode[:, :1]).all() and (episode >= first).all()))
        return out


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_forked_workers_share_the_priorities_and_catch_up_on_parent_appends():
    sampler = make(ReportingSampler, capacity=300, slice_len=4)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(300), sampler=sampler, batch_size=16)
    rb.extend(episodes([7, 9, 5] * 5))
    rb.sample()  # the index is built before the fork: the workers start with a copy of it
    sampler.table = torch.zeros(2, 5, dtype=torch.long).share_memory_()
    sampler.reset = torch.zeros(1, dtype=torch.long).share_memory_()
    dl = DataLoader(rb.as_dataset(num_batches=60), batch_size=None, num_workers=2,
                    multiprocessing_context="fork", timeout=60, collate_fn=tensordict_collate)  # fmt: skip
    t, episode = len(rb), 100
    for i, _ in enumerate(dl):
        # at 25, 355 rows were written (the ring wrapped): from then on only the newest write and the next
        # ones have a priority
        if i == 25:
            priority = torch.zeros(len(rb))
            priority[torch.arange(t - 10, t) % 300] = 1.0
            rb.update_priority(torch.arange(len(rb)), priority)
            sampler.reset[0] = episode - 2
        if i > 25 and i % 2:
            continue  # from then on every other batch: only draws no parent write overlapped are checked (2 of
            # 25 once on CI's loaded run when the parent wrote after each batch)
        rb.extend(episodes([5, 5], first_episode=episode, first_step=t))  # the max priority seen (1.0)
        t, episode = t + 10, episode + 2
    table = sampler.table.clone()
    assert (table[:, 0] == 1).all(), table  # the parent's build, copied at the fork: no worker rebuilt
    assert (table[:, 1] >= 8).all() and table[:, 2].sum() >= 40, table  # caught up on the parent's appends
    assert table[:, 4].sum() == 0 and table[:, 3].sum() >= 3, table
    del dl


def test_through_a_buffer_with_a_done_key_and_right_span():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(45),
        sampler=make(capacity=45, slice_len=5, traj_key=None, end_key=("next", "done"), span=(False, 3)),
        batch_size=20,
    )
    rb.extend(TensorDict({"traj": torch.arange(15) // 15, "data": torch.arange(15),
                          ("next", "done"): (torch.arange(15) == 14).unsqueeze(-1)}, [15]))  # fmt: skip
    data = torch.arange(15, 60)
    rb.extend(TensorDict({"traj": data // 15, "data": data,
                          ("next", "done"): (data % 15 == 14).unsqueeze(-1)}, [45]))  # fmt: skip
    rb.sampler._rng = torch.Generator().manual_seed(0)
    starts_last = set()
    for _ in range(100):
        batch = rb.sample()
        ends = batch[TRUNC].squeeze(-1).nonzero().squeeze(-1)
        for piece in torch.tensor_split(batch, (ends[:-1] + 1).tolist()):
            assert (piece["traj"] == piece["traj"][0]).all()
            assert torch.equal(piece["data"], torch.arange(piece.numel()) + piece["data"][0])
            if int(piece["traj"][0]) == 3:  # trajectory 3 sits in rows 0..14, just before the write cursor
                starts_last.add(int(piece["data"][0]) % 15)
    assert max(starts_last) > 10  # right-truncated slices of the newest trajectory after the wrap, as TorchRL
    assert rb.sampler.trajectory_index_stats["rebuilds"] == 1
