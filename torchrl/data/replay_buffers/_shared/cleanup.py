"""Removing this process's temporary files and directories when it exits, SIGTERM included.

Data model: a registry ``{absolute path: owner pid}``. :func:`register_owned_path` adds a path (a file or a
directory) owned by the calling process; the registered paths of a process are removed

- when the owner calls :func:`remove_owned_path` (e.g. from the ``weakref.finalize`` of the object that
  created it) or :func:`remove_owned_paths`;
- at normal interpreter exit (``atexit``), and at the end of a ``multiprocessing`` child (which leaves through
  ``os._exit`` under fork and forkserver, skipping ``atexit``);
- when the process receives SIGTERM: a handler, installed while the process owns registered paths, removes
  them, then chains to the handler it replaced (see :func:`register_owned_path`).

NOTE [SIGTERM never keeps a process alive]: CPython runs a Python signal handler in the main thread between two
bytecodes; a main thread blocked in a C call that does not return (a native deadlock, a futex wait) defers it,
and with it the default action of SIGTERM, for as long as the call lasts. So the handler is installed only
while it has something to do: from the first registration made from the main thread until this process owns
no registered path any more (the handler it replaced is then put back, at the last removal made from the main
thread), and a forked child, which owns nothing, gets the handler it replaced back at once. A process that owns
no path (a collector or a DataLoader worker forked from the buffer's owner, a process whose storages are gone)
dies of SIGTERM wherever it is blocked. A process that owns paths and whose main thread is blocked in such a
call handles SIGTERM when the call returns; SIGKILL still ends it, and :func:`cleanup_stale_scratch_dirs`
removes what it leaves.

NOTE [owned paths and fork]: only the process that registered a path ever removes it. Each entry records the
owner's pid and every removal checks it against ``os.getpid()``; a child created by ``os.fork`` (DataLoader
workers, ``multiprocessing`` under fork) also starts with an empty registry. A forked child therefore never
removes its parent's files, whether it exits normally, is garbage collected or receives SIGTERM.

Nothing runs on SIGKILL (or on a crash of the interpreter): the registered paths of a process killed that way
stay behind. Scratch directories made by :func:`make_scratch_dir` carry their owner's pid in their name and in
a marker file, so that :func:`cleanup_stale_scratch_dirs` can later remove those of dead processes.

NOTE [marker identity]: a marker file can be copied into any directory of the same user (``cp``, ``cp -a``,
an archive), so its pid alone cannot tell the directory that :func:`make_scratch_dir` created from a copy.
The marker also records what a copy cannot reproduce: the device and inode of the directory and of the marker
file itself (a copy gets new inodes), and the time it was written, checked against the marker's ``ctime``
(which no user can set: a copy's ``ctime`` is the time of the copy). All must match before a directory is
removed; a marker without them (or unreadable) keeps its directory.

This module is the bottom layer: it imports no storage, sampler or buffer.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time

SCRATCH_PREFIX = "torchrl-memmap"
_MARKER = ".torchrl-owner.json"
_NAME = re.compile(rf"^{re.escape(SCRATCH_PREFIX)}-(\d+)-[A-Za-z0-9_]+$")
_MAX_PID = 2**31 - 1  # pids are C ints: a larger number in a name was not written by make_scratch_dir
# a marker's ctime: at most 2 s before, 10 min after its write time
_CTIME_SLACK_NS = (2 * 10**9, 600 * 10**9)

_lock = threading.RLock()  # reentrant: the SIGTERM handler may interrupt the main thread inside the lock
_owned: dict[str, int] = {}
_exit_hooks_pid: int | None = None  # the process whose exit hooks are registered
_handler_installed = False
_previous_handler = None


def _absolute(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike, got {type(path).__name__}: {path!r}.")
    return os.path.abspath(os.fspath(path))


def register_owned_path(path) -> None:
    """Records ``path`` (a file or a directory) as owned by this process, to be removed when it exits.

    The path is removed by :func:`remove_owned_path`, :func:`remove_owned_paths`, at normal interpreter exit
    (or at the end of a ``multiprocessing`` child), or when this process receives SIGTERM, and only ever by
    the process that registered it (a forked child never removes it). The path does not need to exist yet.
    Thread-safe.

    A registration made from the main thread installs a SIGTERM handler if none is installed. On SIGTERM it
    removes this process's registered paths, then chains to the handler it replaced: a Python handler is
    called with the same arguments; for the default action, the default is restored and SIGTERM raised again,
    so the process still ends "killed by SIGTERM". When SIGTERM is ignored (``SIG_IGN``) or handled outside
    Python, no handler is installed: the process survives SIGTERM and its files stay in use, to be removed at
    exit. The replaced handler is put back once this process owns no registered path (at the last removal
    made from the main thread), and in a forked child: see NOTE [SIGTERM never keeps a process alive].

    Args:
        path (str or path-like): the file or directory; stored as an absolute path.

    .. warning:: A SIGTERM handler installed after this one replaces it unless it chains to the handler it
        found; cleanup then happens only at normal exit (``sys.exit`` in that handler is enough). A process
        that keeps running after a chained handler returns finds its registered paths removed.

    Examples:
        >>> import os, tempfile
        >>> from torchrl.data.replay_buffers._shared.cleanup import register_owned_path, remove_owned_path
        >>> fd, path = tempfile.mkstemp()
        >>> os.close(fd)
        >>> register_owned_path(path)
        >>> remove_owned_path(path), os.path.exists(path)
        (True, False)
    """
    global _exit_hooks_pid
    path, pid = _absolute(path), os.getpid()
    with _lock:
        _owned[path] = pid
        if _exit_hooks_pid != pid:  # once per process (a forked child also inherits the parent's: idempotent)
            atexit.register(remove_owned_paths)
            multiprocessing.util.Finalize(None, remove_owned_paths, exitpriority=0)
            _exit_hooks_pid = pid
        _install_sigterm_handler()


def unregister_owned_path(path) -> None:
    """Forgets ``path`` without removing it (e.g. a file that was renamed into its final place)."""
    with _lock:
        _owned.pop(_absolute(path), None)
        _restore_sigterm_handler_if_unused()


def remove_owned_path(path) -> bool:
    """Removes ``path`` now if this process registered it, and forgets it.

    Returns:
        ``True`` if the path was registered by this process (it no longer exists), ``False`` otherwise (not
        registered, or registered by another process such as the parent of a forked child: left untouched).
    """
    path = _absolute(path)
    with _lock:
        if _owned.get(path) != os.getpid():
            return False
        del _owned[path]
        _restore_sigterm_handler_if_unused()
    _remove(path)
    return True


def remove_owned_paths() -> list[str]:
    """Removes every path registered by this process and returns them (what exit and SIGTERM run)."""
    pid = os.getpid()
    with _lock:
        mine = [path for path, owner in _owned.items() if owner == pid]
        for path in mine:
            del _owned[path]
        _restore_sigterm_handler_if_unused()
    for path in mine:
        _remove(path)
    return mine


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def _on_sigterm(signum, frame) -> None:
    previous = _previous_handler  # read first: removing the last path puts it back and forgets it
    try:
        remove_owned_paths()
    finally:
        if previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)  # delivered to this thread before raise_signal returns
        elif callable(previous):
            previous(signum, frame)


def _install_sigterm_handler() -> None:
    """Installs :func:`_on_sigterm` once per process, from the main thread only (called under ``_lock``)."""
    global _handler_installed, _previous_handler
    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is _on_sigterm:  # inherited through fork
        _handler_installed = True
        return
    if previous is None or previous == signal.SIG_IGN:
        return  # a handler outside Python cannot be chained to; an ignored SIGTERM ends nothing
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread of the main interpreter
        return
    _previous_handler = previous
    _handler_installed = True


def _restore_sigterm_handler() -> None:
    """Puts back the SIGTERM handler that :func:`_on_sigterm` replaced, if it is still the one installed (a
    handler installed over it may chain to it: it then stays). Main thread only."""
    global _handler_installed, _previous_handler
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return
    try:
        signal.signal(signal.SIGTERM, _previous_handler)
    except (ValueError, TypeError):  # not the main thread of the main interpreter
        return
    _handler_installed = False
    _previous_handler = None


def _restore_sigterm_handler_if_unused() -> None:
    """Once this process owns no registered path, gives SIGTERM back to the handler it had (called under
    ``_lock``, from any thread: only the main thread can change a handler; the others leave it installed)."""
    if not _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    pid = os.getpid()
    if any(owner == pid for owner in _owned.values()):
        return
    _restore_sigterm_handler()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at fork time
    _owned.clear()  # the parent's paths are never the child's to remove
    if _handler_installed:  # the child owns nothing: SIGTERM ends it wherever it is blocked
        _restore_sigterm_handler()


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- scratch directories and their owners ----------------------------------------------------------------
def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(200).strip()
    except OSError:
        return None


def process_identity() -> dict:
    """What tells whether a pid written in a marker (a scratch directory's, a lock file's) names a process this
    one can see: the host, the boot and the pid namespace."""
    pid_ns = None
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
        "pid_ns": pid_ns,
    }


def make_scratch_dir(root=None) -> str:
    """Creates and registers a private scratch directory ``<root>/torchrl-memmap-<pid>-<random>``.

    The directory (mode ``0o700``) holds a marker file with the owner's pid, host, boot and pid namespace, so
    that :func:`cleanup_stale_scratch_dirs` can tell a dead owner from a live one. It is registered with
    :func:`register_owned_path`.

    Args:
        root (str or path-like, optional): where to create it. Defaults to :func:`tempfile.gettempdir`.
    """
    pid = os.getpid()
    path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}-{pid}-", dir=None if root is None else os.fspath(root))
    register_owned_path(path)
    _write_marker(path, pid)
    return path


def _write_marker(directory: str, pid: int, **fields) -> None:
    """Writes the owner marker of ``directory`` (see NOTE [marker identity]); ``fields`` override entries
    (tests forge markers with them)."""
    fd = os.open(
        os.path.join(directory, _MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
    )
    with os.fdopen(fd, "w") as f:
        dir_info, marker_info = os.stat(directory), os.fstat(fd)
        marker = {
            "pid": pid,
            **process_identity(),
            "dev": dir_info.st_dev,
            "dir_ino": dir_info.st_ino,
            "marker_ino": marker_info.st_ino,
            "written_ns": time.time_ns(),
            **fields,
        }
        json.dump(marker, f)


def _is_original(directory: str, info: os.stat_result, marker: dict) -> bool:
    """Whether ``marker`` was written into ``directory`` itself by :func:`make_scratch_dir`, not copied there."""
    try:
        marker_info = os.lstat(os.path.join(directory, _MARKER))
    except OSError:
        return False
    written = marker.get("written_ns")
    if not isinstance(written, int) or isinstance(written, bool):
        return False
    before, after = _CTIME_SLACK_NS
    return (
        marker.get("dev") == info.st_dev == marker_info.st_dev
        and marker.get("dir_ino") == info.st_ino
        and marker.get("marker_ino") == marker_info.st_ino
        and stat.S_ISREG(marker_info.st_mode)
        and written - before <= marker_info.st_ctime_ns <= written + after
    )


def _owner_is_dead(pid: int, marker: dict, here: dict) -> bool:
    """Whether the process that made a scratch directory is certainly gone (``False`` when unsure)."""
    if marker.get("pid") != pid or marker.get("host") != here["host"] or pid == os.getpid() or pid > _MAX_PID:
        return False
    if marker.get("boot_id") and here["boot_id"] and marker["boot_id"] != here["boot_id"]:
        return True  # made before this machine rebooted
    if marker.get("pid_ns") != here["pid_ns"]:
        return False  # another pid namespace (container): its pids mean nothing here
    return pid_is_gone(pid)


def pid_is_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists in this pid namespace (``False`` when unsure: a process of another
    user, or a value that is no pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):  # PermissionError: alive, another user's; never a crash
        return False
    return False


def _read_marker(directory: str) -> dict | None:
    try:
        fd = os.open(os.path.join(directory, _MARKER), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            marker = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def cleanup_stale_scratch_dirs(root=None, *, dry_run: bool = False) -> list[str]:
    """Removes the scratch directories left behind by dead processes (e.g. killed with SIGKILL).

    A :class:`~torchrl.data.LazyMemmapStorage` built without ``scratch_dir`` keeps its files in a directory
    ``torchrl-memmap-<pid>-<random>`` of the temporary directory. That directory is removed when the storage
    is garbage collected, at normal exit and on SIGTERM, but nothing can run when the owner is killed with
    SIGKILL (or crashes): then it stays. This function removes such directories under ``root``: only those
    with that name, owned by the current user, holding the marker file written at creation, and whose owner
    process is certainly dead. A directory of a live process, of another host or container, or that this
    package did not create is never touched, nor one holding a copy of another directory's marker (the marker
    records the directory's inode and the marker's own inode and write time, which a copy cannot reproduce).
    Every entry is checked before it is removed, and a name that cannot be a scratch directory (e.g. a pid
    too large for the system) is skipped.

    Args:
        root (str or path-like, optional): the directory to scan (not recursively). Defaults to
            :func:`tempfile.gettempdir`.

    Keyword Args:
        dry_run (bool): list the directories that would be removed, remove nothing. Defaults to ``False``.

    Returns:
        The paths removed (or, with ``dry_run=True``, that would be removed), sorted.

    Examples:
        >>> import tempfile
        >>> from torchrl.data import cleanup_stale_scratch_dirs
        >>> with tempfile.TemporaryDirectory() as root:
        ...     print(cleanup_stale_scratch_dirs(root, dry_run=True))
        []
    """
    root = tempfile.gettempdir() if root is None else os.fspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(
            f"`root` must be an existing directory, got {root!r}; pass None for the "
            f"temporary directory ({tempfile.gettempdir()!r})."
        )
    here, uid, found = process_identity(), os.getuid(), []
    for name in sorted(os.listdir(root)):
        match = _NAME.match(name)
        if match is None or int(match.group(1)) > _MAX_PID:
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        marker = _read_marker(path)
        if marker is None or not _is_original(path, info, marker):
            continue
        if not _owner_is_dead(int(match.group(1)), marker, here):
            continue
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
            if os.path.lexists(path):
                continue
        found.append(path)
    return found
