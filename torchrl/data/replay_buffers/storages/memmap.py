"""A storage whose tensors are memory-mapped files: :class:`LazyMemmapStorage`.

Files use tensordict's memmap layout (``meta.json`` per level, one ``<key>.memmap`` per leaf) in
``scratch_dir``, or in a temporary directory ``torchrl-memmap-<pid>-<random>`` that this storage creates. With
``auto_cleanup`` (the default without ``scratch_dir``) the directory of the files is removed when the storage
is garbage collected, at normal exit and on SIGTERM (see :mod:`torchrl.data.replay_buffers._shared.cleanup`),
by the process that built the storage only; SIGKILL leaves a temporary directory, for
:func:`~torchrl.data.cleanup_stale_scratch_dirs`. :meth:`LazyMemmapStorage.cleanup` removes it on demand. Copies
of the storage (pickle, DataLoader workers under fork, spawn or forkserver) re-open the same files: content is
never copied, and a copy never removes the directory by itself.
"""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path

import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.storages._checkpoint as _ckpt
from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool
from torchrl.data.replay_buffers._shared.cleanup import (
    make_scratch_dir,
    register_owned_path,
    remove_owned_path,
    unregister_owned_path,
)
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers.errors import FileExistsRuntimeError
from torchrl.data.replay_buffers.storages._registry import register_memmap_storage
from torchrl.data.replay_buffers.storages.lazy_tensor import LazyTensorStorage

STORAGE_SPAWN_UNINITIALIZED = TorchRLPhrase(
    RuntimeError,
    "it has not been initialized yet",
    "{cls} cannot be shared with a spawned process: it has not been initialized yet, so each process would "
    "allocate its own memory. Write one batch before starting processes, or build it with shared_init=True.",
)


