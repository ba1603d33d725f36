"""EncodedFrameStorage: frames kept as video segments, decoded at read time (single process)."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import av
import pytest
import torch
from helpers.factories import make_buffer
from helpers.frames import moving_frames, psnr
from tensordict import TensorDict

from torchrl.data import EncodedFrameStorage, LazyTensorStorage, RandomSampler, ReplayBuffer, SliceSampler
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.sample_units import FrameStack


def episodes(n_episodes: int, length: int, *, height: int = 16, width: int = 16, layout: str = "CHW",
             channels: int = 3, start: int = 0) -> TensorDict:
    """``n_episodes`` episodes of ``length`` steps: moving frames, episode ids, done flags on the last steps."""
    n = n_episodes * length
    steps = torch.arange(start, start + n)
    done = ((steps - start) % length == length - 1).unsqueeze(-1)
    return TensorDict(
        {
            "pixels": moving_frames(n, height, width, channels=channels, layout=layout, start=start),
            "episode": (steps - start) // length + start,
            "obs": steps.float().unsqueeze(-1),
            ("next", "done"): done,
        },
        batch_size=[n],
    )


def frames_of(data: TensorDict, obs: torch.Tensor) -> torch.Tensor:
    """The frames of ``data`` at the steps whose ``obs`` values are ``obs`` (any shape)."""
    position = {int(v): i for i, v in enumerate(data["obs"].reshape(-1).tolist())}
    index = torch.tensor([position[int(v)] for v in obs.reshape(-1).tolist()])
    return data["pixels"][index].reshape(*obs.shape, *data["pixels"].shape[1:])


# -- lossless ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout, channels", [("CHW", 3), ("HWC", 3), ("CHW", 1)])
def test_lossless_frames_read_back_bit_identical(layout, channels):
    data = episodes(3, 10, layout=layout, channels=channels)
    storage = EncodedFrameStorage(64, segment_frames=4)
    rb = make_buffer(storage=storage, batch_size=8, seed=0, data=data)
    assert storage.stats()["segments"] > 0  # most frames are in closed (encoded) segments
    assert torch.equal(storage.get(torch.arange(30))["pixels"], data["pixels"])
    assert torch.equal(storage[5]["pixels"], data["pixels"][5])
    assert torch.equal(storage[3:9]["pixels"], data["pixels"][3:9])
    assert torch.equal(rb[-1]["pixels"], data["pixels"][-1])
    for _ in range(3):
        batch = rb.sample()
        assert torch.equal(batch["pixels"], frames_of(data, batch["obs"][:, 0]))


def test_slice_draws_are_bit_identical():
    data = episodes(4, 12)
    rb = ReplayBuffer(
        storage=EncodedFrameStorage(100, segment_frames=5),
        sampler=SliceSampler(slice_len=6, traj_key="episode"),
        batch_size=18,
    )
    rb.extend(data)
    batch = rb.sample()
    assert batch["pixels"].shape == (18, 3, 16, 16)
    assert torch.equal(batch["pixels"], frames_of(data, batch["obs"][:, 0]))
    episode = batch["episode"].view(3, 6)
    assert (episode == episode[:, :1]).all()  # slices stay within an episode


def test_frame_stack_draws_are_bit_identical_and_padded_inside_episodes():
    data = episodes(3, 8)
    rb = ReplayBuffer(
        storage=EncodedFrameStorage(64, segment_frames=3),
        sample_unit=FrameStack(4, traj_key="episode"),
        batch_size=10,
    )
    rb.extend(data)
    batch, info = rb.sample(return_info=True)
    assert batch["pixels"].shape == (10, 4, 3, 16, 16)
    rows = info["index"]  # [B, 4] rows read, padded slots repeating the episode's first row
    assert torch.equal(batch["pixels"], data["pixels"][rows])


def test_rows_written_without_frames_are_refused_at_read():
    storage = EncodedFrameStorage(16)
    storage.set(torch.arange(4), episodes(1, 4))
    storage.set(torch.arange(4, 6), TensorDict(obs=torch.zeros(2, 1), batch_size=[2]))
    with pytest.raises(KeyError, match=r"rows \[4, 5\] hold no frame of the pixel key 'pixels'"):
        storage.get(torch.tensor([0, 4, 5]))
    assert storage.get(torch.tensor([1]))["pixels"].shape == (1, 3, 16, 16)


def test_interleaved_trajectories_go_to_their_own_segments():
    a, b = episodes(1, 6), episodes(1, 6, start=100)
    a["episode"].fill_(0)
    b["episode"].fill_(1)
    mixed = torch.stack([a, b], 1).reshape(-1)  # a0 b0 a1 b1 ...
    storage = EncodedFrameStorage(32, segment_frames=3)
    storage.set(torch.arange(12), mixed)
    segments = storage.segments()
    assert len(segments) == 4 and all(s.num_frames == 3 for s in segments)
    for segment in segments:  # each segment holds the frames of one episode, in order
        assert len(set(mixed["episode"][segment.rows].tolist())) == 1
    assert torch.equal(storage.get(torch.arange(12))["pixels"], mixed["pixels"])


def test_an_end_flag_closes_the_segment_and_a_full_tail_closes_the_largest():
    storage = EncodedFrameStorage(64, segment_frames=8)
    storage.set(torch.arange(5), episodes(1, 5))  # done on the last step: closed at 5 frames
    assert [s.num_frames for s in storage.segments()] == [5]
    assert storage.stats()["tail_frames"] == 0
    small = EncodedFrameStorage(64, segment_frames=4, tail_frames=4, trajectory_key="episode")
    data = episodes(1, 3)
    del data["next"]
    small.set(torch.arange(3), data)  # 3 frames open
    other = episodes(1, 2, start=50)
    del other["next"]
    small.set(torch.arange(3, 5), other)  # the 5th frame needs a slot: the 3-frame segment is closed early
    assert [s.num_frames for s in small.segments()] == [3]
    assert small.stats()["tail_frames"] == 2
    assert torch.equal(small.get(torch.arange(5))["pixels"], torch.cat([data["pixels"], other["pixels"]]))


# -- lossy -------------------------------------------------------------------------------------------------------------
def test_lossy_default_quality_is_above_35_db_at_under_a_tenth_of_the_bytes():
    data = episodes(2, 32, height=64, width=64)
    storage = EncodedFrameStorage(64, codec="h264", segment_frames=32)
    storage.set(torch.arange(64), data)
    stats = storage.stats()
    assert stats["tail_frames"] == 0 and stats["closed_frames"] == 64
    decoded = storage.get(torch.arange(64))["pixels"]
    assert psnr(decoded, data["pixels"]) >= 35.0
    assert stats["encoded_bytes"] <= 0.10 * data["pixels"].numel()
    assert stats["raw_bytes"] == data["pixels"].numel()


def _benchmark_episodes(frames: int, size: int, episode: int) -> TensorDict:
    """The moving episodes ``benchmarks/video_frames.py`` quotes (panning texture, bouncing discs, noise)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "_moving_episodes.py"
    spec = importlib.util.spec_from_file_location("video_benchmark_episodes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.moving_episodes(frames, size, episode)


@pytest.mark.parametrize("size", [64, 96])
def test_h264_default_quality_on_the_benchmark_episodes_is_above_35_db_at_under_a_tenth_of_the_bytes(size):
    data = _benchmark_episodes(200, size, 100)
    storage = EncodedFrameStorage(200, codec="h264")  # default crf, segments, keyframe interval
    storage.set(torch.arange(200), data)
    storage.close_segments()
    decoded = storage.get(torch.arange(200))["pixels"]
    assert psnr(decoded, data["pixels"]) >= 35.0
    assert storage.stats()["encoded_bytes"] <= 0.10 * data["pixels"].numel()


@pytest.mark.skipif("libsvtav1" not in av.codecs_available, reason="this PyAV build has no AV1 encoder")
@pytest.mark.parametrize("size, floor", [(64, 28.0), (96, 30.0)])
def test_av1_default_quality_on_the_benchmark_episodes_is_what_the_docs_quote(size, floor):
    # 4:2:0 caps these saturated episodes near 29 / 31 dB whatever the crf; the default stays under a tenth
    data = _benchmark_episodes(200, size, 100)
    storage = EncodedFrameStorage(200, codec="av1")
    storage.set(torch.arange(200), data)
    storage.close_segments()
    assert psnr(storage.get(torch.arange(200))["pixels"], data["pixels"]) >= floor
    assert storage.stats()["encoded_bytes"] <= 0.10 * data["pixels"].numel()


@pytest.mark.skipif("libsvtav1" not in av.codecs_available, reason="this PyAV build has no AV1 encoder")
def test_av1_frames_read_back_close_to_what_was_written():
    data = episodes(1, 8, height=32, width=32)
    storage = EncodedFrameStorage(16, codec="av1", segment_frames=8)
    storage.set(torch.arange(8), data)
    assert psnr(storage.get(torch.arange(8))["pixels"], data["pixels"]) >= 20.0  # 4:2:0 on saturated colours
    assert storage.segments()[0].codec == "av1"


# -- seeks -------------------------------------------------------------------------------------------------------------
def test_a_read_decodes_only_the_frames_it_needs():
    storage = EncodedFrameStorage(64, segment_frames=16)
    storage.set(torch.arange(32), episodes(2, 16))
    before = storage.stats()
    storage.get(torch.tensor([9, 3, 9, 20]))  # 2 frames of segment 0, 1 of segment 1 (ffv1: every frame a keyframe)
    after = storage.stats()
    assert after["frames_decoded"] - before["frames_decoded"] == 3
    assert after["seeks"] - before["seeks"] == 2  # ffv1: one seek per segment, the packets between read, not decoded
    storage.get(torch.tensor([4, 5, 6, 7]))
    again = storage.stats()
    assert (again["frames_decoded"] - after["frames_decoded"], again["seeks"] - after["seeks"]) == (4, 1)


def test_get_without_decoding_reads_the_other_entries_and_decodes_nothing():
    data = episodes(2, 16)
    storage = EncodedFrameStorage(64, segment_frames=16)
    storage.set(torch.arange(32), data)
    before = storage.stats()
    rows = storage.get(torch.tensor([9, 3, 20]), decode=False)
    after = storage.stats()
    assert (after["frames_decoded"], after["seeks"]) == (before["frames_decoded"], before["seeks"])
    assert "pixels" not in rows.keys()
    assert torch.equal(rows["obs"], data["obs"][torch.tensor([9, 3, 20])])
    assert torch.equal(rows["next", "done"], data["next", "done"][torch.tensor([9, 3, 20])])
    assert "pixels" in storage.get(torch.tensor([9]), decode=True).keys()
    with pytest.raises(TypeError, match="`decode` must be True .* or False .*, got 'no'"):
        storage.get(torch.tensor([9]), decode="no")


def test_a_lossy_read_decodes_from_the_keyframe_before_the_first_frame():
    storage = EncodedFrameStorage(64, codec="h264", segment_frames=32, keyframe_interval=8)
    storage.set(torch.arange(32), episodes(1, 32))
    before = storage.stats()
    storage.get(torch.tensor([21, 19]))  # keyframe at 16: decodes 16..21 in one pass
    after = storage.stats()
    assert after["seeks"] - before["seeks"] == 1
    assert after["frames_decoded"] - before["frames_decoded"] <= 8
    storage.get(torch.tensor([1, 30]))  # 29 frames apart: a seek each, not a pass through the segment
    again = storage.stats()
    assert again["seeks"] - after["seeks"] == 2
    assert again["frames_decoded"] - after["frames_decoded"] <= 16


def test_lossy_reads_of_any_subset_match_a_full_decode():
    storage = EncodedFrameStorage(64, codec="h264", segment_frames=32, keyframe_interval=8)
    storage.set(torch.arange(64), TensorDict(pixels=moving_frames(64, 32, 32), batch_size=[64]))
    full = storage.get(torch.arange(64))["pixels"]
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):  # wherever a read seeks to, it lands on the frames asked for
        index = torch.randint(0, 64, (7,), generator=generator)
        assert torch.equal(storage.get(index)["pixels"], full[index])


