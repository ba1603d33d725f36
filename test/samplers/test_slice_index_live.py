"""The live trajectory index of the slice samplers and ``Sequence`` (issue 30 item 1).

NOTE [live trajectory index] (trajectories/live_index.py): the trajectory boundaries are kept as sorted ends
in write time and updated on each append (wrap-around overwrites included), instead of being found again in the
whole storage after every write. These tests check that the index always equals a from-scratch search, that the
draws are exactly those of the from-scratch path for the same generator, that it is rebuilt (never stale) after
writes it was not told about (other processes, DataLoader workers, writes elsewhere than the newest row), that it
survives checkpoints, and ``can_sample`` / ``batch_size_multiplier``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    RandomSampler,
    Sequence,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers.trajectories.ends import find_trajectories
from torchrl.data.replay_buffers.trajectories.layout import ring_layout

DONE = ("next", "done")


class FromScratchSliceSampler(SliceSampler):
    """The draws of the path without the live index (every boundary found in the whole storage)."""

    def _uses_live_index(self) -> bool:
        return False


def steps(
    episode_lengths: list[int], first_episode: int = 0, first_t: int = 0, *, end_done=True
) -> TensorDict:
    """Rows of consecutive episodes: ``episode`` ids, a step counter ``t``, done flags on each episode's last step
    (not on the last row when ``end_done=False``: the episode goes on in the next write), and ``is_init``."""
    episode = torch.cat(
        [torch.full((n,), first_episode + i, dtype=torch.long) for i, n in enumerate(episode_lengths)]
    )
    n = episode.numel()
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[:-1, 0] = episode[1:] != episode[:-1]
    done[-1, 0] = end_done
    is_init = torch.zeros(n, 1, dtype=torch.bool)
    is_init[1:, 0] = episode[1:] != episode[:-1]
    terminated = done & (episode.unsqueeze(-1) % 2 == 0)
    return TensorDict(
        episode=episode,
        t=torch.arange(first_t, first_t + n),
        is_init=is_init,
        next=TensorDict(done=done, terminated=terminated, batch_size=[n]),
        batch_size=[n],
    )


def scratch(storage, key, is_done: bool):
    """``(starts, lengths)`` found from scratch in the whole storage (the reference of the index)."""
    n_rows, _, offset, last_row = ring_layout(storage)
    values = storage.get_entry(key)[:n_rows].reshape(n_rows, 1)
    found = find_trajectories(
        values, is_done=is_done, n_rows=n_rows, n_cols=1, offset=offset, last_row=last_row, ndim=1
    )
    return found.starts.numpy(), found.lengths.numpy()


def live_trajectories(sampler):
    starts, lengths = sampler._live.index.all_trajectories()
    return starts, lengths


def random_writes(draw_sizes, capacity: int, data_rng: np.random.Generator):
    """Chunks of rows whose episodes continue across chunks or end at random (some longer than the ring)."""
    episode, t = 0, 0
    for size in draw_sizes:
        lengths, left = [], size
        while left:
            n = int(data_rng.integers(1, 2 * capacity))
            lengths.append(min(n, left))
            left -= lengths[-1]
        chunk = steps(lengths, episode, t, end_done=bool(data_rng.integers(2)))
        yield chunk
        episode += len(lengths) - (0 if bool(chunk["next", "done"][-1]) else 1)
        if not bool(chunk["next", "done"][-1]) and data_rng.integers(3) == 0:
            episode += 1  # an id change without a done flag (traj_key and end_key disagree there)
        t += size


# -- the index equals a from-scratch search -----------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(3, 40),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=25),
    mode=st.sampled_from(["traj_key", "end_key"]),
    seed=st.integers(0, 2**16),
)
def test_the_index_equals_a_from_scratch_search_after_random_extends(capacity, sizes, mode, seed):
    kwargs = {"traj_key": "episode"} if mode == "traj_key" else {"end_key": DONE}
    sampler = SliceSampler(slice_len=2, strict_length=False, **kwargs)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=4)
    expected_rebuilds = 0
    for chunk in random_writes(sizes, capacity, np.random.default_rng(seed)):
        rebuilt_before = 0 if sampler._live is None else sampler._live.rebuilds
        rb.extend(chunk)
        rb.sample()
        if (
            sampler._live.rebuilds != rebuilt_before
        ):  # only the first write and writes of the whole ring rebuild
            expected_rebuilds += 1
            assert rebuilt_before == 0 or chunk.shape[0] >= capacity
        starts, lengths = live_trajectories(sampler)
        ref_starts, ref_lengths = scratch(
            rb.storage, "episode" if mode == "traj_key" else DONE, mode == "end_key"
        )
        np.testing.assert_array_equal(starts, ref_starts)
        np.testing.assert_array_equal(lengths, ref_lengths)
    assert sampler._live.rebuilds == expected_rebuilds


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(4, 40),
    sizes=st.lists(st.integers(1, 45), min_size=1, max_size=15),
    need=st.integers(2, 9),
    seed=st.integers(0, 2**16),
)
def test_the_eligible_trajectories_follow_cuts_removals_and_growth(capacity, sizes, need, seed):
    sampler = SliceSampler(slice_len=need, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)
    for chunk in random_writes(sizes, capacity, np.random.default_rng(seed)):
        rb.extend(chunk)
        if not sampler.can_sample(rb.storage, need):
            continue
        rb.sample(need)
        index = sampler._live.index
        first, n = index.all_serials()
        serials = np.arange(first, first + n)
        _, lengths = index.trajectories(serials)
        np.testing.assert_array_equal(index.eligible(need), serials[lengths >= need])


# -- the draws are those of the from-scratch path -----------------------------------------------------------
CONFIGS = [
    {"slice_len": 4},
    {"num_slices": 3},
    {"slice_len": 3, "strict_length": False},
    {"slice_len": 5, "strict_length": False, "pad_output": True},
    {"slice_len": 4, "span": True},
    {"slice_len": 6, "span": (1, 2), "strict_length": False},
    {"slice_len": 4, "end_key": DONE},
    {"slice_len": 4, "end_keys": [DONE, ("next", "terminated")]},
    {"slice_len": 4, "truncated_key": None},
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
def test_same_slices_and_info_as_the_from_scratch_path_for_the_same_generator(config, storage_cls, tmp_path):
    kwargs = dict(config)
    if "end_key" not in kwargs and "end_keys" not in kwargs:
        kwargs["traj_key"] = "episode"
    live, reference = SliceSampler(**kwargs), FromScratchSliceSampler(**kwargs)
    storage = storage_cls(50, scratch_dir=tmp_path) if storage_cls is LazyMemmapStorage else storage_cls(50)
    rb = TensorDictReplayBuffer(storage=storage, sampler=live)
    rng = np.random.default_rng(0)
    for i, chunk in enumerate(random_writes(rng.integers(1, 20, size=30).tolist(), 50, rng)):
        rb.extend(chunk)
        batch = 3 * config.get("slice_len", 4)
        for sampler, seed in ((live, i), (reference, i)):
            sampler._rng = torch.Generator().manual_seed(seed)
        try:
            expected = reference.sample(storage, batch)
        except RuntimeError as err:  # no trajectory long enough: the same error
            with pytest.raises(RuntimeError, match="long enough") as caught:
                live.sample(storage, batch)
            assert str(caught.value) == str(err)
            continue
        got = live.sample(storage, batch)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
        assert got[1].keys() == expected[1].keys()
        for key in expected[1]:
            torch.testing.assert_close(got[1][key], expected[1][key], rtol=0, atol=0)
    assert live._live.rebuilds == 1  # every write was applied incrementally


def test_without_replacement_draws_the_same_epochs_as_the_from_scratch_path():
    class FromScratch(SliceSamplerWithoutReplacement):
        def _uses_live_index(self) -> bool:
            return False

    live, reference = (
        cls(slice_len=3, traj_key="episode") for cls in (SliceSamplerWithoutReplacement, FromScratch)
    )
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(60), sampler=live)
    live._rng, reference._rng = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    t = 0
    for i in range(12):
        rb.extend(steps([4, 7, 2], 3 * i, t))
        t += 13
        for _ in range(2):
            assert torch.equal(live.sample(rb.storage, 6)[0][0], reference.sample(rb.storage, 6)[0][0])
    assert live._live.rebuilds == 1


def test_streaming_fallback_and_is_init_under_init_key_match_the_from_scratch_path():
    class FromScratch(StreamingSliceSampler):
        def _uses_live_index(self) -> bool:
            return False

    kwargs = dict(slice_len=4, traj_key="episode", init_key="is_init")
    live, reference = StreamingSliceSampler(**kwargs), FromScratch(**kwargs)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=live)
    ref_rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=reference)
    for i in range(10):
        chunk = steps([5, 6], 2 * i, 11 * i)
        rb.extend(chunk)
        ref_rb.extend(chunk)
        live._rng, reference._rng = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
        got, expected = live.sample(rb.storage, 16), reference.sample(ref_rb.storage, 16)
        assert torch.equal(got[0][0], expected[0][0])
        assert torch.equal(got[1]["is_init"], expected[1]["is_init"])


# -- writes the index was not told about ---------------------------------------------------------------------
def test_writes_elsewhere_than_the_newest_row_rebuild_the_index():
    sampler = SliceSampler(slice_len=2, traj_key="episode", strict_length=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler, batch_size=4)
    rb.extend(steps([10, 10]))
    rb.sample()
    storage = rb.storage
    rewrite = steps([3], first_episode=7)
    storage.set(torch.arange(5, 8), rewrite, set_cursor=False)  # a write the sampler is not told about
    rb.sample()
    assert sampler._live.rebuilds == 2
    np.testing.assert_array_equal(live_trajectories(sampler)[1], scratch(storage, "episode", False)[1])
    storage[torch.tensor([0, 1])] = steps([2], first_episode=9)  # item assignment: no cursor move
    rb.sample()
    assert sampler._live.rebuilds == 3
    np.testing.assert_array_equal(live_trajectories(sampler)[1], scratch(storage, "episode", False)[1])
    storage.set(torch.arange(2, 4), steps([2], first_episode=11))  # the newest row is now 3 of 20 filled
    assert sampler._boundaries(storage).live is None  # a layout the index does not follow: a full read
    assert (
        sampler._boundaries(storage).index.lengths.tolist() == scratch(storage, "episode", False)[1].tolist()
    )
    rb.sample()
    rb.empty()
    rb.extend(steps([4]))
    rb.sample()
    np.testing.assert_array_equal(live_trajectories(sampler)[1], [4])


def test_two_buffers_over_one_storage_share_the_writes_of_the_process():
    storage = LazyTensorStorage(50)
    writer_rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler())
    sampler = SliceSampler(slice_len=3, traj_key="episode")
    reader = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=6)
    writer_rb.extend(steps([8, 8]))
    reader.sample()
    for i in range(10):
        writer_rb.extend(steps([7], first_episode=2 + i))  # told through storage.mark_update (the listener)
        reader.sample()
    assert sampler._live.rebuilds == 1
    np.testing.assert_array_equal(live_trajectories(sampler)[1], scratch(storage, "episode", False)[1])


def test_sequence_follows_writes_incrementally_and_matches_a_fresh_unit():
    unit = Sequence(4, done_key=DONE)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(40), sampler=RandomSampler(), sample_unit=unit, batch_size=5
    )
    rng = np.random.default_rng(3)
    for chunk in random_writes(rng.integers(1, 15, size=25).tolist(), 40, rng):
        rb.extend(chunk)
        anchors = torch.from_numpy(rng.integers(0, len(rb.storage), size=6))
        got = unit.expand(anchors, {}, rb.storage)
        expected = Sequence(4, done_key=DONE).expand(anchors, {}, rb.storage)  # built from scratch
        assert torch.equal(got[0], expected[0])
        for key in expected[1]:
            assert torch.equal(got[1][key], expected[1][key])
    assert unit._live.rebuilds == 1  # one build, then incremental (told by the storage's listener)
    rb.sample()


# -- memory --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("episode_length", [1, 2, 3, 50])
def test_the_index_costs_at_most_16_bytes_per_stored_row(episode_length):
    capacity = 4000
    sampler = SliceSampler(slice_len=2, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=4)
    for i in range(30):
        n = 300
        rb.extend(steps([episode_length] * (n // episode_length), i * n, i * n))
        if sampler.can_sample(rb.storage, 4):
            rb.sample()
    assert sampler._live.index.nbytes() <= 16 * capacity


# -- workers -------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sampler_cls", [SliceSampler, SliceSamplerWithoutReplacement])
def test_dataloader_workers_see_rows_written_after_they_started(sampler_cls):
    sampler = sampler_cls(slice_len=4, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(120), sampler=sampler, batch_size=16)
    rb.extend(steps([10] * 6))
    rb.sample()  # the parent builds its index before the fork: the workers start with a copy of it
    dl = DataLoader(
        rb.as_dataset(num_batches=400),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
        collate_fn=tensordict_collate,
    )
    seen, t = set(), 60
    for i, batch in enumerate(dl):
        slices = batch["episode"].view(-1, 4)
        assert (slices == slices[:, :1]).all()  # never across an episode boundary
        assert (batch["t"].view(-1, 4).diff(dim=1) == 1).all()  # never across the ring's wrap
        seen.update(slices[:, 0].tolist())
        if i % 10 == 0 and t < 400:
            rb.extend(steps([10, 10], first_episode=100 + t // 10, first_t=t))  # wraps and overwrites
            t += 20
        if any(e >= 130 for e in seen):
            break
    assert any(e >= 130 for e in seen), sorted(seen)


# -- checkpoints ---------------------------------------------------------------------------------------------
def test_a_loaded_buffer_rebuilds_its_index_and_draws_the_same_slices(tmp_path):
    def make():
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(50), sampler=SliceSampler(slice_len=3, traj_key="episode"), batch_size=9
        )

    rb = make()
    for i in range(8):
        rb.extend(steps([4, 5], 2 * i, 9 * i))
        rb.sample()
    rb.dumps(tmp_path / "ckpt")
    loaded = make()
    loaded.loads(tmp_path / "ckpt")
    for seed in range(3):
        rb.sampler._rng = torch.Generator().manual_seed(seed)
        loaded.sampler._rng = torch.Generator().manual_seed(seed)
        assert torch.equal(
            rb.sampler.sample(rb.storage, 9)[0][0], loaded.sampler.sample(loaded.storage, 9)[0][0]
        )
    loaded.extend(steps([6], 30, 100))
    loaded.sample()
    np.testing.assert_array_equal(
        live_trajectories(loaded.sampler)[1], scratch(loaded.storage, "episode", False)[1]
    )


def test_a_pickled_sampler_carries_no_index():
    import pickle

    sampler = SliceSampler(slice_len=3, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), sampler=sampler, batch_size=9)
    rb.extend(steps([5, 5]))
    rb.sample()
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._live is None and sampler._live is not None
    copy.sample(rb.storage, 9)
    assert copy._live.rebuilds == 1


# -- can_sample ----------------------------------------------------------------------------------------------
def test_can_sample_of_every_slice_sampler():
    storage = LazyTensorStorage(40)
    samplers = {
        "slice": SliceSampler(slice_len=4, traj_key="episode"),
        "short": SliceSampler(slice_len=4, traj_key="episode", strict_length=False),
        "span": SliceSampler(slice_len=4, traj_key="episode", span=True),
        "wor": SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode", drop_last=True),
        "prioritized": PrioritizedSliceSampler(40, 1.0, 1.0, eps=0.0, slice_len=4, traj_key="episode"),
        "streaming": StreamingSliceSampler(slice_len=4, traj_key="episode"),
    }
    assert not any(s.can_sample(storage, 12) for s in samplers.values())  # empty
    storage.set(torch.arange(9), steps([3, 3, 3]))
    for sampler in samplers.values():
        sampler.mark_update(torch.arange(9), storage=storage)
    ready = {name: s.can_sample(storage, 12) for name, s in samplers.items()}
    assert ready == {
        "slice": False,
        "short": True,
        "span": True,
        "wor": False,
        "prioritized": False,
        "streaming": False,
    }
    storage.set(torch.arange(9, 17), steps([4, 4], first_episode=3))
    for sampler in samplers.values():
        sampler.mark_update(torch.arange(9, 17), storage=storage)
    samplers["prioritized"].extend(torch.arange(17))
    ready = {name: s.can_sample(storage, 12) for name, s in samplers.items()}
    assert ready == {
        "slice": True,
        "short": True,
        "span": True,
        "wor": False,
        "prioritized": True,
        "streaming": True,
    }
    assert samplers["wor"].can_sample(storage, 6)  # 2 slices of 3 steps: 5 trajectories are enough
    samplers["prioritized"].update_priority(torch.arange(17), torch.zeros(17))
    assert not samplers["prioritized"].can_sample(storage, 12)
    for sampler in samplers.values():
        if sampler.can_sample(storage, 12):
            sampler.sample(storage, 12)


def test_can_sample_refuses_what_sample_refuses():
    storage = LazyTensorStorage(40)
    storage.set(torch.arange(8), steps([8]))
    sampler = SliceSampler(slice_len=4, traj_key="episode")
    with pytest.raises(ValueError, match="not divisible by `slice_len`=4"):
        sampler.can_sample(storage, 6)
    with pytest.raises(ValueError, match="batch_size"):
        sampler.can_sample(storage, 0)
    with pytest.raises(RuntimeError, match="no trajectory information"):
        SliceSampler(slice_len=4, traj_key="missing", end_key="missing_too").can_sample(storage, 8)


# -- batch_size_multiplier -----------------------------------------------------------------------------------
def test_batch_size_multiplier_draws_that_many_slices_of_slice_len():
    sampler = SliceSampler(slice_len=4, traj_key="episode")
    assert sampler.batch_size_multiplier == 1 and sampler._batch_size_multiplier == 1
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=5)
    rb.extend(steps([10] * 6))
    sampler._batch_size_multiplier = 4  # TorchRL's spelling (CatFrames.make_rb_transform_and_sampler)
    assert sampler.batch_size_multiplier == 4
    batch = rb.sample()
    assert batch.shape == (20,)
    slices = batch["episode"].view(5, 4)
    assert (slices == slices[:, :1]).all() and (batch["t"].view(5, 4).diff(dim=1) == 1).all()
    assert sampler.can_sample(rb.storage, 5)
    sampler.batch_size_multiplier = 3
    with pytest.raises(ValueError, match="not divisible by `slice_len`=4"):
        sampler.sample(rb.storage, 5)
    for bad, error in ((0, ValueError), (2.0, TypeError), ("4", TypeError)):
        with pytest.raises(error, match="batch_size_multiplier"):
            sampler.batch_size_multiplier = bad
    assert sampler.batch_size_multiplier == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: PrioritizedSliceSampler(100, 1.0, 1.0, slice_len=4, traj_key="episode"),
        lambda: StreamingSliceSampler(slice_len=4, traj_key="episode"),
        lambda: SliceSamplerWithoutReplacement(slice_len=4, traj_key="episode"),
    ],
)
def test_batch_size_multiplier_in_every_slice_sampler(make):
    sampler = make()
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=3)
    rb.extend(steps([10] * 6))
    sampler.batch_size_multiplier = 4
    batch = rb.sample()
    assert batch.shape == (12,)
    assert (batch["episode"].view(3, 4) == batch["episode"].view(3, 4)[:, :1]).all()
