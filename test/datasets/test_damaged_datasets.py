"""Damaged or crafted dataset files are refused with an error naming the file and what is wrong, and nothing is
converted.

Each test damages a COPY of the fixtures (``test/datasets/data``, the same files as ``../shared/fixtures``,
written by Minari 0.5.4) in ``tmp_path``:

- a Minari dataset missing an episode (an Arrow episode directory, an HDF5 ``episode_<id>`` group), or whose
  ``total_steps`` disagrees with its episodes, is incomplete;
- an HDF5 file (Minari's, D4RL's) whose external link or virtual dataset reads a file outside its directory, an
  Arrow episode directory that is a link out of the dataset, and an HDF5 link loop are refused; a link to a file
  inside the directory is read like the data it points to;
- metadata that is no JSON (or JSON nested beyond what Python reads), a space that is no JSON object, and values
  that do not fill the shape their space gives raise a ``ValueError`` naming the file and the field; so does a
  converted LeRobot copy whose JSON is damaged.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import torch
from helpers.extras import needs, require

from torchrl.data.datasets import D4RLExperienceReplay, LeRobotExperienceReplay, MinariExperienceReplay

FIXTURES = Path(__file__).resolve().parent / "data" / "minari_datasets"
IDS = {"hdf5": "cartpole/random-hdf5-v0", "arrow": "cartpole/random-arrow-v0"}
FORMATS = [pytest.param("hdf5", marks=needs("h5py")), "arrow"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A writable copy of the fixtures as Minari's local cache."""
    path = tmp_path / "minari_cache"
    shutil.copytree(FIXTURES, path)
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            target = os.path.join(directory, name)
            os.chmod(target, os.stat(target).st_mode | stat.S_IWUSR)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "torchrl_root"


def _data(cache: Path, fmt: str) -> Path:
    return cache / IDS[fmt] / "data"


def _edit_metadata(cache: Path, fmt: str, mutate) -> None:
    path = _data(cache, fmt) / "metadata.json"
    document = json.loads(path.read_text())
    mutate(document)
    path.write_text(json.dumps(document))


def _refused(fmt, root, error, match) -> None:
    with pytest.raises(error, match=match):
        MinariExperienceReplay(IDS[fmt], batch_size=2, root=root)
    assert not (root / IDS[fmt]).exists()  # nothing converted


def _remove_episode(cache: Path, fmt: str, episode: int) -> None:
    if fmt == "arrow":
        shutil.rmtree(_data(cache, fmt) / str(episode))
    else:
        with require("h5py").File(_data(cache, fmt) / "main_data.hdf5", "r+") as file:
            del file[f"episode_{episode}"]


