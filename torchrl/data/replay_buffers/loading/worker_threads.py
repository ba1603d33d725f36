"""Refuse the worker setting that hangs: a forked DataLoader worker with more than one OpenMP thread.

NOTE [forked workers and OpenMP]: GNU OpenMP (libgomp, torch's intra-op backend on Linux) is not fork-safe.
Once the parent process has run a parallel region, its thread team does not exist in a forked child, but
libgomp's bookkeeping says it does: the child's first parallel region with more than one thread waits forever
in ``gomp_team_barrier_wait_end``. torch protects its DataLoader workers by setting one thread in each worker;
a ``worker_init_fn`` that raises the count again (``torch.set_num_threads(2)``, the obvious thing to try when
a worker's transform is slow) turns the job into a silent hang. The datasets over buffers and storages call
:func:`check_worker_threads` at their first read in a worker, after ``worker_init_fn`` has run, and raise an
error naming the fix instead.

How a forked worker is recognised, on public seams only: a dataset records the pid of the process that built
or unpickled it (:class:`ForkThreadGuard`). spawn and forkserver workers receive the dataset by pickling, so
the recorded pid is their own; a forked worker inherits the parent's object, so the pid differs.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import get_worker_info

__all__ = ["ForkThreadGuard", "check_worker_threads", "uses_openmp"]

_OPENMP: bool | None = None


def uses_openmp() -> bool:
    """Whether torch's intra-op parallel backend is OpenMP (the fork-unsafe one), read once from torch."""
    global _OPENMP
    if _OPENMP is None:
        _OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    return _OPENMP


def check_worker_threads(dataset, origin_pid: int) -> None:
    """Raise if this process is a forked DataLoader worker whose torch thread count is above 1.

    Args:
        dataset: the dataset being read, named in the error.
        origin_pid (int): the pid of the process that built or unpickled ``dataset``.

    Raises:
        RuntimeError: in a forked worker with ``torch.get_num_threads() > 1`` and an OpenMP build of torch.
    """
    info = get_worker_info()
    if info is None or os.getpid() == origin_pid:
        return  # the main process, a thread worker, or a spawn/forkserver worker (the dataset was unpickled)
    threads = torch.get_num_threads()
    if threads > 1 and uses_openmp():
        raise RuntimeError(
            f"{type(dataset).__name__} is read by a forked DataLoader worker (worker {info.id}) that runs "
            f"{threads} torch threads (set by worker_init_fn or the environment). torch's OpenMP runtime is "
            f"not fork-safe: the worker's first parallel operation would wait forever for threads that exist "
            f"only in the parent. Either keep one thread per forked worker (remove torch.set_num_threads from "
            f"worker_init_fn), or start the workers with DataLoader(..., multiprocessing_context='spawn') "
            f"(or 'forkserver'), where several threads per worker are safe. See 'Choosing workers and threads' "
            f"in the DataLoader guide."
        )


class ForkThreadGuard:
    """Mixin for a dataset: records where the object was built or unpickled, and checks worker threads.

    A subclass calls :meth:`_check_worker_threads` at its first read in each process; the check itself costs
    one ``get_worker_info()`` call and is then skipped in that process.
    """

    _origin_pid: int | None = None
    _threads_checked_pid: int | None = None

    def _record_origin(self) -> None:
        self._origin_pid = os.getpid()

    def _check_worker_threads(self) -> None:
        pid = os.getpid()
        if self._threads_checked_pid == pid:
            return
        check_worker_threads(self, self._origin_pid if self._origin_pid is not None else pid)
        self._threads_checked_pid = pid

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._record_origin()
        self._threads_checked_pid = None
