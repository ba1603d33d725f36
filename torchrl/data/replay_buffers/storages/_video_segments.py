"""Video segments: the PyAV encode and decode functions of :class:`~torchrl.data.EncodedFrameStorage`.

Data model. A segment is one video stream in one file: ``num_frames`` frames from ``start_frame`` (presentation
order) of stream ``stream_index``, at a constant frame rate. Frame ``i`` of a stream is the frame whose timestamp is
``i / fps`` after the stream's start; that is how a read finds it after a seek (timestamps, not decode counts, so
a seek to any keyframe knows where it landed). Frames are uint8 ``[H, W, C]`` arrays here, ``C`` being 1 (gray) or
3 (RGB).

Codecs (:data:`CODECS`): ``"ffv1"`` is lossless (RGB frames go through ``bgr0``, gray frames through ``gray``:
both round-trip uint8 exactly), ``"h264"`` and ``"av1"`` are lossy at a constant rate factor (``crf``).

Reads (:func:`decode_frames`) keep opened containers in a small per-process LRU cache (:class:`_DecoderCache`;
a child process never uses nor closes its parent's), seek once per run of frames to the keyframe at or before its
first frame and decode forward to its last one (all-keyframe FFV1 streams: read the packets through and decode the
wanted ones only), counting the frames decoded and the seeks in :data:`COUNTERS`. Frames are converted with one
swscale context per file (or read straight from FFV1's planes), never one per frame.
"""

from __future__ import annotations

import collections
import fractions
import os
import threading
from typing import NamedTuple

import numpy as np

__all__ = [
    "CODECS",
    "COUNTERS",
    "CodecSpec",
    "available_codecs",
    "check_codec",
    "check_decoder",
    "decode_frames",
    "decode_frames_torchcodec",
    "encode_segment",
    "probe_stream",
]


class CodecSpec(NamedTuple):
    """How one codec name of the storage is written: PyAV encoder, container format, file suffix, pixel format
    per channel count, default ``crf`` (``None``: lossless) and whether the codec is lossless."""

    encoder: str
    container: str
    suffix: str
    pix_fmt: dict
    default_crf: int | None
    lossless: bool


CODECS: dict[str, CodecSpec] = {
    "ffv1": CodecSpec("ffv1", "matroska", ".mkv", {3: "bgr0", 1: "gray"}, None, True),
    # 4:4:4: chroma subsampling alone costs saturated, moving content ~10 dB of PSNR. CRF 12: >= 35 dB at <= 10% of
    # the uint8 bytes on benchmarks/_moving_episodes.py's episodes (64x64: 36.3 dB at 5.7%; 96x96: 37.3 dB at 4.0%)
    "h264": CodecSpec("libx264", "mp4", ".mp4", {3: "yuv444p", 1: "gray"}, 12, False),
    # libsvtav1 encodes 4:2:0 only, which caps those episodes near 29 dB (64x64) / 31 dB (96x96) even at CRF 1
    # (22% / 18% of the bytes); CRF 8 stays under 10% (64x64: 28.6 dB at 8.0%; 96x96: 30.7 dB at 5.2%)
    "av1": CodecSpec("libsvtav1", "mp4", ".mp4", {3: "yuv420p", 1: "yuv420p"}, 8, False),
}

#: Per-process read counters: ``frames_decoded`` (frames out of a decoder, including those decoded only to reach a
#: later frame) and ``seeks``. A child process starts its own (see :func:`counters`).
COUNTERS: dict[str, int] = {"frames_decoded": 0, "seeks": 0}
_COUNTERS_PID = [os.getpid()]


def counters() -> dict[str, int]:
    """This process's :data:`COUNTERS` (reset in a process forked from the one that counted)."""
    if _COUNTERS_PID[0] != os.getpid():
        _COUNTERS_PID[0] = os.getpid()
        COUNTERS.update(frames_decoded=0, seeks=0)
    return COUNTERS


def _av():
    try:
        import av
    except ImportError as err:  # pragma: no cover - av is a dependency of the video extra
        raise ImportError(
            "EncodedFrameStorage encodes frames with PyAV, which is not installed: pip install av "
            "(or torchrl[video])."
        ) from err
    return av


def available_codecs() -> list[str]:
    """The codec names of :data:`CODECS` whose encoder this PyAV build has."""
    av = _av()
    names = av.codecs_available
    return [name for name, spec in CODECS.items() if spec.encoder in names]


