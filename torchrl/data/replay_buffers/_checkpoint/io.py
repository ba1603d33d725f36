"""Tensor files of a checkpoint: names, dtypes, streamed writes, checksums and memory-mapped reads.

One tensor is one file of raw bytes (C order, no header) named ``<name>.memmap``, as in tensordict's memmap
layout; a ``/`` in a name makes sub-directories. This module knows nothing of directories switching or of
the metadata document: see :mod:`torchrl.data.replay_buffers.checkpointers` for the format as a whole.

Writes never hold a whole tensor twice in memory:

- a tensor that lives in a shared file mapping (a :class:`~tensordict.MemoryMappedTensor`, a
  ``torch.from_file(..., shared=True)`` tensor) is copied file-to-file by the kernel (``os.copy_file_range``,
  or ``pread``/``write`` through one reusable 64 MiB buffer), so its pages are never faulted into this
  process and its resident memory does not grow;
- any other tensor is written from its own memory in 64 MiB slices (non-contiguous or accelerator tensors
  are made contiguous on the CPU one slice at a time).

Reads into an existing tensor (:func:`read_into`, what ``loads`` runs) copy each byte once, the same way
round: file-to-file into a tensor in a shared file mapping, else straight from the file into the tensor's
memory (``preadv``). Checksums are verified before, on the head and tail windows only
(:func:`verify_windows`), so a refused checkpoint has modified nothing.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import os
import stat
import sys
import zlib
from collections.abc import Callable
from typing import NamedTuple

import torch

from torchrl._files import create_new_file, write_all
from torchrl.data.replay_buffers.errors import CheckpointError

CHUNK_BYTES = 64 << 20
CHECKSUM_WINDOW = 1 << 20
MEMMAP_SUFFIX = ".memmap"
_PAGE = 4096
_READ_PAGE_OFFSET = 256


def _dtype_table() -> dict[str, torch.dtype]:
    names = (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    )  # fmt: skip
    return {name: getattr(torch, name) for name in names if isinstance(getattr(torch, name, None), torch.dtype)}


DTYPES: dict[str, torch.dtype] = _dtype_table()
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}
_FORBIDDEN_CHARS = frozenset("\\:\x00") | frozenset(map(chr, range(32))) | {"\x7f"}


# -- names and paths --------------------------------------------------------------------------------------------
def name_problem(name) -> str | None:
    """Why ``name`` cannot be a relative path inside a checkpoint (``None`` when it can).

    A name is ``/``-separated components; no component is empty, ``.`` or ``..``, longer than 200
    characters, or holds a backslash, a colon or a control character. So no name is absolute or escapes the
    checkpoint directory.
    """
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a str"
    if not name or len(name) > 1024:
        return "it is empty or longer than 1024 characters"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"it has the path component {part!r} (absolute paths, '.' and '..' are refused)"
        if len(part) > 200:
            return "one of its components is longer than 200 characters"
        bad = _FORBIDDEN_CHARS.intersection(part)
        if bad:
            return f"it holds the character(s) {sorted(bad)!r}"
    return None


def leaf_names(keys: list[tuple]) -> list[str]:
    """The tensor names of the leaves ``keys`` (tuples of str) of a saved TensorDict: their ``/``-joined key
    paths when every path is a valid name (see :func:`name_problem`) and no two are equal, else ``leaf_<i>``."""
    names = ["/".join(key) for key in keys]
    if all(name_problem(n) is None for n in names) and len(set(names)) == len(names):
        return names
    return [f"leaf_{i}" for i in range(len(keys))]


def dtype_name(dtype: torch.dtype) -> str:
    """The checkpoint's name of ``dtype``; ``TypeError`` for a dtype outside the allowlist."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(
            f"Checkpoints store tensors of dtypes {sorted(DTYPES)}; got {dtype}. Convert the tensor with "
            f"`.to(torch.float32)` (or another listed dtype) before saving it."
        ) from None


def tensor_nbytes(dtype: torch.dtype, shape) -> int:
    return math.prod(shape) * dtype.itemsize


class ReusedFile(NamedTuple):
    """A tensor entry of a checkpoint being written whose file is hard-linked from the file ``source`` of the
    checkpoint it replaces (see NOTE [incremental dumps] in :mod:`.format`), with that file's description."""

    source: str
    dtype: str
    shape: list
    nbytes: int
    crc32: list
    #: whether the file is known to be on disk already (written by a dump with fsync=True): not fsynced again
    durable: bool = False


