"""Data-parallel ranks (torch.distributed, gloo on localhost) reading one memory-mapped storage directory.

Two ranks are started with ``torch.multiprocessing`` (forkserver); each re-opens the same ``LazyMemmapStorage`` files and reads
them through DataLoaders with 2 workers:

- ``StorageDataset`` + ``DistributedSampler``: the ranks' shards of an epoch are disjoint and cover the storage
  exactly, and ``set_epoch`` gives each epoch its own order;
- ``ReplayBufferDataset``: ``num_batches`` is the total over ranks x workers, split exactly, and no two readers
  draw the same stream although every rank is seeded alike.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from helpers.factories import make_buffer
from helpers.ranks import BATCH, ITEMS, rank_main, write_shared_buffer

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed gloo"),
]

WORLD_SIZE = 2


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    path = str(root / "buffer")
    write_shared_buffer(path)
    # forkserver: new processes that share nothing with this one (the forkserver has torch preloaded, conftest.py)
    context = torch.multiprocessing.start_processes(
        rank_main,
        args=(WORLD_SIZE, str(root / "init"), path, str(root)),
        nprocs=WORLD_SIZE,
        join=False,
        start_method="forkserver",
    )
    try:
        for _ in range(60):  # at most 10 minutes; a dead rank raises at once
            if context.join(timeout=10):
                break
        else:
            raise TimeoutError("the gloo ranks did not finish within 10 minutes")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [torch.load(root / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]


@pytest.mark.timeout(700)
def test_distributed_sampler_shards_cover_the_storage_exactly(rank_results):
    for epoch in range(2):
        shards = [r[f"shard_{epoch}"] for r in rank_results]
        assert [len(s) for s in shards] == [ITEMS // WORLD_SIZE] * WORLD_SIZE
        assert torch.equal(torch.cat(shards).sort().values, torch.arange(ITEMS))  # disjoint, complete
    assert not torch.equal(rank_results[0]["shard_0"], rank_results[0]["shard_1"])  # set_epoch reshuffles


@pytest.mark.timeout(700)
@pytest.mark.parametrize("num_workers,num_batches", [(2, 10), (0, 7)])
def test_replay_buffer_dataset_splits_batches_over_ranks_and_workers(rank_results, num_workers, num_batches):
    counts = [len(r[f"batches_{num_workers}"]) for r in rank_results]
    assert counts == [len(range(rank, num_batches, WORLD_SIZE)) for rank in range(WORLD_SIZE)]
    assert sum(counts) == num_batches
    batches = torch.cat([r[f"batches_{num_workers}"] for r in rank_results])
    assert batches.shape == (num_batches, BATCH)
    assert ((batches >= 0) & (batches < ITEMS)).all()
    # distinct streams: ranks seeded alike still draw different batches (equal ones would be a repeated stream)
    assert len({tuple(b.tolist()) for b in batches}) == num_batches
    first = [r[f"batches_{num_workers}"][0] for r in rank_results]
    assert not torch.equal(first[0], first[1])


# -- in one process: the split and the arguments ------------------------------------------------------------------
def _one_rank_buffer():
    from tensordict import TensorDict

    return make_buffer(capacity=ITEMS, batch_size=BATCH, data=TensorDict(obs=torch.arange(ITEMS), batch_size=[ITEMS]))


@pytest.mark.parametrize("num_batches", [1, 5, 8])
def test_rank_keywords_split_num_batches_exactly(num_batches):
    rb = _one_rank_buffer()
    counts = [len(list(rb.as_dataset(num_batches=num_batches, rank=r, world_size=3))) for r in range(3)]
    assert counts == [len(range(r, num_batches, 3)) for r in range(3)] and sum(counts) == num_batches


def test_ranks_seeded_alike_draw_distinct_streams_without_workers():
    streams = []
    for rank in range(2):
        torch.manual_seed(0)
        rb = _one_rank_buffer()
        streams.append(torch.stack([b["obs"] for b in rb.as_dataset(num_batches=8, rank=rank, world_size=2)]))
    assert not torch.equal(streams[0], streams[1])
    torch.manual_seed(0)
    single = [torch.stack([b["obs"] for b in _one_rank_buffer().as_dataset(num_batches=4)]) for _ in range(1)]
    torch.manual_seed(0)
    again = torch.stack([b["obs"] for b in _one_rank_buffer().as_dataset(num_batches=4, rank=0, world_size=1)])
    assert torch.equal(single[0], again)  # world_size=1 keeps the one-process stream


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"rank": 0}, ValueError, "Pass both `rank` and `world_size`"),
        ({"rank": 2, "world_size": 2}, ValueError, "`rank` must be smaller than `world_size`"),
        ({"rank": -1, "world_size": 2}, ValueError, "`rank`"),
        ({"rank": 0, "world_size": 0}, ValueError, "`world_size`"),
        ({"rank": "0", "world_size": 2}, TypeError, "`rank`"),
    ],
)
def test_bad_rank_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        _one_rank_buffer().as_dataset(num_batches=4, **kwargs)
