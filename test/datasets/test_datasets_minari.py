"""MinariExperienceReplay over local Minari datasets, both formats, checked against Minari's own reader.

The fixtures (test/datasets/data/minari_datasets, written by Minari 0.5.4: CartPole, random policy, one dataset
per format) are copied into ``tmp_path`` and ``MINARI_DATASETS_PATH`` points there, so nothing is written next to
the fixtures; sockets refuse to connect, so a test that tried the network would fail at once.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.extras import needs, require
from tensordict import TensorDict

from torchrl.data import (
    ImmutableDatasetWriter,
    ReplayBuffer,
    RoundRobinWriter,
    SliceSampler,
    tensordict_collate,
)
from torchrl.data.datasets import MinariExperienceReplay, load_dataset

FIXTURES = Path(__file__).resolve().parent / "data" / "minari_datasets"
IDS = {"hdf5": "cartpole/random-hdf5-v0", "arrow": "cartpole/random-arrow-v0"}
STEPS = {"hdf5": 48, "arrow": 46}
FORMATS = [pytest.param("hdf5", marks=needs("h5py")), "arrow"]


@pytest.fixture
def offline(monkeypatch):
    """Internet sockets refuse to connect (Unix sockets, which multiprocessing uses, still work)."""
    connect = socket.socket.connect

    def refuse(self, address, *args, **kwargs):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network access is disabled in these tests (connect to {address!r})")
        return connect(self, address, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def cache(tmp_path, monkeypatch, offline) -> Path:
    """A copy of the fixtures as Minari's local cache."""
    path = tmp_path / "minari_cache"
    shutil.copytree(FIXTURES, path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "torchrl_root"


def _minari_episodes(dataset_id: str):
    minari = require("minari")
    return list(minari.load_dataset(dataset_id).iterate_episodes())


def _rows(ds) -> TensorDict:
    return ds.storage[:]


# -- rows equal Minari's episodes ----------------------------------------------------------------------------
@needs("minari")
@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_equal_minari_episodes(cache, root, fmt):
    ds = MinariExperienceReplay(IDS[fmt], batch_size=4, root=root)
    rows = _rows(ds)
    episodes = _minari_episodes(IDS[fmt])
    assert len(ds) == STEPS[fmt] == sum(len(ep.actions) for ep in episodes)
    start = 0
    for ep in sorted(episodes, key=lambda e: e.id):
        t = len(ep.actions)
        part = rows[start : start + t]
        assert (part["episode"] == ep.id).all() and part["episode"].dtype == torch.int64
        np.testing.assert_array_equal(part["observation"].numpy(), ep.observations[:-1])
        np.testing.assert_array_equal(part["next", "observation"].numpy(), ep.observations[1:])
        np.testing.assert_array_equal(part["action"].numpy(), ep.actions)
        np.testing.assert_array_equal(part["next", "reward"].numpy(), ep.rewards.reshape(t, 1))
        np.testing.assert_array_equal(part["next", "terminated"].numpy(), ep.terminations.reshape(t, 1))
        np.testing.assert_array_equal(part["next", "truncated"].numpy(), ep.truncations.reshape(t, 1))
        done = (ep.terminations | ep.truncations).reshape(t, 1)
        np.testing.assert_array_equal(part["next", "done"].numpy(), done)
        assert part["next", "done"].dtype == torch.bool and part["next", "done"][-1].item()
        assert part["observation"].dtype == torch.float32 and part["next", "reward"].dtype == torch.float64
        start += t
    assert start == len(rows)
    for key in ("done", "terminated", "truncated", "reward"):
        assert key not in rows.keys()  # TorchRL's mapping: flags and reward only under "next"


@pytest.mark.parametrize("fmt", FORMATS)
def test_observation_shift_within_episodes(cache, root, fmt):
    rows = _rows(MinariExperienceReplay(IDS[fmt], batch_size=4, root=root))
    same = rows["episode"][1:] == rows["episode"][:-1]
    # inside an episode, the next observation of a step is the observation of the following step
    assert torch.equal(rows["next", "observation"][:-1][same], rows["observation"][1:][same])
    # done exactly at each episode's last step
    last = torch.cat([~same, torch.tensor([True])])
    assert torch.equal(rows["next", "done"].squeeze(-1), last)


def _toy_dataset(cache: Path, fmt: str) -> str:
    """A Minari dataset with a Dict observation space (a Text member) and infos, written by Minari."""
    minari = require("minari")
    from gymnasium import spaces
    from minari.data_collector import EpisodeBuffer

    obs_space = spaces.Dict(
        {
            "pos": spaces.Box(-10, 10, (2,), np.float32),
            "goal": spaces.Box(-10, 10, (3,), np.float64),
            "mission": spaces.Text(20),
        }
    )

    def episode(i, steps, truncated):
        rng = np.random.default_rng(i)
        return EpisodeBuffer(
            id=i,
            seed=i,
            observations={
                "pos": rng.normal(size=(steps + 1, 2)).astype(np.float32),
                "goal": rng.normal(size=(steps + 1, 3)),
                "mission": [f"m{i}-{t}" for t in range(steps + 1)],
            },
            actions=rng.uniform(-1, 1, size=(steps, 2)).astype(np.float32),
            rewards=list(rng.normal(size=steps)),
            terminations=[False] * (steps - 1) + [not truncated],
            truncations=[False] * (steps - 1) + [truncated],
            infos={
                "success": [False] * steps + [True],
                "dist": [float(v) for v in rng.normal(size=steps + 1)],
                "vec": rng.normal(size=(steps + 1, 2)),
            },
        )

    dataset_id = f"toy/dict-{fmt}-v0"
    with pytest.warns(UserWarning):  # Minari warns that no environment is given
        minari.create_dataset_from_buffers(
            dataset_id, [episode(0, 4, False), episode(1, 3, True)], observation_space=obs_space,
            action_space=spaces.Box(-1, 1, (2,), np.float32), data_format=fmt, algorithm_name="random",
            author="t", author_email="t@example.com", code_permalink="https://example.com", description="t",
        )  # fmt: skip
    return dataset_id


@needs("minari")
@pytest.mark.parametrize("fmt", FORMATS)
def test_dict_spaces_text_and_infos_equal_minari(cache, root, fmt):
    dataset_id = _toy_dataset(cache, fmt)
    rows = _rows(MinariExperienceReplay(dataset_id, batch_size=2, root=root))
    start = 0
    for ep in _minari_episodes(dataset_id):
        t = len(ep.actions)
        part = rows[start : start + t]
        for name in ("pos", "goal"):
            np.testing.assert_array_equal(part["observation", name].numpy(), ep.observations[name][:-1])
            np.testing.assert_array_equal(
                part["next", "observation", name].numpy(), ep.observations[name][1:]
            )
        assert part["observation", "goal"].dtype == torch.float64
        assert list(part["observation", "mission"]) == list(ep.observations["mission"][:-1])
        assert list(part["next", "observation", "mission"]) == list(ep.observations["mission"][1:])
        for name in ("success", "dist", "vec"):
            np.testing.assert_array_equal(part["info", name].numpy(), np.asarray(ep.infos[name])[:-1])
            np.testing.assert_array_equal(part["next", "info", name].numpy(), np.asarray(ep.infos[name])[1:])
        start += t
    assert start == len(rows) == 7
    assert rows["next", "truncated"].squeeze(-1).tolist() == [False] * 6 + [True]
    assert rows["next", "done"].squeeze(-1).tolist() == [False, False, False, True, False, False, True]


def _write_hdf5_dataset(cache: Path, dataset_id: str, infos_steps_offset: int, actions_len_offset: int = 0):
    """A Minari-layout HDF5 dataset written with h5py (infos of T + ``infos_steps_offset`` entries)."""
    h5py = require("h5py")
    data = cache / dataset_id / "data"
    data.mkdir(parents=True)
    box = {"type": "Box", "dtype": "float32", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]}
    metadata = {
        "data_format": "hdf5",
        "total_episodes": 1,
        "total_steps": 3,
        "observation_space": json.dumps(box),
        "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 3}),
    }
    (data / "metadata.json").write_text(json.dumps(metadata))
    with h5py.File(data / "main_data.hdf5", "w") as f:
        g = f.create_group("episode_0")
        g["observations"] = np.arange(8, dtype=np.float32).reshape(4, 2)
        g["actions"] = np.array([0, 1, 2] + [0] * actions_len_offset)
        g["rewards"] = np.array([1.0, 2.0, 3.0])
        g["terminations"] = np.array([False, False, True])
        g["truncations"] = np.array([False, False, False])
        g.create_group("infos")["x"] = np.array([10.0, 20.0, 30.0, 40.0][: 3 + infos_steps_offset])


