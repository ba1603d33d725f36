"""Two TorchRL names of the dataset classes: ``LeRobotExperienceReplay(_data=...)`` (TorchRL's private keyword for
frames already in memory, what ``from_columns`` passes) and ``MinariExperienceReplay.available_datasets`` (a class
property; TorchRL lists Minari's remote datasets, this package, which works offline, lists Minari's local cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers.extras import needs

from torchrl.data.datasets import (
    LeRobotExperienceReplay,
    MinariExperienceReplay,
    lerobot_columns_to_tensordict,
)

MINARI_FIXTURES = Path(__file__).resolve().parent / "data" / "minari_datasets"


def _frames():
    return lerobot_columns_to_tensordict(
        {"observation.state": torch.arange(8.0).unsqueeze(-1), "episode_index": [0] * 4 + [1] * 4,
         "frame_index": [0, 1, 2, 3] * 2}  # fmt: skip
    )


def test_lerobot_data_keyword_serves_frames_in_memory_and_writes_nothing(tmp_path):
    frames = _frames()
    ds = LeRobotExperienceReplay("local/frames", root=tmp_path, download=True, _data=frames, batch_size=4,
                                 slice_len=2)
    assert len(ds) == 8 and ds.repo_id == "local/frames" and ds.root == tmp_path and ds.metadata == {}
    batch = ds.sample()
    assert batch["observation", "state"].shape == (4, 1)
    assert (batch["episode"][:2] == batch["episode"][0]).all()  # slices stay in one episode
    assert list(tmp_path.iterdir()) == []  # nothing converted or downloaded


def test_from_columns_and_the_data_keyword_give_the_same_dataset():
    columns = {"observation.state": torch.arange(8.0).unsqueeze(-1), "episode_index": [0] * 4 + [1] * 4,
               "frame_index": [0, 1, 2, 3] * 2}
    a = LeRobotExperienceReplay.from_columns(columns, repo_id="local/a", batch_size=2)
    b = LeRobotExperienceReplay("local/a", _data=lerobot_columns_to_tensordict(columns), batch_size=2)
    assert (a[:] == b[:]).all() and a.repo_id == b.repo_id


@pytest.mark.parametrize("bad", [{"observation.state": [1.0]}, torch.zeros(3)])
def test_lerobot_data_keyword_refuses_what_is_not_a_tensordict_of_frames(bad):
    with pytest.raises(TypeError, match="`_data` must be a TensorDict of frames with batch size \\[N\\].*from_columns"):
        LeRobotExperienceReplay("local/x", _data=bad)


def test_lerobot_data_keyword_refuses_a_tensordict_without_one_batch_dim():
    with pytest.raises(TypeError, match=r"with batch size \[\]"):
        LeRobotExperienceReplay("local/x", _data=_frames()[0])


def test_minari_available_datasets_lists_the_local_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    shutil.copytree(MINARI_FIXTURES, cache)
    (cache / "other" / "not-a-dataset" / "data").mkdir(parents=True)  # no metadata.json: not a dataset
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(cache))
    assert MinariExperienceReplay.available_datasets == ["cartpole/random-arrow-v0", "cartpole/random-hdf5-v0"]


@pytest.mark.parametrize("dataset_id", ["cartpole/random-arrow-v0",
                                        pytest.param("cartpole/random-hdf5-v0", marks=needs("h5py"))])
def test_each_listed_dataset_opens_from_the_local_cache(dataset_id, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(MINARI_FIXTURES))
    assert dataset_id in MinariExperienceReplay.available_datasets
    ds = MinariExperienceReplay(dataset_id, batch_size=2, root=tmp_path)
    assert len(ds) > 0 and ds.sample()["observation"].shape[0] == 2


def test_minari_available_datasets_is_empty_without_a_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "missing"))
    assert MinariExperienceReplay.available_datasets == []
    ds_class_attr = MinariExperienceReplay.__dict__["available_datasets"]
    assert ds_class_attr.__doc__.startswith("The ids of the datasets this class can open")