def test_a_buffer_of_frames_only():
    storage = EncodedFrameStorage(20, segment_frames=4)
    rb = make_buffer(storage=storage, writer="tensordict_round_robin", batch_size=3, seed=0)
    frames = moving_frames(10, 8, 8)
    rb.extend(TensorDict(pixels=frames, batch_size=[10]))
    batch = rb.sample()
    assert torch.equal(batch["pixels"], frames[batch["index"]])


# -- eviction ----------------------------------------------------------------------------------------------------------
def test_overwritten_trajectories_free_their_segments():
    storage = EncodedFrameStorage(16, segment_frames=4)
    rb = ReplayBuffer(storage=storage, batch_size=4)
    rb.extend(episodes(2, 8))
    first = [s.path for s in storage.segments()]
    assert len(first) == 4 and all(os.path.exists(p) for p in first)
    newer = episodes(1, 8, start=100)
    rb.extend(newer)  # overwrites rows 0..7: the first episode's 2 segments go
    assert not any(os.path.exists(p) for p in first[:2]) and all(os.path.exists(p) for p in first[2:])
    assert len(storage.segments()) == 4
    assert torch.equal(storage.get(torch.arange(8))["pixels"], newer["pixels"])
    rb.extend(episodes(1, 6, start=200))  # rows 8..13 of the second episode: its first segment goes, the second
    [kept] = [s for s in storage.segments() if s.path == first[3]]  # keeps rows 12..15 of which 14, 15 remain
    assert kept.rows.tolist() == [-1, -1, 14, 15] and not os.path.exists(first[2])
    rb.empty()
    assert storage.segments() == [] and not [f for f in os.listdir(storage.scratch_dir) if f.startswith("seg-")]