@needs("h5py")
def test_info_with_one_entry_per_step_gets_a_zero_prepended(cache, root):
    _write_hdf5_dataset(cache, "toy/short-info-v0", infos_steps_offset=0)
    rows = _rows(MinariExperienceReplay("toy/short-info-v0", batch_size=2, root=root))
    assert rows["info", "x"].tolist() == [0.0, 10.0, 20.0]
    assert rows["next", "info", "x"].tolist() == [10.0, 20.0, 30.0]


@needs("h5py")
def test_mismatching_lengths_raise(cache, root):
    _write_hdf5_dataset(cache, "toy/bad-info-v0", infos_steps_offset=-1)
    with pytest.raises(RuntimeError, match="Mismatching number of steps for key"):
        MinariExperienceReplay("toy/bad-info-v0", batch_size=2, root=root)
    assert not (root / "toy" / "bad-info-v0").exists()  # nothing half-converted
    _write_hdf5_dataset(cache, "toy/bad-rewards-v0", infos_steps_offset=1, actions_len_offset=1)
    with pytest.raises(RuntimeError, match="Mismatching number of steps for key"):
        MinariExperienceReplay("toy/bad-rewards-v0", batch_size=2, root=root)


# -- conversion, paths, download -----------------------------------------------------------------------------
def test_converted_once_into_memmap_and_reopened_from_root(cache, root, tmp_path, monkeypatch):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    assert ds.data_path == ds.data_path_root == root / "cartpole" / "random-arrow-v0"
    assert ds.metadata_path == ds.data_path_root / "env_metadata.json" and ds.metadata_path.exists()
    assert (ds.data_path_root / "observation.memmap").exists()
    before = _rows(ds).clone()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "empty"))  # the source is gone
    again = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root, download=False)
    assert (_rows(again) == before).all()
    assert again.storage[:]["observation"].__class__.__name__ == "MemoryMappedTensor"
    assert again.metadata == ds.metadata


