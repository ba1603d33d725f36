"""Replay-buffer transforms and post-processing as TorchRL's own tests and tutorials use them (facts §4, §5, §8 of
torchrl_api_facts_wave3): MultiStepTransform, NextStateReconstructor, PolicyAgeFilter, MultiStep, DensifyReward and
CatFrames at sample time.

Each test is written the way TorchRL-written code would be: TorchRL's import paths, keywords and defaults,
attribute names, error types and phrases (``pytest.raises(match=...)``), shapes and values. Where this package
differs on purpose (docs/source/differences.rst), the tests only rely on what TorchRL documents.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    DensifyReward,
    LazyTensorStorage,
    MultiStep,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.data.postprocs.postprocs import DensifyReward as DensifyRewardFromPostprocs
from torchrl.envs import CatFrames, MultiStepTransform
from torchrl.envs.transforms import NextStateReconstructor, PolicyAgeFilter


# =================================================================================================================
# §4 replay-buffer transforms
# =================================================================================================================
def _ted(length: int, batch: tuple = (), *, done_at=(), seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, length)
    obs = torch.arange(length, dtype=torch.float32).expand(shape).clone()
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., list(done_at), :] = True
    return TensorDict(
        {
            "observation": obs,
            "next": {
                "observation": obs + 1,
                "reward": torch.randn(*shape, 1, generator=g),
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros_like(done),
            },
        },
        batch_size=shape,
    )


def test_multistep_transform_signature_and_defaults():
    t = MultiStepTransform(3, 0.98)
    assert t.n_steps == 3 and t.gamma == 0.98
    assert list(t.reward_keys) == ["reward"]
    assert t.done_key == "done"
    assert list(t.done_keys) == ["done", "truncated", "terminated"]
    assert t.mask_key == "mask"
    t.n_steps = 5
    assert t.n_steps == 5


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_multistep_transform_n_steps_must_be_strictly_positive(bad):
    with pytest.raises(ValueError, match="The value of n_steps must be a strictly positive integer."):
        MultiStepTransform(bad, 0.9)
    t = MultiStepTransform(2, 0.9)
    with pytest.raises(ValueError, match="The value of n_steps must be a strictly positive integer."):
        t.n_steps = bad


def test_multistep_transform_ten_adds():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(3, 0.9))
    td = _ted(10)
    td["next", "reward"] = torch.arange(10.0).unsqueeze(-1)
    for i in range(10):
        rb.add(td[i])
    assert len(rb) == 7
    stored = rb[:]
    assert (stored["steps_to_next_obs"] == 3).all()
    assert (stored["next", "original_reward"].squeeze(-1) == torch.arange(7)).all()


def test_multistep_transform_returns_none_until_more_than_n_steps_are_held():
    t = MultiStepTransform(3, 0.9)
    td = _ted(5)
    assert t.inv(td[:2]) is None
    assert t.inv(td[2:3]) is None
    out = t.inv(td[3:])
    assert out.batch_size == torch.Size([2])  # 2 + 1 + 2 - 3


def test_multistep_transform_dropped_extend_returns_an_empty_index():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(3, 0.9))
    assert torch.as_tensor(rb.extend(_ted(2))).numel() == 0 and len(rb) == 0


def test_multistep_transform_dropped_extend_index_shape():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(3, 0.9))
    assert rb.extend(_ted(2)).shape == (0, 1)


def test_multistep_transform_output_does_not_depend_on_chunking():
    td = _ted(250, (2,), done_at=(30, 31, 120, 200))
    outputs = []
    for chunk in (250, 50, 2):
        t = MultiStepTransform(3, 0.98)
        outs = [t._inv_call(td[:, i : i + chunk]) for i in range(0, 250, chunk)]
        outputs.append(torch.cat([o for o in outs if o is not None], -1))
    for other in outputs[1:]:
        assert (other == outputs[0]).all()
    ms = MultiStep(0.98, 3)
    ms.mask_key = "mask"
    assert (outputs[0] == ms(td)[:, :-3]).all()
    assert set(outputs[0].keys(True, True)) == set(ms(td).keys(True, True))


def test_multistep_transform_with_a_2d_storage():
    td = _ted(30, (2,), done_at=(12,))
    rb = ReplayBuffer(storage=LazyTensorStorage(100, ndim=2), transform=MultiStepTransform(3, 0.98), dim_extend=1)
    for i in range(0, 30, 10):
        rb.extend(td[:, i : i + 10])
    assert len(rb) == 27 * 2
    ms = MultiStep(0.98, 3)
    ms.mask_key = "mask"
    expected = ms(td)[:, :27]
    stored = rb[:]
    stored = stored.transpose(0, 1) if stored.batch_size != expected.batch_size else stored
    assert (stored.select(*expected.keys(True, True)) == expected).all()


def test_multistep_transform_sample_path_is_identity():
    t = MultiStepTransform(3, 0.9)
    td = _ted(5)
    assert t(td) is td


# -- NextStateReconstructor ---------------------------------------------------------------------------------------
def _trajectories(lengths=(10, 7, 13)) -> TensorDict:
    obs, traj, done = [], [], []
    for i, n in enumerate(lengths):
        obs.append(torch.arange(n, dtype=torch.float32) + 100 * i)
        traj.append(torch.full((n,), i))
        d = torch.zeros(n, dtype=torch.bool)
        d[-1] = True
        done.append(d)
    total = sum(lengths)
    return TensorDict(
        {"observation": torch.cat(obs), ("collector", "traj_ids"): torch.cat(traj),
         ("next", "done"): torch.cat(done).unsqueeze(-1), "action": torch.zeros(total, 1)},
        batch_size=[total],
    )


def test_next_state_reconstructor_with_a_slice_sampler():
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=SliceSampler(slice_len=5, traj_key=("collector", "traj_ids")),
        transform=NextStateReconstructor(),
        batch_size=20,
    )
    rb.extend(_trajectories())
    for _ in range(5):
        sample = rb.sample()
        obs, nxt = sample["observation"].reshape(4, 5), sample["next", "observation"].reshape(4, 5)
        assert (nxt[:, :-1] == obs[:, 1:]).all()  # mirrors inside each slice
        assert nxt[-1, -1].isnan()  # the batch end
        ends, starts = nxt[:-1, -1], obs[1:, 0]
        assert (ends.isnan() | (ends == starts)).all()  # same trajectory, not done: the next row is taken


def test_next_state_reconstructor_with_a_slice_sampler_and_a_step_counter():
    torch.manual_seed(0)
    data = _trajectories()
    data["step_count"] = data["observation"].long() % 100
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=SliceSampler(slice_len=5, traj_key=("collector", "traj_ids")),
        transform=NextStateReconstructor(step_count_key="step_count"),
        batch_size=20,
    )
    rb.extend(data)
    for _ in range(5):
        sample = rb.sample()
        obs, nxt = sample["observation"].reshape(4, 5), sample["next", "observation"].reshape(4, 5)
        assert (nxt[:, :-1] == obs[:, 1:]).all()  # mirrors inside each slice
        ends, starts = nxt[:, -1], torch.cat([obs[1:, 0], torch.tensor([-1.0])])
        assert (ends.isnan() | ((ends == starts) & (starts == obs[:, -1] + 1))).all()  # slice ends
        assert nxt.dtype == obs.dtype and nxt.shape == obs.shape


def test_next_state_reconstructor_with_a_random_sampler_is_mostly_nan():
    torch.manual_seed(0)
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=RandomSampler(), transform=NextStateReconstructor(),
                      batch_size=16)
    rb.extend(_trajectories())
    sample = rb.sample()
    assert sample["next", "observation"].isnan().float().mean() > 0.5


def test_next_state_reconstructor_done_catches_back_to_back_copies():
    td = TensorDict({"observation": torch.tensor([0.0, 1, 2, 0, 1, 2]), ("collector", "traj_ids"): torch.zeros(6),
                     ("next", "done"): torch.tensor([0, 0, 1, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)}, [6])
    out = NextStateReconstructor()(td)
    expected = torch.tensor([1.0, 2, float("nan"), 1, 2, float("nan")])
    torch.testing.assert_close(out["next", "observation"], expected, equal_nan=True)


def test_next_state_reconstructor_step_count_and_plain_shift():
    td = TensorDict({"observation": torch.tensor([0.0, 1, 2, 5, 6]), "step_count": torch.tensor([0, 1, 2, 5, 6])},
                    [5])
    out = NextStateReconstructor(traj_key=None, done_key=None, step_count_key="step_count")(td.clone())
    torch.testing.assert_close(out["next", "observation"], torch.tensor([1.0, 2, float("nan"), 6, float("nan")]),
                               equal_nan=True)
    out = NextStateReconstructor(traj_key=None, done_key=None)(td.clone())
    torch.testing.assert_close(out["next", "observation"], torch.tensor([1.0, 2, 5, 6, float("nan")]), equal_nan=True)
    out = NextStateReconstructor(traj_key=None, done_key=None, fill_value=-1.0)(td.clone())
    assert out["next", "observation"].tolist() == [1.0, 2, 5, 6, -1]


def test_next_state_reconstructor_missing_markers():
    td = TensorDict({"observation": torch.arange(4.0)}, [4])
    with pytest.raises(KeyError, match="trajectory key"):
        NextStateReconstructor()(td.clone())
    with pytest.raises(KeyError, match="done key"):
        NextStateReconstructor(traj_key=None)(td.clone())
    with pytest.raises(KeyError, match="step-count key"):
        NextStateReconstructor(traj_key=None, done_key=None, step_count_key="step_count")(td.clone())
    out = NextStateReconstructor(strict=False, step_count_key="step_count")(td.clone())
    torch.testing.assert_close(out["next", "observation"], torch.tensor([1.0, 2, 3, float("nan")]), equal_nan=True)


def test_next_state_reconstructor_shape_and_dtype_errors():
    with pytest.raises(ValueError, match=r"\(B,\)"):
        NextStateReconstructor(traj_key=None, done_key=None)(TensorDict({"observation": torch.zeros(2, 3)}, [2, 3]))
    frames = TensorDict({"pixels": torch.zeros(4, 2, dtype=torch.uint8)}, [4])
    with pytest.raises(TypeError, match="non-floating dtype"):
        NextStateReconstructor(keys=["pixels"], traj_key=None, done_key=None)(frames.clone())
    out = NextStateReconstructor(keys=["pixels"], traj_key=None, done_key=None, fill_value=0)(frames.clone())
    assert out["next", "pixels"].dtype == torch.uint8
    empty = TensorDict({"observation": torch.zeros(0)}, [0])
    assert set(NextStateReconstructor()(empty).keys(True)) == {"observation"}


def test_next_state_reconstructor_markers_with_a_trailing_dim():
    td = TensorDict({"observation": torch.arange(4.0), ("collector", "traj_ids"): torch.tensor([[0], [0], [1], [1]]),
                     ("next", "observation"): torch.full((4,), -5.0)}, [4])
    out = NextStateReconstructor(done_key=None)(td)
    torch.testing.assert_close(out["next", "observation"], torch.tensor([1.0, float("nan"), 3, float("nan")]),
                               equal_nan=True)  # a stored ("next", k) is overwritten


# -- PolicyAgeFilter ------------------------------------------------------------------------------------------------
def _versions(versions) -> TensorDict:
    versions = torch.as_tensor(versions)
    return TensorDict({"obs": torch.arange(versions.shape[0]).float(), "policy_version": versions},
                      batch_size=versions.shape[:1])


def test_policy_age_filter_on_write():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(current_version=3, max_policy_lag=1))
    rb.extend(_versions([0, 2, 2, 3]))
    assert len(rb) == 3


def test_policy_age_filter_on_sample_with_a_callable_version():
    version = {"v": 0}
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                      transform=PolicyAgeFilter(lambda: version["v"], max_policy_lag=1))
    rb.extend(_versions([0, 0, 1, 1]))
    assert len(rb) == 4 and rb.sample().batch_size[0] == 4
    version["v"] = 2  # rows of version 0 are now stale
    sample = rb.sample()
    assert sample.batch_size[0] <= 4 and (sample["policy_version"] >= 1).all()
    version["v"] = 10
    assert rb.sample().batch_size[0] == 0


def test_policy_age_filter_uses_the_oldest_version_of_a_row():
    td = TensorDict({"policy_version": torch.tensor([[3, 3], [2, 3], [3, 1]])}, [3])
    out = PolicyAgeFilter(current_version=3, max_policy_lag=1)(td)
    assert out["policy_version"].tolist() == [[3, 3], [2, 3]]


def test_policy_age_filter_errors_and_missing_key():
    with pytest.raises(ValueError, match="must be non-negative"):
        PolicyAgeFilter(3, -1)
    with pytest.raises(KeyError, match="PolicyAgeFilter:"):
        PolicyAgeFilter(3, 1, strict=True)(TensorDict({"obs": torch.zeros(2)}, [2]))
    t = PolicyAgeFilter(3, 1, policy_version_key="v")
    td = TensorDict({"obs": torch.zeros(2)}, [2])
    with pytest.warns(UserWarning):
        assert t(td) is td
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t(td)  # once
    assert t.in_keys == [] and t.out_keys == []


# =================================================================================================================
# §5 post-processing
# =================================================================================================================
def test_multistep_attributes_and_errors():
    ms = MultiStep(0.9, 3)
    assert ms.gamma == 0.9 and ms.n_steps == 3
    assert ms.done_key == "done"
    assert tuple(ms.done_keys) == ("done", "truncated", "terminated")
    assert tuple(ms.reward_keys) == ("reward",)
    assert ms.mask_key == ("collector", "mask")
    assert "gammas" in dict(ms.named_buffers())
    assert isinstance(ms, torch.nn.Module)
    with pytest.raises(ValueError, match="n_steps must be a non-negative integer."):
        MultiStep(0.9, 0)
    with pytest.raises(ValueError, match="got out-of-bounds gamma decay"):
        MultiStep(1.1, 3)
    with pytest.raises(ValueError, match="got out-of-bounds gamma decay"):
        MultiStep(0.0, 3)


def _torchrl_test_data(key: str, T: int = 11, b: int = 5) -> TensorDict:
    """The data of TorchRL's MultiStep test: trajectories ending at the last four steps, masked after their end."""
    torch.manual_seed(0)
    done = torch.zeros(b, T, 1, dtype=torch.bool)
    done[0, -1] = done[1, -2] = done[2, -3] = done[3, -4] = True
    mask = ~(done.clone().cumsum(1).cumsum(1) >= 2)
    total_obs = torch.randn(1, T + 1, 1).expand(b, T + 1, 1)
    return TensorDict(
        {
            key: total_obs[:, :T] * mask.float(),
            "next": {key: total_obs[:, 1:] * mask.float(), "done": done, "terminated": done.clone(),
                     "reward": torch.randn(b, T, 1) * mask.float()},
            "collector": {"mask": mask.squeeze(-1)},
        },
        batch_size=(b, T),
    )


