"""Reading a LeRobot v3.0 directory (written by LeRobot 0.6.1 itself) with ``ReplayBuffer.from_hf``,
``rb.extend_from_hf`` and ``DatasetStorage(path)``: TorchRL's keys, values bit for bit equal to the parquet files
(read here with pyarrow), ``[N, 1]`` rewards and flags, task texts; and the directories that are refused.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.extras import require
from tensordict import is_leaf_nontensor

require("datasets")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from torchrl.data import (  # noqa: E402
    DatasetStorage,
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    tensordict_collate,
)
from torchrl.data.replay_buffers.hf.lerobot_frames import LeRobotFrames  # noqa: E402

pytestmark = pytest.mark.extras

FIXTURE = Path(__file__).resolve().parents[1] / "datasets" / "data" / "lerobot_v30_cartpole_like"
DATA = FIXTURE / "data" / "chunk-000" / "file-000.parquet"
#: column -> (key, row shape in the buffer) as TorchRL's LeRobotExperienceReplay maps them
MAPPING = {
    "observation.state": (("observation", "state"), (4,)),
    "action": (("action",), (2,)),
    "next.reward": (("next", "reward"), (1,)),
    "next.done": (("next", "done"), (1,)),
    "timestamp": (("timestamp",), ()),
    "frame_index": (("frame",), ()),
    "episode_index": (("episode",), ()),
    "index": (("index",), ()),
    "task_index": (("task_index",), ()),
}


def keys_of(td) -> set:
    keys = td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor)
    return {(k,) if isinstance(k, str) else k for k in keys}


def parquet_columns() -> dict[str, np.ndarray]:
    table = pq.read_table(DATA)
    out = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            out[name] = column.flatten().to_numpy().reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def task_texts() -> dict[int, str]:
    table = pq.read_table(FIXTURE / "meta" / "tasks.parquet").to_pydict()
    return dict(zip(table["task_index"], table["task"]))


def assert_fixture_frames(td, rows=None) -> None:
    columns = parquet_columns()
    rows = np.arange(150) if rows is None else np.asarray(rows)
    for column, (key, shape) in MAPPING.items():
        value = td.get(key)
        expected = columns[column][rows]
        assert tuple(value.shape) == (len(rows), *shape), column
        assert value.numpy().dtype == expected.dtype, column
        assert np.array_equal(value.numpy().reshape(expected.shape), expected), column  # bit for bit
    texts = task_texts()
    assert td["language_instruction"].tolist() == [texts[int(i)] for i in columns["task_index"][rows]]


def copy_fixture(tmp_path) -> Path:
    target = tmp_path / "dataset"
    shutil.copytree(FIXTURE, target)
    return target


def edit_info(path: Path, **changes) -> None:
    info_path = path / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    for key, value in changes.items():
        if value is None:
            info.pop(key, None)
        else:
            info[key] = value
    info_path.write_text(json.dumps(info))


def test_from_hf_reads_the_fixture_bit_for_bit():
    rb = ReplayBuffer.from_hf(FIXTURE, batch_size=4)
    assert len(rb) == 150
    td = rb[:]
    assert keys_of(td) == {k for k, _ in MAPPING.values()} | {("language_instruction",)}
    assert_fixture_frames(td)
    assert td["language_instruction"][50] == "pull the cube" and td["language_instruction"][0] == "push the cube"
    assert td["next", "done"].dtype == torch.bool and td["next", "done"][49].item() and not td["next", "done"][48]


def test_extend_from_hf_into_a_memmap_buffer(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(200, scratch_dir=tmp_path / "mm"))
    assert rb.extend_from_hf(FIXTURE) == 150
    assert_fixture_frames(rb[:])
    small = ReplayBuffer(storage=LazyTensorStorage(100))
    small.extend_from_hf(FIXTURE)  # a ring buffer keeps the newest rows
    assert torch.equal(small[:]["index"].sort().values, torch.arange(50, 150))


def test_columns_select_and_rename():
    rb = ReplayBuffer.from_hf(FIXTURE, columns=["observation.state", "next.reward", "task"])
    td = rb[:]
    assert keys_of(td) == {("observation", "state"), ("next", "reward"), ("language_instruction",)}
    assert td["next", "reward"].shape == (150, 1)
    renamed = ReplayBuffer.from_hf(FIXTURE, columns={"observation.state": "obs", "episode_index": "traj"})[:]
    assert set(renamed.keys()) == {"obs", "traj"}
    assert np.array_equal(renamed["traj"].numpy(), parquet_columns()["episode_index"])
    with pytest.raises(ValueError, match="Unknown columns \\['nope'\\]"):
        ReplayBuffer.from_hf(FIXTURE, columns=["nope"])


def test_slices_of_the_imported_buffer_stay_inside_episodes():
    rb = ReplayBuffer.from_hf(FIXTURE, sampler=SliceSampler(slice_len=5, traj_key="episode"), batch_size=20)
    for _ in range(5):
        batch = rb.sample()
        episodes, frames = batch["episode"].view(4, 5), batch["frame"].view(4, 5)
        assert (episodes == episodes[:, :1]).all() and (frames.diff(dim=1) == 1).all()


def test_dataset_storage_opens_a_lerobot_directory():
    storage = DatasetStorage(FIXTURE)
    assert len(storage) == 150 and storage.stable_items and isinstance(storage.dataset, LeRobotFrames)
    rows = [3, 149, 0, 77]
    assert_fixture_frames(storage.get(rows), rows)
    item = storage.get(51)
    assert item["episode"].item() == 1 and item["language_instruction"] == "pull the cube"
    assert item["next", "reward"].shape == (1,)
    rb = ReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=10, traj_key="episode"), batch_size=20)
    batch = rb.sample()
    assert (batch["episode"].view(2, 10) == batch["episode"].view(2, 10)[:, :1]).all()
    rb = ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=50)
    seen = torch.cat([rb.sample()["index"] for _ in range(3)])
    assert torch.equal(seen.sort().values, torch.arange(150))
    with pytest.raises(RuntimeError, match="read-only"):
        rb.extend(storage.get([0, 1]))
    assert storage.state_dict() == {"dataset_class": f"{LeRobotFrames.__module__}.LeRobotFrames", "length": 150}


def test_dataset_storage_refuses_a_path_that_is_not_lerobot(tmp_path):
    with pytest.raises(TypeError, match="not a LeRobot dataset directory.*load_from_disk"):
        DatasetStorage(tmp_path)
    with pytest.raises(IndexError, match="out of range"):
        LeRobotFrames(FIXTURE)[150]
    with pytest.raises(ValueError, match="not a LeRobot dataset directory"):
        LeRobotFrames(FIXTURE / "data")


def test_an_unknown_directory_names_what_is_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="nor a LeRobot dataset \\(meta/info.json"):
        ReplayBuffer.from_hf(tmp_path)


def test_v2_datasets_are_refused_with_the_conversion_hint(tmp_path):
    path = copy_fixture(tmp_path)
    edit_info(path, codebase_version="v2.1")
    with pytest.raises(ValueError, match="codebase_version 'v2.1'.*convert_dataset_v21_to_v30"):
        ReplayBuffer.from_hf(path)


def test_info_without_codebase_version_is_not_a_lerobot_directory(tmp_path):
    path = copy_fixture(tmp_path)
    edit_info(path, codebase_version=None)
    with pytest.raises(FileNotFoundError, match="nor a LeRobot dataset"):
        ReplayBuffer.from_hf(path)


def test_missing_frames_and_damaged_tables_are_named(tmp_path):
    path = copy_fixture(tmp_path)
    shutil.rmtree(path / "data")
    with pytest.raises(FileNotFoundError, match="no data/chunk-\\*/file-\\*.parquet"):
        ReplayBuffer.from_hf(path)
    path = copy_fixture(tmp_path / "b")
    pq.write_table(pa.table({"task_index": [5], "task": ["x"]}), path / "meta" / "tasks.parquet")
    with pytest.raises(ValueError, match="task_index 0, which meta/tasks.parquet does not list"):
        ReplayBuffer.from_hf(path)
    path = copy_fixture(tmp_path / "c")
    (path / "meta" / "info.json").write_text("{not json")  # not recognised as a LeRobot directory
    with pytest.raises(FileNotFoundError, match="nor a LeRobot dataset"):
        ReplayBuffer.from_hf(path)


def test_a_buffer_too_small_is_refused_before_writing():
    with pytest.raises(ValueError, match="holds 10 items and the dataset has 150 rows"):
        ReplayBuffer.from_hf(FIXTURE, storage=LazyTensorStorage(10))


def test_video_features_without_a_decoder_name_the_decoders(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec  # as on a machine without torchcodec and PyAV installed

    def without_decoders(name, *args, **kwargs):
        return None if name.split(".")[0] in ("torchcodec", "av") else find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", without_decoders)
    path = copy_fixture(tmp_path)
    info = json.loads((path / "meta" / "info.json").read_text())
    info["features"]["observation.images.top"] = {"dtype": "video", "shape": [8, 8, 3],
                                                  "names": ["height", "width", "channels"]}  # fmt: skip
    info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    (path / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(ImportError, match="observation.images.top.*torchcodec.*pip install av"):
        ReplayBuffer.from_hf(path)
    rb = ReplayBuffer.from_hf(path, columns=["observation.state", "episode_index"])  # the others read fine
    assert len(rb) == 150


def test_image_features_are_decoded_to_uint8_chw(tmp_path):
    pil = require("PIL.Image")
    path = copy_fixture(tmp_path)
    frames = np.random.default_rng(0).integers(0, 255, (150, 6, 5, 3), dtype=np.uint8)
    cells = []
    for frame in frames:
        buffer = io.BytesIO()
        pil.fromarray(frame).save(buffer, format="PNG")
        cells.append({"bytes": buffer.getvalue(), "path": None})
    table = pq.read_table(DATA)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = table.append_column("observation.images.top", pa.array(cells, image_type))
    pq.write_table(table, path / "data" / "chunk-000" / "file-000.parquet")
    info = json.loads((path / "meta" / "info.json").read_text())
    info["features"]["observation.images.top"] = {"dtype": "image", "shape": [6, 5, 3],
                                                  "names": ["height", "width", "channels"]}  # fmt: skip
    (path / "meta" / "info.json").write_text(json.dumps(info))
    td = ReplayBuffer.from_hf(path)[:]
    image = td["observation", "image", "top"]
    assert image.dtype == torch.uint8 and image.shape == (150, 3, 6, 5)
    assert torch.equal(image, torch.from_numpy(frames).permute(0, 3, 1, 2))


def write_video_dataset(tmp_path, av) -> tuple[Path, np.ndarray]:
    """The fixture with a camera stored as LeRobot stores videos: one MP4 of every episode, one after the other,
    each episode at its ``from_timestamp`` (lossless RGB H.264, so that decoded frames are exact)."""
    path = copy_fixture(tmp_path)
    frames = np.random.default_rng(1).integers(0, 255, (150, 16, 16, 3), dtype=np.uint8)
    video = path / "videos" / "observation.images.top" / "chunk-000" / "file-000.mp4"
    video.parent.mkdir(parents=True)
    with av.open(str(video), "w") as container:
        stream = container.add_stream("libx264rgb", rate=10, options={"crf": "0"})
        stream.width, stream.height, stream.pix_fmt = 16, 16, "rgb24"
        for i, frame in enumerate(frames):
            out = av.VideoFrame.from_ndarray(frame, format="rgb24")
            out.pts = i
            for packet in stream.encode(out):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    info = json.loads((path / "meta" / "info.json").read_text())
    info["features"]["observation.images.top"] = {"dtype": "video", "shape": [16, 16, 3],
                                                  "names": ["height", "width", "channels"]}  # fmt: skip
    info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    (path / "meta" / "info.json").write_text(json.dumps(info))
    episodes_file = path / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    episodes = pq.read_table(episodes_file)
    for name, values in (("chunk_index", [0, 0, 0]), ("file_index", [0, 0, 0]),
                         ("from_timestamp", [0.0, 5.0, 10.0]), ("to_timestamp", [5.0, 10.0, 15.0])):  # fmt: skip
        episodes = episodes.append_column(f"videos/observation.images.top/{name}", pa.array(values))
    pq.write_table(episodes, episodes_file)
    return path, frames


def test_video_features_are_decoded_at_each_frames_timestamp(tmp_path):
    av = require("av")  # the `video` extra: writes the test video (and decodes it when torchcodec is absent)
    path, frames = write_video_dataset(tmp_path, av)
    td = ReplayBuffer.from_hf(path)[:]
    video = td["observation", "image", "top"]
    assert video.dtype == torch.uint8 and video.shape == (150, 3, 16, 16)
    assert torch.equal(video, torch.from_numpy(frames).permute(0, 3, 1, 2))
    rows = [149, 0, 50, 99]
    batch = DatasetStorage(path).get(rows)
    assert torch.equal(batch["observation", "image", "top"], torch.from_numpy(frames[rows]).permute(0, 3, 1, 2))


@pytest.mark.slow  # two spawned workers import torch, torchrl and datasets
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_dataset_storage_frames_feed_spawned_dataloader_workers():
    context = "spawn"  # the frames travel pickled (fork shares them: the LeRobotExperienceReplay test covers it)
    storage = DatasetStorage(FIXTURE)
    loader = torch.utils.data.DataLoader(storage.as_dataset(), batch_size=50, num_workers=2,
                                         collate_fn=tensordict_collate, timeout=60,
                                         multiprocessing_context=context)  # fmt: skip
    batches = list(loader)
    assert torch.cat([b["index"] for b in batches]).tolist() == list(range(150))
    assert batches[1]["language_instruction"][0] == "pull the cube"  # frame 50, episode 1
