"""The on-disk checkpoint format of replay buffers and their components (schema version 1).

``rb.dumps(path)`` and the ``dumps`` of storages, samplers and writers write a *checkpoint*: a directory
that holds raw tensor files and a JSON description. Nothing is pickled and nothing is read with
``torch.load``, so loading a checkpoint from an untrusted source runs no code: the worst a crafted
checkpoint can do is fail validation (:class:`CheckpointError`) or hold wrong numbers.

Layout of ``path/``::

    metadata.json           the description (below)
    <name>.memmap           one file per tensor: its bytes in C order, no header (tensordict's memmap
                            layout); a "/" in <name> is a sub-directory, e.g. storage/obs.memmap
    COMPLETE                the completion marker, written last

``metadata.json`` is a JSON object::

    {"format": "torchrl-checkpoint", "schema_version": 1,
     "checksum": {"algorithm": "crc32", "window_bytes": 1048576},
     "tensors": {"<name>": {"file": "<name>.memmap", "dtype": "float32", "shape": [4, 3],
                            "nbytes": 48, "crc32": [<head>, <tail>]}, ...},
     "metadata": {...}}

where ``"metadata"`` is the caller's JSON document (for components: their type, configuration and
counters), dtypes are names from an allowlist (``bool``, ``uint8`` ... ``float64``, ``bfloat16``,
``complex64``/``complex128``, ``float8_*``), and ``crc32`` holds the CRC-32 of the first and of the last
``window_bytes`` bytes of the file (the whole file when it is smaller than a window). The checksum is a
cheap check against truncation and torn or misplaced files, not a full-content hash: a byte changed in the
middle of a file larger than 2 MiB goes unnoticed. ``COMPLETE`` is a JSON object
``{"schema_version": 1, "metadata_nbytes": <int>, "metadata_crc32": <int>}`` that also pins the exact
bytes of ``metadata.json``.

Validation (:func:`read_checkpoint`, before anything is returned): the marker exists and matches
``metadata.json``; the schema version is one this code reads; every tensor entry has a safe relative path
(no absolute path, no ``..``, no symlink anywhere, a regular file), an allowlisted dtype, a shape whose
size matches ``nbytes`` and the file's size, and matching checksums. Any failure raises
:class:`CheckpointError` (a :class:`ValueError`) naming the file and what is wrong.

Crash safety. :func:`write_checkpoint` writes everything into a sibling ``<path>.tmp-<hex>``, fsyncs the
files and directories, writes ``COMPLETE`` last, then switches under an ``flock`` of the parent directory:

1. no ``path`` yet: ``rename(tmp, path)``, atomic;
2. otherwise, on Linux, ``renameat2(tmp, path, RENAME_EXCHANGE)`` swaps both directories atomically and
   the old checkpoint, now at the tmp name, is removed;
3. where the exchange is unsupported: ``rename(path, <path>.old-<hex>)`` then ``rename(tmp, path)``, and
   the aside is removed.

Then the parent directory is fsynced. A process killed (SIGKILL) at any moment therefore leaves either
the old or the new complete checkpoint, never a mix: before the switch ``path`` is untouched; after it,
``path`` is complete. The only intermediate state, ``path`` missing between the two renames of case 3,
is handled by this recovery rule: :func:`read_checkpoint` reads the complete ``<path>.old-*`` instead
(readers never modify the disk), and the next :func:`write_checkpoint` renames it back to ``path``. The
next writer also removes what a crash left behind: ``<path>.old-*`` directories once ``path`` exists, and
``<path>.tmp-*`` directories whose writer is dead (each writer holds an ``flock`` on its tmp directory, so
a live writer's directory is never touched). ``fsync=False`` keeps this guarantee against a process
crash but not against a power loss.

Examples:
    >>> import os, tempfile, torch
    >>> from torchrl.data.replay_buffers.checkpointers import read_checkpoint, write_checkpoint
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "ckpt")
    ...     write_checkpoint(path, {"obs": torch.arange(6.0).reshape(2, 3)}, {"step": 10})
    ...     tensors, metadata = read_checkpoint(path)
    ...     print(tensors["obs"].sum().item(), metadata)
    15.0 {'step': 10}
"""

