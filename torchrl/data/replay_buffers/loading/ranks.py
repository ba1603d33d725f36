"""Which share of a dataset one process reads: its rank among data-parallel processes, its DataLoader worker.

A data-parallel run has ``world_size`` processes (ranks), each with ``num_workers`` DataLoader workers (or
none: the rank's main process reads). Each (rank, worker) pair is one *reader*; there are
``world_size * max(num_workers, 1)`` of them. This module says which reader the current process is, and
derives a seed per reader so that no two readers draw the same batches from the same seed.

The rank and world size come from the caller when given, else from an initialized default process group of
:mod:`torch.distributed`, else they are ``0`` and ``1``. Nothing here starts or queries a process group
otherwise.
"""

from __future__ import annotations

import hashlib

from torch.utils.data import get_worker_info

from torchrl._validation import check_int

__all__ = ["Reader", "current_reader", "iteration_key", "reader_quota", "reader_seed", "resolve_rank"]


def _distributed_rank_and_size() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed support
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def resolve_rank(rank, world_size) -> tuple[int, int]:
    """The ``(rank, world_size)`` of a dataset being built: the keywords when given (both, with
    ``0 <= rank < world_size``), else those of torch.distributed's default process group if it is initialized,
    else ``(0, 1)``. Called in the main process: DataLoader workers have no process group of their own."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"Pass both `rank` and `world_size` or neither (then torch.distributed's default process group, if "
            f"initialized, gives them); got rank={rank!r}, world_size={world_size!r}."
        )
    if rank is None:
        found = _distributed_rank_and_size()
        return found if found is not None else (0, 1)
    world_size = check_int("world_size", world_size, minimum=1, hint=" The number of data-parallel processes.")
    rank = check_int("rank", rank, minimum=0, hint=" This process's rank, from 0 to world_size - 1.")
    if rank >= world_size:
        raise ValueError(f"`rank` must be smaller than `world_size`; got rank={rank}, world_size={world_size}.")
    return rank, world_size


class Reader:
    """One reader of a dataset: ``rank`` of ``world_size`` and ``worker`` of ``num_workers`` (``worker`` is
    ``None`` and ``num_workers`` is ``0`` in a rank's main process)."""

    __slots__ = ("rank", "world_size", "worker", "num_workers", "worker_seed")

    def __init__(self, rank: int, world_size: int, worker: int | None, num_workers: int, worker_seed: int | None):
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers, self.worker_seed = worker, num_workers, worker_seed

    @property
    def index(self) -> int:
        """This reader's position among all readers: ``worker * world_size + rank``, so that the readers of a
        rank together get ``len(range(rank, total, world_size))`` of ``total`` batches (ranks differ by at most
        one batch: data-parallel steps stay in lockstep), split over its workers as one rank's would be."""
        return (self.worker or 0) * self.world_size + self.rank

    @property
    def count(self) -> int:
        """The number of readers: ``world_size * max(num_workers, 1)``."""
        return self.world_size * max(self.num_workers, 1)

    def describe(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "worker": self.worker,
                "num_workers": self.num_workers}


def current_reader(rank: int, world_size: int) -> Reader:
    """The reader the calling process is, in rank ``rank`` of ``world_size`` (see :func:`resolve_rank`); the
    worker comes from :func:`torch.utils.data.get_worker_info`."""
    info = get_worker_info()
    if info is None:
        return Reader(rank, world_size, None, 0, None)
    return Reader(rank, world_size, info.id, info.num_workers, info.seed)


def reader_quota(total: int | None, reader: Reader) -> int | None:
    """This reader's share of ``total`` batches: ``len(range(reader.index, total, reader.count))``, so the
    shares of all readers add up to ``total`` exactly (``None``, endless, stays ``None``)."""
    if total is None:
        return None
    return len(range(reader.index, total, reader.count))


def reader_seed(seed: int, rank: int, world_size: int) -> int:
    """The seed of a reader: ``seed`` itself in a single-rank run (so one-process behaviour is unchanged),
    else a hash of ``(seed, rank)`` below ``2**63``: ranks seeded alike (the usual ``torch.manual_seed(s)`` on
    every rank) still draw distinct streams."""
    if world_size == 1:
        return int(seed) % (2**63)
    digest = hashlib.blake2b(f"torchrl-reader:{int(seed)}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**63)


def iteration_key(base_seed: int, iteration: int) -> int:
    """The key of one DataLoader iteration, the same in all its workers: a hash of torch's base seed of the
    iteration (``info.seed - info.id``) and the worker's count of iterations (persistent workers keep their
    seed from one iteration to the next), below ``2**62``."""
    digest = hashlib.blake2b(f"torchrl-iteration:{int(base_seed)}:{int(iteration)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**62)
