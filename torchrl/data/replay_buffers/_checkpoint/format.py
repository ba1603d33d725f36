"""The checkpoint format engine: :func:`write_checkpoint`/:func:`read_checkpoint` (a directory of raw tensor files
and a validated JSON description, switched into place atomically) and :func:`dump_component`/:func:`load_component`
(one component per checkpoint, through the part protocol of :mod:`.parts`).

The format itself (layout, validation, crash safety) is specified in :mod:`torchrl.data.replay_buffers.checkpointers`,
the public module that re-exports these functions. This module knows no component.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

import torchrl.data.replay_buffers._checkpoint.fs as _fs
import torchrl.data.replay_buffers._checkpoint.io as _io
import torchrl.data.replay_buffers._checkpoint.parts as _parts
from torchrl._files import fsync_file, write_new_file
from torchrl.data.replay_buffers._checkpoint.args import (
    advance_fn,
    check_metadata,
    check_path,
    check_progress,
    check_replaceable,
    check_tensors,
    progress_bar,
)
from torchrl.data.replay_buffers._checkpoint.validate import (
    FORMAT,
    SCHEMA_VERSION,
    parse_document,
    read_validated_metadata_bytes,
    validated_entries,
)
from torchrl.data.replay_buffers.errors import CheckpointError

__all__ = [
    "read_checkpoint",
    "write_checkpoint",
    "dump_component",
    "load_component",
    "register_checkpoint_handler",
]


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
    moment leaves one of the two complete (see :mod:`torchrl.data.replay_buffers.checkpointers`). Tensor bytes are streamed in 64 MiB
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
        >>> from torchrl.data.replay_buffers.checkpointers import read_checkpoint, write_checkpoint
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = os.path.join(d, "ckpt")
        ...     write_checkpoint(path, {"a": torch.ones(3)}, {"version": 1})
        ...     write_checkpoint(path, {"a": torch.zeros(3)}, {"version": 2})  # replaces it atomically
        ...     print(sorted(os.listdir(path)))
        ['COMPLETE', 'a.memmap', 'metadata.json']
    """
    _write(path, tensors, metadata, fsync=fsync, progress=progress, reuse=False)


def _write(path, tensors, metadata, *, fsync, progress, reuse: bool) -> None:
    """:func:`write_checkpoint`; with ``reuse``, values of ``tensors`` may also be :class:`_io.ReusedFile` (linked)."""
    path = check_path(path)
    entries = check_tensors(tensors, allow_reused=reuse)
    user_metadata = check_metadata(metadata)
    if not isinstance(fsync, bool):
        raise TypeError(f"`fsync` must be a bool; got {fsync!r}.")
    check_progress(progress)
    mappings = _mappings_of(entries)
    links = _linkable(path, entries, mappings)
    _fs.replace_dir(
        path,
        lambda tmp: _write_contents(tmp, entries, user_metadata, links, mappings, fsync=fsync, progress=progress),
        lambda: check_replaceable(path, adopt=bool(links)),
        fsync=fsync,
    )


def _mappings_of(entries) -> list:
    """The file mappings holding the tensors of ``entries`` (one read of ``/proc/self/maps`` up to each tensor:
    parsing every mapping of a process with torch loaded costs milliseconds)."""
    found: dict[int, object] = {}
    for _, tensor, _ in entries:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and tensor.numel():
            for mapping in _io.mapping_at(tensor.data_ptr()):
                found.setdefault(mapping.start, mapping)
    return list(found.values())


def _linkable(path: str, entries, mappings) -> dict[str, str]:
    """Tensors whose bytes are exactly the file ``path/<name>.memmap`` (a memmap storage living in the
    checkpoint it is saved to): they are hard-linked into the new checkpoint instead of copied."""
    links = {}
    for name, tensor, _ in entries:
        if isinstance(tensor, _io.ReusedFile):
            continue
        source = _io.file_source(tensor, mappings)
        expected = os.path.join(path, *(name + _io.MEMMAP_SUFFIX).split("/"))
        if source is None or source[1] != 0 or not os.path.exists(expected):
            continue
        if os.path.samefile(source[0], expected) and os.path.getsize(expected) == tensor.numel() * tensor.element_size():
            links[name] = expected
    return links