from __future__ import annotations

import json
import os
import sys
import warnings
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from torchrl.data.replay_buffers import _checkpoint_fs as _fs
from torchrl.data.replay_buffers import _checkpoint_io as _io
from torchrl.data.replay_buffers._checkpoint_io import CheckpointError

__all__ = [
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "CheckpointError",
    "read_checkpoint",
    "write_checkpoint",
    "dump_component",
    "load_component",
]

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)
FORMAT = "torchrl-checkpoint"
PROGRESS_THRESHOLD_BYTES = 256 << 20
_MAX_METADATA_BYTES = 64 << 20
_MAX_NDIM = 64


# -- progress ---------------------------------------------------------------------------------------------------
def _check_progress(progress) -> None:
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(
            f"`progress` must be None (automatic), True or False; got {progress!r} ({type(progress).__name__})."
        )


def _progress_bar(progress: bool | None, total: int, desc: str):
    """A tqdm bar over ``total`` bytes, or ``None``: ``None`` shows one for large jobs on a terminal."""
    if progress is False or (progress is None and (total < PROGRESS_THRESHOLD_BYTES or not sys.stderr.isatty())):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            warnings.warn("`progress=True` needs tqdm (`pip install tqdm`); no progress bar is shown.", stacklevel=3)
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def _advance_fn(bar) -> Callable[[int], None]:
    return (lambda n: None) if bar is None else bar.update


# -- argument checks --------------------------------------------------------------------------------------------
def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike; got {path!r} ({type(path).__name__}).")
    path = os.path.abspath(os.fsdecode(path))
    if os.path.dirname(path) == path:
        raise ValueError(f"`path` must name a directory below a parent; got the root {path!r}.")
    return path


def _check_tensors(tensors) -> list[tuple[str, torch.Tensor, str]]:
    if not isinstance(tensors, Mapping):
        raise TypeError(f"`tensors` must be a mapping from names to tensors; got {type(tensors).__name__}.")
    out = []
    for name, tensor in tensors.items():
        problem = _io.name_problem(name)
        if problem is not None:
            raise ValueError(
                f"`tensors` key {name!r} cannot name a file of the checkpoint: {problem}. Use names made of "
                f"'/'-separated components such as 'storage/obs'."
            )
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"`tensors[{name!r}]` must be a torch.Tensor; got {type(tensor).__name__}.")
        if tensor.layout != torch.strided or tensor.is_nested:
            raise TypeError(
                f"`tensors[{name!r}]` has layout {tensor.layout}; checkpoints store dense tensors. Convert it "
                f"with `.to_dense()` or save its components as separate tensors."
            )
        try:
            dtype = _io.dtype_name(tensor.dtype)
        except TypeError as err:
            raise TypeError(f"`tensors[{name!r}]`: {err}") from None
        out.append((name, tensor, dtype))
    return out


def _check_metadata(metadata) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise TypeError(f"`metadata` must be a JSON-serializable mapping; got {type(metadata).__name__}.")
    try:
        return json.loads(json.dumps(dict(metadata)))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`metadata` must be JSON-serializable (str keys; str, numbers, bools, None, lists and dicts "
            f"of those): {err}. Store tensors in `tensors` instead."
        ) from None


def _check_replaceable(path: str) -> None:
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        raise FileExistsError(
            f"`path` {path!r} exists and is not a directory (or is a symlink); a checkpoint replaces only a "
            f"previous checkpoint. Remove it or choose another path."
        )
    names = set(os.listdir(path))
    if names and not names & {_fs.MARKER, _fs.METADATA}:
        raise FileExistsError(
            f"`path` {path!r} is a non-empty directory that is not a checkpoint (no {_fs.METADATA}); refusing "
            f"to replace it. Remove it or choose another path."
        )