def check_codec(codec) -> CodecSpec:
    """The spec of ``codec``; ``ValueError`` naming the available codecs for an unknown or unavailable one."""
    available = available_codecs()
    if not isinstance(codec, str) or codec not in CODECS:
        raise ValueError(
            f"`codec` must be one of {sorted(CODECS)} (available in this PyAV build: {available}), got {codec!r}. "
            f"Pass 'ffv1' for lossless frames or 'h264'/'av1' for lossy ones."
        )
    if codec not in available:
        raise ValueError(
            f"`codec`={codec!r} needs the encoder {CODECS[codec].encoder!r}, which this PyAV build lacks; the "
            f"available codecs are {available}. Install a PyAV/FFmpeg with it or pass one of those."
        )
    return CODECS[codec]


def encode_segment(
    frames: np.ndarray, path: str, codec: str, *, crf: int | None, fps: int, keyframe_interval: int
) -> int:
    """Encodes ``frames`` (uint8 ``[N, H, W, C]``, ``C`` 1 or 3) into a new file ``path``; returns its size.

    The file is written under a temporary name and renamed, so a reader never sees a partial segment.
    """
    av = _av()
    spec = CODECS[codec]
    n, height, width, channels = frames.shape
    tmp = f"{path}.{os.getpid()}.part"
    options = {"g": str(keyframe_interval)}
    if spec.default_crf is not None:
        options["crf"] = str(spec.default_crf if crf is None else crf)
    if codec == "av1":
        options["preset"] = "10"
        options["svtav1-params"] = "lp=1"
    in_format = "rgb24" if channels == 3 else "gray"
    try:
        with av.open(tmp, "w", format=spec.container) as container:
            stream = container.add_stream(spec.encoder, rate=fps, options=options)
            stream.width, stream.height = width, height
            stream.pix_fmt = spec.pix_fmt[channels]
            stream.codec_context.time_base = fractions.Fraction(1, fps)
            stream.thread_count = 1
            for i in range(n):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i]), format=in_format)
                frame.pts = i
                frame.time_base = stream.codec_context.time_base
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return os.path.getsize(path)


def probe_stream(path: str, stream_index: int = 0) -> dict:
    """``{"codec", "width", "height", "fps", "frames"}`` of video stream ``stream_index`` of ``path`` (``frames``:
    the count the container declares, ``0`` when it declares none). Raises ``ValueError`` for a file PyAV cannot
    open or without that stream."""
    av = _av()
    try:
        with av.open(path) as container:
            streams = container.streams.video
            if not 0 <= stream_index < len(streams):
                raise ValueError(
                    f"`stream_index`={stream_index} is not a video stream of {path!r}, which has {len(streams)}: "
                    f"pass 0..{len(streams) - 1}."
                )
            stream = streams[stream_index]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            return {
                "codec": _CODEC_NAMES.get(stream.codec_context.name, stream.codec_context.name),
                "width": stream.codec_context.width,
                "height": stream.codec_context.height,
                "fps": float(rate) if rate else 0.0,
                "frames": int(stream.frames or 0),
            }
    except av.error.FFmpegError as err:
        raise ValueError(f"`path` {path!r} is not a video file PyAV can open ({err}).") from None


_CODEC_NAMES = {"libdav1d": "av1", "libaom-av1": "av1", "libsvtav1": "av1", "libx264": "h264"}  # decoder -> codec


class _Opened:
    __slots__ = ("container", "stream", "start", "seconds_per_tick", "fps", "reformatter", "ticks", "frames")

    def __init__(self, path: str, stream_index: int):
        av = _av()
        from av.video.reformatter import VideoReformatter

        self.container = av.open(path)
        # one converter per file: ``frame.to_ndarray(format=...)`` builds a new swscale context per frame, which
        # costs more than decoding a small frame
        self.reformatter = VideoReformatter()
        self.stream = self.container.streams.video[stream_index]
        self.stream.thread_type = "SLICE"
        self.start = self.stream.start_time or 0
        self.seconds_per_tick = self.stream.time_base
        rate = self.stream.average_rate or self.stream.guessed_rate or self.stream.base_rate
        self.fps = fractions.Fraction(rate)
        # frame index = ticks * self.ticks / self.frames (integers: Fraction arithmetic per frame costs)
        per_frame = self.seconds_per_tick * self.fps
        self.ticks, self.frames = per_frame.numerator, per_frame.denominator

    def index_of(self, pts) -> int:
        """The frame at ``pts``, rounded to the nearest (half to even, as ``round``)."""
        q, r = divmod((pts - self.start) * self.ticks, self.frames)
        return q + (2 * r > self.frames or (2 * r == self.frames and q % 2 == 1))

    def pts_of(self, index: int) -> int:
        """The timestamp of frame ``index`` (truncated to a tick)."""
        return self.start + (index * self.frames) // self.ticks


