"""A tensor storage that keeps its image entries as video: :class:`EncodedFrameStorage`.

Data model. Non-image entries live in the storage's tensor backing (a :class:`~torchrl.data.LazyTensorStorage`).
Each image entry (a *pixel key*: uint8 ``[C, H, W]`` or ``[H, W, C]`` per row) is kept outside it, per camera:

- ``loc`` (int64 ``[max_size, 2]``): where the frame of each row is, ``(segment id, frame)`` for a frame in a
  closed segment, ``(TAIL, slot)`` for one still raw in the tail ring, ``(NONE, 0)`` for a row without one;
- ``tail`` (uint8 ``[tail_frames, H, W, C]``): the ring of raw frames of the open segments;
- closed segments: video files (one stream each) in the scratch directory, each described by a JSON sidecar
  (``<file>.json``), so that a process sharing the storage finds a segment written after it started.

Writes append each row's frame to the open segment of its trajectory (``trajectory_key``; one stream without it) in
the tail ring; a segment is encoded (:mod:`._video_segments`) and closed when it holds ``segment_frames`` frames,
when its trajectory ends (an ``end_keys`` flag on the row) or when the tail ring is full (the largest open segment
is closed early). Overwriting a row (the ring buffer wrapping) drops its frame; a segment none of whose rows is
left is deleted. Only the process that built the storage writes frames (it alone knows the open segments).

NOTE [encoded frames across processes]: the ``loc`` maps and tail rings move to shared memory with
:meth:`~EncodedFrameStorage.share_memory_` (or when a DataLoader spawns workers), and closed segments are files:
readers in other processes see every frame written after they started, for pixel keys first written before
sharing. A reader racing the writer may read a tail slot being reused, as a reader of a row being overwritten may
in any shared storage.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import weakref
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.storages._video_segments as _video
from torchrl._validation import check_positive_int
from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers._shared.cleanup import make_scratch_dir, remove_owned_path
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages.lazy_tensor import LazyTensorStorage

__all__ = ["EncodedFrameStorage", "SegmentInfo"]

TAIL, NONE = -2, -1
# 2: the tail tensor holds the occupied slots only (in the order the document's "open" lists them), and segments
# over one file share its bytes; 1 (still read): the whole tail ring
SCHEMA_VERSION = 2
# probed in this order when no key is given: trajectories/keys.py's TRAJECTORY_KEYS (that package sits above storages)
_TRAJECTORY_KEYS = (("collector", "traj_ids"), "traj_ids", "episode")
_END_KEYS = (("next", "done"), ("next", "terminated"), ("next", "truncated"))


class SegmentInfo(NamedTuple):
    """A closed segment (see :meth:`EncodedFrameStorage.segments`).

    ``rows[i]`` is the storage row of frame ``start_frame + i`` of stream ``stream_index`` of ``path`` (``-1``
    once that row was overwritten); ``owned`` tells whether the storage deletes ``path`` with the segment.
    """

    id: int
    key: str | tuple
    path: str
    codec: str
    stream_index: int
    start_frame: int
    num_frames: int
    rows: torch.Tensor
    height: int
    width: int
    channels: int
    fps: float
    owned: bool


class _Camera:
    """The frames of one pixel key: layout, shape, the row map and the tail ring (writer state aside)."""

    def __init__(self, layout: str, hwc: tuple, max_size: int, tail_frames: int, shared: bool):
        self.layout, self.hwc = layout, tuple(int(s) for s in hwc)
        self.loc = torch.full((max_size, 2), NONE, dtype=torch.long)
        self.tail = torch.zeros((tail_frames, *self.hwc), dtype=torch.uint8)
        if shared:
            self.share_memory_()
        self.free = list(range(tail_frames - 1, -1, -1))  # writer only: free tail slots (pop from the end)
        self.open: dict[Any, dict[int, int]] = {}  # writer only: trajectory -> {row: tail slot}, in write order
        self.tail_trajectory: dict[int, Any] = {}  # writer only: row in the tail -> its trajectory

    def share_memory_(self) -> None:
        self.loc.share_memory_()
        self.tail.share_memory_()

    def item_shape(self) -> tuple:
        h, w, c = self.hwc
        return (c, h, w) if self.layout == "CHW" else (h, w, c)


class EncodedFrameStorage(LazyTensorStorage):
    """A storage that keeps uint8 image entries encoded as video and decodes only the frames a read asks for.

    Pixel-based RL stores one frame per step; as uint8 rows they dominate the memory of a buffer. This storage
    appends each trajectory's frames to short video segments (one per camera key), encoded with PyAV losslessly
    (``"ffv1"``: frames read back bit-identical) or lossily (``"h264"``, ``"av1"`` at a constant rate factor).
    Other entries are kept in tensors as in :class:`~torchrl.data.LazyTensorStorage`, so every sampler
    (:class:`~torchrl.data.SliceSampler`, ...) and :class:`~torchrl.data.replay_buffers.sample_units.FrameStack`
    work unchanged. A read of closed segments seeks once per segment to the keyframe before the first frame it
    needs and decodes that segment's frames in one pass (decoders are cached per process: each DataLoader worker
    decodes its own draws); frames of still-open segments are read raw. See the module docstring for the data
    model and NOTE [encoded frames across processes].

    Args:
        max_size (int): the capacity in rows.

    Keyword Args:
        pixel_keys (NestedKey or list of NestedKey): the uint8 image entries to encode. Defaults to ``"pixels"``.
        codec (str): ``"ffv1"`` (lossless), ``"h264"`` or ``"av1"`` (lossy). Defaults to ``"ffv1"``.
        crf (int, optional): the constant rate factor of a lossy codec (lower: better and bigger). Defaults to
            ``None``: 12 for h264 (4:4:4; >= 35 dB PSNR at under a tenth of the uint8 bytes on moving camera
            content), 8 for av1 (4:2:0, which caps saturated colours near 30 dB; see :ref:`pixels-and-video`).
        segment_frames (int): the most frames per segment. Defaults to ``64``.
        keyframe_interval (int, optional): frames between keyframes; a read decodes at most that many frames to
            reach one. Defaults to ``None``: every frame for ffv1, 16 otherwise.
        fps (int): the frame rate written in the files (it only maps frames to timestamps). Defaults to ``30``.
        trajectory_key (NestedKey, optional): a per-row trajectory id; frames of different ids go to different
            segments. Defaults to ``None``: ``("collector", "traj_ids")``, ``"traj_ids"`` or ``"episode"`` (the
            first written), else the rows form one stream.
        end_keys (list of NestedKey, optional): per-row flags that end a trajectory (its segment closes). Defaults
            to ``None``: ``("next", "done")``, ``("next", "terminated")``, ``("next", "truncated")``.
        tail_frames (int, optional): raw frames held per key before encoding. Defaults to ``4 * segment_frames``.
        scratch_dir (str, optional): the directory of the segment files. Defaults to ``None``: a new temporary
            directory, removed with the storage.
        decoder (str): what decodes reads: ``"pyav"``, or ``"torchcodec"`` (``pip install torchcodec``; it counts
            in :meth:`stats` the frames returned, not those decoded to reach them). Defaults to ``"pyav"``.
        device: where non-image entries live and reads go. Defaults to ``"cpu"``.

    Raises:
        ValueError: an unknown or unavailable ``codec`` (the message lists the available ones), or a bad
            argument; writes of image entries that are not uint8 ``[C, H, W]``/``[H, W, C]`` (``C`` 1 or 3) or
            change shape raise ``TypeError``/``ValueError`` before anything is written.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import EncodedFrameStorage, ReplayBuffer
        >>> storage = EncodedFrameStorage(100, segment_frames=8)
        >>> rb = ReplayBuffer(storage=storage, batch_size=4)
        >>> frames = torch.randint(0, 256, (20, 3, 16, 16), dtype=torch.uint8)
        >>> _ = rb.extend(TensorDict(pixels=frames, reward=torch.zeros(20), batch_size=[20]))
        >>> bool((storage[torch.arange(20)]["pixels"] == frames).all())  # lossless
        True
        >>> len(storage.segments()), storage.stats()["tail_frames"]  # 2 closed segments, 4 raw frames
        (2, 4)
    """

    def __init__(
        self,
        max_size: int,
        *,
        pixel_keys=("pixels",),
        codec: str = "ffv1",
        crf: int | None = None,
        segment_frames: int = 64,
        keyframe_interval: int | None = None,
        fps: int = 30,
        trajectory_key=None,
        end_keys=None,
        tail_frames: int | None = None,
        scratch_dir: str | None = None,
        decoder: str = "pyav",
        device="cpu",
    ):
        spec = _video.check_codec(codec)
        self.decoder = _video.check_decoder(decoder)
        self.codec = codec
        self.pixel_keys = _check_keys("pixel_keys", pixel_keys)
        if crf is not None:
            if spec.lossless:
                raise ValueError(f"`crf`={crf!r} was given with the lossless codec {codec!r}: pass crf=None.")
            crf = check_positive_int("crf", crf) if crf != 0 else 0
        self.crf = crf
        self.segment_frames = check_positive_int("segment_frames", segment_frames)
        default_interval = 1 if spec.lossless else 16
        self.keyframe_interval = (
            default_interval if keyframe_interval is None else check_positive_int("keyframe_interval", keyframe_interval)
        )
        self.fps = check_positive_int("fps", fps)
        self.trajectory_key = None if trajectory_key is None else _check_keys("trajectory_key", trajectory_key)[0]
        self.end_keys = _END_KEYS if end_keys is None else _check_keys("end_keys", end_keys)
        self.tail_frames = (
            4 * self.segment_frames if tail_frames is None else check_positive_int("tail_frames", tail_frames)
        )
        if self.tail_frames < self.segment_frames:
            raise ValueError(
                f"`tail_frames`={self.tail_frames} is smaller than `segment_frames`={self.segment_frames}: the "
                f"tail ring holds the open segments; pass at least segment_frames."
            )
        if scratch_dir is None:
            scratch_dir = _video_scratch_dir(self)
        else:
            if not isinstance(scratch_dir, (str, os.PathLike)):
                raise TypeError(f"`scratch_dir` must be a directory path or None, got {scratch_dir!r}.")
            scratch_dir = os.path.abspath(os.fspath(scratch_dir))
            os.makedirs(scratch_dir, exist_ok=True)
        self.scratch_dir = scratch_dir
        super().__init__(max_size, device=device)
        self._cameras: dict[tuple, _Camera] = {}
        self._segments: dict[int, dict] = {}  # id -> description (and, in the writer, "live": rows still using it)
        self._token = uuid.uuid4().hex[:12]
        self._next_segment = 0
        self._writer_pid = os.getpid()

    # -- writes -------------------------------------------------------------------------------------------------
    def check_write(self, data, n: int):
        return None  # validated in the write itself (frames and the other entries)

    def _locked_write(self, cursor, data, set_cursor: bool, filled_only: bool, ring=None) -> None:
        if not isinstance(data, TensorDictBase) or not any(data.get(k, None) is not None for k in self.pixel_keys):
            plan = None if not isinstance(data, TensorDictBase) else self._plan(cursor, data, {})
            super()._locked_write(cursor, data, set_cursor, filled_only, ring)
            if plan is not None:
                with self.write_lock:
                    self._put_frames(*plan)
            return
        frames = {key: data.get(key) for key in self.pixel_keys if data.get(key, None) is not None}
        plan = self._plan(cursor, data, frames)  # validates every frame before anything is written
        super()._locked_write(cursor, data.exclude(*frames), set_cursor, filled_only, ring)
        with self.write_lock:
            self._put_frames(*plan)

    def _plan(self, cursor, data: TensorDictBase, frames: dict) -> tuple:
        """``(rows, frames per key as [n, H, W, C], trajectory per row, end flag per row)``, all validated."""
        if (frames or self._cameras) and os.getpid() != self._writer_pid:  # a write drops the rows' old frames
            raise RuntimeError(
                f"EncodedFrameStorage takes frame writes from the process that built it (pid {self._writer_pid}) "
                f"only, which keeps the open segments and the segments' row counts; this is pid {os.getpid()}. "
                f"Write from that process, or build a storage in this one."
            )
        single = isinstance(cursor, int) or (isinstance(cursor, torch.Tensor) and cursor.ndim == 0)
        if single:
            rows = torch.tensor([int(cursor)])
        elif isinstance(cursor, slice):
            rows = torch.arange(self.max_size)[cursor]
        else:
            rows = torch.as_tensor(cursor).reshape(-1).long()
        rows = rows.remainder(self.max_size)
        n = rows.numel()
        hwc = {}
        for key, value in frames.items():
            hwc[key] = self._check_frames(key, value, n, single)
        per_row = None if single else n
        traj = self._per_row(data, self._trajectory_key(data), per_row)
        ends = None
        for key in self.end_keys:
            flag = self._per_row(data, key, per_row)
            if flag is not None:
                ends = flag.bool() if ends is None else ends | flag.bool()
        return rows, hwc, traj, ends

    def _check_frames(self, key, value, n: int, single: bool) -> np.ndarray:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"The pixel entry {key!r} must be a uint8 tensor, got {type(value).__name__}.")
        if value.dtype != torch.uint8:
            raise TypeError(
                f"The pixel entry {key!r} must be uint8 (frames of 0..255), got {value.dtype}. Convert it with "
                f"`.to(torch.uint8)` (e.g. `(x * 255).round().to(torch.uint8)` for [0, 1] floats), or leave "
                f"it out of `pixel_keys`."
            )
        item = tuple(value.shape) if single else tuple(value.shape[1:])
        if (not single and (value.ndim != 4 or value.shape[0] != n)) or len(item) != 3:
            raise ValueError(
                f"The pixel entry {key!r} must hold one [C, H, W] or [H, W, C] frame per row (C 1 or 3), got "
                f"shape {list(value.shape)} for {n} row(s)."
            )
        camera = self._cameras.get(key)
        if camera is not None:
            if item != camera.item_shape():
                raise ValueError(
                    f"The pixel entry {key!r} holds frames of shape {list(camera.item_shape())}, got "
                    f"{list(item)}: every frame of a key has one shape. Resize the frames, or use another key."
                )
            layout = camera.layout
        elif item[0] in (1, 3):
            layout = "CHW"
        elif item[2] in (1, 3):
            layout = "HWC"
        else:
            raise ValueError(
                f"The pixel entry {key!r} has frames of shape {list(item)}: expected [C, H, W] or [H, W, C] "
                f"with C = 1 (gray) or 3 (RGB)."
            )
        frames = value.detach().to("cpu")
        if single:
            frames = frames.unsqueeze(0)
        if layout == "CHW":
            frames = frames.permute(0, 2, 3, 1)
        h, w = frames.shape[1:3]
        if self.codec == "av1" and (h % 2 or w % 2):
            raise ValueError(
                f"The codec 'av1' encodes 4:2:0 frames, whose height and width must be even; the pixel entry "
                f"{key!r} has {h}x{w} frames. Pad or crop them, or use codec='h264' or 'ffv1'."
            )
        return layout, frames.contiguous()

    def _trajectory_key(self, data: TensorDictBase):
        if self.trajectory_key is not None:
            return self.trajectory_key
        return next((key for key in _TRAJECTORY_KEYS if data.get(key, None) is not None), None)

    def _per_row(self, data: TensorDictBase, key, n: int | None):
        value = None if key is None else data.get(key, None)
        if value is None:
            return None
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"The entry {key!r} must be a tensor (one value per row), got {type(value).__name__}.")
        if n is None:
            return value.reshape(-1)[:1].cpu()
        if value.ndim == 0 or value.shape[0] != n or value[0].numel() != 1:
            raise ValueError(f"The entry {key!r} must hold one value per row ([{n}] or [{n}, 1]), got shape "
                             f"{list(value.shape)}.")
        return value.reshape(n).cpu()

    def _put_frames(self, rows: torch.Tensor, hwc: dict, traj, ends) -> None:
        """Stores each row's frame in its trajectory's open segment (closing full or ended ones); a row without
        a frame for a key loses the one it held."""
        rows_list = rows.tolist()
        traj_list = [0] * len(rows_list) if traj is None else traj.tolist()
        end_list = [False] * len(rows_list) if ends is None else ends.tolist()
        for key in self.pixel_keys:
            camera = self._cameras.get(key)
            written = hwc.get(key)
            if written is not None and camera is None:
                layout, frames = written
                camera = self._cameras[key] = _Camera(
                    layout, frames.shape[1:], self.max_size, self.tail_frames, self.is_shared
                )
            if camera is None:
                continue
            for i, row in enumerate(rows_list):
                self._drop_row(camera, row)
                if written is None:
                    continue
                if not camera.free:
                    self._close(key, camera, max(camera.open, key=lambda t: len(camera.open[t])))
                slot = camera.free.pop()
                camera.tail[slot] = written[1][i]
                t = traj_list[i]
                camera.open.setdefault(t, {})[row] = slot
                camera.tail_trajectory[row] = t
                camera.loc[row, 1] = slot
                camera.loc[row, 0] = TAIL
                if end_list[i] or len(camera.open[t]) >= self.segment_frames:
                    self._close(key, camera, t)

    def _drop_row(self, camera: _Camera, row: int) -> None:
        seg, pos = camera.loc[row].tolist()
        if seg == NONE:
            return
        camera.loc[row, 0] = NONE
        if seg == TAIL:
            t = camera.tail_trajectory.pop(row)
            camera.free.append(camera.open[t].pop(row))
            if not camera.open[t]:
                del camera.open[t]
            return
        desc = self._segments.get(seg)
        if desc is not None:
            desc["live"] -= 1
            if desc["live"] <= 0:
                self._delete_segment(seg)

    def _close(self, key, camera: _Camera, t) -> None:
        """Encodes the open segment of trajectory ``t`` of ``key`` into a new file and points its rows at it."""
        entries = camera.open.pop(t)
        rows, slots = list(entries), list(entries.values())
        frames = camera.tail[torch.tensor(slots)].numpy()
        seg = self._next_segment
        self._next_segment += 1
        path = os.path.join(self.scratch_dir, f"seg-{self._token}-{seg:08d}{_video.CODECS[self.codec].suffix}")
        size = _video.encode_segment(
            frames, path, self.codec, crf=self.crf, fps=self.fps, keyframe_interval=self.keyframe_interval
        )
        h, w, c = camera.hwc
        desc = {
            "key": list(_as_tuple(key)), "path": path, "codec": self.codec, "stream_index": 0, "start_frame": 0,
            "num_frames": len(rows), "rows": rows, "height": h, "width": w, "channels": c, "fps": float(self.fps),
            "owned": True, "bytes": size, "keyframe_interval": self.keyframe_interval,
        }
        self._register(seg, desc)
        index = torch.tensor(rows)
        camera.loc[index, 1] = torch.arange(len(rows))
        camera.loc[index, 0] = seg
        for row in rows:
            del camera.tail_trajectory[row]
        camera.free.extend(slots)

    def _register(self, seg: int, desc: dict) -> None:
        """Publishes segment ``seg``: its JSON sidecar first (what other processes read), then this process's
        catalogue entry."""
        sidecar = self._sidecar_of(seg) + ".json"
        with open(sidecar + ".part", "w") as f:
            json.dump({k: v for k, v in desc.items() if k != "rows"}, f)
        os.replace(sidecar + ".part", sidecar)
        self._segments[seg] = {**desc, "live": len(desc["rows"])}

    def _delete_segment(self, seg: int) -> None:
        desc = self._segments.pop(seg)
        _video.forget(desc["path"])
        if desc["owned"]:
            _unlink(desc["path"])
        _unlink(self._sidecar_of(seg) + ".json")

    def _sidecar_of(self, seg: int) -> str:
        return os.path.join(self.scratch_dir, f"seg-{self._token}-{seg:08d}")

    def close_segments(self) -> None:
        """Encodes every open segment now (e.g. before exporting :meth:`segments`)."""
        with self.write_lock:
            for key, camera in self._cameras.items():
                for t in list(camera.open):
                    self._close(key, camera, t)

    # -- segments of existing files ----------------------------------------------------------------------------
    def add_segment(self, path, rows, *, key="pixels", stream_index: int = 0, start_frame: int = 0,
                    copy: bool = False, layout: str = "CHW") -> int:
        """Makes frames ``start_frame .. start_frame + len(rows) - 1`` of video stream ``stream_index`` of the
        existing file ``path`` the frames of the storage rows ``rows`` for pixel key ``key``, without decoding or
        re-encoding them; returns the new segment's id.

        The stream must have a constant frame rate (frame ``i`` is at ``i / fps`` after its start). ``copy=False``
        reads ``path`` where it is (the storage never deletes it); ``copy=True`` hard-links (or copies) it into
        :attr:`scratch_dir`, owned by the storage. ``layout`` (``"CHW"`` or ``"HWC"``) is the layout reads return
        for a key that holds no frame yet. Rows that held a frame of ``key`` lose it.

        Examples:
            >>> import os, tempfile, torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import EncodedFrameStorage
            >>> src = EncodedFrameStorage(10)
            >>> frames = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
            >>> src.set(torch.arange(4), TensorDict(pixels=frames, batch_size=[4])); src.close_segments()
            >>> seg = src.segments()[0]
            >>> dst = EncodedFrameStorage(10)
            >>> dst.set(torch.arange(4), TensorDict(reward=torch.zeros(4), batch_size=[4]))
            >>> _ = dst.add_segment(seg.path, torch.arange(4), copy=True)
            >>> bool((dst[torch.arange(4)]["pixels"] == frames).all())
            True
        """
        key = _check_keys("key", key)[0]
        if key not in self.pixel_keys:
            raise ValueError(f"`key`={key!r} is not one of the storage's `pixel_keys` {list(self.pixel_keys)}.")
        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
            raise ValueError(f"`path` must name an existing video file, got {path!r}.")
        if layout not in ("CHW", "HWC"):
            raise ValueError(f"`layout` must be 'CHW' or 'HWC', got {layout!r}.")
        rows_t = torch.as_tensor(rows).reshape(-1).long()
        if rows_t.numel() == 0 or int(rows_t.min()) < 0 or int(rows_t.max()) >= self.max_size:
            raise ValueError(f"`rows` must be a non-empty list of storage rows in 0..{self.max_size - 1}, got {rows!r}.")
        if rows_t.unique().numel() != rows_t.numel():
            raise ValueError("`rows` lists a row twice: each frame of a segment is the frame of one row.")
        start_frame = int(start_frame)
        if start_frame < 0:
            raise ValueError(f"`start_frame` must be >= 0, got {start_frame}.")
        if os.getpid() != self._writer_pid:
            raise RuntimeError(f"add_segment runs in the process that built the storage (pid {self._writer_pid}).")
        info = _video.probe_stream(os.path.abspath(os.fspath(path)), int(stream_index))
        if info["frames"] and start_frame + rows_t.numel() > info["frames"]:
            raise ValueError(
                f"`path` {path!r} holds {info['frames']} frames; frames {start_frame}..{start_frame + rows_t.numel() - 1} "
                f"were asked for. Pass `start_frame` and `rows` within the stream."
            )
        camera = self._cameras.get(key)
        hwc = (info["height"], info["width"], 3)
        if camera is not None and camera.hwc != hwc:
            raise ValueError(f"The key {key!r} holds {list(camera.hwc)} (H, W, C) frames; {path!r} has {list(hwc)}.")
        with self.write_lock:
            if camera is None:
                camera = self._cameras[key] = _Camera(layout, hwc, self.max_size, self.tail_frames, self.is_shared)
            seg = self._next_segment
            self._next_segment += 1
            target = os.path.abspath(os.fspath(path))
            if copy:
                target = self._sidecar_of(seg) + os.path.splitext(target)[1]
                _link_or_copy(path, target)
            for row in rows_t.tolist():
                self._drop_row(camera, row)
            desc = {
                "key": list(_as_tuple(key)), "path": target, "codec": info["codec"], "stream_index": int(stream_index),
                "start_frame": start_frame, "num_frames": rows_t.numel(), "rows": rows_t.tolist(), "height": hwc[0],
                "width": hwc[1], "channels": 3, "fps": info["fps"], "owned": bool(copy),
                "bytes": os.path.getsize(target), "keyframe_interval": None,
            }
            self._register(seg, desc)
            camera.loc[rows_t, 1] = torch.arange(rows_t.numel())
            camera.loc[rows_t, 0] = seg
        return seg

    def segments(self, key=None) -> list[SegmentInfo]:
        """The closed segments (of pixel key ``key``, or all), oldest first: what an export copies as it is."""
        wanted = None if key is None else _as_tuple(_check_keys("key", key)[0])
        out = []
        for seg, desc in sorted(self._segments.items()):
            k = tuple(desc["key"])
            if wanted is not None and k != wanted:
                continue
            camera = self._cameras[k if len(k) > 1 else k[0]]
            rows = torch.tensor(desc["rows"], dtype=torch.long)
            loc = camera.loc[rows]
            alive = (loc[:, 0] == seg) & (loc[:, 1] == torch.arange(rows.numel()))
            out.append(SegmentInfo(
                seg, k if len(k) > 1 else k[0], desc["path"], desc["codec"], desc["stream_index"], desc["start_frame"],
                desc["num_frames"], torch.where(alive, rows, torch.full_like(rows, -1)), desc["height"],
                desc["width"], desc["channels"], desc["fps"], desc["owned"],
            ))
        return out

    # -- reads --------------------------------------------------------------------------------------------------
    def get(self, index, *, decode: bool = True):
        """Reads rows as :class:`~torchrl.data.LazyTensorStorage` does, with each pixel key's frames decoded
        (uint8, in the layout written); a row without a frame for a key raises ``KeyError``.

        ``decode=False`` reads the other entries only (no pixel key, nothing decoded): what a reader that takes the
        frames from :meth:`segments` (an export) needs.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import EncodedFrameStorage
            >>> storage = EncodedFrameStorage(10)
            >>> frames = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
            >>> storage.set(torch.arange(4), TensorDict(pixels=frames, reward=torch.ones(4), batch_size=[4]))
            >>> sorted(storage.get(torch.arange(2), decode=False).keys())
            ['reward']
        """
        if not isinstance(decode, bool):
            raise TypeError(f"`decode` must be True (decode the pixel keys) or False (leave them out), got {decode!r}.")
        out = super().get(index)
        if not decode or not self._cameras or not isinstance(out, TensorDictBase):
            return out
        rows = self._rows_of(index)
        for key, camera in self._cameras.items():
            out.set(key, self._read_frames(key, camera, rows).to(out.device))
        return out

    def read_rows(self, index):
        return self.get(index)

    def _rows_of(self, index) -> torch.Tensor:
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        n = self.rows_written()
        if isinstance(index, torch.Tensor) and index.dtype == torch.long:
            return index.cpu().remainder(n)
        if isinstance(index, int):
            return torch.tensor(index).remainder(n)
        return torch.arange(n)[index]

    def _read_frames(self, key, camera: _Camera, rows: torch.Tensor) -> torch.Tensor:
        # gathers in numpy: torch's parallel copies leave OpenMP threads spinning, which take the cores the
        # decoder needs between them (a uniform draw of 256 frames: 2x slower on 2 cores)
        flat = rows.reshape(-1)
        loc = camera.loc[flat].numpy()
        seg, pos = loc[:, 0], loc[:, 1]
        out = np.empty((flat.numel(), *camera.hwc), dtype=np.uint8)
        tail = seg == TAIL
        if tail.any():
            out[tail] = camera.tail.numpy()[pos[tail]]
        missing = seg == NONE
        if missing.any():
            raise KeyError(
                f"The rows {flat[torch.from_numpy(missing)][:8].tolist()} hold no frame of the pixel key {key!r}: "
                f"they were written without it. Write frames with every row, or add a segment for them (add_segment)."
            )
        where = np.flatnonzero(~(tail | missing))
        if where.size:
            segs = seg[where]
            decode = _video.decode_frames if self.decoder == "pyav" else _video.decode_frames_torchcodec
            for s in np.unique(segs).tolist():
                at = where[segs == s]
                desc = self._segment(s)
                wanted, inverse = np.unique(pos[at], return_inverse=True)
                decoded = decode(
                    desc["path"], desc["stream_index"], wanted + desc["start_frame"], camera.hwc[2],
                    reseek_gap=desc.get("keyframe_interval"),
                )
                out[at] = decoded[inverse.reshape(-1)]
        frames = torch.from_numpy(out)
        if camera.layout == "CHW":
            frames = frames.permute(0, 3, 1, 2)
        return frames.reshape(*rows.shape, *camera.item_shape())

    def _segment(self, seg: int) -> dict:
        desc = self._segments.get(seg)
        if desc is None:  # a segment closed by the writing process after this one started
            try:
                with open(self._sidecar_of(seg) + ".json") as f:
                    desc = json.load(f)
            except FileNotFoundError:
                raise RuntimeError(
                    f"The segment {seg} of {self.scratch_dir!r} is gone: the rows that pointed at it were "
                    f"overwritten while they were read. Draw again."
                ) from None
            self._segments[seg] = {**desc, "rows": [], "live": 0}
        return desc

    def stats(self) -> dict[str, int]:
        """Counters of this process: ``frames_decoded`` and ``seeks`` (reads), and the ``segments``,
        ``closed_frames``, ``tail_frames``, ``encoded_bytes`` (of the closed segments' files) and ``raw_bytes``
        (what the closed and tail frames take as uint8) this process knows of."""
        counts = dict(_video.counters())
        closed = [d for d in self._segments.values() if d.get("live", 0) > 0]
        tail = sum(len(rows) for c in self._cameras.values() for rows in c.open.values())
        frame_bytes = {k: int(np.prod(c.hwc)) for k, c in self._cameras.items()}
        raw = sum(d["num_frames"] * d["height"] * d["width"] * d["channels"] for d in closed)
        raw += sum(len(rows) * frame_bytes[k] for k, c in self._cameras.items() for rows in c.open.values())
        counts.update(
            segments=len(closed), closed_frames=sum(d["num_frames"] for d in closed), tail_frames=tail,
            encoded_bytes=sum(d["bytes"] for d in closed), raw_bytes=raw,
        )
        return counts

    # -- sharing, emptying --------------------------------------------------------------------------------------
    def share_memory_(self) -> EncodedFrameStorage:
        super().share_memory_()
        for camera in self._cameras.values():
            camera.share_memory_()
        return self

    def _empty(self) -> None:
        super()._empty()
        with self.write_lock:
            self._drop_all()

    def _drop_all(self) -> None:
        for seg in list(self._segments):
            if "live" in self._segments[seg] and os.getpid() == self._writer_pid:
                self._delete_segment(seg)
        self._segments.clear()
        for camera in self._cameras.values():
            camera.loc.fill_(NONE)
            camera.open.clear()
            camera.tail_trajectory.clear()
            camera.free = list(range(self.tail_frames - 1, -1, -1))

    # -- state and checkpoints ----------------------------------------------------------------------------------
    # The frames' part of a checkpoint or state dict: per camera (in ``pixel_keys`` order), the ``loc`` map, the
    # raw frames of the occupied tail slots and one uint8 tensor of the closed segments' file bytes, as they are
    # (no re-encode; a file several segments use, as a LeRobot import's, once); the JSON ``encoded_frames``
    # document describes each segment (its byte range there) and the open segments (their rows and tail slots).
    def _frames_part(self) -> tuple[dict, dict]:
        tensors, cameras = {}, []
        for i, (key, camera) in enumerate(self._cameras.items()):
            loc = camera.loc.clone()
            segments, blobs, offset, saved = [], [], 0, {}
            for seg in sorted(set(loc[:, 0].tolist()) - {TAIL, NONE}):
                desc = self._segment(seg)
                stat = os.stat(desc["path"])
                identity = (stat.st_dev, stat.st_ino)  # hard links and shared files are one file
                if identity not in saved:
                    data = np.fromfile(desc["path"], dtype=np.uint8)
                    blobs.append(data)
                    saved[identity] = (offset, int(data.size))
                    offset += int(data.size)
                start, nbytes = saved[identity]
                segments.append({
                    "id": seg, "codec": desc["codec"], "stream_index": desc["stream_index"],
                    "start_frame": desc["start_frame"], "num_frames": desc["num_frames"], "fps": desc["fps"],
                    "suffix": os.path.splitext(desc["path"])[1], "offset": start, "nbytes": nbytes,
                    "keyframe_interval": desc.get("keyframe_interval"),
                })
            slots = [slot for rows in camera.open.values() for slot in rows.values()]
            tensors[f"{i}/loc"] = loc
            tensors[f"{i}/tail"] = camera.tail[torch.tensor(slots, dtype=torch.long)].clone()
            tensors[f"{i}/segments"] = torch.from_numpy(np.concatenate(blobs) if blobs else np.zeros(0, np.uint8))
            cameras.append({
                "key": list(_as_tuple(key)), "layout": camera.layout, "hwc": list(camera.hwc),
                "segments": segments,
                "open": [[_json_id(t), [[r, slot] for r, slot in rows.items()]] for t, rows in camera.open.items()],
            })
        doc = {
            "schema_version": SCHEMA_VERSION, "codec": self.codec, "pixel_keys": [list(_as_tuple(k)) for k in
            self.pixel_keys], "tail_frames": self.tail_frames, "cameras": cameras,
        }
        return tensors, doc

    def _check_frames_part(self, doc, tensors, where: str) -> None:
        def bad(what: str):
            return CheckpointError(f"{where}: {what}. Nothing was loaded.")

        if not isinstance(doc, dict) or doc.get("schema_version") not in (1, SCHEMA_VERSION):
            got = doc.get("schema_version") if isinstance(doc, dict) else doc
            raise bad(f"the encoded frames have schema_version {got!r}; this torchrl reads 1 to {SCHEMA_VERSION}")
        mine = [list(_as_tuple(k)) for k in self.pixel_keys]
        for field, expected in (("codec", self.codec), ("pixel_keys", mine), ("tail_frames", self.tail_frames)):
            if doc.get(field) != expected:
                raise bad(
                    f"`{field}` is {doc.get(field)!r} in the checkpoint, {expected!r} here: build the "
                    f"EncodedFrameStorage with {field}={doc.get(field)!r}"
                )
        cameras = doc.get("cameras")
        if not isinstance(cameras, list) or len(cameras) > len(mine):
            raise bad("`cameras` is not a list of at most one entry per pixel key")
        for i, cam in enumerate(cameras):
            try:
                loc, tail, blob = (tensors[f"{i}/{name}"] for name in ("loc", "tail", "segments"))
                hwc = [int(v) for v in cam["hwc"]]
                assert cam["key"] in mine and cam["layout"] in ("CHW", "HWC") and len(hwc) == 3
                assert loc.dtype == torch.long and tuple(loc.shape) == (self.max_size, 2)
                slots = [slot for _, rows in cam["open"] for _, slot in rows]
                ring = self.tail_frames if doc["schema_version"] == 1 else len(slots)
                assert tail.dtype == torch.uint8 and tuple(tail.shape) == (ring, *hwc)
                assert blob.dtype == torch.uint8 and blob.ndim == 1
                ids = set()
                for seg in cam["segments"]:
                    assert seg["offset"] >= 0 and seg["nbytes"] > 0 and seg["offset"] + seg["nbytes"] <= blob.numel()
                    assert seg["suffix"] in (".mkv", ".mp4", ".nut", ".avi", ".webm", ".mov")
                    ids.add(int(seg["id"]))
                segs = set(loc[:, 0].tolist()) - {TAIL, NONE}
                assert segs <= ids and min(segs | {0}) >= 0
                assert all(0 <= s < self.tail_frames for s in slots) and len(set(slots)) == len(slots)
            except (KeyError, TypeError, ValueError, AssertionError) as err:
                raise bad(f"the encoded frames of camera {i} are inconsistent ({type(err).__name__} {err})") from None

    def _load_frames_part(self, doc: dict, tensors) -> None:
        self._drop_all()
        self._token = uuid.uuid4().hex[:12]  # new file names: no process reads a stale decoder of an old one
        self._writer_pid = os.getpid()
        cameras = {}
        for i, cam in enumerate(doc["cameras"]):
            key = tuple(cam["key"]) if len(cam["key"]) > 1 else cam["key"][0]
            old = self._cameras.get(key)
            hwc = tuple(int(v) for v in cam["hwc"])
            if old is not None and old.hwc == hwc:
                camera, camera.layout = old, cam["layout"]
            else:
                camera = _Camera(cam["layout"], hwc, self.max_size, self.tail_frames, self.is_shared)
            camera.loc.copy_(tensors[f"{i}/loc"])
            slots = [int(slot) for _, rows in cam["open"] for _, slot in rows]
            if doc["schema_version"] == 1:  # the whole ring
                camera.tail.copy_(tensors[f"{i}/tail"])
            elif slots:
                camera.tail[torch.tensor(slots, dtype=torch.long)] = tensors[f"{i}/tail"]
            blob = tensors[f"{i}/segments"].numpy()
            loc = camera.loc
            written: dict[tuple, str] = {}  # byte range -> the file written for it: segments sharing it link it
            for seg in cam["segments"]:
                sid = int(seg["id"])
                path = self._sidecar_of(sid) + seg["suffix"]
                span = (int(seg["offset"]), int(seg["nbytes"]))
                if span in written:  # each segment owns a name of its own (removed with it), one file's bytes
                    _link_or_copy(written[span], path)
                else:
                    blob[span[0]: span[0] + span[1]].tofile(path)
                    written[span] = path
                at = (loc[:, 0] == sid).nonzero().squeeze(1)
                rows = torch.full((int(seg["num_frames"]),), -1, dtype=torch.long)
                rows[loc[at, 1]] = at
                self._register(sid, {
                    "key": list(cam["key"]), "path": path, "codec": seg["codec"],
                    "stream_index": int(seg["stream_index"]), "start_frame": int(seg["start_frame"]),
                    "num_frames": int(seg["num_frames"]), "rows": rows.tolist(), "height": hwc[0], "width": hwc[1],
                    "channels": hwc[2], "fps": float(seg["fps"]), "owned": True, "bytes": int(seg["nbytes"]),
                    "keyframe_interval": _interval(seg.get("keyframe_interval")),
                })
                self._segments[sid]["live"] = int(at.numel())
                self._next_segment = max(self._next_segment, sid + 1)
            used = set()
            for t, rows in cam["open"]:
                t = tuple(t) if isinstance(t, list) else t
                camera.open[t] = {int(r): int(slot) for r, slot in rows}
                for r, slot in rows:
                    camera.tail_trajectory[int(r)] = t
                    used.add(int(slot))
            camera.free = [s for s in range(self.tail_frames - 1, -1, -1) if s not in used]
            cameras[key] = camera
        self._cameras = cameras

    def state_dict(self) -> dict[str, Any]:
        """:class:`~torchrl.data.LazyTensorStorage`'s state, plus ``"encoded_frames"``: ``{"doc": ..., "tensors":
        ...}``, the frames' maps, tail rings and segment bytes (see :meth:`dumps` for the layout)."""
        state = super().state_dict()
        tensors, doc = self._frames_part()
        state["encoded_frames"] = {"doc": doc, "tensors": tensors}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        frames = state_dict.get("encoded_frames") if isinstance(state_dict, dict) else None
        if not isinstance(frames, dict) or "doc" not in frames or "tensors" not in frames:
            raise TypeError(
                "`state_dict` must be the dict returned by EncodedFrameStorage.state_dict(), with its "
                "'encoded_frames' entry."
            )
        self._check_frames_part(frames["doc"], frames["tensors"], "The EncodedFrameStorage state dict")
        super().load_state_dict(state_dict)
        with self.write_lock:
            self._load_frames_part(frames["doc"], frames["tensors"])

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        """:class:`~torchrl.data.LazyTensorStorage`'s part (the non-image entries) plus the frames: tensors
        ``encoded_frames/<camera>/{loc,tail,segments}`` (``segments``: the segment files' bytes, copied as they
        are) and the JSON document ``encoded_frames`` (schema version, codec, per segment its byte range)."""
        tensors, doc = super().checkpoint_part(ctx)  # holds the write lock until the checkpoint is written
        frames, frames_doc = self._frames_part()
        tensors.update({ctx.name(f"encoded_frames/{name}"): t for name, t in frames.items()})
        return tensors, {**doc, "encoded_frames": frames_doc}

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        super().check_checkpoint_part(doc, tensors, ctx)
        prefix = ctx.name("encoded_frames/")
        mine = {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
        self._check_frames_part(doc.get("encoded_frames"), mine, f"The EncodedFrameStorage part of {ctx.path!r}")

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        super().load_checkpoint_part(doc, tensors, ctx)
        prefix = ctx.name("encoded_frames/")
        mine = {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
        with self.write_lock:
            self._load_frames_part(doc["encoded_frames"], mine)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, codec={self.codec!r}, pixel_keys={list(self.pixel_keys)})"


def _interval(value) -> int | None:
    """A saved keyframe interval: a positive int, else ``None`` (unknown: reads decode through gaps)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _json_id(t):
    """A trajectory id as JSON (ints stay ints; tuples become lists)."""
    return list(t) if isinstance(t, tuple) else t


def _as_tuple(key) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def _check_keys(name: str, keys) -> tuple:
    """``keys`` (a key or a list of keys) as a tuple of keys, each a str or a tuple of str."""
    if isinstance(keys, str) or (isinstance(keys, tuple) and keys and all(isinstance(k, str) for k in keys)
                                 and name in ("trajectory_key", "key")):
        keys = [keys]
    try:
        out = []
        for key in keys:
            if isinstance(key, str):
                out.append(key)
            elif isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
                out.append(key if len(key) > 1 else key[0])
            else:
                raise TypeError
    except TypeError:
        raise TypeError(
            f"`{name}` must be a key (a str or a tuple of str) or a list of keys, got {keys!r}."
        ) from None
    if not out:
        raise ValueError(f"`{name}` names no key: pass at least one, e.g. 'pixels'.")
    return tuple(out)


def _video_scratch_dir(owner) -> str:
    """A new temporary directory of segment files, removed with ``owner`` (in this process only)."""
    path = make_scratch_dir()
    weakref.finalize(owner, remove_owned_path, path)
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _link_or_copy(src, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
