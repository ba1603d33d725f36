"""HERReplayBuffer (issue 26 item 1): goal sources, relabelled fraction, the write seam, workers, checkpoints, errors.

Every stored step carries a unique step number ``s`` (``achieved_goal = s``, ``("next", "achieved_goal") = s + 1``)
and its episode id, so the source of any relabelled goal is read back from the goal itself. Stored goals and
rewards are sentinels (``-1`` and ``-5``): an entry that kept its sentinel was not relabelled.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    HERReplayBuffer,
    HindsightStrategy,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.her import HER_1D_STORAGE, HER_MISSING_KEYS, HER_RATIO_RANGE

GOAL, REWARD = -1.0, -5.0


def reward_fn(td):
    """1 when the goal equals the goal reached after the step (module level: picklable for workers)."""
    return (td["next", "achieved_goal"] == td["desired_goal"]).float()


def episodes(lengths, *, first_step=0, first_episode=0, close_last=True) -> TensorDict:
    """Consecutive episodes of the given lengths, steps numbered from ``first_step``."""
    n = sum(lengths)
    step = torch.arange(first_step, first_step + n, dtype=torch.float32).unsqueeze(-1)
    episode = torch.cat([torch.full((k,), first_episode + i) for i, k in enumerate(lengths)])
    done = torch.zeros(n, 1, dtype=torch.bool)
    ends = torch.cumsum(torch.tensor(lengths), 0) - 1
    done[ends] = True
    if not close_last:
        done[-1] = False
    return TensorDict(
        {
            "achieved_goal": step,
            "desired_goal": torch.full((n, 1), GOAL),
            "episode": episode,
            "step": step.squeeze(-1).long(),
            "next": {
                "achieved_goal": step + 1,
                "desired_goal": torch.full((n, 1), GOAL),
                "reward": torch.full((n, 1), REWARD),
                "done": done,
            },
        },
        batch_size=[n],
    )


def make_rb(capacity=100, batch_size=32, seed=0, **kwargs):
    return make_buffer(cls=HERReplayBuffer, reward_fn=reward_fn, capacity=capacity, batch_size=batch_size, seed=seed,
                       **kwargs)  # fmt: skip


def stored_steps(rb) -> dict[int, tuple[int, int]]:
    """``{step number: (episode, row)}`` of what the storage holds now."""
    data = rb.storage[:]
    if isinstance(data, list):
        data = torch.stack(data)
    return {int(s): (int(e), r) for r, (s, e) in enumerate(zip(data["step"], data["episode"]))}


def check_sources(rb, batch, strategy):
    """Every relabelled goal comes from a stored step of the sampled step's episode, as ``strategy`` says."""
    steps = stored_steps(rb)
    by_episode: dict[int, list[int]] = {}
    for s, (e, _) in steps.items():
        by_episode.setdefault(e, []).append(s)
    goal = batch["desired_goal"].squeeze(-1)
    relabelled = goal != GOAL
    for g, s, e in zip(goal[relabelled].long().tolist(), batch["step"][relabelled].tolist(),
                       batch["episode"][relabelled].tolist()):  # fmt: skip
        assert g in steps, "the goal is the achieved goal of a stored step"
        if strategy == "random":
            continue
        assert steps[g][0] == e, f"goal from step {g} (episode {steps[g][0]}) for a step of episode {e}"
        if strategy == "future":
            assert g >= s
        if strategy == "final":
            assert g == max(by_episode[e])
    next_goal = batch["next", "desired_goal"].squeeze(-1)
    assert torch.equal(next_goal, goal), "('next', goal) is relabelled with the goal"
    reward = batch["next", "reward"].squeeze(-1)
    expected = (batch["next", "achieved_goal"].squeeze(-1) == goal).float()
    assert torch.equal(reward[relabelled], expected[relabelled]), "rewards recomputed by reward_fn"
    assert (reward[~relabelled] == REWARD).all(), "the other rewards are the stored ones"
    return int(relabelled.sum())


