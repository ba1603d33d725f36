"""HERReplayBuffer, exercised the way TorchRL's tests and users exercise it.

One test per fact of ``torchrl_api_facts_wave3.md`` §1 (HER): TorchRL's import paths, keywords, attribute names
(including the private ``_last_cache_key`` / ``_episode_ends_cache`` that TorchRL's tests read), error types and
phrases, reprs and results. Where we differ on purpose (TorchRL's full-ring mapping, the ``"_her"`` entry left in the
given state dict) the test pins both what TorchRL code relies on and our behaviour. The import paths of the trajectory
queries are checked here too (the same facts file, §0); their behaviour in test_query_torchrl_compat.py.
"""

from __future__ import annotations

import enum
import importlib
import inspect

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    HERReplayBuffer,
    HindsightStrategy,
    LazyTensorStorage,
    RandomSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.envs.transforms import Compose

GOAL, REWARD = -1.0, -5.0


def reward_fn(td):
    return (td["next", "achieved_goal"] == td["desired_goal"]).all(-1, keepdim=True).float()


def goal_data(lengths, *, first_step=0, close_last=True, terminated=False) -> TensorDict:
    """Episodes of the given lengths; ``achieved_goal`` = global step number; sentinel goals and rewards."""
    n = sum(lengths)
    step = torch.arange(first_step, first_step + n, dtype=torch.float32).unsqueeze(-1)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[torch.cumsum(torch.tensor(lengths), 0) - 1] = True
    if not close_last:
        done[-1] = False
    nxt = {"achieved_goal": step + 1, "desired_goal": torch.full((n, 1), GOAL), "reward": torch.full((n, 1), REWARD)}
    nxt["terminated" if terminated else "done"] = done
    return TensorDict(
        {"achieved_goal": step, "desired_goal": torch.full((n, 1), GOAL), "observation": step.clone(), "next": nxt},
        batch_size=[n],
    )


def her(capacity=100, batch_size=16, seed=0, **kwargs):
    kwargs.setdefault("storage", LazyTensorStorage(capacity))
    return HERReplayBuffer(
        reward_fn=reward_fn, batch_size=batch_size, generator=torch.Generator().manual_seed(seed), **kwargs
    )


def every_row(rb, **kwargs):
    """One batch holding every stored row once (TorchRL-style: ``SamplerWithoutReplacement``)."""
    batch = rb.sample(len(rb), **kwargs)
    return batch, batch["index"]


def torchrl_episode_ends(done: torch.Tensor, n: int, full: bool, last: int, index: torch.Tensor) -> torch.Tensor:
    """TorchRL's mapping (facts §1 step 3 and 5): first boundary >= index, clamped to the last boundary."""
    boundary = done.reshape(n).clone()
    boundary[last if full else n - 1] = True
    ends = boundary.nonzero().squeeze(-1)
    position = torch.searchsorted(ends, index).clamp(max=ends.numel() - 1)
    return ends[position]


# -- §0 import paths ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module,names",
    [
        ("torchrl.data", ("HERReplayBuffer", "HindsightStrategy", "Trajectory", "traj", "TrajectoryPredicate",
                          "iter_trajectories", "filter_trajectories")),  # fmt: skip
        ("torchrl.data.replay_buffers", ("HERReplayBuffer", "HindsightStrategy", "Trajectory", "traj",
                                         "TrajectoryPredicate", "iter_trajectories", "filter_trajectories")),  # fmt: skip
        ("torchrl.data.replay_buffers.her", ("HERReplayBuffer", "HindsightStrategy")),
        ("torchrl.data.replay_buffers.query", ("Trajectory", "traj", "TrajectoryPredicate", "iter_trajectories",
                                               "filter_trajectories")),  # fmt: skip
    ],
)
def test_import_paths(module, names):
    mod = importlib.import_module(module)
    her_mod = importlib.import_module("torchrl.data.replay_buffers.her")
    query_mod = importlib.import_module("torchrl.data.replay_buffers.query")
    for name in names:
        assert getattr(mod, name) is getattr(her_mod if name in ("HERReplayBuffer", "HindsightStrategy") else query_mod,
                                              name), (module, name)  # fmt: skip


