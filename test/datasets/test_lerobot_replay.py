"""LeRobotExperienceReplay over a LeRobot v3.0 directory written by LeRobot 0.6.1 (test/datasets/data/
lerobot_v30_cartpole_like), converted once into memory-mapped files under ``root`` and re-opened from there;
``from_columns`` and ``lerobot_columns_to_tensordict``; TorchRL's arguments and errors. The Hub is never reached:
``HF_HUB_OFFLINE=1`` and internet sockets refuse to connect.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

require("datasets")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from torchrl.data import (  # noqa: E402
    ImmutableDatasetWriter,
    RandomSampler,
    RoundRobinWriter,
    SliceSampler,
    tensordict_collate,
)
from torchrl.data.datasets import (  # noqa: E402
    BaseDatasetExperienceReplay,
    LeRobotExperienceReplay,
    lerobot_columns_to_tensordict,
    load_dataset,
)

pytestmark = pytest.mark.extras

FIXTURE = Path(__file__).resolve().parent / "data" / "lerobot_v30_cartpole_like"
DATA = "data/chunk-000/file-000.parquet"
NAME = "local/lerobot_v30_cartpole_like"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """The Hub is off (HF_HUB_OFFLINE=1) and internet sockets refuse to connect."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    connect = socket.socket.connect

    def refuse(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError("network access is disabled in this test")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", refuse)


def frames() -> dict:
    table = pq.read_table(FIXTURE / DATA)
    state = table.column("observation.state").combine_chunks()
    return {
        "state": state.flatten().to_numpy().reshape(-1, 4),
        **{
            c: table.column(c).to_numpy()
            for c in ("next.reward", "next.done", "episode_index", "frame_index")
        },
    }


def copy_fixture(tmp_path) -> Path:
    target = tmp_path / "source"
    shutil.copytree(FIXTURE, target)
    return target


def test_from_local_converts_once_and_reopens_from_root(tmp_path):
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=5)
    assert isinstance(ds, BaseDatasetExperienceReplay) and len(ds) == 150
    assert ds.data_path == ds.data_path_root == tmp_path / "local_lerobot_v30_cartpole_like"
    assert {"lerobot_info.json", "lerobot_source.json", "meta.json"} <= {
        p.name for p in ds.data_path.iterdir()
    }
    td, expected = ds[:], frames()
    assert np.array_equal(td["observation", "state"].numpy(), expected["state"])  # bit for bit
    assert np.array_equal(td["next", "reward"].numpy()[:, 0], expected["next.reward"])
    assert td["next", "done"].shape == (150, 1) and td["episode"].shape == (150,)
    assert np.array_equal(td["episode"].numpy(), expected["episode_index"])
    assert np.array_equal(td["frame"].numpy(), expected["frame_index"])
    assert (
        td["language_instruction"][120] == "push the cube"
        and td["language_instruction"][60] == "pull the cube"
    )
    assert ds.metadata["fps"] == 10 and ds.metadata["codebase_version"] == "v3.0"
    assert ds.metadata["tasks"] == {0: "push the cube", 1: "pull the cube"}
    assert isinstance(ds.writer, ImmutableDatasetWriter) and ds.sample()["observation", "state"].shape == (
        5,
        4,
    )
    stamp = (ds.data_path / "meta.json").stat().st_mtime_ns
    again = LeRobotExperienceReplay(
        NAME, root=tmp_path, download=False, batch_size=5
    )  # TorchRL's constructor
    assert len(again) == 150 and (again.data_path / "meta.json").stat().st_mtime_ns == stamp
    reopened = LeRobotExperienceReplay.from_local(
        FIXTURE, root=tmp_path
    )  # the source is unchanged: no reconversion
    assert (reopened.data_path / "meta.json").stat().st_mtime_ns == stamp


def test_a_changed_local_source_is_converted_again(tmp_path):
    source = copy_fixture(tmp_path)
    ds = LeRobotExperienceReplay.from_local(source, root=tmp_path / "cache")
    table = pq.read_table(source / DATA)
    state = table.column("observation.state").combine_chunks()
    values = state.flatten().to_numpy().copy() + 1
    table = table.set_column(0, "observation.state", pa.FixedSizeListArray.from_arrays(pa.array(values), 4))
    time.sleep(0.01)
    pq.write_table(table, source / DATA)
    updated = LeRobotExperienceReplay.from_local(source, root=tmp_path / "cache")
    assert torch.equal(updated[:]["observation", "state"], ds[:]["observation", "state"] + 1)
    forced = LeRobotExperienceReplay.from_local(source, root=tmp_path / "cache", download="force")
    assert len(forced) == 150
    forced.delete()
    assert not forced.data_path.exists() and (source / DATA).exists()  # delete() never touches the source