@pytest.mark.parametrize("n", range(1, 14))
@pytest.mark.parametrize("key", ["observation", "pixels", "observation_whatever"])
def test_multistep_as_torchrl_tests_it(n, key):
    tensordict = _torchrl_test_data(key)
    ms_tensordict = MultiStep(0.9, n)(tensordict.clone())
    assert ms_tensordict.get(("next", "done")).max() == 1
    if n == 1:
        for k in tensordict.keys(True, True):
            assert (ms_tensordict.get(k) == tensordict.get(k)).all(), k
        assert not ms_tensordict["nonterminal"].any()
    else:
        assert (ms_tensordict["next", "reward"] != ms_tensordict["next", "original_reward"]).any()
    assert (ms_tensordict["next", "original_reward"] == tensordict["next", "reward"]).all()
    # the next obs is the one at t + n - 1, pulled back before any done or the batch end
    T = tensordict.shape[-1]
    done = tensordict["next", "done"].squeeze(-1)
    for b in range(tensordict.shape[0]):
        for t in range(T):
            idx = min(t + n - 1, T - 1)
            ends = done[b, t:idx].nonzero()
            if ends.numel():
                idx = t + int(ends[0])
            assert ms_tensordict["next", key][b, t] == tensordict["next", key][b, idx]
            assert ms_tensordict["steps_to_next_obs"][b, t] == idx - t + 1
    assert (ms_tensordict["gamma"] == 0.9 ** ms_tensordict["steps_to_next_obs"]).all()
    k = ms_tensordict["steps_to_next_obs"] - 1
    assert (ms_tensordict["nonterminal"] == ((k != 0) & tensordict["collector", "mask"])).all()
    assert ms_tensordict["steps_to_next_obs"].shape == tensordict.shape
    assert ms_tensordict["steps_to_next_obs"].dtype == torch.int64
    # the done flags are those of step t
    assert (ms_tensordict["next", "done"] == tensordict["next", "done"]).all()
    assert "original_reward" not in tensordict["next"].keys()


