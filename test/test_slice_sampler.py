"""Tests of the trajectory slice samplers: invariants of the slices they return, and their errors."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.samplers.slice_without_replacement import SliceSamplerWithoutReplacement

DONE = ("next", "done")
TRUNC = ("next", "truncated")
TERM = ("next", "terminated")
MASK = ("collector", "mask")


# -- data helpers --------------------------------------------------------------------------------------------
def episodes(lengths, first_episode: int = 0, first_step: int = 0, n_envs: int | None = None) -> TensorDict:
    """Steps of consecutive trajectories: ``episode`` id, global step ``t``, done/terminated flags."""
    lengths = torch.as_tensor(lengths)
    n = int(lengths.sum())
    episode = torch.repeat_interleave(torch.arange(len(lengths)), lengths) + first_episode
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[lengths.cumsum(0) - 1] = True
    td = TensorDict(
        {
            "episode": episode,
            "t": torch.arange(first_step, first_step + n),
            "obs": torch.randn(n, 2),
            DONE: done,
            TERM: done & (episode % 2 == 0).unsqueeze(-1),
        },
        batch_size=[n],
    )
    return td


def ring_write(storage, data: TensorDict, cursor: int, split_wrap: bool = True) -> int:
    """Writes ``data`` at ``cursor`` as a round-robin writer would; returns the next cursor."""
    rows = storage._max_size_along_dim0(batched_data=data)
    n = data.shape[0]
    if n > rows:
        data, cursor, n = data[-rows:], (cursor + n - rows) % rows, rows
    index = (torch.arange(n) + cursor) % rows
    if split_wrap and n and index[-1] < index[0]:  # two writes (see test_wrapped_single_write_...)
        cut = rows - cursor
        storage.set(index[:cut], data[:cut])
        storage.set(index[cut:], data[cut:])
    else:
        storage.set(index, data)
    return (cursor + n) % rows


def reference_runs(storage, key: str, is_done: bool) -> dict:
    """Brute-force trajectories: maps (row, col) -> (run id, position in run), walking rows in time order."""
    n = storage.rows_written()
    last = storage._counters["last_row"]
    order = list(range(last + 1, n)) + list(range(last + 1)) if storage._is_full else list(range(n))
    data = storage.get(slice(None))
    values = data.get(key)
    n_cols = 1 if storage.ndim == 1 else data.shape[1]
    values = values.reshape(n, n_cols, -1)[..., 0]
    where = {}
    run = 0
    for col in range(n_cols):
        run += 1
        pos = 0
        for i, row in enumerate(order):
            if i:
                prev = order[i - 1]
                split = bool(values[prev, col]) if is_done else bool(values[prev, col] != values[row, col])
                if split:
                    run, pos = run + 1, 0
            where[(row, col)] = (run, pos)
            pos += 1
    return where


def check_slices(index, where: dict, slice_len: int) -> None:
    """Every slice lies in one reference trajectory, in consecutive time order."""
    rows = index[0].tolist()
    cols = index[1].tolist() if len(index) > 1 else [0] * len(rows)
    assert len(rows) % slice_len == 0
    for s in range(0, len(rows), slice_len):
        cells = [where[(r, c)] for r, c in zip(rows[s : s + slice_len], cols[s : s + slice_len])]
        assert len({run for run, _ in cells}) == 1, cells
        positions = [pos for _, pos in cells]
        assert positions == list(range(positions[0], positions[0] + slice_len)), positions


# -- invariants ----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=25),
    capacity=st.integers(4, 60),
    chunk=st.integers(1, 17),
    slice_len=st.integers(1, 5),
    mode=st.sampled_from(["traj_key", "end_key", "auto"]),
    cache=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_slices_stay_inside_trajectories_across_the_wrap(
    lengths, capacity, chunk, slice_len, mode, cache, seed
):
    storage = LazyTensorStorage(capacity)
    data = episodes(lengths)
    cursor = 0
    for start in range(0, data.shape[0], chunk):
        cursor = ring_write(storage, data[start : start + chunk], cursor)
    kwargs = {"traj_key": "episode"} if mode == "traj_key" else {"end_key": DONE} if mode == "end_key" else {}
    sampler = SliceSampler(slice_len=slice_len, cache_values=cache, **kwargs)
    sampler._rng = torch.Generator().manual_seed(seed)
    where = reference_runs(storage, "episode" if mode != "end_key" else DONE, is_done=mode == "end_key")
    run_lengths = {}
    for run, pos in where.values():
        run_lengths[run] = max(run_lengths.get(run, 0), pos + 1)
    if max(run_lengths.values()) < slice_len:
        with pytest.raises(RuntimeError, match="strict_length"):
            sampler.sample(storage, 4 * slice_len)
        return
    for _ in range(3):
        index, info = sampler.sample(storage, 4 * slice_len)
        assert isinstance(index, tuple) and len(index) == 1
        check_slices(index, where, slice_len)
        data = storage.get(index)
        assert (data["t"].view(4, slice_len).diff(dim=1) == 1).all()
    bounds = sampler._boundaries(storage)
    assert sorted(bounds.index.lengths.tolist()) == sorted(run_lengths.values())


@settings(max_examples=40, deadline=None)
@given(
    env_lengths=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=12), min_size=2, max_size=4),
    capacity_rows=st.integers(3, 25),
    chunk=st.integers(1, 11),
    slice_len=st.integers(1, 4),
    use_done=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_ndim2_slices_stay_in_one_env_and_trajectory(
    env_lengths, capacity_rows, chunk, slice_len, use_done, seed
):
    n_envs = len(env_lengths)
    columns = []
    for e, lengths in enumerate(env_lengths):
        td = episodes(lengths, first_episode=1000 * e)
        columns.append(td)
    steps = min(td.shape[0] for td in columns)
    data = torch.stack([td[:steps] for td in columns], 1)  # [time, envs]
    storage = LazyTensorStorage(capacity_rows * n_envs, ndim=2)
    cursor = 0
    for start in range(0, steps, chunk):
        cursor = ring_write(storage, data[start : start + chunk], cursor)
    kwargs = {"end_key": DONE} if use_done else {"traj_key": "episode"}
    sampler = SliceSampler(slice_len=slice_len, **kwargs)
    sampler._rng = torch.Generator().manual_seed(seed)
    where = reference_runs(storage, DONE if use_done else "episode", is_done=use_done)
    longest = {}
    for run, pos in where.values():
        longest[run] = max(longest.get(run, 0), pos + 1)
    if max(longest.values()) < slice_len:
        with pytest.raises(RuntimeError, match="slice_len"):
            sampler.sample(storage, 3 * slice_len)
        return
    index, info = sampler.sample(storage, 3 * slice_len)
    assert len(index) == 2
    check_slices(index, where, slice_len)
    assert (index[1].view(3, slice_len) == index[1].view(3, slice_len)[:, :1]).all()
    got = storage.get(index)
    assert (got["t"].view(3, slice_len).diff(dim=1) == 1).all()
    assert sorted(sampler._boundaries(storage).index.lengths.tolist()) == sorted(longest.values())


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage, ListStorage])
def test_works_on_every_storage_kind(storage_cls):
    storage = storage_cls(50)
    data = episodes([10, 20, 5, 15])
    if storage_cls is ListStorage:
        storage.set(list(range(50)), data)
    else:
        storage.set(torch.arange(50), data)
    index, info = SliceSampler(num_slices=4, traj_key="episode").sample(storage, 24)
    eps = torch.stack([storage.get(int(i))["episode"] for i in index[0]]).view(4, 6)
    assert (eps == eps[:, :1]).all()
    assert info[TRUNC].shape == (24, 1)


def test_wrapped_single_write_keeps_newest_and_oldest_apart():
    storage = LazyTensorStorage(10)
    ring_write(storage, episodes([8]), 0)
    ring_write(storage, episodes([6], first_episode=1, first_step=8)[:4], 8, split_wrap=False)
    # rows 8, 9, 0, 1 hold the ongoing episode 1 (no done yet); rows 2..7 the tail of episode 0
    sampler = SliceSampler(slice_len=3, end_key=DONE)
    for _ in range(20):
        index, _ = sampler.sample(storage, 30)
        t = storage.get(index)["t"].view(10, 3)
        assert (t.diff(dim=1) == 1).all()


def test_replay_buffer_integration_with_round_robin_writes():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64), sampler=SliceSampler(slice_len=4, traj_key="episode"), batch_size=32
    )
    data = episodes([7] * 20)
    for start in range(0, 140, 10):  # chunks of 10 divide 140 and never split a write across the wrap
        rb.extend(data[start : start + 10])
    batch = rb.sample()
    assert (batch["episode"].view(8, 4) == batch["episode"].view(8, 4)[:, :1]).all()
    assert (batch["t"].view(8, 4).diff(dim=1) == 1).all()
    assert batch[TRUNC].view(8, 4)[:, -1].all()


# -- info entries --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_slices", [1, 3, 8])
def test_truncated_marks_exactly_the_last_step_of_each_slice(num_slices):
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(60), episodes([6, 12, 30, 12]))
    sampler = SliceSampler(num_slices=num_slices, end_key=DONE)
    index, info = sampler.sample(storage, num_slices * 5)
    truncated = info[TRUNC].view(num_slices, 5)
    assert truncated[:, -1].all() and not truncated[:, :-1].any()
    data = storage.get(index)
    assert torch.equal(info[DONE], data[DONE] | info[TRUNC])
    assert torch.equal(info[TERM], data[TERM])


def test_terminated_is_false_when_not_stored_and_truncated_key_none_drops_flags():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), TensorDict(episode=torch.arange(20) // 5, batch_size=[20]))
    _, info = SliceSampler(slice_len=5).sample(storage, 10)
    assert not info[TERM].any() and info[TERM].shape == (10, 1)
    assert torch.equal(info[DONE], info[TRUNC])
    _, info = SliceSampler(slice_len=5, truncated_key=None).sample(storage, 10)
    assert info == {}
    _, info = SliceSampler(slice_len=5, truncated_key="cut").sample(storage, 10)
    assert info["cut"].view(2, 5)[:, -1].all()


# -- short trajectories --------------------------------------------------------------------------------------
def test_pad_output_pads_with_the_last_step_and_masks_padding():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(12), episodes([2, 3, 1, 6]))
    sampler = SliceSampler(slice_len=4, strict_length=False, pad_output=True, traj_key="episode")
    sampler._rng = torch.Generator().manual_seed(0)
    for _ in range(10):
        index, info = sampler.sample(storage, 16)
        assert index[0].numel() == 16
        mask = info.get(MASK, torch.ones(16, dtype=torch.bool)).view(4, 4)  # no mask: nothing padded
        data = storage.get(index)
        t, ep = data["t"].view(4, 4), data["episode"].view(4, 4)
        length = torch.tensor([2, 3, 1, 6])[ep[:, 0]]
        assert torch.equal(mask.sum(1), length.clamp_max(4))
        assert (mask[:, :-1] >= mask[:, 1:]).all()  # real steps first
        last_real = t.gather(1, (mask.sum(1, keepdim=True) - 1))
        assert ((t == last_real) | mask).all()  # padding repeats the last real step
        truncated = info[TRUNC].view(4, 4)
        assert ((truncated & mask).sum(1) == 1).all()
        assert torch.equal(truncated, (t == last_real) & mask)  # the padding is not truncated (TorchRL)


def test_non_strict_without_padding_returns_shorter_slices():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(6), episodes([1, 2, 3]))
    sampler = SliceSampler(slice_len=4, strict_length=False, traj_key="episode")
    index, info = sampler.sample(storage, 40)
    data = storage.get(index)
    assert index[0].numel() < 40
    assert int(info[TRUNC].sum()) == 10  # one last step per slice
    ends = info[TRUNC].squeeze(-1).nonzero().squeeze(-1).tolist()
    start = 0
    for end in ends:  # each slice is a whole trajectory, in time order
        ep = data["episode"][start : end + 1]
        assert (ep == ep[0]).all() and ep.numel() == int(ep[0]) + 1
        assert (data["t"][start : end + 1].diff() == 1).all()
        start = end + 1


@pytest.mark.parametrize("span", [True, 2, (True, False), (0, 3)])
def test_span_reaches_trajectory_edges_by_clamping(span):
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(30), episodes([10, 10, 10]))
    sampler = SliceSampler(slice_len=4, span=span, traj_key="episode")
    sampler._rng = torch.Generator().manual_seed(1)
    left, right = (span, span) if not isinstance(span, tuple) else span
    left = 3 if left is True else left
    right = 3 if right is True else right
    firsts, lasts = set(), set()
    for _ in range(50):
        index, info = sampler.sample(storage, 40)
        data = storage.get(index)
        pos = (data["t"] % 10).view(10, 4)
        assert (data["episode"].view(10, 4) == data["episode"].view(10, 4)[:, :1]).all()
        assert (pos.diff(dim=1) >= 0).all() and (pos.diff(dim=1) <= 1).all()
        repeats = pos.diff(dim=1) == 0
        assert (~repeats | (pos[:, 1:] == 0) | (pos[:, 1:] == 9)).all()  # repeats only at the edges
        firsts.update(pos[:, 0].tolist())
        lasts.update(pos[:, -1].tolist())
        assert torch.equal(info[TRUNC].view(10, 4), pos == pos[:, -1:])
    assert min(firsts) == 0 and max(firsts) == 6 + right
    assert max(lasts) == 9 and min(lasts) == 3 - left


def test_span_makes_short_trajectories_eligible():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(5), episodes([2, 3]))
    with pytest.raises(RuntimeError, match="span=True"):
        SliceSampler(slice_len=4, traj_key="episode").sample(storage, 8)
    index, _ = SliceSampler(slice_len=4, traj_key="episode", span=True).sample(storage, 8)
    assert index[0].numel() == 8


# -- trajectory sources --------------------------------------------------------------------------------------
def test_auto_probe_prefers_collector_traj_ids_then_episode_then_done():
    storage = LazyTensorStorage(20)
    td = TensorDict(
        {("collector", "traj_ids"): torch.arange(20) // 5, "episode": torch.zeros(20, dtype=torch.long)}, [20]
    )
    storage.set(torch.arange(20), td)
    index, _ = SliceSampler(slice_len=5).sample(storage, 20)
    assert (index[0].view(4, 5) // 5 == (index[0].view(4, 5) // 5)[:, :1]).all()
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), TensorDict({"episode": torch.arange(20) // 10}, [20]))
    with pytest.raises(RuntimeError, match="long enough"):
        SliceSampler(slice_len=11).sample(storage, 11)
    storage = LazyTensorStorage(20)
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[9] = True
    storage.set(torch.arange(20), TensorDict({DONE: done}, [20]))
    index, _ = SliceSampler(slice_len=10).sample(storage, 30)
    assert set(index[0].view(3, 10)[:, 0].tolist()) <= {0, 10}


def test_traj_key_missing_falls_back_to_end_key():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), episodes([10, 10]).exclude("episode"))
    index, _ = SliceSampler(slice_len=10, traj_key="episode", end_key=DONE).sample(storage, 20)
    assert set(index[0].view(2, 10)[:, 0].tolist()) <= {0, 10}


@pytest.mark.parametrize("kind", ["ends", "trajectories"])
def test_static_ends_and_trajectories(kind):
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(40), torch.arange(40.0))  # plain tensors: no keys at all
    ids = torch.arange(40) // 8
    values = ids if kind == "trajectories" else torch.arange(40) % 8 == 7
    sampler = SliceSampler(slice_len=8, cache_values=True, **{kind: values})
    index, info = sampler.sample(storage, 24)
    assert (ids[index[0]].view(3, 8) == ids[index[0]].view(3, 8)[:, :1]).all()
    assert info[TRUNC].view(3, 8)[:, -1].all()


def test_uniform_over_trajectories_not_steps():
    storage = LazyTensorStorage(200)
    storage.set(torch.arange(130), episodes([100, 10, 10, 10]))
    sampler = SliceSampler(slice_len=5, traj_key="episode")
    sampler._rng = torch.Generator().manual_seed(0)
    index, _ = sampler.sample(storage, 5 * 4000)
    counts = torch.bincount(storage.get(index[0][::5])["episode"], minlength=4).float()
    assert ((counts / 4000 - 0.25).abs() < 0.03).all(), counts


def test_generator_makes_draws_reproducible():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(100), episodes([25] * 4))
    outs = []
    for _ in range(2):
        sampler = SliceSampler(slice_len=5, traj_key="episode")
        sampler._rng = torch.Generator().manual_seed(3)
        torch.manual_seed(len(outs))  # the global generator must not matter
        outs.append(sampler.sample(storage, 50)[0][0])
    assert torch.equal(outs[0], outs[1])


# -- cache ---------------------------------------------------------------------------------------------------
def test_cache_is_reused_until_a_write_then_rebuilt():
    storage = LazyTensorStorage(60)
    storage.set(torch.arange(60), episodes([60]))
    sampler = SliceSampler(slice_len=5, cache_values=True, traj_key="episode")
    sampler.sample(storage, 10)
    first = sampler._cache
    sampler.sample(storage, 10)
    assert sampler._cache is first
    storage.set(torch.arange(60), episodes([5] * 12))  # same rows, new boundaries
    for _ in range(5):
        index, _ = sampler.sample(storage, 60)
        assert (index[0].view(12, 5) % 5 == torch.arange(5)).all()
    assert sampler._cache is not first
    no_cache = SliceSampler(slice_len=5, traj_key="episode")
    no_cache.sample(storage, 10)
    assert no_cache._cache is None


def test_cache_cleared_by_buffer_notifications_and_pickling():
    storage = ListStorage(30)
    storage.set(list(range(30)), episodes([30]))
    sampler = SliceSampler(slice_len=5, cache_values=True, traj_key="episode")
    sampler.sample(storage, 10)
    assert sampler._cache is not None
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone._cache is None and clone.slice_len == 5
    sampler.extend(torch.arange(3))
    assert sampler._cache is None
    sampler.sample(storage, 10)
    sampler.mark_update(torch.arange(3))
    assert sampler._cache is None


# -- without replacement -------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_slices", [1, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_without_replacement_visits_each_trajectory_once_per_epoch(num_slices, shuffle):
    storage = LazyTensorStorage(100)
    cursor = ring_write(storage, episodes([9] * 10), 0)
    ring_write(storage, episodes([9] * 3, first_episode=10, first_step=90), cursor)  # wraps
    sampler = SliceSamplerWithoutReplacement(num_slices=num_slices, shuffle=shuffle, traj_key="episode")
    assert sampler.requires_shared_state
    stored = torch.bincount(storage.get(slice(None))["episode"])
    live = (stored >= 3).nonzero().squeeze(-1).tolist()  # episode 1 keeps 1 step after the wrap: too short
    assert stored[1] == 1 and 1 not in live
    for _epoch in range(2):
        seen = []
        while True:
            index, info = sampler.sample(storage, num_slices * 3)
            ep = storage.get(index)["episode"].view(-1, 3)
            assert (ep == ep[:, :1]).all()
            seen += ep[:, 0].tolist()
            if sampler.ran_out:
                break
        assert sorted(seen) == live
        if not shuffle:
            assert seen == sorted(seen)


def test_without_replacement_drop_last_and_state_dict():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(70), episodes([10] * 7))
    sampler = SliceSamplerWithoutReplacement(num_slices=3, drop_last=True, traj_key="episode")
    counts = []
    while True:
        index, _ = sampler.sample(storage, 6)
        counts.append(index[0].numel() // 2)
        if sampler.ran_out:
            break
    assert counts == [3, 3]  # the 7th trajectory is dropped
    sampler.sample(storage, 6)
    state = sampler.state_dict()
    other = SliceSamplerWithoutReplacement(num_slices=3, drop_last=True, traj_key="episode")
    other.load_state_dict(state)
    a = storage.get(sampler.sample(storage, 6)[0])["episode"][::2]
    b = storage.get(other.sample(storage, 6)[0])["episode"][::2]
    assert torch.equal(a, b)
    keep = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode")
    ran_out = [(keep.sample(storage, 6)[0][0].numel(), keep.ran_out) for _ in range(3)]
    assert ran_out == [(6, False), (6, False), (2, True)]


def test_without_replacement_drop_last_with_too_few_trajectories():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(20), episodes([10, 10]))
    with pytest.raises(ValueError, match="drop_last"):
        SliceSamplerWithoutReplacement(num_slices=3, drop_last=True, traj_key="episode").sample(storage, 6)


# -- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, TypeError, "num_slices.*slice_len"),
        ({"num_slices": 2, "slice_len": 3}, TypeError, "num_slices.*slice_len"),
        ({"slice_len": 0}, ValueError, "slice_len"),
        ({"num_slices": 1.5}, ValueError, "num_slices"),
        ({"slice_len": 2, "pad_output": True}, ValueError, "pad_output.*strict_length"),
        ({"slice_len": 2, "ends": torch.zeros(3, dtype=torch.bool)}, ValueError, "cache_values"),
        (
            {"slice_len": 2, "ends": torch.zeros(3, dtype=torch.bool), "traj_key": "e", "cache_values": True},
            ValueError,
            "end_key.*traj_key",
        ),
        (
            {"slice_len": 2, "ends": torch.zeros(3), "trajectories": torch.zeros(3), "cache_values": True},
            ValueError,
            "ends.*trajectories",
        ),
        ({"slice_len": 2, "ends": [0, 1], "cache_values": True}, TypeError, "ends"),
        ({"slice_len": 2, "span": -1}, TypeError, "span"),
        ({"slice_len": 2, "span": (1, 2, 3)}, TypeError, "span"),
        ({"slice_len": 2, "traj_key": 3}, TypeError, "key"),
        ({"slice_len": 2, "end_key": "a", "end_keys": ["b"]}, ValueError, "end_key.*end_keys"),
        ({"slice_len": 2, "end_keys": "done"}, TypeError, "`end_keys` must be a list of keys, got 'done'"),
        ({"slice_len": 2, "end_keys": []}, ValueError, "`end_keys` is empty"),
        ({"slice_len": 2, "end_keys": ["a", 3]}, TypeError, "key must be a str"),
        (
            {"slice_len": 2, "ends": torch.zeros(3) == 1, "end_keys": ["a"], "cache_values": True},
            ValueError,
            "excludes `end_key`/`end_keys`/`traj_key`",
        ),
        ({"slice_len": 2, "compile": "yes"}, TypeError, "`compile` must be a bool or a dict"),
        ({"slice_len": 2, "use_gpu": "gpu0"}, TypeError, "`use_gpu` must be a bool or a torch.device"),
        ({"slice_len": 2, "use_gpu": 1}, TypeError, "`use_gpu` must be a bool or a torch.device"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SliceSampler(**kwargs)


@pytest.mark.parametrize("kwargs, batch", [({"slice_len": 4}, 10), ({"num_slices": 3}, 10)])
def test_batch_size_not_divisible(kwargs, batch):
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), episodes([20]))
    with pytest.raises(ValueError, match="not divisible"):
        SliceSampler(**kwargs).sample(storage, batch)


def test_no_trajectory_long_enough_says_which_lengths_exist():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(9), episodes([3, 3, 2, 1]))
    with pytest.raises(RuntimeError, match=r"3 \(x2\).*strict_length=False"):
        SliceSampler(slice_len=4, traj_key="episode").sample(storage, 8)


def test_missing_keys_and_empty_storage():
    storage = LazyTensorStorage(20)
    with pytest.raises(RuntimeError, match="empty"):
        SliceSampler(slice_len=2).sample(storage, 4)
    storage.set(torch.arange(4), TensorDict(obs=torch.zeros(4, 1), batch_size=[4]))
    with pytest.raises(RuntimeError, match="traj_key.*end_key"):
        SliceSampler(slice_len=2).sample(storage, 4)
    with pytest.raises(RuntimeError, match="traj_key='episode'"):
        SliceSampler(slice_len=2, traj_key="episode").sample(storage, 4)
    with pytest.raises(RuntimeError, match="end_key=\\('next', 'done'\\)"):
        SliceSampler(slice_len=2, end_key=DONE).sample(storage, 4)
    tensors = LazyTensorStorage(20)
    tensors.set(torch.arange(4), torch.zeros(4))
    with pytest.raises(RuntimeError, match="ends"):
        SliceSampler(slice_len=2).sample(tensors, 4)


def test_static_ends_of_the_wrong_length():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(10), torch.zeros(10))
    sampler = SliceSampler(slice_len=2, ends=torch.zeros(7, dtype=torch.bool), cache_values=True)
    with pytest.raises(ValueError, match="one value per"):
        sampler.sample(storage, 4)


def test_declared_state_and_repr():
    assert SliceSampler.requires_shared_state is False
    assert SliceSamplerWithoutReplacement.requires_shared_state is True
    assert SliceSampler(slice_len=3).state_dict() == {}
    assert "slice_len=3" in repr(SliceSampler(slice_len=3))
    without = repr(SliceSamplerWithoutReplacement(num_slices=2))
    assert "drop_last=False" in without
    # the repr shows arguments the class takes: not pad_output/span/cache_values, fixed in this class
    assert not any(f"{name}=" in without for name in ("pad_output", "span", "cache_values"))


# -- prioritized slices --------------------------------------------------------------------------------------
def _prioritized(storage, n, **kwargs):
    kwargs.setdefault("traj_key", "episode")
    sampler = PrioritizedSliceSampler(storage.max_size, alpha=1.0, beta=0.5, eps=0.0, **kwargs)
    sampler.extend(torch.arange(n))
    sampler._rng = torch.Generator().manual_seed(0)
    return sampler


def test_prioritized_starts_only_where_a_full_slice_fits():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(40), episodes([10] * 4))
    sampler = _prioritized(storage, 40, slice_len=4)
    priority = torch.zeros(40)
    priority[[2, 8, 15]] = torch.tensor([1.0, 100.0, 3.0])  # 8 cannot start a slice of 4 (episode ends at 9)
    sampler.update_priority(torch.arange(40), priority)
    index, info = sampler.sample(storage, 4 * 4000)
    starts = index[0].view(-1, 4)[:, 0]
    counts = torch.bincount(starts, minlength=40)
    assert set(starts.unique().tolist()) == {2, 15}
    assert abs(counts[15] / counts[2] - 3.0) < 0.35, counts[[2, 15]]
    weight = info["priority_weight"].view(-1, 4)
    assert (weight == weight[:, :1]).all()  # one weight per slice, on every step
    expected = torch.where(starts == 2, torch.tensor(1.0), torch.tensor(3.0**-0.5))
    assert torch.allclose(weight[:, 0], expected) and (weight <= 1).all()


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=20),
    capacity=st.integers(8, 50),
    slice_len=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_prioritized_slices_stay_inside_trajectories_across_the_wrap(lengths, capacity, slice_len, seed):
    storage = LazyTensorStorage(capacity)
    data = episodes(lengths)
    cursor = 0
    for start in range(0, data.shape[0], 7):
        cursor = ring_write(storage, data[start : start + 7], cursor)
    sampler = _prioritized(storage, len(storage), slice_len=slice_len, cache_values=True)
    gen = torch.Generator().manual_seed(seed)
    sampler.update_priority(torch.arange(len(storage)), torch.rand(len(storage), generator=gen) + 0.01)
    where = reference_runs(storage, "episode", is_done=False)
    longest = {}
    for run, pos in where.values():
        longest[run] = max(longest.get(run, 0), pos + 1)
    if max(longest.values()) < slice_len:
        with pytest.raises(RuntimeError, match="long enough"):
            sampler.sample(storage, 2 * slice_len)
        return
    index, info = sampler.sample(storage, 5 * slice_len)
    check_slices(index, where, slice_len)
    assert info["priority_weight"].shape == (5 * slice_len,)
    assert info[TRUNC].view(5, slice_len)[:, -1].all()
    sampler.update_priority(index, torch.ones(5 * slice_len))  # the batch index goes back as is


def test_prioritized_slice_errors_state_and_warnings():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), episodes([10, 10]))
    sampler = PrioritizedSliceSampler(20, 1.0, 1.0, slice_len=5, traj_key="episode")
    assert sampler.requires_shared_state
    with pytest.raises(RuntimeError, match="priority zero"):
        sampler.sample(storage, 10)  # the sampler was never told about the writes
    sampler.extend(torch.arange(20))
    sampler.sample(storage, 10)
    state = sampler.state_dict()
    other = PrioritizedSliceSampler(20, 1.0, 1.0, slice_len=5, traj_key="episode")
    other.load_state_dict(state)
    other.sample(storage, 10)
    with pytest.raises(RuntimeError, match="max_capacity"):
        PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=5).sample(storage, 10)
    with pytest.warns(UserWarning, match="left part of `span`"):
        spanned = PrioritizedSliceSampler(20, 1.0, 1.0, slice_len=5, span=True, traj_key="episode")
    assert spanned.span == (False, True)
    with pytest.raises(TypeError, match="num_slices.*slice_len"):
        PrioritizedSliceSampler(20, 1.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedSliceSampler(20, -1.0, 1.0, slice_len=2)
    sampler._empty()
    assert sampler._cache is None


def test_prioritized_slice_through_a_replay_buffer():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(50),
        sampler=PrioritizedSliceSampler(50, 0.7, 0.5, num_slices=4, traj_key="episode", cache_values=True),
        batch_size=20,
    )
    rb.extend(episodes([10] * 5))
    batch = rb.sample()
    ep = batch["episode"].view(4, 5)
    assert (ep == ep[:, :1]).all()
    assert batch["priority_weight"].shape == (20,)
    rb.update_priority(batch["index"], torch.rand(20))


def test_prioritized_slices_on_ndim2_storage():
    data = torch.stack([episodes([6, 6]), episodes([4, 8], first_episode=10)], 1)  # [12, 2]
    storage = LazyTensorStorage(24, ndim=2)
    storage.set(torch.arange(12), data)
    sampler = PrioritizedSliceSampler(24, 1.0, 1.0, slice_len=5, traj_key="episode")
    sampler.extend(torch.arange(24))
    index, info = sampler.sample(storage, 50)
    assert len(index) == 2
    got = storage.get(index)
    assert (got["episode"].view(10, 5) == got["episode"].view(10, 5)[:, :1]).all()
    assert (got["t"].view(10, 5).diff(dim=1) == 1).all()
    assert set(got["episode"].tolist()) <= {0, 1, 11}  # episode 10 (4 steps) is too short


# -- TorchRL-compatible signatures ---------------------------------------------------------------------------
SLICE_CLASSES = [SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler]
_SLICE_DEFAULTS = {
    "num_slices": None,
    "slice_len": None,
    "drop_last": False,
    "end_key": None,
    "end_keys": None,
    "traj_key": None,
    "ends": None,
    "trajectories": None,
    "cache_values": False,
    "truncated_key": ("next", "truncated"),
    "strict_length": True,
    "pad_output": False,
    "shuffle": True,
    "compile": False,
    "span": False,
    "use_gpu": False,
    "max_priority_within_buffer": False,
}


@pytest.mark.parametrize(
    "cls, positional, keywords",
    [
        (
            SliceSampler,
            [],
            "num_slices slice_len end_key end_keys traj_key ends trajectories cache_values truncated_key "
            "strict_length pad_output compile span use_gpu",
        ),
        (
            SliceSamplerWithoutReplacement,
            [],
            "num_slices slice_len drop_last end_key end_keys traj_key ends trajectories truncated_key "
            "strict_length shuffle compile use_gpu",
        ),
        (
            PrioritizedSliceSampler,
            [(name, inspect.Parameter.empty) for name in ("max_capacity", "alpha", "beta")]
            + [("eps", 1e-8), ("dtype", torch.float), ("reduction", "max")],
            "num_slices slice_len end_key end_keys traj_key ends trajectories cache_values truncated_key "
            "strict_length compile span max_priority_within_buffer",
        ),
    ],
)
def test_signatures_match_torchrl_order_and_defaults(cls, positional, keywords):
    params = list(inspect.signature(cls).parameters.values())
    head, tail = params[: len(positional)], params[len(positional) :]
    assert [(p.name, p.default) for p in head] == positional
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in head)
    assert [p.name for p in tail] == keywords.split()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in tail)
    assert {p.name: p.default for p in tail} == {name: _SLICE_DEFAULTS[name] for name in keywords.split()}


def _slice_sampler(cls, storage, seed: int = 0, **kwargs):
    """A slice sampler of class ``cls`` seeded with ``seed``, told about the writes when prioritized."""
    if cls is PrioritizedSliceSampler:
        sampler = cls(storage.max_size, 1.0, 1.0, **kwargs)
        sampler.extend(torch.arange(len(storage)))
    else:
        sampler = cls(**kwargs)
    sampler._rng = torch.Generator().manual_seed(seed)
    return sampler


# -- compile / use_gpu ---------------------------------------------------------------------------------------
_HINTS = [{"compile": True}, {"compile": {"mode": "reduce-overhead"}}, {"use_gpu": True}, {"use_gpu": "cpu"}]


@pytest.mark.parametrize(
    "cls, hints",
    [(cls, hints) for cls in (SliceSampler, SliceSamplerWithoutReplacement) for hints in _HINTS]
    # TorchRL's PrioritizedSliceSampler has no use_gpu argument
    + [(PrioritizedSliceSampler, hints) for hints in _HINTS if "compile" in hints],
)
def test_compile_and_use_gpu_are_accepted_and_change_nothing(cls, hints):
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(60), episodes([6, 12, 30, 12]))
    plain = _slice_sampler(cls, storage, num_slices=3, traj_key="episode")
    hinted = _slice_sampler(cls, storage, num_slices=3, traj_key="episode", **hints)
    for _ in range(3):
        (index_a, info_a), (index_b, info_b) = plain.sample(storage, 15), hinted.sample(storage, 15)
        assert torch.equal(index_a[0], index_b[0])
        assert info_a.keys() == info_b.keys() and all(torch.equal(info_a[k], info_b[k]) for k in info_a)
    name, value = next(iter(hints.items()))
    assert f"{name}=" in repr(hinted) and f"{name}=" not in repr(plain)
    assert getattr(hinted, name) == (torch.device(value) if isinstance(value, str) else value)


# -- end_keys ------------------------------------------------------------------------------------------------
def _flagged_steps(n: int = 40) -> TensorDict:
    """Steps ended by terminated (rows 9, 24) or truncated (rows 4, 16, 31) flags; no ("next", "done")."""
    terminated = torch.zeros(n, 1, dtype=torch.bool)
    truncated = torch.zeros(n, 1, dtype=torch.bool)
    terminated[[9, 24]] = True
    truncated[[4, 16, 31]] = True
    return TensorDict({"t": torch.arange(n), TERM: terminated, TRUNC: truncated}, [n])


@pytest.mark.parametrize("cls", SLICE_CLASSES)
@pytest.mark.parametrize(
    "kwargs, lengths",
    [
        ({"end_keys": [TERM, TRUNC]}, [5, 5, 7, 8, 7, 8]),
        ({"end_keys": [TERM, "not_stored", TRUNC]}, [5, 5, 7, 8, 7, 8]),
        ({"end_keys": [TERM, "not_stored"]}, [10, 15, 15]),
        ({"end_keys": (TERM,)}, [10, 15, 15]),
        ({"end_key": TERM}, [10, 15, 15]),
    ],
)
def test_end_keys_are_or_ed_and_missing_ones_skipped(cls, kwargs, lengths):
    storage = LazyTensorStorage(50)
    data = _flagged_steps()
    storage.set(torch.arange(40), data)
    sampler = _slice_sampler(cls, storage, num_slices=4, **kwargs)
    assert sampler._boundaries(storage).index.lengths.tolist() == lengths
    ends = torch.tensor(lengths).cumsum(0) - 1
    segment = torch.bucketize(torch.arange(40), ends)  # trajectory of each step
    for _ in range(5):
        index, info = sampler.sample(storage, 20)
        seg = segment[index[0]].view(-1, 5)
        assert (seg == seg[:, :1]).all()
        assert (data["t"][index[0]].view(-1, 5).diff(dim=1) == 1).all()
        stored = torch.zeros(40, 1, dtype=torch.bool)
        stored[ends] = True  # ("next", "done") is not stored: the done info is the end flags used
        assert torch.equal(info[DONE], stored[index[0]] | info[TRUNC])


@pytest.mark.parametrize(
    "kwargs, entries, lengths",
    [
        ({"end_keys": ["a", "b"]}, {"episode": torch.arange(20) // 4}, [4] * 5),
        ({"end_keys": ["a"], "traj_key": "episode"}, {"episode": torch.arange(20) // 10}, [10, 10]),
        ({"end_key": "a"}, {("collector", "traj_ids"): torch.arange(20) // 5}, [5] * 4),
        ({"traj_key": "missing"}, {DONE: (torch.arange(20) % 10 == 9).unsqueeze(-1)}, [10, 10]),
    ],
    ids=["end_keys->episode", "end_keys->traj_key", "end_key->collector", "traj_key->done"],
)
@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, ListStorage])
def test_missing_keys_fall_back_to_the_other_kind(kwargs, entries, lengths, storage_cls):
    storage = storage_cls(20)
    rows = torch.arange(20) if storage_cls is LazyTensorStorage else list(range(20))
    storage.set(rows, TensorDict(entries, [20]))
    sampler = SliceSampler(slice_len=2, **kwargs)
    assert sampler._boundaries(storage).index.lengths.tolist() == lengths


def test_no_stored_end_key_nor_trajectory_id_names_every_key_tried():
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(4), TensorDict(obs=torch.zeros(4, 1), batch_size=[4]))
    tried = r"\['a', 'b', \('collector', 'traj_ids'\), 'episode'\]"
    with pytest.raises(RuntimeError, match=tried + r" \(from end_keys=\('a', 'b'\)\)"):
        SliceSampler(slice_len=2, end_keys=["a", "b"]).sample(storage, 4)


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, ListStorage])
def test_an_end_key_naming_a_group_of_entries_says_to_pass_a_list(storage_cls):
    storage = storage_cls(20)
    data = episodes([10, 10])
    storage.set(torch.arange(20) if storage_cls is LazyTensorStorage else list(range(20)), data)
    sampler = SliceSampler(slice_len=2, end_keys=("next", "done"))  # two keys, "next" and "done"
    with pytest.raises(ValueError, match=r"'next' is a group of entries.*end_keys=\[\('next', 'done'\)"):
        sampler.sample(storage, 4)


# -- is_init -------------------------------------------------------------------------------------------------
_IS_INIT_MODES = {
    "strict": {},
    "span": {"span": (0, 2)},
    "left_span": {"span": True},
    "pad": {"strict_length": False, "pad_output": True, "span": True},
    "drop": {"strict_length": False, "span": (2, 1)},
    "non_strict": {"strict_length": False},  # short trajectories give short slices
}


def _with_is_init(lengths, extra_every: int = 7) -> TensorDict:
    """``episodes(lengths)`` plus a stored ``is_init``: True at each trajectory start and every few steps."""
    data = episodes(lengths)
    n = data.shape[0]
    is_init = torch.zeros(n, 1, dtype=torch.bool)
    is_init[torch.as_tensor(lengths).cumsum(0) - torch.as_tensor(lengths)] = True
    is_init[::extra_every] = True
    data["is_init"] = is_init
    return data


def _slice_firsts(info, slice_len: int, dropped: bool) -> torch.Tensor:
    """The first step of each slice: position 0 of each, or (short slices) the step after a slice's last."""
    truncated = info[TRUNC].view(-1)
    if not dropped:
        return (torch.arange(truncated.numel()) % slice_len == 0).unsqueeze(-1)
    return torch.cat([torch.ones(1, dtype=torch.bool), truncated[:-1]]).unsqueeze(-1)


