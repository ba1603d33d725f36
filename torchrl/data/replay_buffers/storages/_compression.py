"""The byte codecs of :class:`~torchrl.data.CompressedListStorage`: the defaults and the user's functions.

A *compressor* turns one tensor into a 1-D uint8 tensor; a *decompressor* turns that back into a tensor,
given the metadata ``{"shape": torch.Size, "dtype": torch.dtype}``. The default codec is Zstandard (the
``zstandard`` package) when it is installed and ``zlib`` from the standard library otherwise; both read at
most the expected number of bytes, so corrupted or crafted data cannot make a read allocate more than the
item's size.

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

_CODEC_ERRORS: tuple[type[BaseException], ...] = (zlib.error,) + ((_zstd.ZstdError,) if _zstd is not None else ())

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

    def _decompress(self, data, nbytes: int):
        if self.name == "zlib":
            return zlib.decompressobj().decompress(data, nbytes + 1)
        # a zstd frame written by ZstdCompressor.compress records its size: allocate that only when it is ours
        if _zstd.frame_content_size(data) != nbytes:
            raise _zstd.ZstdError(f"the frame does not hold {nbytes} bytes")
        if self._live is None:
            self._live = _zstd.ZstdDecompressor()
        return self._live.decompress(data)

    def __call__(self, compressed: torch.Tensor, metadata: dict[str, Any]) -> torch.Tensor:
        dtype, shape = metadata["dtype"], metadata["shape"]
        nbytes = _nbytes(dtype, shape)
        data = compressed.numpy() if compressed.numel() else b""
        try:
            raw = self._decompress(data, nbytes)
        except _CODEC_ERRORS as err:
            raise ValueError(
                f"The compressed bytes of a {dtype} tensor of shape {list(shape)} are corrupted or were not written "
                f"by {self.name} ({type(err).__name__}: {err})."
            ) from None
        if len(raw) != nbytes:
            raise ValueError(
                f"The compressed bytes decompress to {f'more than {nbytes}' if len(raw) > nbytes else len(raw)} bytes "
                f"with {self.name}, while a {dtype} tensor of shape {list(shape)} has {nbytes}: they are corrupted "
                f"or were written by another codec."
            )
        return bytes_to_tensor(raw, dtype, shape)

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
    """``fn(tensor)`` as a 1-D uint8 CPU tensor (bytes-like results are accepted and copied)."""
    out = fn(tensor)
    if isinstance(out, (bytes, bytearray, memoryview)):
        return _as_uint8(out)
    if isinstance(out, torch.Tensor) and out.dtype == torch.uint8:
        return out.detach().to("cpu").reshape(-1)
    raise TypeError(
        f"`compression_fn` must return a uint8 tensor or bytes; {fn!r} returned a {type(out).__name__}"
        f"{f' of dtype {out.dtype}' if isinstance(out, torch.Tensor) else ''}."
    )


def decompress_tensor(fn: Callable, compressed: torch.Tensor, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """``fn(compressed, {"shape", "dtype"})`` checked to be a tensor of that shape and dtype (bytes-like
    results are reinterpreted with them)."""
    out = fn(compressed, {"shape": torch.Size(shape), "dtype": dtype})
    if isinstance(out, (bytes, bytearray, memoryview)):
        if len(out) != _nbytes(dtype, shape):
            raise ValueError(
                f"`decompression_fn` {fn!r} returned {len(out)} bytes for a {dtype} tensor of shape "
                f"{list(shape)}, which has {_nbytes(dtype, shape)}: the data or the function is wrong."
            )
        return bytes_to_tensor(out, dtype, shape)
    if not isinstance(out, torch.Tensor) or out.dtype != dtype or tuple(out.shape) != tuple(shape):
        got = type(out).__name__
        if isinstance(out, torch.Tensor):
            got = f"a {out.dtype} tensor of shape {list(out.shape)}"
        raise ValueError(
            f"`decompression_fn` {fn!r} returned {got}; the item stored was a {dtype} tensor of shape "
            f"{list(shape)}. Pass the decompression_fn that inverts the compression_fn."
        )
    return out
