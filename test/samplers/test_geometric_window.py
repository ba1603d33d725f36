"""GeometricTrajectoryWindowSampler: windows checked against a brute-force reference (Python loops over the stored
steps), the distributions of the future length and of the anchors, errors, state and compiled draws."""

from __future__ import annotations

import pickle
import random

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    GeometricTrajectoryWindowSampler,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers.geometric import draw_windows, window_tables

TRAJ = ("collector", "traj_ids")


def _steps(lengths: list[int], *, interleave: bool, missing: float = 0.0, seed: int = 0, start_id: int = 0):
    """Rows of trajectories of ``lengths`` (``obs`` = a unique row id), interleaved at random or one after another,
    each step dropped with probability ``missing``."""
    rng = random.Random(seed)
    streams = [[(start_id + i, s) for s in range(n) if rng.random() >= missing] for i, n in enumerate(lengths)]
    rows = []
    if interleave:
        heads = [0] * len(streams)
        while any(h < len(s) for h, s in zip(heads, streams)):
            i = rng.choice([i for i, s in enumerate(streams) if heads[i] < len(s)])
            rows.append(streams[i][heads[i]])
            heads[i] += 1
    else:
        rows = [row for stream in streams for row in stream]
    traj = torch.tensor([r[0] for r in rows], dtype=torch.long)
    step = torch.tensor([r[1] for r in rows], dtype=torch.long)
    n = len(rows)
    return TensorDict({TRAJ: traj, "step_count": step, "obs": torch.arange(n)}, batch_size=[n])


def _reference(storage, history: int, max_future: int):
    """Eligible anchors by Python loops: ``{slot: future}``, and ``window(slot, k) -> (slots, valid)``."""
    n = len(storage)
    content = storage.get(torch.arange(n))
    trajs, steps = content[TRAJ].tolist(), content["step_count"].tolist()
    where = {}
    for slot in range(n):
        where[(trajs[slot], steps[slot])] = slot
    eligible = {}
    for slot in range(n):
        traj, s = trajs[slot], steps[slot]
        first = s
        while (traj, first - 1) in where:
            first -= 1
        last = s
        while (traj, last + 1) in where:
            last += 1
        if max(0, s - history) >= first:
            eligible[slot] = min(max_future, last - s)

    def window(slot: int, k: int):
        traj, s = trajs[slot], steps[slot]
        slots, valid = [], []
        for column in range(history + max_future + 1):
            offset = column - history
            if s + offset < 0:
                slots.append(where[(traj, 0)])
                valid.append(False)
            elif offset > k:
                slots.append(where[(traj, s + k)])
                valid.append(False)
            else:
                slots.append(where[(traj, s + offset)])
                valid.append(True)
        return slots, valid

    return eligible, window


def _ring_storage(capacity: int, data: TensorDict, *, memmap: bool = False):
    """``data`` written in two extends into a ring of ``capacity`` (the second wraps it when it is long enough)."""
    storage = LazyMemmapStorage(capacity) if memmap else LazyTensorStorage(capacity)
    rb = TensorDictReplayBuffer(storage=storage)
    half = data.shape[0] // 2
    rb.extend(data[:half])
    rb.extend(data[half:])
    return rb, storage


@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "contiguous"])
@pytest.mark.parametrize("history,max_future,y", [(0, 0, 0.5), (2, 3, 0.6), (3, 1, 0.0), (1, 5, 0.9)])
def test_windows_match_a_brute_force_reference(interleave, history, max_future, y):
    data = _steps([9, 4, 12, 2, 7, 1], interleave=interleave, missing=0.08, seed=history * 10 + max_future)
    _, storage = _ring_storage(30, data)  # 35 rows into 30: the ring wraps, older steps are overwritten
    eligible, window = _reference(storage, history, max_future)
    largest = max(eligible.values())
    sampler = GeometricTrajectoryWindowSampler(history, max_future, y)
    sampler._rng = torch.Generator().manual_seed(0)
    seen, ks = set(), set()
    for _ in range(300):
        index, info = sampler.sample(storage, 5)
        assert index.shape == (5, history + max_future + 1)
        for row in range(5):
            anchor, k = int(info["anchor_index"][row, 0]), int(info["future_offset"][row, 0])
            assert anchor in eligible and 0 <= k <= min(max_future, largest) and eligible[anchor] >= k
            slots, valid = window(anchor, k)
            assert index[row].tolist() == slots
            assert info["validity_mask"][row].tolist() == valid
            assert (info["anchor_index"][row] == anchor).all() and (info["future_offset"][row] == k).all()
            assert int(index[row, history]) == anchor
            seen.add(anchor)
            ks.add(k)
    assert seen == set(eligible)  # every eligible anchor is drawn, and only those
    if y == 0.0:
        assert ks == {0}