@pytest.mark.parametrize(
    "cls, mode",
    [(SliceSampler, mode) for mode in _IS_INIT_MODES]
    + [(SliceSamplerWithoutReplacement, "strict"), (SliceSamplerWithoutReplacement, "non_strict")]
    + [(PrioritizedSliceSampler, mode) for mode in ("strict", "span", "non_strict")],
)
def test_is_init_marks_slice_starts_and_stored_init_steps(cls, mode):
    kwargs = dict(_IS_INIT_MODES[mode])
    storage = LazyTensorStorage(100)
    data = _with_is_init([3, 8, 12, 2, 9])
    storage.set(torch.arange(34), data)
    sampler = _slice_sampler(cls, storage, num_slices=5, traj_key="episode", **kwargs)
    for _ in range(10):
        index, info = sampler.sample(storage, 20)
        is_init = info["is_init"]
        assert is_init.dtype == torch.bool and is_init.shape == (index[0].numel(), 1)
        expected = _slice_firsts(info, 4, dropped=mode in ("drop", "non_strict")) | data["is_init"][index[0]]
        assert torch.equal(is_init, expected)


@pytest.mark.parametrize("cls", SLICE_CLASSES)
def test_is_init_only_when_stored_and_independent_of_truncated_key(cls):
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(40), episodes([10] * 4))
    assert "is_init" not in _slice_sampler(cls, storage, slice_len=5).sample(storage, 10)[1]
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(40), _with_is_init([10] * 4))
    _, info = _slice_sampler(cls, storage, slice_len=5, truncated_key=None).sample(storage, 10)
    expected = {"is_init", "priority_weight"} if cls is PrioritizedSliceSampler else {"is_init"}
    assert set(info) == expected
    assert info["is_init"].view(-1, 5)[:, 0].all()