def test_root_may_be_the_lerobot_directory_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ds = LeRobotExperienceReplay("my/robot", root=FIXTURE, batch_size=4)  # LeRobot's meaning of root
    assert ds.data_path == tmp_path / "home" / ".cache" / "torchrl" / "lerobot" / "my_robot"
    assert len(ds) == 150 and ds.source == FIXTURE.resolve()


def test_not_converted_and_download_false_raises_torchrls_error(tmp_path):
    with pytest.raises(RuntimeError, match="Dataset 'lerobot/pusht' not found at"):
        LeRobotExperienceReplay("lerobot/pusht", root=tmp_path, download=False)


def test_download_offline_fails_fast_with_the_local_route(tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="could not be fetched.*HF_HUB_OFFLINE.*from_local"):
        LeRobotExperienceReplay("lerobot/pusht", root=tmp_path)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "lerobot_pusht").exists()


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="num_slices or slice_len can be passed, but not both."):
        LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, num_slices=2, slice_len=4, batch_size=8)
    with pytest.raises(ValueError, match="`download` must be True, False or 'force'"):
        LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, download="yes")
    with pytest.raises(TypeError, match="`repo_id` must be a non-empty str"):
        LeRobotExperienceReplay("", root=tmp_path)
    with pytest.raises(ValueError, match="`repo_id` must be a Hub id"):
        LeRobotExperienceReplay("../x", root=tmp_path)
    with pytest.raises(ValueError, match="`path` must be a LeRobot dataset directory"):
        LeRobotExperienceReplay.from_local(tmp_path, root=tmp_path)
    with pytest.raises(TypeError, match="`key_map` must be a mapping"):
        LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, key_map=["a"])
    with pytest.raises(TypeError, match="`rehydrate` must be a bool"):
        LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, rehydrate="yes")


@pytest.mark.parametrize("how", ["slice_len", "num_slices"])
def test_slices_stay_inside_episodes(tmp_path, how):
    kwargs = {"slice_len": 5} if how == "slice_len" else {"num_slices": 4}
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=20, **kwargs)
    assert isinstance(ds.sampler, SliceSampler)
    for _ in range(5):
        batch = ds.sample()
        episodes, steps = batch["episode"].view(4, 5), batch["frame"].view(4, 5)
        assert (episodes == episodes[:, :1]).all() and (steps.diff(dim=1) == 1).all()
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=20, sampler=RandomSampler(),
                                            **kwargs)  # fmt: skip
    assert isinstance(ds.sampler, RandomSampler)  # an explicit sampler wins


def test_strict_length_false_allows_short_episodes(tmp_path):
    ds = LeRobotExperienceReplay.from_local(
        FIXTURE, root=tmp_path, batch_size=60, slice_len=60, strict_length=False
    )
    assert ds.sample().shape[0] <= 60
    strict = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=60, slice_len=60)
    with pytest.raises((RuntimeError, ValueError)):
        strict.sample()  # no episode holds 60 frames


def test_rehydrate_rebuilds_the_next_state_within_an_episode(tmp_path):
    ds = LeRobotExperienceReplay.from_local(
        FIXTURE, root=tmp_path, batch_size=40, slice_len=10, rehydrate=True
    )
    batch = ds.sample()
    state, nxt = batch["observation", "state"], batch["next", "observation", "state"]
    # a row followed by the next frame of its episode gets that frame's state, also at the end of a slice (the
    # sampler flags it done) when the next slice happens to continue the episode: it is the true next state
    same = (batch["episode"][1:] == batch["episode"][:-1]) & (batch["frame"][1:] == batch["frame"][:-1] + 1)
    assert torch.equal(nxt[:-1][same], state[1:][same])
    assert torch.isnan(nxt[:-1][~same]).all() and torch.isnan(nxt[-1]).all()
    assert ("next", "observation") not in ds.storage[:].keys(True)  # nothing stored: rebuilt at sample time