def test_future_lengths_follow_the_truncated_geometric_law():
    storage = LazyTensorStorage(200)
    storage.set(torch.arange(80), _steps([40, 40], interleave=True))
    sampler = GeometricTrajectoryWindowSampler(0, 3, 0.5)
    sampler._rng = torch.Generator().manual_seed(1)
    draws = 6000
    k = torch.stack([sampler.sample(storage, 1)[1]["future_offset"][0, 0] for _ in range(draws)])
    freq = torch.bincount(k, minlength=4).double() / draws
    expected = torch.tensor([8, 4, 2, 1], dtype=torch.float64) / 15
    assert torch.allclose(freq, expected, atol=0.025), freq


def test_future_lengths_are_truncated_to_the_longest_available_future():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(6), _steps([2, 2, 2], interleave=True))  # every future is at most 1
    sampler = GeometricTrajectoryWindowSampler(0, 4, 0.5)
    sampler._rng = torch.Generator().manual_seed(2)
    draws = 4000
    k = torch.stack([sampler.sample(storage, 1)[1]["future_offset"][0, 0] for _ in range(draws)])
    assert int(k.max()) == 1
    assert abs(float((k == 1).double().mean()) - 1 / 3) < 0.03  # P(1) = y / (1 + y)


def test_anchors_are_uniform_over_stored_steps_not_trajectories():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), _steps([1, 3], interleave=True, seed=3))
    sampler = GeometricTrajectoryWindowSampler(0, 2, 0.0)
    sampler._rng = torch.Generator().manual_seed(3)
    traj = storage.get(torch.arange(4))[TRAJ]
    anchors = sampler.sample(storage, 8000)[1]["anchor_index"][:, 0]
    share = float((traj[anchors] == 1).double().mean())
    assert abs(share - 0.75) < 0.02


def test_history_before_step_zero_and_future_after_k_are_padded_and_invalid():
    storage = LazyTensorStorage(10)
    data = TensorDict({TRAJ: torch.zeros(5, dtype=torch.long), "step_count": torch.tensor([3, 1, 0, 4, 2])}, [5])
    storage.set(torch.arange(5), data)  # slot of step s: 2, 1, 4, 0, 3 for s = 0..4
    sampler = GeometricTrajectoryWindowSampler(3, 2, 0.0)  # k = 0 always
    sampler._rng = torch.Generator().manual_seed(0)
    index, info = sampler.sample(storage, 200)
    row = (info["anchor_index"][:, 0] == 1).nonzero()[0, 0]  # the anchor at step 1 (slot 1)
    assert index[row].tolist() == [2, 2, 2, 1, 1, 1]
    assert info["validity_mask"][row].tolist() == [False, False, True, True, False, False]


# (LazyStackStorage is left out: its reads return the stored TensorDicts themselves, so the info entries written
# into a batch whose windows overlap land in the shared items)
@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_buffer_samples_have_batch_shape_batch_by_window_with_info_entries(storage):
    sampler = GeometricTrajectoryWindowSampler(2, 3, 0.7)
    rb = make_buffer(
        storage=storage(100), sampler=sampler, cls=TensorDictReplayBuffer, batch_size=6, seed=0,
        data=_steps([20, 15, 30], interleave=True, missing=0.05),
    )
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == (6, 6)
    for key, dtype in (("validity_mask", torch.bool), ("future_offset", torch.long), ("anchor_index", torch.long)):
        assert batch[key].shape == (6, 6) and batch[key].dtype == dtype
        assert torch.equal(batch[key], info[key])
    assert torch.equal(batch["index"], info["index"])
    assert torch.equal(batch["obs"], rb.storage.get(info["index"].reshape(-1))["obs"].reshape(6, 6))
    valid = batch["validity_mask"]
    assert (batch[TRAJ] == batch[TRAJ][:, 2:3]).all()  # padding repeats slots of the same trajectory
    gaps = batch["step_count"][:, 1:] - batch["step_count"][:, :-1]
    assert (gaps[valid[:, 1:] & valid[:, :-1]] == 1).all()
    assert torch.equal(batch["index"][:, 2], batch["anchor_index"][:, 0])


