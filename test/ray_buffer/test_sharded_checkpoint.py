"""One consistent checkpoint of every shard of a ShardedRayReplayBuffer, and shards that die: a SIGKILL of a shard
during ``dumps`` leaves the previous checkpoint loadable, a dead shard's error names it and the way out, and a
shard restarted by Ray (``max_restarts``) loads its part of the last checkpoint.

One local cluster for the module (``ray.init(num_cpus=2, include_dashboard=False)``, usage statistics off); shard
actors reserve no CPU. Data is tiny: the time goes to starting actor processes.
"""

from __future__ import annotations

import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before ray is imported: nothing leaves this machine

import functools
import json
import random
import signal
import threading
import time

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ShardedRayReplayBuffer, TensorDictPrioritizedReplayBuffer

ray = require("ray")

pytestmark = [pytest.mark.extras, pytest.mark.multiprocess]

NO_CPU = {"num_cpus": 0}
STORAGE = functools.partial(LazyTensorStorage, 1_000)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _make(**kwargs) -> ShardedRayReplayBuffer:
    return ShardedRayReplayBuffer(num_shards=2, replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=0.7,
                                  beta=0.5, storage=STORAGE, remote_config=NO_CPU, **kwargs)  # fmt: skip


@pytest.fixture(scope="module")
def loader(cluster):
    """A second buffer, never killed: what a fresh process would load a checkpoint into."""
    rb = _make()
    yield rb
    rb.close()


def _rows(start: int, n: int) -> TensorDict:
    obs = torch.arange(start, start + n)
    return TensorDict(obs=obs, reward=obs.float() / 10, batch_size=[n])


def _content(rb) -> list[list[tuple[int, float]]]:
    """Each shard's rows (obs, reward) in slot order, and each row's priority read back through a draw."""
    out = []
    for shard, length in enumerate(rb.shard_lengths()):
        rows = rb[torch.arange(length) * rb.num_shards + shard]
        out.append(list(zip(rows["obs"].tolist(), rows["reward"].tolist())))
    return out