class _DecoderCache:
    """The containers opened by this process, least recently used first (at most ``capacity``)."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self.pid = os.getpid()
        self.opened: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()

    def adopt(self) -> None:
        """In a process forked from the one that opened the decoders: start with none and a new lock. The
        parent's decoders are kept (``inherited``), never used nor closed: closing one in a fork child waits
        forever on decoder threads that fork did not copy (and the parent's lock may have been held at fork)."""
        if self.pid != os.getpid():
            self.inherited = (self.opened, getattr(self, "inherited", None))
            self.pid, self.opened, self.lock = os.getpid(), collections.OrderedDict(), threading.Lock()

    def get(self, path: str, stream_index: int) -> _Opened:
        self.adopt()
        key = (path, stream_index)
        opened = self.opened.pop(key, None)
        if opened is None:
            opened = _Opened(path, stream_index)
            while len(self.opened) >= self.capacity:
                _, old = self.opened.popitem(last=False)
                old.container.close()
        self.opened[key] = opened
        return opened

    def drop(self, path: str) -> None:
        self.adopt()
        for key in [k for k in self.opened if k[0] == path]:
            self.opened.pop(key).container.close()


_CACHE = _DecoderCache()


def forget(path: str) -> None:
    """Closes this process's decoders of ``path`` (a segment file removed); never those a fork inherited."""
    _CACHE.adopt()
    with _CACHE.lock:
        _CACHE.drop(path)
        if _TORCHCODEC["pid"] == os.getpid():
            for key in [k for k in _TORCHCODEC["opened"] if k[0] == path]:
                del _TORCHCODEC["opened"][key]


def decode_frames(
    path: str, stream_index: int, wanted: np.ndarray, channels: int, *, reseek_gap: int | None = None
) -> np.ndarray:
    """The frames ``wanted`` (sorted unique stream frame indices) of ``path``: uint8 ``[len(wanted), H, W, C]``.

    One seek to the keyframe at or before ``wanted[0]``, then one forward decode pass to ``wanted[-1]``. With
    ``reseek_gap`` (the stream's largest keyframe interval, when known), the frames are split in runs wherever two
    wanted frames are more than ``reseek_gap`` apart, each run decoded after its own seek: a keyframe lies
    between them, so seeking decodes fewer frames than decoding through the gap. An FFV1 stream with
    ``reseek_gap=1`` (every frame a keyframe) is read in one pass from one seek, decoding only the packets of the
    frames wanted.
    """
    fmt = "rgb24" if channels == 3 else "gray"
    count = counters()
    out = []
    _CACHE.adopt()
    with _CACHE.lock:
        opened = _CACHE.get(path, stream_index)
        intra = reseek_gap == 1 and opened.stream.codec_context.name == "ffv1"
        runs = [wanted]
        if reseek_gap is not None and len(wanted) > 1 and not intra:
            runs = np.split(wanted, np.nonzero(np.diff(wanted) > reseek_gap)[0] + 1)
        for run in runs:
            frames = _decode_intra(opened, run, fmt, count) if intra else _decode(opened, run, fmt, count)
            if frames is None:  # the seek landed after the first frame asked for: decode from the start
                opened.container.seek(opened.start, stream=opened.stream, backward=True, any_frame=False)
                count["seeks"] += 1
                frames = (_decode_intra if intra else _decode)(opened, run, fmt, count, seek=False)
            if frames is None or len(frames) != len(run):
                got = 0 if frames is None else len(frames)
                raise RuntimeError(
                    f"The video segment {path!r} (stream {stream_index}) yielded {got} of the {len(run)} frames "
                    f"asked for (frames {run[0]}..{run[-1]}): the file is shorter than the segment it backs, or "
                    f"was replaced. Re-add it with the right frame range."
                )
            out.extend(frames)
    return np.stack(out)


def _decode(opened: _Opened, wanted: np.ndarray, fmt: str, count: dict, seek: bool = True):
    if seek:
        opened.container.seek(opened.pts_of(int(wanted[0])), stream=opened.stream, backward=True, any_frame=False)
        count["seeks"] += 1
    out = []
    pos = 0
    last = int(wanted[-1])
    for frame in opened.container.decode(opened.stream):
        count["frames_decoded"] += 1
        if frame.pts is None:
            continue
        index = opened.index_of(frame.pts)
        if not out and index > wanted[pos]:
            return None
        while pos < len(wanted) and wanted[pos] < index:  # a frame missing from the stream
            pos += 1
        if pos < len(wanted) and wanted[pos] == index:
            out.append(_to_array(opened, frame, fmt))
            pos += 1
        if index >= last or pos >= len(wanted):
            break
    return out


def _decode_intra(opened: _Opened, wanted: np.ndarray, fmt: str, count: dict, seek: bool = True):
    """:func:`_decode` for a stream whose every frame is a keyframe (FFV1): one seek, then the packets are read
    through and only those of ``wanted`` frames decoded (no seek per gap, no frame decoded to be dropped)."""
    if seek:
        opened.container.seek(opened.pts_of(int(wanted[0])), stream=opened.stream, backward=True, any_frame=False)
        count["seeks"] += 1
    out = []
    pos = 0
    last = int(wanted[-1])
    for packet in opened.container.demux(opened.stream):
        if packet.pts is None:  # the demuxer's end-of-stream packet
            continue
        index = opened.index_of(packet.pts)
        if not out and pos == 0 and index > wanted[0]:
            return None
        while pos < len(wanted) and wanted[pos] < index:  # a frame missing from the stream
            pos += 1
        if pos < len(wanted) and wanted[pos] == index:
            for frame in opened.stream.decode(packet):
                count["frames_decoded"] += 1
                out.append(_to_array(opened, frame, fmt))
            pos += 1
        if index >= last or pos >= len(wanted):
            break
    return out


def _to_array(opened: _Opened, frame, fmt: str) -> np.ndarray:
    """``frame`` as uint8 ``[H, W, C]`` in ``fmt`` (``"rgb24"`` or ``"gray"``). FFV1's own formats (``bgr0``,
    ``gray``) are read from the frame's plane (exact, no conversion); others go through the file's converter."""
    native = frame.format.name
    if native == "bgr0" and fmt == "rgb24" or native == fmt == "gray":
        plane = frame.planes[0]
        height, width, channels = frame.height, frame.width, 4 if native == "bgr0" else 1
        pixels = np.frombuffer(plane, np.uint8).reshape(height, plane.line_size)[:, : width * channels]
        pixels = pixels.reshape(height, width, channels)
        return pixels[..., 2::-1].copy() if channels == 4 else pixels.copy()
    array = opened.reformatter.reformat(frame, format=fmt).to_ndarray()
    return array[..., None] if array.ndim == 2 else array


DECODERS = ("pyav", "torchcodec")


def check_decoder(decoder) -> str:
    """``decoder`` if it names a usable decoder: ``"pyav"``, or ``"torchcodec"`` when that package is installed."""
    if decoder not in DECODERS:
        raise ValueError(f"`decoder` must be one of {list(DECODERS)}, got {decoder!r}.")
    if decoder == "torchcodec":
        try:
            import torchcodec.decoders  # noqa: F401
        except ImportError as err:
            raise ImportError(
                "decoder='torchcodec' needs the torchcodec package, which is not installed: pip install torchcodec, "
                "or pass decoder='pyav' (the default)."
            ) from err
    return decoder


_TORCHCODEC: dict = {"pid": None, "opened": collections.OrderedDict()}


def decode_frames_torchcodec(path: str, stream_index: int, wanted: np.ndarray, channels: int, **_) -> np.ndarray:
    """:func:`decode_frames` through torchcodec's ``VideoDecoder`` (``get_frames_at``, exact seek mode), its
    decoders kept in a per-process LRU cache as PyAV's are. Counts ``len(wanted)`` frames decoded and one seek
    per call (torchcodec does not report the frames it decodes to reach them)."""
    from torchcodec.decoders import VideoDecoder

    count = counters()
    _CACHE.adopt()
    with _CACHE.lock:
        if _TORCHCODEC["pid"] != os.getpid():
            _TORCHCODEC["pid"], _TORCHCODEC["opened"] = os.getpid(), collections.OrderedDict()
        opened = _TORCHCODEC["opened"]
        key = (path, stream_index)
        decoder = opened.pop(key, None)
        if decoder is None:
            decoder = VideoDecoder(path, stream_index=stream_index, dimension_order="NHWC", seek_mode="exact")
            while len(opened) >= _CACHE.capacity:
                opened.popitem(last=False)
        opened[key] = decoder
        frames = decoder.get_frames_at(indices=[int(i) for i in wanted]).data
    count["frames_decoded"] += len(wanted)
    count["seeks"] += 1
    array = frames.numpy()
    return np.ascontiguousarray(array[..., :1]) if channels == 1 else array
