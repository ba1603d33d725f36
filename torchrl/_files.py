"""Crash-safe file writes shared by torchrl's on-disk formats (replay-buffer and policy checkpoints).

Why one module: a torn file after a crash is the failure every format must rule out, and the steps that rule
it out (create a new file without following links, fsync it, rename it over the old one, fsync the parent
directory) are easy to get subtly wrong in a copy. This module imports nothing from torchrl, so every layer
can use it.

- :func:`create_new_file` opens a file that must not exist yet (``O_CREAT | O_EXCL``, symlinks never
  followed);
- :func:`write_new_file` writes a small file whole into a directory no reader sees yet (a checkpoint's
  temporary directory);
- :func:`write_file_atomically` replaces ``path`` in place: readers see the old file or the new one, never
  a mix;
- :func:`fsync_file` and :func:`fsync_dir` flush a file or a directory's entries to the disk.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["create_new_file", "fsync_dir", "fsync_file", "write_all", "write_file_atomically", "write_new_file"]


def create_new_file(path: str | os.PathLike, mode: int = 0o644) -> int:
    """Creates ``path``, which must not exist (symlinks are never followed), and returns a write descriptor.

    Raises:
        FileExistsError: if ``path`` exists (a file, a directory or a symlink).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, mode)


def fsync_file(path: str | os.PathLike) -> None:
    """Flushes the content of the file ``path`` to the disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flushes a directory's entries to disk (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:  # some filesystems refuse fsync on directories
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Writes all of ``data`` to the descriptor ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view) :]


def write_new_file(path: str | os.PathLike, data: bytes, *, fsync: bool) -> None:
    """Writes ``data`` as the new file ``path`` (see :func:`create_new_file`), flushed to disk if ``fsync``.

    Not atomic by itself: use it inside a directory that becomes visible only once complete (a checkpoint's
    temporary directory), or use :func:`write_file_atomically`.
    """
    fd = create_new_file(path)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(
    path: str | os.PathLike, write: Callable[[BinaryIO], None], *, fsync: bool = True
) -> None:
    """Replaces the file ``path`` with what ``write(file)`` writes, so that a crash never leaves a torn file.

    ``write`` receives a binary file object of a new temporary sibling ``.<name>.<hex>.tmp`` (created with
    ``O_EXCL``, permissions ``0o644`` less the umask); the file is flushed, renamed over ``path`` with
    ``os.replace`` (atomic on POSIX and Windows), and the parent directory is flushed so the rename survives a
    power loss. If ``write`` raises, the temporary file is removed and ``path`` is untouched.

    Args:
        path (str or path-like): the file to create or replace. Its directory must exist.
        write (callable): ``write(file)`` writes the whole content to the binary ``file``.

    Keyword Args:
        fsync (bool): flush the file and the directory to the disk. ``False`` is still safe against a
            process crash, not against a power loss. Defaults to ``True``.

    Examples:
        >>> import os, tempfile
        >>> from torchrl._files import write_file_atomically
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = os.path.join(d, "spec.json")
        ...     write_file_atomically(path, lambda f: f.write(b'{"version": 1}'))
        ...     write_file_atomically(path, lambda f: f.write(b'{"version": 2}'))  # replaced whole
        ...     print(open(path).read(), os.listdir(d))
        {"version": 2} ['spec.json']
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
    fd = create_new_file(tmp)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            if fsync:
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(directory)
