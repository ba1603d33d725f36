"""HERReplayBuffer and trajectory queries, exercised the way TorchRL's tests and users exercise them.

One test per fact of ``torchrl_api_facts_wave3.md`` §1 (HER) and §3 (trajectory queries): TorchRL's import paths,
keywords, attribute names (including the private ``_last_cache_key`` / ``_episode_ends_cache`` that TorchRL's tests
read), error types and phrases, reprs and results. Where we differ on purpose (TorchRL's full-ring mapping, the
``"_her"`` entry left in the given state dict) the test pins both what TorchRL code relies on and our behaviour.
``query_replay_buffer`` is what ``ReplayBuffer.query`` delegates to; the ``rb.query`` tests skip until it is wired.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import warnings

import pytest
import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack

from torchrl.data import (
    HERReplayBuffer,
    HindsightStrategy,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
    Trajectory,
    TrajectoryPredicate,
    filter_trajectories,
    iter_trajectories,
    traj,
)
from torchrl.data.replay_buffers.query import query_replay_buffer
from torchrl.data.replay_buffers.utils import find_start_stop_traj
from torchrl.envs.transforms import Compose, Transform

GOAL, REWARD = -1.0, -5.0
needs_rb_query = pytest.mark.skipif(not hasattr(ReplayBuffer, "query"), reason="the lead wires ReplayBuffer.query")


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


# -- §3 Trajectory -----------------------------------------------------------------------------------------------------
def transitions(n=4) -> TensorDict:
    return TensorDict(
        {"observation": torch.arange(n, dtype=torch.float32).unsqueeze(-1), "state": torch.zeros(n, 2),
         "action": torch.ones(n, 1),
         "next": {"observation": torch.arange(1, n + 1, dtype=torch.float32).unsqueeze(-1),
                  "reward": torch.arange(n, dtype=torch.float32).unsqueeze(-1),
                  "done": torch.tensor([False] * (n - 1) + [True]).unsqueeze(-1)}},
        batch_size=[n],
    )  # fmt: skip


def test_trajectory_is_a_tensorclass_with_one_data_field():
    t = Trajectory(data=transitions())
    assert isinstance(t.data, TensorDictBase) and t.batch_size == torch.Size([4])
    assert hasattr(Trajectory, "__dataclass_fields__") and list(Trajectory.__dataclass_fields__) == ["data"]
    for bad in (TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3]), TensorDict(obs=torch.zeros(()), batch_size=[])):
        with pytest.raises(ValueError, match="single batch dimension"):
            Trajectory(bad)


def test_trajectory_length_and_total_reward():
    t = Trajectory(transitions(5))
    assert t.length == 5 and len(t) == 5 and isinstance(t.length, int)
    assert float(t.total_reward) == 10.0


def test_trajectory_get_root_first_then_next_for_string_keys_only():
    data = transitions()
    t = Trajectory(data)
    assert torch.equal(t.get("observation"), data["observation"])
    assert torch.equal(t.get("reward"), data["next", "reward"])
    assert t.get(("reward",)) is None and t.get("missing") is None and t.get("missing", 3) == 3
    data["reward"] = torch.full((4, 1), 9.0)
    assert (Trajectory(data).get("reward") == 9).all()
    assert list(t.keys()) == list(data.keys()) and ("next", "reward") in t.keys(include_nested=True)


def test_trajectory_attribute_fallbacks():
    data = transitions()
    t = Trajectory(data)
    assert torch.equal(t.observation, data["observation"]) and torch.equal(t.state, data["state"])
    assert torch.equal(t.action, data["action"]) and torch.equal(t.reward, data["next", "reward"])
    assert torch.equal(t.done, data["next", "done"])
    with pytest.raises(AttributeError, match="Trajectory has no entry 'x'"):
        _ = t.x
    data["_private"] = torch.zeros(4)
    with pytest.raises(AttributeError):
        _ = Trajectory(data)._private


def test_trajectory_indexing():
    data = transitions()
    t = Trajectory(data)
    assert torch.equal(t["observation"], data["observation"]) and torch.equal(t["next", "reward"], data["next", "reward"])
    for index in (slice(1, 3), 0, torch.tensor([0, 2])):
        sub = t[index]
        assert isinstance(sub, Trajectory)
    assert t[1:3].length == 2 and torch.equal(t[1:3].observation, data["observation"][1:3])


def test_clone_to_and_lazy_stack_keep_the_type():
    t = Trajectory(transitions(3))
    assert isinstance(t.clone(), Trajectory) and isinstance(t.to("cpu"), Trajectory)
    stacked = lazy_stack([t, Trajectory(transitions(5))])
    assert isinstance(stacked, Trajectory) and stacked.batch_size == torch.Size([2, -1])


def test_trajectory_repr():
    data = transitions(3)
    assert repr(Trajectory(data)) == f"Trajectory(length=3, keys={list(data.keys())})"


# -- §3 traj expressions ------------------------------------------------------------------------------------------------
def three() -> TensorDict:
    return TensorDict(
        {"episode": torch.tensor([0, 0, 1, 1, 1, 2]),
         "observation": torch.tensor([1.0, 5.0, 0.0, 3.0, 1.0, 9.0]).unsqueeze(-1),
         ("next", "reward"): torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, -1.0]).unsqueeze(-1),
         ("next", "done"): torch.tensor([0, 1, 0, 0, 1, 1], dtype=torch.bool).unsqueeze(-1)},
        batch_size=[6],
    )  # fmt: skip


def lengths(predicate, data=None):
    return [t.length for t in filter_trajectories(three() if data is None else data, predicate)]


def test_traj_required_keys():
    assert traj.length.required_keys() == frozenset()
    assert traj.total_reward.required_keys() == frozenset({"reward"})
    assert traj.observation.required_keys() == frozenset({"observation"})
    assert traj["next", "reward"].required_keys() == frozenset({("next", "reward")})
    assert traj[("obs",)].required_keys() == frozenset({"obs"}), "unravel_key"


def test_field_reductions():
    assert lengths(traj.reward.sum() == 2) == [3]
    mean = traj.reward.mean()
    t = Trajectory(three()[:2])
    assert (mean > 0.49)(t) and (mean < 0.51)(t)
    assert lengths(traj.observation.mean() > 1.5) == [2, 1]
    assert lengths(traj.observation.max() >= 5) == [2, 1] and lengths(traj.observation.min() < 1) == [3]
    assert lengths(traj.reward.first() == 1) == [2] and lengths(traj.reward.last() == 2) == [3]


def test_comparisons_give_predicates_and_elementwise_ones_reduce_with_any_all():
    for op in ("__gt__", "__ge__", "__lt__", "__le__", "__eq__", "__ne__"):
        assert isinstance(getattr(traj.length, op)(2), TrajectoryPredicate), op
    assert lengths(traj.length != 3) == [2, 1] and lengths(traj.length <= 2) == [2, 1]
    assert lengths((traj.reward > 0).any()) == [2, 3] and lengths((traj.reward >= 0).all()) == [2, 3]
    assert lengths(traj.done.any()) == [2, 3, 1]


def test_an_unreduced_elementwise_predicate_is_a_type_error():
    elementwise = traj.reward > 0
    with pytest.raises(TypeError, match=r"Call \.any\(\) or \.all\(\)"):
        filter_trajectories(three(), elementwise)
    with pytest.raises(TypeError, match=r"Call \.any\(\) or \.all\(\)"):
        elementwise(Trajectory(three()))
    with pytest.raises(TypeError, match=r"Call \.any\(\) or \.all\(\)"):
        query_replay_buffer(_query_rb(), elementwise)


def test_missing_key_at_evaluation():
    with pytest.raises(KeyError, match=r"not found in trajectory \(looked up root and \('next', \.\.\.\)\)"):
        filter_trajectories(three(), traj.velocity.max() > 0)


def test_expressions_are_unhashable():
    for expression in (traj.length, traj.reward, traj.reward.sum(), traj.reward > 0):
        with pytest.raises(TypeError):
            hash(expression)


def test_trajectory_predicate_signature_call_and_repr():
    params = inspect.signature(TrajectoryPredicate).parameters
    assert [(p.name, p.default) for p in params.values()] == [
        ("fn", inspect.Parameter.empty), ("description", "predicate"), ("keys", None)]  # fmt: skip
    pred = TrajectoryPredicate(lambda t: t.length > 2)
    t = Trajectory(transitions(3))
    assert pred(t) is True and repr(pred) == "TrajectoryPredicate(predicate)"
    assert repr(TrajectoryPredicate(lambda t: True, "always")) == "TrajectoryPredicate(always)"


def test_predicates_combine_and_short_circuit():
    calls = []

    def spy(t):
        calls.append(t.length)
        return True

    opaque = TrajectoryPredicate(spy, "spy")
    assert lengths((traj.length >= 2) & opaque) == [2, 3] and sorted(calls) == [2, 3]
    calls.clear()
    assert lengths((traj.length >= 2) | opaque) == [2, 3, 1] and calls == [1]
    calls.clear()
    assert lengths(~(traj.length == 3)) == [2, 1]
    t = Trajectory(transitions(3))
    assert ((traj.length > 5) & opaque)(t) is False and calls == [], "a & b: b not called when a fails"
    assert ((traj.length > 1) | opaque)(t) is True and calls == [], "a | b: b not called when a passes"


def test_required_keys_union_or_none_when_an_operand_is_opaque():
    a, b = traj.total_reward > 0, (traj["next", "observation"] > 0).any()
    assert (a & b).required_keys() == {"reward", ("next", "observation")} and (~a).required_keys() == {"reward"}
    opaque = TrajectoryPredicate(lambda t: True)
    assert opaque.required_keys() is None
    assert (a | opaque).required_keys() is None and (opaque & a).required_keys() is None


# -- §3 iter_trajectories / filter_trajectories -------------------------------------------------------------------------
def test_iter_trajectories_input_errors_and_empty():
    with pytest.raises(TypeError, match="expects a TensorDictBase"):
        list(iter_trajectories({"episode": torch.zeros(3)}))
    with pytest.raises(ValueError):
        list(iter_trajectories(TensorDict(episode=torch.zeros(2, 3), batch_size=[2, 3])))
    assert list(iter_trajectories(TensorDict(episode=torch.zeros(0), batch_size=[0]))) == []
    assert inspect.isgenerator(iter_trajectories(three()))


def test_iter_trajectories_signal_order_first_found_wins():
    data = TensorDict(obs=torch.arange(6), batch_size=[6])
    data["episode"] = torch.tensor([0, 0, 0, 1, 1, 2])
    data["traj_ids"] = torch.tensor([0, 1, 1, 1, 1, 1])
    data["collector", "traj_ids"] = torch.tensor([0, 0, 1, 1, 1, 1])
    data["next", "done"] = torch.ones(6, 1, dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # id-based splitting does not warn
        assert [len(t) for t in iter_trajectories(data, trajectory_key="episode")] == [3, 2, 1]
        assert [len(t) for t in iter_trajectories(data)] == [2, 4]
        del data["collector"]
        assert [len(t) for t in iter_trajectories(data)] == [1, 5]
        del data["traj_ids"]
        assert [len(t) for t in iter_trajectories(data)] == [3, 2, 1]
    with pytest.raises(KeyError, match="trajectory_key .* not found in data."):
        list(iter_trajectories(data, trajectory_key="missing"))


def test_end_flag_fallback_next_first_then_root_with_a_warning():
    data = TensorDict(obs=torch.arange(6), batch_size=[6])
    data["next", "done"] = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool).unsqueeze(-1)
    data["next", "truncated"] = torch.tensor([0, 0, 0, 0, 1, 0], dtype=torch.bool).unsqueeze(-1)
    data["done"] = torch.ones(6, 1, dtype=torch.bool)
    phrase = "No trajectory id entry was found; splitting on the end-of-episode flags"
    with pytest.warns(UserWarning, match=phrase):
        assert [len(t) for t in iter_trajectories(data)] == [3, 2, 1]
    root = TensorDict(obs=torch.arange(4), terminated=torch.tensor([0, 1, 0, 0], dtype=torch.bool), batch_size=[4])
    with pytest.warns(UserWarning, match=phrase):
        assert [len(t) for t in iter_trajectories(root)] == [2, 2]
    with pytest.raises(KeyError, match="Cannot split data into trajectories"):
        list(iter_trajectories(TensorDict(obs=torch.arange(3), batch_size=[3])))


def test_missing_trailing_done_closes_the_last_trajectory_views_of_the_data():
    done = torch.zeros(15, 1, dtype=torch.bool)
    done[[4, 7]] = True
    data = TensorDict({"obs": torch.arange(15), ("next", "done"): done}, batch_size=[15])
    with pytest.warns(UserWarning):
        parts = list(iter_trajectories(data))
    assert [len(p) for p in parts] == [5, 3, 7]
    assert torch.equal(parts[1]["obs"], data[5:8]["obs"])
    parts[2]["obs"][0] = -1
    assert data["obs"][8] == -1, "data[start:stop + 1] views"


def test_boundaries_agree_with_find_start_stop_traj_and_slice_sampler():
    ids = torch.tensor([0, 0, 1, 1, 1, 0, 0, 2, 3, 3])
    data = TensorDict(episode=ids, obs=torch.arange(10), batch_size=[10])
    start, stop, length = find_start_stop_traj(trajectory=ids, at_capacity=False)
    assert [len(t) for t in iter_trajectories(data)] == length.tolist() == [2, 3, 2, 1, 2]
    assert [int(t["obs"][0]) for t in iter_trajectories(data)] == start[:, 0].tolist()
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(10), data)
    index, _ = SliceSampler(slice_len=2, traj_key="episode", strict_length=True).sample(storage, 40)
    rows = index[0] if isinstance(index, tuple) else index
    for pair in rows.view(-1, 2).tolist():
        assert ids[pair[0]] == ids[pair[1]] and pair[1] == pair[0] + 1


def test_filter_trajectories_none_keeps_all_and_returns_trajectories():
    got = filter_trajectories(three())
    assert isinstance(got, list) and all(isinstance(t, Trajectory) for t in got) and [t.length for t in got] == [2, 3, 1]
    assert [t.length for t in filter_trajectories(three(), trajectory_key="episode")] == [2, 3, 1]
    assert [t.length for t in filter_trajectories(three(), lambda t: t.length == 1)] == [1]
    with pytest.raises(TypeError):
        filter_trajectories(three(), traj.observation == 1)


# -- §3 ReplayBuffer.query ----------------------------------------------------------------------------------------------
def _query_rb(transform=None) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), transform=transform)
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate((3, 4, 5))])
    rb.extend(TensorDict({"traj_ids": ids, "obs": torch.arange(12.0),
                          ("next", "reward"): torch.ones(12, 1)}, batch_size=[12]))  # fmt: skip
    return rb


@needs_rb_query
def test_replay_buffer_query_signature_and_result():
    params = inspect.signature(ReplayBuffer.query).parameters
    assert params["predicate"].default is None
    assert params["trajectory_key"].kind is inspect.Parameter.KEYWORD_ONLY and params["trajectory_key"].default is None
    rb = _query_rb()
    assert [t.length for t in rb.query()] == [3, 4, 5]
    assert [t.length for t in rb.query(traj.length > 3, trajectory_key="traj_ids")] == [4, 5]


def test_query_of_an_empty_or_delayed_init_buffer_is_an_empty_list():
    assert query_replay_buffer(TensorDictReplayBuffer(storage=LazyTensorStorage(5))) == []
    lazy = ReplayBuffer(storage=LazyTensorStorage(10), delayed_init=True)
    assert query_replay_buffer(lazy, traj.length > 0) == [] and lazy.initialized


def test_query_of_list_storages():
    rb = ReplayBuffer(storage=ListStorage(20))
    rb.extend(list(three().unbind(0)))
    got = query_replay_buffer(rb, traj.length >= 2)
    assert [t.length for t in got] == [2, 3] and isinstance(got[0], Trajectory)
    rb = ReplayBuffer(storage=ListStorage(5))
    rb.extend([torch.zeros(2), torch.ones(2)])
    with pytest.raises(TypeError, match="requires a tensordict-backed storage"):
        query_replay_buffer(rb)
    rb = ReplayBuffer(storage=ListStorage(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rb.add(three())
    with pytest.raises(TypeError, match=r"expects single-transition \(scalar\) items."):
        query_replay_buffer(rb)


def test_query_after_wrap_around_is_chronological():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict(traj_ids=torch.tensor([0] * 5 + [1] * 3), step=torch.arange(8), batch_size=[8]))
    rb.extend(TensorDict(traj_ids=torch.full((4,), 2), step=torch.arange(8, 12), batch_size=[4]))
    got = query_replay_buffer(rb)
    assert [t.length for t in got] == [3, 3, 4]
    assert [t["step"].tolist() for t in got] == [[2, 3, 4], [5, 6, 7], [8, 9, 10, 11]]


def test_query_trajectory_key_and_the_end_flag_warning():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    done = torch.tensor([0, 1, 0, 0, 1, 0], dtype=torch.bool).unsqueeze(-1)
    rb.extend(TensorDict({"obs": torch.arange(6), "run": torch.tensor([0, 0, 0, 1, 1, 1]), ("next", "done"): done},
                         batch_size=[6]))  # fmt: skip
    with pytest.warns(UserWarning, match="No trajectory id entry was found; splitting on the end-of-episode flags"):
        assert [t.length for t in query_replay_buffer(rb)] == [2, 3, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [t.length for t in query_replay_buffer(rb, traj.length > 0, trajectory_key="run")] == [3, 3]
    with pytest.raises(KeyError, match="trajectory_key .* not found in data."):
        query_replay_buffer(rb, traj.length > 0, trajectory_key="missing")


def test_query_of_an_ndim2_storage_groups_by_batch_coordinate():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
    ids = torch.tensor([[0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 3, 3]])
    rb.extend(TensorDict(traj_ids=ids, obs=torch.arange(12).view(2, 6), batch_size=[2, 6]))
    got = query_replay_buffer(rb)
    assert [t.length for t in got] == [3, 3, 4, 2]
    assert [t["obs"].tolist() for t in got] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9], [10, 11]]


class Doubler(Transform):
    """Doubles its in_keys (out_keys = in_keys) and counts its calls."""

    def __init__(self, in_keys):
        super().__init__(in_keys=in_keys)
        self.calls = 0

    def forward(self, td):
        self.calls += 1
        return super().forward(td)

    def _apply_transform(self, value):
        return value * 2


def test_query_predicates_see_transformed_values():
    plain, doubled = _query_rb(), _query_rb(Compose(Doubler([("next", "reward")])))
    assert [t.length for t in query_replay_buffer(plain, traj.total_reward >= 8)] == []
    got = query_replay_buffer(doubled, traj.total_reward >= 8)
    assert [t.length for t in got] == [4, 5] and (got[0].reward == 2).all()
    assert [t.length for t in query_replay_buffer(doubled, lambda t: float(t.total_reward) == 6.0)] == [3]
    as_lambda = _query_rb()
    as_lambda.append_transform(lambda td: td.set(("next", "reward"), td["next", "reward"] * 2))  # no out_keys
    assert [t.length for t in query_replay_buffer(as_lambda, traj.total_reward >= 8)] == [4, 5]


def test_an_opaque_predicate_runs_the_whole_chain_once():
    reward_t, obs_t = Doubler([("next", "reward")]), Doubler(["obs"])
    rb = _query_rb(Compose(reward_t, obs_t))
    got = query_replay_buffer(rb, lambda t: t.length >= 4)
    assert reward_t.calls == 1 and obs_t.calls == 1
    assert [t.length for t in got] == [4, 5] and torch.equal(got[0]["obs"], 2 * torch.arange(3.0, 7.0))


def test_a_traj_predicate_runs_only_the_transforms_writing_what_it_reads():
    obs_t, reward_t = Doubler(["obs"]), Doubler([("next", "reward")])
    rb = _query_rb(Compose(obs_t, reward_t))
    assert query_replay_buffer(rb, traj.total_reward > 100) == []
    assert reward_t.calls == 1 and obs_t.calls == 0
    got = query_replay_buffer(rb, traj.total_reward >= 10)  # matches: returned with every key, whole chain
    assert [t.length for t in got] == [5] and torch.equal(got[0]["obs"], 2 * torch.arange(7.0, 12.0))
    assert set(got[0].keys()) == set(rb.storage[:].keys()) >= {"traj_ids", "obs", "next"} and obs_t.calls == 1


def test_a_transform_without_out_keys_forces_it_and_everything_before_on_all_keys():
    seen = []

    def spy(td):
        seen.append(set(td.keys(include_nested=True, leaves_only=True)))
        return td

    reward_t, obs_t = Doubler([("next", "reward")]), Doubler(["obs"])
    rb = _query_rb(Compose(reward_t))
    rb.append_transform(spy)
    rb.append_transform(obs_t)
    assert query_replay_buffer(rb, traj.obs.max() > 1000) == []
    assert reward_t.calls == 1 and obs_t.calls == 1 and len(seen) == 1
    assert seen[0] == set(rb.storage[:].keys(include_nested=True, leaves_only=True)), "every entry"
