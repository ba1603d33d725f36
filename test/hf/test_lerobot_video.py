"""LeRobot video features kept encoded: ``ReplayBuffer.from_hf(path, video="keep")`` makes each episode's frame
range of LeRobot's video files a segment of an :class:`EncodedFrameStorage` without decoding a frame, and
``export_hf(path, layout="lerobot")`` of such a storage writes LeRobot's video layout (segments copied as they are
when H.264/AV1, re-encoded otherwise).

The datasets are written here as LeRobot 0.6.1 lays them out (its test fixture plus a camera: one MP4 per camera
holding the episodes one after the other, a keyframe every 2 frames, 4:2:0, episode ranges in the episode table).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.extras import require
from helpers.frames import moving_frames, psnr
from tensordict import TensorDict

require("datasets")
av = require("av")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from torchrl.data import EncodedFrameStorage, LazyTensorStorage, ReplayBuffer, SliceSampler  # noqa: E402

pytestmark = pytest.mark.extras

FIXTURE = Path(__file__).resolve().parents[1] / "datasets" / "data" / "lerobot_v30_cartpole_like"
CAMERA = "observation.images.top"
KEY = ("observation", "image", "top")
FPS = 10  # the fixture's
#: What 4:2:0 at LeRobot-like quality keeps of the test frames (saturated colour edges lose most to subsampling).
LOSSY_PSNR = 22
ENCODERS = {"h264": ("libx264", {"g": "2", "crf": "20"}), "av1": ("libsvtav1", {"g": "2", "crf": "30", "preset": "10"})}


def write_lerobot_video_dataset(tmp_path: Path, codec: str = "h264") -> tuple[Path, torch.Tensor]:
    """The fixture (3 episodes x 50 frames) with the camera ``CAMERA`` stored as LeRobot stores videos; returns
    the directory and the frames written (uint8 ``[150, 3, 64, 64]``)."""
    path = tmp_path / "lerobot"
    shutil.copytree(FIXTURE, path)
    frames = moving_frames(150, 64, 64, layout="HWC")
    video = path / "videos" / CAMERA / "chunk-000" / "file-000.mp4"
    video.parent.mkdir(parents=True)
    encoder, options = ENCODERS[codec]
    with av.open(str(video), "w") as container:
        stream = container.add_stream(encoder, rate=FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i, frame in enumerate(frames.numpy()):
            out = av.VideoFrame.from_ndarray(frame, format="rgb24")
            out.pts = i
            for packet in stream.encode(out):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    info = json.loads((path / "meta" / "info.json").read_text())
    info["features"][CAMERA] = {
        "dtype": "video", "shape": [64, 64, 3], "names": ["height", "width", "channels"],
        "info": {"video.height": 64, "video.width": 64, "video.codec": codec, "video.pix_fmt": "yuv420p",
                 "video.is_depth_map": False, "video.fps": FPS, "video.channels": 3, "has_audio": False},
    }  # fmt: skip
    info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    (path / "meta" / "info.json").write_text(json.dumps(info))
    episodes_file = path / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    episodes = pq.read_table(episodes_file)
    for name, values in (("chunk_index", [0, 0, 0]), ("file_index", [0, 0, 0]),
                         ("from_timestamp", [0.0, 5.0, 10.0]), ("to_timestamp", [5.0, 10.0, 15.0])):  # fmt: skip
        episodes = episodes.append_column(f"videos/{CAMERA}/{name}", pa.array(values))
    pq.write_table(episodes, episodes_file)
    return path, frames.permute(0, 3, 1, 2)


def frames_decoded(storage=None) -> int:
    """The frames this process decoded so far (a per-process counter of every EncodedFrameStorage)."""
    storage = EncodedFrameStorage(1) if storage is None else storage
    return storage.stats()["frames_decoded"]


def encoded_buffer(codec: str, n: int = 60, episode_len: int = 20, layout: str = "CHW") -> tuple:
    """A buffer over an EncodedFrameStorage holding ``n`` moving frames in episodes of ``episode_len`` (segments of
    8 frames: several per episode), with a state, an action and done flags."""
    storage = EncodedFrameStorage(200, codec=codec, segment_frames=8, fps=FPS)
    rb = ReplayBuffer(storage=storage)
    step = torch.arange(n)
    data = TensorDict(
        {
            "pixels": moving_frames(n, 64, 64, layout=layout, start=7),
            "episode": step // episode_len,
            "observation": {"state": torch.randn(n, 4)},
            "action": torch.randn(n, 2),
            "next": {"done": (step % episode_len == episode_len - 1).unsqueeze(-1)},
        },
        batch_size=[n],
    )
    rb.extend(data)
    return rb, data


# -- import ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_keep_imports_lerobot_videos_as_segments_without_decoding(tmp_path, codec):
    path, written = write_lerobot_video_dataset(tmp_path, codec)
    decoded = ReplayBuffer.from_hf(path)[:][KEY]  # video="decode": every frame decoded into uint8 rows
    before = frames_decoded()
    rb = ReplayBuffer.from_hf(path, video="keep")
    storage = rb.storage
    assert isinstance(storage, EncodedFrameStorage) and frames_decoded(storage) == before
    segments = storage.segments(KEY)
    assert [(s.start_frame, s.num_frames) for s in segments] == [(0, 50), (50, 50), (100, 50)]
    assert all(s.path.endswith("file-000.mp4") and s.codec == codec for s in segments)  # the file, referenced
    stored = storage.stats()
    assert stored["encoded_bytes"] < stored["raw_bytes"] / 3
    frames = rb[:][KEY]
    assert frames.dtype == torch.uint8 and frames.shape == (150, 3, 64, 64)
    assert torch.equal(frames, decoded)  # the same frames as a decoding import
    assert psnr(frames, written) > LOSSY_PSNR  # within the codec's tolerance of what was written


def test_keep_decodes_only_the_frames_a_read_asks_for(tmp_path):
    path, written = write_lerobot_video_dataset(tmp_path)
    rb = ReplayBuffer.from_hf(path, video="keep")
    before = frames_decoded(rb.storage)
    rows = torch.tensor([3, 77, 140])
    frames = rb.storage.get(rows)[KEY]
    assert frames_decoded(rb.storage) - before <= 3 * 2  # a keyframe every 2 frames: at most 2 decodes per row
    assert psnr(frames, written[rows]) > LOSSY_PSNR
    assert rb.storage.get(rows)["episode"].tolist() == [0, 1, 2]


def test_keep_samples_slices_of_decoded_frames(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    decoded = ReplayBuffer.from_hf(path)[:][KEY]
    rb = ReplayBuffer.from_hf(path, video="keep", sampler=SliceSampler(slice_len=5, traj_key="episode"),
                              batch_size=20)  # fmt: skip
    batch, info = rb.sample(return_info=True)
    index = info["index"] if isinstance(info, dict) else info
    index = index[0] if isinstance(index, tuple) else index
    assert torch.equal(batch[KEY], decoded[index])
    episodes = batch["episode"].view(4, 5)
    assert (episodes == episodes[:, :1]).all()


def test_keep_into_a_given_encoded_storage(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    storage = EncodedFrameStorage(200, pixel_keys=[KEY], fps=FPS)
    rb = ReplayBuffer.from_hf(path, video="keep", storage=storage, columns=["episode_index", CAMERA])
    assert rb.storage is storage and len(rb) == 150
    assert rb[:][KEY].shape == (150, 3, 64, 64) and rb[:]["episode"].tolist() == [i // 50 for i in range(150)]
    copy = ReplayBuffer(storage=EncodedFrameStorage(400, pixel_keys=[KEY], fps=FPS))
    assert copy.extend_from_hf(path, video="keep") == 150
    assert torch.equal(copy[:][KEY], rb[:][KEY])


def test_keep_refusals_write_nothing(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    with pytest.raises(ValueError, match="`video` must be 'decode'.*got 'lazy'"):
        ReplayBuffer.from_hf(path, video="lazy")
    with pytest.raises(TypeError, match="video='keep'.*EncodedFrameStorage.*LazyTensorStorage"):
        ReplayBuffer.from_hf(path, video="keep", storage=LazyTensorStorage(150))
    wrong_key = EncodedFrameStorage(150, pixel_keys=["pixels"], fps=FPS)
    with pytest.raises(ValueError, match="not `pixel_keys`.*pixel_keys="):
        ReplayBuffer.from_hf(path, video="keep", storage=wrong_key)
    assert len(wrong_key) == 0
    small = ReplayBuffer(storage=EncodedFrameStorage(100, pixel_keys=[KEY], fps=FPS))
    with pytest.raises(ValueError, match="needs a row of the storage for every frame.*at least 150"):
        small.extend_from_hf(path, video="keep")
    assert len(small) == 0
    (path / "videos" / CAMERA / "chunk-000" / "file-000.mp4").unlink()
    target = ReplayBuffer(storage=EncodedFrameStorage(150, pixel_keys=[KEY], fps=FPS))
    with pytest.raises(FileNotFoundError, match="file-000.mp4 of episode 0"):
        target.extend_from_hf(path, video="keep")
    assert len(target) == 0


def test_keep_refuses_timestamps_outside_the_episode_video(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    episodes_file = path / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(episodes_file)
    column = f"videos/{CAMERA}/to_timestamp"
    at = table.column_names.index(column)
    table = table.set_column(at, column, pa.array([5.0, 10.0, 12.0]))  # episode 2 cut to 20 frames
    pq.write_table(table, episodes_file)
    target = ReplayBuffer(storage=EncodedFrameStorage(150, pixel_keys=[KEY], fps=FPS))
    with pytest.raises(ValueError, match="episode 2 do not fit its video range of 20 frames"):
        target.extend_from_hf(path, video="keep")
    assert len(target) == 0


# -- export ---------------------------------------------------------------------------------------------------
def read_episode_videos(path: Path, column: str) -> dict:
    table = pq.read_table(path / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    return {name.split("/")[-1]: table.column(name).to_pylist() for name in table.column_names
            if name.startswith(f"videos/{column}/")}  # fmt: skip


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_export_copies_h264_and_av1_segments_into_lerobot_files(tmp_path, codec):
    rb, data = encoded_buffer(codec)
    stored = rb[:]["pixels"]
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=FPS, task="reach")
    info = json.loads((tmp_path / "export" / "meta" / "info.json").read_text())
    feature = info["features"]["observation.image"]
    assert feature["dtype"] == "video" and feature["shape"] == [64, 64, 3]
    assert feature["names"] == ["height", "width", "channels"]
    assert feature["info"]["video.codec"] == codec and feature["info"]["video.fps"] == FPS
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert (tmp_path / "export" / "videos" / "observation.image" / "chunk-000" / "file-000.mp4").is_file()
    assert read_episode_videos(tmp_path / "export", "observation.image") == {
        "chunk_index": [0, 0, 0], "file_index": [0, 0, 0], "from_timestamp": [0.0, 2.0, 4.0],
        "to_timestamp": [2.0, 4.0, 6.0],
    }  # fmt: skip
    data_columns = pq.read_schema(tmp_path / "export" / "data" / "chunk-000" / "file-000.parquet").names
    assert "observation.image" not in data_columns  # the frames are in the video files only
    back = ReplayBuffer.from_hf(tmp_path / "export")[:]  # decoded from the export's files
    assert torch.equal(back["pixels"], stored)  # packets copied: the same frames, bit for bit
    assert torch.equal(back["action"], data["action"])


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_export_reencodes_lossless_segments_within_tolerance(tmp_path, layout):
    rb, data = encoded_buffer("ffv1", layout=layout)
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=FPS)
    info = json.loads((tmp_path / "export" / "meta" / "info.json").read_text())
    assert info["features"]["observation.image"]["info"]["video.codec"] == "h264"
    again = ReplayBuffer.from_hf(tmp_path / "export", video="keep")
    frames = again[:]["pixels"]
    assert frames.shape == data["pixels"].shape  # the layout written comes back
    assert psnr(frames, data["pixels"]) > 35
    assert {s.codec for s in again.storage.segments("pixels")} == {"h264"}


def test_export_and_reimport_of_an_imported_dataset_keeps_its_frames(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    decoded = ReplayBuffer.from_hf(path)[:][KEY]
    rb = ReplayBuffer.from_hf(path, video="keep", columns=["observation.state", "action", "episode_index", CAMERA])
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=FPS, task="push")
    assert read_episode_videos(tmp_path / "export", "observation.image.top")["from_timestamp"] == [0.0, 5.0, 10.0]
    before = frames_decoded()
    again = ReplayBuffer.from_hf(tmp_path / "export", video="keep")
    assert frames_decoded(again.storage) == before  # nothing decoded by the import
    assert torch.equal(again[:][KEY], decoded)
    assert torch.equal(again[:]["observation", "state"], rb[:]["observation", "state"])


def test_export_video_refusals(tmp_path):
    rb, _ = encoded_buffer("h264")
    with pytest.raises(ValueError, match="`fps`=30 differs from the frame rate.*Pass fps=10"):
        rb.export_hf(tmp_path / "a", layout="lerobot", fps=30)
    with pytest.raises(ValueError, match="`video_codec` must be one of"):
        rb.export_hf(tmp_path / "b", layout="lerobot", fps=FPS, video_codec="mpeg4")
    with pytest.raises(ValueError, match="`video_codec` describe a LeRobot dataset"):
        rb.export_hf(tmp_path / "c", layout="trajectories", video_codec="h264")
    assert not any((tmp_path / name).exists() for name in "abc")


def wrapped_h264_buffer(writes: list[int]) -> tuple[ReplayBuffer, torch.Tensor]:
    """A 50-row h264 buffer that received 60 steps (episodes of 20) in ``writes`` extends, and the frames of its
    rows oldest first (the export's order)."""
    rb = ReplayBuffer(storage=EncodedFrameStorage(50, codec="h264", segment_frames=8, fps=FPS))
    step = torch.arange(60)
    data = TensorDict({"pixels": moving_frames(60, 64, 64), "episode": step // 20,
                       "next": {"done": (step % 20 == 19).unsqueeze(-1)}}, batch_size=[60])  # fmt: skip
    start = 0
    for n in writes:
        rb.extend(data[start : start + n])
        start += n
    return rb, rb.storage.get(torch.cat([torch.arange(10, 50), torch.arange(10)]))["pixels"]


def test_export_copies_segments_of_uneven_lengths(tmp_path):
    rb, stored = wrapped_h264_buffer([60])  # frames 0..9 overwritten before they were encoded: segments of 8, 2, ...
    assert sorted({s.num_frames for s in rb.storage.segments()} - {8}) == [2, 4]
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=FPS)
    info = json.loads((tmp_path / "export" / "meta" / "info.json").read_text())
    assert info["features"]["observation.image"]["info"]["video.pix_fmt"] == "yuv444p"  # the storage's h264
    assert read_episode_videos(tmp_path / "export", "observation.image")["to_timestamp"] == [1.0, 3.0, 5.0]
    assert torch.equal(ReplayBuffer.from_hf(tmp_path / "export")[:]["pixels"], stored)