@pytest.mark.parametrize("batch_size", [[], [4], [2, 3]])
@pytest.mark.parametrize("T", [1, 2, 10])
@pytest.mark.parametrize("done_trailing", [True, False])
def test_multistep_batch_shapes(batch_size, T, done_trailing):
    shape = (*batch_size, T)
    done = torch.rand(*shape, 1) < 0.2
    td = TensorDict({"obs": torch.randn(*shape, 2), "next": {
        "obs": torch.randn(*shape, 2), "reward": torch.randn(*shape, 1),
        "done": done if done_trailing else done.squeeze(-1)}}, batch_size=shape)
    out = MultiStep(0.9, 3)(td)
    for name in ("steps_to_next_obs", "gamma", "nonterminal"):
        assert out[name].shape == torch.Size(shape)
    assert out["next", "reward"].shape == td["next", "reward"].shape
    assert out is not td


def test_multistep_done_shape_must_match_the_batch():
    td = TensorDict({"next": {"reward": torch.randn(4, 1), "done": torch.zeros(4, 3, dtype=torch.bool)}}, [4])
    with pytest.raises(RuntimeError, match="tensordict shape must be compatible with the done's shape"):
        MultiStep(0.9, 2)(td)


def test_multistep_rebatches_to_a_done_with_more_dims():
    T, A = 5, 3
    done = torch.zeros(T, A, dtype=torch.bool)
    done[2, 1] = True
    obs = torch.arange(T).float()[:, None].expand(T, A).clone()
    td = TensorDict({"obs": obs, "next": {"obs": obs + 1, "reward": torch.ones(T, A), "done": done}}, [T])
    out = MultiStep(1.0, 3)(td)
    assert out.batch_size == torch.Size([T]) and out["steps_to_next_obs"].shape == (T, A)
    assert out["next", "reward"][:, 1].tolist() == [3, 2, 1, 2, 1]
    assert out["next", "reward"][:, 0].tolist() == [3, 3, 3, 2, 1]
    assert out["next", "obs"][:, 1].tolist() == [3, 3, 3, 5, 5]


