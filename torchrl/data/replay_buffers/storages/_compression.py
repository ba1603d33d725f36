"""The byte codecs of :class:`~torchrl.data.CompressedListStorage`: the defaults and the user's functions.

A *compressor* turns one tensor into a uint8 tensor; a *decompressor* turns that back into a tensor, given
the metadata ``{"type", "shape": torch.Size, "dtype": torch.dtype, "device"}``. The default codec is
Zstandard (the ``zstandard`` package) when it is installed and ``zlib`` from the standard library otherwise.

NOTE [bounded reads]: the shape and dtype of an item come with its bytes (from a checkpoint, possibly
crafted), so the default decompressor trusts neither. It refuses a declared size that the stored bytes
cannot expand to (more than the codec's largest ratio, :data:`MAX_RATIO`, times the compressed size), before
allocating anything; otherwise it allocates the declared size once and decompresses into it in chunks, so
the peak memory of a read is the declared size plus one chunk, and bytes beyond the declared size are never
produced.

The defaults are small picklable objects (a replay buffer over the storage can be pickled); the live
compressor objects they cache are rebuilt after unpickling.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

try:
    import zstandard as _zstd
except ImportError:  # optional: the `zstd` extra
    _zstd = None

_CODEC_ERRORS: tuple[type[BaseException], ...] = (zlib.error,) + (
    (_zstd.ZstdError,) if _zstd is not None else ()
)
#: The most bytes one compressed byte can expand to: zlib's deflate tops out near 1032:1; a zstd RLE block
#: of 4 bytes (3 of header) stands for up to 128 KiB. A declared size above ratio x stored bytes is a lie.
MAX_RATIO = {"zlib": 1032, "zstd": 1 << 15}
_SLACK = 1 << 17  # frame headers and the last block
_CHUNK = 1 << 20  # bytes decompressed per step

__all__ = ["default_codec_name", "make_default_codec", "compress_tensor", "decompress_tensor"]


def default_codec_name() -> str:
    """``"zstd"`` when the ``zstandard`` package is installed, else ``"zlib"``."""
    return "zstd" if _zstd is not None else "zlib"


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The raw bytes of ``tensor`` in C order, as a uint8 array (a CPU copy only when needed)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8)


def _as_uint8(raw) -> torch.Tensor:
    if not len(raw):
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


class _DefaultCompressor:
    """``zstd`` or ``zlib`` compression of a tensor's bytes at ``level``."""

    def __init__(self, name: str, level: int):
        self.name, self.level = name, level
        self._live = None

    def _compressor(self):
        if self._live is None:
            self._live = _zstd.ZstdCompressor(level=self.level) if self.name == "zstd" else None
        return self._live

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        data = tensor_bytes(tensor)
        if self.name == "zstd":
            return _as_uint8(self._compressor().compress(data))
        return _as_uint8(zlib.compress(data, self.level))

    def __getstate__(self):
        return {"name": self.name, "level": self.level, "_live": None}

    def __repr__(self) -> str:
        return f"{self.name}(level={self.level})"


