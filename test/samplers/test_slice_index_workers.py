"""The live trajectory index across processes: DataLoader workers and other writers (issue 30 item 1).

NOTE [catching up on appends] (trajectories/sync.py): the index follows the storage's shared append
counters (``TensorStorage.append_state``), so a worker's copy of a slice sampler or a ``Sequence`` applies the
rows the parent appended since its last draw in ``O(rows)`` instead of rebuilding from the whole storage, and a
process reading a storage that another process writes does the same. These tests check the counters, that the
workers take the incremental path (``trajectory_index_stats``), that their draws stay those of a fresh index, and
that a concurrent writer never yields a stale slice.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader, get_worker_info

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    RandomSampler,
    Sequence,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
    tensordict_collate,
)

DONE = ("next", "done")


def steps(lengths: list[int], first_episode: int = 0, first_t: int = 0) -> TensorDict:
    """Consecutive episodes of ``lengths`` steps: ``episode`` ids, a global step ``t``, done flags."""
    episode = torch.cat(
        [torch.full((n,), first_episode + i, dtype=torch.long) for i, n in enumerate(lengths)]
    )
    n = episode.numel()
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[:-1, 0] = episode[1:] != episode[:-1]
    done[-1, 0] = True
    return TensorDict(
        episode=episode,
        t=torch.arange(first_t, first_t + n),
        next=TensorDict(done=done, batch_size=[n]),
        batch_size=[n],
    )


def valid_slices(batch: TensorDict, slice_len: int) -> bool:
    """No slice crosses an episode boundary or the write seam (its global steps are consecutive)."""
    episode, t = batch["episode"].view(-1, slice_len), batch["t"].view(-1, slice_len)
    return bool((episode == episode[:, :1]).all() and (t.diff(dim=1) == 1).all())


def assert_valid_slices(batch: TensorDict, slice_len: int) -> None:
    assert valid_slices(batch, slice_len), (batch["episode"], batch["t"])


# -- the storage's append counters ----------------------------------------------------------------------------
@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
def test_append_state_counts_appends_and_marks_everything_else_as_a_break(storage_cls, tmp_path):
    storage = (
        storage_cls(10, scratch_dir=tmp_path / "s") if storage_cls is LazyMemmapStorage else storage_cls(10)
    )

    def state():
        return storage.append_state()

    storage.set(torch.arange(4), steps([4]))  # the first write allocates: the allocation is a break
    rev, appended, broken = state()
    assert (rev, appended) == (storage.write_revision, 4) and broken < rev
    storage.set(4, steps([1])[0])  # one row after the newest (rb.add): an append
    storage.set(torch.arange(5, 12) % 10, steps([7]))  # wraps around the ring: an append
    assert state()[1:] == (12, broken) and state()[0] == rev + 2
    for write in (
        lambda: storage.set(torch.tensor([5]), steps([1])),  # not after the newest row
        lambda: storage.set(torch.arange(2, 4), steps([2]), set_cursor=False),  # the cursor does not move
        lambda: storage.__setitem__(torch.tensor([2, 3]), steps([2])),  # item assignment
        lambda: storage.set(torch.arange(10), steps([10])),  # the whole ring
        lambda: storage.set(torch.tensor([1, 0]), steps([2])),  # after the newest row, out of order
        lambda: storage.load_state_dict(storage.state_dict()),
        lambda: TensorDictReplayBuffer(storage=storage).empty(),
    ):
        before = state()
        write()
        after = state()
        assert after[0] == before[0] + 1 and after[2] == after[0] and after[1] == before[1], write
    storage.set(torch.arange(3), steps([3]))  # after empty(): row 0 follows the newest row (none)
    assert state()[1] == 15 and state()[2] == state()[0] - 1


def test_append_state_after_loads_is_a_break(tmp_path):
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(6), steps([6]))
    storage.dumps(tmp_path / "ckpt")
    storage.set(torch.arange(6, 8), steps([2]))
    storage.loads(tmp_path / "ckpt")
    rev, _, broken = storage.append_state()
    assert broken == rev
    assert len(storage) == 6


# -- DataLoader workers ---------------------------------------------------------------------------------------
class _WorkerReport:
    """Per-worker counters in shared memory (inherited by forked workers): draws compared with a fresh index,
    mismatches, rebuilds and catch-ups of the worker's copy."""

    def __init__(self, workers: int):
        self.table = torch.zeros(workers, 4, dtype=torch.long).share_memory_()

    @staticmethod
    def revision(storage) -> int:
        """The storage's revision with no write in flight (a write holds the lock until its counters moved)."""
        with storage.write_lock:
            return storage.write_revision

    def record(self, storage, holder, compare, before: int) -> None:
        """``before``: :meth:`revision` before the draw being compared."""
        worker = get_worker_info()
        if worker is None:
            return
        row = self.table[worker.id]
        stats = holder.trajectory_index_stats
        row[2], row[3] = stats["rebuilds"], stats["catch_ups"]
        same = compare()
        if self.revision(storage) == before:  # no parent write overlapped the draw: the comparison holds
            row[0] += 1
            row[1] += int(not same)