# -- incomplete datasets ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_missing_an_episode_is_refused_naming_it(cache, root, fmt):
    _remove_episode(cache, fmt, 1)
    source = "main_data.hdf5" if fmt == "hdf5" else "data"
    _refused(fmt, root, RuntimeError, rf"incomplete: .*total_episodes=3, and episode\(s\) \[1\] missing .*{source}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_whose_steps_disagree_with_its_metadata_is_refused(cache, root, fmt):
    _edit_metadata(cache, fmt, lambda d: d.update(total_steps=d["total_steps"] + 1))
    _refused(fmt, root, RuntimeError, r"incomplete: .*total_steps=\d+, and its episodes hold \d+ steps")


@pytest.mark.parametrize("value", [-1, "3", True])
def test_an_episode_count_that_is_no_count_is_refused(cache, root, value):
    _edit_metadata(cache, "arrow", lambda d: d.update(total_episodes=value))
    _refused("arrow", root, ValueError, rf"metadata.json.*`total_episodes` = {value!r}, expected an int >= 0")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_complete_copy_converts(cache, root, fmt):
    ds = MinariExperienceReplay(IDS[fmt], batch_size=2, root=root)
    assert len(ds) == {"hdf5": 48, "arrow": 46}[fmt]


# -- links leaving the dataset ---------------------------------------------------------------------------------
@needs("h5py")
def test_an_hdf5_external_link_out_of_the_dataset_is_refused(cache, root, tmp_path):
    h5py = require("h5py")
    outside = tmp_path / "elsewhere" / "secret.hdf5"
    outside.parent.mkdir()
    with h5py.File(outside, "w") as file:
        file["rewards"] = np.full(24, 7.0)
    with h5py.File(_data(cache, "hdf5") / "main_data.hdf5", "r+") as file:
        del file["episode_0/rewards"]
        file["episode_0/rewards"] = h5py.ExternalLink(str(outside), "/rewards")
    _refused("hdf5", root, ValueError, r"main_data.hdf5' refers to data outside its directory.*external link "
             r"'episode_0/rewards' points to .*secret.hdf5")  # fmt: skip


@needs("h5py")
def test_an_hdf5_external_link_inside_the_dataset_is_read(cache, root):
    h5py = require("h5py")
    data = _data(cache, "hdf5")
    with h5py.File(data / "main_data.hdf5", "r+") as file:
        rewards = file["episode_0/rewards"][()]
        with h5py.File(data / "rewards.hdf5", "w") as side:
            side["rewards"] = rewards * 2
        del file["episode_0/rewards"]
        file["episode_0/rewards"] = h5py.ExternalLink("rewards.hdf5", "/rewards")
    ds = MinariExperienceReplay(IDS["hdf5"], batch_size=2, root=root)
    assert torch.equal(ds.storage[:24]["next", "reward"].reshape(-1), torch.from_numpy(rewards * 2))


@needs("h5py")
def test_an_hdf5_virtual_dataset_reading_outside_the_dataset_is_refused(cache, root, tmp_path):
    h5py = require("h5py")
    outside = tmp_path / "elsewhere.hdf5"
    with h5py.File(outside, "w") as file:
        file["rewards"] = np.full(24, 7.0)
    layout = h5py.VirtualLayout(shape=(24,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(outside), "rewards", shape=(24,))
    with h5py.File(_data(cache, "hdf5") / "main_data.hdf5", "r+") as file:
        del file["episode_0/rewards"]
        file.create_virtual_dataset("episode_0/rewards", layout)
    _refused("hdf5", root, ValueError, r"virtual dataset 'episode_0/rewards' maps data of .*elsewhere.hdf5")


@needs("h5py")
def test_an_hdf5_link_loop_is_refused(cache, root):
    h5py = require("h5py")
    with h5py.File(_data(cache, "hdf5") / "main_data.hdf5", "r+") as file:
        file["episode_1/infos/again"] = h5py.SoftLink("/episode_1/infos")
    _refused("hdf5", root, ValueError, r"main_data.hdf5' holds a link loop: '/episode_1/infos/again'")


def test_an_arrow_episode_linked_from_outside_the_dataset_is_refused(cache, root, tmp_path):
    data = _data(cache, "arrow")
    shutil.move(data / "2", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", data / "2")
    _refused("arrow", root, ValueError, r"episode directory .*/2' is a link to .*elsewhere', outside the dataset")


@needs("h5py")
def test_a_d4rl_file_linking_out_of_its_directory_is_refused(tmp_path):
    h5py = require("h5py")
    n, root = 6, tmp_path / "d4rl_root"
    root.mkdir()
    outside = tmp_path / "secret.hdf5"
    with h5py.File(outside, "w") as file:
        file["rewards"] = np.ones(n, dtype=np.float32)
    layout = h5py.VirtualLayout(shape=(n,), dtype="f4")
    layout[:] = h5py.VirtualSource(str(outside), "rewards", shape=(n,))
    with h5py.File(root / "toy-v0.hdf5", "w") as file:
        file["observations"] = np.zeros((n, 3), dtype=np.float32)
        file["actions"] = np.zeros((n, 2), dtype=np.float32)
        file["terminals"] = np.zeros(n, dtype=bool)
        file.create_virtual_dataset("rewards", layout)
    with pytest.raises(ValueError, match=r"toy-v0.hdf5' refers to data outside its directory.*'rewards'"):
        D4RLExperienceReplay("toy-v0", batch_size=2, root=root)
    assert not (root / "toy-v0").exists()


# -- reader errors name the file and the field -----------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("text, problem", [("{not json", "JSONDecodeError"), ("[" * 100_000, "RecursionError")])
def test_metadata_that_is_no_json_is_refused_naming_the_file(cache, root, fmt, text, problem):
    (_data(cache, fmt) / "metadata.json").write_text(text)
    _refused(fmt, root, ValueError, rf"metadata file '.*{IDS[fmt]}/data/metadata.json' is not readable JSON "
             rf"\({problem}")  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "space, problem",
    [
        ('{"type": ', r"is not readable JSON \(JSONDecodeError"),
        ("[1, 2]", r"is JSON of a list, expected an object"),
    ],
)
def test_a_space_that_is_no_json_object_is_refused_naming_the_field(cache, root, fmt, space, problem):
    _edit_metadata(cache, fmt, lambda d: d.update(observation_space=space))
    _refused(fmt, root, ValueError, rf"`observation_space` of .*{IDS[fmt]}/data {problem}")


def test_values_that_do_not_fill_their_space_shape_are_refused_naming_the_field(cache, root):
    def wrong_shape(document):
        space = json.loads(document["observation_space"])
        space["shape"] = [5]  # the rows hold 4 values
        document["observation_space"] = json.dumps(space)

    _edit_metadata(cache, "arrow", wrong_shape)
    _refused("arrow", root, ValueError, r"field 'observations' of the Minari episode directory '.*/0' holds 72 "
             r"values for 18 rows, which do not fill rows of shape \[5\]")  # fmt: skip


def test_a_damaged_converted_lerobot_copy_is_refused_naming_the_file(tmp_path):
    source = Path(__file__).resolve().parent / "data" / "lerobot_v30_cartpole_like"
    ds = LeRobotExperienceReplay.from_local(source, root=tmp_path, batch_size=5)
    (ds.data_path / "lerobot_info.json").write_text('{"fps": ')
    match = r"lerobot_info.json' is not readable JSON \(JSONDecodeError.*download='force'"
    with pytest.raises(ValueError, match=match):
        LeRobotExperienceReplay.from_local(source, root=tmp_path, batch_size=5, download=False)


@needs("h5py")
def test_an_unreadable_hdf5_file_is_refused_naming_it(cache, root):
    (_data(cache, "hdf5") / "main_data.hdf5").write_bytes(b"not an hdf5 file" * 64)
    _refused("hdf5", root, ValueError, r"Minari file '.*main_data.hdf5' is not a readable HDF5 file")


@needs("h5py")
def test_hdf5_text_that_is_no_utf8_is_refused_naming_the_field(cache, root):
    h5py = require("h5py")
    with h5py.File(_data(cache, "hdf5") / "main_data.hdf5", "r+") as file:
        file["episode_0/infos/text"] = np.array([b"\xff\xfe"] * 25, dtype="S2")
    _refused("hdf5", root, ValueError, r"field '/episode_0/infos/text' of the Minari file '.*main_data.hdf5' "
             r"cannot be read \(UnicodeDecodeError")  # fmt: skip


@needs("h5py")
def test_hdf5_groups_nested_without_end_are_refused(cache, root):
    h5py = require("h5py")
    with h5py.File(_data(cache, "hdf5") / "main_data.hdf5", "r+") as file:
        file.create_group("episode_0/infos/" + "/".join(["g"] * 80))
    _refused("hdf5", root, ValueError, r"group '/episode_0/infos/g/.*' of the Minari file .* is nested 64 groups deep")


def test_an_unreadable_arrow_episode_is_refused_naming_its_directory(cache, root):
    part = _data(cache, "arrow") / "1" / "part-0.arrow"
    part.write_bytes(part.read_bytes()[:100])
    _refused("arrow", root, ValueError, r"Minari episode directory '.*/data/1' holds no readable Arrow file")


def test_a_tuple_space_whose_member_is_not_numbered_is_refused_naming_the_field(cache, root):
    discrete = {"type": "Discrete", "dtype": "int64", "start": 0, "n": 2}
    space = json.dumps({"type": "Tuple", "subspaces": [discrete]})
    _edit_metadata(cache, "arrow", lambda d: d.update(action_space=space))
    for episode in (0, 1, 2):
        part = _data(cache, "arrow") / str(episode) / "part-0.arrow"
        with ipc.open_file(part) as reader:
            table = reader.read_all()
        actions = pa.StructArray.from_arrays([table.column("actions").combine_chunks()], names=["first"])
        table = table.set_column(table.schema.get_field_index("actions"), "actions", actions)
        with ipc.new_file(part, table.schema) as writer:
            writer.write_table(table)
    _refused("arrow", root, ValueError, r"field 'actions' of the Minari episode directory '.*/0' is a Tuple space "
             r"whose member 'first' is not numbered")  # fmt: skip
