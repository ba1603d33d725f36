"""StreamingSliceSampler (issue 14): windows cut from the writes, served once each, newest first."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SliceSampler,
    StreamingSliceSampler,
    TensorDictReplayBuffer,
    tensordict_collate,
)

TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging


def steps(start: int, n: int, *, done_at=(), traj=None, **extra) -> TensorDict:
    """``n`` steps numbered from ``start``; ``done`` set at the given offsets; optional trajectory ids."""
    done = torch.zeros(n, 1, dtype=torch.bool)
    for i in done_at:
        done[i] = True
    data = {"step": torch.arange(start, start + n), ("next", "done"): done}
    if traj is not None:
        data["traj"] = torch.as_tensor(traj).expand(n) if torch.as_tensor(traj).ndim == 0 else torch.as_tensor(traj)
    data.update(extra)
    return TensorDict(data, batch_size=[n])


def buffer(capacity=100, batch_size=8, seed=0, **kwargs) -> TensorDictReplayBuffer:
    kwargs.setdefault("slice_len", 4)
    sampler = StreamingSliceSampler(**kwargs)
    return make_buffer(cls=TensorDictReplayBuffer, sampler=sampler, capacity=capacity, batch_size=batch_size, seed=seed)


def windows(batch, slice_len=4) -> list[list[int]]:
    return batch["step"].view(-1, slice_len).tolist()


def assert_valid_slices(batch, slice_len=4):
    """Each slice is consecutive steps of one trajectory (episodes of the tests number their steps)."""
    for window in windows(batch, slice_len):
        assert window == list(range(window[0], window[0] + slice_len)), window


# -- the documented sequence ----------------------------------------------------------------------------------
def test_windows_are_served_once_newest_first_then_uniform_slices():
    rb = buffer()
    rb.extend(steps(0, 16, done_at=(7, 15)))
    assert rb.sampler.queued == 0  # cut at the first sample
    assert windows(rb.sample()) == [[12, 13, 14, 15], [8, 9, 10, 11]]
    assert windows(rb.sample()) == [[4, 5, 6, 7], [0, 1, 2, 3]]
    assert rb.sampler.queued == 0
    for _ in range(5):  # the queue is empty: uniform slices, within an episode
        batch = rb.sample()
        assert_valid_slices(batch)
        assert all((w[0] < 8) == (w[-1] < 8) for w in windows(batch))


def test_later_writes_are_served_before_older_windows():
    rb = buffer()
    rb.extend(steps(0, 8))
    assert windows(rb.sample(4)) == [[4, 5, 6, 7]]
    rb.extend(steps(8, 8))  # continues the same episode
    assert windows(rb.sample()) == [[12, 13, 14, 15], [8, 9, 10, 11]]
    assert windows(rb.sample(4)) == [[0, 1, 2, 3]]


def test_rows_that_do_not_fill_a_window_wait_for_the_next_write():
    rb = buffer()
    rb.extend(steps(0, 6))
    assert windows(rb.sample(4)) == [[0, 1, 2, 3]]
    assert rb.sampler.queued == 0
    rb.extend(steps(6, 2))  # steps 4, 5 were pending: with 6, 7 they fill a window
    assert windows(rb.sample(4)) == [[4, 5, 6, 7]]


def test_a_partly_served_batch_is_completed_with_uniform_slices():
    rb = buffer()
    rb.extend(steps(0, 20, done_at=(9, 19)))  # windows 0-3, 4-7 | 10-13, 14-17 (tails 8-9, 18-19 dropped)
    batch = rb.sample(24)
    assert windows(batch)[:4] == [[14, 15, 16, 17], [10, 11, 12, 13], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert_valid_slices(batch)
    assert batch.shape == torch.Size([24])


def test_sampler_info_marks_slice_ends_and_starts():
    rb = buffer()
    data = steps(0, 8, done_at=(7,))
    data["is_init"] = torch.zeros(8, 1, dtype=torch.bool)
    data["is_init"][0] = True
    data["next", "terminated"] = data["next", "done"].clone()
    rb.extend(data)
    batch = rb.sample()
    assert batch["next", "truncated"].view(2, 4).tolist() == [[False, False, False, True]] * 2
    assert batch["next", "done"].view(2, 4).tolist() == [[False, False, False, True]] * 2
    assert batch["next", "terminated"].view(2, 4).tolist() == [[False, False, False, True], [False] * 4]
    assert batch["is_init"].view(2, 4).tolist() == [[True, False, False, False]] * 2


def test_init_key_names_the_stored_flag_and_the_info_entry():
    rb = buffer(init_key="first", truncated_key=None)
    data = steps(0, 8)
    data["first"] = torch.zeros(8, dtype=torch.bool)
    rb.extend(data)
    _, info = rb.sample(return_info=True)
    assert set(info) == {"first", "index"}
    assert info["first"].view(2, 4).tolist() == [[True, False, False, False]] * 2
    _, info = rb.sample(return_info=True)  # uniform fallback: the same entry
    assert "first" in info and "is_init" not in info and info["first"].view(2, 4)[:, 0].all()


# -- trajectories ---------------------------------------------------------------------------------------------
def test_trajectory_ids_are_cut_separately_across_interleaved_writes():
    rb = buffer(traj_key="traj")
    for chunk in range(3):  # two envs write 3 steps each, alternately
        for env in (0, 1):
            rb.extend(steps(100 * env + 3 * chunk, 3, traj=env))
    first = windows(rb.sample())
    second = windows(rb.sample())
    assert first == [[104, 105, 106, 107], [4, 5, 6, 7]]
    assert second == [[100, 101, 102, 103], [0, 1, 2, 3]]


def test_a_done_flag_ends_a_trajectory_given_by_ids():
    rb = buffer(traj_key="traj")
    rb.extend(steps(0, 6, traj=0, done_at=(5,)))
    rb.extend(steps(6, 4, traj=0))  # same id, but the done flag ended the first trajectory
    assert windows(rb.sample()) == [[6, 7, 8, 9], [0, 1, 2, 3]]


def test_short_tails_are_dropped_or_queued_with_strict_length():
    strict = buffer()
    strict.extend(steps(0, 6, done_at=(5,)))
    assert windows(strict.sample(4)) == [[0, 1, 2, 3]] and strict.sampler.queued == 0

    padded = buffer(strict_length=False, pad_output=True)
    padded.extend(steps(0, 6, done_at=(5,)))
    batch = padded.sample()
    assert windows(batch) == [[4, 5, 5, 5], [0, 1, 2, 3]]
    assert batch["collector", "mask"].view(2, 4).tolist() == [[True, True, False, False], [True] * 4]
    assert batch["next", "truncated"].view(2, 4).tolist() == [[False, True, False, False], [False] * 3 + [True]]

    shortened = buffer(strict_length=False)
    shortened.extend(steps(0, 6, done_at=(5,)))
    batch = shortened.sample()
    assert batch["step"].tolist() == [4, 5, 0, 1, 2, 3]
    assert batch["next", "truncated"].squeeze(-1).tolist() == [False, True, False, False, False, True]


def test_probed_trajectory_ids_as_slice_sampler():
    rb = buffer()
    rb.extend(steps(0, 8, episode=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])))
    assert windows(rb.sample()) == [[4, 5, 6, 7], [0, 1, 2, 3]]
    assert rb.sampler.traj_key == "episode"


# -- ring buffer ----------------------------------------------------------------------------------------------
def test_windows_overwritten_before_being_served_are_dropped():
    rb = buffer(capacity=8)
    rb.extend(steps(0, 8))  # rows 0-7: windows 0-3, 4-7
    rb.extend(steps(8, 4))  # overwrites rows 0-3: window 0-3 is gone, 8-11 is new
    assert windows(rb.sample()) == [[8, 9, 10, 11], [4, 5, 6, 7]]
    assert rb.sampler.queued == 0
    batch = rb.sample()  # uniform slices never join the newest and the oldest steps
    assert_valid_slices(batch)


def test_a_window_queued_then_overwritten_is_skipped():
    rb = buffer(capacity=8, batch_size=4)
    rb.extend(steps(0, 8))
    assert windows(rb.sample()) == [[4, 5, 6, 7]]  # cuts both windows; serves the newest
    rb.extend(steps(8, 2))  # overwrites rows 0, 1: window 0-3 is stale; 8, 9 wait for more
    assert rb.sampler.queued == 1
    assert_valid_slices(rb.sample())  # the stale window is dropped: a uniform slice
    assert rb.sampler.queued == 0
    rb.extend(steps(10, 2))
    assert windows(rb.sample()) == [[8, 9, 10, 11]]


def test_pending_rows_overwritten_before_their_window_fills_are_dropped():
    rb = buffer(capacity=6, batch_size=4)
    rb.extend(steps(0, 6))  # window 0-3; 4, 5 pending
    assert windows(rb.sample()) == [[0, 1, 2, 3]]
    rb.extend(steps(6, 6))  # wraps the whole ring: 4, 5 are overwritten, steps 6-9 fill a window
    assert windows(rb.sample()) == [[6, 7, 8, 9]]


def test_writes_larger_than_the_storage_keep_the_newest_windows():
    rb = buffer(capacity=8)
    rb.extend(steps(0, 20))
    assert windows(rb.sample()) == [[16, 17, 18, 19], [12, 13, 14, 15]]
    assert rb.sampler.queued == 0


def _full_windows(stream: list[tuple[int, bool]], length: int) -> list[list[int]]:
    """The windows a step stream ``[(step, done), ...]`` holds: per episode, consecutive full windows."""
    out, episode = [], []
    for step, done in stream:
        episode.append(step)
        if len(episode) == length:
            out.append(episode)
            episode = []
        if done:
            episode = []
    return out


@pytest.mark.parametrize("capacity", [1000, 24])
@pytest.mark.parametrize("seed", range(4))
def test_each_window_is_served_once_newest_first_among_those_not_overwritten(capacity, seed):
    gen = torch.Generator().manual_seed(seed)
    rb = buffer(capacity=capacity, batch_size=4, seed=seed)
    stream, served, step = [], [], 0
    for _ in range(40):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        done = (torch.rand(n, generator=gen) < 0.15).tolist()
        rb.extend(steps(step, n, done_at=[i for i, d in enumerate(done) if d]))
        stream += list(zip(range(step, step + n), done))
        step += n
        oldest_kept = max(0, step - capacity)
        for _ in range(int(torch.randint(0, 3, (1,), generator=gen))):
            available = [w for w in _full_windows(stream, 4) if w not in served and w[0] >= oldest_kept]
            if not available:
                break
            window = windows(rb.sample())[0]
            assert window == max(available, key=lambda w: w[-1])
            served.append(window)
    assert len(served) == len({tuple(w) for w in served}) > 0


# -- state ----------------------------------------------------------------------------------------------------
def _continue(rb, start, rounds=4):
    out = []
    for i in range(rounds):
        rb.extend(steps(start + 6 * i, 6, done_at=(5,) if i % 2 else ()))
        out.append(rb.sample()["step"].tolist())
    return out


def _mid_stream_buffer(capacity=16):
    rb = buffer(capacity=capacity)
    rb.extend(steps(0, 14, done_at=(9,)))
    rb.sample()
    rb.extend(steps(14, 3))  # some steps logged, some pending, some queued
    return rb


def test_state_dict_round_trip_mid_stream_continues_identically():
    rb = _mid_stream_buffer()
    twin = buffer(capacity=16)
    twin.sampler.load_state_dict(rb.sampler.state_dict())  # the sampler's own round trip ...
    assert twin.sampler.queued == rb.sampler.queued
    twin = buffer(capacity=16)
    twin.load_state_dict(rb.state_dict())  # ... and within the buffer's, with the storage and the writer
    assert _continue(twin, 100) == _continue(rb, 100)


def test_dumps_loads_of_the_buffer_mid_stream_continue_identically(tmp_path):
    rb = _mid_stream_buffer()
    twin = assert_checkpoint_round_trip(rb, lambda: buffer(capacity=16), tmp_path, draws=0)
    assert twin.sampler.queued == rb.sampler.queued
    assert _continue(twin, 100) == _continue(rb, 100)


def test_sampler_dumps_loads_alone(tmp_path):
    rb = _mid_stream_buffer()
    fresh = assert_checkpoint_round_trip(rb.sampler, lambda: StreamingSliceSampler(slice_len=4), tmp_path)
    for key, value in rb.sampler.state_dict().items():
        other = fresh.state_dict()[key]
        assert (value == other).all() if isinstance(value, torch.Tensor) else value == other, key
    with pytest.raises(ValueError, match="slice_len"):
        StreamingSliceSampler(slice_len=2).loads(tmp_path / "first")


def test_pickling_mid_stream_continues_identically():
    rb = _mid_stream_buffer()
    twin = pickle.loads(pickle.dumps(rb))
    twin.set_rng(torch.Generator().manual_seed(3))
    rb.set_rng(torch.Generator().manual_seed(3))
    assert _continue(twin, 100) == _continue(rb, 100)


def test_trajectory_id_pending_rows_survive_a_round_trip():
    rb = buffer(traj_key="traj", batch_size=4)
    rb.extend(steps(0, 3, traj=0))
    rb.extend(steps(100, 3, traj=1))
    with pytest.raises(RuntimeError, match="No trajectory is long enough"):
        rb.sample()  # cut: both trajectories wait (3 rows each); no uniform slice fits either
    fresh = StreamingSliceSampler(slice_len=4, traj_key="traj")
    fresh.load_state_dict(pickle.loads(pickle.dumps(rb.sampler.state_dict())))
    assert sorted(fresh.state_dict()["pending_keys"]) == [0, 1]
    rb.sampler.load_state_dict(fresh.state_dict())
    rb.extend(steps(3, 1, traj=0))
    assert windows(rb.sample()) == [[0, 1, 2, 3]]


def test_windows_stay_queued_when_the_uniform_part_of_the_batch_fails():
    rb = buffer(traj_key="traj")
    # two envs interleaved step by step: windows follow the ids (rows 0, 2, 4, 6 and 1, 3, 5, 7), while the
    # uniform slices need runs of equal ids in the storage, and there is none longer than one step
    rb.extend(steps(0, 8, traj=torch.tensor([0, 1] * 4)))
    with pytest.raises(RuntimeError, match="long enough"):
        rb.sample(12)  # two windows and one uniform slice
    assert rb.sampler.queued == 2
    assert windows(rb.sample()) == [[1, 3, 5, 7], [0, 2, 4, 6]]


def test_empty_forgets_everything():
    rb = buffer()
    rb.extend(steps(0, 16))
    rb.sample()
    rb.empty()
    assert rb.sampler.queued == 0 and rb.sampler.state_dict()["clock"] == 0
    rb.extend(steps(50, 4))
    assert windows(rb.sample(4)) == [[50, 51, 52, 53]]


def test_bad_state_is_refused_and_changes_nothing():
    rb = _mid_stream_buffer()
    before = rb.sampler.state_dict()
    bad = dict(before, clock=-1)
    with pytest.raises(ValueError, match="inconsistent"):
        rb.sampler.load_state_dict(bad)
    bad = dict(before, queue_rows=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="inconsistent"):
        rb.sampler.load_state_dict(bad)
    after = rb.sampler.state_dict()
    assert after["clock"] == before["clock"] and (after["queue_rows"] == before["queue_rows"]).all()


# -- contract -------------------------------------------------------------------------------------------------
def test_stateful_and_compatible_signature():
    sampler = StreamingSliceSampler(slice_len=4)
    assert sampler.requires_shared_state
    assert isinstance(sampler, SliceSampler)
    assert not SliceSampler(slice_len=4).requires_shared_state
    assert "StreamingSliceSampler(slice_len=4" in repr(sampler) and "queued=0" in repr(sampler)


def test_bad_arguments_and_uses_raise_clear_errors():
    with pytest.raises(TypeError, match="slice_len"):
        StreamingSliceSampler()
    with pytest.raises(TypeError, match="slice_len"):
        StreamingSliceSampler(slice_len=None)
    with pytest.raises(ValueError, match="slice_len"):
        StreamingSliceSampler(slice_len=0)
    with pytest.raises(TypeError):
        StreamingSliceSampler(slice_len=4, num_slices=2)
    with pytest.raises(ValueError, match="pad_output"):
        StreamingSliceSampler(slice_len=4, pad_output=True)
    rb = buffer()
    rb.extend(steps(0, 8))
    with pytest.raises(ValueError, match="not divisible by `slice_len`=4"):
        rb.sample(6)
    with pytest.raises(RuntimeError, match="empty"):
        StreamingSliceSampler(slice_len=2).sample(LazyTensorStorage(4), 2)
    grid = ReplayBuffer(storage=LazyTensorStorage(8, ndim=2), sampler=StreamingSliceSampler(slice_len=2))
    grid.extend(TensorDict(step=torch.arange(8).view(4, 2), batch_size=[4, 2]))  # the write goes through
    with pytest.raises(ValueError, match="ndim=2.*1-D storage"):
        grid.sample(2)
    bare = buffer(traj_key="traj", end_key=("next", "end"))
    bare.extend(TensorDict(step=torch.arange(8), batch_size=[8]))
    with pytest.raises(RuntimeError, match="no trajectory information"):
        bare.sample()
    assert bare.sampler.state_dict()["log_rows"].numel() == 8  # the writes wait for a storage that has them
    wide = buffer(traj_key="traj")
    wide.extend(steps(0, 8, traj=torch.zeros(8, 2, dtype=torch.long)))
    with pytest.raises(ValueError, match="one scalar id per step"):
        wide.sample()


def test_writes_can_be_reported_without_a_buffer():
    storage = LazyTensorStorage(20)
    sampler = StreamingSliceSampler(slice_len=2)
    storage.set(torch.arange(4), steps(0, 4))
    sampler.mark_update(torch.arange(4))  # as a buffer would, after the write
    index, info = sampler.sample(storage, 4)
    assert storage.get(index)["step"].tolist() == [2, 3, 0, 1]
    assert info[("next", "truncated")].squeeze(-1).tolist() == [False, True, False, True]


def test_a_lazy_stack_storage_works_and_a_plain_list_storage_is_refused():
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(20), sampler=StreamingSliceSampler(slice_len=2), batch_size=4)
    rb.extend(steps(0, 6, done_at=(5,)))
    batch = rb.sample()
    assert batch["step"].view(2, 2).tolist() == [[4, 5], [2, 3]]
    listed = TensorDictReplayBuffer(storage=ListStorage(20), sampler=StreamingSliceSampler(slice_len=2), batch_size=4)
    listed.extend(steps(0, 6, done_at=(5,)))
    queued = listed.sampler.state_dict()
    with pytest.raises(RuntimeError, match="Could not get a tensordict out of the storage.*got a ListStorage"):
        listed.sample()
    assert str(listed.sampler.state_dict()) == str(queued)  # nothing served


# -- DataLoader -----------------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_refused_by_dataloader_workers_and_fine_without():
    rb = buffer()
    rb.extend(steps(0, 16))
    loader = DataLoader(rb.as_dataset(num_batches=2), batch_size=None, collate_fn=tensordict_collate,
                        num_workers=1, multiprocessing_context="fork", timeout=TIMEOUT)
    with pytest.raises(RuntimeError, match="StreamingSliceSampler.*num_workers=0"):
        list(loader)
    batches = list(DataLoader(rb.as_dataset(num_batches=2), batch_size=None, collate_fn=tensordict_collate))
    assert [windows(b) for b in batches] == [[[12, 13, 14, 15], [8, 9, 10, 11]], [[4, 5, 6, 7], [0, 1, 2, 3]]]