# -- goal sources --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
def test_goals_come_from_the_same_episode_and_future_goals_from_later_steps(strategy):
    rb = make_rb(strategy=strategy, her_ratio=0.5, batch_size=64)
    torch.manual_seed(0)
    lengths = torch.randint(1, 9, (25,)).tolist()
    rb.extend(episodes(lengths))
    assert rb.strategy is HindsightStrategy(strategy)
    for _ in range(20):
        batch = rb.sample()
        check_sources(rb, batch, strategy)
        assert (batch["desired_goal"][:32] != GOAL).all() and (batch["desired_goal"][32:] == GOAL).all()


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_goals_after_the_ring_wrapped_stay_in_their_episode(strategy):
    rb = make_rb(capacity=50, strategy=strategy, her_ratio=1.0, batch_size=64)
    gen = torch.Generator().manual_seed(3)
    step, episode = 0, 0
    for _ in range(12):  # chunks of episodes, the last one of each left open half of the time
        lengths = torch.randint(1, 12, (3,), generator=gen).tolist()
        rb.extend(episodes(lengths, first_step=step, first_episode=episode))
        step, episode = step + sum(lengths), episode + len(lengths)
        for _ in range(3):
            check_sources(rb, rb.sample(), strategy)


def test_no_goal_across_the_write_seam_nor_the_physical_end():
    # capacity 10: episode A (6 steps, closed), then B (7 steps, still open). Rows: 0-2 = B[4:7] (row 2 newest),
    # 3-5 = A[3:6], 6-9 = B[0:4]. B runs across the physical end (rows 6..9, 0..2); the seam is between rows 2 and 3.
    rb = make_rb(capacity=10, strategy="final", her_ratio=1.0, batch_size=200)
    rb.extend(episodes([6]))
    rb.extend(episodes([7], first_step=6, first_episode=1, close_last=False))
    batch = rb.sample()
    goal, episode = batch["desired_goal"].squeeze(-1), batch["episode"]
    assert set(goal[episode == 0].tolist()) == {5.0}, "A's final goal: its last step, not B's steps after the seam"
    assert set(goal[episode == 1].tolist()) == {12.0}, "B's final goal: the newest step, across the physical end"
    future = make_rb(capacity=10, strategy="future", her_ratio=1.0, batch_size=400)
    future.extend(episodes([6]))
    future.extend(episodes([7], first_step=6, first_episode=1, close_last=False))
    batch = future.sample()
    newest = batch["step"] == 12
    assert newest.any() and (batch["desired_goal"].squeeze(-1)[newest] == 12).all(), "nothing after the newest step"
    check_sources(future, batch, "future")


def test_a_full_storage_without_done_flags_is_one_episode_ending_at_the_newest_row():
    rb = make_rb(capacity=8, strategy="final", her_ratio=1.0, batch_size=50)
    rb.extend(episodes([13], close_last=False))  # steps 5..12 kept, newest (12) at row 4
    goal = rb.sample()["desired_goal"].squeeze(-1)
    assert set(goal.tolist()) == {12.0}


def test_terminated_flags_end_episodes_too():
    data = episodes([10], close_last=False)
    terminated = torch.zeros(10, 1, dtype=torch.bool)
    terminated[3] = True
    data["next", "terminated"] = terminated
    rb = make_rb(strategy="final", her_ratio=1.0, batch_size=100)
    rb.extend(data)
    batch = rb.sample()
    goal, step = batch["desired_goal"].squeeze(-1), batch["step"]
    assert (goal[step <= 3] == 3).all() and (goal[step > 3] == 9).all()
    assert rb.terminated_key == ("next", "terminated")


# -- relabelled fraction -------------------------------------------------------------------------------------
@pytest.mark.parametrize("her_ratio,batch_size", [(0.0, 16), (0.25, 16), (0.8, 10), (1.0, 16)])
def test_the_head_of_each_batch_is_relabelled_exactly_when_the_count_is_whole(her_ratio, batch_size):
    rb = make_rb(her_ratio=her_ratio, batch_size=batch_size, strategy="episode")
    rb.extend(episodes([5] * 10))
    n = round(her_ratio * batch_size)
    for _ in range(10):
        batch = rb.sample()
        relabelled = batch["desired_goal"].squeeze(-1) != GOAL
        assert relabelled[:n].all() and not relabelled[n:].any()
        assert (batch["next", "reward"][n:] == REWARD).all()


