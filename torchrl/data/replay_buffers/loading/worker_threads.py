"""Refuse the worker setting that hangs: a forked DataLoader worker with more than one OpenMP thread.

NOTE [forked workers and OpenMP]: GNU OpenMP (libgomp, torch's intra-op backend on Linux) is not fork-safe.
Once the parent process has run a parallel region, its thread team does not exist in a forked child, but
libgomp's bookkeeping says it does: the child's first parallel region with more than one thread waits forever
in ``gomp_team_barrier_wait_end``. torch protects its DataLoader workers by setting one thread in each worker;
a ``worker_init_fn`` that raises the count again (``torch.set_num_threads(2)``, the obvious thing to try when
a worker's transform is slow) turns the job into a silent hang. The datasets over buffers and storages call
:func:`check_worker_threads` at their first read in a worker, after ``worker_init_fn`` has run, and raise an
error naming the fix instead.

How a forked worker is recognised, on public seams only: a dataset holds a :class:`WorkerThreadCheck`, which
records the pid of the process that built or unpickled it. spawn and forkserver workers receive the dataset by
pickling, so the recorded pid is their own; a forked worker inherits the parent's object, so the pid differs.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import get_worker_info

__all__ = ["WorkerThreadCheck", "check_worker_threads", "uses_openmp"]

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


class WorkerThreadCheck:
    """The check of :func:`check_worker_threads` for one dataset, run once per process.

    A dataset builds one in its ``__init__`` (``self._thread_check = WorkerThreadCheck()``) and calls
    ``self._thread_check.check(self)`` at each read: the first call in a process costs one ``get_worker_info()``
    call, the next ones compare a pid. The object records the process that built it; a copy made by pickling
    (what a spawn or forkserver worker receives) records the process that unpickles it, while a forked worker
    inherits the parent's object and its pid.

    Examples:
        >>> from torchrl.data.replay_buffers.loading.worker_threads import WorkerThreadCheck
        >>> check = WorkerThreadCheck()
        >>> check.check(object())  # the main process: nothing to refuse
        >>> check.checked_pid == check.origin_pid
        True
    """

    __slots__ = ("origin_pid", "checked_pid")

    def __init__(self) -> None:
        self.origin_pid: int = os.getpid()
        self.checked_pid: int | None = None

    def check(self, dataset) -> None:
        """Raises the ``RuntimeError`` of :func:`check_worker_threads` for ``dataset``, once per process."""
        pid = os.getpid()
        if self.checked_pid == pid:
            return
        check_worker_threads(dataset, self.origin_pid)
        self.checked_pid = pid

    def __reduce__(self):
        return (WorkerThreadCheck, ())  # a copy records the process that unpickles it