def test_multistep_values():
    td = TensorDict({"obs": torch.arange(5.0), "next": {
        "obs": torch.arange(1.0, 6.0), "reward": torch.tensor([1.0, 2, 4, 8, 16]).unsqueeze(-1),
        "done": torch.tensor([False, False, True, False, False]).unsqueeze(-1)}}, [5])
    out = MultiStep(0.5, 3)(td)
    assert out["next", "reward"].squeeze(-1).tolist() == [3.0, 4.0, 4.0, 16.0, 16.0]
    assert out["next", "obs"].tolist() == [3.0, 3.0, 3.0, 5.0, 5.0]
    assert out["steps_to_next_obs"].tolist() == [3, 2, 1, 2, 1]
    assert out["nonterminal"].tolist() == [True, True, False, True, False]
    assert out["next", "done"].squeeze(-1).tolist() == [False, False, True, False, False]


def test_densify_reward():
    reward = torch.zeros(10, 1)
    reward[3], reward[7] = 3.0, 7.0
    done = torch.zeros(10, 1, dtype=torch.bool)
    done[3] = done[7] = True
    td = TensorDict({"next": {"reward": reward, "done": done}}, [10])
    module = DensifyRewardFromPostprocs()
    assert DensifyRewardFromPostprocs is DensifyReward
    assert module(td) is td
    assert td["next", "reward"].squeeze(-1).tolist() == [3, 3, 3, 3, 7, 7, 7, 7, 0, 0]
    td = TensorDict({"next": {"reward": reward, "done": done}}, [10])
    out = DensifyReward(reward_key_out="rtg", discount=0.5)(td)
    assert out["next", "rtg"].squeeze(-1)[:4].tolist() == [3 * 0.125, 3 * 0.25, 3 * 0.5, 3.0]
    assert (out["next", "reward"] == reward).all()


