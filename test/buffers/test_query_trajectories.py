"""Trajectory queries (issue 26 item 3): Trajectory, traj expressions, iter/filter_trajectories, ReplayBuffer.query.

The reference is brute force: every written step carries a global step number, the test keeps the list of
written steps in Python, and splits what the ring still holds with a loop over steps. ``query_replay_buffer`` is
what ``ReplayBuffer.query`` calls.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from helpers.factories import Doubler, make_buffer
from tensordict import TensorDict, lazy_stack

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    Trajectory,
    TrajectoryPredicate,
    filter_trajectories,
    iter_trajectories,
    traj,
)
from torchrl.data.replay_buffers.query import (
    QUERY_BATCH_DIMS,
    QUERY_LIST_STORAGE_BATCHED,
    QUERY_LIST_STORAGE_TYPE,
    QUERY_NOT_TENSORDICT,
    QUERY_UNREDUCED,
    query_replay_buffer,
)
from torchrl.data.replay_buffers.trajectories.split import QUERY_END_FLAGS, QUERY_NO_SIGNAL


def _raises(entry):
    if issubclass(entry.type, Warning):
        return pytest.warns(entry.type, match=entry.phrase)
    return pytest.raises(entry.type, match=entry.phrase)


def _steps(traj_lengths, gen, *, first_step=0, first_id=0, close_last=True) -> TensorDict:
    n = sum(traj_lengths)
    ids = torch.cat([torch.full((k,), first_id + i) for i, k in enumerate(traj_lengths)])
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[torch.cumsum(torch.tensor(traj_lengths), 0) - 1] = True
    if not close_last:
        done[-1] = False
    return TensorDict(
        {
            "step": torch.arange(first_step, first_step + n),
            "traj_ids": ids,
            "obs": torch.randn(n, 2, generator=gen),
            ("next", "reward"): torch.randint(-2, 3, (n, 1), generator=gen).float(),
            ("next", "done"): done,
        },
        batch_size=[n],
    )


def _reference(steps: list[dict], by: str) -> list[list[dict]]:
    """Splits time-ordered steps with a Python loop: at an id change (``by="ids"``) or after a done flag."""
    out: list[list[dict]] = []
    for i, s in enumerate(steps):
        if not out or (by == "ids" and s["traj_ids"] != steps[i - 1]["traj_ids"]) or (
            by == "done" and steps[i - 1]["done"]
        ):
            out.append([])
        out[-1].append(s)
    return out


def _fill(rb, gen, capacity, *, chunks=8, open_ends=True):
    """Writes random trajectories in random chunks; returns the Python log of every step written."""
    log, step, tid = [], 0, 0
    for _ in range(chunks):
        lengths = torch.randint(1, 7, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen).tolist()
        close = not open_ends or bool(torch.rand(1, generator=gen) < 0.5)
        data = _steps(lengths, gen, first_step=step, first_id=tid, close_last=close)
        if not close:  # the open trajectory continues in the next chunk with the same id
            tid -= 1
        rb.extend(data)
        for i in range(data.shape[0]):
            log.append({"step": int(data["step"][i]), "traj_ids": int(data["traj_ids"][i]),
                        "done": bool(data["next", "done"][i]), "reward": float(data["next", "reward"][i]),
                        "obs0": float(data["obs"][i, 0])})  # fmt: skip
        step, tid = step + data.shape[0], tid + len(lengths)
    return log[-capacity:]


PREDICATES = [
    (None, lambda t: True),
    (traj.length > 3, lambda t: len(t) > 3),
    (traj.total_reward >= 1, lambda t: sum(s["reward"] for s in t) >= 1),
    ((traj.reward > 1).any(), lambda t: any(s["reward"] > 1 for s in t)),
    ((traj.reward >= 0).all() & (traj.length >= 2), lambda t: all(s["reward"] >= 0 for s in t) and len(t) >= 2),
    (~(traj.length == 1) | (traj.obs.max() > 1.5), lambda t: len(t) != 1 or max(s["obs0"] for s in t) > 1.5),
    (traj["next", "reward"].last() < traj["next", "reward"].first(), lambda t: t[-1]["reward"] < t[0]["reward"]),
    (traj.reward.mean() * 2 > 1, lambda t: 2 * sum(s["reward"] for s in t) / len(t) > 1),
    (lambda t: t.length % 2 == 0, lambda t: len(t) % 2 == 0),
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("by", ["ids", "done"])
def test_query_matches_brute_force_on_wrapped_buffers(seed, by):
    gen = torch.Generator().manual_seed(seed)
    capacity = int(torch.randint(8, 30, (1,), generator=gen))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))
    if by == "done":  # split on the done flags: the ids are dropped on the write path
        rb.append_transform(lambda td: td.exclude("traj_ids"), invert=True)
    log = _fill(rb, gen, capacity)
    # the oldest stored step may be the middle of a trajectory (head-truncated); with done flags only,
    # a trajectory is cut where the ring's oldest step starts
    expected = _reference(log, by)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for predicate, reference in PREDICATES:
            got = query_replay_buffer(rb, predicate)
            want = [t for t in expected if reference(t)]
            assert [t.data["step"].tolist() for t in got] == [[s["step"] for s in t] for t in want], predicate
            assert all(isinstance(t, Trajectory) and "obs" in t.keys() for t in got)


def test_a_trajectory_written_across_the_physical_end_comes_back_whole_and_in_order():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    gen = torch.Generator().manual_seed(0)
    rb.extend(_steps([5, 3], gen))
    rb.extend(_steps([4], gen, first_step=8, first_id=2))
    got = query_replay_buffer(rb)
    assert [t.length for t in got] == [3, 3, 4]
    assert got[-1].data["step"].tolist() == [8, 9, 10, 11]


def test_ndim2_storage_trajectories_are_grouped_by_env_column():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
    ids = torch.tensor([[0, 0, 1, 1], [5, 5, 5, 6]])
    rb.extend(TensorDict(step=torch.arange(8).reshape(2, 4), traj_ids=ids, batch_size=[2, 4]))
    assert [t.data["step"].tolist() for t in query_replay_buffer(rb)] == [[0, 1], [2, 3], [4, 5, 6], [7]]
    more = torch.tensor([[1, 2, 2], [6, 6, 7]])
    rb.extend(TensorDict(step=100 + torch.arange(6).reshape(2, 3), traj_ids=more, batch_size=[2, 3]))
    # 6 rows x 2 envs, wrapped: each column oldest first, a trajectory across the wrap kept whole
    got = query_replay_buffer(rb)
    assert [t.data["step"].tolist() for t in got] == [[1], [2, 3, 100], [101, 102], [5, 6], [7, 103, 104], [105]]
    assert [t.data["step"].tolist() for t in query_replay_buffer(rb, traj.length == 3)] == [[2, 3, 100], [7, 103, 104]]


@pytest.mark.parametrize("seed", range(3))
def test_ndim2_matches_brute_force_per_column(seed):
    gen = torch.Generator().manual_seed(seed)
    n_envs, rows = 3, int(torch.randint(4, 9, (1,), generator=gen))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(rows * n_envs, ndim=2))
    written = []
    for chunk in range(5):
        t = int(torch.randint(1, 5, (1,), generator=gen))
        ids = torch.randint(0, 2, (n_envs, t), generator=gen).cumsum(-1) + 100 * chunk
        step = torch.arange(t).expand(n_envs, t) + 10 * len(written) + 1000 * torch.arange(n_envs).unsqueeze(-1)
        reward = torch.randn(n_envs, t, 1, generator=gen)
        rb.extend(TensorDict({"step": step, "traj_ids": ids, ("next", "reward"): reward}, batch_size=[n_envs, t]))
        written.append((step, ids, reward))
    steps = torch.cat([s for s, _, _ in written], 1)[:, -rows:]
    ids = torch.cat([i for _, i, _ in written], 1)[:, -rows:]
    reward = torch.cat([r for _, _, r in written], 1)[:, -rows:]
    expected = []
    for e in range(n_envs):
        log = [{"step": int(steps[e, j]), "traj_ids": int(ids[e, j]), "reward": float(reward[e, j])}
               for j in range(steps.shape[1])]  # fmt: skip
        expected += _reference(log, "ids")
    got = query_replay_buffer(rb, traj.total_reward > 0)
    want = [t for t in expected if sum(s["reward"] for s in t) > 0]
    assert [t.data["step"].tolist() for t in got] == [[s["step"] for s in t] for t in want]


# -- transforms --------------------------------------------------------------------------------------------------


def _buffer_with(*transforms):
    rb = make_buffer(cls=TensorDictReplayBuffer, capacity=50)
    for t in transforms:
        rb.append_transform(t)
    rb.extend(_steps([3, 4, 5], torch.Generator().manual_seed(0)))
    return rb


def test_predicates_see_transformed_values_and_matches_carry_every_entry_transformed():
    plain = _buffer_with()
    doubled = _buffer_with(Doubler([("next", "reward")]))
    totals = sorted(float(t.total_reward) for t in query_replay_buffer(plain))
    threshold = totals[1]
    got = query_replay_buffer(doubled, traj.total_reward > 2 * threshold)
    want = query_replay_buffer(plain, traj.total_reward > threshold)
    assert [t.length for t in got] == [t.length for t in want]
    for g, w in zip(got, want):
        assert torch.equal(g.reward, 2 * w.reward) and torch.equal(g.obs, w.obs)


def test_a_traj_predicate_runs_only_the_transforms_that_write_what_it_reads():
    reward_t, obs_t = Doubler([("next", "reward")]), Doubler(["obs"])
    rb = _buffer_with(reward_t, obs_t)
    got = query_replay_buffer(rb, traj.length == 4)
    assert reward_t.calls == 1 and obs_t.calls == 1, "predicate: neither; the match: the whole chain once"
    query_replay_buffer(rb, traj.length == 100)
    assert reward_t.calls == 1 and obs_t.calls == 1, "nothing matched: no transform ran"
    query_replay_buffer(rb, traj.total_reward > -1000)
    assert reward_t.calls == 3 and obs_t.calls == 2
    assert [t.length for t in got] == [4] and set(got[0].keys()) >= {"obs", "next", "step"}


def test_an_opaque_predicate_or_a_transform_without_out_keys_runs_the_chain_once():
    seen = []

    def spy(td):
        seen.append(td.batch_size)
        return td

    reward_t = Doubler([("next", "reward")])
    rb = _buffer_with(spy, reward_t)
    got = query_replay_buffer(rb, lambda t: t.length >= 4)
    assert len(seen) == 1 and reward_t.calls == 1 and seen[0] == torch.Size([12])
    assert [t.length for t in got] == [4, 5]
    query_replay_buffer(rb, traj.reward.sum() > -100)
    assert len(seen) == 2 and reward_t.calls == 2


def test_traj_predicate_is_faster_than_a_loop_over_trajectories():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20_000))
    rb.extend(_steps([4] * 5000, torch.Generator().manual_seed(0)))
    start = time.perf_counter()
    assert query_replay_buffer(rb, traj.total_reward > 1000) == []
    vectorized = time.perf_counter() - start
    start = time.perf_counter()
    assert query_replay_buffer(rb, lambda t: bool(t.total_reward > 1000)) == []
    looped = time.perf_counter() - start
    assert vectorized * 3 < looped, (vectorized, looped)


# -- buffers of every kind -----------------------------------------------------------------------------------------
def test_empty_list_storage_and_delayed_init_buffers():
    assert query_replay_buffer(TensorDictReplayBuffer(storage=LazyTensorStorage(5))) == []
    rb = ReplayBuffer(storage=ListStorage(20))
    rb.extend(list(_steps([2, 3], torch.Generator().manual_seed(0)).unbind(0)))
    assert [t.data["step"].tolist() for t in query_replay_buffer(rb, traj.length > 2)] == [[2, 3, 4]]
    rb.extend(list(_steps([5, 2, 3, 2, 6], torch.Generator().manual_seed(1), first_step=5, first_id=2).unbind(0)))
    assert [t.length for t in query_replay_buffer(rb)] == [2, 5, 2, 3, 2, 6]  # wrapped: 23 steps in 20
    lazy = ReplayBuffer(storage=LazyTensorStorage(10), delayed_init=True)
    assert not lazy.initialized and query_replay_buffer(lazy) == [] and lazy.initialized


def test_list_storage_of_non_tensordicts_or_batched_items():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, 2, 3])
    with _raises(QUERY_LIST_STORAGE_TYPE):
        query_replay_buffer(rb)
    rb = ReplayBuffer(storage=ListStorage(10))
    with pytest.warns(UserWarning, match="add"):  # a whole rollout stored as one item
        rb.add(_steps([3], torch.Generator()))
    with _raises(QUERY_LIST_STORAGE_BATCHED):
        query_replay_buffer(rb)


@pytest.mark.skipif(not hasattr(ReplayBuffer, "query"), reason="lead wires ReplayBuffer.query")
def test_replay_buffer_query_method():
    rb = _buffer_with()
    got = rb.query(traj.length >= 4, trajectory_key="traj_ids")
    assert [t.length for t in got] == [4, 5]
    assert [t.length for t in rb.query()] == [3, 4, 5]


# -- iter_trajectories / filter_trajectories -----------------------------------------------------------------------
def test_iter_trajectories_signals_in_order():
    base = TensorDict(obs=torch.arange(6), batch_size=[6])
    data = base.clone()
    data["episode"] = torch.tensor([0, 0, 0, 1, 1, 2])
    data["traj_ids"] = torch.tensor([0, 1, 1, 1, 1, 1])
    data["collector", "traj_ids"] = torch.tensor([0, 0, 1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # id-based splitting does not warn
        assert [t.shape[0] for t in iter_trajectories(data)] == [2, 4]
        del data["collector"]
        assert [t.shape[0] for t in iter_trajectories(data)] == [1, 5]
        assert [t.shape[0] for t in iter_trajectories(data, ("episode",))] == [3, 2, 1]
    with pytest.raises(KeyError, match="not found in data"):
        list(iter_trajectories(data, "missing"))
    flags = base.clone()
    flags["next", "done"] = torch.tensor([0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], dtype=torch.bool)[:6]
    flags["next", "truncated"] = torch.tensor([0, 1, 0, 0, 0, 0], dtype=torch.bool)
    flags["done"] = torch.ones(6, dtype=torch.bool)  # root flags are only a fallback
    with _raises(QUERY_END_FLAGS):
        lengths = [t.shape[0] for t in iter_trajectories(flags)]
    assert lengths == [2, 3, 1]
    root = base.clone()
    root["terminated"] = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool).unsqueeze(-1)
    with _raises(QUERY_END_FLAGS):
        assert [t.shape[0] for t in iter_trajectories(root)] == [3, 3]


def test_missing_trailing_done_closes_the_last_trajectory_and_views_share_memory():
    done = torch.zeros(15, 1, dtype=torch.bool)
    done[[4, 7]] = True
    data = TensorDict({"obs": torch.arange(15), ("next", "done"): done}, batch_size=[15])
    with pytest.warns(UserWarning):
        parts = list(iter_trajectories(data))
    assert [p.shape[0] for p in parts] == [5, 3, 7]
    parts[1]["obs"][0] = -1
    assert data["obs"][5] == -1
    assert list(iter_trajectories(TensorDict(obs=torch.zeros(0), batch_size=[0]))) == []


def test_iter_and_filter_errors():
    with _raises(QUERY_NOT_TENSORDICT):
        list(iter_trajectories({"obs": torch.zeros(3)}))
    with _raises(QUERY_NOT_TENSORDICT):
        filter_trajectories(torch.zeros(3))
    with _raises(QUERY_BATCH_DIMS):
        list(iter_trajectories(TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3])))
    with _raises(QUERY_NO_SIGNAL):
        list(iter_trajectories(TensorDict(obs=torch.zeros(3), batch_size=[3])))
    data = TensorDict(episode=torch.tensor([0, 0, 1]), batch_size=[3])
    with _raises(QUERY_UNREDUCED):
        filter_trajectories(data, traj.episode > 0)
    with _raises(QUERY_UNREDUCED):
        filter_trajectories(data, traj.episode)
    with pytest.raises(TypeError, match="predicate"):
        filter_trajectories(data, 3)
    with pytest.raises(KeyError, match="not found in trajectory"):
        filter_trajectories(data, traj.reward.sum() > 0)


def test_filter_without_predicate_keeps_all():
    data = TensorDict(episode=torch.tensor([0, 0, 1, 2, 2, 2]), batch_size=[6])
    assert [t.length for t in filter_trajectories(data)] == [2, 1, 3]
    assert filter_trajectories(TensorDict(episode=torch.zeros(0), batch_size=[0])) == []


# -- traj expressions and predicates ---------------------------------------------------------------------------------
def _three() -> TensorDict:
    return TensorDict(
        {
            "episode": torch.tensor([0, 0, 1, 1, 1, 2]),
            "obs": torch.tensor([[1.0, 5.0], [2.0, 2.0], [0.0, 0.0], [3.0, 1.0], [1.0, 1.0], [9.0, 9.0]]),
            ("next", "reward"): torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, -1.0]).unsqueeze(-1),
            ("next", "done"): torch.tensor([0, 1, 0, 0, 1, 1], dtype=torch.bool).unsqueeze(-1),
        },
        batch_size=[6],
    )


@pytest.mark.parametrize(
    "predicate,lengths",
    [
        (traj.length == 3, [3]),
        (traj.total_reward > 0.5, [2, 3]),
        (traj.reward.sum() == 2, [3]),
        (traj.reward.mean() > 0.4, [2, 3]),
        (traj.obs.max() >= 5, [2, 1]),
        (traj.obs.min() < 1, [3]),
        (traj.reward.first() == 1, [2]),
        (traj.reward.last() < 0, [1]),
        (traj.done.any(), [2, 3, 1]),
        (traj["next", "done"].all(), [1]),
        ((traj.obs > 2).any(), [2, 3, 1]),
        ((traj.obs >= 1).all(), [2, 1]),
        ((traj.reward > traj.reward.mean()).any(), [2, 3]),
        (((traj.reward > 0) | (traj.obs == 0)).any(), [2, 3]),
        ((traj.length > 1) & ~(traj.total_reward > 1.5), [2]),
        ((traj.length + 1) * 2 == 8, [3]),
        (1 - traj.length < -1, [3]),
        (traj.total_reward / traj.length > 0.6, [3]),
    ],
)
def test_traj_expressions(predicate, lengths):
    data = _three()
    got = filter_trajectories(data, predicate)
    assert [t.length for t in got] == lengths
    trajectories = list(map(Trajectory, iter_trajectories(data)))
    assert [t.length for t in trajectories if predicate(t)] == lengths, "one trajectory at a time agrees"


def test_required_keys_descriptions_and_short_circuit():
    assert traj.length.required_keys() == frozenset()
    assert (traj.length > 1).required_keys() == frozenset()
    assert (traj.total_reward > 0).required_keys() == {"reward"}
    assert ((traj["next", "obs"] > 0).any() & (traj.done.any())).required_keys() == {("next", "obs"), "done"}
    calls = []
    opaque = TrajectoryPredicate(lambda t: calls.append(t.length) or True, "spy")
    assert opaque.required_keys() is None and ((traj.length > 0) & opaque).required_keys() is None
    declared = TrajectoryPredicate(lambda t: True, "declared", keys=["obs"])
    assert (declared | (traj.total_reward > 0)).required_keys() == {"obs", "reward"}
    got = filter_trajectories(_three(), (traj.length >= 2) & opaque)
    assert [t.length for t in got] == [2, 3] and sorted(calls) == [2, 3], "the opaque operand skips length 1"
    calls.clear()
    filter_trajectories(_three(), (traj.length >= 2) | opaque)
    assert calls == [1]
    assert repr(opaque) == "TrajectoryPredicate(spy)" and repr(traj.length > 1) == "TrajectoryPredicate(traj.length > 1)"
    for expression in (traj.length, traj.reward, traj.reward > 0):
        with pytest.raises(TypeError):
            hash(expression)
    assert len({traj.length > 0, opaque}) == 2, "predicates (no __eq__ of their own) hash by identity"
    with _raises(QUERY_UNREDUCED):
        (traj.reward > 0)(Trajectory(_three()))
    with _raises(QUERY_UNREDUCED):
        bool(traj.reward > 0)
    with _raises(QUERY_UNREDUCED):
        (traj.length > 0) & (traj.reward > 0)
    with pytest.raises(TypeError, match="fn"):
        TrajectoryPredicate(3)
    with pytest.raises(ValueError, match="one element per step"):
        filter_trajectories(_three(), traj.obs.first() > 0)


# -- Trajectory --------------------------------------------------------------------------------------------------
def test_trajectory_api():
    data = _three()[:3]
    data["reward_root"] = torch.zeros(3)
    t = Trajectory(data)
    assert t.length == 3 and len(t) == 3 and float(t.total_reward) == 1.0
    assert torch.equal(t.reward, data["next", "reward"]) and torch.equal(t.obs, data["obs"])
    assert t.get("reward") is not None and t.get("missing", 7) == 7 and t.get(("next", "missing")) is None
    data["reward"] = torch.full((3, 1), 4.0)
    assert (Trajectory(data).reward == 4).all(), "a root entry wins"
    with pytest.raises(AttributeError, match="Trajectory has no entry 'foo'"):
        _ = t.foo
    with pytest.raises(AttributeError):
        _ = t._hidden
    assert torch.equal(t["next", "done"], data["next", "done"]) and torch.equal(t["obs"], data["obs"])
    sub = t[1:3]
    assert isinstance(sub, Trajectory) and sub.length == 2 and isinstance(t[0], Trajectory)
    assert isinstance(t.clone(), Trajectory) and isinstance(t.to("cpu"), Trajectory)
    stacked = lazy_stack([t, t[:2]])
    assert isinstance(stacked, Trajectory) and stacked.batch_size == torch.Size([2, -1])
    assert repr(t).startswith("Trajectory(length=3, keys=[") and "obs" in repr(t)
    assert "obs" in t.keys()
    with _raises(QUERY_BATCH_DIMS):
        Trajectory(TensorDict(obs=torch.zeros(2, 3), batch_size=[2, 3]))
    with pytest.raises(KeyError, match="reward"):
        _ = Trajectory(TensorDict(obs=torch.zeros(3), batch_size=[3])).total_reward
