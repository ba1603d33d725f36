"""LeRobot videos kept encoded: the video files of a LeRobot v3.0 directory as segments of an
:class:`~torchrl.data.EncodedFrameStorage` (import), and its segments written as LeRobot's video files (export).

LeRobot's video layout (v3.0): the frames of camera ``<key>`` live in ``videos/<key>/chunk-CCC/file-FFF.mp4``, the
episodes one after the other in a file; the episode table (``meta/episodes/...``) gives each episode's file
(``videos/<key>/chunk_index``, ``videos/<key>/file_index``) and its time range in it
(``videos/<key>/from_timestamp``, ``videos/<key>/to_timestamp``); frame ``t`` of an episode is shown at
``from_timestamp + t / fps``. ``meta/info.json`` lists the camera as a feature of dtype ``"video"``, shape
``[height, width, channels]`` and an ``info`` block (``video.codec``, ``video.fps``, ...), and gives the file names'
template in ``video_path``.

- Import (``video="keep"``): each episode's frame range becomes one closed segment of the storage
  (:meth:`EncodedFrameStorage.add_segment <torchrl.data.EncodedFrameStorage.add_segment>`) over the file as it is:
  nothing is decoded when importing; a sampled frame is decoded when drawn.
- Export: the segments of an episode are copied packet by packet into the LeRobot file (no re-encode) when every
  segment of the camera is H.264 or AV1 with the same stream parameters and each episode's frames start on a
  keyframe; otherwise the camera's frames are decoded and encoded again (``video_codec``, H.264 by default), e.g.
  from lossless FFV1 segments, which LeRobot's readers do not expect in MP4.

PyAV (``av``) is imported by the functions that need it.
"""

from __future__ import annotations

import fractions
import os
from collections.abc import Mapping

import numpy as np
import torch

from torchrl.data.replay_buffers.hf.lerobot import CHUNKS_SIZE, VIDEO_FILES_SIZE_IN_MB, VIDEO_PATH

__all__ = [
    "VIDEO_MODES",
    "VIDEO_PATH",
    "VideoImportPlan",
    "LeRobotVideoWriter",
    "check_video_mode",
    "check_video_codec",
]

#: What an import does with LeRobot's video features: decode every frame into uint8 rows, or keep the files.
VIDEO_MODES = ("decode", "keep")
#: The codecs an export copies as they are (LeRobot reads them from MP4), and those it re-encodes into.
COPIED_CODECS = ("h264", "av1")
# the default quality of EncodedFrameStorage (storages/_video_segments.py CODECS: CRF 12 / 8)
_ENCODERS = {"h264": ("libx264", {"crf": "12"}), "av1": ("libsvtav1", {"crf": "8", "preset": "10"})}
_DECODER_CODECS = {"libdav1d": "av1", "libaom-av1": "av1", "libx264": "h264"}
_FILE_BYTES = VIDEO_FILES_SIZE_IN_MB << 20


def _av():
    try:
        import av
    except ImportError as err:
        raise ImportError(
            "LeRobot videos are read and written with PyAV, which is not installed: pip install av (or "
            "torchrl[video])."
        ) from err
    return av


def check_video_mode(video) -> str:
    """``video`` if it is one of :data:`VIDEO_MODES`, else a ``ValueError`` naming them.

    Examples:
        >>> from torchrl.data.replay_buffers.hf.lerobot_video import check_video_mode
        >>> check_video_mode("keep")
        'keep'
    """
    if not isinstance(video, str) or video not in VIDEO_MODES:
        raise ValueError(
            f"`video` must be 'decode' (every frame of LeRobot's video features decoded into uint8 rows) or 'keep' "
            f"(the video files kept as segments of an EncodedFrameStorage, decoded when sampled), got {video!r}."
        )
    return video


def check_video_codec(video_codec) -> str:
    """``video_codec`` if an export can encode with it (:data:`_ENCODERS`), else a ``ValueError``."""
    if not isinstance(video_codec, str) or video_codec not in _ENCODERS:
        raise ValueError(
            f"`video_codec` must be one of {sorted(_ENCODERS)} (the codec LeRobot video files are re-encoded with "
            f"when the stored segments cannot be copied as they are), got {video_codec!r}."
        )
    return video_codec


# -- import -----------------------------------------------------------------------------------------------------
def _video_fps(directory, column: str) -> float:
    feature = directory.features.get(column) or {}
    info = feature.get("info") or feature.get("video_info") or {}
    fps = info.get("video.fps") or directory.fps
    if not fps or float(fps) <= 0:
        raise ValueError(
            f"{directory.path}/meta/info.json gives no frame rate for the video feature {column!r} (`fps` or its "
            f"`info['video.fps']`): the dataset is damaged."
        )
    return float(fps)


