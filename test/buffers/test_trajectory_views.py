"""Trajectory views from iter_trajectories / filter_trajectories / rb.query, and interleaved trajectories.

The views behave as TorchRL documents ``Trajectory`` (length, attribute lookup falling back to ``("next", ...)``,
slicing, stacking). With ``fragmented=True`` the steps of several trajectories written interleaved (several envs or
collectors feeding one stream) are gathered per trajectory in step order; checked against a brute-force grouping.
"""

from __future__ import annotations

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict, lazy_stack

from torchrl.data import LazyTensorStorage, Trajectory, filter_trajectories, iter_trajectories, traj
from torchrl.data.replay_buffers.trajectories.interleaved import (
    FRAGMENTED_DUPLICATE,
    FRAGMENTED_NO_TRAJ,
    FRAGMENTED_STEP_KEY,
)


def episodes(lengths) -> TensorDict:
    """Episodes one after the other; ``obs`` is the global row, reward under ``"next"``."""
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    count = torch.cat([torch.arange(n) for n in lengths])
    n = ids.numel()
    return TensorDict({"episode": ids, "step_count": count, "obs": torch.arange(n, dtype=torch.float32),
                       ("next", "reward"): torch.ones(n, 1), ("next", "done"): torch.zeros(n, 1, dtype=torch.bool)},
                      batch_size=[n])  # fmt: skip


def interleaved(n_streams=4, steps_per_stream=12, missing=0.0, seed=0) -> TensorDict:
    """``n_streams`` envs, each running episodes of random lengths, their steps interleaved at random.

    Each episode has its own id; ``missing`` drops that fraction of the steps (a gap in ``step_count``).
    """
    g = torch.Generator().manual_seed(seed)
    streams, next_id = [], 0
    for _ in range(n_streams):
        ids, steps = [], []
        while len(ids) < steps_per_stream:
            length = int(torch.randint(2, 7, (1,), generator=g))
            ids += [next_id] * length
            steps += list(range(length))
            next_id += 1
        streams.append(list(zip(ids[:steps_per_stream], steps[:steps_per_stream])))
    rows, cursor = [], [0] * n_streams
    while any(c < steps_per_stream for c in cursor):
        live = [s for s in range(n_streams) if cursor[s] < steps_per_stream]
        s = live[int(torch.randint(len(live), (1,), generator=g))]
        rows.append(streams[s][cursor[s]])
        cursor[s] += 1
    keep = torch.rand(len(rows), generator=g) >= missing
    rows = [r for r, k in zip(rows, keep.tolist()) if k]
    ids = torch.tensor([r[0] for r in rows])
    steps = torch.tensor([r[1] for r in rows])
    n = len(rows)
    return TensorDict({("collector", "traj_ids"): ids, "step_count": steps, "obs": torch.arange(n, dtype=torch.float32),
                       ("next", "reward"): torch.rand(n, 1, generator=g)}, batch_size=[n])  # fmt: skip


def brute_force_runs(ids: list, steps: list) -> list[list[int]]:
    """The rows of each run (one id, consecutive steps), rows in step order, runs by their earliest row."""
    by_id: dict = {}
    for row, (i, s) in enumerate(zip(ids, steps)):
        by_id.setdefault(i, []).append((s, row))
    runs = []
    for pairs in by_id.values():
        pairs.sort()
        run = [pairs[0][1]]
        for (prev, _), (s, row) in zip(pairs, pairs[1:]):
            if s == prev + 1:
                run.append(row)
            else:
                runs.append(run)
                run = [row]
        runs.append(run)
    return sorted(runs, key=min)


