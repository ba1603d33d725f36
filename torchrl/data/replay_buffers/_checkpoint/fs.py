"""Checkpoint directories: temporary siblings, the atomic switch, crash recovery, locks and fsync.

The rules are stated in :mod:`torchrl.data.replay_buffers.checkpointers` ("Crash safety"); this module
implements them. Names of siblings of a checkpoint ``<parent>/<name>``:

- ``<name>.tmp-<hex>``: a checkpoint being written. Its writer holds an exclusive ``flock`` on the
  directory while it lives, so a lock that can be taken means the writer died and the directory is stale.
- ``<name>.old-<hex>``: the previous checkpoint moved aside during a two-rename switch.

Writers take an exclusive ``flock`` on ``<parent>`` while they recover and switch (not while they stream
data), so two writers never switch or clean up at the same time. Readers take no lock and never modify
anything on disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator

from torchrl._files import fsync_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

MARKER = "COMPLETE"
METADATA = "metadata.json"

# Test-only: called with the name of each step of a write (see ``STEPS``); tests make it kill the process.
STEP_HOOK: Callable[[str], None] | None = None
# Test-only: False forces the two-rename switch even where renameat2(RENAME_EXCHANGE) works.
USE_EXCHANGE = True
STEPS = (
    "tmp_created",
    "tensor_written",
    "metadata_written",
    "marker_written",
    "before_switch",
    "after_exchange",
    "after_aside",
    "after_rename",
    "after_parent_sync",
    "after_cleanup",
)


def step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


# -- locks ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def locked_dir(path: str) -> Iterator[None]:
    """Holds an exclusive ``flock`` on the directory ``path`` (blocking) for the ``with`` block."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _lock_is_free(path: str) -> bool:
    """Whether no live process holds the ``flock`` of ``path`` (i.e. its writer is gone)."""
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def make_tmp_dir(path: str) -> tuple[str, int]:
    """Creates ``<path>.tmp-<hex>`` and locks it; returns it and the descriptor that holds the lock."""
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    os.mkdir(tmp, 0o755)
    fd = os.open(tmp, os.O_RDONLY)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return tmp, fd


# -- state of a path --------------------------------------------------------------------------------------------
def is_complete(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and os.path.isfile(os.path.join(path, MARKER))


def _siblings(path: str, kind: str) -> list[str]:
    parent, name = os.path.split(path)
    prefix = f"{name}.{kind}-"
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(parent, e) for e in entries if e.startswith(prefix))


def resolve_for_read(path: str) -> str | None:
    """The directory a reader should read for ``path``: itself, or the checkpoint moved aside by a crash.

    ``path`` is missing only after a crash between the two renames of a switch (or before any checkpoint
    was written); the previous checkpoint then sits complete at ``<path>.old-<hex>``.
    """
    if os.path.lexists(path):
        return path
    asides = [a for a in _siblings(path, "old") if is_complete(a)]
    if not asides:
        return None
    return max(asides, key=lambda a: os.stat(a).st_mtime_ns)


def recover(path: str, *, fsync: bool) -> None:
    """Repairs what a crashed writer left next to ``path``. Call with the parent directory locked.

    1. ``path`` missing and a complete ``<path>.old-*`` present: it is renamed back to ``path``.
    2. every other ``<path>.old-*`` is removed (``path`` holds a complete checkpoint, or none ever existed);
    3. every ``<path>.tmp-*`` whose lock is free (its writer died) is removed.
    """
    parent = os.path.dirname(path)
    if not os.path.lexists(path):
        restore = resolve_for_read(path)
        if restore is not None:
            os.rename(restore, path)
            if fsync:
                fsync_dir(parent)
    for aside in _siblings(path, "old"):
        shutil.rmtree(aside, ignore_errors=True)
    for tmp in _siblings(path, "tmp"):
        if _lock_is_free(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


# -- the switch -------------------------------------------------------------------------------------------------
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def exchange(a: str, b: str) -> bool:
    """Atomically swaps the directories ``a`` and ``b``; ``False`` where the system cannot do it."""
    if _RENAMEAT2 is None or not USE_EXCHANGE:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, f"renameat2({a!r}, {b!r}, RENAME_EXCHANGE) failed: {os.strerror(err)}")


def switch(tmp: str, path: str, *, fsync: bool) -> None:
    """Puts the complete checkpoint ``tmp`` at ``path``, replacing what is there. Parent must be locked.

    - no ``path``: ``rename(tmp, path)``;
    - else ``renameat2(tmp, path, RENAME_EXCHANGE)`` where the kernel and filesystem support it: ``tmp``
      then holds the old checkpoint and is removed;
    - else ``rename(path, <path>.old-<hex>)``, ``rename(tmp, path)``, then the aside is removed. A crash
      between the two renames leaves ``path`` missing and the old checkpoint complete aside, which readers
      use and the next writer renames back (:func:`recover`).
    """
    parent = os.path.dirname(path)
    step("before_switch")
    if not os.path.lexists(path):
        os.rename(tmp, path)
        step("after_rename")
        leftover = None
    elif exchange(tmp, path):
        step("after_exchange")
        leftover = tmp
    else:
        leftover = f"{path}.old-{secrets.token_hex(6)}"
        os.rename(path, leftover)
        step("after_aside")
        os.rename(tmp, path)
        step("after_rename")
    if fsync:
        fsync_dir(parent)
    step("after_parent_sync")
    if leftover is not None:
        shutil.rmtree(leftover, ignore_errors=True)
    step("after_cleanup")


def replace_dir(path: str, write: Callable[[str], None], check: Callable[[], None], *, fsync: bool) -> None:
    """Puts a new directory at ``path`` crash-safely (the protocol of checkpoints and dataset exports).

    Under the parent's lock: completes a switch a crash interrupted (:func:`recover`) and calls ``check()``,
    which raises to refuse ``path`` (nothing is written then). ``write(tmp)`` then fills a fresh locked
    temporary directory beside ``path``; under the parent's lock again, ``check()`` runs once more and
    :func:`switch` puts ``tmp`` at ``path``. On any error the temporary directory is removed and what was at
    ``path`` is left as it was.
    """
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    with locked_dir(parent):
        recover(path, fsync=fsync)
        check()
    tmp, lock_fd = make_tmp_dir(path)
    try:
        step("tmp_created")
        write(tmp)
        with locked_dir(parent):
            check()
            switch(tmp, path, fsync=fsync)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock_fd)