def _episode_ranges(directory, column: str, fps: float) -> dict[int, tuple[str, int, int]]:
    """``{episode: (file, first frame, number of frames)}`` of ``column`` from the episode table."""
    table = directory.episodes
    names = [f"videos/{column}/{part}" for part in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise ValueError(
            f"The episode table of {directory.path} lacks the columns {missing} of the video feature {column!r}: "
            f"the dataset is damaged (or not a LeRobot v3.0 dataset with videos)."
        )
    template = directory.info.get("video_path") or VIDEO_PATH
    columns = table.select(["episode_index"] + names).to_pydict()
    out = {}
    for e, chunk, file, start, stop in zip(columns["episode_index"], *(columns[n] for n in names)):
        path = os.path.join(directory.path, template.format(video_key=column, chunk_index=chunk, file_index=file))
        first = int(round(float(start) * fps))
        out[int(e)] = (path, first, int(round(float(stop) * fps)) - first)
    return out


class VideoImportPlan:
    """Which frames of which LeRobot video file back each imported row, for the video features ``columns``
    (``{column: (key, layout)}``, ``layout`` ``"CHW"`` or ``"HWC"``: how reads return the frames); checked when
    built, so that a refused import writes nothing.

    ``episode`` and ``timestamp`` are the ``episode_index`` and ``timestamp`` values of the imported rows, in
    import order. :meth:`attach` registers the segments once the rows are written (``rows``: the storage
    index of each imported row).
    """

    def __init__(self, directory, columns: Mapping, episode: np.ndarray, timestamp: np.ndarray):
        self.pieces = []  # (key, layout, path, positions in import order, first frame)
        for column, (key, layout) in columns.items():
            fps = _video_fps(directory, column)
            ranges = _episode_ranges(directory, column, fps)
            for e in np.unique(episode):
                if int(e) not in ranges:
                    raise ValueError(
                        f"Episode {int(e)} of {directory.path} has frames but no row in the episode table for "
                        f"the video feature {column!r}: the dataset is damaged."
                    )
                path, first, count = ranges[int(e)]
                if not os.path.isfile(path):
                    raise FileNotFoundError(
                        f"The video file {path} of episode {int(e)} ({column!r}) is missing: download or copy the "
                        f"whole dataset directory."
                    )
                where = np.flatnonzero(episode == e)
                frames = np.rint(timestamp[where].astype(np.float64) * fps).astype(np.int64)
                order = np.argsort(frames, kind="stable")
                where, frames = where[order], frames[order]
                if frames[0] < 0 or frames[-1] >= count or (len(frames) > 1 and (np.diff(frames) == 0).any()):
                    raise ValueError(
                        f"The timestamps of episode {int(e)} do not fit its video range of {count} frames in {path} "
                        f"({column!r}): frames {int(frames[0])}..{int(frames[-1])} asked for. The dataset is "
                        f"damaged."
                    )
                cuts = np.flatnonzero(np.diff(frames) != 1) + 1  # runs of consecutive frames
                for run_where, run_frames in zip(np.split(where, cuts), np.split(frames, cuts)):
                    self.pieces.append((key, layout, path, run_where, first + int(run_frames[0])))

    def attach(self, storage, rows: torch.Tensor) -> None:
        """Registers every piece as a closed segment of ``storage`` (the files are referenced, not copied)."""
        for key, layout, path, where, first in self.pieces:
            storage.add_segment(path, rows[torch.from_numpy(where)], key=key, start_frame=first, layout=layout)


# -- export -----------------------------------------------------------------------------------------------------
def _stream_frames(path: str, stream_index: int):
    """``(keyframes, fps, parameters, reorder depth)`` of a video stream, from its packets (no decode):
    ``keyframes`` is the set of frame indices that start on a keyframe, ``parameters`` what must match for two
    streams to be concatenated (codec, size, pixel format, codec extradata), the reorder depth the most a packet
    comes after its frame's place in presentation order (B-frames)."""
    av = _av()
    with av.open(path) as container:
        stream = container.streams.video[stream_index]
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps, tb, start = fractions.Fraction(rate), stream.time_base, stream.start_time or 0
        keyframes, depth, count = set(), 0, 0
        for packet in container.demux(stream):
            if packet.pts is None:
                continue
            frame = int(round((packet.pts - start) * tb * fps))
            if packet.is_keyframe:
                keyframes.add(frame)
            depth, count = max(depth, count - frame), count + 1
        ctx = stream.codec_context
        codec = _DECODER_CODECS.get(ctx.name, ctx.name)
        params = (codec, ctx.width, ctx.height, ctx.pix_fmt, bytes(ctx.extradata or b""))
    return keyframes, fps, params, depth


class _Piece:
    __slots__ = ("segment", "first", "count")

    def __init__(self, segment, first: int, count: int):
        self.segment, self.first, self.count = segment, first, count


class LeRobotVideoWriter:
    """Writes the frames of the pixel entries ``columns`` (``{key: LeRobot column}``) of an
    :class:`~torchrl.data.EncodedFrameStorage` as LeRobot video files under ``root``, episode by episode.

    :meth:`__call__` takes the episode table being written (``[{"episode_index", "from", "to"}]``, export rows)
    and ``order`` (the storage row of each export row), writes the files, adds each episode's ``videos/<column>/*``
    entries and returns the video features of ``info.json``.
    """

    def __init__(self, root: str, storage, columns: Mapping, *, fps: int, video_codec: str = "h264",
                 fsync: bool = True):  # fmt: skip
        self.root, self.storage, self.columns = root, storage, dict(columns)
        self.fps, self.video_codec, self.fsync = int(fps), check_video_codec(video_codec), fsync
        self.paths: list[str] = []

    def __call__(self, episodes: list[dict], order: torch.Tensor) -> dict:
        features = {}
        for key, column in self.columns.items():
            features[column] = self._write_camera(key, column, episodes, order)
        return features

    # -- planning --------------------------------------------------------------------------------------------
    def _pieces(self, key, episodes, order) -> list[list[_Piece]]:
        """Each episode's frames as runs of consecutive frames of one segment."""
        segments = self.storage.segments(key)
        where = {}
        for segment in segments:
            for offset, row in enumerate(segment.rows.tolist()):
                if row >= 0:
                    where[row] = (segment, offset)
        out = []
        for ep in episodes:
            pieces: list[_Piece] = []
            for row in order[ep["from"] : ep["to"]].tolist():
                found = where.get(row)
                if found is None:
                    raise ValueError(
                        f"Row {row} of the storage holds no frame of the pixel key {key!r} (it was written without "
                        f"it), and every exported row needs one: a LeRobot video has a frame per row. Write its "
                        f"frame (or add a segment for it with storage.add_segment) before exporting."
                    )
                segment, offset = found
                last = pieces[-1] if pieces else None
                if last is not None and last.segment.id == segment.id and last.first + last.count == offset:
                    last.count += 1
                else:
                    pieces.append(_Piece(segment, offset, 1))
            out.append(pieces)
        return out

    def _copy_delay(self, per_episode) -> int | None:
        """The decode delay (in frames) of one MP4 stream holding every piece copied packet by packet, or
        ``None`` when they cannot be: they must be H.264/AV1 segments of one set of stream parameters, each piece
        starting on a keyframe and ending at a keyframe or its segment's end (no kept frame refers to a dropped
        one)."""
        probed, params, delay = {}, set(), 0
        for pieces in per_episode:
            for piece in pieces:
                segment = piece.segment
                if segment.codec not in COPIED_CODECS:
                    return None
                if segment.path not in probed:
                    probed[segment.path] = _stream_frames(segment.path, segment.stream_index)
                keyframes, fps, stream_params, depth = probed[segment.path]
                params.add(stream_params)
                if fps != self.fps or len(params) > 1:
                    return None
                start = segment.start_frame + piece.first
                end = start + piece.count
                if start not in keyframes or not (piece.first + piece.count == segment.num_frames or end in keyframes):
                    return None
                delay = max(delay, depth)
        return delay

    # -- writing ---------------------------------------------------------------------------------------------
    def _write_camera(self, key, column, episodes, order) -> dict:
        per_episode = self._pieces(key, episodes, order)
        delay = self._copy_delay(per_episode)
        copy = delay is not None
        file_number, out = -1, None
        try:
            for ep, pieces in zip(episodes, per_episode):
                if out is None or out.bytes >= _FILE_BYTES:
                    if out is not None:
                        out.close()
                    file_number += 1
                    chunk, index = divmod(file_number, CHUNKS_SIZE)
                    path = os.path.join(self.root, VIDEO_PATH.format(video_key=column, chunk_index=chunk,
                                                                     file_index=index))  # fmt: skip
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    out = _OutputVideo(path, self.fps, template=pieces[0].segment if copy else None,
                                       codec=self.video_codec, delay=delay or 0)  # fmt: skip
                    self.paths.append(path)
                start = out.frames
                if copy:
                    for piece in pieces:
                        out.copy(piece.segment, piece.first, piece.count)
                else:
                    rows = order[ep["from"] : ep["to"]]
                    for lo in range(0, len(rows), 256):  # bounded memory: 256 frames decoded at a time
                        out.encode(self._frames(key, rows[lo : lo + 256], pieces[0].segment))
                ep["videos"] = ep.get("videos", {})
                ep["videos"][column] = {"chunk_index": chunk, "file_index": index,
                                        "from_timestamp": start / self.fps, "to_timestamp": out.frames / self.fps}
        finally:
            if out is not None:
                out.close()
        if self.fsync:
            from torchrl._files import fsync_file

            for path in self.paths:
                fsync_file(path)
        return self._feature(column, per_episode[0][0].segment, out.info)

    def _frames(self, key, rows: torch.Tensor, segment) -> np.ndarray:
        """The frames of ``rows`` as uint8 ``[n, H, W, C]`` (decoded from their segments)."""
        frames = self.storage.get(rows).get(key)
        if tuple(frames.shape[-3:]) != (segment.height, segment.width, segment.channels):
            frames = frames.permute(0, 2, 3, 1)  # stored [C, H, W]
        return frames.contiguous().numpy()

    def _feature(self, column, segment, info) -> dict:
        return {
            "dtype": "video",
            "shape": [segment.height, segment.width, segment.channels],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": segment.height, "video.width": segment.width, "video.codec": info["codec"],
                "video.pix_fmt": info["pix_fmt"], "video.is_depth_map": False, "video.fps": self.fps,
                "video.channels": segment.channels, "has_audio": False,
            },
        }  # fmt: skip