class _DefaultDecompressor:
    """Decompresses what :class:`_DefaultCompressor` wrote, reading at most the item's size."""

    def __init__(self, name: str):
        self.name = name
        self._live = None

    def _decompress_into(self, data, out: memoryview) -> tuple[int, bool]:
        """Decompresses ``data`` into ``out`` in chunks; ``(bytes written, whether more output followed)``."""
        nbytes, written = len(out), 0
        if self.name == "zlib":
            stream, pending = zlib.decompressobj(), data
            while written < nbytes:
                chunk = stream.decompress(pending, min(_CHUNK, nbytes - written))
                if not chunk:
                    break
                out[written : written + len(chunk)] = chunk
                written += len(chunk)
                pending = stream.unconsumed_tail
            return written, bool(stream.decompress(pending, 1))
        # a zstd frame written by ZstdCompressor.compress records its size: it must be the declared one
        if _zstd.frame_content_size(data) != nbytes:
            raise _zstd.ZstdError(f"the frame does not hold {nbytes} bytes")
        if self._live is None:
            self._live = _zstd.ZstdDecompressor()
        with self._live.stream_reader(data, read_across_frames=False) as reader:
            while written < nbytes:
                n = reader.readinto(out[written : min(nbytes, written + _CHUNK)])
                if not n:
                    break
                written += n
            return written, bool(reader.read(1))

    def __call__(self, compressed: torch.Tensor, metadata: dict[str, Any]) -> torch.Tensor:
        dtype, shape = metadata["dtype"], tuple(metadata["shape"])
        nbytes = _nbytes(dtype, shape)
        stored = compressed.numel()
        if nbytes > stored * MAX_RATIO[self.name] + _SLACK:
            raise ValueError(
                f"An item declared as a {dtype} tensor of shape {list(shape)} ({nbytes} bytes) is stored in "
                f"{stored} compressed bytes, which {self.name} cannot expand to more than "
                f"{stored * MAX_RATIO[self.name] + _SLACK}: its shape or its bytes were altered. Nothing was "
                f"allocated; save the storage again, or drop the item."
            )
        data = compressed.detach().cpu().contiguous().reshape(-1).numpy() if stored else b""
        out = torch.empty(nbytes, dtype=torch.uint8)
        try:
            written, more = self._decompress_into(
                data, memoryview(out.numpy()) if nbytes else memoryview(bytearray())
            )
        except _CODEC_ERRORS as err:
            raise ValueError(
                f"The compressed bytes of a {dtype} tensor of shape {list(shape)} are corrupted or were not written "
                f"by {self.name} ({type(err).__name__}: {err})."
            ) from None
        if written != nbytes or more:
            raise ValueError(
                f"The compressed bytes decompress to {f'more than {nbytes}' if more else written} bytes "
                f"with {self.name}, while a {dtype} tensor of shape {list(shape)} has {nbytes}: they are corrupted "
                f"or were written by another codec."
            )
        return out.view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)

    def __getstate__(self):
        return {"name": self.name, "_live": None}

    def __repr__(self) -> str:
        return self.name


def _nbytes(dtype: torch.dtype, shape) -> int:
    return math.prod(shape) * dtype.itemsize


def bytes_to_tensor(raw, dtype: torch.dtype, shape) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` over a copy of the bytes ``raw`` (their number must match)."""
    if not len(raw):
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(tuple(shape))


def make_default_codec(level: int) -> tuple[Callable, Callable, str]:
    """``(compressor, decompressor, name)`` of the default codec at ``level``; raises ``ValueError`` naming
    ``compression_level`` when the codec refuses the level."""
    name = default_codec_name()
    compressor = _DefaultCompressor(name, level)
    try:
        compressor(torch.zeros(1))
    except (ValueError, *_CODEC_ERRORS) as err:
        valid = "-1..9" if name == "zlib" else f"up to {_zstd.MAX_COMPRESSION_LEVEL}"
        raise ValueError(
            f"`compression_level`={level} is not a valid {name} level ({err}); pass a level in {valid}."
        ) from None
    return compressor, _DefaultDecompressor(name), name


# -- calling the codec, with the checks that make a user's function fail clearly -----------------------------
def compress_tensor(fn: Callable, tensor: torch.Tensor) -> torch.Tensor:
    """``fn(tensor)``: a uint8 tensor returned as it is (moved to the CPU if it is elsewhere); bytes-like
    results are copied into a 1-D uint8 tensor."""
    out = fn(tensor)
    if isinstance(out, (bytes, bytearray, memoryview)):
        return _as_uint8(out)
    if isinstance(out, torch.Tensor) and out.dtype == torch.uint8:
        return out if out.device.type == "cpu" else out.detach().to("cpu")
    raise TypeError(
        f"`compression_fn` must return a uint8 tensor or bytes; {fn!r} returned a {type(out).__name__}"
        f"{f' of dtype {out.dtype}' if isinstance(out, torch.Tensor) else ''}."
    )


def decompress_tensor(fn: Callable, compressed: torch.Tensor, metadata: dict[str, Any]):
    """``fn(compressed, metadata)`` (``metadata``: ``type``, ``shape``, ``dtype``, ``device``), returned as it is
    (whatever it is: the function owns the format); bytes-like results are reinterpreted with the shape and dtype
    (their number must match)."""
    out = fn(compressed, metadata)
    if isinstance(out, (bytes, bytearray, memoryview)):
        dtype, shape = metadata["dtype"], tuple(metadata["shape"])
        if len(out) != _nbytes(dtype, shape):
            raise ValueError(
                f"`decompression_fn` {fn!r} returned {len(out)} bytes for a {dtype} tensor of shape "
                f"{list(shape)}, which has {_nbytes(dtype, shape)}: the data or the function is wrong."
            )
        return bytes_to_tensor(out, dtype, shape)
    return out
