"""SliceSampler and SliceSamplerWithoutReplacement: invariants of the slices they return, info entries, short
trajectories, trajectory sources, the cache, epochs without replacement, and their errors.

Prioritized slices: test_prioritized_slice_sampler.py; TorchRL's keywords of the three classes:
test_slice_sampler_keywords.py."""

from __future__ import annotations

import pytest
import torch
from helpers.assertions import check_slices, reference_runs
from helpers.factories import DONE, MASK, TERM, TRUNC, episodes, ring_write
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, LazyStackStorage, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers.slice import SliceSampler
from torchrl.data.replay_buffers.samplers.slice_without_replacement import SliceSamplerWithoutReplacement


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


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage, LazyStackStorage])
def test_works_on_every_storage_kind(storage_cls):
    storage = storage_cls(50)
    data = episodes([10, 20, 5, 15])
    if storage_cls is LazyStackStorage:
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
# (forgotten at every write, on empty and when pickled, as every sampler's derived state: test_sampler_base.py)
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