def _write_contents(tmp: str, entries, user_metadata: dict, links, mappings, *, fsync: bool, progress) -> None:
    total = sum(
        t.numel() * t.element_size() for name, t, _ in entries if name not in links and not isinstance(t, _io.ReusedFile)
    )
    bar = progress_bar(progress, total, "dumps")
    advance = advance_fn(bar)
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
            if isinstance(tensor, _io.ReusedFile):  # NOTE [incremental dumps]
                _link_reused(tensor, target, fsync)
                described[name] = {"file": relative, "dtype": tensor.dtype, "shape": tensor.shape,
                                   "nbytes": tensor.nbytes, "crc32": tensor.crc32}  # fmt: skip
                _fs.step("tensor_written")
                continue
            if name in links:  # shared with a live storage: its content changes later, so no checksum
                os.link(links[name], target)
                if fsync:
                    fsync_file(target)
                crc = None
            else:
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
    write_new_file(os.path.join(tmp, _fs.METADATA), raw, fsync=fsync)
    _fs.step("metadata_written")
    # the marker may precede the directory fsyncs: nothing reads a tmp directory, and it only becomes
    # `path` by the rename below, after every file and directory in it is on disk
    marker = {"schema_version": SCHEMA_VERSION, "metadata_nbytes": len(raw), "metadata_crc32": zlib.crc32(raw)}
    write_new_file(os.path.join(tmp, _fs.MARKER), json.dumps(marker).encode(), fsync=fsync)
    if fsync:
        for folder in sorted(dirs, key=len, reverse=True):
            _fs.fsync_dir(folder)
    _fs.step("marker_written")


def _link_reused(reused: _io.ReusedFile, target: str, fsync: bool) -> None:
    try:
        os.link(reused.source, target)
    except FileNotFoundError:
        raise FileNotFoundError(f"{reused.source!r} was removed while a checkpoint reusing it was written.") from None
    if os.path.getsize(target) != reused.nbytes:
        raise FileNotFoundError(f"{reused.source!r} changed size while a checkpoint reusing it was written.")
    if fsync and not reused.durable:  # written by a dump with fsync=False, maybe: this one promises durability
        fsync_file(target)  # (the new directory entry is made durable by the fsync of its directory)


# -- the checkpoint being replaced: what an incremental dump reuses ----------------------------------------------
# NOTE [incremental dumps]: files of a checkpoint are never modified once it is complete. A dump onto a checkpoint
# of the same data may hard-link some of its files (io.ReusedFile: same inode, no byte copied) into the new
# checkpoint's temporary directory and write only the rest; the new checkpoint is then switched into place
# atomically as any other (fs.replace_dir), so a crash at any moment leaves the previous or the new one complete.
# The previous checkpoint's directory is removed after the switch; the linked inodes live on in the new one. Only
# files whose checksums are known are reused (never the null-checksum files linked from a live memory-mapped
# storage), with their checksums. Which files a part may reuse is the part's business: a tensor storage reuses the
# files it wrote itself and tracks which rows changed since (storages/_incremental.py). A file that vanishes before
# it is linked (another writer replaced the checkpoint) raises FileNotFoundError, and the dump is done again in
# full.
class PreviousCheckpoint:
    """The complete checkpoint at ``root`` that a dump is about to replace.

    ``entries`` maps tensor names to ``(file relative to root, dtype name, shape, nbytes, crc32)``; ``metadata``
    is the caller's document. Built by :func:`read_previous`, which has validated both.
    """

    def __init__(self, root: str, entries: dict[str, tuple], metadata: dict[str, Any]):
        self.root, self.entries, self.metadata = root, entries, metadata

    def file(self, name: str) -> str:
        """The absolute path of the file of the tensor ``name``."""
        return os.path.join(self.root, *self.entries[name][0].split("/"))

    def reuse(self, name: str) -> _io.ReusedFile | None:
        """The entry ``name`` as a :class:`_io.ReusedFile`; ``None`` if there is none or its checksum is unknown."""
        entry = self.entries.get(name)
        if entry is None or entry[4] is None:
            return None
        relative, dtype, shape, nbytes, crc = entry
        return _io.ReusedFile(self.file(name), dtype, list(shape), nbytes, list(crc))


def read_previous(path: str) -> PreviousCheckpoint | None:
    """The checkpoint at ``path`` if one is there, complete and valid (checksums are not read); else ``None``.

    A checkpoint moved aside by a crashed switch is not returned: the next write renames it back first, which
    would move the files to reuse.
    """
    if _fs.resolve_for_read(path) != path or not _fs.is_complete(path):
        return None
    try:
        document = parse_document(path, read_validated_metadata_bytes(path))
        entries = validated_entries(path, document["tensors"])
    except (CheckpointError, OSError, ValueError, UnicodeDecodeError):
        return None
    described = {name: (relative, document["tensors"][name]["dtype"], shape, nbytes, crc)
                 for name, relative, _, shape, nbytes, crc in entries}  # fmt: skip
    return PreviousCheckpoint(path, described, document["metadata"])