def test_metadata_holds_minari_spec_with_spaces(cache, root):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    assert ds.metadata["dataset_id"] == IDS["arrow"] and ds.metadata["total_steps"] == 46
    assert ds.metadata["observation_space"]["type"] == "Box" and ds.metadata["observation_space"][
        "shape"
    ] == [4]
    action_space = ds.metadata["action_space"]
    assert action_space == {"type": "Discrete", "dtype": "int64", "start": 0, "n": 2}
    actions = _rows(ds)["action"]
    assert ((actions >= action_space["start"]) & (actions < action_space["start"] + action_space["n"])).all()
    assert ds.metadata["env_spec"]["id"] == "CartPole-v1"


@pytest.mark.timeout(60)
def test_download_of_an_absent_dataset_fails_fast_naming_the_ways_out(cache, root):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="load_from_local_minari") as err:
        MinariExperienceReplay("mujoco/hopper/expert-v0", batch_size=4, root=root)
    assert "MINARI_DATASETS_PATH" in str(err.value) and "does not download" in str(err.value)
    assert time.monotonic() - start < 10
    assert not (root / "mujoco").exists()


def test_load_from_local_minari_missing_dataset(cache, root):
    with pytest.raises(FileNotFoundError, match="does not exist in local Minari cache!"):
        MinariExperienceReplay("cartpole/absent-v0", batch_size=4, root=root, load_from_local_minari=True)