# -- the views -----------------------------------------------------------------------------------------------------
def test_iter_trajectories_yields_trajectory_views_with_length_and_attribute_lookup():
    data = episodes([3, 2, 4])
    views = list(iter_trajectories(data))
    assert all(isinstance(t, Trajectory) for t in views)
    assert [t.length for t in views] == [3, 2, 4] and [len(t) for t in views] == [3, 2, 4]
    first = views[0]
    assert torch.equal(first.obs, data["obs"][:3])  # root entry
    assert torch.equal(first.reward, data["next", "reward"][:3])  # falls back to ("next", "reward")
    assert float(first.total_reward) == 3.0
    with pytest.raises(AttributeError, match="Trajectory has no entry 'velocity'"):
        _ = first.velocity
    views[1]["obs"][0] = -1.0  # a view: writes reach the data
    assert data["obs"][3] == -1.0


def test_slicing_a_view_gives_a_trajectory_of_the_slice():
    t = next(iter_trajectories(episodes([5])))
    part = t[1:4]
    assert isinstance(part, Trajectory) and part.length == 3 and part.obs.tolist() == [1.0, 2.0, 3.0]
    assert isinstance(t[torch.tensor([0, 4])], Trajectory) and t[torch.tensor([0, 4])].obs.tolist() == [
        0.0,
        4.0,
    ]
    assert torch.equal(t["next", "reward"], torch.ones(5, 1))


def test_a_trajectory_of_a_trajectory_wraps_the_same_data():
    t = next(iter_trajectories(episodes([3])))
    again = Trajectory(t)
    assert isinstance(again.data, TensorDict) and again.length == 3 and torch.equal(again.obs, t.obs)


def test_stacking_views():
    views = list(iter_trajectories(episodes([3, 3, 5])))
    dense = torch.stack(views[:2])
    assert isinstance(dense, Trajectory) and dense.batch_size == torch.Size([2, 3]) and dense.length == 3
    assert dense.obs.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert isinstance(dense[1], Trajectory) and dense[1].obs.tolist() == [3.0, 4.0, 5.0]
    ragged = lazy_stack(views)
    assert isinstance(ragged, Trajectory) and ragged.batch_size == torch.Size([3, -1])
    assert [ragged[i].length for i in range(3)] == [3, 3, 5]
    assert [x.tolist() for x in ragged.data.get("obs", as_list=True)] == [t.obs.tolist() for t in views]
    with pytest.raises(RuntimeError):
        torch.stack(views)  # dense stacking needs one length


def test_filter_and_query_return_trajectory_views():
    data = episodes([3, 2, 4])
    assert all(isinstance(t, Trajectory) for t in filter_trajectories(data))
    rb = make_buffer(capacity=20, data=data)
    out = rb.query(traj.length > 2, trajectory_key="episode")
    assert [t.length for t in out] == [3, 4] and all(isinstance(t, Trajectory) for t in out)
    assert out[1].reward.shape == (4, 1)


# -- interleaved trajectories ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("missing", [0.0, 0.1])
@pytest.mark.parametrize("seed", [0, 1])
def test_fragmented_iteration_gathers_each_trajectory_in_step_order(missing, seed):
    data = interleaved(missing=missing, seed=seed)
    ids, steps = data["collector", "traj_ids"].tolist(), data["step_count"].tolist()
    expected = brute_force_runs(ids, steps)
    views = list(iter_trajectories(data, fragmented=True))
    assert [t.obs.long().tolist() for t in views] == expected
    for t in views:
        assert t["collector", "traj_ids"].unique().numel() == 1
        assert torch.equal(t.step_count, torch.arange(t.length) + t.step_count[0])
    assert len(views) >= len(set(ids)) if missing else len(views) == len(set(ids))


def test_a_missing_step_ends_a_trajectory_and_done_flags_play_no_role():
    data = TensorDict({"episode": torch.tensor([7, 8, 7, 8, 7, 7]), "step_count": torch.tensor([0, 0, 1, 1, 3, 4]),
                       ("next", "done"): torch.tensor([False, True, True, False, False, False])},
                      batch_size=[6])  # fmt: skip
    views = list(iter_trajectories(data, fragmented=True))
    assert [(int(t.episode[0]), t.step_count.tolist()) for t in views] == [
        (7, [0, 1]),
        (8, [0, 1]),
        (7, [3, 4]),
    ]


