"""Issue 26 item 4: FrameStack rebuilds [B, k, *frame] stacks at sample time from frames stored once.

Every check compares against a naive stacked store: numbered synthetic frames (frame value = global step id + 1,
so 0 is padding), stacks computed at collection time from the whole history, then the one rule the ring adds:
the history starts at the oldest stored step (the write seam).
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.loading import tensordict_collate
from torchrl.data.replay_buffers.samplers.frame_stack import FrameStack

K = 4


def _episodes(total: int, seed: int = 0) -> torch.Tensor:
    """Episode id per global step: random lengths 1..9 (length-1 episodes included)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (total,), generator=gen)
    return torch.repeat_interleave(torch.arange(total), lengths)[:total]


def _steps(episode: torch.Tensor, first: int = 0) -> TensorDict:
    n = episode.numel()
    g = torch.arange(first, first + n)
    done = torch.ones(n, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]  # the last step of the data ends an episode too
    return TensorDict(
        {
            "pixels": (g + 1).to(torch.int32).view(n, 1, 1, 1).expand(n, 1, 2, 3).clone(),
            "step": g,
            "episode": episode,
            ("next", "done"): done.unsqueeze(-1),
            ("next", "pixels"): (-(g + 1)).to(torch.int32).view(n, 1, 1, 1).expand(n, 1, 2, 3).clone(),
        },
        batch_size=[n],
    )


def _expected(step: torch.Tensor, episode: torch.Tensor, oldest: int, padding: str, *, mask: bool = False):
    """The naive stacked store: frame values [B, K] of the stacks ending at global steps ``step`` (and, with
    ``mask``, the padded slots)."""
    starts = torch.ones_like(episode, dtype=torch.bool)
    starts[1:] = episode[1:] != episode[:-1]
    ep_start = torch.cummax(torch.where(starts, torch.arange(episode.numel()), 0), 0).values
    out, padded = [], []
    for g in step.tolist():
        first = max(int(ep_start[g]), oldest)
        stack = []
        for j in range(K - 1, -1, -1):
            src = g - j
            stack.append(src + 1 if src >= first else (first + 1 if padding == "same" else 0))
        out.append(stack)
        padded.append([g - j < first for j in range(K - 1, -1, -1)])
    return (torch.tensor(out), torch.tensor(padded)) if mask else torch.tensor(out)


def _frames(batch) -> torch.Tensor:
    pixels = batch["pixels"]
    assert pixels.shape[1:] == (K, 1, 2, 3)
    values = pixels[:, :, 0, 0, 0].long()
    assert (pixels == pixels[:, :, :1, :1, :1]).all()  # each frame is whole
    return values


def _fill(storage, total: int, chunk: int = 7) -> torch.Tensor:
    episode = _episodes(total)
    rb = ReplayBuffer(storage=storage)
    data = _steps(episode)
    for i in range(0, total, chunk):  # chunks that do not line up with the capacity: the seam moves inside one
        rb.extend(data[i : i + chunk])
    return episode


@pytest.mark.parametrize("signal", [{"traj_key": "episode"}, {"end_key": ("next", "done")}], ids=["traj", "done"])
@pytest.mark.parametrize("padding", ["same", "constant"])
@pytest.mark.parametrize("total", [45, 113], ids=["not_full", "wrapped"])
def test_every_stack_equals_the_naive_stacked_store(signal, padding, total):
    capacity = 50
    storage = LazyTensorStorage(capacity)
    episode = _fill(storage, total)
    unit = FrameStack(K, **signal, padding=padding, mask_key="pad")
    rows = torch.arange(len(storage))
    index, _ = unit.expand(rows, {}, storage)
    batch = unit.read(storage, index)
    oldest = max(0, total - capacity)
    expected, padded = _expected(batch["step"], episode, oldest, padding, mask=True)
    assert torch.equal(_frames(batch), expected)
    assert torch.equal(batch["pad"], padded) and padded.any() and not padded.all()
    # other entries come from the drawn step; stacked frames are all from its episode (or padding)
    assert torch.equal(batch["step"], storage.get(rows)["step"])
    assert index.shape == (len(storage), K) and torch.equal(index[:, -1], rows)


def test_the_seam_starts_the_history():
    storage = LazyTensorStorage(10)
    rb = ReplayBuffer(storage=storage)
    rb.extend(_steps(torch.zeros(13, dtype=torch.long)))  # one long episode; rows 0..2 overwritten
    unit = FrameStack(K, traj_key="episode", padding="constant")
    # the oldest stored step is 3 (row 3); the newest is 12 (row 2), just before it in row order
    batch = unit.read(storage, unit.expand(torch.tensor([3, 4, 2, 0]), {}, storage)[0])
    assert batch["step"].tolist() == [3, 4, 12, 10]
    assert _frames(batch).tolist() == [[0, 0, 0, 4], [0, 0, 4, 5], [10, 11, 12, 13], [8, 9, 10, 11]]