class _OutputVideo:
    """One MP4 file being written: packets copied from segments (``template``: the first segment) or frames
    encoded with ``codec``. Frame ``i`` of the file is at ``i / fps`` seconds. Copied packets get the decode
    timestamps ``k - delay`` (``k``: their place in the file's decode order), which increase and never pass their
    presentation time however the segments' encoders reordered frames, when ``delay`` is at least every segment's
    reorder depth."""

    def __init__(self, path: str, fps: int, *, template, codec: str, delay: int = 0):
        av = _av()
        self.path, self.fps, self.frames, self.bytes = path, fps, 0, 0
        self.delay, self.packets = delay, 0
        self.tick = fractions.Fraction(1, fps)
        self.container = av.open(path, "w", format="mp4")
        self.stream, self.codec, self.encoding = None, codec, False
        if template is not None:
            with av.open(template.path) as source:
                self.stream = self.container.add_stream_from_template(source.streams.video[template.stream_index],
                                                                     opaque=True)
            self.info = {"codec": template.codec, "pix_fmt": self.stream.codec_context.pix_fmt}

    def copy(self, segment, first: int, count: int) -> None:
        """Frames ``first .. first + count - 1`` of ``segment`` (its own numbering) appended, packets copied."""
        av = _av()
        lo = segment.start_frame + first
        hi = lo + count
        with av.open(segment.path) as source:
            stream = source.streams.video[segment.stream_index]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps, tb, start = fractions.Fraction(rate), stream.time_base, stream.start_time or 0
            source.seek(int(start + fractions.Fraction(lo) / fps / tb), stream=stream, backward=True)
            for packet in source.demux(stream):
                if packet.pts is None or packet.dts is None:
                    continue
                frame = int(round((packet.pts - start) * tb * fps))
                if frame < lo or frame >= hi:
                    if frame >= hi + 16:  # past the range (and past any reordering delay)
                        break
                    continue
                packet.pts = self.frames + frame - lo
                packet.dts = self.packets - self.delay
                self.packets += 1
                packet.time_base = self.tick
                packet.duration = 1
                packet.stream = self.stream
                self.bytes += packet.size
                self.container.mux(packet)
        self.frames += count

    def encode(self, frames: np.ndarray) -> None:
        """``frames`` (uint8 ``[n, H, W, C]``) encoded and appended."""
        av = _av()
        n, height, width, channels = frames.shape
        if self.stream is None:
            encoder, options = _ENCODERS[self.codec]
            options = dict(options, g=str(2 * self.fps))
            self.stream = self.container.add_stream(encoder, rate=self.fps, options=options)
            self.stream.width, self.stream.height = width, height
            even = height % 2 == 0 and width % 2 == 0
            self.stream.pix_fmt = "yuv444p" if self.codec == "h264" or not even else "yuv420p"
            self.stream.codec_context.time_base = self.tick
            self.encoding = True
            self.info = {"codec": self.codec, "pix_fmt": self.stream.pix_fmt}
        fmt = "rgb24" if channels == 3 else "gray"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i] if channels == 3 else frames[i, ..., 0]),
                                               format=fmt)  # fmt: skip
            frame.pts = self.frames
            frame.time_base = self.tick
            self.frames += 1
            self._mux(self.stream.encode(frame))

    def _mux(self, packets) -> None:
        for packet in packets:
            self.bytes += packet.size
            self.container.mux(packet)

    def close(self) -> None:
        if self.container is None:
            return
        if self.encoding:
            self._mux(self.stream.encode())
        self.container.close()
        self.container = None