def test_download_false_without_converted_copy(cache, root):
    with pytest.raises(FileNotFoundError, match="download=True"):
        MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root, download=False)


def test_force_and_load_from_local_minari_convert_again(cache, root):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    marker = ds.data_path_root / "marker"
    marker.write_text("x")
    MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root, download="force")
    assert not marker.exists()
    marker.write_text("x")
    again = MinariExperienceReplay(
        IDS["arrow"], batch_size=4, root=root, download=False, load_from_local_minari=True
    )
    assert not marker.exists() and len(again) == 46
    MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)  # already converted: opened, not rebuilt
    marker.write_text("x")
    MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    assert marker.exists()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"download": "yes"}, ValueError, "`download`"),
        ({"split_trajs": 1}, TypeError, "`split_trajs`"),
        ({"load_from_local_minari": "no"}, TypeError, "`load_from_local_minari`"),
    ],
)
def test_bad_arguments(cache, root, kwargs, error, match):
    with pytest.raises(error, match=match):
        MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root, **kwargs)
    assert not (root / "cartpole").exists()


@pytest.mark.parametrize("dataset_id", ["../escape", "/abs/path"])
def test_dataset_id_must_stay_under_root(cache, root, dataset_id):
    with pytest.raises(ValueError, match="`dataset_id`"):
        MinariExperienceReplay(dataset_id, batch_size=4, root=root)


def test_split_trajs(cache, root):
    flat = _rows(MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root))
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=2, root=root, split_trajs=True)
    assert ds.data_path == root / "cartpole" / "random-arrow-v0_split" and ds.data_path.exists()
    rows = _rows(ds)
    assert rows.batch_size == torch.Size([3, 17])
    assert rows["mask"].sum(-1).tolist() == [17, 14, 15]
    assert torch.equal(rows["observation"][rows["mask"]], flat["observation"])
    assert torch.equal(rows["traj_ids"][rows["mask"]], flat["episode"])
    assert (rows["observation"][~rows["mask"]] == 0).all()
    assert ds.sample()["observation"].shape == torch.Size([2, 17, 4])


# -- as a buffer -----------------------------------------------------------------------------------------------
def test_read_only_by_default_and_writer_override(cache, root):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    assert isinstance(ds.writer, ImmutableDatasetWriter)
    with pytest.raises(RuntimeError):
        ds.extend(_rows(ds)[:2].clone())
    assert len(ds) == 46
    sample = ds.sample()
    assert sample.batch_size == torch.Size([4]) and "index" in sample.keys()


def test_slice_sampler_never_crosses_episodes(cache, root):
    ds = MinariExperienceReplay(
        IDS["hdf5" if _has("h5py") else "arrow"], batch_size=30, root=root,
        sampler=SliceSampler(slice_len=5, traj_key="episode"),
    )  # fmt: skip
    for _ in range(5):
        episodes = ds.sample()["episode"].reshape(6, 5)
        assert (episodes == episodes[:, :1]).all()


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_dataloader_workers_read_the_dataset(cache, root):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=8, root=root)
    rows = _rows(ds)
    loader = torch.utils.data.DataLoader(
        ds.as_dataset(num_batches=4),
        batch_size=None,
        num_workers=2,
        collate_fn=tensordict_collate,
        timeout=60,
    )
    batches = list(loader)
    assert len(batches) == 4
    for batch in batches:
        assert torch.equal(batch["observation"], rows["observation"][batch["index"]])
    storage_loader = torch.utils.data.DataLoader(
        ds.storage.as_dataset(), batch_size=16, num_workers=2, collate_fn=tensordict_collate, timeout=60
    )
    assert torch.equal(torch.cat([b["observation"] for b in storage_loader]), rows["observation"])