# -- existing files as segments ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("copy", [False, True])
def test_an_existing_video_file_becomes_a_segment_without_reencoding(tmp_path, copy):
    source = EncodedFrameStorage(16, scratch_dir=str(tmp_path / "src"))
    data = episodes(1, 6)
    source.set(torch.arange(6), data)
    [segment] = source.segments()
    storage = EncodedFrameStorage(16, segment_frames=4)
    rb = ReplayBuffer(storage=storage)
    rb.extend(TensorDict(obs=torch.zeros(4, 1), batch_size=[4]))
    seg = storage.add_segment(segment.path, torch.tensor([3, 2, 1, 0]), start_frame=2, copy=copy)
    assert torch.equal(storage.get(torch.tensor([3, 2, 1, 0]))["pixels"], data["pixels"][2:6])
    [info] = storage.segments()
    assert (info.id, info.codec, info.start_frame, info.num_frames, info.owned) == (seg, "ffv1", 2, 4, copy)
    assert (info.path == segment.path) is not copy
    with open(info.path, "rb") as f, open(segment.path, "rb") as g:
        assert f.read() == g.read()  # the bytes as they are
    rb.empty()
    assert storage.segments() == [] and os.path.exists(segment.path)  # a referenced file is never deleted


def test_add_segment_refuses_bad_arguments(tmp_path):
    source = EncodedFrameStorage(8)
    source.set(torch.arange(4), episodes(1, 4))
    path = source.segments()[0].path
    storage = EncodedFrameStorage(8)
    with pytest.raises(ValueError, match="`key`='depth' is not one of the storage's `pixel_keys`"):
        storage.add_segment(path, [0], key="depth")
    with pytest.raises(ValueError, match="`path` must name an existing video file"):
        storage.add_segment(str(tmp_path / "missing.mkv"), [0])
    with pytest.raises(ValueError, match=r"`rows` must be a non-empty list of storage rows in 0\.\.7"):
        storage.add_segment(path, [8])
    with pytest.raises(ValueError, match="lists a row twice"):
        storage.add_segment(path, [1, 1])
    with pytest.raises(ValueError, match="`stream_index`=1 is not a video stream"):
        storage.add_segment(path, [0], stream_index=1)
    (tmp_path / "text.mkv").write_text("not a video")
    with pytest.raises(ValueError, match="is not a video file PyAV can open"):
        storage.add_segment(str(tmp_path / "text.mkv"), [0])
    assert storage.segments() == []