class ReportingSliceSampler(SliceSampler):
    """A SliceSampler whose worker copies compare each draw with a fresh sampler's for the same generator."""

    report: _WorkerReport | None = None

    def sample(self, storage, batch_size):
        gen = self._rng if self._rng is not None else torch.Generator().manual_seed(0)
        self._rng = gen
        state = gen.get_state()
        before = _WorkerReport.revision(storage)
        out = super().sample(storage, batch_size)
        if self.report is not None:

            def compare():
                fresh = SliceSampler(slice_len=self.slice_len, traj_key=self.traj_key)
                fresh._rng = torch.Generator().manual_seed(0)
                fresh._rng.set_state(state)
                same = torch.equal(fresh.sample(storage, batch_size)[0][0], out[0][0])
                return same and valid_slices(storage.get(out[0][0]), self.slice_len)

            self.report.record(storage, self, compare, before)
        return out


class ReportingWithoutReplacement(SliceSamplerWithoutReplacement):
    report: _WorkerReport | None = None

    def sample(self, storage, batch_size):
        before = _WorkerReport.revision(storage)
        out = super().sample(storage, batch_size)
        if self.report is not None:
            self.report.record(storage, self, lambda: valid_slices(storage.get(out[0][0]), 4), before)
        return out


class ReportingSequence(Sequence):
    """A Sequence whose worker copies compare each expansion with a fresh unit's."""

    report: _WorkerReport | None = None

    def expand(self, index, info, storage):
        before = _WorkerReport.revision(storage)
        out = super().expand(index, info, storage)
        if self.report is not None:

            def compare():
                fresh = Sequence(self.length, done_key=self.done_key).expand(index, dict(info), storage)
                return torch.equal(fresh[0], out[0]) and all(
                    torch.equal(fresh[1][k], out[1][k]) for k in fresh[1]
                )

            self.report.record(storage, self, compare, before)
        return out


def _run_workers(rb, report, *, batches, write, context="fork", workers=2, every=1):
    """Iterates a DataLoader over ``rb`` while the parent appends ``write`` rows after every ``every``-th batch;
    returns the workers' report. The batches are not checked here: a write landing between a worker's draw and its gather
    may overwrite sampled rows (see ``valid_slices`` in the workers, which checks draws no write overlapped)."""
    dl = DataLoader(
        rb.as_dataset(num_batches=batches),
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=context,
        timeout=60,
        collate_fn=tensordict_collate,
    )
    t, episode = len(rb), 1000
    for i, _ in enumerate(dl):
        if i % every:
            continue
        rb.extend(steps([write // 2, write - write // 2], episode, t))  # the parent appends between batches
        t, episode = t + write, episode + 2
    return report.table.clone()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
def test_forked_workers_catch_up_on_parent_appends_without_rebuilding(storage_cls, tmp_path):
    report = _WorkerReport(2)
    sampler = ReportingSliceSampler(slice_len=4, traj_key="episode")
    storage = (
        storage_cls(200, scratch_dir=tmp_path / "s") if storage_cls is LazyMemmapStorage else storage_cls(200)
    )
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=16)
    rb.extend(steps([7, 9, 5] * 5, 0, 0))
    rb.sample()  # the index is built before the fork: the workers start with a copy of it
    sampler.report = report
    table = _run_workers(rb, report, batches=80, write=10)  # 800 rows: the ring wraps 4 times
    compared, mismatched = table.sum(0).tolist()[:2]
    assert mismatched == 0 and compared >= 20, table
    assert (table[:, 2] == 1).all(), table  # the parent's build, copied at the fork: no worker rebuilt
    assert (table[:, 3] >= 10).all(), table  # every worker caught up on the parent's appends, again and again


@pytest.mark.timeout(120)
def test_workers_of_a_shared_without_replacement_sampler_catch_up_incrementally():
    report = _WorkerReport(2)
    sampler = ReportingWithoutReplacement(slice_len=4, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(200), sampler=sampler, batch_size=16)
    rb.extend(steps([8] * 10))
    rb.sample()
    sampler.report = report
    table = _run_workers(rb, report, batches=60, write=8)
    assert table[:, 1].sum() == 0 and table[:, 0].sum() >= 15, table
    assert (table[:, 2] == 1).all() and (table[:, 3] >= 8).all(), table


@pytest.mark.timeout(120)
def test_worker_sequences_catch_up_incrementally_and_match_a_fresh_unit():
    report = _WorkerReport(2)
    unit = ReportingSequence(4, done_key=DONE)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(150), sampler=RandomSampler(), sample_unit=unit, batch_size=6
    )
    rb.extend(steps([5, 8, 3] * 5))
    rb.sample()
    unit.report = report
    table = _run_workers(rb, report, batches=60, write=9)
    compared, mismatched = table.sum(0).tolist()[:2]
    assert mismatched == 0 and compared >= 15, table
    assert (table[:, 2] == 1).all() and (table[:, 3] >= 8).all(), table


@pytest.mark.timeout(150)
def test_a_spawned_worker_rebuilds_once_then_catches_up():
    report = _WorkerReport(1)
    sampler = ReportingSliceSampler(slice_len=4, traj_key="episode")
    sampler.report = report  # pickled with the sampler: the same shared table in the spawned worker
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(120), sampler=sampler, batch_size=8)
    rb.extend(steps([6, 6, 6]))
    # only the draws that no parent write overlapped are compared: with a write after every batch, as few as
    # 2 of 50; writes after every other batch leave the worker draws of its own
    table = _run_workers(rb, report, batches=50, write=8, context="spawn", workers=1, every=2)
    compared, mismatched, rebuilds, catch_ups = table[0].tolist()
    assert rebuilds == 1 and catch_ups >= 10 and mismatched == 0 and compared >= 3, table


