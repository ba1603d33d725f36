"""Interleaved trajectories (several envs or collectors writing into one buffer step by step).

``fragmented=True, step_key=...`` on every slice sampler: trajectories come from a trajectory id and a step counter
wherever their steps are stored, and a missing step ends a window as a trajectory end does (NOTE [interleaved runs
index] in ``trajectories/interleaved.py``). The data: 8 streams of episodes interleaved at random, about 2% of the
step numbers missing, written in two extends that wrap the ring.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader, get_worker_info

from torchrl.data import (
    GeometricTrajectoryWindowSampler,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSliceSampler,
    Sequence,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers.sample_units import FrameStack
from torchrl.data.replay_buffers.trajectories.interleaved import InterleavedRuns

TRAJ = ("collector", "traj_ids")  # what collectors write (and TorchRL's first probe)
STEP = "step_count"
WINDOW = 8
WINDOWS = 16  # per batch
BATCH = WINDOW * WINDOWS
CAPACITY = 600  # rows of a 1-D storage; the two extends write 900 rows (the second one wraps)
MASK = ("collector", "mask")
PADDED = "padded"


# -- data ---------------------------------------------------------------------------------------------------------
def interleaved_streams(rows: int, *, streams: int = 8, missing: float = 0.02, seed: int = 0) -> TensorDict:
    """``rows`` steps of ``streams`` envs interleaved at random: each env plays episodes of 20-60 steps (ids unique
    over envs and episodes), and about ``missing`` of the step numbers are skipped (never written)."""
    rng = random.Random(seed)
    episode = list(range(streams))
    step = [0] * streams
    left = [rng.randint(20, 60) for _ in range(streams)]
    next_id = streams
    traj, steps, env = [], [], []
    for _ in range(rows):
        e = rng.randrange(streams)
        if rng.random() < missing:
            step[e] += 1  # this step number is never written
        traj.append(episode[e])
        steps.append(step[e])
        env.append(e)
        step[e] += 1
        left[e] -= 1
        if left[e] <= 0:  # a new episode, with a new id
            episode[e], next_id, step[e], left[e] = next_id, next_id + 1, 0, rng.randint(20, 60)
    n = len(traj)
    return TensorDict(
        {
            TRAJ: torch.tensor(traj),
            STEP: torch.tensor(steps),
            "env": torch.tensor(env),
            "obs": torch.randn(n, 2),
            ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
        },
        batch_size=[n],
    )


def as_rows(data: TensorDict, ndim: int) -> TensorDict:
    """``data`` as stored in a storage of ``ndim`` dims: ``[time, 4]`` for ``ndim=2`` (4 cells per row)."""
    return data if ndim == 1 else data.reshape(-1, 4)


def for_buffer(rows: TensorDict, ndim: int) -> TensorDict:
    """Stored ``rows`` as a buffer's ``extend`` takes them: ``[envs, time]`` for ``ndim=2`` (TorchRL's layout)."""
    return rows if ndim == 1 else rows.transpose(0, 1).contiguous()


def make_storage(ndim: int, capacity_rows: int = CAPACITY):
    return (
        LazyTensorStorage(capacity_rows, ndim=1)
        if ndim == 1
        else LazyTensorStorage(capacity_rows * 4, ndim=2)
    )


def live_runs(storage) -> list[list[tuple[int, int, int]]]:
    """Brute force: the runs of consecutive steps of the live rows, each a list of ``(traj, step, cell)``, ordered
    by (traj, step)."""
    data = storage[:]
    traj = data.get(TRAJ).reshape(-1).tolist()
    step = data.get(STEP).reshape(-1).tolist()
    rows = sorted(zip(traj, step, range(len(traj))))
    runs: list[list[tuple[int, int, int]]] = []
    for item in rows:
        if runs and runs[-1][-1][0] == item[0] and runs[-1][-1][1] + 1 == item[1]:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def windows_of(batch: TensorDict, length: int = WINDOW) -> list[tuple[list[int], list[int]]]:
    """``(traj ids, steps)`` of the real steps of each window of a batch (padding left out)."""
    traj = batch.get(TRAJ).reshape(-1, length)
    step = batch.get(STEP).reshape(-1, length)
    real = batch.get(MASK, None)
    if real is None and "validity_mask" in batch.keys():  # a Sequence unit's padding flags
        real = batch.get("validity_mask")
    if real is None and PADDED in batch.keys():  # a FrameStack unit's (mask_key=PADDED: True on padding)
        real = ~batch.get(PADDED)
    real = torch.ones_like(traj, dtype=torch.bool) if real is None else real.reshape(-1, length)
    return [(t[r].tolist(), s[r].tolist()) for t, s, r in zip(traj, step, real)]


def bad_windows(batch: TensorDict, length: int = WINDOW) -> int:
    """Windows that mix trajectories or do not advance one step at a time."""
    bad = 0
    for traj, step in windows_of(batch, length):
        if len(set(traj)) != 1 or any(b - a != 1 for a, b in zip(step, step[1:])):
            bad += 1
    return bad


# -- the samplers and units drawing windows (extend this dict to check another one) --------------------------------
def _rb(sampler, storage, seed: int) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(
        storage=storage, sampler=sampler, batch_size=BATCH, generator=torch.Generator().manual_seed(seed)
    )


def _unit_rb(unit, storage, seed: int) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(
        storage=storage, sample_unit=unit, batch_size=WINDOWS, generator=torch.Generator().manual_seed(seed)
    )


#: name -> ``factory(storage, seed, fragmented)``: a buffer over ``storage`` whose batches are windows of ``WINDOW``
#: steps (``fragmented=False``: the same sampler for the contiguous layout, keyed on run ids in ``TRAJ``).
WINDOW_SOURCES = {
    "SliceSampler": lambda storage, seed, fragmented=True: _rb(
        SliceSampler(slice_len=WINDOW, traj_key=TRAJ, fragmented=fragmented), storage, seed
    ),
    "SliceSampler(strict_length=False, pad_output=True)": lambda storage, seed, fragmented=True: _rb(
        SliceSampler(
            slice_len=WINDOW, traj_key=TRAJ, fragmented=fragmented, strict_length=False, pad_output=True
        ),
        storage,
        seed,
    ),
    "SliceSamplerWithoutReplacement": lambda storage, seed, fragmented=True: _rb(
        SliceSamplerWithoutReplacement(slice_len=WINDOW, traj_key=TRAJ, fragmented=fragmented), storage, seed
    ),
    "PrioritizedSliceSampler": lambda storage, seed, fragmented=True: _rb(
        PrioritizedSliceSampler(
            storage.max_size, 1.0, 1.0, slice_len=WINDOW, traj_key=TRAJ, fragmented=fragmented
        ),
        storage,
        seed,
    ),
    "StreamingSliceSampler": lambda storage, seed, fragmented=True: _rb(
        StreamingSliceSampler(slice_len=WINDOW, traj_key=TRAJ, fragmented=fragmented), storage, seed
    ),
    # windows of 3 steps of history, the anchor and up to 4 future steps: [WINDOWS, WINDOW] batches
    "GeometricTrajectoryWindowSampler": lambda storage, seed, fragmented=True: TensorDictReplayBuffer(
        storage=storage,
        sampler=GeometricTrajectoryWindowSampler(3, WINDOW - 4, 0.8, trajectory_key=TRAJ, step_key=STEP),
        batch_size=WINDOWS,
        generator=torch.Generator().manual_seed(seed),
    ),
    # sample units: WINDOWS anchors drawn by the default RandomSampler, each a window of WINDOW steps. Without
    # ``done`` flags in the contiguous layout, Sequence reads it with fragmented=True too (each run id is one run)
    "Sequence": lambda storage, seed, fragmented=True: _unit_rb(
        Sequence(WINDOW, traj_key=TRAJ, fragmented=True), storage, seed
    ),
    "Sequence(episode_boundary='stop', burn_in=2)": lambda storage, seed, fragmented=True: _unit_rb(
        Sequence(WINDOW - 2, "stop", burn_in=2, traj_key=TRAJ, fragmented=True), storage, seed
    ),
    "FrameStack": lambda storage, seed, fragmented=True: _unit_rb(
        FrameStack(
            WINDOW,
            [TRAJ, STEP] if fragmented else [TRAJ, STEP, "real_traj"],  # stacked: the window's ids and steps
            traj_key=TRAJ,
            fragmented=fragmented,
            mask_key=PADDED,
        ),
        storage,
        seed,
    ),
}
ONE_D_ONLY = {
    "StreamingSliceSampler",
    "GeometricTrajectoryWindowSampler",
}  # 1-D storages (their documented limit)
#: sources whose draws are uniform given the content (no queue of fresh windows): compared by chi-square
STATIONARY = [name for name in WINDOW_SOURCES if name != "StreamingSliceSampler"]
#: sample units: their anchors are storage rows drawn by a RandomSampler, so the same seed draws other steps in
#: another layout (their start frequencies are compared by chi-square)
ANCHOR_UNITS = {"Sequence", "Sequence(episode_boundary='stop', burn_in=2)", "FrameStack"}


def filled_buffer(name: str, ndim: int, seed: int = 0) -> TensorDictReplayBuffer:
    """The buffer of ``name`` after two extends of interleaved streams, the second one wrapping the ring."""
    rb = WINDOW_SOURCES[name](make_storage(ndim), seed)
    data = interleaved_streams(900 if ndim == 1 else 900 * 4, seed=seed)
    rows = as_rows(data, ndim)
    half = rows.shape[0] * 5 // 9
    rb.extend(for_buffer(rows[:half], ndim))
    rb.extend(for_buffer(rows[half:], ndim))  # wraps: the oldest rows are overwritten
    return rb


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("name", list(WINDOW_SOURCES))
def test_no_window_mixes_trajectories_or_goes_back_in_time(name, ndim):
    if ndim == 2 and name in ONE_D_ONLY:
        pytest.skip(f"{name} serves 1-D storages only")
    rb = filled_buffer(name, ndim)
    assert len(rb.storage) == CAPACITY * (1 if ndim == 1 else 4)
    windows = bad = 0
    for _ in range(200):
        batch = rb.sample()
        windows += len(windows_of(batch))
        bad += bad_windows(batch)
    assert bad == 0
    assert windows >= 200  # without replacement, an epoch's last batch may hold fewer windows


def contiguous_buffer(name: str, runs, seed: int) -> TensorDictReplayBuffer:
    """The same trajectories laid out contiguously: runs end to end, ``TRAJ`` holding the run id."""
    rows = [item for run in runs for item in run]
    run_id = [r for r, run in enumerate(runs) for _ in run]
    data = TensorDict(
        {
            TRAJ: torch.tensor(run_id),
            STEP: torch.tensor([s for _, s, _ in rows]),
            "real_traj": torch.tensor([t for t, _, _ in rows]),
        },
        batch_size=[len(rows)],
    )
    rb = WINDOW_SOURCES[name](LazyTensorStorage(len(rows)), seed, fragmented=False)
    rb.extend(data)
    return rb


def start_counts(batches, traj_key) -> dict:
    counts: dict = {}
    for batch in batches:
        traj = batch.get(traj_key).reshape(-1, WINDOW)[:, 0].tolist()
        step = batch.get(STEP).reshape(-1, WINDOW)[:, 0].tolist()
        for key in zip(traj, step):
            counts[key] = counts.get(key, 0) + 1
    return counts


#: chi-square critical values at p = 0.001 (tabulated), by degrees of freedom
CHI2_999 = {15: 37.697}
BINS = 16


@pytest.mark.parametrize("name", STATIONARY)
def test_start_frequencies_match_the_contiguous_layout(name):
    rb = filled_buffer(name, 1, seed=0)
    runs = live_runs(rb.storage)
    fragmented = start_counts((rb.sample() for _ in range(200)), TRAJ)
    contiguous_rb = contiguous_buffer(name, runs, seed=1)
    contiguous = start_counts((contiguous_rb.sample() for _ in range(200)), "real_traj")
    # every possible start (traj, step), in (traj, step) order, grouped into BINS bins of consecutive starts
    starts = sorted({key for key in fragmented} | {key for key in contiguous})
    keys = sorted({(t, s) for run in runs for t, s, _ in run})
    assert set(starts) <= set(keys)  # every window starts at a live step
    bin_of = {key: i * BINS // len(keys) for i, key in enumerate(keys)}
    a, b = np.zeros(BINS), np.zeros(BINS)
    for key, n in fragmented.items():
        a[bin_of[key]] += n
    for key, n in contiguous.items():
        b[bin_of[key]] += n
    used = (a + b) > 0
    assert used.sum() == BINS
    n_a, n_b = a.sum(), b.sum()
    stat = float((((a * np.sqrt(n_b / n_a) - b * np.sqrt(n_a / n_b)) ** 2) / (a + b)).sum())
    assert stat < CHI2_999[BINS - 1], (stat, a, b)


@pytest.mark.parametrize(
    "name", [name for name in STATIONARY if name != "PrioritizedSliceSampler" and name not in ANCHOR_UNITS]
)
def test_same_seed_draws_the_same_windows_as_the_contiguous_layout(name):
    # uniform samplers draw runs in (traj, step) order, as the contiguous layout orders its trajectories: the same
    # generator state gives the same windows
    rb = filled_buffer(name, 1, seed=0)
    contiguous_rb = contiguous_buffer(name, live_runs(rb.storage), seed=0)
    for _ in range(5):
        a, b = rb.sample(), contiguous_rb.sample()
        assert torch.equal(a.get(STEP), b.get(STEP))
        assert torch.equal(a.get(TRAJ), b.get("real_traj"))


# -- DataLoader workers ---------------------------------------------------------------------------------------------
_SEEDS = torch.zeros(2, dtype=torch.long).share_memory_()


def _record_seed(worker_id: int) -> None:
    _SEEDS[worker_id] = get_worker_info().seed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["SliceSampler", "PrioritizedSliceSampler"])
def test_dataloader_workers_draw_what_the_main_process_draws_for_the_same_seed(name):
    rb = filled_buffer(name, 1)
    loader = DataLoader(
        rb.as_dataset(num_batches=8),
        batch_size=None,
        num_workers=2,
        collate_fn=tensordict_collate,
        multiprocessing_context="fork",
        worker_init_fn=_record_seed,
        generator=torch.Generator().manual_seed(3),
        timeout=60,
    )
    got = [batch["index"].clone() for batch in loader]
    assert len(got) == 8
    for worker in range(2):
        copy = pickle.loads(pickle.dumps(rb))  # a worker's copy, built here from scratch
        copy.prepare_worker_copy(int(_SEEDS[worker]))
        mine = [copy.sample()["index"] for _ in range(4)]
        for drawn, expected in zip(got[worker::2], mine):  # the loader yields the workers' batches in turn
            assert torch.equal(drawn, expected)
    for batch_index in got:
        assert bad_windows(rb.storage[batch_index]) == 0


@pytest.mark.timeout(120)
def test_dataloader_workers_share_one_epoch_of_runs_without_replacement():
    rb = filled_buffer("SliceSamplerWithoutReplacement", 1)
    run_of = {(t, s): r for r, run in enumerate(live_runs(rb.storage)) for t, s, _ in run}
    eligible = {r for r, run in enumerate(live_runs(rb.storage)) if len(run) >= WINDOW}
    loader = DataLoader(
        rb.as_dataset(num_batches=4),
        batch_size=None,
        num_workers=2,
        collate_fn=tensordict_collate,
        multiprocessing_context="fork",
        timeout=60,
    )
    batches = list(loader)
    assert all(bad_windows(batch) == 0 for batch in batches)
    epochs, current = [], []
    for batch in batches:  # an epoch ends with a short batch (drop_last=False)
        current += [run_of[t[0], s[0]] for t, s in windows_of(batch)]
        if len(windows_of(batch)) < WINDOWS:
            epochs.append(current)
            current = []
    assert len(epochs) == 2
    for epoch in epochs:  # every run long enough for a window, once per epoch, across both workers
        assert sorted(epoch) == sorted(eligible)


# -- the index itself -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [1, 2])
def test_the_index_follows_appends_in_place_and_equals_a_rebuild(ndim):
    cols = 1 if ndim == 1 else 3
    storage = LazyTensorStorage(50 * cols, ndim=ndim)
    runs = InterleavedRuns(TRAJ, STEP)
    data = interleaved_streams(1200, streams=6, missing=0.05, seed=4)
    cursor, at = 0, 0
    rng = random.Random(1)
    while at + 14 * cols <= data.shape[0]:
        k = rng.randint(1, 14)
        chunk = data[at : at + k * cols]
        at += k * cols
        storage.set(
            torch.arange(cursor, cursor + k) % 50,
            as_rows(chunk, ndim) if ndim == 1 else chunk.reshape(k, cols),
        )
        cursor = (cursor + k) % 50
        runs.refresh(storage)
        fresh = InterleavedRuns(TRAJ, STEP)
        fresh.refresh(storage)
        for name in ("slots", "steps", "traj", "run_start", "run_length", "run_traj"):
            assert torch.equal(getattr(runs, name), getattr(fresh, name)), name
    assert runs.rebuilds == 1 and runs.catch_ups > 50
    brute = live_runs(storage)
    assert runs.run_length.tolist() == [len(run) for run in brute]
    assert runs.slots.tolist() == [cell for run in brute for _, _, cell in run]
    assert runs.run_traj.tolist() == [run[0][0] for run in brute]


def test_window_slots_gathers_windows_in_step_order():
    storage = make_storage(1)
    storage.set(torch.arange(900) % CAPACITY, interleaved_streams(900))
    runs = InterleavedRuns(TRAJ, STEP)
    runs.refresh(storage)
    run_ids = runs.eligible(WINDOW)
    offsets = torch.zeros_like(run_ids)
    cells = runs.window_slots(run_ids, offsets, WINDOW)
    data = storage[cells.reshape(-1)]
    step, traj = data.get(STEP).view(-1, WINDOW), data.get(TRAJ).view(-1, WINDOW)
    assert (step.diff(dim=1) == 1).all() and (traj == runs.run_traj[run_ids].unsqueeze(-1)).all()
    short = int((runs.run_length < WINDOW).nonzero()[0])
    cells = runs.window_slots(torch.tensor([short]), torch.tensor([0]), WINDOW)
    length = int(runs.run_length[short])
    assert (cells[0, length:] == cells[0, length - 1]).all()  # past the run's end: its last cell repeated


def test_a_missing_step_ends_a_window_and_done_flags_do_not():
    # TorchRL: end keys play no role in building fragmented windows
    data = TensorDict(
        {
            "episode": torch.tensor([7, 9, 7, 9, 7, 9, 7, 9]),
            STEP: torch.tensor([0, 0, 1, 1, 3, 2, 4, 3]),  # episode 7 misses step 2
            ("next", "done"): torch.tensor([0, 0, 1, 0, 0, 0, 0, 0], dtype=torch.bool).unsqueeze(-1),
        },
        batch_size=[8],
    )
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8), sampler=SliceSampler(slice_len=2, fragmented=True), batch_size=40
    )
    rb.extend(data)
    batch = rb.sample()
    assert rb.sampler.traj_key == "episode"  # probed and kept
    pairs = {
        tuple(zip(t, s))
        for t, s in zip(batch["episode"].view(-1, 2).tolist(), batch[STEP].view(-1, 2).tolist())
    }
    assert pairs <= {((7, 0), (7, 1)), ((7, 3), (7, 4)), ((9, 0), (9, 1)), ((9, 1), (9, 2)), ((9, 2), (9, 3))}
    assert ((7, 0), (7, 1)) in pairs and ((7, 3), (7, 4)) in pairs
    truncated = batch[("next", "truncated")].view(-1, 2)
    assert truncated[:, 1].all() and not truncated[:, 0].any()
    assert (batch[("next", "done")].view(-1, 2)[:, 1]).all()


def test_lazy_stack_storage_and_pickling():
    data = interleaved_streams(300)
    rb = TensorDictReplayBuffer(
        storage=LazyStackStorage(300),
        sampler=SliceSampler(slice_len=WINDOW, fragmented=True),
        batch_size=BATCH,
    )
    rb.extend(data)
    assert bad_windows(rb.sample()) == 0
    sampler = pickle.loads(pickle.dumps(rb.sampler))
    assert sampler.fragmented and sampler.step_key == STEP
    rb2 = TensorDictReplayBuffer(storage=LazyTensorStorage(300), sampler=sampler, batch_size=BATCH)
    rb2.extend(data)
    assert bad_windows(rb2.sample()) == 0


def test_strict_length_false_pads_short_runs_and_masks_the_padding():
    data = TensorDict({"episode": torch.tensor([1, 2, 1, 2, 2]), STEP: torch.tensor([0, 0, 1, 1, 2])}, [5])
    sampler = SliceSampler(slice_len=4, fragmented=True, strict_length=False, pad_output=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=40)
    rb.extend(data)
    batch = rb.sample()
    mask = batch[MASK].view(-1, 4)
    assert (mask.sum(1) == torch.where(batch["episode"].view(-1, 4)[:, 0] == 1, 2, 3)).all()
    assert (
        bad_windows(TensorDict({TRAJ: batch["episode"], STEP: batch[STEP], MASK: batch[MASK]}, [40]), 4) == 0
    )


def test_streaming_cuts_windows_in_step_order_and_a_gap_ends_one():
    sampler = StreamingSliceSampler(slice_len=2, traj_key="episode", fragmented=True, strict_length=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler, batch_size=2)
    rb.extend(TensorDict({"episode": torch.tensor([5, 5, 5]), STEP: torch.tensor([1, 0, 2])}, [3]))
    rb.extend(
        TensorDict({"episode": torch.tensor([5, 5]), STEP: torch.tensor([4, 5])}, [2])
    )  # step 3 missing
    served = [rb.sample()[STEP].tolist() for _ in range(3)]  # one window per batch, newest first
    assert served == [[4, 5], [2], [0, 1]]  # [2] alone: the missing step 3 ended its window
    assert sampler.queued == 0


# -- refusals (TorchRL's phrases) -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"step_key": None}, ValueError, "step_key must be provided when fragmented=True"),
        ({"span": True}, NotImplementedError, "span is not supported with fragmented=True"),
        ({"compile": True}, NotImplementedError, "compile is not supported with fragmented=True"),
        (
            {"ends": torch.zeros(4, dtype=torch.bool), "cache_values": True, "traj_key": None},
            ValueError,
            "ends",
        ),
        (
            {"trajectories": torch.zeros(4), "cache_values": True, "traj_key": None},
            ValueError,
            "trajectories",
        ),
        ({"fragmented": "yes"}, TypeError, "`fragmented` must be a bool"),
    ],
)
def test_construction_refusals(kwargs, error, match):
    kwargs = {"slice_len": 2, "traj_key": "episode", "fragmented": True, **kwargs}
    if kwargs["traj_key"] is None:
        del kwargs["traj_key"]
    with pytest.raises(error, match=match):
        SliceSampler(**kwargs)


def _sample(data, storage=None, **kwargs):
    storage = LazyTensorStorage(20) if storage is None else storage
    rb = TensorDictReplayBuffer(
        storage=storage, sampler=SliceSampler(slice_len=2, fragmented=True, **kwargs), batch_size=4
    )
    rb.extend(data)
    return rb.sample()


@pytest.mark.parametrize(
    "entries, error, match",
    [
        (
            {"episode": None, ("next", "done"): torch.zeros(4, 1, dtype=torch.bool)},
            RuntimeError,
            "fragmented=True requires a trajectory identifier under traj_key; end-of-trajectory flags alone",
        ),
        ({"episode": TensorDict(a=torch.zeros(4), batch_size=[4])}, TypeError, "key=.*must contain a tensor"),
        ({"episode": torch.zeros(4, 2, dtype=torch.long)}, RuntimeError, "Expected scalar values under key="),
        ({"episode": torch.zeros(4)}, TypeError, "must contain integer values"),
        ({STEP: torch.tensor([0, 1, -1, 2])}, ValueError, "Step numbers must be non-negative"),
        (
            {STEP: torch.tensor([0, 1, 1, 2])},
            RuntimeError,
            "Found duplicate records for trajectory.*Trajectory-step pairs must be unique in the live storage",
        ),
        ({STEP: None}, KeyError, "step_count"),
    ],
)
def test_sample_time_refusals(entries, error, match):
    data = {"episode": torch.zeros(4, dtype=torch.long), STEP: torch.arange(4), **entries}
    data = TensorDict({k: v for k, v in data.items() if v is not None}, [4])
    with pytest.raises(error, match=match):
        _sample(data)


def test_a_list_storage_is_refused():
    with pytest.raises(
        TypeError, match="Fragmented trajectory indexing requires a single-dimensional storage"
    ):
        _sample(
            TensorDict({"episode": torch.zeros(4, dtype=torch.long), STEP: torch.arange(4)}, [4]),
            ListStorage(20),
        )


def test_no_run_long_enough_is_refused_with_torchrl_phrase():
    data = TensorDict({"episode": torch.tensor([0, 1, 0, 1]), STEP: torch.tensor([0, 0, 2, 2])}, [4])
    with pytest.raises(
        RuntimeError, match="Did not find a single fragmented trajectory run with sufficient length"
    ):
        _sample(data)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8), sampler=SliceSampler(slice_len=2, fragmented=True), batch_size=4
    )
    rb.extend(data)
    assert not rb.sampler.can_sample(rb.storage, 4)


def test_a_refused_write_leaves_the_index_as_it_was():
    storage = LazyTensorStorage(10)
    storage.set(
        torch.arange(4), TensorDict({"episode": torch.zeros(4, dtype=torch.long), STEP: torch.arange(4)}, [4])
    )
    runs = InterleavedRuns("episode", STEP)
    runs.refresh(storage)
    before = (runs.slots.clone(), runs.run_start.clone(), runs.version)
    storage.set(
        torch.arange(4, 6),
        TensorDict({"episode": torch.zeros(2, dtype=torch.long), STEP: torch.tensor([3, 4])}, [2]),
    )
    with pytest.raises(RuntimeError, match="Found duplicate records for trajectory 0 at step 3"):
        runs.refresh(storage)
    assert (
        torch.equal(runs.slots, before[0])
        and torch.equal(runs.run_start, before[1])
        and runs.version == before[2]
    )
    storage.set(
        torch.tensor([4]),
        TensorDict({"episode": torch.zeros(1, dtype=torch.long), STEP: torch.tensor([5])}, [1]),
    )
    runs.refresh(storage)  # the duplicate was overwritten: the index holds the content again
    assert runs.run_length.tolist() == [6] and runs.slots.tolist() == [0, 1, 2, 3, 5, 4]


@pytest.mark.parametrize("id_gap", [1, 2**40])  # ids 2**40 apart: no composite keys, rebuilt at each change
def test_locate_finds_the_run_and_offset_of_every_cell(id_gap):
    data = interleaved_streams(300, seed=2)
    data.set(TRAJ, data.get(TRAJ) * id_gap)
    storage = LazyTensorStorage(200)
    storage.set(torch.arange(300) % 200, data)
    runs = InterleavedRuns(TRAJ, STEP)
    runs.refresh(storage)
    live, run, offset = runs.locate(np.arange(-1, 202))
    assert not live[0] and not live[-2:].any() and live[1:-2].all()
    for cell in range(200):
        r, o = int(run[cell + 1]), int(offset[cell + 1])
        assert int(runs.slots[runs.run_start[r] + o]) == cell and o < int(runs.run_length[r])
    rb = TensorDictReplayBuffer(
        storage=storage,
        sampler=PrioritizedSliceSampler(200, 1.0, 1.0, slice_len=WINDOW, traj_key=TRAJ, fragmented=True),
        batch_size=BATCH,
    )
    rb.sampler.extend(torch.arange(200))
    assert bad_windows(rb.sample()) == 0


def test_replacement_false_forwards_the_fragmented_arguments():
    sampler = SliceSampler(slice_len=WINDOW, traj_key=TRAJ, fragmented=True, step_key=STEP, replacement=False)
    assert (
        isinstance(sampler, SliceSamplerWithoutReplacement)
        and sampler.fragmented
        and sampler.step_key == STEP
    )
    assert "fragmented=True" in repr(sampler)


def test_a_sampler_pickled_before_the_fragmented_arguments_still_samples():
    sampler = SliceSampler(slice_len=2, traj_key="episode")
    for name in ("fragmented", "step_key", "_runs"):  # what an older version's pickle lacks
        del sampler.__dict__[name]
    sampler = pickle.loads(pickle.dumps(sampler))
    assert sampler.fragmented is False and sampler.step_key == STEP
    storage = LazyTensorStorage(8)
    storage.set(torch.arange(8), TensorDict(episode=torch.arange(8) // 4, batch_size=[8]))
    index, _ = sampler.sample(storage, 4)
    assert index[0].view(2, 2).diff(dim=1).eq(1).all()


@pytest.mark.parametrize("seed", range(6))
def test_the_index_equals_a_rebuild_whatever_the_write_pattern(seed):
    # writes of random sizes (up to the ring's size), new episode ids at random times, steps skipped, 1-D and
    # ndim=2 storages: the index caught up after each batch of writes is the one built from scratch
    g = np.random.default_rng(seed)
    cols = 1 if seed % 2 else 3
    rows = int(g.integers(5, 60))
    storage = LazyTensorStorage(rows * cols, ndim=1 if cols == 1 else 2)
    runs = InterleavedRuns("traj", STEP)
    streams = int(g.integers(1, 10))
    current, step, next_id, cursor = list(range(streams)), [0] * streams, streams, 0
    for _ in range(60):
        k = int(g.integers(1, rows))
        ids, steps = [], []
        for _ in range(k * cols):
            e = int(g.integers(streams))
            step[e] += int(g.random() < 0.05)
            ids.append(current[e])
            steps.append(step[e])
            step[e] += 1
            if g.random() < 0.03:
                current[e], next_id, step[e] = next_id, next_id + 1, 0
        shape = (k,) if cols == 1 else (k, cols)
        data = TensorDict(
            traj=torch.tensor(ids).view(shape), step_count=torch.tensor(steps).view(shape), batch_size=shape
        )
        storage.set(torch.arange(cursor, cursor + k) % rows, data)
        cursor = (cursor + k) % rows
        if g.random() < 0.3:
            continue  # several writes before the next refresh
        runs.refresh(storage)
        fresh = InterleavedRuns("traj", STEP)
        fresh.refresh(storage)
        for name in ("slots", "steps", "traj", "run_start", "run_length", "run_traj"):
            assert torch.equal(getattr(runs, name), getattr(fresh, name)), name
    assert runs.rebuilds < runs.catch_ups


@pytest.mark.parametrize("seed", range(4))
def test_eligible_runs_and_draws_follow_appends_as_a_rebuild(seed):
    # the runs long enough for a window and the sampler's eligible table are kept as writes are caught up (ids
    # growing: runs leave at the front, new ones come at the back): they, the run lookups and the windows drawn
    # for the same generator state are those of an index and a sampler built from scratch
    g = np.random.default_rng(seed)
    rows, streams = int(g.integers(30, 90)), int(g.integers(2, 8))
    storage = LazyTensorStorage(rows)
    runs = InterleavedRuns("traj", STEP)
    kept = {
        strict: SliceSampler(slice_len=4, traj_key="traj", fragmented=True, strict_length=strict)
        for strict in (True, False)
    }
    current, step, next_id, cursor = list(range(streams)), [0] * streams, streams, 0
    for it in range(80):
        k = int(g.integers(1, rows // 3))
        ids, steps = [], []
        for _ in range(k):
            e = int(g.integers(streams))
            step[e] += int(g.random() < 0.05)  # a missing step splits a run
            ids.append(current[e])
            steps.append(step[e])
            step[e] += 1
            if g.random() < 0.04:
                current[e], next_id, step[e] = next_id, next_id + 1, 0
        storage.set(
            torch.arange(cursor, cursor + k) % rows,
            TensorDict(traj=torch.tensor(ids), step_count=torch.tensor(steps), batch_size=[k]),
        )
        cursor = (cursor + k) % rows
        runs.refresh(storage)
        fresh = InterleavedRuns("traj", STEP)
        fresh.refresh(storage)
        for need in (1, 3, 6):
            assert torch.equal(runs.eligible(need), fresh.eligible(need)), need
        assert runs.longest() == fresh.longest()
        cells = g.integers(0, rows, 20)
        (live, run, offset), (live_f, run_f, offset_f) = runs.locate(cells), fresh.locate(cells)
        assert np.array_equal(live, live_f)
        assert np.array_equal(run[live], run_f[live]) and np.array_equal(offset[live], offset_f[live])
        assert np.array_equal(runs.run_starts_of(run[live]), fresh.run_start.numpy()[run_f[live]])
        for strict, sampler in kept.items():
            drawn = []
            for chosen in (
                sampler,
                SliceSampler(slice_len=4, traj_key="traj", fragmented=True, strict_length=strict),
            ):
                torch.manual_seed(it)
                try:
                    index, info = chosen.sample(storage, 16)
                    drawn.append(
                        (index[0].tolist(), {str(key): value.tolist() for key, value in info.items()})
                    )
                except RuntimeError as error:  # no run of 4 steps yet (strict_length=True): the same error
                    drawn.append(str(error))
            assert drawn[0] == drawn[1]
    assert runs.rebuilds == 1 and kept[True].trajectory_index_stats["catch_ups"] > 40