def test_dumps_loads_round_trip(cache, root, tmp_path):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    ds.dumps(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "COMPLETE").exists()
    copy = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=tmp_path / "other_root")
    copy.loads(tmp_path / "ckpt")
    assert (copy.storage[:] == _rows(ds)).all() and isinstance(copy.writer, ImmutableDatasetWriter)
    with pytest.raises(ValueError, match="checkpoint"):  # another dataset's checkpoint does not fit
        MinariExperienceReplay(IDS["arrow"], batch_size=4, root=tmp_path / "r3", split_trajs=True).loads(
            tmp_path / "ckpt"
        )


@needs("datasets")
def test_export_hf_to_lerobot_in_two_lines(cache, root, tmp_path):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    with pytest.warns(UserWarning):  # the LeRobot layout says which keys it derives anew
        ds.export_hf(tmp_path / "lerobot", layout="lerobot")
    assert any((tmp_path / "lerobot").iterdir())
    # the default layout reloads losslessly
    ds.export_hf(tmp_path / "hf")
    back = ReplayBuffer.from_hf(tmp_path / "hf")
    assert torch.equal(back.storage[:]["next", "observation"], _rows(ds)["next", "observation"])


def test_load_dataset_minari_prefix(cache, root):
    ds = load_dataset(f"minari:{IDS['arrow']}", batch_size=4, root=root)
    assert isinstance(ds, MinariExperienceReplay) and len(ds) == 46


def test_writer_override_allows_writing(cache, root):
    ds = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root, writer=RoundRobinWriter())
    ds.extend(_rows(ds)[:2].clone())
    assert len(ds) == 46  # the storage is full: the write wrapped around


def test_interrupted_or_concurrent_conversion_leaves_one_complete_copy(cache, root):
    from torchrl.data.datasets._files import write_atomically

    first = MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root)
    # a second process finishing the same conversion later keeps the first copy, without error
    write_atomically(first.data_path_root, _rows(first).clone(), sidecars={"env_metadata.json": {}})
    assert MinariExperienceReplay(IDS["arrow"], batch_size=4, root=root).metadata["total_steps"] == 46
    assert not [p for p in (root / "cartpole").iterdir() if p.name.startswith(".")]  # no temporary leftovers


@needs("minari")
@needs("PIL")
@pytest.mark.parametrize("fmt", FORMATS)
def test_jpeg_images_and_tuple_actions_equal_minari(cache, root, fmt):
    minari = require("minari")
    from gymnasium import spaces
    from minari.data_collector import EpisodeBuffer

    def episode(i, steps):
        rng = np.random.default_rng(i)
        return EpisodeBuffer(
            id=i,
            observations=rng.integers(0, 255, size=(steps + 1, 32, 32, 3), dtype=np.uint8),
            actions=(rng.integers(0, 3, size=steps), rng.uniform(-1, 1, size=(steps, 2)).astype(np.float32)),
            rewards=list(rng.normal(size=steps)),
            terminations=[False] * (steps - 1) + [True],
            truncations=[False] * steps,
        )

    dataset_id = f"toy/img-{fmt}-v0"
    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            dataset_id, [episode(0, 4), episode(1, 3)],
            observation_space=spaces.Box(0, 255, (32, 32, 3), np.uint8),  # stored as JPEG by Minari
            action_space=spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32))),
            data_format=fmt, algorithm_name="random", author="t", author_email="t@example.com",
            code_permalink="https://example.com", description="t",
        )  # fmt: skip
    rows = _rows(MinariExperienceReplay(dataset_id, batch_size=2, root=root))
    start = 0
    for ep in _minari_episodes(dataset_id):
        t = len(ep.actions[0])
        part = rows[start : start + t]
        np.testing.assert_array_equal(part["observation"].numpy(), ep.observations[:-1])
        np.testing.assert_array_equal(part["next", "observation"].numpy(), ep.observations[1:])
        np.testing.assert_array_equal(part["action", "_index_0"].numpy(), ep.actions[0])
        np.testing.assert_array_equal(part["action", "_index_1"].numpy(), ep.actions[1])
        start += t
    assert start == len(rows) == 7 and rows["observation"].dtype == torch.uint8