def file_identity(path: str) -> tuple[int, int, int, int] | None:
    """``(st_dev, st_ino, st_size, st_mtime_ns)`` of ``path`` (no symlink followed), ``None`` if it is gone."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


# -- low-level file helpers -------------------------------------------------------------------------------------
def open_for_read(path: str) -> int:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags)


def read_exact(fd: int, count: int, offset: int) -> bytes:
    parts = []
    while count > 0:
        block = os.pread(fd, count, offset)
        if not block:
            break
        parts.append(block)
        count -= len(block)
        offset += len(block)
    return b"".join(parts)


def crc_windows(fd: int, nbytes: int, window: int = CHECKSUM_WINDOW) -> list[int]:
    """``[crc32 of the first window bytes, crc32 of the last window bytes]`` of the open file ``fd``."""
    size = min(window, nbytes)
    head = zlib.crc32(read_exact(fd, size, 0))
    tail = head if nbytes <= window else zlib.crc32(read_exact(fd, size, nbytes - size))
    return [head, tail]


# -- where a tensor's bytes live --------------------------------------------------------------------------------
class _Mapping:
    __slots__ = ("start", "end", "shared", "offset", "dev", "inode", "path")

    def __init__(self, start, end, shared, offset, dev, inode, path):
        self.start, self.end, self.shared = start, end, shared
        self.offset, self.dev, self.inode, self.path = offset, dev, inode, path


def _maps_lines() -> list[str]:
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _parse_mapping(line: str) -> _Mapping | None:
    fields = line.split(maxsplit=5)
    if len(fields) < 6 or not fields[5].startswith("/"):
        return None
    start, end = (int(x, 16) for x in fields[0].split("-"))
    major, minor = (int(x, 16) for x in fields[3].split(":"))
    return _Mapping(start, end, fields[1][3] == "s", int(fields[2], 16), (major, minor), int(fields[4]), fields[5])


def read_file_mappings() -> list[_Mapping]:
    """The file mappings of this process (Linux ``/proc/self/maps``); empty where that does not exist."""
    return [m for m in map(_parse_mapping, _maps_lines()) if m is not None]


def mapping_at(address: int) -> list[_Mapping]:
    """``[the file mapping holding address]``, or ``[]``: :func:`read_file_mappings` for one tensor.

    The kernel lists mappings by increasing address and writes ``/proc/self/maps`` as it is read, so the
    file is read a page at a time and only up to ``address``. A process with torch loaded has hundreds of
    mappings, most of them libraries mapped at start-up and so above the tensors mapped later (Linux maps
    downwards); listing them all would cost milliseconds per tensor.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps", "rb", buffering=_PAGE) as f:
            for line in f:
                dash = line.find(b"-")
                if int(line[:dash], 16) > address:
                    return []
                if address < int(line[dash + 1 : line.find(b" ", dash)], 16):
                    mapping = _parse_mapping(os.fsdecode(line).rstrip("\n"))
                    return [] if mapping is None else [mapping]
    except OSError:
        pass
    return []


def file_source(tensor: torch.Tensor, mappings: list[_Mapping]) -> tuple[str, int] | None:
    """``(file, byte offset)`` when ``tensor``'s bytes are a contiguous range of a shared file mapping.

    Only then may the file be copied instead of the memory: a shared mapping's pages are the file's page
    cache, so the file holds every write made through the tensor. A private (copy-on-write) mapping, a
    file replaced on disk since it was mapped, or a non-contiguous tensor give ``None``. The file is found
    by the path the kernel reports for the mapping or, when that name was unlinked or moved (a checkpoint
    switch renames directories), by the tensor's own ``filename`` if it is the same inode.
    """
    if (
        not mappings
        or tensor.device.type != "cpu"
        or tensor.layout != torch.strided
        or tensor.numel() == 0
        or not tensor.is_contiguous()
        or tensor.is_conj()
        or tensor.is_neg()
    ):
        return None
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    for m in mappings:
        if m.start <= start and end <= m.end:
            if not m.shared:
                return None
            for candidate in (m.path, getattr(tensor, "_filename", None)):
                try:
                    st = os.stat(candidate)
                except (OSError, TypeError):
                    continue
                if (os.major(st.st_dev), os.minor(st.st_dev)) != m.dev or st.st_ino != m.inode:
                    continue
                offset = m.offset + (start - m.start)
                if not stat.S_ISREG(st.st_mode) or offset + (end - start) > st.st_size:
                    return None
                return candidate, offset
            return None
    return None


