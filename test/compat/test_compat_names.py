"""TorchRL drop-in names: sample units, MultiStep, find_start_stop_traj, the utils module, the TED layouts,
_MEMMAP_STORAGE_REGISTRY and RemoteTensorDictReplayBuffer (locally, and over rpc in two processes).

Expected values are computed by hand from TorchRL's documented behaviour.
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing as mp
import pickle
import queue
import socket

import numpy as np
import pytest
import torch
from helpers.extras import require
from helpers.rpc import rpc_client, rpc_owner
from tensordict import TensorDict

from torchrl.data import (
    DEFAULT_DONE_KEYS,
    Flat2TED,
    H5Combine,
    H5Split,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    MultiStep,
    Nested2TED,
    RemoteTensorDictReplayBuffer,
    Sequence,
    TED2Flat,
    TED2Nested,
    TensorDictReplayBuffer,
    Transition,
    find_start_stop_traj,
)
from torchrl.data.replay_buffers.sample_units import SampleUnit, check_sample_unit
from torchrl.data.replay_buffers.storages import _MEMMAP_STORAGE_REGISTRY
from torchrl.data.replay_buffers.utils import INT_CLASSES, pin_memory_output, tree_iter


# -- import paths ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module, name",
    [
        ("torchrl.data", "Sequence"),
        ("torchrl.data", "SampleUnit"),
        ("torchrl.data", "Transition"),
        ("torchrl.data", "MultiStep"),
        ("torchrl.data", "DEFAULT_DONE_KEYS"),
        ("torchrl.data", "find_start_stop_traj"),
        ("torchrl.data", "RemoteTensorDictReplayBuffer"),
        ("torchrl.data.replay_buffers", "RemoteTensorDictReplayBuffer"),
        ("torchrl.data.replay_buffers", "Sequence"),
        ("torchrl.data.replay_buffers.replay_buffers", "RemoteTensorDictReplayBuffer"),
        ("torchrl.data.replay_buffers.sample_units", "SampleUnit"),
        ("torchrl.data.replay_buffers.sample_units", "Transition"),
        ("torchrl.data.replay_buffers.sample_units", "Sequence"),
        ("torchrl.data.replay_buffers.utils", "tree_iter"),
        ("torchrl.data.replay_buffers.utils", "TED2Flat"),
        ("torchrl.data.replay_buffers.storages", "_MEMMAP_STORAGE_REGISTRY"),
        ("torchrl.data.postprocs", "MultiStep"),
    ]
    + [(m, n) for m in ("torchrl.data", "torchrl.data.replay_buffers")
       for n in ("TED2Flat", "Flat2TED", "TED2Nested", "Nested2TED", "H5Split", "H5Combine")],
)
def test_name_importable_from_torchrl_path(module, name):
    mod = importlib.import_module(module)
    assert getattr(mod, name) is not None
    if module in ("torchrl.data", "torchrl.data.replay_buffers") and not name.startswith("_"):
        assert name in mod.__all__  # star-imports bring it, as in TorchRL


def test_default_done_keys_are_torchrl_s():
    assert DEFAULT_DONE_KEYS == ("done", "truncated", "terminated")


# -- sample units ---------------------------------------------------------------------------------------------
def _episodes_storage(done, *, capacity=None, extra=None):
    """A 1-D storage holding obs = row number and the given done flags (rows 0..len(done)-1)."""
    n = len(done)
    storage = LazyTensorStorage(capacity or n)
    data = {"obs": torch.arange(n), ("next", "done"): torch.tensor(done).unsqueeze(-1)}
    data.update(extra or {})
    storage.set(torch.arange(n), TensorDict(data, batch_size=[n]))
    return storage


def test_transition_returns_the_sampler_index_unchanged():
    index, info = Transition().expand(torch.tensor([4, 2]), {"priority_weight": torch.ones(2)}, storage=None)
    assert index.tolist() == [4, 2] and info["priority_weight"].tolist() == [1.0, 1.0]


def test_check_sample_unit_accepts_units_and_refuses_the_rest():
    assert check_sample_unit(None) is None
    assert check_sample_unit(Transition()) is None  # nothing to do on the sample path
    unit = Sequence(2)
    assert check_sample_unit(unit) is unit
    with pytest.raises(TypeError, match=r"instance.*Sequence\(\.\.\.\)"):
        check_sample_unit(Sequence)
    with pytest.raises(TypeError, match="sample_unit"):
        check_sample_unit("sequence")
    with pytest.raises(TypeError):
        SampleUnit()  # abstract


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"length": 0}, "`length`"),
        ({"length": True}, "`length`"),
        ({"length": 2, "episode_boundary": "wrap"}, "`episode_boundary`"),
        ({"length": 2, "burn_in": -1}, "`burn_in`"),
        ({"length": 2, "bootstrap": 1.5}, "`bootstrap`"),
        ({"length": 2, "dilation": 0}, "`dilation`"),
    ],
)
def test_sequence_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sequence(**kwargs)
    with pytest.raises(TypeError, match="key"):
        Sequence(2, done_key=3)


def test_sequence_pad_repeats_the_episode_edge_and_marks_it_invalid():
    # episodes: rows [0, 2] (done at 2) and [3, 5] (the newest step ends it)
    storage = _episodes_storage([False, False, True, False, False, False])
    unit = Sequence(3)
    index, info = unit.expand(torch.tensor([1, 3, 5]), {}, storage)
    assert index.tolist() == [1, 2, 2, 3, 4, 5, 5, 5, 5]  # flat, window-major (TorchRL's layout)
    assert info["validity_mask"].tolist() == [True, True, False, True, True, True, True, False, False]
    assert info["learning_mask"].tolist() == [True] * 9  # the learning positions, valid or not
    assert info["anchor_index"].tolist() == [1] * 3 + [3] * 3 + [5] * 3
    data = unit.read(storage, index)
    assert data.batch_size == torch.Size([9]) and data["obs"].tolist() == index.tolist()


def test_sequence_burn_in_and_bootstrap_surround_the_learning_steps():
    storage = _episodes_storage([False] * 8)
    unit = Sequence(2, burn_in=2, bootstrap=1)
    assert unit.window == 5
    index, info = unit.expand(torch.tensor([1, 4]), {}, storage)
    # anchor 1: steps -1, 0 (burn-in), 1, 2 (learning), 3 (bootstrap); -1 is before the data: padded with 0
    assert index.tolist() == [0, 0, 1, 2, 3, 2, 3, 4, 5, 6]
    assert info["validity_mask"].tolist() == [False, True, True, True, True] + [True] * 5
    assert info["learning_mask"].tolist() == [False, False, True, True, False] * 2


def test_sequence_dilation_spaces_the_steps():
    storage = _episodes_storage([False] * 10)
    index, info = Sequence(3, dilation=3).expand(torch.tensor([0, 5]), {}, storage)
    assert index.tolist() == [0, 3, 6, 5, 8, 9]
    assert info["validity_mask"].tolist() == [True, True, True, True, True, False]


def test_sequence_stop_moves_the_window_back_to_end_at_the_episode_end():
    storage = _episodes_storage([False, False, False, True, False, False])  # episodes [0, 3], [4, 5]
    index, info = Sequence(3, episode_boundary="stop").expand(torch.tensor([2, 0, 5]), {}, storage)
    assert index.tolist() == [1, 2, 3, 0, 1, 2, 4, 5, 5]
    assert info["validity_mask"].tolist() == [True] * 3 + [True] * 3 + [True, True, False]
    assert info["anchor_index"].tolist() == [2] * 3 + [0] * 3 + [5] * 3  # the drawn anchors


def test_sequence_include_reset_crosses_episode_ends_but_not_the_stored_stream():
    storage = _episodes_storage([False, True, False, False])
    index, info = Sequence(3, episode_boundary="include_reset").expand(torch.tensor([1, 2]), {}, storage)
    assert index.tolist() == [1, 2, 3, 2, 3, 3]
    assert info["validity_mask"].tolist() == [True, True, True, True, True, False]


def test_sequence_in_a_full_ring_never_joins_the_newest_and_oldest_steps():
    # capacity 4, steps 0..5 written: rows hold steps 4, 5, 2, 3 and row 1 (step 5) is the newest
    storage = _episodes_storage([False] * 4)
    done = torch.zeros(2, 1, dtype=torch.bool)
    storage.set(torch.arange(2), TensorDict({"obs": torch.arange(4, 6), ("next", "done"): done}, batch_size=[2]))
    index, info = Sequence(3).expand(torch.tensor([0, 2]), {}, storage)
    # from step 4 (row 0): step 5 (row 1), then the newest step ends the stream
    assert index.tolist() == [0, 1, 1, 2, 3, 0]
    assert info["validity_mask"].tolist() == [True, True, False, True, True, True]
    assert unit_read_obs(storage, index) == [4, 5, 5, 2, 3, 4]


def unit_read_obs(storage, index):
    return Sequence(1).read(storage, index)["obs"].tolist()


def test_sequence_on_a_time_by_env_storage_stays_in_the_env_column():
    storage = LazyTensorStorage(8, ndim=2)  # [4 time steps, 2 envs]
    done = torch.tensor([[False, False], [True, False], [False, False], [False, False]])
    obs = torch.arange(8).reshape(4, 2)
    storage.set(torch.arange(4), TensorDict({"obs": obs, ("next", "done"): done}, batch_size=[4, 2]))
    index, info = Sequence(2).expand((torch.tensor([0, 1]), torch.tensor([0, 1])), {}, storage)
    rows, cols = index
    assert rows.tolist() == [0, 1, 1, 2] and cols.tolist() == [0, 0, 1, 1]
    assert info["anchor_index"].tolist() == [[0, 0], [0, 0], [1, 1], [1, 1]]
    assert Sequence(2).read(storage, index)["obs"].tolist() == [0, 2, 3, 5]


def test_sequence_repeats_the_sampler_info_along_the_window():
    storage = _episodes_storage([False] * 4)
    _, info = Sequence(2).expand(torch.tensor([0, 1]), {"priority_weight": torch.tensor([0.5, 1.0])}, storage)
    assert info["priority_weight"].tolist() == [0.5, 0.5, 1.0, 1.0]


def test_sequence_is_rebuilt_after_a_write_and_drops_its_cache_when_pickled():
    storage = _episodes_storage([False] * 4, capacity=8)
    unit = Sequence(3)
    assert unit.expand(torch.tensor([2]), {}, storage)[0].tolist() == [2, 3, 3]
    storage.set(torch.arange(4, 6), TensorDict({"obs": torch.arange(4, 6),
                                                ("next", "done"): torch.zeros(2, 1, dtype=torch.bool)}, [2]))
    assert unit.expand(torch.tensor([2]), {}, storage)[0].tolist() == [2, 3, 4]
    assert pickle.loads(pickle.dumps(unit))._cache is None
    # an overwrite that keeps the length (a full ring) changes the episodes too
    full = _episodes_storage([False] * 4)
    assert unit.expand(torch.tensor([0]), {}, full)[0].tolist() == [0, 1, 2]
    full.set(0, TensorDict({"obs": torch.tensor(0), ("next", "done"): torch.tensor([True])}, []))
    assert unit.expand(torch.tensor([1]), {}, full)[1]["validity_mask"].tolist() == [True, True, True]
    assert unit.expand(torch.tensor([3]), {}, full)[0].tolist() == [3, 0, 0]  # row 3 now runs into row 0


def test_sequence_valid_steps_never_leave_the_anchor_episode():
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        n = int(torch.randint(5, 40, (1,), generator=gen))
        done = (torch.rand(n, generator=gen) < 0.2).tolist()
        storage = _episodes_storage(done)
        episode = torch.cumsum(torch.tensor([0] + done[:-1]), 0)  # episode id of each row
        anchors = torch.randint(n, (16,), generator=gen)
        for boundary in ("pad", "stop"):
            unit = Sequence(4, burn_in=1, episode_boundary=boundary)
            index, info = unit.expand(anchors, {}, storage)
            index, valid = index.view(16, unit.window), info["validity_mask"].view(16, unit.window)
            anchor = info["anchor_index"].view(16, unit.window)[:, 0]
            assert anchor.tolist() == anchors.tolist()  # the drawn anchors, even where "stop" moved the window
            same = episode[index] == episode[anchor].unsqueeze(-1)
            assert bool(same[valid].all()), (trial, boundary)
            assert bool((index[:, 1:] >= index[:, :-1]).all())  # time runs forward in a window


def test_sequence_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="TensorStorage"):
        Sequence(2).expand(torch.tensor([0]), {}, ListStorage(4))
    with pytest.raises(RuntimeError, match="empty"):
        Sequence(2).expand(torch.tensor([0]), {}, LazyTensorStorage(4))
    storage = _episodes_storage([False] * 4)
    with pytest.raises(KeyError, match="done_key"):
        Sequence(2, done_key="terminal").expand(torch.tensor([0]), {}, storage)
    with pytest.raises(ValueError, match="ndim=1"):
        Sequence(2).expand((torch.tensor([0]), torch.tensor([0])), {}, storage)


def test_sequence_anchor_priorities_take_the_max_over_valid_steps():
    storage = _episodes_storage([False, True, False, False])
    unit = Sequence(3)
    index, info = unit.expand(torch.tensor([0, 2]), {}, storage)
    batch = unit.read(storage, index)
    for key in ("anchor_index", "validity_mask"):
        batch.set(key, info[key])
    # window of anchor 0 is [0, 1, 1(invalid)]: the invalid step's 9 does not count
    priority = torch.tensor([1.0, 2.0, 9.0, 3.0, 1.0, 0.5])
    anchor, per_window = unit.anchor_priorities(batch, priority)
    assert anchor.tolist() == [0, 2] and per_window.tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="priority"):
        unit.anchor_priorities(batch, torch.ones(2))
    with pytest.raises(KeyError, match="anchor_index"):
        unit.anchor_priorities(batch.exclude("anchor_index"), priority)


# -- MultiStep ------------------------------------------------------------------------------------------------
def _rollout(rewards, done, *, terminated=None, obs=None):
    t = len(rewards)
    obs = torch.arange(t + 1.0) if obs is None else obs
    nxt = {"obs": obs[1:], "reward": torch.tensor(rewards).unsqueeze(-1), "done": torch.tensor(done).unsqueeze(-1)}
    if terminated is not None:
        nxt["terminated"] = torch.tensor(terminated).unsqueeze(-1)
    return TensorDict({"obs": obs[:-1], "next": nxt}, batch_size=[t])


def test_multistep_sums_discounted_rewards_up_to_the_episode_end():
    td = _rollout([1.0, 2.0, 4.0, 8.0, 16.0], [False, False, True, False, False])
    out = MultiStep(gamma=0.5, n_steps=3)(td)
    # step 0: 1 + .5*2 + .25*4 = 3; step 1: 2 + .5*4 = 4 (done at 2); step 2: 4; step 3: 8 + .5*16 = 16; step 4: 16
    assert out["next", "reward"].squeeze(-1).tolist() == [3.0, 4.0, 4.0, 16.0, 16.0]
    assert out["next", "original_reward"].squeeze(-1).tolist() == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert out["steps_to_next_obs"].squeeze(-1).tolist() == [3, 2, 1, 2, 1]
    assert out["next", "obs"].tolist() == [3.0, 3.0, 3.0, 5.0, 5.0]  # the obs after step t + m - 1
    assert out["gamma"].squeeze(-1).tolist() == [0.125, 0.25, 0.5, 0.25, 0.5]
    assert out["nonterminal"].tolist() == [True, True, False, True, False]  # TorchRL: k != 0
    assert out["next", "done"].squeeze(-1).tolist() == [False, False, True, False, False]  # step t's flags
    assert out["steps_to_next_obs"].shape == td.batch_size  # TorchRL: the batch shape
    assert "original_reward" not in td["next"].keys()  # the input is left as it was


def test_multistep_with_one_step_keeps_rewards_and_next_entries():
    td = _rollout([1.0, 2.0, 3.0], [False, True, False])
    out = MultiStep(gamma=0.9, n_steps=1)(td)
    assert (out["next", "reward"] == td["next", "reward"]).all()
    assert (out["next", "obs"] == td["next", "obs"]).all()
    assert torch.allclose(out["gamma"], torch.full((3, 1), 0.9))


def test_multistep_nonterminal_is_false_where_no_step_is_looked_ahead_as_torchrl():
    td = _rollout([1.0, 1.0, 1.0, 1.0], [False, True, False, True], terminated=[False, False, False, True])
    out = MultiStep(gamma=1.0, n_steps=2)(td)
    assert out["nonterminal"].tolist() == [True, False, True, False]
    assert out["next", "terminated"].squeeze(-1).tolist() == [False, False, False, True]
    assert not MultiStep(gamma=1.0, n_steps=1)(td)["nonterminal"].any()


def test_multistep_treats_each_row_of_a_batch_separately_and_masks_nonterminal():
    a = _rollout([1.0, 1.0, 1.0], [False, False, False])
    b = _rollout([2.0, 2.0, 2.0], [False, False, False])
    td = torch.stack([a, b])
    td.set(("collector", "mask"), torch.tensor([[True, True, True], [True, True, False]]))
    out = MultiStep(gamma=1.0, n_steps=3)(td)
    assert out["next", "reward"].squeeze(-1).tolist() == [[3.0, 2.0, 1.0], [6.0, 4.0, 2.0]]  # mask: no cut
    assert out["nonterminal"].tolist() == [[True, True, False], [True, True, False]]


def test_multistep_matches_a_step_by_step_computation():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(3, 12, generator=gen)
    done = torch.rand(3, 12, generator=gen) < 0.25
    td = TensorDict({"obs": torch.randn(3, 12, 2, generator=gen),
                     "next": {"obs": torch.randn(3, 12, 2, generator=gen), "reward": rewards, "done": done}},
                    batch_size=[3, 12])
    gamma, n = 0.9, 4
    out = MultiStep(gamma, n)(td)
    for b in range(3):
        for t in range(12):
            total, k = 0.0, 0
            while True:
                total += gamma**k * float(rewards[b, t + k])
                k += 1
                if k == n or bool(done[b, t + k - 1]) or t + k == 12:
                    break
            assert out["next", "reward"][b, t].item() == pytest.approx(total, rel=1e-5)
            assert (out["next", "obs"][b, t] == td["next", "obs"][b, t + k - 1]).all()


@pytest.mark.parametrize("kwargs, match", [({"gamma": 0.0, "n_steps": 2}, "gamma"), ({"gamma": 1.5, "n_steps": 2}, "gamma"),
                                           ({"gamma": 0.9, "n_steps": 0}, "n_steps"), ({"gamma": 0.9, "n_steps": 2.0}, "n_steps")])
def test_multistep_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiStep(**kwargs)


def test_multistep_refuses_data_it_cannot_process():
    ms = MultiStep(0.9, 2)
    with pytest.raises(TypeError, match="TensorDict"):
        ms(torch.zeros(3))
    with pytest.raises(ValueError, match="time dim"):
        ms(TensorDict({"next": {"reward": torch.ones(()), "done": torch.zeros((), dtype=torch.bool)}}, []))
    with pytest.raises(KeyError, match="reward"):
        ms(TensorDict({"next": {"done": torch.zeros(3, dtype=torch.bool)}}, [3]))


# -- find_start_stop_traj -------------------------------------------------------------------------------------
def test_find_start_stop_traj_from_done_flags():
    end = torch.tensor([False, True, False, False, True, False])
    start, stop, lengths = find_start_stop_traj(end=end, at_capacity=False)
    assert start.tolist() == [[0], [2], [5]] and stop.tolist() == [[1], [4], [5]] and lengths.tolist() == [2, 3, 1]


def test_find_start_stop_traj_wraps_around_a_full_storage():
    end = torch.tensor([False, True, False, False, True, False])
    start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True)
    assert start.squeeze(-1).tolist() == [5, 2] and stop.squeeze(-1).tolist() == [1, 4] and lengths.tolist() == [3, 3]
    # the cursor (last written row) ends a trajectory too
    start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True, cursor=torch.tensor([2, 3]))
    assert stop.squeeze(-1).tolist() == [1, 3, 4] and lengths.tolist() == [3, 2, 1]
    assert find_start_stop_traj(end=torch.zeros(3, dtype=torch.bool), at_capacity=True)[2].tolist() == [3]


def test_find_start_stop_traj_from_trajectory_ids():
    traj = torch.tensor([0, 0, 1, 1, 1, 2])
    start, stop, lengths = find_start_stop_traj(trajectory=traj, at_capacity=False)
    assert start.squeeze(-1).tolist() == [0, 2, 5] and lengths.tolist() == [2, 3, 1]
    _, _, lengths = find_start_stop_traj(trajectory=torch.tensor([2, 0, 0, 1, 2, 2]), at_capacity=True)
    assert lengths.tolist() == [3, 2, 1]  # the first one (id 2) runs from row 4 over the end into row 0


def test_find_start_stop_traj_orders_streams_then_time():
    end = torch.tensor([[False, True], [True, False], [False, True]])  # [time, envs]
    start, stop, lengths = find_start_stop_traj(end=end, at_capacity=False)
    assert stop.tolist() == [[1, 0], [2, 0], [0, 1], [2, 1]]
    assert start.tolist() == [[0, 0], [2, 0], [0, 1], [1, 1]]
    assert lengths.tolist() == [2, 1, 1, 2]


def test_find_start_stop_traj_refuses_bad_arguments():
    end = torch.tensor([False, True])
    with pytest.raises(TypeError, match="Exactly one of `trajectory` and `end`.*got neither"):
        find_start_stop_traj(at_capacity=False)
    with pytest.raises(TypeError, match="Exactly one of `trajectory` and `end`.*got both"):
        find_start_stop_traj(end=end, trajectory=torch.tensor([0, 1]), at_capacity=False)
    with pytest.raises(ValueError, match="`end`"):
        find_start_stop_traj(end=torch.tensor(True), at_capacity=False)
    with pytest.raises(TypeError, match="dtype"):
        find_start_stop_traj(end=torch.tensor([0.0, 1.0]), at_capacity=False)
    with pytest.raises(TypeError, match="at_capacity"):
        find_start_stop_traj(end=end, at_capacity=None)
    with pytest.raises(TypeError, match="cursor"):
        find_start_stop_traj(end=end, at_capacity=True, cursor=1.5)
    with pytest.raises(IndexError, match="cursor"):
        find_start_stop_traj(end=end, at_capacity=True, cursor=5)


# -- utils ----------------------------------------------------------------------------------------------------
def test_tree_iter_yields_the_leaves_depth_first():
    leaves = list(tree_iter({"a": 1, "b": [2, (3, {"c": 4})]}))
    assert leaves == [1, 2, 3, 4]
    td = TensorDict(a=torch.zeros(2), b=TensorDict(c=torch.ones(2), batch_size=[2]), batch_size=[2])
    assert sorted(float(leaf.sum()) for leaf in tree_iter(td)) == [0.0, 2.0]
    assert list(tree_iter([1, [2, 3]], is_leaf=lambda x: isinstance(x, list) and len(x) == 2)) == [[1, [2, 3]]]


def test_pin_memory_output_passes_values_through_without_cuda_or_flag():
    class Source:
        def __init__(self, pin):
            self._pin_memory = pin

        @pin_memory_output
        def read(self):
            return torch.ones(2), "meta"

    for pin in (False, True):
        value, meta = Source(pin).read()
        assert meta == "meta" and value.tolist() == [1.0, 1.0]
        if pin and torch.cuda.is_available():
            assert value.is_pinned()
    assert Source.read.__name__ == "read"


def test_int_classes_cover_python_and_numpy_ints():
    assert isinstance(3, INT_CLASSES) and isinstance(np.int64(3), INT_CLASSES)
    assert not isinstance(3.0, INT_CLASSES)


# -- TED layouts ----------------------------------------------------------------------------------------------
def _ted():
    """Two trajectories: steps [0, 1] (done at 1) and [2, 3, 4] (still running); obs of traj 2 start at 10."""
    obs = torch.tensor([0.0, 1.0, 10.0, 11.0, 12.0])
    next_obs = torch.tensor([1.0, 2.0, 11.0, 12.0, 13.0])
    done = torch.tensor([False, True, False, False, False]).unsqueeze(-1)
    return TensorDict(
        {
            "obs": obs,
            "action": torch.arange(5),
            "done": torch.zeros(5, 1, dtype=torch.bool),
            "terminated": torch.zeros(5, 1, dtype=torch.bool),
            "next": {"obs": next_obs, "reward": torch.arange(5.0), "done": done, "terminated": done.clone(),
                     "info": torch.arange(5) * 7},
        },
        batch_size=[5],
    )


def test_ted2flat_stores_each_observation_once():
    flat = TED2Flat()(_ted())
    assert flat.batch_size == torch.Size([])
    assert flat["obs"].tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 13.0]  # T + K = 5 + 2
    assert flat["reward"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert flat["done"].squeeze(-1).tolist() == [False, True, False, False, False]
    assert flat["next", "info"].tolist() == [0, 7, 14, 21, 28]  # other next entries stay under "next"
    assert set(flat.keys(True, True)) == {"obs", "action", "reward", "done", "terminated", ("next", "info")}


def test_flat2ted_inverts_ted2flat():
    ted = _ted()
    assert bool((Flat2TED()(TED2Flat()(ted)) == ted).all())


def test_ted2flat_of_a_full_ring_restores_the_rows_in_place():
    ted = _ted()
    rows = ted[torch.tensor([3, 4, 0, 1, 2])]  # a full ring whose oldest step is at row 2
    hook = TED2Flat()
    hook.shift, hook.is_full = 2, True
    flat = hook(rows)
    assert flat["obs"].tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 13.0]
    assert int(flat["shift"]) == 2 and bool(flat["is_full"])
    out = torch.zeros_like(rows)
    Flat2TED()(flat, out=out)
    assert bool((out == rows).all())


def test_ted2flat_reads_only_the_filled_rows():
    hook = TED2Flat()
    hook.shift = 2  # not full: 2 rows written
    flat = hook(_ted())
    assert flat["action"].tolist() == [0, 1] and flat["obs"].tolist() == [0.0, 1.0, 2.0]


def test_ted2nested_splits_per_trajectory_and_nested2ted_inverts_it():
    ted = _ted()
    nested = TED2Nested()(ted)
    assert nested.batch_size == torch.Size([2])
    assert [t.tolist() for t in nested["obs"].unbind()] == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0, 13.0]]
    assert [t.tolist() for t in nested["action"].unbind()] == [[0, 1], [2, 3, 4]]
    assert bool((Nested2TED()(nested) == ted).all())


def test_h5split_and_h5combine_round_trip():
    nested = TED2Nested()(_ted())
    split = H5Split()(nested)
    assert split["_lengths", "obs"].tolist() == [3, 4] and split["obs"].shape == torch.Size([7])
    back = Nested2TED()(H5Combine()(split))
    assert bool((back == _ted()).all())


@pytest.mark.extras
def test_h5_layout_round_trips_through_an_hdf5_file(tmp_path):
    require("h5py")
    from tensordict import PersistentTensorDict

    hook = TED2Nested()
    hook.shift, hook.is_full = 1, True
    rows = _ted()[torch.tensor([4, 0, 1, 2, 3])]
    split = H5Split()(hook(rows))
    on_disk = PersistentTensorDict.from_dict(split, tmp_path / "checkpoint.h5")
    loaded = on_disk.to_tensordict()
    on_disk.close()
    out = torch.zeros_like(rows)
    Nested2TED()(H5Combine()(loaded), out=out)
    assert bool((out == rows).all())


def test_ted_hooks_refuse_data_outside_the_ted_layout():
    with pytest.raises(TypeError, match="TensorDict"):
        TED2Flat()(torch.zeros(3))
    with pytest.raises(ValueError, match=r"batch size \[T\]"):
        TED2Flat()(torch.stack([_ted(), _ted()], 1))
    with pytest.raises(KeyError, match="done_key"):
        TED2Flat()(_ted().exclude(("next", "done")))
    bad = _ted()
    bad["done"][0] = True
    with pytest.raises(ValueError, match="root entry"):
        TED2Flat()(bad)
    with pytest.raises(TypeError, match="done_keys"):
        TED2Flat(done_keys=[3])
    hook = TED2Flat()
    hook.is_full, hook.shift = True, 9
    with pytest.raises(ValueError, match="shift"):
        hook(_ted())
    flat = TED2Flat()(_ted())
    flat["obs"] = flat["obs"][:6]
    with pytest.raises(ValueError, match="'obs'"):
        Flat2TED()(flat)
    with pytest.raises(KeyError, match="done"):
        Flat2TED()(TensorDict(obs=torch.zeros(3)))


# -- _MEMMAP_STORAGE_REGISTRY ---------------------------------------------------------------------------------
def test_memmap_registry_holds_live_self_cleaning_storages_only(tmp_path):
    temp = LazyMemmapStorage(10)
    kept = LazyMemmapStorage(10, scratch_dir=tmp_path / "kept")
    assert temp in _MEMMAP_STORAGE_REGISTRY and kept not in _MEMMAP_STORAGE_REGISTRY
    assert temp in list(_MEMMAP_STORAGE_REGISTRY) and len(_MEMMAP_STORAGE_REGISTRY) >= 1
    assert pickle.loads(pickle.dumps(temp)) not in _MEMMAP_STORAGE_REGISTRY  # a copy never cleans up
    gc.collect()  # storages that earlier tests left in reference cycles go first
    before = len(_MEMMAP_STORAGE_REGISTRY)
    del temp
    gc.collect()
    assert len(_MEMMAP_STORAGE_REGISTRY) == before - 1
    assert [] not in _MEMMAP_STORAGE_REGISTRY
    with pytest.raises(TypeError, match="read-only"):
        _MEMMAP_STORAGE_REGISTRY.add(kept)
    with pytest.raises(TypeError, match="read-only"):
        _MEMMAP_STORAGE_REGISTRY.discard(kept)


# -- RemoteTensorDictReplayBuffer, locally --------------------------------------------------------------------
def test_remote_buffer_works_as_a_local_tensordict_buffer():
    rb = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    assert isinstance(rb, TensorDictReplayBuffer)
    index = rb.extend(TensorDict(obs=torch.arange(6), batch_size=[6]))
    assert index.tolist() == list(range(6)) and len(rb) == 6
    batch = rb.sample()
    assert batch["obs"].shape == torch.Size([4]) and (batch["obs"] == batch["index"]).all()
    rb.add(TensorDict(obs=torch.tensor(6), batch_size=[]))
    assert len(rb) == 7 and rb[6]["obs"].item() == 6
    assert pickle.loads(pickle.dumps(rb))[:]["obs"].tolist() == list(range(7))


def test_remote_buffer_methods_are_picklable_by_name_and_accept_a_non_rref_self():
    method = RemoteTensorDictReplayBuffer.sample
    assert pickle.loads(pickle.dumps(method)) is method
    assert method.__qualname__ == "RemoteTensorDictReplayBuffer.sample"
    assert RemoteTensorDictReplayBuffer.__len__.__qualname__ == "RemoteTensorDictReplayBuffer.__len__"
    assert isinstance(RemoteTensorDictReplayBuffer.storage, property)  # properties are left alone


def test_sequence_contract_with_a_prioritized_sampler_and_tensordict_batches():
    """The four steps a buffer runs with ``sample_unit=`` (see sample_units.py), then a priority update."""
    from torchrl.data import PrioritizedSampler

    storage = _episodes_storage([False, False, True, False, False, False, False, True])
    sampler = PrioritizedSampler(8, alpha=1.0, beta=1.0)
    sampler.mark_update(torch.arange(8), storage=storage)
    unit = check_sample_unit(Sequence(3, burn_in=1))
    index, info = sampler.sample(storage, 4)
    index, info = unit.expand(index, info, storage)
    info["index"] = index
    batch = unit.read(storage, index)
    for key, value in info.items():  # what TensorDictReplayBuffer does with the info
        batch.set(key, value)
    assert batch.batch_size == torch.Size([16])  # B * W records (TorchRL's flat layout)
    assert batch["priority_weight"].shape == torch.Size([16])
    assert (batch["obs"] == batch["index"]).all()
    anchor, priority = unit.anchor_priorities(batch, batch["obs"].float())
    assert anchor.shape == priority.shape and 1 <= anchor.numel() <= 4  # one per distinct anchor
    sampler.update_priority(anchor, priority + 1, storage=storage)


# -- every TorchRL torchrl.data name: provided here, or refused with an ImportError that says why ------------------
# TorchRL 0.14's `torchrl.data.replay_buffers.__all__` (62 names) and its other `torchrl.data.__all__` names (53),
# as listed in the compatibility reference.
TORCHRL_RB_NAMES = """
filter_trajectories iter_trajectories traj Trajectory TrajectoryPredicate HERReplayBuffer HindsightStrategy
CompressedListStorage CompressedListStorageCheckpointer FlatStorageCheckpointer H5StorageCheckpointer
ListStorageCheckpointer NestedStorageCheckpointer StorageCheckpointerBase StorageEnsembleCheckpointer
TensorStorageCheckpointer RayReplayBuffer PrioritizedReplayBuffer RemoteTensorDictReplayBuffer
ConditionalUpdateResult ReplayBuffer SampleUnit Sequence Transition ReplayBufferEnsemble
TensorDictPrioritizedReplayBuffer TensorDictReplayBuffer ConsumingSampler PrioritizedSampler
PrioritizedSliceSampler PromptGroupSampler RandomSampler Sampler SamplerEnsemble SamplerWithoutReplacement
SliceSampler SliceSamplerWithoutReplacement StalenessAwareSampler LazyMemmapStorage LazyStackStorage
LazyTensorStorage ListStorage Storage StorageEnsemble StoreStorage TensorStorage DEFAULT_DONE_KEYS
find_start_stop_traj Flat2TED H5Combine H5Split Nested2TED TED2Flat TED2Nested ImmutableDatasetWriter
OfflineToOnlineReplayBuffer prefill_replay_buffer RoundRobinWriter TensorDictMaxValueWriter
TensorDictRoundRobinWriter Writer WriterEnsemble
""".split()
TORCHRL_DATA_ONLY_NAMES = """
ActionTokenizerBase AdaptiveKLController Binary BinaryToDecimal Bounded BoundedContinuous Categorical Choice
Composite ConstantKLController ContentBase DEVICE_TYPING DensifyReward HashToInt History MCTSForest
MultiCategorical MultiOneHot MultiStep NonTensor OneHot PairwiseDataset PromptData PromptTensorDictTokenizer
QueryModule RandomProjectionHash RewardData RobotDatasetMetadata RolloutFromModel SipHash Stacked
StackedComposite TensorDictMap TensorDictTokenizer TensorMap TensorSpec TokenizedDatasetLoader
TopKRewardSelector Tree Unbounded UnboundedContinuous UnboundedDiscrete UniformActionTokenizer
VocabTailActionTokenizer VideoClipRef check_no_exclusive_keys clear_video_decoder_cache consolidate_spec
contains_lazy_spec create_infinite_iterator get_dataloader set_video_decoder_cache_size validate_vla_tensordict
""".split()


def test_the_reference_lists_are_complete():
    assert len(TORCHRL_RB_NAMES) == len(set(TORCHRL_RB_NAMES)) == 62
    assert len(TORCHRL_DATA_ONLY_NAMES) == len(set(TORCHRL_DATA_ONLY_NAMES)) == 53


def _import_from(module: str, name: str):
    namespace: dict = {}
    exec(f"from {module} import {name}", namespace)
    return namespace[name]


@pytest.mark.parametrize(
    "module, name",
    [("torchrl.data", n) for n in TORCHRL_RB_NAMES + TORCHRL_DATA_ONLY_NAMES]
    + [("torchrl.data.replay_buffers", n) for n in TORCHRL_RB_NAMES],
)
def test_every_torchrl_name_is_provided_or_refused_with_a_reason(module, name):
    from torchrl.data._torchrl_names import NotProvidedError

    try:
        value = _import_from(module, name)
    except NotProvidedError as err:
        assert isinstance(err, ImportError)
        message = str(err)
        assert repr(name) in message and module in message
        assert "not part of this package" in message or "does not implement" in message
        assert "TorchRL" in message
        mod = importlib.import_module(module)
        assert name not in mod.__all__ and name not in dir(mod)  # star-imports and completion never meet it
        with pytest.raises(NotProvidedError):  # attribute access says the same
            getattr(mod, name)
    else:
        assert value is not None
        if name != "Sampler" or module != "torchrl.data":  # TorchRL omits Sampler from torchrl.data's __all__
            assert name in importlib.import_module(module).__all__


@pytest.mark.parametrize("name", ["Bounded", "TensorSpec", "History", "MCTSForest", "VideoClipRef"])
def test_out_of_scope_names_name_their_torchrl_area(name):
    from torchrl.data._torchrl_names import NotProvidedError

    with pytest.raises(NotProvidedError, match=rf"'{name}' belongs to TorchRL's .*not part of this package"):
        _import_from("torchrl.data", name)
    try:  # the usual optional-feature pattern works
        _import_from("torchrl.data", name)
        found = True
    except ImportError:
        found = False
    assert not found


def test_storestorage_imports_from_every_torchrl_path():
    from torchrl.data import StoreStorage

    for module in ("torchrl.data.replay_buffers", "torchrl.data.replay_buffers.storages",
                   "torchrl.data.replay_buffers.storages.store"):
        assert _import_from(module, "StoreStorage") is StoreStorage


def test_other_missing_names_keep_python_s_errors_and_hasattr():
    import torchrl.data

    assert not hasattr(torchrl.data, "NoSuchName")
    assert getattr(torchrl.data, "NoSuchName", None) is None
    with pytest.raises(ImportError, match="cannot import name 'NoSuchName'"):
        _import_from("torchrl.data", "NoSuchName")
    with pytest.raises(AttributeError, match="NoSuchName"):
        torchrl.data.NoSuchName  # noqa: B018
    assert hasattr(torchrl.data, "ReplayBuffer") and hasattr(torchrl.data, "LazyStackStorage")
    namespace: dict = {}
    exec("from torchrl.data import *", namespace)  # star-imports skip the refused names
    assert "ReplayBuffer" in namespace and "Bounded" not in namespace


def test_a_refused_name_cannot_shadow_what_is_provided():
    import torchrl.data
    from torchrl.data._torchrl_names import NOT_PROVIDED, not_provided_getattr

    provided = set(torchrl.data.__all__) & set(NOT_PROVIDED)
    assert all(getattr(torchrl.data, name) is not None for name in provided)  # module attributes win
    with pytest.raises(ValueError, match="not listed"):
        not_provided_getattr("m", ["ReplayBuffer"])


# -- RemoteTensorDictReplayBuffer over torch.distributed.rpc: two processes on 127.0.0.1 (TensorPipe) --------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_remote_buffer_is_written_and_sampled_over_rpc():
    ctx = mp.get_context("forkserver")  # two new processes; the forkserver has torch preloaded (conftest.py)
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=fn, args=(port, results)) for fn in (rpc_owner, rpc_client)]
    for p in procs:
        p.start()
    reports = {}
    try:
        for _ in procs:
            who, report = results.get(timeout=90)
            reports[who] = report
    except queue.Empty:
        pytest.fail(f"rpc processes did not report in time; got {reports}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    assert reports["owner"] == "ok", reports["owner"]
    seen = reports["client"]
    assert isinstance(seen, dict), seen
    assert seen["owner_name"] == "owner"
    assert seen["extend_index"] == list(range(10))
    assert seen["add_index"] == 10 and seen["len"] == 11
    assert len(seen["batch_obs"]) == 8
    assert all(obs == index + 10 for obs, index in zip(seen["batch_obs"], seen["batch_index"]))
    assert seen["sample_3"] == 3 and "index" in seen["info_keys"]
    assert seen["write_count"] == 11
    assert seen["bad_extend"] is not None and "TensorDict" in seen["bad_extend"]
    assert seen["owner_content"] == list(range(10, 21))