def test_the_relabelled_fraction_is_her_ratio_in_expectation_binomial():
    # B * her_ratio = 3.5: each batch relabels 3 or 4 (4 with probability 0.5), so the number of batches with 4
    # relabelled steps is Binomial(N, 0.5); TorchRL's floor (the default) relabels 3 every time (a fraction of 3/7).
    rb = make_rb(her_ratio=0.5, batch_size=7, strategy="episode", relabel_rounding="stochastic")
    rb.extend(episodes([5] * 10))
    n_batches, fours, total = 400, 0, 0
    for _ in range(n_batches):
        relabelled = (rb.sample()["desired_goal"].squeeze(-1) != GOAL).int()
        count = int(relabelled.sum())
        assert count in (3, 4) and relabelled[:count].all()
        fours += count == 4
        total += count
    mean, sd = n_batches * 0.5, math.sqrt(n_batches * 0.25)
    assert abs(fours - mean) < 4 * sd, (fours, mean, sd)
    assert abs(total / (7 * n_batches) - 0.5) < 4 * sd / (7 * n_batches) + 1e-9


def test_a_batch_of_one_is_relabelled_with_probability_her_ratio():
    rb = make_rb(her_ratio=0.3, batch_size=1, strategy="final", relabel_rounding="stochastic")
    rb.extend(episodes([4] * 5))
    hits = sum(int(rb.sample()["desired_goal"].item() != GOAL) for _ in range(500))
    assert abs(hits - 150) < 4 * math.sqrt(500 * 0.3 * 0.7)


@pytest.mark.parametrize("her_ratio,batch_size,expected", [(0.5, 7, 3), (0.8, 1, 0), (0.8, 32, 25)])
def test_the_default_rounding_relabels_torchrl_s_floor_every_batch(her_ratio, batch_size, expected):
    rb = make_rb(her_ratio=her_ratio, batch_size=batch_size, strategy="episode")
    rb.extend(episodes([5] * 10))
    for _ in range(20):
        relabelled = rb.sample()["desired_goal"].squeeze(-1) != GOAL
        assert relabelled[:expected].all() and not relabelled[expected:].any()


def test_relabel_rounding_is_validated():
    with pytest.raises(ValueError, match="relabel_rounding.*'floor'.*got 'round'"):
        make_rb(relabel_rounding="round")


# -- other behaviours ------------------------------------------------------------------------------------------
def test_nested_goal_keys_and_a_flat_reward_from_reward_fn():
    def flat_reward(td):
        return torch.ones(td.shape[0]) * 7

    data = episodes([4, 4])
    data["obs", "desired_goal"] = data.pop("desired_goal")
    data["obs", "achieved_goal"] = data.pop("achieved_goal")
    rb = HERReplayBuffer(flat_reward, goal_key=("obs", "desired_goal"), achieved_goal_key=("obs", "achieved_goal"),
                         her_ratio=1.0, storage=LazyTensorStorage(20), batch_size=8)  # fmt: skip
    rb.extend(data)
    batch = rb.sample()
    assert (batch["obs", "desired_goal"] != GOAL).all() and (batch["next", "reward"] == 7).all()
    assert (batch["next", "desired_goal"] == GOAL).all(), "('next', 'obs', 'desired_goal') is absent: untouched"


def test_reward_fn_sees_transformed_data_while_goals_come_from_the_storage():
    seen = []

    def spy(td):
        seen.append(td["achieved_goal"].clone())
        return torch.zeros(td.shape[0], 1)

    def add_thousand(td):
        td["achieved_goal"] = td["achieved_goal"] + 1000
        return td

    rb = HERReplayBuffer(spy, her_ratio=1.0, storage=LazyTensorStorage(20), batch_size=8, transform=add_thousand,
                         strategy="final")  # fmt: skip
    rb.extend(episodes([10]))
    batch = rb.sample()
    assert (seen[0] >= 1000).all() and (batch["desired_goal"] == 9).all()


def test_works_with_a_slice_sampler_list_and_memmap_storages(tmp_path):
    for storage in (ListStorage(40), LazyMemmapStorage(40, scratch_dir=tmp_path / "mm")):
        rb = HERReplayBuffer(reward_fn, her_ratio=1.0, storage=storage, batch_size=20, strategy="future")
        rb.extend(episodes([5] * 12))  # wraps: 60 steps in 40 rows
        check_sources(rb, rb.sample(), "future")
    rb = HERReplayBuffer(reward_fn, her_ratio=0.5, storage=LazyTensorStorage(40), batch_size=20,
                         sampler=SliceSampler(slice_len=5, end_key=("next", "done")))  # fmt: skip
    rb.extend(episodes([5] * 8))
    check_sources(rb, rb.sample(), "future")