# -- read -------------------------------------------------------------------------------------------------------
def read_checkpoint(
    path, *, mmap: bool = True, verify: bool = True, progress: bool | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Validates the checkpoint at ``path`` and returns its tensors and its metadata.

    Everything is checked before anything is returned (see :mod:`torchrl.data.replay_buffers.checkpointers`): a checkpoint that is
    incomplete, corrupted, of an unknown schema version or unsafe (paths escaping the directory, symlinks)
    raises :class:`CheckpointError`. By default the tensors are copy-on-write memory maps of the files, so
    nothing is read now and in-place changes never reach the checkpoint. This function never modifies the
    disk.

    Args:
        path (str or path-like): the checkpoint directory written by :func:`write_checkpoint`. If it is
            missing because a writer crashed mid-switch, the previous checkpoint moved aside is read.

    Keyword Args:
        mmap (bool): return memory maps (``True``) or tensors read into RAM with plain reads (``False``).
            Defaults to ``True``.
        verify (bool): check the head/tail checksum of every file (reads at most 2 MiB per file). Defaults
            to ``True``.
        progress (bool, optional): a tqdm bar while reading into RAM (``mmap=False``); ``None`` shows one
            above 256 MiB when stderr is a terminal. Defaults to ``None``.

    Returns:
        ``(tensors, metadata)``: a dict from names to tensors and the caller's metadata document.

    Raises:
        FileNotFoundError: if there is no checkpoint at ``path``.
        CheckpointError: if the checkpoint is incomplete, corrupted, unsafe or of an unknown version.

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data.replay_buffers.checkpointers import read_checkpoint, write_checkpoint
        >>> with tempfile.TemporaryDirectory() as d:
        ...     write_checkpoint(os.path.join(d, "c"), {"x": torch.tensor([1, 2, 3])}, {})
        ...     tensors, _ = read_checkpoint(os.path.join(d, "c"))
        ...     print(tensors["x"].tolist())
        [1, 2, 3]
    """
    path = check_path(path)
    for name, value in (("mmap", mmap), ("verify", verify)):
        if not isinstance(value, bool):
            raise TypeError(f"`{name}` must be a bool; got {value!r}.")
    check_progress(progress)
    root = _fs.resolve_for_read(path)
    if root is None:
        raise FileNotFoundError(f"No checkpoint at {path!r}: the directory does not exist.")
    if not os.path.isdir(root):
        raise CheckpointError(f"{root!r} is not a checkpoint directory.")
    raw = read_validated_metadata_bytes(root)
    document = parse_document(root, raw)
    entries = validated_entries(root, document["tensors"])
    if verify:
        for _, relative, _, _, nbytes, crc in entries:
            if crc is not None:
                _io.verify_windows(root, relative, nbytes, crc)
    if mmap:
        tensors = {
            name: _io.map_tensor(os.path.join(root, relative), dtype, shape)
            for name, relative, dtype, shape, _, _ in entries
        }
        return tensors, document["metadata"]
    bar = progress_bar(progress, sum(e[4] for e in entries), "loads")
    try:
        tensors = {}
        for name, relative, dtype, shape, _, _ in entries:
            tensors[name] = _io.empty_tensor(dtype, shape)
            _io.read_into(os.path.join(root, relative), tensors[name], advance_fn(bar))
    finally:
        if bar is not None:
            bar.close()
    return tensors, document["metadata"]


# -- components (storages, samplers, writers, buffers) -----------------------------------------------------------
def register_checkpoint_handler(cls: type, *, dump: Callable, load: Callable, check: Callable | None = None) -> None:
    """Declares how instances of ``cls`` (and its subclasses) are saved by ``dumps`` and restored by ``loads``.

    Handlers are looked up along the class's MRO, so a subclass inherits its parent's handler unless it
    registers its own, and a handler wins over the class's own ``checkpoint_part`` methods. Use it for
    classes you do not own: a class you write implements the part protocol itself (see
    :mod:`torchrl.data.replay_buffers._checkpoint.parts`), and any object with ``state_dict()`` and
    ``load_state_dict()`` is saved without either (tensors become files, the rest JSON).

    Args:
        cls (type): the component class.

    Keyword Args:
        dump (callable): ``dump(obj, ctx) -> (tensors, doc)``: the tensors to save, named under
            ``ctx.prefix`` (``ctx.name("w")`` is ``ctx.prefix + "w"``), and a JSON-serializable document.
        load (callable): ``load(obj, doc, tensors, ctx)``: restores ``obj``; ``tensors`` are memory-mapped.
        check (callable, optional): ``check(obj, doc, tensors, ctx)``: raises ``ValueError`` saying what
            differs when the checkpoint does not fit ``obj``; called before anything is loaded. Defaults to
            ``None`` (only the class is compared).

    Examples:
        >>> from torchrl.data.replay_buffers.checkpointers import register_checkpoint_handler
        >>> class Counter:
        ...     def __init__(self):
        ...         self.n = 0
        >>> register_checkpoint_handler(
        ...     Counter,
        ...     dump=lambda obj, ctx: ({}, {"n": obj.n}),
        ...     load=lambda obj, doc, tensors, ctx: setattr(obj, "n", doc["n"]),
        ... )
    """
    if not isinstance(cls, type):
        raise TypeError(f"`cls` must be a class; got {cls!r}.")
    for name, fn in (("dump", dump), ("load", load), ("check", check)):
        if fn is not None and not callable(fn):
            raise TypeError(f"`{name}` must be callable; got {fn!r}.")
    _parts.register(cls, dump, load, check)


def dump_component(obj, path, *, fsync: bool = True, progress: bool | None = None) -> None:
    """Saves a storage, sampler, writer or replay buffer to the checkpoint directory ``path``.

    This is what ``obj.dumps(path)`` runs. The checkpoint's metadata holds ``{"component": {"class": ...,
    "doc": ...}}`` where ``doc`` is the component's part (see :mod:`torchrl.data.replay_buffers._checkpoint.parts`).

    Incremental dumps: when ``path`` holds a checkpoint that this very storage wrote (its metadata names the
    storage and the write revision it was taken at), a tensor storage that tracks row writes (every CPU tensor
    storage but a ``compilable`` one: memory-mapped, shared or private RAM) rewrites only the rows written
    since, as a new patch file per entry, and hard-links the files it wrote before; the other parts and the metadata are
    written again. The new checkpoint is switched in atomically like a full one, and never modifies a file of
    the previous one (see NOTE [incremental dumps] in :mod:`torchrl.data.replay_buffers._checkpoint.format`).
    Anything else (another storage's checkpoint, a storage on an accelerator or ``compilable``, a storage loaded
    or changed in layout since, patches adding up to a quarter of the rows) gives a full dump, and loads read
    either the same way.
    Rows handed out as views (``storage[a:b]``, ``get_entry``) are checked by digest, so in-place edits through
    them are saved (NOTE [edits through views] in ``storages/_incremental.py``).
    A storage whose checkpointer is ``TensorStorageCheckpointer(incremental=False)`` always dumps in full: use
    it when stored tensors are changed in place through views taken in another process, which the storage
    cannot see.

    Args:
        obj: the component.
        path (str or path-like): the checkpoint directory; a previous checkpoint there is replaced atomically.

    Keyword Args:
        fsync (bool): see :func:`write_checkpoint`. Defaults to ``True``.
        progress (bool, optional): see :func:`write_checkpoint`. Defaults to ``None``.

    Raises:
        TypeError: if the component holds data a checkpoint cannot represent without pickling (e.g. a
            ``ListStorage`` item that is a string).

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(3), torch.ones(3, 2))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     dump_component(storage, os.path.join(d, "s"))
        ...     fresh = LazyTensorStorage(10)
        ...     load_component(fresh, os.path.join(d, "s"))
        >>> len(fresh), fresh.get(2).tolist()
        (3, [1.0, 1.0])
    """
    path = check_path(path)
    dump_parts(path, lambda ctx: _component(obj, ctx), fsync=fsync, progress=progress)


def _component(obj, ctx: _parts.PartContext) -> tuple[dict, dict]:
    tensors, doc = _parts.dump_part(obj, ctx)
    return tensors, {"component": doc}


def dump_parts(path: str, build: Callable, *, fsync: bool = True, progress: bool | None = None) -> None:
    """Writes the checkpoint ``build(ctx) -> (tensors, metadata)`` describes, its parts dumped with ``ctx``
    (:func:`~torchrl.data.replay_buffers._checkpoint.parts.dump_part`), so that storages may dump incrementally
    onto the checkpoint at ``path`` (NOTE [incremental dumps]). What :func:`dump_component` runs; for documents
    holding parts and more (a training state). ``build`` may run twice: again, for a full dump, when a file to
    reuse vanished meanwhile (another writer replaced the checkpoint)."""
    previous = read_previous(path)
    try:
        _dump(path, build, previous, fsync=fsync, progress=progress)
    except FileNotFoundError:
        if previous is None:
            raise
        _dump(path, build, None, fsync=fsync, progress=progress)


# NOTE [consistent dumps]: a storage that other processes write (shared memory, memory-mapped files) gives its
# part as views of its live rows, copied into the checkpoint's files later in the dump. Its part takes the
# storage's write lock through ``ctx.hold`` when it reads its counters, and the dump holds it until every file
# is written and the checkpoint switched in: the saved rows are those the counters describe, no row half
# written by a concurrent `extend` (a writer waits for the copy; with fsync=True, for the flush too). Private
# storages hold a no-op lock.
def _dump(path: str, build: Callable, previous, *, fsync, progress) -> None:
    """One dump: parts see ``ctx.facts["previous"]`` (the checkpoint being replaced, or absent) and may append
    callables to ``ctx.facts["after_write"]``, run once the new checkpoint is in place; the locks they hold
    (``ctx.hold``: NOTE [consistent dumps]) are released once it is written."""
    facts: dict[str, Any] = {"fsync": fsync} if previous is None else {"fsync": fsync, "previous": previous}
    with contextlib.ExitStack() as held:
        facts["held"] = held
        tensors, metadata = build(_parts.PartContext(path, facts=facts))
        if facts.get("checkpoint_ids"):  # which storage wrote which rows (see storages/_incremental.py)
            metadata = {**metadata, "checkpoint_ids": facts["checkpoint_ids"]}
        _write(path, tensors, metadata, fsync=fsync, progress=progress, reuse=True)
    for callback in facts.get("after_write", ()):
        callback()


def load_context(path: str, metadata: Mapping[str, Any]) -> _parts.PartContext:
    """The :class:`~torchrl.data.replay_buffers._checkpoint.parts.PartContext` to check and load the parts of
    the checkpoint at ``path`` (whose ``metadata`` was read) with: storages then remember the checkpoint they
    loaded, for an incremental dump there later."""
    ids = metadata.get("checkpoint_ids")
    return _parts.PartContext(check_path(path), facts={"checkpoint_ids": ids} if isinstance(ids, dict) else None)


def load_component(obj, path) -> None:
    """Loads a checkpoint written by :func:`dump_component` into ``obj`` (what ``obj.loads(path)`` runs).

    The checkpoint is validated (:func:`read_checkpoint`) and compared with ``obj`` (class, capacity, data
    keys, shapes and dtypes of an initialized storage) before anything is modified. Storage content is
    copied file-to-file into a memory-mapped storage, read straight into a RAM storage (a fresh private one
    reads into memory that is not zeroed first, laid out for fast reads: about ``numpy.load``'s bandwidth), and
    mapped in place when ``obj`` is a memory-mapped storage whose ``scratch_dir`` is the checkpoint's storage
    directory.

    Args:
        obj: a component built with the configuration of the saved one (typically freshly).
        path (str or path-like): the checkpoint directory.

    Raises:
        FileNotFoundError: if there is no checkpoint at ``path``.
        CheckpointError: if the checkpoint is incomplete, corrupted or malformed.
        ValueError: if the checkpoint does not fit ``obj`` (the message says what differs); ``obj`` is unchanged.

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import RandomSampler
        >>> from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
        >>> with tempfile.TemporaryDirectory() as d:
        ...     dump_component(RandomSampler(), os.path.join(d, "s"))
        ...     load_component(RandomSampler(), os.path.join(d, "s"))
    """
    tensors, metadata = read_checkpoint(path)
    doc = metadata.get("component")
    if not isinstance(doc, dict) or not isinstance(doc.get("class"), str) or not isinstance(doc.get("doc"), dict):
        raise CheckpointError(
            f"The checkpoint at {os.fspath(path)!r} holds no component description: it was not written by "
            f"`dumps` (use read_checkpoint for checkpoints written by write_checkpoint)."
        )
    ctx = load_context(path, metadata)
    try:
        _parts.check_part(obj, doc, tensors, ctx)
    except (KeyError, IndexError, AttributeError, TypeError) as err:
        raise CheckpointError(
            f"The component description in the checkpoint at {os.fspath(path)!r} is malformed: "
            f"{type(err).__name__}: {err}."
        ) from None
    _parts.load_part(obj, doc, tensors, ctx)