def test_densify_reward_keys_and_errors():
    module = DensifyReward(reward_key="r", done_key="d", reward_key_out="rtg")
    assert module.in_keys == ["r", "d"] and module.out_keys == ["rtg"]
    td = TensorDict({"next": {"reward": torch.zeros(10, 1), "done": torch.zeros(10, dtype=torch.bool)}}, [10])
    with pytest.raises(RuntimeError, match="reward and done state are expected to have the same shape"):
        DensifyReward()(td)


# =================================================================================================================
# §8 CatFrames at sample time
# =================================================================================================================
def test_catframes_signature_defaults_and_errors():
    cat = CatFrames(N=4, dim=-3)
    assert cat.in_keys == ["pixels"] and cat.out_keys == ["pixels"]
    assert cat.N == 4 and cat.dim == -3 and cat.padding == "same" and cat.padding_value == 0
    assert cat.done_key == "done"
    with pytest.raises(ValueError, match="dim must be < 0"):
        CatFrames(N=4, dim=0)
    with pytest.raises(RuntimeError):
        CatFrames(N=4, dim=-1, padding="zeros")
    with pytest.raises(ValueError):
        CatFrames(N=4, dim=-1, padding="reflect")


def _frames(T: int = 8, done_at=(2,)) -> TensorDict:
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[list(done_at)] = True
    return TensorDict({"obs": torch.arange(T, dtype=torch.float32).unsqueeze(-1), ("next", "done"): done}, [T])