def test_same_seed_gives_the_same_windows_and_writes_of_another_buffer_are_seen():
    storage = LazyTensorStorage(50)
    writer = TensorDictReplayBuffer(storage=storage)
    writer.extend(_steps([10, 10], interleave=True))
    draws = []
    for _ in range(2):
        rb = TensorDictReplayBuffer(
            storage=storage, sampler=GeometricTrajectoryWindowSampler(1, 2, 0.5), batch_size=8,
            generator=torch.Generator().manual_seed(5),
        )
        draws.append(rb.sample()["index"])
    assert torch.equal(draws[0], draws[1])
    sampler = rb.sampler
    writer.extend(_steps([6], interleave=False, start_id=7))  # a new trajectory, written through the other buffer
    eligible, _ = _reference(storage, 1, 2)
    anchors = set(sampler.sample(storage, 2000)[1]["anchor_index"][:, 0].tolist())
    assert anchors == set(eligible) and any(a >= 20 for a in anchors)


def test_compiled_draws_equal_eager_draws():
    storage = LazyTensorStorage(100)
    data = _steps([25, 20, 15], interleave=True, missing=0.05)
    storage.set(torch.arange(data.shape[0]), data)
    eager = GeometricTrajectoryWindowSampler(2, 4, 0.6)
    compiled = GeometricTrajectoryWindowSampler(2, 4, 0.6, compile={"backend": "eager", "fullgraph": True})
    for sampler in (eager, compiled):
        sampler._rng = torch.Generator().manual_seed(7)
    for _ in range(3):
        a_index, a_info = eager.sample(storage, 16)
        b_index, b_info = compiled.sample(storage, 16)
        assert torch.equal(a_index, b_index)
        for key in a_info:
            assert torch.equal(a_info[key], b_info[key])


def test_state_is_empty_and_loading_it_drops_the_index(tmp_path):
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(10), _steps([5, 5], interleave=True))
    sampler = GeometricTrajectoryWindowSampler(1, 1, 0.5, trajectory_key=TRAJ)
    sampler._rng = torch.Generator().manual_seed(0)
    first = sampler.sample(storage, 4)[0]
    assert sampler.state_dict() == {}
    sampler.load_state_dict({})  # drops the index: found again from the storage at the next draw
    storage.set(torch.arange(10, 12), _steps([2], interleave=False, start_id=9))
    sampler._rng = torch.Generator().manual_seed(0)
    assert sampler.sample(storage, 4)[0].shape == first.shape
    sampler.dumps(tmp_path / "sampler")
    sampler.loads(tmp_path / "sampler")
    copy = pickle.loads(pickle.dumps(sampler))  # carries the configuration, not the index
    assert copy.sample(storage, 3)[0].shape == (3, 3) and copy.trajectory_key == TRAJ
    assert sampler.requires_shared_state is False


def test_windows_never_leave_a_run_over_wrapped_interleaved_streams():
    data = _steps([60] * 8, interleave=True, missing=0.02, seed=11)
    rb, storage = _ring_storage(300, data)  # 8 streams, ~2% of the steps missing, two extends that wrap the ring
    sampler = GeometricTrajectoryWindowSampler(3, 4, 0.8)
    sampler._rng = torch.Generator().manual_seed(0)
    for _ in range(200):
        index, info = sampler.sample(storage, 16)
        got = storage.get(index.reshape(-1)).reshape(index.shape)
        valid = info["validity_mask"]
        assert (got[TRAJ] == got[TRAJ][:, 3:4]).all()
        gaps = got["step_count"][:, 1:] - got["step_count"][:, :-1]
        assert (gaps[valid[:, 1:] & valid[:, :-1]] == 1).all()
        assert valid[:, 3].all()