# -- write ------------------------------------------------------------------------------------------------------
def write_checkpoint(
    path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, Any],
    *,
    fsync: bool = True,
    progress: bool | None = None,
) -> None:
    """Writes ``tensors`` and ``metadata`` as a checkpoint directory at ``path``, atomically.

    A previous checkpoint at ``path`` is replaced only once the new one is complete on disk; a crash at any
    moment leaves one of the two complete (see the module docstring). Tensor bytes are streamed in 64 MiB
    slices, or copied file-to-file by the kernel for memory-mapped tensors, so a write of a tensor larger
    than RAM does not grow the process's resident memory by its size.

    Args:
        path (str or path-like): the checkpoint directory. Missing parents are created. An existing
            ``path`` must be a checkpoint (it is replaced) or an empty directory.
        tensors (mapping of str to Tensor): the tensors to save, by name. A name is a relative path made of
            ``/``-separated components (``"storage/obs"`` is stored as ``storage/obs.memmap``). Tensors may
            be on any device, non-contiguous or memory-mapped; dtypes must be in the format's allowlist.
        metadata (mapping): a JSON-serializable document returned as is by :func:`read_checkpoint` (tuples
            come back as lists).

    Keyword Args:
        fsync (bool): flush files and directories to the disk before and after the switch. ``False`` is
            faster and still safe against a process crash, but not against a power loss. Defaults to
            ``True``.
        progress (bool, optional): show a tqdm progress bar (tqdm is optional). ``None`` shows one for
            writes above 256 MiB when stderr is a terminal. Defaults to ``None``.

    Raises:
        TypeError: if an argument has the wrong type, a tensor is not dense or its dtype is not storable.
        ValueError: if a tensor name is not a safe relative path.
        FileExistsError: if ``path`` exists and is neither a checkpoint nor an empty directory.

    Examples:
        >>> import os, tempfile, torch
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = os.path.join(d, "ckpt")
        ...     write_checkpoint(path, {"a": torch.ones(3)}, {"version": 1})
        ...     write_checkpoint(path, {"a": torch.zeros(3)}, {"version": 2})  # replaces it atomically
        ...     print(sorted(os.listdir(path)))
        ['COMPLETE', 'a.memmap', 'metadata.json']
    """
    path = _check_path(path)
    entries = _check_tensors(tensors)
    user_metadata = _check_metadata(metadata)
    if not isinstance(fsync, bool):
        raise TypeError(f"`fsync` must be a bool; got {fsync!r}.")
    _check_progress(progress)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    with _fs.locked_dir(parent):
        _fs.recover(path, fsync=fsync)
        _check_replaceable(path)
    tmp, lock_fd = _fs.make_tmp_dir(path)
    try:
        _fs.step("tmp_created")
        _write_contents(tmp, entries, user_metadata, fsync=fsync, progress=progress)
        with _fs.locked_dir(parent):
            _check_replaceable(path)
            _fs.switch(tmp, path, fsync=fsync)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock_fd)


def _write_contents(tmp: str, entries, user_metadata: dict, *, fsync: bool, progress) -> None:
    total = sum(t.numel() * t.element_size() for _, t, _ in entries)
    bar = _progress_bar(progress, total, "dumps")
    advance = _advance_fn(bar)
    mappings = _io.read_file_mappings()
    dirs = {tmp}
    described = {}
    try:
        for name, tensor, dtype in entries:
            relative = name + _io.MEMMAP_SUFFIX
            target = os.path.join(tmp, *relative.split("/"))
            folder = os.path.dirname(target)
            while folder not in dirs:
                dirs.add(folder)
                folder = os.path.dirname(folder)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            crc = _io.write_tensor_file(target, tensor, mappings=mappings, fsync=fsync, advance=advance)
            described[name] = {
                "file": relative,
                "dtype": dtype,
                "shape": list(tensor.shape),
                "nbytes": tensor.numel() * tensor.element_size(),
                "crc32": crc,
            }
            _fs.step("tensor_written")
    finally:
        if bar is not None:
            bar.close()
    document = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "checksum": {"algorithm": "crc32", "window_bytes": _io.CHECKSUM_WINDOW},
        "tensors": described,
        "metadata": user_metadata,
    }
    raw = json.dumps(document, indent=1).encode()
    _write_small_file(os.path.join(tmp, _fs.METADATA), raw, fsync=fsync)
    _fs.step("metadata_written")
    if fsync:
        for folder in sorted(dirs, key=len, reverse=True):
            _fs.fsync_dir(folder)
    marker = {"schema_version": SCHEMA_VERSION, "metadata_nbytes": len(raw), "metadata_crc32": zlib.crc32(raw)}
    _write_small_file(os.path.join(tmp, _fs.MARKER), json.dumps(marker).encode(), fsync=fsync)
    if fsync:
        _fs.fsync_dir(tmp)
    _fs.step("marker_written")


