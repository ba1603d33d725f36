"""Validation of a checkpoint directory before anything is read from it (see ``checkpointers``' docstring).

Every check raises :class:`CheckpointError` naming the file and what is wrong: the completion marker pins
the bytes of ``metadata.json``; the schema version must be a supported one; every tensor entry must have a
safe relative path to a regular file (no symlink at any level), an allowlisted dtype, and a shape, byte
count and file size that agree. :func:`check_int_field` checks the counters and sizes of component
descriptions (lengths, cursors, batch sizes) before a component is loaded.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import torchrl.data.replay_buffers._checkpoint.fs as _fs
import torchrl.data.replay_buffers._checkpoint.io as _io
from torchrl.data.replay_buffers.errors import CheckpointError

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)
FORMAT = "torchrl-checkpoint"
_MAX_METADATA_BYTES = 64 << 20
_MAX_NDIM = 64


def _read_json_file(root: str, name: str, limit: int) -> tuple[bytes, Any]:
    st = _io.lstat_inside(root, name)
    if st.st_size > limit:
        raise CheckpointError(f"{name!r} of the checkpoint {root!r} is {st.st_size} bytes, over the {limit} limit.")
    fd = _io.open_for_read(os.path.join(root, name))
    try:
        raw = _io.read_exact(fd, st.st_size, 0)
    finally:
        os.close(fd)
    try:
        return raw, json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointError(f"{name!r} of the checkpoint {root!r} is not valid JSON: {err}.") from None


def _check_version(root: str, where: str, version) -> None:
    if isinstance(version, bool) or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise CheckpointError(
            f"The checkpoint {root!r} has schema_version {version!r} in {where!r}; this version of torchrl "
            f"reads schema versions {list(SUPPORTED_SCHEMA_VERSIONS)}. Load it with the torchrl version that "
            f"wrote it, or upgrade torchrl."
        )


def read_validated_metadata_bytes(root: str) -> bytes:
    if not os.path.lexists(os.path.join(root, _fs.MARKER)):
        raise CheckpointError(
            f"The checkpoint {root!r} is incomplete: its completion marker {_fs.MARKER!r} is missing (the "
            f"write did not finish, or files were removed)."
        )
    _, marker = _read_json_file(root, _fs.MARKER, 4096)
    if not isinstance(marker, dict):
        raise CheckpointError(f"The completion marker {_fs.MARKER!r} of {root!r} is not a JSON object.")
    _check_version(root, _fs.MARKER, marker.get("schema_version"))
    raw, _ = _read_json_file(root, _fs.METADATA, _MAX_METADATA_BYTES)
    if len(raw) != marker.get("metadata_nbytes") or zlib.crc32(raw) != marker.get("metadata_crc32"):
        raise CheckpointError(
            f"{_fs.METADATA!r} of the checkpoint {root!r} does not match its completion marker (size or "
            f"checksum): the file was modified or corrupted after the checkpoint was written."
        )
    return raw


def parse_document(root: str, raw: bytes) -> dict[str, Any]:
    document = json.loads(raw.decode("utf-8"))
    if not isinstance(document, dict):
        raise CheckpointError(f"{_fs.METADATA!r} of {root!r} is not a JSON object.")
    _check_version(root, _fs.METADATA, document.get("schema_version"))
    if document.get("format") != FORMAT:
        raise CheckpointError(
            f"{_fs.METADATA!r} of {root!r} has format {document.get('format')!r}, expected {FORMAT!r}."
        )
    checksum = document.get("checksum")
    if checksum != {"algorithm": "crc32", "window_bytes": _io.CHECKSUM_WINDOW}:
        raise CheckpointError(f"{_fs.METADATA!r} of {root!r} has an unknown checksum description {checksum!r}.")
    if not isinstance(document.get("tensors"), dict):
        raise CheckpointError(f"{_fs.METADATA!r} of {root!r} has no 'tensors' object.")
    if not isinstance(document.get("metadata"), dict):
        raise CheckpointError(f"{_fs.METADATA!r} of {root!r} has no 'metadata' object.")
    return document


def _is_int(value, low: int = 0, high: int | None = None) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value <= high)
    )


def validated_entries(root: str, described: dict) -> list[tuple]:
    """``(name, file, dtype, shape, nbytes, crc)`` for every tensor, after checking all of them."""
    entries, files = [], set()
    for name, entry in described.items():
        where = f"the entry {name!r} of {_fs.METADATA!r} in the checkpoint {root!r}"
        if _io.name_problem(name) is not None:
            raise CheckpointError(f"{where}: the name is unsafe ({_io.name_problem(name)}).")
        if not isinstance(entry, dict) or set(entry) != {"file", "dtype", "shape", "nbytes", "crc32"}:
            raise CheckpointError(f"{where} must be an object with keys file, dtype, shape, nbytes, crc32.")
        relative, dtype, shape, nbytes, crc = (entry[k] for k in ("file", "dtype", "shape", "nbytes", "crc32"))
        problem = _io.name_problem(relative)
        if problem is not None or not relative.endswith(_io.MEMMAP_SUFFIX):
            raise CheckpointError(
                f"{where}: the file path {relative!r} is refused ({problem or 'it does not end in .memmap'})."
            )
        if relative in files:
            raise CheckpointError(f"{where}: the file {relative!r} is described twice.")
        files.add(relative)
        if not isinstance(dtype, str) or dtype not in _io.DTYPES:
            raise CheckpointError(f"{where}: dtype {dtype!r} is not one of {sorted(_io.DTYPES)}.")
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM or not all(_is_int(s) for s in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of non-negative ints.")
        torch_dtype = _io.DTYPES[dtype]
        if not _is_int(nbytes) or nbytes != _io.tensor_nbytes(torch_dtype, shape):
            raise CheckpointError(
                f"{where}: nbytes {nbytes!r} does not match shape {shape} of dtype {dtype} "
                f"({_io.tensor_nbytes(torch_dtype, shape)} bytes)."
            )
        if crc is not None and (
            not isinstance(crc, list) or len(crc) != 2 or not all(_is_int(c, 0, 0xFFFFFFFF) for c in crc)
        ):
            raise CheckpointError(f"{where}: crc32 {crc!r} is not a pair of 32-bit unsigned ints, nor null.")
        size = _io.lstat_inside(root, relative).st_size
        if size != nbytes:
            raise CheckpointError(
                f"The file {relative!r} of the checkpoint {root!r} holds {size} bytes; the metadata says "
                f"{nbytes} (shape {shape}, dtype {dtype}). The file is truncated or was replaced."
            )
        entries.append((name, relative, torch_dtype, shape, nbytes, crc))
    return entries


def check_int_field(value, field: str, where: str, low: int, high: int | None = None, *, fix: str = "") -> int:
    """Returns ``value`` if it is an int in ``[low, high]`` (``high=None``: no upper bound), else raises.

    Counters and sizes of a component description are checked with it before anything is loaded, so that a
    hand-edited checkpoint (a length above the capacity, a negative cursor, a batch size of ``"4"``) is refused
    instead of leaving a broken component.

    Raises:
        CheckpointError: naming ``where`` and ``field``, the value found and the allowed range.
    """
    if _is_int(value, low, high):
        return value
    allowed = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
    kind = "" if isinstance(value, int) and not isinstance(value, bool) else f" ({type(value).__name__})"
    raise CheckpointError(
        f"{where}: `{field}` is {value!r}{kind}, expected {allowed}.{' ' + fix if fix else ''} The metadata was "
        f"edited or written by other code: save the component again with `dumps`, or correct `{field}` in "
        f"metadata.json (then re-sign the COMPLETE marker). Nothing was loaded."
    )