# -- checkpoints -------------------------------------------------------------------------------------------------------
def test_dumps_and_loads_keep_the_encoded_bytes_and_the_open_tail(tmp_path):
    data = episodes(2, 7)
    del data["next"]  # no end flags: each episode keeps 3 open frames
    storage = EncodedFrameStorage(32, segment_frames=4)
    rb = ReplayBuffer(storage=storage, batch_size=4)
    rb.extend(data)
    tail = storage.stats()["tail_frames"]
    assert tail > 0
    saved = {s.id: open(s.path, "rb").read() for s in storage.segments()}
    rb.dumps(tmp_path / "rb")
    fresh = EncodedFrameStorage(32, segment_frames=4)
    rb2 = ReplayBuffer(storage=fresh, batch_size=4)
    rb2.loads(tmp_path / "rb")
    assert torch.equal(fresh.get(torch.arange(14))["pixels"], data["pixels"])
    assert {s.id: open(s.path, "rb").read() for s in fresh.segments()} == saved  # no re-encode
    assert fresh.stats()["tail_frames"] == tail
    more = episodes(1, 5, start=50)
    rb2.extend(more)  # the open segments go on after a load
    assert torch.equal(fresh.get(torch.arange(14, 19))["pixels"], more["pixels"])
    assert torch.equal(fresh.get(torch.arange(14))["pixels"], data["pixels"])


