"""``_MEMMAP_STORAGE_REGISTRY``: a read-only view of the live memory-mapped storages that clean up after
themselves (those built without ``scratch_dir``, whose temporary directory is removed automatically).

TorchRL keeps such storages in a module-level ``WeakSet`` that its tests and some user code inspect
(``storage in _MEMMAP_STORAGE_REGISTRY``). Here the cleanup itself is done by
:mod:`torchrl.data.replay_buffers._shared.cleanup`, which knows directories, not storages: this view only answers
the question. :class:`~torchrl.data.LazyMemmapStorage` calls :func:`register_memmap_storage` once, when it is
built; copies made by pickling are not registered (they never remove the directory).

This module imports no storage.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Set

_LIVE: weakref.WeakSet = weakref.WeakSet()


def register_memmap_storage(storage) -> None:
    """Records ``storage`` (a memory-mapped storage just built) in the registry while it is alive."""
    _LIVE.add(storage)


def _cleans_up(storage) -> bool:
    auto_cleanup = getattr(storage, "auto_cleanup", None)
    if auto_cleanup is not None:
        return bool(auto_cleanup)
    return getattr(storage, "scratch_dir", None) is None


class _MemmapStorageRegistry(Set):
    """The live memory-mapped storages whose temporary files are removed automatically (read-only)."""

    def _members(self) -> list:
        return [storage for storage in list(_LIVE) if _cleans_up(storage)]

    def __contains__(self, storage) -> bool:
        try:
            return storage in _LIVE and _cleans_up(storage)
        except TypeError:  # not weak-referenceable: never registered
            return False

    def __iter__(self) -> Iterator:
        return iter(self._members())

    def __len__(self) -> int:
        return len(self._members())

    def _refuse(self, *args, **kwargs):
        raise TypeError(
            "_MEMMAP_STORAGE_REGISTRY is read-only: storages register themselves, and their temporary files are "
            "removed when they are garbage collected or the process exits. Pass `scratch_dir` to a "
            "LazyMemmapStorage to keep its files."
        )

    add = discard = remove = clear = pop = _refuse

    def __repr__(self) -> str:
        return f"_MEMMAP_STORAGE_REGISTRY({self._members()!r})"


_MEMMAP_STORAGE_REGISTRY = _MemmapStorageRegistry()