# -- errors -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,error,match",
    [
        ((True, 1, 0.5), TypeError, "`history`"),
        ((1.0, 1, 0.5), TypeError, "`history`"),
        ((-1, 1, 0.5), ValueError, "`history`"),
        ((1, False, 0.5), TypeError, "`max_future`"),
        ((1, -2, 0.5), ValueError, "`max_future`"),
        ((1, 1, True), TypeError, "`continuation_probability`"),
        ((1, 1, "0.5"), TypeError, "`continuation_probability`"),
        ((1, 1, 1.0), ValueError, "`continuation_probability`"),
        ((1, 1, -0.1), ValueError, "`continuation_probability`"),
        ((1, 1, float("nan")), ValueError, "`continuation_probability`"),
    ],
)
def test_bad_arguments_are_refused(args, error, match):
    with pytest.raises(error, match=match):
        GeometricTrajectoryWindowSampler(*args)


def test_numpy_ints_are_accepted_and_bad_keywords_refused():
    import numpy as np

    sampler = GeometricTrajectoryWindowSampler(np.int64(2), np.int32(3), np.float32(0.25))
    assert (sampler.history, sampler.max_future, sampler.window) == (2, 3, 6)
    with pytest.raises(TypeError, match="`compile`"):
        GeometricTrajectoryWindowSampler(1, 1, 0.5, compile="yes")
    with pytest.raises(ValueError, match="step_key"):
        GeometricTrajectoryWindowSampler(1, 1, 0.5, step_key=None)


def test_empty_storage_and_missing_history_raise():
    sampler = GeometricTrajectoryWindowSampler(3, 1, 0.5)
    storage = LazyTensorStorage(10)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        sampler.sample(storage, 2)
    data = TensorDict({TRAJ: torch.zeros(2, dtype=torch.long), "step_count": torch.tensor([5, 6])}, [2])
    storage.set(torch.arange(2), data)  # steps 5, 6 only: no anchor has 3 stored steps before it
    assert not sampler.can_sample(storage, 2)
    with pytest.raises(RuntimeError, match="complete stored history"):
        sampler.sample(storage, 2)


def test_unsupported_storages_and_records_raise():
    sampler = GeometricTrajectoryWindowSampler(0, 1, 0.5)
    storage = LazyTensorStorage(10, ndim=2)
    TensorDictReplayBuffer(storage=storage).extend(_steps([4, 4], interleave=False).reshape(4, 2))
    with pytest.raises(NotImplementedError, match="only supports single-dimensional storages, got storage.ndim=2"):
        sampler.sample(storage, 2)
    listed = ListStorage(10)
    listed.set(torch.arange(2), [TensorDict({TRAJ: torch.tensor(0), "step_count": torch.tensor(i)}) for i in range(2)])
    with pytest.raises(TypeError, match="single-dimensional storage whose slices return a tensor collection"):
        sampler.sample(listed, 2)
    storage = LazyTensorStorage(10)
    duplicate = TensorDict({TRAJ: torch.zeros(3, dtype=torch.long), "step_count": torch.tensor([0, 1, 0])}, [3])
    storage.set(torch.arange(3), duplicate)
    with pytest.raises(RuntimeError, match="Found duplicate records for trajectory"):
        sampler.sample(storage, 2)


def test_the_kernel_never_draws_a_future_longer_than_any_anchor_has():
    # one run of steps 0..2 at slots 4, 2, 0: the largest future is 2 (max_future is 5)
    tables = window_tables(
        torch.tensor([4, 2, 0]), torch.tensor([0, 1, 2]), torch.tensor([0]), torch.tensor([3]),
        history=0, max_future=5, continuation_probability=0.9,
    )
    for u in (0.0, 0.5, 1.0 - 1e-12, 1.0):  # 1.0: the top of a cdf rounded below it
        index, valid, k, anchor = draw_windows(
            tables.slots, tables.back, tables.order, tables.counts, tables.cdf,
            torch.tensor([u], dtype=torch.float64), torch.tensor([0.0, 0.99], dtype=torch.float64), 0, 5,
        )
        assert int(k.max()) <= 2 and (anchor == 4).all() == (int(k[0, 0]) == 2)
        assert valid.sum(1).tolist() == [int(k[0, 0]) + 1] * 2
    assert int(k[0, 0]) == 2 and index[0].tolist() == [4, 2, 0, 0, 0, 0]