def test_dumps_saves_the_occupied_tail_slots_only(tmp_path):
    data = episodes(1, 3, height=64, width=64)
    del data["next"]  # 3 open frames in a ring of 256
    storage = EncodedFrameStorage(300)
    storage.set(torch.arange(3), data)
    assert storage.state_dict()["encoded_frames"]["tensors"]["0/tail"].shape == (3, 64, 64, 3)
    storage.dumps(tmp_path / "s")
    saved = sum(f.stat().st_size for f in (tmp_path / "s").rglob("*") if f.is_file())
    assert saved < 256 * 64 * 64 * 3 / 10  # the whole ring would be 3 MB
    fresh = EncodedFrameStorage(300)
    fresh.loads(tmp_path / "s")
    assert torch.equal(fresh.get(torch.arange(3))["pixels"], data["pixels"])
    more = episodes(1, 70, height=64, width=64, start=3)  # the open segment goes on, then closes
    fresh.set(torch.arange(3, 73), more)
    assert torch.equal(fresh.get(torch.arange(73))["pixels"], torch.cat([data["pixels"], more["pixels"]]))


@pytest.mark.parametrize("copy", [False, True])
def test_dumps_saves_a_file_shared_by_several_segments_once(tmp_path, copy):
    data = episodes(1, 12)
    del data["next"]
    source = EncodedFrameStorage(16, segment_frames=12, scratch_dir=str(tmp_path / "src"))
    source.set(torch.arange(12), data)  # one file of 12 frames, as a LeRobot file of 3 episodes
    [file] = source.segments()
    storage = EncodedFrameStorage(16)
    storage.set(torch.arange(12), TensorDict(obs=data["obs"], batch_size=[12]))
    for start in (0, 4, 8):
        storage.add_segment(file.path, torch.arange(start, start + 4), start_frame=start, copy=copy)
    blob = storage.state_dict()["encoded_frames"]["tensors"]["0/segments"]
    assert blob.numel() == os.path.getsize(file.path)  # once, not once per segment
    storage.dumps(tmp_path / "s")
    fresh = EncodedFrameStorage(16)
    fresh.loads(tmp_path / "s")
    assert torch.equal(fresh.get(torch.arange(12))["pixels"], data["pixels"])
    assert [(s.start_frame, s.num_frames) for s in fresh.segments()] == [(0, 4), (4, 4), (8, 4)]
    fresh.set(torch.arange(4), episodes(1, 4, start=40))  # evicts the first segment: the others still read
    assert torch.equal(fresh.get(torch.arange(4, 12))["pixels"], data["pixels"][4:])


def test_loads_refuses_a_checkpoint_of_another_codec_and_changes_nothing(tmp_path):
    storage = EncodedFrameStorage(16)
    storage.set(torch.arange(4), episodes(1, 4))
    storage.dumps(tmp_path / "s")
    other = EncodedFrameStorage(16, codec="h264")
    data = episodes(1, 3, start=9)
    other.set(torch.arange(3), data)
    with pytest.raises(CheckpointError, match=r"`codec` is 'ffv1' in the checkpoint, 'h264' here"):
        other.loads(tmp_path / "s")
    assert psnr(other.get(torch.arange(3))["pixels"], data["pixels"]) > 30


def test_state_dict_round_trip():
    data = episodes(1, 6)
    storage = EncodedFrameStorage(16, segment_frames=4)
    storage.set(torch.arange(6), data)
    fresh = EncodedFrameStorage(16, segment_frames=4)
    fresh.load_state_dict(storage.state_dict())
    assert torch.equal(fresh.get(torch.arange(6))["pixels"], data["pixels"])
    with pytest.raises(TypeError, match="'encoded_frames' entry"):
        fresh.load_state_dict(LazyTensorStorage(16).state_dict())