def test_export_reencodes_when_an_episode_starts_between_keyframes(tmp_path):
    rb, stored = wrapped_h264_buffer([40, 20])  # the oldest episode kept starts at frame 10, inside a segment
    with_offsets = [s for s in rb.storage.segments() if bool((s.rows[:1] < 0).any())]
    assert with_offsets  # a segment whose first frames were overwritten
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=FPS, video_codec="h264")
    assert read_episode_videos(tmp_path / "export", "observation.image")["to_timestamp"] == [1.0, 3.0, 5.0]
    frames = ReplayBuffer.from_hf(tmp_path / "export")[:]["pixels"]  # re-encoded from the decoded frames
    assert not torch.equal(frames, stored) and psnr(frames, stored) > 35


def test_export_writes_one_video_feature_per_camera(tmp_path):
    storage = EncodedFrameStorage(40, pixel_keys=["pixels", ("observation", "wrist")], codec="h264",
                                  segment_frames=8, fps=FPS)  # fmt: skip
    rb = ReplayBuffer(storage=storage)
    step = torch.arange(40)
    data = TensorDict({"pixels": moving_frames(40, 64, 64), "observation": {"wrist": moving_frames(40, 32, 48, start=3)},
                       "episode": step // 20, "next": {"done": (step % 20 == 19).unsqueeze(-1)}}, batch_size=[40])  # fmt: skip
    rb.extend(data)
    stored = rb[:]
    rb.export_hf(tmp_path / "export", layout="lerobot", fps=FPS)
    features = json.loads((tmp_path / "export" / "meta" / "info.json").read_text())["features"]
    assert features["observation.image"]["shape"] == [64, 64, 3]
    assert features["observation.wrist"]["shape"] == [32, 48, 3]
    back = ReplayBuffer.from_hf(tmp_path / "export", video="keep")
    assert set(map(tuple, [(k,) if isinstance(k, str) else k for k in back.storage.pixel_keys])) == {
        ("pixels",), ("observation", "wrist")}
    assert torch.equal(back[:]["pixels"], stored["pixels"])
    assert torch.equal(back[:]["observation", "wrist"], stored["observation", "wrist"])


def test_keep_refuses_a_damaged_episode_table(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    episodes_file = path / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(episodes_file)
    pq.write_table(table.filter(pa.compute.not_equal(table.column("episode_index"), 1)), episodes_file)
    target = ReplayBuffer(storage=EncodedFrameStorage(150, pixel_keys=[KEY], fps=FPS))
    with pytest.raises(ValueError, match="Episode 1 .* no row in the episode table"):
        target.extend_from_hf(path, video="keep")
    pq.write_table(table.drop_columns([f"videos/{CAMERA}/from_timestamp"]), episodes_file)
    with pytest.raises(ValueError, match=f"lacks the columns \\['videos/{CAMERA}/from_timestamp'\\]"):
        target.extend_from_hf(path, video="keep")
    assert len(target) == 0


def test_keep_refuses_an_import_of_video_features_only(tmp_path):
    path, _ = write_lerobot_video_dataset(tmp_path)
    with pytest.raises(ValueError, match="Only video features were asked for.*at least one other column"):
        ReplayBuffer.from_hf(path, video="keep", columns=[CAMERA])


def test_export_refuses_rows_without_a_frame_and_clashing_columns(tmp_path):
    storage = EncodedFrameStorage(20, codec="h264", fps=FPS)
    rb = ReplayBuffer(storage=storage)
    step = torch.arange(10)
    rb.extend(TensorDict({"pixels": moving_frames(10, 32, 32), "episode": step * 0}, batch_size=[10]))
    rb.extend(TensorDict({"episode": step * 0 + 1}, batch_size=[10]))  # rows written without a frame
    with pytest.raises(ValueError, match="Row 10 of the storage holds no frame of the pixel key"):
        rb.export_hf(tmp_path / "a", layout="lerobot", fps=FPS)
    clash = ReplayBuffer(storage=EncodedFrameStorage(10, fps=FPS))  # "pixels" is LeRobot's "observation.image"
    clash.extend(TensorDict({"pixels": moving_frames(10, 32, 32), ("observation", "image"): step.float(),
                             "episode": step * 0}, batch_size=[10]))  # fmt: skip
    with pytest.raises(ValueError, match="map to the column 'observation.image'"):
        clash.export_hf(tmp_path / "b", layout="lerobot", fps=FPS)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