def test_a_length_one_episode_and_a_single_row():
    storage = LazyTensorStorage(10)
    ReplayBuffer(storage=storage).extend(_steps(torch.tensor([0])))
    unit = FrameStack(K, end_key=("next", "done"))
    batch = unit.read(storage, unit.expand(torch.tensor([0]), {}, storage)[0])
    assert _frames(batch).tolist() == [[1, 1, 1, 1]]


@pytest.mark.parametrize("buffer", [ReplayBuffer, TensorDictReplayBuffer])
def test_buffer_sample_returns_stacks_and_drawn_step_entries(buffer):
    storage = LazyTensorStorage(64)
    episode = _fill(storage, 64)
    rb = buffer(storage=storage, sample_unit=FrameStack(K, traj_key="episode"), batch_size=16)
    torch.manual_seed(0)
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == (16,)
    assert torch.equal(_frames(batch), _expected(batch["step"], episode, 0, "same"))
    assert info["index"].shape == (16, K)
    assert batch["episode"].shape == (16,) and batch[("next", "done")].shape == (16, 1)
    assert batch[("next", "pixels")].shape == (16, 1, 2, 3)  # not stacked unless next_frames=True
    if buffer is TensorDictReplayBuffer:
        assert torch.equal(batch["index"], info["index"])


def test_next_frames_shift_the_stack_and_append_the_stored_next_frame():
    storage = LazyTensorStorage(40)
    episode = _fill(storage, 40)
    unit = FrameStack(K, traj_key="episode", next_frames=True)
    batch = unit.read(storage, unit.expand(torch.arange(40), {}, storage)[0])
    nxt = batch[("next", "pixels")][:, :, 0, 0, 0].long()
    frames = _expected(batch["step"], episode, 0, "same")
    assert torch.equal(nxt[:, :-1], frames[:, 1:])
    assert torch.equal(nxt[:, -1], -(batch["step"] + 1))


def test_memmap_storage_and_a_without_replacement_epoch():
    with tempfile.TemporaryDirectory() as tmp:
        storage = LazyMemmapStorage(30, scratch_dir=tmp)
        episode = _fill(storage, 30)
        rb = ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=10,
                          sample_unit=FrameStack(K, traj_key="episode"))
        steps = []
        for batch in rb:
            assert torch.equal(_frames(batch), _expected(batch["step"], episode, 0, "same"))
            steps += batch["step"].tolist()
        assert sorted(steps) == list(range(30))  # one epoch: each stack once


def test_ndim2_storage_stacks_along_time_in_each_env_column():
    n_envs, T = 3, 12
    storage = LazyTensorStorage(8 * n_envs, ndim=2)  # 8 time rows: the second write wraps
    rb = ReplayBuffer(storage=storage)
    cols = []
    for e in range(n_envs):
        episode = _episodes(T, seed=e)
        td = _steps(episode, first=100 * e)
        td["episode"] = episode + 1000 * e
        cols.append(td)
    data = torch.stack(cols, 0)  # [envs, T]: the layout extend takes for ndim=2 (dim_extend=1)
    rb.extend(data[:, :5])
    rb.extend(data[:, 5:])
    unit = FrameStack(K, traj_key="episode")
    rows = torch.arange(8).repeat_interleave(n_envs)
    env = torch.arange(n_envs).repeat(8)
    index, _ = unit.expand((rows, env), {}, storage)
    batch = unit.read(storage, index)
    for e in range(n_envs):
        mine = env == e
        local = batch["step"][mine] - 100 * e
        expected = _expected(local, _episodes(T, seed=e), T - 8, "same") + 100 * e
        assert torch.equal(_frames(batch)[mine], expected)
    sampled = TensorDictReplayBuffer(storage=storage, sample_unit=unit, batch_size=5).sample()
    assert sampled["pixels"].shape == (5, K, 1, 2, 3) and sampled["index"].shape == (5, K, 2)
    assert (sampled["index"][:, :, 1] == sampled["index"][:, -1:, 1]).all()  # one env column per stack


def test_prioritized_buffer_updates_the_drawn_steps():
    storage = LazyTensorStorage(20)
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=storage, batch_size=4,
                                           sample_unit=FrameStack(K, traj_key="episode"))
    rb.extend(_steps(_episodes(20)))
    batch = rb.sample()
    batch["td_error"] = torch.arange(1.0, 5.0)
    rb.update_tensordict_priority(batch)
    drawn = batch["index"][:, -1]
    weights = torch.tensor([float(rb.sampler._sum_tree[int(i)]) for i in drawn])
    last = {int(i): float(p) for i, p in zip(drawn, batch["td_error"])}  # a step drawn twice keeps one value
    assert weights.tolist() == [last[int(i)] for i in drawn]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_dataloader_workers_sample_exact_stacks():
    storage = LazyTensorStorage(60)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=8, sample_unit=FrameStack(K, traj_key="episode"))
    episode = _episodes(60)
    rb.extend(_steps(episode))
    loader = DataLoader(rb.as_dataset(num_batches=6), batch_size=None, num_workers=2,
                        collate_fn=tensordict_collate, multiprocessing_context="fork", timeout=60)
    batches = list(loader)
    assert len(batches) == 6
    for batch in batches:
        assert torch.equal(_frames(batch), _expected(batch["step"], episode, 0, "same"))
    assert not torch.equal(batches[0]["step"], batches[1]["step"])  # the workers draw distinct streams