def _write_small_file(path: str, data: bytes, *, fsync: bool) -> None:
    fd = _io.create_file(path)
    try:
        _io.write_all(fd, memoryview(data))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


# -- read -------------------------------------------------------------------------------------------------------
def read_checkpoint(path, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Validates the checkpoint at ``path`` and returns its tensors, memory-mapped, and its metadata.

    Everything is checked before anything is returned (see the module docstring): a checkpoint that is
    incomplete, corrupted, of an unknown schema version or unsafe (paths escaping the directory, symlinks)
    raises :class:`CheckpointError`. The tensors are copy-on-write memory maps of the files, so nothing is
    read now and in-place changes never reach the checkpoint. This function never modifies the disk.

    Args:
        path (str or path-like): the checkpoint directory written by :func:`write_checkpoint`. If it is
            missing because a writer crashed mid-switch, the previous checkpoint moved aside is read.

    Keyword Args:
        verify (bool): check the head/tail checksum of every file (reads at most 2 MiB per file). Defaults
            to ``True``.

    Returns:
        ``(tensors, metadata)``: a dict from names to tensors and the caller's metadata document.

    Raises:
        FileNotFoundError: if there is no checkpoint at ``path``.
        CheckpointError: if the checkpoint is incomplete, corrupted, unsafe or of an unknown version.

    Examples:
        >>> import os, tempfile, torch
        >>> with tempfile.TemporaryDirectory() as d:
        ...     write_checkpoint(os.path.join(d, "c"), {"x": torch.tensor([1, 2, 3])}, {})
        ...     tensors, _ = read_checkpoint(os.path.join(d, "c"))
        ...     print(tensors["x"].tolist())
        [1, 2, 3]
    """
    path = _check_path(path)
    root = _fs.resolve_for_read(path)
    if root is None:
        raise FileNotFoundError(f"No checkpoint at {path!r}: the directory does not exist.")
    if not os.path.isdir(root):
        raise CheckpointError(f"{root!r} is not a checkpoint directory.")
    raw = _read_validated_metadata_bytes(root)
    document = _parse_document(root, raw)
    entries = _validated_entries(root, document["tensors"])
    if verify:
        for _, relative, _, _, nbytes, crc in entries:
            _io.verify_windows(root, relative, nbytes, crc)
    tensors = {
        name: _io.map_tensor(os.path.join(root, relative), dtype, shape)
        for name, relative, dtype, shape, _, _ in entries
    }
    return tensors, document["metadata"]


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


def _read_validated_metadata_bytes(root: str) -> bytes:
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


def _parse_document(root: str, raw: bytes) -> dict[str, Any]:
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


def _validated_entries(root: str, described: dict) -> list[tuple]:
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
        if not isinstance(crc, list) or len(crc) != 2 or not all(_is_int(c, 0, 0xFFFFFFFF) for c in crc):
            raise CheckpointError(f"{where}: crc32 {crc!r} is not a pair of 32-bit unsigned ints.")
        size = _io.lstat_inside(root, relative).st_size
        if size != nbytes:
            raise CheckpointError(
                f"The file {relative!r} of the checkpoint {root!r} holds {size} bytes; the metadata says "
                f"{nbytes} (shape {shape}, dtype {dtype}). The file is truncated or was replaced."
            )
        entries.append((name, relative, torch_dtype, shape, nbytes, crc))
    return entries


# -- components (storages, samplers, writers) -------------------------------------------------------------------
def dump_component(obj, path) -> None:
    """Saves a storage, sampler or writer to the checkpoint directory ``path``."""
    raise NotImplementedError(f"Saving a {type(obj).__name__} to a checkpoint is not implemented yet.")


def load_component(obj, path) -> None:
    """Loads a checkpoint written by :func:`dump_component` into ``obj``."""
    raise NotImplementedError(f"Loading a checkpoint into a {type(obj).__name__} is not implemented yet.")