# -- §1 HindsightStrategy ----------------------------------------------------------------------------------------------
def test_hindsight_strategy_is_a_str_enum_looked_up_by_value():
    assert [(m.name, m.value) for m in HindsightStrategy] == [
        ("FUTURE", "future"), ("FINAL", "final"), ("EPISODE", "episode"), ("RANDOM", "random")]  # fmt: skip
    if hasattr(enum, "StrEnum"):
        assert issubclass(HindsightStrategy, enum.StrEnum)
    assert isinstance(HindsightStrategy.FUTURE, str) and HindsightStrategy.FINAL == "final"
    assert str(HindsightStrategy.EPISODE) == "episode" and f"{HindsightStrategy.RANDOM}" == "random"
    assert HindsightStrategy("future") is HindsightStrategy.FUTURE
    with pytest.raises(ValueError):
        HindsightStrategy("best")


# -- §1 constructor --------------------------------------------------------------------------------------------------
def test_signature_keywords_and_defaults():
    params = inspect.signature(HERReplayBuffer).parameters
    assert list(params)[0] == "reward_fn"
    expected = {"her_ratio": 0.8, "strategy": "future", "goal_key": "desired_goal",
                "achieved_goal_key": "achieved_goal", "reward_key": ("next", "reward"),
                "end_key": ("next", "done"), "sampler": None}  # fmt: skip
    for name, default in expected.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default == default, name
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_a_tensordict_replay_buffer_taking_its_keywords():
    transform = Compose()
    rb = HERReplayBuffer(reward_fn, storage=LazyTensorStorage(7), batch_size=3, transform=transform)
    assert isinstance(rb, TensorDictReplayBuffer) and isinstance(rb.storage, LazyTensorStorage)
    assert rb.storage.max_size == 7 and rb.batch_size == 3
    assert isinstance(rb.sampler, RandomSampler), "sampler=None -> RandomSampler()"
    custom = SamplerWithoutReplacement()
    assert HERReplayBuffer(reward_fn, sampler=custom).sampler is custom


def test_her_ratio_outside_zero_one_is_a_value_error():
    for ratio in (-0.01, 1.01, 2):
        with pytest.raises(ValueError, match=r"her_ratio must be in \[0, 1\]"):
            HERReplayBuffer(reward_fn, her_ratio=ratio)
    for ratio in (0, 0.0, 1, 1.0, 0.5):
        assert HERReplayBuffer(reward_fn, her_ratio=ratio).her_ratio == ratio


def test_strategy_is_coerced_to_the_enum_and_a_bad_one_is_a_value_error():
    assert HERReplayBuffer(reward_fn).strategy is HindsightStrategy.FUTURE
    for value in ("future", "final", "episode", "random"):
        assert HERReplayBuffer(reward_fn, strategy=value).strategy is HindsightStrategy(value)
    assert HERReplayBuffer(reward_fn, strategy=HindsightStrategy.FINAL).strategy is HindsightStrategy.FINAL
    with pytest.raises(ValueError, match="is not a valid HindsightStrategy"):
        HERReplayBuffer(reward_fn, strategy="hindsight")


def test_public_attributes():
    rb = HERReplayBuffer(reward_fn, her_ratio=0.25, strategy="episode", goal_key=("obs", "goal"),
                         achieved_goal_key=("obs", "ag"), reward_key="r", end_key="done")  # fmt: skip
    assert rb.reward_fn is reward_fn and rb.her_ratio == 0.25 and rb.strategy is HindsightStrategy.EPISODE
    assert (rb.goal_key, rb.achieved_goal_key, rb.reward_key, rb.end_key) == (("obs", "goal"), ("obs", "ag"), "r",
                                                                              "done")  # fmt: skip


