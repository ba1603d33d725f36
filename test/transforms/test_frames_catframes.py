"""Issue 26 item 4: TorchRL's CatFrames in its replay-buffer ("unfolding") use, and make_rb_transform_and_sampler.

Stacks are checked against a naive loop over numbered frames (frame value = global step id + 1, so 0 is padding).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
from torchrl.envs.transforms import CatFrames, Compose

N = 4


def _batch(B: int, T: int, seed: int = 0, feat: int = 2, named: bool = True) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    g = torch.arange(B * T).view(B, T)
    done = torch.rand(B, T, generator=gen) < 0.25
    obs = (g + 1).float().unsqueeze(-1).expand(B, T, feat).clone()
    td = TensorDict({"obs": obs, ("next", "done"): done.unsqueeze(-1), ("next", "obs"): -obs}, batch_size=[B, T])
    return td.refine_names(None, "time") if named else td


def _naive(td: TensorDict, padding: str, future: bool = False, padding_value: float = 0.0):
    """Frame values [B, T, N] (first feature) and the padded mask, with Python loops."""
    obs = td["obs"][..., 0]
    done = td["next", "done"][..., 0]
    B, T = obs.shape
    out = torch.zeros(B, T, N)
    mask = torch.zeros(B, T, N, dtype=torch.bool)
    for b in range(B):
        seg, s = [], 0
        for t in range(T):
            seg.append(s)
            if done[b, t]:
                s += 1
        for t in range(T):
            members = [u for u in range(T) if seg[u] == seg[t]]
            lo, hi = members[0], members[-1]
            offsets = range(N) if future else range(-N + 1, 1)
            for j, o in enumerate(offsets):
                src = t + o
                if lo <= src <= hi:
                    out[b, t, j] = obs[b, src]
                else:
                    mask[b, t, j] = True
                    out[b, t, j] = padding_value if padding == "constant" else obs[b, lo if not future else hi]
    return out, mask


@pytest.mark.parametrize("padding", ["same", "constant"])
@pytest.mark.parametrize("future", [False, True])
def test_stacks_equal_a_naive_loop(padding, future):
    td = _batch(3, 17)
    expected, mask = _naive(td, padding, future, padding_value=-7.0)
    cat = CatFrames(N, dim=-1, in_keys=["obs"], out_keys=["stack"], padding=padding, padding_value=-7.0,
                    future=future, mask_key="pad")
    out = cat(td.clone())
    assert out["stack"].shape == (3, 17, 2 * N)
    frames = out["stack"].view(3, 17, N, 2)  # cat along the last dim: frame j is [2j, 2j + 2)
    assert torch.equal(frames[..., 0], expected) and torch.equal(frames[..., 1], expected)
    assert torch.equal(out["pad"], mask) and mask.any()
    assert torch.equal(out["obs"], td["obs"])  # the input entry is kept


def test_frames_concatenate_along_dim_of_each_frame():
    td = TensorDict({"pixels": torch.arange(6.).view(6, 1, 1, 1).expand(6, 2, 3, 3),
                     ("next", "done"): torch.zeros(6, 1, dtype=torch.bool)}, batch_size=[6]).refine_names("time")
    out = CatFrames(N, dim=-3)(td)["pixels"]
    assert out.shape == (6, 2 * N, 3, 3)
    assert out[5, :, 0, 0].tolist() == [2, 2, 3, 3, 4, 4, 5, 5]
    with pytest.raises(ValueError, match=r"pass a dim in \[-3, -1\]"):
        CatFrames(N, dim=-4)(td.clone())


def test_the_time_dim_is_the_named_one_or_the_last_with_a_warning():
    named = CatFrames(N, dim=-1, in_keys=["obs"])(_batch(2, 6))
    with pytest.warns(UserWarning, match="no dim named 'time'"):
        unnamed = CatFrames(N, dim=-1, in_keys=["obs"])(_batch(2, 6, named=False))
    assert torch.equal(named["obs"], unnamed["obs"])
    first = _batch(2, 6, named=False).transpose(0, 1).refine_names("time", None)  # [T, B], time first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved = CatFrames(N, dim=-1, in_keys=["obs"])(first)
    assert torch.equal(moved["obs"].transpose(0, 1), named["obs"])


def test_next_stack_is_the_root_stack_shifted_with_the_next_frame():
    td = _batch(2, 9)
    out = CatFrames(N, dim=-1, in_keys=["obs", ("next", "obs")], mask_key="m")(td.clone())
    root = out["obs"].view(2, 9, N, 2)
    nxt = out["next", "obs"].view(2, 9, N, 2)
    assert torch.equal(nxt[:, :, :-1], root[:, :, 1:])
    assert torch.equal(nxt[:, :, -1], td["next", "obs"])


def test_catframes_facts_errors():
    with pytest.raises(ValueError, match="dim must be < 0"):
        CatFrames(N, dim=0)
    with pytest.raises(ValueError, match="dim must be < 0"):
        CatFrames(N, dim=2)
    with pytest.raises(RuntimeError, match="deprecated"):
        CatFrames(N, dim=-1, padding="zeros")
    with pytest.raises(ValueError, match="`padding` must be one of"):
        CatFrames(N, dim=-1, padding="reflect")
    with pytest.raises(ValueError, match="`N`"):
        CatFrames(0, dim=-1)
    with pytest.raises(TypeError, match="`dim`"):
        CatFrames(N, dim=-1.0)
    with pytest.raises(TypeError, match="padding_value"):
        CatFrames(N, dim=-1, padding_value=None)
    td = TensorDict(obs=torch.zeros(5, 1), batch_size=[5]).refine_names("time")
    with pytest.raises(KeyError, match="CatFrames.unfolding requires"):
        CatFrames(N, dim=-1, in_keys=["obs"])(td)
    assert CatFrames(N, dim=-1, in_keys=["obs"], future=True)(td)["obs"].shape == (5, N)  # no done needed
    with pytest.raises(ValueError, match="unbatched"):
        CatFrames(N, dim=-1, in_keys=["obs"])(TensorDict(obs=torch.zeros(1)))


def test_env_side_use_is_refused_with_the_way_out():
    with pytest.raises(RuntimeError, match="only provides the replay-buffer use"):
        CatFrames(N, dim=-1, as_inverse=True)
    cat = CatFrames(N, dim=-1, future=True, reset_key="_reset")
    td = TensorDict(pixels=torch.zeros(1))
    for call in (lambda: cat._step(td, td), lambda: cat._reset(td, td), lambda: cat._call(td)):
        with pytest.raises(RuntimeError, match="replay-buffer use"):
            call()
    assert cat.inv(td) is td and cat.done_key == "done" and cat.in_keys == ["pixels"]
    assert "CatFrames(N=4" in repr(cat)


# -- make_rb_transform_and_sampler -----------------------------------------------------------------------------
def _episodes(n_steps: int = 200, length: int = 10) -> TensorDict:
    g = torch.arange(n_steps)
    return TensorDict({
        "observation": (g + 1).float().unsqueeze(-1),
        "episode": g // length,
        ("next", "observation"): (g + 2).float().unsqueeze(-1),
        ("next", "done"): (g % length == length - 1).unsqueeze(-1),
    }, batch_size=[n_steps])


def test_make_rb_transform_and_sampler_gives_stacks_of_consecutive_frames():
    cat = CatFrames(N, dim=-1, in_keys=["observation"], out_keys=["observation_stack"])
    transform, sampler = cat.make_rb_transform_and_sampler(32, traj_key="episode", strict_length=True)
    assert isinstance(sampler, SliceSampler) and sampler.slice_len == N
    assert getattr(sampler, "batch_size_multiplier", None) == N
    assert isinstance(transform, Compose)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), sampler=sampler, transform=transform)
    rb.extend(_episodes())
    assert rb.storage.get_entry("observation_stack") is None  # stacked outputs are never stored
    assert rb.storage.get_entry(("next", "observation_stack")) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the time dim is named: no warning per sample
        batch = rb.sample(32)
    assert batch.batch_size == (32,)
    stack = batch["observation_stack"]
    assert stack.shape == (32, 4)
    assert torch.equal(stack.diff(dim=-1), torch.ones(32, N - 1))  # consecutive frames
    assert torch.equal(stack[:, -1:], batch["observation"])  # the kept step is the last of its stack
    assert torch.equal(batch["next", "observation_stack"][:, :-1], stack[:, 1:])
    assert torch.equal(batch["next", "observation_stack"][:, -1:], batch["next", "observation"])
    episode_of = ((stack - 1) // 10).long()
    assert (episode_of == episode_of[:, :1]).all()  # never across an episode


def test_make_rb_transform_with_default_out_keys_keeps_the_frames_in_storage():
    transform, sampler = CatFrames(N, dim=-1, in_keys=["observation"]).make_rb_transform_and_sampler(
        traj_key="episode")
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), sampler=sampler, transform=transform)
    rb.extend(_episodes())
    assert rb.storage.get_entry("observation").shape[1:] == (1,)
    assert rb.sample(8)["observation"].shape == (8, N)


def test_the_rb_transform_refuses_batches_that_are_not_slices():
    transform, _ = CatFrames(N, dim=-1, in_keys=["observation"]).make_rb_transform_and_sampler()
    with pytest.raises(ValueError, match="make_rb_transform_and_sampler returned"):
        transform(_episodes(6))
