"""Trajectory queries, exercised the way TorchRL's tests and users exercise them.

One test per fact of ``torchrl_api_facts_wave3.md`` §3 (trajectory queries): ``Trajectory``, ``traj`` expressions,
``iter_trajectories`` / ``filter_trajectories`` and ``ReplayBuffer.query``: keywords, error types and phrases, reprs
and results. ``query_replay_buffer`` is what ``ReplayBuffer.query`` delegates to; the ``rb.query`` tests skip until it
is wired.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from helpers.factories import Doubler, make_buffer
from tensordict import TensorDict, TensorDictBase, lazy_stack

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
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
from torchrl.envs.transforms import Compose

needs_rb_query = pytest.mark.skipif(not hasattr(ReplayBuffer, "query"), reason="the lead wires ReplayBuffer.query")


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
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate((3, 4, 5))])
    data = TensorDict({"traj_ids": ids, "obs": torch.arange(12.0), ("next", "reward"): torch.ones(12, 1)}, batch_size=[12])
    return make_buffer(cls=TensorDictReplayBuffer, capacity=50, transform=transform, data=data)


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