# -- writes -----------------------------------------------------------------------------------------------------
def _byte_slices(tensor: torch.Tensor, chunk_bytes: int):
    """Yields the bytes of ``tensor`` in C order, as memoryviews of at most about ``chunk_bytes``."""
    tensor = tensor.detach().as_subclass(torch.Tensor)
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    if tensor.numel() == 0:
        return
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(view), chunk_bytes):
            yield view[start : start + chunk_bytes]
        return
    if tensor.dim() == 0:
        yield from _byte_slices(tensor.cpu().reshape(1), chunk_bytes)
        return
    row_bytes = tensor[0].numel() * tensor.element_size()
    if row_bytes > chunk_bytes and tensor.dim() > 1:
        for row in tensor.unbind(0):
            yield from _byte_slices(row, chunk_bytes)
        return
    rows = max(1, chunk_bytes // max(1, row_bytes))
    for start in range(0, tensor.shape[0], rows):
        piece = tensor[start : start + rows].to("cpu").contiguous()
        yield memoryview(piece.reshape(-1).view(torch.uint8).numpy())


def _copy_file_range(src: int, dst: int, src_offset: int, dst_offset: int, count: int, advance) -> int:
    """Copies with ``os.copy_file_range``; returns how many bytes it copied (fewer if it is unsupported)."""
    copy = getattr(os, "copy_file_range", None)
    done = 0
    while copy is not None and done < count:
        try:
            n = copy(src, dst, min(count - done, CHUNK_BYTES), src_offset + done, dst_offset + done)
        except OSError as err:
            if err.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF):
                return done
            raise
        if n == 0:
            return done
        done += n
        advance(n)
    return done


def copy_between_files(
    src: int, src_offset: int, dst: int, dst_offset: int, count: int, advance: Callable[[int], None]
) -> None:
    """Copies ``count`` bytes between open files, kernel-side if possible, else through one 64 MiB buffer."""
    done = _copy_file_range(src, dst, src_offset, dst_offset, count, advance)
    if done < count:
        view = memoryview(bytearray(min(CHUNK_BYTES, count - done)))
        while done < count:
            n = os.preadv(src, [view[: min(len(view), count - done)]], src_offset + done)
            if n == 0:
                raise RuntimeError(
                    f"A file ended {count - done} bytes early while it was copied: it was truncated by another "
                    f"process during the copy."
                )
            chunk = view[:n]
            while len(chunk):
                chunk = chunk[os.pwrite(dst, chunk, dst_offset + done + n - len(chunk)) :]
            done += n
            advance(n)


def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), or ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2
_WRITEBACK_STEP = 16 << 20


# NOTE [writeback during durable writes]: a durable write (fsync=True) that copies N bytes and then calls fsync
# spends the copy at memory speed and then waits for the disk to take all N bytes; starting the writeback of each
# written range while the next is copied (sync_file_range(SYNC_FILE_RANGE_WRITE), which does not wait) overlaps
# the two, so the final fsync finds most pages already on their way. It changes no content and no guarantee: the
# fsync still runs and waits for everything.
def _writeback_as_written(fd: int, advance: Callable[[int], None]) -> Callable[[int], None]:
    """``advance``, plus a start of the writeback of every ``_WRITEBACK_STEP`` bytes written to ``fd``."""
    if _SYNC_FILE_RANGE is None:
        return advance
    state = [0, 0]  # bytes written, bytes whose writeback has started

    def step(n: int) -> None:
        advance(n)
        state[0] += n
        if state[0] - state[1] >= _WRITEBACK_STEP:
            _SYNC_FILE_RANGE(fd, state[1], state[0] - state[1], _SYNC_FILE_RANGE_WRITE)  # a hint: errors ignored
            state[1] = state[0]

    return step