@pytest.mark.parametrize("end_key,terminated", [(("next", "done"), ("next", "terminated")), ("done", "terminated")])
def test_the_terminated_sibling_of_end_key_ends_episodes(end_key, terminated):
    data = goal_data([3, 4])
    del data["next", "done"]
    data[terminated] = torch.zeros(7, 1, dtype=torch.bool)
    data[terminated][2] = True
    rb = her(strategy="final", her_ratio=1.0, end_key=end_key, sampler=SamplerWithoutReplacement())
    rb.extend(data)
    batch, index = every_row(rb)
    assert batch["desired_goal"].squeeze(-1).tolist() == [2.0 if i <= 2 else 6.0 for i in index.tolist()]


# -- §1 sampling ---------------------------------------------------------------------------------------------------
def test_sample_return_info_iteration_and_the_index_key():
    rb = her(batch_size=8)
    rb.extend(goal_data([5, 5]))
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == torch.Size([8]) and "index" in info and torch.equal(batch["index"], info["index"])
    assert ((batch["desired_goal"] != GOAL).squeeze(-1)[:6]).all(), "sample() relabels: _sample is overridden"
    batches = []
    for b in rb:
        batches.append(b)
        if len(batches) == 2:
            break
    assert all((b["desired_goal"][:6] != GOAL).all() for b in batches), "iteration relabels too"


def test_missing_goal_keys_raise_at_the_first_sample_only():
    data = goal_data([4])
    del data["achieved_goal"]
    rb = her()
    rb.extend(data)
    with pytest.raises(KeyError, match="The following keys are not present in storage") as info:
        rb.sample()
    assert "storage: achieved_goal_key='achieved_goal'." in str(info.value), "lists only the missing key"
    both = goal_data([4]).exclude("achieved_goal", "desired_goal")
    rb = her()
    rb.extend(both)
    with pytest.raises(KeyError, match="storage: goal_key='desired_goal', achieved_goal_key='achieved_goal'"):
        rb.sample()
    ok = her(her_ratio=0.0)
    ok.extend(goal_data([4]))
    ok.sample()
    ok.extend(goal_data([4]).exclude("desired_goal"))  # not re-checked after the first sample
    ok.sample()


def test_transforms_run_before_relabelling_and_reward_fn_sees_the_transformed_batch():
    seen = []

    def spy(td):
        seen.append(td.get("scaled", None))
        assert (td["desired_goal"] != GOAL).all(), "reward_fn gets the relabelled part, goals already replaced"
        return (td["desired_goal"] * 0).float()

    rb = HERReplayBuffer(spy, her_ratio=1.0, storage=LazyTensorStorage(20), batch_size=4)
    rb.append_transform(lambda td: td.set("scaled", td["observation"] * 10))
    rb.extend(goal_data([5]))
    batch = rb.sample()
    assert seen[0] is not None and seen[0].shape[0] == 4 and "scaled" in batch.keys()
    assert torch.equal(batch["scaled"], batch["observation"] * 10)
    assert (batch["desired_goal"] >= batch["index"].unsqueeze(-1)).all(), "goals from the raw storage"


def test_boundary_cache_key_changes_after_extend_and_after_add():
    rb = her()
    assert rb._last_cache_key is None and rb._episode_ends_cache is None
    rb.extend(goal_data([4]))
    rb.sample()
    first = rb._last_cache_key
    assert first is not None and rb._episode_ends_cache.tolist() == [3] and rb._episode_ends_cache.device.type == "cpu"
    rb.extend(goal_data([3], first_step=4))
    rb.sample()
    second = rb._last_cache_key
    assert second != first and rb._episode_ends_cache.tolist() == [3, 6]
    rb.add(goal_data([1], first_step=7)[0])
    rb.sample()
    assert rb._last_cache_key != second and rb._episode_ends_cache.tolist() == [3, 6, 7]
    full = her(capacity=6)
    full.extend(goal_data([6]))
    full.sample()
    key = full._last_cache_key
    full.add(goal_data([1], first_step=6)[0])  # full: the length is unchanged, the write point moved
    full.sample()
    assert full._last_cache_key != key