def test_rehydrate_fills_integer_frames_with_zero_and_needs_an_episode():
    pixels = torch.arange(6, dtype=torch.uint8).view(6, 1, 1).expand(6, 2, 2).contiguous()
    ds = LeRobotExperienceReplay.from_columns(
        {"observation.images.top": pixels, "episode_index": [0, 0, 0, 1, 1, 1], "frame_index": [0, 1, 2, 0, 1, 2]},
        batch_size=6, sampler=SliceSampler(slice_len=3, traj_key="episode"), rehydrate=True)  # fmt: skip
    batch = ds.sample()
    nxt = batch["next", "observation", "image", "top"]
    assert nxt.dtype == torch.uint8
    first = batch["observation", "image", "top"]
    assert torch.equal(nxt[0], first[1]) and (nxt[2] == 0).all()
    with pytest.raises(ValueError, match="rehydrate=True.*'episode'"):
        LeRobotExperienceReplay.from_columns({"observation.state": torch.zeros(4, 2)}, rehydrate=True)
    with pytest.warns(UserWarning, match="no \\('frame',\\) entry"):
        LeRobotExperienceReplay.from_columns({"observation.state": torch.zeros(4, 2), "episode_index": [0] * 4},
                                             rehydrate=True)  # fmt: skip


def test_user_transform_runs_after_the_reconstruction(tmp_path):
    seen = []

    def record(td):
        seen.append(("next", "observation", "state") in td.keys(True, True))
        return td

    from torchrl.envs.transforms import Transform

    class Record(Transform):
        def forward(self, td):
            return record(td)

    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=4, slice_len=2, rehydrate=True,
                                            transform=Record())  # fmt: skip
    ds.sample()
    assert seen == [True]


def test_the_dataset_is_read_only_unless_given_a_writer(tmp_path):
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=4)
    with pytest.raises(RuntimeError, match="This dataset doesn't allow writing."):
        ds.extend(ds[:2])
    writable = LeRobotExperienceReplay.from_columns({"action": torch.zeros(4, 1)}, writer=RoundRobinWriter())
    writable.extend(TensorDict(action=torch.ones(2, 1), batch_size=[2]))
    assert writable[:]["action"].sum() == 2


def test_from_columns_creates_no_directory(tmp_path):
    root = tmp_path / "never"
    ds = LeRobotExperienceReplay.from_columns(
        {"observation.state": torch.randn(6, 3), "action": np.zeros((6, 2), np.float32),
         "next.reward": [0.0] * 6, "next.done": [False] * 5 + [True], "episode_index": [0] * 6,
         "task": ["reach"] * 6}, repo_id="mine", root=root, batch_size=3)  # fmt: skip
    assert not root.exists() and len(ds) == 6 and ds.repo_id == "mine"
    batch = ds.sample()
    assert batch["next", "done"].shape == (3, 1) and batch["language_instruction"].tolist() == ["reach"] * 3
    ds.delete()  # nothing to remove
    assert not root.exists()


def test_lerobot_columns_to_tensordict_maps_torchrls_keys():
    td = lerobot_columns_to_tensordict(
        {"observation.state": torch.zeros(2, 3), "observation.images.wrist": torch.zeros(2, 3, 4, 4),
         "observation.environment_state": torch.zeros(2, 5), "action": torch.zeros(2, 1),
         "next.reward": torch.zeros(2), "next.done": [False, True], "next.success": torch.zeros(2, 1),
         "episode_index": [0, 0], "frame_index": [0, 1], "index": [0, 1], "timestamp": [0.0, 0.1],
         "task_index": [1, 0]}, tasks=["a", "b"])  # fmt: skip
    assert td["observation", "image", "wrist"].shape == (2, 3, 4, 4)
    assert td["observation", "environment_state"].shape == (2, 5)
    assert td["next", "reward"].shape == (2, 1) and td["next", "done"].shape == (2, 1)
    assert td["next", "success"].shape == (2, 1) and td["episode"].shape == (2,) and td["frame"].shape == (2,)
    assert td["language_instruction"].tolist() == ["b", "a"]  # task_index resolved with the task table
    mapped = lerobot_columns_to_tensordict(
        {"observation.state": torch.zeros(2, 3), "action": [1, 2]},
        key_map={"observation.state": "obs", "action": ("act", "x")},
    )
    assert set(mapped.keys(True, True)) == {"obs", ("act", "x")}