class LazyMemmapStorage(LazyTensorStorage):
    """A lazily allocated storage of memory-mapped tensors, for buffers larger than RAM.

    Args:
        max_size (int): the capacity in items (cells for ``ndim > 1``).

    Keyword Args:
        scratch_dir (str or path-like, optional): the directory of the memory-mapped files (created if
            missing; a path naming a file is refused). It is removed only by :meth:`cleanup` or with
            ``auto_cleanup=True``. ``None`` creates a directory ``torchrl-memmap-<pid>-<random>`` in
            :func:`tempfile.gettempdir`. Defaults to ``None``.
        device (torch.device or str): must be ``"cpu"`` (memory maps live in host memory); move batches to
            an accelerator after sampling. Defaults to ``"cpu"``.
        ndim (int): how many leading dims index items. Defaults to ``1``.
        existsok (bool): whether files already present in ``scratch_dir`` may be overwritten at allocation.
            Defaults to ``False`` (a clear error instead).
        compilable (bool): keep the counters as a tensor, private to this process (the files are not shared with
            other processes then), for compiled writes and draws (see :class:`~torchrl.data.Storage`); the first
            write, which makes the files, runs eagerly. Defaults to ``False``.
        shared_init (bool): let the first write come from any process that shares the storage; the files go to
            ``scratch_dir`` or to a temporary directory created at construction (see
            :class:`~torchrl.data.LazyTensorStorage`). Defaults to ``False``.
        auto_cleanup (bool, optional): whether the directory of the files (the temporary one, or
            ``scratch_dir`` once this storage wrote files there) is removed when the storage is garbage
            collected, when the process exits normally and when it receives SIGTERM, by the process that built
            the storage (never by a copy). ``False`` keeps it: a temporary directory then stays until
            :func:`~torchrl.data.cleanup_stale_scratch_dirs` runs after this process ended. Auto-cleanup
            storages are listed in ``torchrl.data.replay_buffers.storages._MEMMAP_STORAGE_REGISTRY``.
            Defaults to ``None``: ``True`` without ``scratch_dir``, ``False`` with one.
        max_string_bytes (int, optional): the width of string entries (see
            :class:`~torchrl.data.LazyTensorStorage`). Without it, each string entry is sized at its first
            write (at least 256 bytes) and longer strings are refused later, since other processes map the
            files. Defaults to ``None``.

    .. note:: Pickling this storage (``pickle``, ``torch.save``, DataLoader workers) sends the path of its
        files, never their bytes. A copy in another process never removes the original's directory.

    .. warning:: ``auto_cleanup=True`` with a ``scratch_dir`` removes that whole directory, files of yours in it
        included. A checkpoint directory mapped in place (``scratch_dir`` naming the ``storage`` folder of a
        checkpoint being loaded) is never removed automatically, only by an explicit :meth:`cleanup`.

    .. warning:: Nothing runs when the process is killed with SIGKILL (or crashes): its temporary directory
        stays behind. :func:`~torchrl.data.cleanup_stale_scratch_dirs` removes those of dead processes; pass
        ``scratch_dir`` to keep the files where you manage them.

    Examples:
        >>> import tempfile, torch
        >>> from torchrl.data import LazyMemmapStorage
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage = LazyMemmapStorage(1000, scratch_dir=d)
        ...     storage.set(torch.arange(2), torch.ones(2, 3))
        ...     print(storage.get(torch.tensor([1])).shape)
        torch.Size([1, 3])
    """

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir=None,
        device="cpu",
        ndim: int = 1,
        existsok: bool = False,
        compilable: bool = False,
        shared_init: bool = False,
        auto_cleanup: bool | None = None,
        max_string_bytes: int | None = None,
    ):
        self.auto_cleanup = _check_auto_cleanup(auto_cleanup, scratch_dir)
        scratch_dir = _check_scratch_dir(scratch_dir)
        if device == "auto":
            device = "cpu"
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"LazyMemmapStorage keeps data in memory-mapped files on the host: `device` must be 'cpu', got "
                f"{device!r}. Use LazyTensorStorage(device={str(device)!r}) for data on that device, or move "
                f"sampled batches with `.to(device)` (e.g. in a transform)."
            )
        self.scratch_dir = scratch_dir
        self.existsok = bool(existsok)
        self._memmap_dir: str | None = None
        self._owns_dir = False
        self._cleaned_up = False
        super().__init__(
            max_size,
            device="cpu",
            ndim=ndim,
            compilable=compilable,
            shared_init=shared_init,
            max_string_bytes=max_string_bytes,
        )
        if not self._compilable:  # compilable: counters private to this process (see TensorCounters)
            self._make_shared()  # files are shared by every process that opens them: so are the counters
        register_memmap_storage(self)  # the _MEMMAP_STORAGE_REGISTRY view (auto-cleanup storages only)
        if self.shared_init and self.scratch_dir is not None:
            self._auto_remove(self.scratch_dir)  # the first writer may be another process: own it from here

    def _new_scratch_dir(self) -> str:
        path = make_scratch_dir()  # registered: removed at exit and on SIGTERM, by this process only
        if self.auto_cleanup:
            weakref.finalize(self, remove_owned_path, path)
            self._owns_dir = True
        else:
            unregister_owned_path(path)  # auto_cleanup=False: the directory outlives the storage
        return path

    def _shared_init_dir(self) -> str:
        return self.scratch_dir if self.scratch_dir is not None else self._new_scratch_dir()

    def _auto_remove(self, path: str) -> None:
        """With ``auto_cleanup``, removes the user's ``path`` with this storage, at exit and on SIGTERM (the
        process that built the storage only)."""
        if not self.auto_cleanup or self._owns_dir or os.getpid() != self._creator_pid:
            return
        register_owned_path(path)
        weakref.finalize(self, remove_owned_path, path)
        self._owns_dir = True

    def _allocate(self, item: TensorDictBase, rows: int) -> TensorDictBase:
        state = self.shared_init_state
        if self.scratch_dir is None:
            path = self._new_scratch_dir() if state is None else state.directory
        else:
            path = self.scratch_dir
            if not self.existsok and Path(path).exists() and any(Path(path).iterdir()):
                raise FileExistsRuntimeError(  # a FileExistsError, and the RuntimeError TorchRL raises here
                    f"`scratch_dir` {path!r} already holds files and `existsok=False`. Pass existsok=True to "
                    f"overwrite them, or choose an empty directory."
                )
        self._memmap_dir = path
        template = item.expand(rows, *item.batch_size)
        backing = template.memmap_like(prefix=path, existsok=True)
        if self.scratch_dir is not None:
            self._auto_remove(path)
        self._cleaned_up = False
        return backing

    def _backing_for_checkpoint(self, doc: dict, tensors) -> TensorDictBase:
        """Maps the checkpoint's files in place when ``scratch_dir`` is the checkpoint's storage directory."""
        mapped = (
            None if self.scratch_dir is None else _ckpt.map_checkpoint_files(doc, tensors, self.scratch_dir)
        )
        if mapped is None:
            if self.scratch_dir is not None:  # never allocate into the checkpoint's own files
                _ckpt.check_not_own_files(doc, tensors, self.scratch_dir, type(self).__name__)
            return super()._backing_for_checkpoint(doc, tensors)
        self._memmap_dir = self.scratch_dir
        return mapped

    @property
    def memmap_dir(self) -> str | None:
        """The directory holding the memory-mapped files (``None`` before the first write)."""
        if self._memmap_dir is None and self.shared_init_state is not None:
            return self.shared_init_state.directory
        return self._memmap_dir

    def cleanup(self) -> bool:
        """Removes the directory of the memory-mapped files now: ``scratch_dir``, or the temporary directory.

        It works whatever ``auto_cleanup`` (a ``scratch_dir`` of yours is removed too) and in any copy of the
        storage: every process mapping the files keeps reading the data it mapped, but nothing can map them
        again (a new process, a checkpoint of the files). Call it when the data is no longer needed.

        Returns:
            ``True`` if it removed the directory; ``False`` if there was nothing to remove: a second call,
            a storage that holds no data yet, or a directory already gone.

        Examples:
            >>> import os, torch
            >>> from torchrl.data import LazyMemmapStorage
            >>> storage = LazyMemmapStorage(10)
            >>> storage.cleanup()  # nothing written yet
            False
            >>> storage.set(torch.arange(2), torch.ones(2, 3))
            >>> path = storage.memmap_dir
            >>> storage.cleanup(), os.path.exists(path), storage.cleanup()
            (True, False, False)
        """
        path = self.memmap_dir
        if self._cleaned_up or path is None or not self.initialized:
            return False
        self._cleaned_up = True
        unregister_owned_path(path)  # the exit hooks and the finalizer have nothing left to do
        if not os.path.isdir(path) or os.path.islink(path):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)

    def share_memory_(self) -> LazyMemmapStorage:
        """No-op: memory-mapped files and their counters are always shared between processes."""
        return self

    def __getstate__(self):
        if is_spawning() and not self.shared_init and not self.initialized:
            raise STORAGE_SPAWN_UNINITIALIZED.error(cls=type(self).__name__)
        state = super().__getstate__()
        state["_owns_dir"] = False
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if (
            not self.is_shared
        ):  # a copy by value (pickle, torch.save) shares the files: share its counters too
            self._make_shared()

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", scratch_dir={self._memmap_dir!r})"


