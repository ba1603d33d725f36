"""ShardedRayReplayBuffer without a cluster: bad arguments are refused before Ray starts, and the pure parts of a
sharded buffer (routing, the split of a draw, global indices, weights, the checkpoint manifest) hold their
contracts."""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import functools
import json

import numpy as np
import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, RateLimitedReplayBuffer, ShardedRayReplayBuffer
from torchrl.data.replay_buffers._ray.shard_checkpoint import (
    MANIFEST,
    commit,
    new_version_dir,
    read_manifest,
)
from torchrl.data.replay_buffers._ray.shards import (
    from_global,
    global_weights,
    group_rows,
    shard_of_rows,
    split_counts,
    to_global,
)

ray = require("ray")

STORAGE = functools.partial(LazyTensorStorage, 10)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_shards": 0}, ValueError, "`num_shards`"),
        ({"num_shards": -2}, ValueError, "`num_shards`"),
        ({"num_shards": 2.0}, TypeError, "`num_shards`"),
        ({"num_shards": True}, TypeError, "`num_shards`"),
        ({"num_shards": 2, "route_key": 3}, TypeError, "`route_key`"),
        ({"num_shards": 2, "route_key": ("a", 1)}, TypeError, "`route_key`"),
        ({"num_shards": 2, "batch_size": 0}, ValueError, "`batch_size`"),
        ({"num_shards": 2, "max_restarts": -5}, ValueError, "`max_restarts`"),
        ({"num_shards": 2, "max_restarts": 1.5}, TypeError, "`max_restarts`"),
        ({"num_shards": 2, "replay_buffer_cls": dict}, TypeError, "`replay_buffer_cls`"),
        ({"num_shards": 2, "remote_config": {"max_concurrency": 4}}, ValueError, "max_concurrency"),
        ({"num_shards": 2, "remote_config": {"max_restarts": 2}}, TypeError, "max_restarts"),
        ({"num_shards": 2, "remote_config": [1]}, TypeError, "`remote_config`"),
        ({"num_shards": 2, "prefetch": 2}, ValueError, "prefetch"),
        ({"num_shards": 2, "storage": LazyTensorStorage(10)}, TypeError, "needs a constructor"),
        ({"num_shards": 2, "restore_dir": 3}, TypeError, "`restore_dir`"),
        ({"num_shards": 2, "rate_limiter": 1.0}, TypeError, "`rate_limiter` must be a RateLimiter"),
        ({"num_shards": 2, "replay_buffer_cls": RateLimitedReplayBuffer, "samples_per_insert": 1.0},
         TypeError, "pass rate_limiter=SampleToInsertRatio"),
    ],
)
def test_a_bad_argument_is_refused_before_ray_starts(kwargs, error, match):
    was_running = ray.is_initialized()
    kwargs.setdefault("storage", STORAGE)
    with pytest.raises(error, match=match):
        ShardedRayReplayBuffer(**kwargs)
    assert ray.is_initialized() == was_running


def test_num_shards_is_required():
    with pytest.raises(TypeError, match="num_shards"):
        ShardedRayReplayBuffer(storage=STORAGE)


# -- routing ------------------------------------------------------------------------------------------------------
def test_integer_route_keys_pick_their_value_modulo_the_shards():
    data = TensorDict(cid=torch.tensor([0, 1, 2, 3, 4, -1]), obs=torch.zeros(6, 3), batch_size=[6])
    assert shard_of_rows(data, "cid", 3).tolist() == [0, 1, 2, 0, 1, 2]


def test_string_route_keys_hash_the_same_in_every_process():
    data = TensorDict(obs=torch.zeros(3), batch_size=[3])
    data["worker"] = ["a", "b", "a"]
    shards = shard_of_rows(data, "worker", 4)
    assert shards[0] == shards[2] and 0 <= shards.min() and shards.max() < 4
    assert shards.tolist() == shard_of_rows(data, "worker", 4).tolist()


def test_a_nested_route_key_is_read_from_its_sub_tensordict():
    data = TensorDict({"collector": {"id": torch.tensor([[5], [6]])}}, batch_size=[2])
    assert shard_of_rows(data, ("collector", "id"), 4).tolist() == [1, 2]


def test_a_missing_route_key_names_the_entries_and_the_ways_out():
    data = TensorDict(obs=torch.zeros(2), batch_size=[2])
    with pytest.raises(KeyError, match="route_key='cid' is not an entry.*'obs'.*shard="):
        shard_of_rows(data, "cid", 2)


def test_a_float_route_key_is_refused():
    data = TensorDict(cid=torch.zeros(2), batch_size=[2])
    with pytest.raises(TypeError, match="integers or strings"):
        shard_of_rows(data, "cid", 2)


def test_rows_are_grouped_by_shard_in_their_order():
    groups = group_rows(np.array([1, 0, 1, 2, 0]), 4)
    assert [(s, rows.tolist()) for s, rows in groups] == [(0, [1, 4]), (1, [0, 2]), (2, [3])]


# -- the draw math -------------------------------------------------------------------------------------------------
def test_global_indices_name_shard_and_slot_and_round_trip():
    index = to_global(torch.tensor([0, 1, 7]), 2, 3)
    assert index.tolist() == [2, 5, 23]
    shards, slots = from_global(index, 3)
    assert shards.tolist() == [2, 2, 2] and slots.tolist() == [0, 1, 7]
    assert [a.tolist() for a in from_global(4, 3)] == [[1], [1]]