def test_is_init_on_ndim2_storage_and_through_a_buffer():
    data = torch.stack([_with_is_init([6, 6], extra_every=5), _with_is_init([4, 8], extra_every=3)], 1)
    storage = LazyTensorStorage(24, ndim=2)
    storage.set(torch.arange(12), data)
    sampler = SliceSampler(slice_len=3, traj_key="episode")
    index, info = sampler.sample(storage, 30)
    first = (torch.arange(30) % 3 == 0).unsqueeze(-1)
    assert torch.equal(info["is_init"], first | data["is_init"][index])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=12)
    rb.extend(_with_is_init([10, 10], extra_every=50))  # stored True only at trajectory starts
    batch = rb.sample()
    assert batch["is_init"].view(4, 3)[:, 0].all()
    assert torch.equal(batch["is_init"].view(4, 3)[:, 1:], (batch["t"].view(4, 3) % 10 == 0)[:, 1:])


# -- replacement= --------------------------------------------------------------------------------------------
def test_slice_sampler_replacement_false_builds_slice_sampler_without_replacement():
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(60), episodes([10] * 6))
    sampler = SliceSampler(
        num_slices=2, end_keys=[DONE], strict_length=False, compile=True, replacement=False, shuffle=False
    )
    assert type(sampler) is SliceSamplerWithoutReplacement
    assert sampler.end_keys == (DONE,) and sampler.strict_length is False and sampler.compile is True
    assert sampler.shuffle is False and sampler.drop_last is False
    seen = []
    while not sampler.ran_out:
        index, _ = sampler.sample(storage, 10)
        seen += storage.get(index)["episode"][::5].tolist()
    assert seen == list(range(6))