def _wait_alive(rb, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not rb.is_alive:
        assert time.monotonic() < deadline, "the killed shard was not restarted"
        time.sleep(0.2)


@pytest.mark.timeout(600)
def test_a_checkpoint_round_trips_every_shard_and_its_priorities(loader, tmp_path):
    source = loader
    source.empty()
    index = source.extend(_rows(0, 6), shard=0)
    source.extend(_rows(6, 4), shard=1)
    source.update_priority(index, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 5.0]))
    before = _content(source)
    source.dumps(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["num_shards"] == 2 and manifest["schema_version"] == 1
    source.empty()
    assert len(source) == 0
    source.loads(tmp_path / "ckpt")
    assert _content(source) == before
    source.update_priority(torch.arange(4) * 2 + 1, 0.0)  # shard 1: priority 0 everywhere
    obs = source.sample(200)["obs"]
    assert obs.eq(5).float().mean() > 0.9  # the loaded priorities: row 5 of shard 0 dominates


@pytest.mark.timeout(120)
def test_loads_refuses_a_partial_checkpoint_and_leaves_the_shards_unchanged(loader, tmp_path):
    loader.empty()
    loader.extend(_rows(0, 3), shard=1)
    (tmp_path / "v000001-0123abcd" / "shard-000").mkdir(parents=True)  # a save killed before its manifest
    with pytest.raises(FileNotFoundError, match="never finished"):
        loader.loads(tmp_path)
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        loader.loads(tmp_path / "v000001-0123abcd")
    assert loader.shard_lengths() == [0, 3]


@pytest.mark.timeout(120)
def test_a_checkpoint_of_another_shard_count_is_refused(loader, tmp_path):
    loader.empty()
    loader.extend(_rows(0, 3), shard=0)
    loader.dumps(tmp_path)
    manifest_path = tmp_path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["num_shards"] = 3
    manifest["shards"].append({"shard": 2, "part": "shard-002"})
    (tmp_path / manifest["directory"] / "shard-002").mkdir()
    manifest_path.write_text(json.dumps(manifest))
    loader.empty()
    with pytest.raises(ValueError, match="holds 3 shards and this buffer has 2.*num_shards=3"):
        loader.loads(tmp_path)
    assert len(loader) == 0


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_shard_killed_during_dumps_leaves_the_previous_checkpoint_loadable(loader, cluster, tmp_path):
    """10 trials: write, then save while one shard's process is SIGKILLed at a random moment of the save. The
    save fails (its manifest is never written) or completes; either way the checkpoint at the path loads into
    another buffer, whole, as the last completed save left it. Ray restarts the killed shard from it."""
    rng = random.Random(0)
    root = tmp_path / "ckpt"
    source = _make(max_restarts=-1)
    try:
        source.extend(_rows(0, 50))
        source.extend(_rows(50, 50))
        source.dumps(root)
        saved = _content(source)
        failed = 0
        for trial in range(10):
            source.extend(_rows(1_000 * (trial + 1), 20 + trial))
            current = _content(source)
            victim = rng.randrange(2)
            pid = source.shard_pids()[victim]
            outcome = {}

            def save(outcome=outcome):
                try:
                    source.dumps(root)
                    outcome["ok"] = True
                except RuntimeError as err:
                    outcome["error"] = err

            thread = threading.Thread(target=save)
            thread.start()
            time.sleep(rng.uniform(0.0, 0.01))  # a random moment of the save
            os.kill(pid, signal.SIGKILL)
            thread.join(120)
            assert not thread.is_alive()
            if "error" in outcome:
                failed += 1
                message = str(outcome["error"])
                assert f"Shard {victim} of 2" in message and "max_restarts=-1" in message
            else:
                saved = current  # the save completed before the kill reached it
            loader.loads(root)
            assert _content(loader) == saved
            _wait_alive(source)
            source.loads(root)  # the restarted shard and the other one, back to the checkpoint
            assert _content(source) == saved
        assert failed >= 1  # at least one kill landed during a save
    finally:
        source.close()


@pytest.mark.timeout(600)
def test_a_dead_shard_raises_an_error_naming_it_and_the_way_out(cluster):
    rb = ShardedRayReplayBuffer(num_shards=1, storage=STORAGE, remote_config=NO_CPU)
    try:
        rb.extend(torch.arange(4))
        os.kill(rb.shard_pids()[0], signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"Shard 0 of 1 .*died.*loads\(\) the last checkpoint.*max_restarts"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the kill takes effect within moments
                rb.shard_lengths()
                time.sleep(0.1)
        assert not rb.is_alive
        with pytest.raises(RuntimeError, match="Shard 0 of 1"):
            rb.sample(2)
    finally:
        rb.close()
    with pytest.raises(RuntimeError, match="closed"):
        len(rb)


@pytest.mark.timeout(600)
def test_a_restarted_shard_loads_its_part_of_the_last_checkpoint(cluster, tmp_path):
    rb = _make(max_restarts=1)
    try:
        rb.extend(_rows(0, 5), shard=0)
        rb.extend(_rows(5, 3), shard=1)
        rb.dumps(tmp_path)
        rb.extend(_rows(100, 2), shard=1)  # written after the checkpoint: lost with the shard
        os.kill(rb.shard_pids()[1], signal.SIGKILL)
        try:  # a call that meets the death raises; one sent once Ray knows reaches the restarted shard
            rb.shard_lengths()
        except RuntimeError as err:
            assert "Shard 1 of 2" in str(err) and "Ray restarts it (max_restarts=1)" in str(err)
        _wait_alive(rb)
        assert rb.shard_lengths() == [5, 3]
        assert _content(rb)[1] == list(zip(range(5, 8), (torch.arange(5, 8).float() / 10).tolist()))
    finally:
        rb.close()