def test_fragmented_filter_evaluates_predicates_on_the_gathered_trajectories():
    data = interleaved(seed=3)
    runs = brute_force_runs(data["collector", "traj_ids"].tolist(), data["step_count"].tolist())
    out = filter_trajectories(data, traj.length >= 4, fragmented=True)
    assert [t.obs.long().tolist() for t in out] == [r for r in runs if len(r) >= 4]
    reward = data["next", "reward"].squeeze(-1)
    opaque = filter_trajectories(data, lambda t: t.length >= 4, fragmented=True)
    assert [t.obs.long().tolist() for t in opaque] == [r for r in runs if len(r) >= 4]
    for t, rows in zip(out, [r for r in runs if len(r) >= 4]):
        assert torch.allclose(t.total_reward, reward[rows].sum())


def test_fragmented_query_over_a_ring_that_wrapped():
    data = interleaved(n_streams=3, steps_per_stream=14, seed=5)  # 42 steps
    capacity = 30
    rb = make_buffer(capacity=capacity)
    rb.extend(data[:25])
    rb.extend(data[25:])  # wraps: the 12 oldest steps are overwritten
    live = data[len(data) - capacity :]
    expected = brute_force_runs(live["collector", "traj_ids"].tolist(), live["step_count"].tolist())
    out = rb.query(fragmented=True)
    assert [(t.obs.long() - (len(data) - capacity)).tolist() for t in out] == expected
    picked = rb.query(traj.length >= 3, fragmented=True)  # the declared-keys path reads the matches again
    assert [(t.obs.long() - (len(data) - capacity)).tolist() for t in picked] == [
        r for r in expected if len(r) >= 3
    ]
    assert all(("next", "reward") in t.keys(include_nested=True) for t in picked)


def test_fragmented_query_on_a_two_dimensional_storage_matches_the_contiguous_split():
    envs = [episodes([3, 3]), episodes([2, 4])]
    envs[1]["episode"] += 10
    rb = make_buffer(storage=LazyTensorStorage(12, ndim=2), dim_extend=1)
    rb.extend(torch.stack(envs))  # [envs, time], written along time: a [6, 2] storage, one env per column
    contiguous = [t.episode.tolist() for t in rb.query(trajectory_key="episode")]
    fragmented = [t.episode.tolist() for t in rb.query(trajectory_key="episode", fragmented=True)]
    assert fragmented == contiguous == [[0, 0, 0], [1, 1, 1], [10, 10], [11, 11, 11, 11]]


def test_fragmented_errors():
    data = interleaved()
    with pytest.raises(RuntimeError, match=FRAGMENTED_NO_TRAJ.phrase):
        list(iter_trajectories(data.exclude("collector"), fragmented=True))
    with pytest.raises(KeyError, match="step_key 'tick' not found"):
        list(iter_trajectories(data, fragmented=True, step_key="tick"))
    with pytest.raises(ValueError, match=FRAGMENTED_STEP_KEY.phrase):
        filter_trajectories(data, fragmented=True, step_key=None)
    with pytest.raises(TypeError, match="`fragmented` must be a bool"):
        filter_trajectories(data, fragmented="yes")
    dup = data.clone()
    dup["step_count"][:] = 0
    with pytest.raises(RuntimeError, match=FRAGMENTED_DUPLICATE.phrase):
        list(iter_trajectories(dup, fragmented=True))
    floats = data.clone()
    floats["step_count"] = floats["step_count"].float()
    with pytest.raises(TypeError, match="must contain integer values"):
        list(iter_trajectories(floats, fragmented=True))
    negative = data.clone()
    negative["step_count"][0] = -1
    with pytest.raises(ValueError, match="Step numbers must be non-negative"):
        list(iter_trajectories(negative, fragmented=True))
    rb = make_buffer(capacity=50, data=data.exclude("step_count"))
    with pytest.raises(KeyError, match="step_key 'step_count' not found"):
        rb.query(fragmented=True)