def test_lerobot_columns_to_tensordict_refuses_bad_columns():
    with pytest.raises(ValueError, match="mixes strings"):
        lerobot_columns_to_tensordict({"task": ["a", 1]})
    with pytest.raises(ValueError, match="holds no column"):
        lerobot_columns_to_tensordict({})
    with pytest.raises(ValueError, match="'action' has 3 values but the first column has 2"):
        lerobot_columns_to_tensordict({"frame_index": [0, 1], "action": torch.zeros(3)})
    with pytest.raises(TypeError, match="`columns` must be a mapping"):
        lerobot_columns_to_tensordict([("a", [1])])
    with pytest.raises(TypeError, match="'action' holds a set"):
        lerobot_columns_to_tensordict({"action": {1, 2}})
    with pytest.raises(ValueError, match="`task_index` 3 is not in `tasks`"):
        lerobot_columns_to_tensordict({"task_index": [3]}, tasks={0: "a"})
    with pytest.raises(ValueError, match="Two columns map to the key"):
        lerobot_columns_to_tensordict({"action": [1], "act": [2]}, key_map={"act": "action"})


def test_key_map_renames_and_a_new_key_map_converts_again(tmp_path):
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, key_map={"observation.state": "obs"},
                                            batch_size=4, slice_len=2)  # fmt: skip
    assert "obs" in ds[:].keys() and ("observation", "state") not in ds[:].keys(True)
    plain = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path)
    assert ("observation", "state") in plain[:].keys(True)


def test_video_features_left_out_when_decode_video_is_false(tmp_path):
    source = copy_fixture(tmp_path)
    info = json.loads((source / "meta/info.json").read_text())
    info["features"]["observation.images.top"] = {"dtype": "video", "shape": [8, 8, 3], "names": None}
    (source / "meta/info.json").write_text(json.dumps(info))
    with pytest.warns(UserWarning, match="decode_video=False.*observation.images.top"):
        ds = LeRobotExperienceReplay.from_local(source, root=tmp_path / "c", decode_video=False)
    assert ("observation", "image", "top") not in ds[:].keys(True)
    if not any(__import__("importlib").util.find_spec(m) for m in ("torchcodec", "av")):
        with pytest.raises(ImportError, match="torchcodec"):
            LeRobotExperienceReplay.from_local(source, root=tmp_path / "d")


def test_load_dataset_opens_a_converted_dataset(tmp_path):
    LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path)
    ds = load_dataset(f"lerobot:{NAME}", root=tmp_path, download=False, batch_size=3)
    assert isinstance(ds, LeRobotExperienceReplay) and ds.sample().batch_size == (3,)


def test_dumps_and_loads_round_trip(tmp_path):
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path / "cache", batch_size=4, slice_len=2)
    ds.dumps(tmp_path / "ckpt")
    other = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path / "cache", batch_size=4, slice_len=2)
    other.loads(tmp_path / "ckpt")
    assert len(other) == 150
    assert torch.equal(other[:]["observation", "state"], ds[:]["observation", "state"])
    assert other[:]["language_instruction"].tolist() == ds[:]["language_instruction"].tolist()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_as_dataset_with_dataloader_workers(tmp_path):
    ds = LeRobotExperienceReplay.from_local(FIXTURE, root=tmp_path, batch_size=10, slice_len=5)
    loader = torch.utils.data.DataLoader(ds.as_dataset(num_batches=4), batch_size=None, num_workers=2,
                                         collate_fn=tensordict_collate, timeout=60)  # fmt: skip
    batches = list(loader)
    assert len(batches) == 4
    for batch in batches:
        episodes = batch["episode"].view(2, 5)
        assert (episodes == episodes[:, :1]).all() and batch["observation", "state"].shape == (10, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage_loader = torch.utils.data.DataLoader(ds.storage.as_dataset(), batch_size=50, num_workers=2,
                                                     collate_fn=tensordict_collate, timeout=60)  # fmt: skip
        total = sum(b.batch_size[0] for b in storage_loader)
    assert total == 150
