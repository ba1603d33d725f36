"""NextStateReconstructor: ("next", obs) rebuilt at sample time from the following row.

Checked against a brute-force loop over the rule, through a real buffer with a SliceSampler (inside a slice the
rebuilt next observation is the stored one, at the slice ends it is the fill value), and for the bytes it saves.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer, SliceSampler, TensorDictReplayBuffer
from torchrl.envs.transforms import NextStateReconstructor


def episodes(lengths, obs_shape=(), dtype=torch.float32) -> TensorDict:
    """Episodes of the given lengths, one after the other: obs = global step number, next obs = obs + 1."""
    episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    count = torch.cat([torch.arange(n) for n in lengths])
    n = len(episode)
    obs = torch.arange(n, dtype=dtype).reshape(n, *[1] * len(obs_shape)).expand(n, *obs_shape).clone()
    done = (count == torch.tensor([lengths[e] - 1 for e in episode.tolist()])).unsqueeze(-1)
    return TensorDict({"observation": obs, "episode": episode, "step_count": count,
                       "next": {"observation": obs + 1, "done": done}}, batch_size=[n])


def brute_force(batch: TensorDict, traj_key, done_key, step_count_key, fill) -> torch.Tensor:
    obs = batch["observation"]
    out = torch.full_like(obs, fill)
    for i in range(batch.batch_size[0] - 1):
        ok = True
        if traj_key is not None:
            ok &= bool(batch[traj_key][i] == batch[traj_key][i + 1])
        if done_key is not None:
            ok &= not bool(batch[done_key][i].reshape(-1)[0])
        if step_count_key is not None:
            ok &= bool(batch[step_count_key][i + 1] == batch[step_count_key][i] + 1)
        if ok:
            out[i] = obs[i + 1]
    return out


@pytest.mark.parametrize("traj_key", ["episode", None])
@pytest.mark.parametrize("done_key", [("next", "done"), None])
@pytest.mark.parametrize("step_count_key", ["step_count", None])
def test_values_equal_a_brute_force_loop(traj_key, done_key, step_count_key):
    data = episodes([5, 3, 7, 1, 4])
    g = torch.Generator().manual_seed(0)
    order = torch.cat([torch.arange(20), torch.randint(0, 20, (30,), generator=g)])  # runs, then random rows
    batch = data[order]
    transform = NextStateReconstructor(traj_key=traj_key, done_key=done_key, step_count_key=step_count_key)
    expected = brute_force(batch, traj_key, done_key, step_count_key, math.nan)
    out = transform(batch.exclude(("next", "observation")))
    torch.testing.assert_close(out["next", "observation"], expected, equal_nan=True)


def test_inside_slices_the_next_observation_mirrors_the_stored_one():
    data = episodes([9, 12, 6, 15, 10])
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=SliceSampler(slice_len=4, traj_key="episode"),
        transform=NextStateReconstructor(traj_key="episode", step_count_key="step_count"),
        batch_size=32,
    )
    rb.extend(data.exclude(("next", "observation")))
    assert ("next", "observation") not in rb.storage.get(torch.arange(len(rb))).keys(True)  # stored once
    for _ in range(5):
        batch = rb.sample()
        rebuilt = batch["next", "observation"].reshape(8, 4)
        true_next = (batch["observation"] + 1).reshape(8, 4)
        inside = rebuilt[:, :-1]
        assert torch.equal(inside, true_next[:, :-1])  # every step but a slice's last one
        ends = rebuilt[:, -1]
        assert torch.isnan(ends[-1])  # the end of the batch
        known = ~torch.isnan(ends)
        assert torch.equal(ends[known], true_next[:, -1][known])  # a slice followed by its own next step, if any


def test_slice_ends_are_filled_when_each_slice_is_a_whole_episode():
    data = episodes([4] * 6)
    rb = ReplayBuffer(storage=LazyTensorStorage(50), sampler=SliceSampler(slice_len=4, traj_key="episode"),
                      transform=NextStateReconstructor(traj_key="episode"), batch_size=16)
    rb.extend(data.exclude(("next", "observation")))
    rebuilt = rb.sample()["next", "observation"].reshape(4, 4)
    assert torch.isnan(rebuilt[:, -1]).all() and not torch.isnan(rebuilt[:, :-1]).any()


def test_done_catches_back_to_back_copies_of_one_episode():
    data = episodes([4, 3])
    batch = torch.cat([data[:4], data[:4]])  # the same episode twice: the trajectory ids match across the seam
    out = NextStateReconstructor(traj_key="episode")(batch.exclude(("next", "observation")))
    assert torch.isnan(out["next", "observation"][3])
    assert torch.equal(out["next", "observation"][:3], torch.tensor([1.0, 2.0, 3.0]))


def test_random_samples_are_mostly_filled():
    data = episodes([50] * 4)
    rb = ReplayBuffer(storage=LazyTensorStorage(300), sampler=RandomSampler(), batch_size=64,
                      transform=NextStateReconstructor(traj_key="episode", step_count_key="step_count"))
    rb.extend(data.exclude(("next", "observation")))
    rebuilt = rb.sample()["next", "observation"]
    assert torch.isnan(rebuilt).float().mean() > 0.8


def test_works_in_a_tensordict_replay_buffer_with_nested_and_integer_observations():
    data = episodes([5, 5], obs_shape=(3, 2), dtype=torch.uint8)
    data["pixels"] = data.pop("observation")
    data = data.exclude(("next", "observation"))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=SliceSampler(slice_len=5, traj_key="episode"),
                                transform=NextStateReconstructor(["pixels"], traj_key="episode", fill_value=0),
                                batch_size=10)
    rb.extend(data)
    batch = rb.sample()
    rebuilt = batch["next", "pixels"]
    assert rebuilt.dtype == torch.uint8 and rebuilt.shape == (10, 3, 2)
    assert torch.equal(rebuilt[:4], batch["pixels"][1:5]) and (rebuilt[4] == 0).all()
    assert "index" in batch.keys()


def test_a_stored_next_entry_is_overwritten_and_markers_with_a_trailing_dim_are_read():
    data = episodes([3, 3])
    data["episode"] = data["episode"].unsqueeze(-1)
    out = NextStateReconstructor(traj_key="episode", done_key=None, fill_value=-1.0)(data)
    assert torch.equal(out["next", "observation"], torch.tensor([1.0, 2.0, -1.0, 4.0, 5.0, -1.0]))


def test_plain_shift_without_markers_and_an_empty_batch():
    data = episodes([6])
    out = NextStateReconstructor(traj_key=None, done_key=None)(data.exclude(("next", "observation")))
    assert torch.equal(out["next", "observation"][:-1], torch.arange(1.0, 6.0)) and out["next", "observation"][-1].isnan()
    empty = data[:0].exclude(("next", "observation"))
    assert NextStateReconstructor()(empty) is empty and ("next", "observation") not in empty.keys(True)


def test_strict_false_skips_the_missing_marker_checks():
    data = episodes([3, 3]).exclude(("next", "observation"), "episode", ("next", "done"))
    out = NextStateReconstructor(traj_key="episode", strict=False)(data)
    assert torch.equal(out["next", "observation"][:-1], torch.arange(1.0, 6.0))


# -- bytes saved -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("obs_shape", "dtype"), [((17,), torch.float32), ((4, 84, 84), torch.uint8)],
                         ids=["mujoco", "atari"])
def test_storing_observations_once_saves_their_bytes(obs_shape, dtype):
    n = 64
    data = episodes([16] * 4, obs_shape=obs_shape, dtype=dtype)
    data["action"] = torch.zeros(n, 6)
    data["next", "reward"] = torch.zeros(n, 1)
    sizes = {}
    for name, written in (("both", data), ("once", data.exclude(("next", "observation")))):
        storage = LazyTensorStorage(n)
        ReplayBuffer(storage=storage).extend(written)
        sizes[name] = storage.get(torch.arange(n)).bytes()  # the storage is full: all of its bytes
    obs_bytes = n * math.prod(obs_shape) * dtype.itemsize
    assert sizes["both"] - sizes["once"] == obs_bytes
    if dtype == torch.uint8:  # images dominate: storing them once nearly halves the storage
        assert sizes["once"] / sizes["both"] < 0.51


# -- errors ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("missing", "phrase", "kwargs"), [
    ("episode", "trajectory key", {"traj_key": "episode"}),
    (("next", "done"), "done key", {"traj_key": None}),
    ("step_count", "step-count key", {"traj_key": None, "step_count_key": "step_count"}),
])
def test_strict_raises_for_a_missing_marker_and_writes_nothing(missing, phrase, kwargs):
    data = episodes([3, 3]).exclude(("next", "observation"), missing)
    with pytest.raises(KeyError, match=phrase):
        NextStateReconstructor(**kwargs)(data)
    assert ("next", "observation") not in data.keys(True)


def test_default_trajectory_key_is_the_collector_one():
    data = episodes([3]).exclude(("next", "observation"))
    with pytest.raises(KeyError, match=r"trajectory key \('collector', 'traj_ids'\)"):
        NextStateReconstructor()(data)
    data["collector", "traj_ids"] = data["episode"]
    assert NextStateReconstructor()(data)["next", "observation"][:2].tolist() == [1.0, 2.0]


def test_nan_fill_of_an_integer_entry_is_a_type_error():
    data = episodes([3], dtype=torch.uint8).exclude(("next", "observation"))
    with pytest.raises(TypeError, match="non-floating dtype"):
        NextStateReconstructor(traj_key="episode")(data)
    with pytest.raises(TypeError, match="non-floating dtype"):
        NextStateReconstructor(traj_key="episode", fill_value=0.5)(data)
    assert ("next", "observation") not in data.keys(True)
    assert NextStateReconstructor(traj_key="episode", fill_value=0)(data)["next", "observation"].tolist() == [1, 2, 0]


def test_a_batch_that_is_not_flat_is_refused():
    data = episodes([4]).reshape(2, 2)
    with pytest.raises(ValueError, match=r"flat \(B,\) sample"):
        NextStateReconstructor(traj_key="episode")(data)


def test_a_marker_that_is_not_one_tensor_value_per_row_is_refused():
    data = episodes([4]).exclude(("next", "observation"))
    data.set_non_tensor("name", "e0")
    with pytest.raises(ValueError, match=r"one value per sampled row"):
        NextStateReconstructor(traj_key="name")(data)
    assert ("next", "observation") not in data.keys(True)


def test_a_missing_observation_is_a_key_error_and_nothing_is_written():
    data = episodes([3]).exclude(("next", "observation"))
    with pytest.raises(KeyError, match="'pixels'"):
        NextStateReconstructor(["observation", "pixels"], traj_key="episode")(data)
    assert ("next", "observation") not in data.keys(True)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"keys": 3}, TypeError, "`keys` must be a key"),
    ({"keys": []}, TypeError, "`keys` must be a key"),
    ({"keys": [("a", 1)]}, TypeError, "A nested key goes in a list"),
    ({"traj_key": 1}, TypeError, "`traj_key` must be a key"),
    ({"fill_value": "nan"}, TypeError, "`fill_value` must be a number"),
    ({"strict": 1}, TypeError, "`strict` must be a bool"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        NextStateReconstructor(**kwargs)


def test_non_tensordict_input_is_refused_and_keys_are_declared():
    transform = NextStateReconstructor(("observation", ("obs", "pixels")))
    assert transform.in_keys == ["observation", ("obs", "pixels")]
    assert transform.out_keys == [("next", "observation"), ("next", "obs", "pixels")]
    with pytest.raises(TypeError, match="takes a TensorDict"):
        transform(torch.zeros(3))
    assert "NextStateReconstructor(keys=" in repr(transform)


# -- consecutive steps told by the storage index -----------------------------------------------------------------
def with_slots(data: TensorDict) -> TensorDict:
    data = data.exclude(("next", "observation"))
    data["index"] = torch.arange(data.batch_size[0])
    return data


def test_two_slices_of_one_episode_back_to_back_end_with_the_fill_value_when_indices_are_present():
    data = with_slots(episodes([10]))
    batch = torch.cat([data[0:4], data[2:6]])  # same episode, no done at the seam: TorchRL's rule pairs 3 with 2
    out = NextStateReconstructor(traj_key="episode")(batch.clone())["next", "observation"]
    assert torch.isnan(out[3]) and torch.isnan(out[7])
    assert out[:3].tolist() == [1.0, 2.0, 3.0] and out[4:7].tolist() == [3.0, 4.0, 5.0]
    torchrl_rule = NextStateReconstructor(traj_key="episode", index_key=None)(batch.clone())["next", "observation"]
    assert torchrl_rule[3] == 2.0, "without indices the seam is paired (TorchRL's documented hole)"
    adjacent = torch.cat([data[0:4], data[4:8]])  # the second slice really follows the first
    assert NextStateReconstructor(traj_key="episode")(adjacent)["next", "observation"][3] == 4.0


def test_through_a_buffer_every_slice_end_is_the_true_next_observation_or_the_fill_value():
    torch.manual_seed(0)
    data = episodes([40, 30])  # few episodes: slices of one episode are often drawn back to back
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=SliceSampler(slice_len=5, traj_key="episode"),
                                transform=NextStateReconstructor(traj_key="episode"), batch_size=40)
    rb.extend(data.exclude(("next", "observation")))
    filled_ends = 0
    for _ in range(20):
        batch = rb.sample()
        rebuilt = batch["next", "observation"].reshape(8, 5)
        true_next = (batch["observation"] + 1).reshape(8, 5)
        assert torch.equal(rebuilt[:, :-1], true_next[:, :-1])
        ends, known = rebuilt[:, -1], ~torch.isnan(rebuilt[:, -1])
        assert torch.equal(ends[known], true_next[:, -1][known]), "a slice end is never paired with another slice"
        filled_ends += int(known.sum())
    assert filled_ends < 20, "only a slice followed by its own next step is filled"


def test_the_ring_seam_is_filled_only_when_a_step_counter_confirms_it():
    data = episodes([15])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(data.exclude(("next", "observation")))  # steps 5..14; step 10 is in slot 0
    batch = rb.storage.get(torch.tensor([7, 8, 9, 0, 1]))  # a slice across the seam: slots 7-9 then 0-1
    assert batch["index"].tolist() == [7, 8, 9, 0, 1] and batch["step_count"].tolist() == [7, 8, 9, 10, 11]
    out = NextStateReconstructor(traj_key="episode")(batch.clone())["next", "observation"]
    assert out[:2].tolist() == [8.0, 9.0] and torch.isnan(out[2]) and out[3] == 11.0
    counted = NextStateReconstructor(traj_key="episode", step_count_key="step_count")(batch.clone())
    assert counted["next", "observation"][:4].tolist() == [8.0, 9.0, 10.0, 11.0]


def test_interleaved_steps_are_paired_by_the_step_counter():
    from torchrl.data.replay_buffers.trajectories.split import fragmented_runs

    ids = torch.tensor([0, 1, 0, 1, 0, 1])  # two envs writing step by step
    steps = torch.tensor([0, 0, 1, 1, 2, 2])
    stored = TensorDict(episode=ids, step_count=steps, observation=10.0 * ids + steps, index=torch.arange(6),
                        batch_size=[6])  # fmt: skip
    order, _, _ = fragmented_runs(ids, steps)
    window = stored[order]  # each trajectory in step order, slots 0, 2, 4 then 1, 3, 5
    out = NextStateReconstructor(traj_key="episode", done_key=None, step_count_key="step_count")(window.clone())
    assert out["next", "observation"].tolist()[:2] == [1.0, 2.0] and out["next", "observation"][3:5].tolist() == [11, 12]
    slots_only = NextStateReconstructor(traj_key="episode", done_key=None)(window.clone())["next", "observation"]
    assert torch.isnan(slots_only).all(), "slots are not consecutive: without a step counter nothing is paired"


def test_an_index_of_a_two_dimensional_storage_must_match_in_the_env_column():
    batch = TensorDict(observation=torch.arange(4.0), episode=torch.zeros(4),
                       index=torch.tensor([[3, 0], [4, 0], [5, 1], [6, 1]]), batch_size=[4])  # fmt: skip
    out = NextStateReconstructor(traj_key="episode", done_key=None)(batch)["next", "observation"]
    assert out[0] == 1.0 and torch.isnan(out[1]) and out[2] == 3.0 and torch.isnan(out[3])


def test_a_bad_index_entry_is_refused_and_nothing_is_written():
    data = with_slots(episodes([4]))
    data["index"] = data["index"].float()
    with pytest.raises(ValueError, match="`index_key` entry 'index' must hold the integer storage index"):
        NextStateReconstructor(traj_key="episode")(data)
    assert ("next", "observation") not in data.keys(True)
    with pytest.raises(TypeError, match="`index_key` must be a key"):
        NextStateReconstructor(index_key=3)
    assert "index_key='index'" in repr(NextStateReconstructor())