@pytest.mark.parametrize(
    "name, value", [("cache_values", True), ("cache_values", False), ("pad_output", True)]
)
def test_slice_sampler_replacement_false_refuses_what_the_class_without_replacement_lacks(name, value):
    kwargs = {name: value, "strict_length": not (name == "pad_output")}
    with pytest.raises(TypeError, match=rf"SliceSamplerWithoutReplacement, which does not take `{name}`"):
        SliceSampler(slice_len=2, replacement=False, **kwargs)
    with pytest.raises(TypeError, match=r"`span`.*\(got span=2\).*SliceSampler without `replacement`"):
        SliceSampler(slice_len=2, replacement=False, span=2)


def _without(**kwargs):
    return SliceSamplerWithoutReplacement(num_slices=2, **kwargs)


def _prioritized_slices(**kwargs):
    return PrioritizedSliceSampler(10, 1.0, 1.0, num_slices=2, **kwargs)


@pytest.mark.parametrize(
    "build, replacement, expected",
    [
        (lambda **kw: SliceSampler(slice_len=2, **kw), True, SliceSampler),
        (_without, False, SliceSamplerWithoutReplacement),
        (_prioritized_slices, True, PrioritizedSliceSampler),
        (_without, True, r"SliceSamplerWithoutReplacement samples without replacement.*Use SliceSampler"),
        (_prioritized_slices, False, r"PrioritizedSliceSampler has no variant.*Use a sampler without"),
    ],
    ids=["slice-true", "without-false", "prioritized-true", "without-true", "prioritized-false"],
)
def test_replacement_on_each_slice_sampler(build, replacement, expected):
    if isinstance(expected, str):
        with pytest.raises(TypeError, match=expected):
            build(replacement=replacement)
        return
    sampler = build(replacement=replacement)
    assert type(sampler) is expected and repr(sampler) == repr(build())