def test_catframes_offline_windows_same_and_constant_padding():
    td = _frames(6, done_at=(2,)).refine_names("time")
    out = CatFrames(N=3, dim=-1, in_keys=["obs"])(td.clone())["obs"]
    assert out.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [3, 3, 3], [3, 3, 4], [3, 4, 5]]
    out = CatFrames(N=3, dim=-1, in_keys=["obs"], padding="constant", padding_value=-1)(td.clone())["obs"]
    assert out.tolist() == [[-1, -1, 0], [-1, 0, 1], [0, 1, 2], [-1, -1, 3], [-1, 3, 4], [3, 4, 5]]


def test_catframes_mask_and_future():
    td = _frames(6, done_at=(2,)).refine_names("time")
    out = CatFrames(N=3, dim=-1, in_keys=["obs"], out_keys=["stack"], mask_key="pad")(td.clone())
    assert out["pad"].dtype == torch.bool and out["pad"].shape == (6, 3)
    assert out["pad"][0].tolist() == [True, True, False] and out["pad"][2].tolist() == [False, False, False]
    future = CatFrames(N=3, dim=-1, in_keys=["obs"], future=True)(td.clone())["obs"]
    assert future[0].tolist() == [0, 1, 2] and future[3].tolist() == [3, 4, 5]


def test_catframes_offline_errors_and_warning():
    with pytest.warns(UserWarning):
        CatFrames(N=2, dim=-1, in_keys=["obs"])(_frames(4))
    with pytest.raises(ValueError):
        CatFrames(N=2, dim=-1, in_keys=["obs"])(_frames(4)[0])
    with pytest.raises(KeyError, match="CatFrames.unfolding requires"):
        CatFrames(N=2, dim=-1, in_keys=["obs"])(_frames(4).exclude(("next", "done")).refine_names("time"))
    out = CatFrames(N=2, dim=-1, in_keys=["obs"], future=True)(_frames(4).exclude(("next", "done")).refine_names("time"))
    assert out["obs"].shape == (4, 2)


def test_catframes_next_stack_is_built_from_the_root_stack():
    td = _frames(5, done_at=())
    td["next", "obs"] = td["obs"] + 1
    td = td.refine_names("time")
    out = CatFrames(N=3, dim=-1, in_keys=["obs", ("next", "obs")])(td)
    assert out["next", "obs"].tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]


def test_catframes_make_rb_transform_and_sampler():
    torch.manual_seed(0)
    T = 100
    traj = torch.arange(T) // 25
    done = (torch.arange(T) % 25 == 24).unsqueeze(-1)
    data = TensorDict({"observation": torch.arange(T, dtype=torch.float32).unsqueeze(-1), ("next", "done"): done,
                       ("next", "observation"): torch.arange(1, T + 1, dtype=torch.float32).unsqueeze(-1),
                       ("collector", "traj_ids"): traj}, [T])
    cat = CatFrames(N=4, dim=-1, in_keys=["observation"], out_keys=["observation_stack"])
    transform, sampler = cat.make_rb_transform_and_sampler(
        batch_size=32, traj_key=("collector", "traj_ids"), strict_length=True
    )
    assert isinstance(sampler, SliceSampler)
    rb = ReplayBuffer(storage=LazyTensorStorage(T), sampler=sampler, transform=transform, batch_size=32)
    rb.extend(data)
    assert "observation_stack" not in rb.storage[:].keys()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unnamed time dim warns, as in TorchRL
        sample = rb.sample()
    assert sample.batch_size == torch.Size([32])
    stack = sample["observation_stack"]
    assert stack.shape == (32, 4)
    assert (stack.diff(dim=-1) == 1).all()  # consecutive frames
    assert (sample["next", "observation_stack"] == stack + 1).all()
