"""The rank processes of loading/test_distributed.py (gloo, localhost): each re-opens one memory-mapped storage directory.

Child-process targets live here, not in the test module, so that a ``spawn`` child imports only this module.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from helpers.factories import make_buffer
from torchrl.data import LazyMemmapStorage, ReplayBuffer, tensordict_collate

ITEMS = 48
BATCH = 4
WORKERS = 2
TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging


def write_shared_buffer(path: str) -> None:
    """The buffer every rank reads: ``ITEMS`` items whose ``obs`` is their id, saved at ``path`` with its
    memory-mapped files in ``path/storage`` (each rank maps them in place)."""
    storage = LazyMemmapStorage(ITEMS, scratch_dir=os.path.join(path, "storage"))
    make_buffer(storage=storage, batch_size=BATCH, data=TensorDict(obs=torch.arange(ITEMS), batch_size=[ITEMS])).dumps(path)


def open_shared_buffer(path: str) -> ReplayBuffer:
    rb = make_buffer(storage=LazyMemmapStorage(ITEMS, scratch_dir=os.path.join(path, "storage")), batch_size=BATCH)
    rb.loads(path)  # maps the files in place: no copy, every rank reads the same pages
    return rb


def _loader(dataset, num_workers: int, **kwargs) -> DataLoader:
    if num_workers:
        kwargs.update(multiprocessing_context="fork", timeout=TIMEOUT)
    return DataLoader(dataset, num_workers=num_workers, collate_fn=tensordict_collate, **kwargs)


def rank_main(rank: int, world_size: int, init_file: str, path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # every rank seeded alike, as data-parallel scripts do
        rb = open_shared_buffer(path)
        results = {}

        # StorageDataset + DistributedSampler: one shard per rank and epoch
        dataset = rb.storage.as_dataset()
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # rank and world size from the group
        loader = _loader(dataset, WORKERS, batch_size=5, sampler=sampler)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            results[f"shard_{epoch}"] = torch.cat([batch["obs"] for batch in loader])

        # ReplayBufferDataset: num_batches split over ranks x workers, one stream each
        for num_workers, num_batches in ((WORKERS, 10), (0, 7)):
            loader = _loader(rb.as_dataset(num_batches=num_batches), num_workers, batch_size=None,
                             generator=torch.Generator().manual_seed(1))
            batches = [batch["obs"].clone() for batch in loader]
            results[f"batches_{num_workers}"] = torch.stack(batches) if batches else torch.zeros(0, BATCH)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