@pytest.mark.parametrize(
    "round_trip", [lambda obj: pickle.loads(pickle.dumps(obj)), copy.deepcopy], ids=["pickle", "deepcopy"]
)
@pytest.mark.parametrize(
    "build",
    [
        lambda: SliceSampler(
            num_slices=3, end_keys=[DONE, TERM], cache_values=True, compile={"mode": "default"}, use_gpu=True
        ),
        lambda: SliceSampler(num_slices=3, traj_key="episode", replacement=False, drop_last=True),
        lambda: PrioritizedSliceSampler(60, 0.8, 0.5, num_slices=3, end_keys=[DONE], compile=True),
    ],
    ids=["slice", "without_replacement", "prioritized"],
)
def test_slice_samplers_pickle_and_copy_with_their_new_arguments(build, round_trip):
    storage = LazyTensorStorage(60)
    storage.set(torch.arange(60), _with_is_init([10, 12, 8, 14, 16]))
    sampler = build()
    sampler.extend(torch.arange(60))
    if isinstance(sampler, PrioritizedSliceSampler):
        sampler.update_priority(torch.arange(60), torch.rand(60, generator=torch.Generator().manual_seed(0)))
    sampler.sample(storage, 12)  # fills caches, moves an epoch forward
    clone = round_trip(sampler)
    assert type(clone) is type(sampler) and repr(clone) == repr(sampler)
    for s in (sampler, clone):
        s._rng = torch.Generator().manual_seed(7)
    (index_a, info_a), (index_b, info_b) = sampler.sample(storage, 12), clone.sample(storage, 12)
    assert torch.equal(index_a[0], index_b[0])
    assert info_a.keys() == info_b.keys() and all(torch.equal(info_a[k], info_b[k]) for k in info_a)