def test_strategy_repr_and_public_attributes():
    rb = HERReplayBuffer(reward_fn, strategy=HindsightStrategy.EPISODE, her_ratio=0.25, end_key="done")
    assert rb.strategy is HindsightStrategy.EPISODE and rb.strategy == "episode" and rb.her_ratio == 0.25
    assert rb.terminated_key == "terminated" and rb.reward_key == ("next", "reward")
    assert repr(rb).startswith("HERReplayBuffer(strategy='episode', her_ratio=0.25, goal_key='desired_goal'")
    assert str(HindsightStrategy.FUTURE) == "future" and f"{HindsightStrategy.FINAL}" == "final"


def test_the_boundary_cache_follows_extend_add_and_empty():
    rb = make_rb(strategy="final", her_ratio=1.0)
    rb.extend(episodes([4]))
    rb.sample()
    key = rb.state_dict()["_her"]["last_cache_key"]
    rb.extend(episodes([3], first_step=4, first_episode=1))
    rb.sample()
    after_extend = rb.state_dict()["_her"]["last_cache_key"]
    assert after_extend != key
    rb.add(episodes([1], first_step=7, first_episode=2)[0])
    batch = rb.sample()
    assert rb.state_dict()["_her"]["last_cache_key"] != after_extend
    assert set(batch["desired_goal"][batch["episode"] == 2].squeeze(-1).tolist()) <= {7.0}
    rb.empty()
    assert rb.state_dict()["_her"]["episode_ends_cache"] is None


