"""A process forked from this one never waits on the OpenMP thread team of its parent.

NOTE [OpenMP and fork]: GNU OpenMP (libgomp, the intra-op runtime of torch's Linux CPU builds, also used by MKL
there) keeps, for each thread that opened a parallel region, a pool of worker threads that it reuses for the
next region. ``fork`` copies that bookkeeping into the child but not the threads: once the parent has run any
parallel op (a large ``torch.zeros``, the copy of ``share_memory_()``, a matmul), a forked child's first
parallel op with more than one thread waits forever in ``gomp_team_barrier_wait_end`` for threads that exist
only in the parent (0 % CPU). Building a shared buffer is enough to open a team (its row versions are copied
into shared memory), and so is almost any user code, so this is fixed at the fork rather than in each op.

OpenMP 5.0 gives the cure: ``omp_pause_resource_all(omp_pause_hard)`` ends the calling thread's pool (its
workers exit, its bookkeeping is freed). An ``os.register_at_fork`` ``before`` handler, installed when this
module is imported (with ``torchrl.data``), calls it in the forking thread of every loaded libgomp just before
``os.fork`` (``multiprocessing`` and DataLoader workers under fork, ``os.fork`` itself): the child starts with
no pool and builds its own at its first parallel op, with all its threads. The parent builds a new pool at its
next parallel op (its worker threads start again, once per fork). A libgomp without ``omp_pause_resource_all``
(older than OpenMP 5.0), or a pool that cannot be paused (a fork from inside a parallel region), leaves the
child with one intra-op thread (``torch.set_num_threads(1)``), which never opens a team: slower, never stuck.

Other OpenMP runtimes (LLVM's libomp, Intel's libiomp5) handle fork themselves and are left alone; so are
platforms without ``/proc/self/maps`` (where the loaded libgomp copies are found). ``subprocess`` children run
no at-fork handler, and need none (they ``exec``).

This module is a bottom-layer primitive: it imports no storage, sampler or buffer.
"""

from __future__ import annotations

import ctypes
import os

import torch

OMP_PAUSE_HARD = 2  # omp_pause_resource_t: omp_pause_soft = 1, omp_pause_hard = 2 (OpenMP 5.0)

_pause_functions: dict[str, object] = {}  # libgomp path -> its omp_pause_resource_all, or None without one
_child_single_thread = False  # set by the before-fork handler when a pool may survive into the child


def loaded_libgomp_paths(maps_lines=None) -> list[str]:
    """The files of the GNU OpenMP runtimes loaded in this process (``libgomp*.so*``), in load order.

    Args:
        maps_lines (iterable of str, optional): lines in the format of ``/proc/self/maps``; read from there by
            default (an empty list where it does not exist).

    Examples:
        >>> loaded_libgomp_paths(["7f0-7f1 r-xp 00000000 fe:00 54 /venv/torch/lib/libgomp.so.1"])
        ['/venv/torch/lib/libgomp.so.1']
    """
    if maps_lines is None:
        try:
            with open("/proc/self/maps") as maps:
                maps_lines = maps.readlines()
        except OSError:
            return []
    paths: list[str] = []
    for line in maps_lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].strip()
        name = os.path.basename(path)
        if name.startswith("libgomp") and ".so" in name and path not in paths:
            paths.append(path)
    return paths


def _pause_function(path: str):
    """The ``omp_pause_resource_all`` of the already loaded library ``path`` (``None`` if it has none)."""
    if path not in _pause_functions:
        function = None
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)  # the copy already loaded, never a new one
            function = library.omp_pause_resource_all
            function.argtypes = [ctypes.c_int]
            function.restype = ctypes.c_int
        except (OSError, AttributeError):
            function = None
        _pause_functions[path] = function
    return _pause_functions[path]


def release_openmp_pools(paths=None) -> bool:
    """Ends the calling thread's OpenMP worker pool in each GNU OpenMP runtime of ``paths``.

    What the before-fork handler runs. Pausing an absent pool costs nothing; the next parallel op of this thread
    builds a new pool.

    Args:
        paths (list of str, optional): libgomp files loaded in this process. Defaults to
            :func:`loaded_libgomp_paths`.

    Returns:
        ``True`` if every runtime released its pool (or there is none), ``False`` if one could not (no
        ``omp_pause_resource_all``, or called inside a parallel region).

    Examples:
        >>> import torch
        >>> _ = torch.zeros(1_000_000).add_(1)  # a parallel op: the pool exists now
        >>> release_openmp_pools()
        True
    """
    released = True
    for path in loaded_libgomp_paths() if paths is None else paths:
        function = _pause_function(path)
        if function is None or function(OMP_PAUSE_HARD) != 0:
            released = False
    return released


def _before_fork() -> None:
    global _child_single_thread
    _child_single_thread = not release_openmp_pools()


def _after_fork_in_parent() -> None:
    global _child_single_thread
    _child_single_thread = False


def _after_fork_in_child() -> None:
    global _child_single_thread
    if _child_single_thread:
        _child_single_thread = False
        torch.set_num_threads(1)  # a team of one never waits on the parent's pool


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