def _check_scratch_dir(scratch_dir) -> str | None:
    """``scratch_dir`` as an absolute str; refuses a value that is not a path, and a path naming a file (or
    under one), which memory-mapped files cannot go into."""
    if scratch_dir is None:
        return None
    if not isinstance(scratch_dir, (str, os.PathLike)) or isinstance(scratch_dir, bytes):
        raise TypeError(
            f"`scratch_dir` must be a str or a path-like naming a directory, or None for a temporary directory; "
            f"got {type(scratch_dir).__name__}: {scratch_dir!r}."
        )
    path = Path(os.fspath(scratch_dir)).absolute()
    for candidate in (path, *path.parents):  # the nearest existing ancestor decides
        if candidate.exists():
            if not candidate.is_dir():
                raise NotADirectoryError(
                    f"`scratch_dir`={str(scratch_dir)!r} cannot hold memory-mapped files: {str(candidate)!r} is a "
                    f"file, not a directory. Pass a directory (it is created if missing), or None for a "
                    f"temporary directory."
                )
            break
    return str(path)


def _check_auto_cleanup(auto_cleanup, scratch_dir) -> bool:
    """``auto_cleanup`` as a bool: ``None`` means ``True`` without ``scratch_dir`` and ``False`` with one."""
    if auto_cleanup is None:
        return scratch_dir is None
    return check_bool("auto_cleanup", auto_cleanup)