def test_a_rewrite_that_keeps_the_cache_key_still_rebuilds_the_cache_and_state_dict_carries_the_new_one():
    rb = make_rb(capacity=8, batch_size=8, strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    rb.extend(episodes([8]))
    assert set(rb.sample()["desired_goal"].squeeze(-1).tolist()) == {7.0}
    key = rb._last_cache_key
    rb.extend(episodes([3, 5], first_step=8, first_episode=1))  # the ring written over exactly once
    batch = rb.sample()
    assert rb._last_cache_key == key, "TorchRL's key (len, last row, full) is unchanged"
    assert torch.equal(batch["desired_goal"].squeeze(-1), torch.where(batch["index"] <= 2, 10.0, 15.0))
    rb.extend(episodes([6, 2], first_step=16, first_episode=3))  # again, and no sample before state_dict
    state = rb.state_dict()
    assert state["_her"]["episode_ends_cache"].tolist() == [5, 7]
    other = make_rb(capacity=8, batch_size=8, strategy="final", her_ratio=1.0, sampler=SamplerWithoutReplacement())
    other.load_state_dict(state)
    batch = other.sample()
    assert torch.equal(batch["desired_goal"].squeeze(-1), torch.where(batch["index"] <= 5, 21.0, 23.0))
    assert other._last_cache_key == rb._last_cache_key


# -- state and checkpoints -------------------------------------------------------------------------------------
def test_state_dict_carries_her_and_restores_the_cache_without_changing_the_given_dict():
    rb = make_rb(her_ratio=0.5, strategy="final")
    rb.extend(episodes([3, 4]))
    rb.sample()
    state = rb.state_dict()
    her = state["_her"]
    assert her["strategy"] == "final" and her["her_ratio"] == 0.5 and her["goal_key"] == "desired_goal"
    assert her["achieved_goal_key"] == "achieved_goal" and her["reward_key"] == ("next", "reward")
    assert her["episode_ends_cache"].tolist() == [2, 6]
    other = make_rb(her_ratio=0.5, strategy="final", seed=1)
    other.load_state_dict(state)
    assert "_her" in state
    assert other.state_dict()["_her"]["last_cache_key"] == her["last_cache_key"]
    assert torch.equal(other.sample()["desired_goal"], rb.sample()["desired_goal"])


def test_dumps_loads_round_trip_restores_config_and_the_random_stream(tmp_path):
    rb = make_rb(her_ratio=0.75, strategy="episode", capacity=30)
    rb.extend(episodes([5] * 8))  # wrapped
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    files = [f for _, _, names in os.walk(tmp_path / "ckpt") for f in names]
    assert not any(f.endswith((".pkl", ".pickle", ".pt")) for f in files)
    fresh = HERReplayBuffer(reward_fn, storage=LazyTensorStorage(30), batch_size=32)  # default ratio/strategy
    fresh.loads(tmp_path / "ckpt")
    assert fresh.her_ratio == 0.75 and fresh.strategy is HindsightStrategy.EPISODE
    assert torch.equal(fresh.storage[:]["step"], rb.storage[:]["step"])
    for _ in range(3):
        a, b = rb.sample(), fresh.sample()
        assert (a == b).all()
        check_sources(fresh, b, "episode")


def test_loads_refuses_other_keys_and_a_plain_buffer_leaving_the_buffer_unchanged(tmp_path):
    rb = make_rb(capacity=20)
    rb.extend(episodes([5, 5]))
    rb.dumps(tmp_path / "ckpt")
    other = HERReplayBuffer(reward_fn, goal_key="goal", storage=LazyTensorStorage(20), batch_size=4)
    with pytest.raises(ValueError, match="goal_key"):
        other.loads(tmp_path / "ckpt")
    assert len(other) == 0
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    with pytest.raises(ValueError, match="class"):
        plain.loads(tmp_path / "ckpt")


# -- DataLoader workers ------------------------------------------------------------------------------------------
def _worker_batches(rb, seed):
    loader = rb.as_dataset(num_batches=6).loader(
        num_workers=2, multiprocessing_context="fork", generator=torch.Generator().manual_seed(seed), timeout=60
    )
    return [batch.clone() for batch in loader]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_workers_relabel_reproducibly_for_a_seed():
    rb = make_rb(capacity=64, batch_size=16, her_ratio=0.5, strategy="future")
    rb.extend(episodes([6] * 10))
    first, again, other = _worker_batches(rb, 0), _worker_batches(rb, 0), _worker_batches(rb, 1)
    assert len(first) == 6
    for a, b in zip(first, again):
        assert (a == b).all()
    assert any(not (a["desired_goal"] == b["desired_goal"]).all() for a, b in zip(first, other))
    assert not (first[0]["desired_goal"] == first[1]["desired_goal"]).all(), "the two workers draw apart"
    for batch in first:
        assert check_sources(rb, batch, "future") == 8


# -- errors (TorchRL's phrases) ----------------------------------------------------------------------------------
def _raises(entry):
    return pytest.raises(entry.type, match=entry.phrase)


@pytest.mark.parametrize("her_ratio", [-0.1, 1.5, True, "0.5", float("nan")])
def test_her_ratio_outside_zero_one(her_ratio):
    with _raises(HER_RATIO_RANGE):
        HERReplayBuffer(reward_fn, her_ratio=her_ratio)


def test_missing_goal_keys_named_at_the_first_sample():
    data = episodes([4])
    del data["desired_goal"]
    rb = make_rb()
    rb.extend(data)
    with _raises(HER_MISSING_KEYS) as info:
        rb.sample()
    assert "storage: goal_key='desired_goal'." in str(info.value)


def test_storage_with_two_dims_is_refused_when_sampling():
    rb = HERReplayBuffer(reward_fn, storage=LazyTensorStorage(20, ndim=2), batch_size=4)
    rb.extend(episodes([5, 5]).reshape(2, 5))  # built and written as a plain TensorDictReplayBuffer
    assert len(rb) == 10
    with _raises(HER_1D_STORAGE):
        rb.sample()


def test_bad_strategy_reward_fn_and_missing_end_keys():
    with pytest.raises(ValueError, match="'best' is not a valid HindsightStrategy.*future"):
        HERReplayBuffer(reward_fn, strategy="best")
    with pytest.raises(TypeError, match="reward_fn"):
        HERReplayBuffer("not callable")
    data = episodes([4])
    del data["next", "done"]
    rb = make_rb()
    rb.extend(data)
    with pytest.raises(KeyError, match="terminated"):
        rb.sample()
    bad = HERReplayBuffer(lambda td: torch.zeros(3), storage=LazyTensorStorage(10), batch_size=4, her_ratio=1.0)
    bad.extend(episodes([4]))
    with pytest.raises(ValueError, match="reward_fn"):
        bad.sample()
