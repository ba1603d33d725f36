"""FrameStack's episode starts for every window length, fill state and signal layout (issue 26 item 4).

Each check compares every stored step's stack against a naive stacked store built from the global step numbers
(frame value = step + 1), as test_frames_stack.py does, over the cases the vectorized episode start has to get
right: ``k = 1`` (no earlier slot), a ring that is not full, exactly full (the seam at row 0) or wrapped (the seam
inside), ``[N, 1]`` trajectory ids, done flags held as several uint8 values per step, and ``ndim=2`` storages.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers.frame_stack import FrameStack


def _episodes(total: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (total,), generator=gen)
    return torch.repeat_interleave(torch.arange(total), lengths)[:total]


def _stream(total: int, seed: int, first: int, layout: str) -> TensorDict:
    """One env's steps: ``pixels`` = global step + 1, ``step``, the episode id and the done flag of each step."""
    episode = _episodes(total, seed) + first
    g = torch.arange(first, first + total)
    done = torch.ones(total, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]
    if layout == "wide":  # ids [N, 1]; flags as two uint8 values per step, the first one set
        episode = episode.unsqueeze(-1)
        done = torch.stack([done, torch.zeros_like(done)], -1).to(torch.uint8)
    return TensorDict(
        {
            "pixels": (g + 1).to(torch.int32).view(total, 1, 1).expand(total, 2, 2).clone(),
            "step": g,
            "episode": episode,
            ("next", "done"): done,
        },
        batch_size=[total],
    )


def _naive(step: int, episode: torch.Tensor, oldest: int, k: int, padding: str, first_step: int) -> list[int]:
    """The frame values of the stack ending at global ``step`` of a stream whose steps start at ``first_step``."""
    local = step - first_step
    ids = episode.reshape(-1)
    start = local
    while start > 0 and ids[start - 1] == ids[local]:
        start -= 1
    start = max(start, oldest)
    return [
        src + first_step + 1 if src >= start else (start + first_step + 1 if padding == "same" else 0)
        for src in range(local - k + 1, local + 1)
    ]


CAPACITY = 12


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("signal", ["traj", "done"])
@pytest.mark.parametrize(
    "total", [7, CAPACITY, 2 * CAPACITY + 5], ids=["not_full", "exactly_full", "wrapped"]
)
@pytest.mark.parametrize("layout", ["flat", "wide"])
def test_every_stack_of_a_1d_storage_equals_the_naive_store(k, signal, total, layout):
    storage = LazyTensorStorage(CAPACITY)
    data = _stream(total, seed=k, first=0, layout=layout)
    rb = ReplayBuffer(storage=storage)
    for i in range(0, total, 5):  # chunks that do not line up with the capacity: the seam moves inside one
        rb.extend(data[i : i + 5])
    kwargs = {"traj_key": "episode"} if signal == "traj" else {"end_key": ("next", "done")}
    for padding in ("same", "constant"):
        unit = FrameStack(k, **kwargs, padding=padding, mask_key="pad")
        rows = torch.arange(len(storage))
        index, _ = unit.expand(rows, {}, storage)
        batch = unit.read(storage, index)
        oldest = max(0, total - CAPACITY)
        expected = [_naive(int(s), data["episode"], oldest, k, padding, 0) for s in batch["step"]]
        assert batch["pixels"][:, :, 0, 0].tolist() == expected
        assert torch.equal(index[:, -1], rows)  # the last slot is the drawn step
        pad = [[v == 0 or (j + 1 < k and v == row[j + 1]) for j, v in enumerate(row)] for row in expected]
        if padding == "constant":
            assert batch["pad"].tolist() == pad


def test_a_one_frame_stack_with_an_end_key_is_the_drawn_step():
    storage = LazyTensorStorage(10)
    ReplayBuffer(storage=storage).extend(_stream(10, seed=0, first=0, layout="flat"))
    unit = FrameStack(1, end_key=("next", "done"))
    index, _ = unit.expand(torch.arange(10), {}, storage)
    assert index.tolist() == [[i] for i in range(10)]
    batch = TensorDictReplayBuffer(storage=storage, sample_unit=unit, batch_size=6).sample()
    assert torch.equal(batch["pixels"][:, 0, 0, 0].long(), batch["step"] + 1)


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("signal", ["traj", "done"])
def test_every_stack_of_an_ndim2_storage_equals_the_naive_store(k, signal):
    n_envs, total, rows = 3, 17, 8  # 8 time rows: the ring wraps, the seam inside
    streams = [_stream(total, seed=10 + e, first=100 * e, layout="flat") for e in range(n_envs)]
    for e, td in enumerate(streams):
        td["episode"] = td["episode"] + 1000 * e
    data = torch.stack(streams, 0)  # [envs, T]
    storage = LazyTensorStorage(rows * n_envs, ndim=2)
    rb = ReplayBuffer(storage=storage)
    rb.extend(data[:, :6])
    rb.extend(data[:, 6:])
    kwargs = {"traj_key": "episode"} if signal == "traj" else {"end_key": ("next", "done")}
    unit = FrameStack(k, **kwargs)
    time_rows = torch.arange(rows).repeat_interleave(n_envs)
    env = torch.arange(n_envs).repeat(rows)
    index, _ = unit.expand((time_rows, env), {}, storage)
    batch = unit.read(storage, index)
    for i, (step, e) in enumerate(zip(batch["step"].tolist(), env.tolist())):
        episode = streams[e]["episode"] - 1000 * e
        expected = _naive(step, episode, total - rows, k, "same", 100 * e)
        assert batch["pixels"][i, :, 0, 0].tolist() == expected
    assert torch.equal(index[0][:, -1], time_rows)  # the last slot is the drawn step
    assert torch.equal(index[1], env.unsqueeze(-1).expand(-1, k))