# -- refused writes and arguments --------------------------------------------------------------------------------------
def test_bad_frames_are_refused_before_anything_is_written():
    storage = EncodedFrameStorage(16)
    storage.set(torch.arange(2), episodes(1, 2))
    bad = episodes(1, 2, start=5)
    cases = [
        (bad.clone().set("pixels", bad["pixels"].float()), TypeError, "must be uint8"),
        (bad.clone().set("pixels", bad["pixels"][:, :, :8]), ValueError, r"holds frames of shape \[3, 16, 16\]"),
    ]
    for data, error, message in cases:
        with pytest.raises(error, match=message):
            storage.set(torch.arange(2, 4), data)
        assert len(storage) == 2
    fresh = EncodedFrameStorage(16)
    two = TensorDict(pixels=torch.zeros(2, 2, 8, 8, dtype=torch.uint8), batch_size=[2])
    with pytest.raises(ValueError, match=r"expected \[C, H, W\] or \[H, W, C\] with C = 1 \(gray\) or 3"):
        fresh.set(torch.arange(2), two)
    flat = TensorDict(pixels=torch.zeros(2, 64, dtype=torch.uint8), batch_size=[2])
    with pytest.raises(ValueError, match=r"one \[C, H, W\] or \[H, W, C\] frame per row"):
        fresh.set(torch.arange(2), flat)
    assert len(fresh) == 0


def test_av1_refuses_odd_frame_sizes():
    storage = EncodedFrameStorage(8, codec="av1") if "av1" in _available() else None
    if storage is None:
        pytest.skip("this PyAV build has no AV1 encoder")
    odd = TensorDict(pixels=torch.zeros(1, 3, 15, 16, dtype=torch.uint8), batch_size=[1])
    with pytest.raises(ValueError, match="height and width must be even"):
        storage.set(torch.arange(1), odd)


def _available():
    from torchrl.data.replay_buffers.storages._video_segments import available_codecs

    return available_codecs()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"codec": "mpeg2"}, ValueError, r"`codec` must be one of \['av1', 'ffv1', 'h264'\] \(available in this PyAV"),
        ({"crf": 20}, ValueError, "`crf`=20 was given with the lossless codec 'ffv1'"),
        ({"segment_frames": 0}, ValueError, "segment_frames"),
        ({"segment_frames": 8, "tail_frames": 4}, ValueError, "`tail_frames`=4 is smaller than `segment_frames`=8"),
        ({"pixel_keys": 3}, TypeError, "`pixel_keys` must be a key"),
        ({"pixel_keys": []}, ValueError, "`pixel_keys` names no key"),
        ({"scratch_dir": 3}, TypeError, "`scratch_dir` must be a directory path or None"),
        ({"decoder": "ffmpeg"}, ValueError, r"`decoder` must be one of \['pyav', 'torchcodec'\], got 'ffmpeg'"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        EncodedFrameStorage(8, **kwargs)


def test_the_torchcodec_decoder_needs_torchcodec():
    try:
        import torchcodec  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install torchcodec, or pass decoder='pyav'"):
            EncodedFrameStorage(8, decoder="torchcodec")
        return
    data = episodes(1, 6)
    storage = EncodedFrameStorage(8, decoder="torchcodec", segment_frames=3)
    storage.set(torch.arange(6), data)
    assert torch.equal(storage.get(torch.tensor([5, 0, 4]))["pixels"], data["pixels"][[5, 0, 4]])


def test_several_cameras_and_nested_keys():
    data = episodes(1, 5)
    data["next", "pixels"] = moving_frames(5, 8, 8, layout="HWC", start=1)
    storage = EncodedFrameStorage(8, pixel_keys=["pixels", ("next", "pixels")], segment_frames=2)
    rb = ReplayBuffer(storage=storage, batch_size=3, sampler=RandomSampler())
    rb.extend(data)
    out = storage.get(torch.arange(5))
    assert torch.equal(out["pixels"], data["pixels"]) and torch.equal(out["next", "pixels"], data["next", "pixels"])
    assert storage.get_entry("pixels") is None  # frames are not in the tensor backing
    assert {s.key for s in storage.segments()} == {"pixels", ("next", "pixels")}