def write_tensor_file(
    path: str,
    tensor: torch.Tensor,
    *,
    mappings: list[_Mapping],
    fsync: bool,
    advance: Callable[[int], None],
) -> list[int]:
    """Writes the bytes of ``tensor`` to the new file ``path``; returns its head/tail checksums."""
    nbytes = tensor.numel() * tensor.element_size()
    fd = create_new_file(path)
    if fsync:  # NOTE [writeback during durable writes]
        advance = _writeback_as_written(fd, advance)
    try:
        source = file_source(tensor, mappings)
        if source is not None:
            src = open_for_read(source[0])
            try:
                copy_between_files(src, source[1], fd, 0, nbytes, advance)
            finally:
                os.close(src)
        else:
            for view in _byte_slices(tensor, CHUNK_BYTES):
                write_all(fd, view)
                advance(len(view))
        written = os.fstat(fd).st_size
        if written != nbytes:
            raise RuntimeError(f"Wrote {written} bytes to {path!r} instead of {nbytes}.")
        if fsync:
            os.fsync(fd)
        reader = open_for_read(path)
        try:
            return crc_windows(reader, nbytes)
        finally:
            os.close(reader)
    finally:
        os.close(fd)


# -- reads ------------------------------------------------------------------------------------------------------
def lstat_inside(root: str, relative: str) -> os.stat_result:
    """``lstat`` of ``root/relative`` that refuses symlinks at every component (``CheckpointError``)."""
    parts = relative.split("/")
    current = root
    for i, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise CheckpointError(f"The file {relative!r} of the checkpoint {root!r} is missing.") from None
        if stat.S_ISLNK(st.st_mode):
            raise CheckpointError(
                f"{current!r} in the checkpoint {root!r} is a symlink; checkpoints hold regular files only "
                f"and links are never followed."
            )
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise CheckpointError(f"{current!r} in the checkpoint {root!r} should be a directory.")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{relative!r} in the checkpoint {root!r} is not a regular file.")
    return st


def verify_windows(root: str, relative: str, nbytes: int, expected: list[int]) -> None:
    fd = open_for_read(os.path.join(root, relative))
    try:
        found = crc_windows(fd, nbytes)
    finally:
        os.close(fd)
    if found != list(expected):
        where = "first" if found[0] != expected[0] else "last"
        raise CheckpointError(
            f"The file {relative!r} of the checkpoint {root!r} is corrupted: the checksum of its {where} "
            f"{min(nbytes, CHECKSUM_WINDOW)} bytes does not match the metadata."
        )


def read_into(
    path: str, tensor: torch.Tensor, advance: Callable[[int], None] = lambda n: None, offset: int = 0
) -> None:
    """Fills ``tensor`` with the bytes of the file ``path`` from byte ``offset`` on, without mapping it: one copy
    of each byte.

    A ``tensor`` in a shared file mapping (a memmap storage) receives a file-to-file copy, so neither file
    is faulted into this process; a contiguous CPU tensor is read into directly (``preadv``), its memory
    first advised to use huge pages (:func:`advise_huge_pages`); any other tensor is filled one 64 MiB
    slice at a time.
    """
    nbytes = tensor.numel() * tensor.element_size()
    src = open_for_read(path)
    try:
        target = file_source(tensor, mapping_at(tensor.data_ptr())) if nbytes else None
        if target is not None and target[1] == offset and os.path.samefile(target[0], path):
            advance(nbytes)  # the tensor is this very file (a storage mapping its checkpoint's files)
        elif target is not None:
            dst = os.open(target[0], os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                copy_between_files(src, offset, dst, target[1], nbytes, advance)
            except RuntimeError as err:  # the checkpoint file ended early: truncated since it was validated
                raise CheckpointError(f"The checkpoint file {path!r} could not be read whole: {err}") from None
            finally:
                os.close(dst)
        elif tensor.device.type == "cpu" and tensor.is_contiguous() and not (tensor.is_conj() or tensor.is_neg()):
            advise_huge_pages(tensor.data_ptr(), nbytes)
            _preadv_all(src, memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy()), offset, advance)
        else:
            _read_rows(src, tensor if tensor.dim() else tensor.view(1), advance, offset)
    finally:
        os.close(src)