@pytest.mark.parametrize("index, error", [(torch.tensor([0.5]), TypeError), ([1, -1], ValueError),
                                          (["a"], TypeError), (torch.tensor([True]), TypeError)])
def test_a_bad_global_index_is_refused(index, error):
    with pytest.raises(error, match="`index`"):
        from_global(index, 2)


def test_a_draw_is_split_over_shards_in_proportion_to_their_weights():
    rng = np.random.default_rng(0)
    counts = split_counts([1.0, 0.0, 3.0], 100_000, rng)
    assert counts.sum() == 100_000 and counts[1] == 0
    assert abs(counts[2] / counts[0] - 3.0) < 0.1


def test_shard_weights_become_the_weights_of_one_buffer():
    q = torch.tensor([2.0, 4.0, 8.0], dtype=torch.float64)
    beta = 0.6
    local = (q / 2.0) ** -beta  # a shard whose minimum is 2
    expected = (q / 0.5) ** -beta  # one buffer whose minimum is 0.5 (another shard's)
    torch.testing.assert_close(global_weights(local.float(), 2.0, 0.5, beta), expected.float())
    assert global_weights(local, 2.0, 2.0, beta) is local


# -- the checkpoint manifest ---------------------------------------------------------------------------------------
def _fake_checkpoint(root, num_shards=2) -> str:
    version, name, parts = new_version_dir(root, num_shards)
    for part in parts:
        os.mkdir(part)
    return commit(root, version, name, [{"shard": s} for s in range(num_shards)], {"route_key": None})


def test_the_manifest_is_written_last_and_names_every_part(tmp_path):
    _fake_checkpoint(tmp_path)
    manifest = read_manifest(tmp_path, 2)
    assert manifest["schema_version"] == 1 and manifest["version"] == 1
    assert [os.path.basename(e["path"]) for e in manifest["shards"]] == ["shard-000", "shard-001"]
    _fake_checkpoint(tmp_path)  # the next version replaces the previous one's directory
    assert read_manifest(tmp_path)["version"] == 2
    assert sorted(os.listdir(tmp_path)) == sorted([MANIFEST, read_manifest(tmp_path)["directory"]])


def test_a_save_that_never_wrote_its_manifest_is_refused(tmp_path):
    new_version_dir(tmp_path, 2)  # a save killed before its manifest
    with pytest.raises(FileNotFoundError, match="never finished"):
        read_manifest(tmp_path)


def test_a_version_directory_is_refused_with_a_pointer_to_its_parent(tmp_path):
    _fake_checkpoint(tmp_path)
    inner = os.path.join(tmp_path, read_manifest(tmp_path)["directory"])
    with pytest.raises(FileNotFoundError, match="pass its parent"):
        read_manifest(inner)


def test_a_missing_shard_part_refuses_the_whole_checkpoint(tmp_path):
    _fake_checkpoint(tmp_path)
    os.rmdir(read_manifest(tmp_path)["shards"][1]["path"])
    with pytest.raises(FileNotFoundError, match="shard 1"):
        read_manifest(tmp_path)


def test_a_checkpoint_of_another_shard_count_or_schema_is_refused(tmp_path):
    path = _fake_checkpoint(tmp_path, 3)
    with pytest.raises(ValueError, match="holds 3 shards and this buffer has 2.*num_shards=3"):
        read_manifest(tmp_path, 2)
    manifest = json.load(open(path))
    manifest["schema_version"] = 99
    with open(path, "w") as file:
        json.dump(manifest, file)
    with pytest.raises(ValueError, match="schema_version=99"):
        read_manifest(tmp_path)


def test_an_empty_directory_is_no_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ShardedRayReplayBuffer.dumps"):
        read_manifest(tmp_path)



# -- the priority mass a prioritized shard reports -----------------------------------------------------------------
@pytest.mark.parametrize("compilable", [False, True], ids=["tree-kernel", "torch-kernel"])
def test_a_prioritized_sampler_reports_the_mass_and_minimum_a_draw_uses(compilable):
    from torchrl.data import PrioritizedSampler

    storage = LazyTensorStorage(8, compilable=compilable)  # a compilable storage puts the trees in tensors
    sampler = PrioritizedSampler(8, alpha=0.5, beta=1.0, eps=0.0)
    assert sampler.priority_mass(storage) == (0.0, float("inf"))
    storage.set(torch.arange(4), torch.arange(4))
    sampler.extend(torch.arange(4))
    sampler.update_priority(torch.arange(4), torch.tensor([0.0, 4.0, 1.0, 9.0]), storage=storage)
    assert (sampler.kernel == "torch") == compilable
    mass, smallest = sampler.priority_mass(storage)
    assert mass == pytest.approx(2.0 + 1.0 + 3.0) and smallest == pytest.approx(1.0)  # zero is not a minimum
    index, info = sampler.sample(storage, 64)
    q = torch.tensor([0.0, 2.0, 1.0, 3.0])[index]
    torch.testing.assert_close(info["priority_weight"], (q / smallest) ** -1.0)


def test_ray_replay_buffer_points_num_shards_to_the_sharded_class():
    from torchrl.data import RayReplayBuffer

    was_running = ray.is_initialized()
    with pytest.raises(TypeError, match=r"ShardedRayReplayBuffer\(num_shards=N"):
        RayReplayBuffer(storage=STORAGE, num_shards=4)
    assert ray.is_initialized() == was_running