def test_checkpoint_round_trip_keeps_the_stacks():
    unit = FrameStack(K, traj_key="episode", padding="constant")
    rb = ReplayBuffer(storage=LazyTensorStorage(50), sample_unit=unit, batch_size=5)
    rb.extend(_steps(_episodes(70)))
    with tempfile.TemporaryDirectory() as tmp:
        rb.dumps(tmp)
        other = ReplayBuffer(storage=LazyTensorStorage(50), sample_unit=FrameStack(K, traj_key="episode",
                                                                                  padding="constant"))
        other.loads(tmp)
    index = unit.expand(torch.arange(50), {}, rb.storage)[0]
    assert torch.equal(unit.read(other.storage, index)["pixels"], unit.read(rb.storage, index)["pixels"])
    assert rb.sampler.state_dict() == {} and not rb.sampler.requires_shared_state


# -- failure modes -----------------------------------------------------------------------------------------------
def _plain_storage(n=10, **entries) -> LazyTensorStorage:
    storage = LazyTensorStorage(n)
    td = TensorDict({"pixels": torch.zeros(n, 1, 2, 2), **entries}, batch_size=[n])
    ReplayBuffer(storage=storage).extend(td)
    return storage


def test_frames_without_an_episode_signal_are_refused_naming_the_keys():
    storage = _plain_storage()
    with pytest.raises(KeyError, match="Pass `traj_key`.*or `end_key`"):
        FrameStack(K).expand(torch.arange(3), {}, storage)
    with pytest.raises(KeyError, match="'ep'"):
        FrameStack(K, traj_key="ep").expand(torch.arange(3), {}, storage)
    rb = ReplayBuffer(storage=storage, sample_unit=FrameStack(K, end_key="done"), batch_size=2)
    with pytest.raises(KeyError, match="end_key"):
        rb.sample()


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="num_frames"):
        FrameStack(0)
    with pytest.raises(ValueError, match="not both"):
        FrameStack(K, traj_key="episode", end_key="done")
    with pytest.raises(ValueError, match="padding='constant'"):
        FrameStack(K, padding="zeros")
    with pytest.raises(ValueError, match="`padding` must be one of"):
        FrameStack(K, padding="reflect")
    with pytest.raises(TypeError, match="padding_value"):
        FrameStack(K, padding_value="0")
    with pytest.raises(TypeError, match="next_frames"):
        FrameStack(K, next_frames=1)
    with pytest.raises(ValueError, match="frame_keys"):
        FrameStack(K, frame_keys=[])
    assert "FrameStack(num_frames=4" in repr(FrameStack(K, traj_key="episode"))


def test_storages_and_entries_it_cannot_read_are_refused():
    with pytest.raises(TypeError, match="TensorStorage"):
        FrameStack(K).expand(torch.arange(2), {}, ListStorage(5))
    with pytest.raises(RuntimeError, match="empty storage"):
        FrameStack(K).expand(torch.arange(2), {}, LazyTensorStorage(5))
    storage = _plain_storage(episode=torch.zeros(10, dtype=torch.long))
    with pytest.raises(IndexError, match="outside the 10 written rows"):
        FrameStack(K, traj_key="episode").expand(torch.tensor([10]), {}, storage)
    with pytest.raises(KeyError, match="frame_keys"):
        unit = FrameStack(K, "rgb", traj_key="episode")
        unit.read(storage, unit.expand(torch.arange(3), {}, storage)[0])
    with pytest.raises(KeyError, match="next_frames=False"):
        unit = FrameStack(K, traj_key="episode", next_frames=True)
        unit.read(storage, unit.expand(torch.arange(3), {}, storage)[0])
    with pytest.raises(ValueError, match="one id per step"):
        bad = _plain_storage(episode=torch.zeros(10, 2, dtype=torch.long))
        FrameStack(K, traj_key="episode").expand(torch.arange(3), {}, bad)
    with pytest.raises(ValueError, match="ndim=1 or ndim=2"):
        FrameStack(K).expand(torch.arange(3), {}, LazyTensorStorage(8, ndim=3))
    with pytest.raises(ValueError, match="index with 2 dim"):
        FrameStack(K, traj_key="episode").expand((torch.arange(2), torch.arange(2)), {}, storage)
    plain = LazyTensorStorage(4)
    ReplayBuffer(storage=plain).extend(torch.arange(4))
    with pytest.raises(KeyError, match="traj_key"):
        FrameStack(K).expand(torch.arange(2), {}, plain)