def _huge_page_madvise():
    """``(madvise, MADV_HUGEPAGE, huge page size)`` from libc on Linux; ``None`` elsewhere."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            size = int(f.read())
    except (AttributeError, OSError, ValueError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn, advice, size


_HUGE_PAGES = _huge_page_madvise()


# NOTE [huge pages for bulk fills]: a fresh tensor faults one 4 KiB page at a time on its first write; with
# transparent huge pages it faults one 2 MiB page. ``rb.loads`` reads into huge-page memory (empty_tensor), and
# ``ReplayBuffer.from_hf`` advises its storage after the first chunk (TensorStorage.advise_huge_pages): a 1 GiB
# import took 0.20-0.26 s instead of 0.54-0.65 s. Storages do not advise by themselves: on this project's 2-core
# Linux machine (THP defrag "madvise"), filling a 288 MB storage with 1000 extends of 1000 rows took 0.47-0.62 s
# with the advice and 0.15-0.17 s without, the kernel compacting memory to find huge pages.
def advise_huge_pages(address: int, nbytes: int) -> None:
    """Asks the kernel to back ``[address, address + nbytes)`` with transparent huge pages (Linux).

    A read into memory never touched before (``torch.empty`` of a storage being loaded) spends most of its
    time in page faults, one per 4 KiB page; with huge pages there is one per 2 MiB. numpy's allocator
    asks the same for arrays of 4 MiB and more, which is why ``numpy.load`` reads faster than a plain read
    into a fresh torch tensor. Only whole huge pages inside the range are advised, so no memory outside it
    changes; pages already in place are kept. The advice changes no content, and a refusal (THP disabled,
    an unsupported mapping) is ignored.
    """
    if _HUGE_PAGES is None or nbytes < 2 * _HUGE_PAGES[2]:
        return
    fn, advice, size = _HUGE_PAGES
    start = -(-address // size) * size
    end = (address + nbytes) // size * size
    if end > start:
        fn(start, end - start, advice)


def advise_private_tensors(backing) -> bool:
    """:func:`advise_huge_pages` for every leaf of ``backing`` (a TensorDict) if it lies in private CPU memory
    (not shared, not memory-mapped); returns whether it did."""
    if backing is None or backing.device is None or backing.device.type != "cpu":
        return False
    if backing.is_shared() or backing.is_memmap():
        return False
    for leaf in backing.values(include_nested=True, leaves_only=True):
        advise_huge_pages(leaf.data_ptr(), leaf.numel() * leaf.element_size())
    return True


def _read_rows(src: int, tensor: torch.Tensor, advance, offset: int = 0) -> None:
    """Reads into a non-contiguous ``tensor`` row by row (along dim 0), each row through a CPU buffer."""
    row_bytes = tensor[0].numel() * tensor.element_size() if tensor.shape[0] else 0
    rows = max(1, CHUNK_BYTES // max(1, row_bytes))
    for start in range(0, tensor.shape[0], rows):
        piece = torch.empty((min(rows, tensor.shape[0] - start), *tensor.shape[1:]), dtype=tensor.dtype)
        view = memoryview(piece.reshape(-1).view(torch.uint8).numpy())
        _preadv_all(src, view, offset + start * row_bytes, advance)
        with torch.no_grad():
            tensor[start : start + piece.shape[0]].copy_(piece)


def _preadv_all(fd: int, view: memoryview, offset: int, advance) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done : done + CHUNK_BYTES]], offset + done)
        if n == 0:
            raise CheckpointError(f"A checkpoint file ended {len(view) - done} bytes early while it was read.")
        done += n
        advance(n)


def empty_tensor(dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """An uninitialized CPU tensor laid out for fast reads from the page cache.

    Two measured effects make a read of 256 MiB into fresh memory run at ~4.7 GB/s where ``numpy.load``
    reaches ~7 GB/s (Linux, x86-64): page faults, which numpy's allocator cuts by asking for transparent
    huge pages (``torch.empty`` does not), and a kernel copy whose source (a page of the file) and
    destination start at nearly the same offset in their 4 KiB pages (the stores then alias the loads).
    So the memory comes from numpy and the data starts 256 bytes into a page.
    """
    import numpy as np

    nbytes = tensor_nbytes(dtype, shape)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = np.empty(nbytes + _PAGE, dtype=np.uint8)
    skip = (_READ_PAGE_OFFSET - raw.ctypes.data) % _PAGE
    return torch.from_numpy(raw)[skip : skip + nbytes].view(dtype).reshape(shape)


def map_tensor(path: str, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A copy-on-write memory map of ``path`` (nothing is read now); an empty tensor for 0 bytes."""
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    from tensordict import MemoryMappedTensor

    return MemoryMappedTensor.from_filename(path, dtype=dtype, shape=torch.Size(shape), mode="r")
