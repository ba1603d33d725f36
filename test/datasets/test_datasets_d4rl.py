"""D4RLExperienceReplay over a small D4RL-layout HDF5 file written here with h5py (TorchRL's mapping, offline)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.extras import require

from torchrl.data import ImmutableDatasetWriter, SliceSampler, tensordict_collate
from torchrl.data.datasets import D4RLExperienceReplay, load_dataset

h5py = require("h5py")

N = 8
TERMINALS = np.array([0, 0, 1, 0, 0, 0, 0, 0], dtype=bool)
TIMEOUTS = np.array([0, 0, 0, 0, 0, 1, 0, 0], dtype=bool)


def _write(path: Path, *, next_observations: bool = False, **extra) -> dict:
    data = {
        "observations": np.arange(N * 3, dtype=np.float32).reshape(N, 3),
        "actions": np.arange(N * 2, dtype=np.float32).reshape(N, 2) / 10,
        "rewards": np.arange(N, dtype=np.float32) + 0.5,
        "terminals": TERMINALS,
        "timeouts": TIMEOUTS,
        "infos/qpos": np.arange(N * 2, dtype=np.float64).reshape(N, 2) + 100,
    }
    if next_observations:
        data["next_observations"] = -np.arange(N * 3, dtype=np.float32).reshape(N, 3) - 1
    data.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, value in data.items():
            f[key] = value
        f["metadata/algorithm"] = b"SAC"
        f["metadata/policy/n_layers"] = np.int64(2)
    return data


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "d4rl_root"


def test_mapping_without_next_observations(root):
    raw = _write(root / "toy-v0.hdf5")
    ds = D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
    rows = ds.storage[:]
    assert len(ds) == N - 1  # the last row has no successor
    obs = torch.from_numpy(raw["observations"])
    assert torch.equal(rows["observation"], obs[:-1])
    assert torch.equal(rows["action"], torch.from_numpy(raw["actions"])[:-1])
    done = torch.from_numpy(TERMINALS | TIMEOUTS)[:-1].unsqueeze(-1)
    assert torch.equal(rows["next", "terminated"], torch.from_numpy(TERMINALS)[:-1].unsqueeze(-1))
    assert torch.equal(rows["next", "truncated"], torch.from_numpy(TIMEOUTS)[:-1].unsqueeze(-1))
    assert torch.equal(rows["next", "done"], done) and rows["next", "done"].dtype == torch.bool
    assert torch.equal(rows["next", "reward"], torch.from_numpy(raw["rewards"])[:-1].unsqueeze(-1))
    # next observation: the following row's, zeroed where the step is done
    expected = torch.where(done, torch.zeros(()), obs[1:])
    assert torch.equal(rows["next", "observation"], expected)
    qpos = torch.from_numpy(raw["infos/qpos"])
    assert torch.equal(rows["info", "qpos"], qpos[:-1]) and torch.equal(
        rows["next", "info", "qpos"], qpos[1:]
    )
    # root flags and reward: the previous row's values, zero on row 0 (TorchRL's layout)
    for key in ("reward", "done", "terminated", "truncated"):
        assert torch.equal(rows[key][1:], rows["next", key][:-1]) and not rows[key][0].any()
    assert "episode" not in rows.keys()
    assert ds.metadata == {"algorithm": "SAC", "policy/n_layers": 2}
    assert ds.specs is None and isinstance(ds.writer, ImmutableDatasetWriter)


def test_next_observations_used_when_present(root):
    raw = _write(root / "toy-v0.hdf5", next_observations=True)
    rows = D4RLExperienceReplay("toy-v0", batch_size=4, root=root).storage[:]
    done = rows["next", "done"]
    expected = torch.where(done, torch.zeros(()), torch.from_numpy(raw["next_observations"])[:-1])
    assert torch.equal(rows["next", "observation"], expected)


def test_use_truncated_as_done_false(root):
    _write(root / "toy-v0.hdf5")
    rows = D4RLExperienceReplay("toy-v0", batch_size=4, root=root, use_truncated_as_done=False).storage[:]
    assert torch.equal(rows["next", "done"], rows["next", "terminated"])
    assert rows["next", "truncated"].any()


def test_path_keyword_and_reopen_without_the_file(root, tmp_path):
    source = tmp_path / "elsewhere" / "file.hdf5"
    _write(source)
    ds = D4RLExperienceReplay("toy-v0", batch_size=4, root=root, path=source)
    assert ds.data_path == ds.data_path_root == root / "toy-v0"
    source.unlink()
    again = D4RLExperienceReplay("toy-v0", batch_size=4, root=root, download=False)
    assert (again.storage[:] == ds.storage[:]).all() and again.metadata == ds.metadata


def test_absent_dataset_errors(root):
    with pytest.raises(RuntimeError, match="The dataset could not be found in"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, download=False)
    with pytest.raises(RuntimeError, match="does not download") as err:
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
    assert "path=" in str(err.value)
    assert not (root / "toy-v0").exists()


def test_force_converts_again(root):
    _write(root / "toy-v0.hdf5")
    ds = D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
    (ds.data_path / "marker").write_text("x")
    D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
    assert (ds.data_path / "marker").exists()
    D4RLExperienceReplay("toy-v0", batch_size=4, root=root, download="force")
    assert not (ds.data_path / "marker").exists()


def test_split_trajs(root):
    _write(root / "toy-v0.hdf5")
    ds = D4RLExperienceReplay("toy-v0", batch_size=2, root=root, split_trajs=True)
    rows = ds.storage[:]
    assert rows.batch_size == torch.Size([3, 3])  # trajectories of 3, 3 and 1 steps (7 rows)
    assert rows["mask"].sum(-1).tolist() == [3, 3, 1]
    assert rows["next", "done"][:, -1].all()  # TorchRL sets done on the last column of every row
    assert rows["traj_ids"][rows["mask"]].tolist() == [0, 0, 0, 1, 1, 1, 2]


@pytest.mark.skipif(importlib.util.find_spec("d4rl") is not None, reason="d4rl is installed")
@pytest.mark.parametrize("kwargs", [{"from_env": True}, {"direct_download": False}])
def test_d4rl_routes_need_d4rl(root, kwargs):
    with pytest.raises(ImportError, match="Could not import d4rl"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, **kwargs)


def test_refused_arguments(root):
    _write(root / "toy-v0.hdf5")
    with pytest.raises(RuntimeError, match="Environment keyword arguments"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, frame_skip=2)
    with pytest.raises(ValueError, match="terminate_on_end=False"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, terminate_on_end=False)
    with pytest.raises(ValueError, match="`download`"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, download="always")
    with pytest.raises(TypeError, match="`split_trajs`"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, split_trajs="yes")
    assert not (root / "toy-v0").exists()


def test_not_a_d4rl_file(root):
    with h5py.File(root.parent / "x.hdf5", "w") as f:
        f["observations"] = np.zeros((3, 2))
    with pytest.raises(KeyError, match="not a D4RL file"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, path=root.parent / "x.hdf5")


def test_mismatching_lengths(root):
    _write(root / "toy-v0.hdf5", **{"infos/extra": np.zeros(N - 1)})
    with pytest.raises(RuntimeError, match="expected 8"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
    assert not (root / "toy-v0").exists()


def test_positional_arguments_follow_torchrl(root):
    _write(root / "toy-v0.hdf5")
    sampler = SliceSampler(slice_len=2, end_key=("next", "done"))
    ds = D4RLExperienceReplay("toy-v0", 4, sampler, None, None, False, None, None, False, False, True, None, None,
                              True, root)  # fmt: skip
    assert ds.sampler is sampler and ds.sample().batch_size == torch.Size([4])


def test_load_dataset_and_dataloader(root):
    _write(root / "toy-v0.hdf5")
    ds = load_dataset("d4rl:toy-v0", batch_size=4, root=root)
    assert isinstance(ds, D4RLExperienceReplay)
    loader = torch.utils.data.DataLoader(
        ds.as_dataset(num_batches=2), batch_size=None, num_workers=0, collate_fn=tensordict_collate
    )
    assert [b.batch_size for b in loader] == [torch.Size([4])] * 2


def test_converted_with_other_options_is_refused(root):
    _write(root / "toy-v0.hdf5")
    D4RLExperienceReplay("toy-v0", batch_size=4, root=root)
    with pytest.raises(ValueError, match="split_trajs=False"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, split_trajs=True)
    with pytest.raises(ValueError, match="download='force'"):
        D4RLExperienceReplay("toy-v0", batch_size=4, root=root, use_truncated_as_done=False)
    ds = D4RLExperienceReplay("toy-v0", batch_size=2, root=root, split_trajs=True, download="force")
    assert ds.storage[:].batch_size == torch.Size([3, 3])