# -- another process writing ----------------------------------------------------------------------------------
def _collect(rb, bursts: int, per_burst: int, write: int, first_t: int, quiet, resume) -> None:
    """Appends ``bursts`` bursts of ``per_burst`` writes of ``write`` rows; after each burst, waits for the
    reader to check a quiet storage (``quiet`` set by the writer, ``resume`` by the reader)."""
    t, episode = first_t, 10_000
    for _ in range(bursts):
        for i in range(per_burst):
            rb.extend(steps([write] if i % 2 else [3, write - 3], episode, t))
            t, episode = t + write, episode + 2
        quiet.set()
        if not resume.wait(timeout=30):
            raise RuntimeError("the reader did not check the quiet storage in time")
        resume.clear()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sampler_cls", [SliceSampler, SliceSamplerWithoutReplacement])
def test_a_concurrent_writer_process_never_yields_a_stale_slice(sampler_cls):
    slice_len, capacity, write, bursts, per_burst = 3, 400, 11, 12, 25
    sampler = sampler_cls(slice_len=slice_len, traj_key="episode")
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=12, shared=True
    )
    rb.extend(steps([6] * 8))
    storage = rb.storage
    rb.sample()
    ctx = mp.get_context("fork")
    quiet, resume = ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_collect, args=(rb, bursts, per_burst, write, 48, quiet, resume), daemon=True)
    writer.start()
    concurrent_draws = quiet_checks = 0
    try:
        deadline = time.monotonic() + 60
        while quiet_checks < bursts and time.monotonic() < deadline:
            if not quiet.is_set():  # the writer is appending: draw while it writes
                sampler.sample(storage, 12)
                concurrent_draws += 1
                continue
            quiet.clear()  # no write in flight: every slice must lie in one episode, and be a fresh index's
            for seed in range(2):
                sampler._rng = torch.Generator().manual_seed(seed)
                fresh = SliceSampler(slice_len=slice_len, traj_key="episode")
                fresh._rng = torch.Generator().manual_seed(seed)
                got = sampler.sample(storage, 12)[0][0]
                if sampler_cls is SliceSampler:
                    assert torch.equal(got, fresh.sample(storage, 12)[0][0])
                assert_valid_slices(storage.get(got), slice_len)
            quiet_checks += 1
            resume.set()
    finally:
        resume.set()
        writer.join(timeout=30)
    assert writer.exitcode == 0 and quiet_checks == bursts
    # the writes the reader saw, mid-burst included, were caught up incrementally, not rebuilt
    stats = sampler.trajectory_index_stats
    assert stats["catch_ups"] >= bursts and stats["rebuilds"] * 5 <= stats["catch_ups"], (
        stats,
        concurrent_draws,
    )
    end = 48 + bursts * per_burst * write
    assert sorted(storage.get(torch.arange(capacity))["t"].tolist()) == list(range(end - capacity, end))