def test_done_or_terminated_mark_boundaries_and_neither_is_a_key_error():
    data = goal_data([2, 3])
    data["next", "terminated"] = torch.zeros(5, 1, dtype=torch.bool)
    data["next", "done"][1] = False
    data["next", "terminated"][1] = True
    rb = her(strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    rb.extend(data)
    assert rb._episode_ends_cache is None
    rb.sample(5)
    assert rb._episode_ends_cache.tolist() == [1, 4]
    rb = her()
    rb.extend(goal_data([4]).exclude(("next", "done")))
    with pytest.raises(KeyError, match=r"'done'.*'terminated'"):
        rb.sample()


def test_a_storage_with_two_dims_raises_not_implemented_when_sampling():
    rb = HERReplayBuffer(reward_fn, storage=LazyTensorStorage(20, ndim=2), batch_size=4)
    rb.extend(goal_data([5, 5]).reshape(2, 5))
    with pytest.raises(NotImplementedError, match="only supports 1D storages"):
        rb.sample()


def test_synthetic_episode_end_at_the_newest_row_not_full_and_at_the_write_point_full():
    rb = her(capacity=20, strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    rb.extend(goal_data([4, 3], close_last=False))  # not full: row len-1 ends the open episode
    rb.sample(7)
    assert rb._episode_ends_cache.tolist() == [3, 6]
    full = her(capacity=10, strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    full.extend(goal_data([12], close_last=False))  # rows 0-1 hold steps 10-11: the write point is row 1
    batch, index = every_row(full)
    assert full._episode_ends_cache.tolist() == [1]
    assert (batch["desired_goal"] == 11.0).all(), "no goal across the write point"


@pytest.mark.parametrize("batch_size,her_ratio", [(10, 0.8), (7, 0.5), (3, 0.3), (1, 0.8), (9, 1.0), (5, 0.0)])
def test_the_first_int_batch_times_her_ratio_positions_are_relabelled(batch_size, her_ratio):
    rb = her(batch_size=batch_size, her_ratio=her_ratio)
    rb.extend(goal_data([6, 6, 6]))
    n_her = int(batch_size * her_ratio)
    for _ in range(3):
        batch = rb.sample()
        relabelled = (batch["desired_goal"] != GOAL).squeeze(-1)
        assert relabelled.tolist() == [True] * n_her + [False] * (batch_size - n_her)
        assert ((batch["next", "reward"] != REWARD).squeeze(-1) == relabelled).all()


@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
def test_goal_sources_per_strategy(strategy):
    rb = her(strategy=strategy, her_ratio=1.0, batch_size=64, seed=1)
    rb.extend(goal_data([4, 6, 5]))  # episodes [0, 3], [4, 9], [10, 14]
    starts, ends = torch.tensor([0, 4, 10]), torch.tensor([3, 9, 14])
    for _ in range(5):
        batch = rb.sample()
        idx, goal = batch["index"], batch["desired_goal"].squeeze(-1).long()
        episode = torch.searchsorted(ends, idx)
        if strategy == "future":
            assert ((goal >= idx) & (goal <= ends[episode])).all()
        elif strategy == "final":
            assert torch.equal(goal, ends[episode])
        elif strategy == "episode":
            assert ((goal >= starts[episode]) & (goal <= ends[episode])).all()
        else:
            assert ((goal >= 0) & (goal < len(rb))).all()


def test_future_may_give_the_sampled_step_s_own_root_achieved_goal():
    rb = her(strategy="future", her_ratio=1.0, batch_size=200)
    rb.extend(goal_data([3]))
    batch = rb.sample()
    assert (batch["desired_goal"].squeeze(-1).long() == batch["index"]).any(), "[idx, end] includes idx (Odd)"
    last = batch["index"] == 2
    assert (batch["desired_goal"][last] == 2.0).all(), "the root achieved goal, not ('next', ...)"


def test_goals_written_to_goal_key_and_its_next_twin_and_rewards_recomputed():
    rb = her(her_ratio=1.0, batch_size=32)
    rb.extend(goal_data([5, 5]))
    batch = rb.sample()
    assert torch.equal(batch["desired_goal"], batch["next", "desired_goal"])
    assert torch.equal(batch["next", "reward"], reward_fn(batch))
    flat = HERReplayBuffer(lambda td: reward_fn(td).squeeze(-1), her_ratio=1.0, storage=LazyTensorStorage(20),
                           batch_size=8)  # fmt: skip
    flat.extend(goal_data([5]).exclude(("next", "desired_goal")))
    batch = flat.sample()
    assert batch["next", "reward"].shape == torch.Size([8, 1]) and torch.equal(batch["next", "reward"], reward_fn(batch))


def test_nested_goal_keys():
    data = goal_data([4, 4])
    data["obs", "desired_goal"] = data.pop("desired_goal")
    data["obs", "achieved_goal"] = data.pop("achieved_goal")
    data["next", "obs", "desired_goal"] = data["next"].pop("desired_goal")

    def nested_reward(td):
        return (td["obs", "desired_goal"] == td["obs", "desired_goal"].floor()).float()

    rb = HERReplayBuffer(nested_reward, her_ratio=1.0, strategy="final", goal_key=("obs", "desired_goal"),
                         achieved_goal_key=("obs", "achieved_goal"), storage=LazyTensorStorage(20), batch_size=8)  # fmt: skip
    rb.extend(data)
    batch = rb.sample()
    goal = batch["obs", "desired_goal"].squeeze(-1)
    assert torch.equal(goal, torch.where(batch["index"] <= 3, 3.0, 7.0))
    assert torch.equal(batch["next", "obs", "desired_goal"], batch["obs", "desired_goal"])
    assert (batch["next", "reward"] == 1.0).all()


def test_her_ratio_zero_keeps_stored_goals_and_one_recomputes_every_reward():
    rb = her(her_ratio=0.0, batch_size=16)
    rb.extend(goal_data([5, 5]))
    batch = rb.sample()
    stored = rb.storage[batch["index"]]
    assert torch.equal(batch["desired_goal"], stored["desired_goal"])
    assert torch.equal(batch["next", "reward"], stored["next", "reward"])
    rb = her(her_ratio=1.0, batch_size=16)
    rb.extend(goal_data([5, 5]))
    batch = rb.sample()
    assert (batch["next", "reward"] != REWARD).all() and torch.equal(batch["next", "reward"], reward_fn(batch))


def test_final_with_several_episodes_stays_in_episode_and_matches_torchrl_s_mapping():
    rb = her(strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    data = goal_data([3, 5, 2, 4], close_last=False)
    rb.extend(data)
    batch, index = every_row(rb)
    expected = torchrl_episode_ends(data["next", "done"], len(rb), False, len(rb) - 1, index)
    assert torch.equal(batch["desired_goal"].squeeze(-1).long(), expected)


def test_full_ring_matches_torchrl_when_the_last_row_ends_an_episode():
    """The configuration TorchRL's tests can pass in: every row maps to the same episode end as in TorchRL."""
    rb = her(capacity=12, strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    rb.extend(goal_data([4] * 4))  # wrapped: rows 0-3 hold steps 12-15, rows 4-11 steps 4-11
    batch, index = every_row(rb)
    stored = rb.storage[:]
    expected = torchrl_episode_ends(stored["next", "done"], 12, True, 3, index)
    assert torch.equal(batch["desired_goal"].squeeze(-1), stored["achieved_goal"].squeeze(-1)[expected])


@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_full_ring_goal_ranges_are_torchrl_s_when_the_last_row_ends_an_episode(strategy):
    rb = her(capacity=12, strategy=strategy, her_ratio=1.0, batch_size=2000, seed=3)
    rb.extend(goal_data([4] * 4))  # boundaries at rows 3 (also the write point), 7, 11
    batch = rb.sample()
    index = batch["index"]
    step = batch["desired_goal"].squeeze(-1).long()
    goal_row = torch.where(step >= 12, step - 12, step)
    ends = torch.tensor([3, 7, 11])
    end = torchrl_episode_ends(rb.storage[:]["next", "done"], 12, True, 3, index)
    episode = torch.searchsorted(ends, index)
    start = torch.where(episode > 0, ends[(episode - 1).clamp(min=0)] + 1, 0)
    low = index if strategy == "future" else start
    assert ((goal_row >= low) & (goal_row <= end)).all()
    seen = {(int(i), int(g)) for i, g in zip(index, goal_row)}
    assert seen == {(i, g) for i in range(12) for g in range(int(low[index == i][0]), int(end[index == i][0]) + 1)}


def test_full_ring_odd_rows_above_the_highest_boundary_keep_their_own_episode():
    """TorchRL maps rows above the highest boundary to that boundary (an older episode, **Odd**); ours follows
    time: their episode continues at row 0 and ends at the first boundary there. Other rows agree."""
    rb = her(capacity=10, strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    rb.extend(goal_data([4, 4, 4]))  # rows 0-1 hold steps 10-11 (done at 11), rows 2-9 steps 2-9 (done at 3, 7)
    batch, index = every_row(rb)
    stored = rb.storage[:]
    goal_row = {int(i): int(g) - 10 if g >= 10 else int(g) for i, g in zip(index, batch["desired_goal"].squeeze(-1))}
    theirs = torchrl_episode_ends(stored["next", "done"], 10, True, 1, index)
    for i, t in zip(index.tolist(), theirs.tolist()):
        if i <= 7:
            assert goal_row[i] == t, i
        else:
            assert t == 7 and goal_row[i] == 1, "steps 8, 9 belong to the episode ending at step 11 (row 1)"


def test_empty_clears_the_boundary_cache():
    rb = her()
    rb.extend(goal_data([4]))
    rb.sample()
    assert rb._episode_ends_cache is not None
    rb.empty()
    assert rb._episode_ends_cache is None and rb._last_cache_key is None and len(rb) == 0
    rb.extend(goal_data([2, 2]))
    rb.sample()
    assert rb._episode_ends_cache.tolist() == [1, 3]


def test_state_dict_her_entry_and_load_state_dict_restoring_the_cache():
    rb = her(her_ratio=0.5, strategy="episode")
    rb.extend(goal_data([3, 4]))
    rb.sample()
    sd = rb.state_dict()
    entry = sd["_her"]
    assert entry["goal_key"] == "desired_goal" and entry["achieved_goal_key"] == "achieved_goal"
    assert entry["reward_key"] == ("next", "reward") and entry["her_ratio"] == 0.5
    assert entry["strategy"] == "episode" and type(entry["strategy"]) is str
    assert isinstance(entry["episode_ends_cache"], torch.Tensor) and entry["episode_ends_cache"].tolist() == [2, 6]
    assert entry["last_cache_key"] == rb._last_cache_key
    rb2 = her(her_ratio=0.5, strategy="episode")
    rb2.load_state_dict(sd)
    assert rb2._last_cache_key == rb._last_cache_key
    assert torch.equal(rb2._episode_ends_cache, rb._episode_ends_cache) and len(rb2) == 7
    cache = rb2._episode_ends_cache
    rb2.sample()
    rb.sample()
    assert rb2._last_cache_key == rb._last_cache_key and rb2._episode_ends_cache is cache, "the restored cache is used"
    assert "_her" in sd, "deliberate: the given dict is not modified (TorchRL pops '_her')"
    rb3 = her(her_ratio=0.5, strategy="episode")
    rb3.load_state_dict({k: v for k, v in sd.items() if k != "_her"})  # a plain TDRB state: no cache restored
    assert len(rb3) == 7 and rb3._last_cache_key is None


def test_repr():
    rb = HERReplayBuffer(reward_fn, her_ratio=0.5, storage=LazyTensorStorage(10))
    text = repr(rb)
    assert text.startswith(
        "HERReplayBuffer(strategy='future', her_ratio=0.5, goal_key='desired_goal', achieved_goal_key='achieved_goal', "
        "reward_key=('next', 'reward'), storage="
    )
    assert text.endswith(")") and "LazyTensorStorage" in text
