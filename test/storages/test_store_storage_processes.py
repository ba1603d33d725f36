"""StoreStorage written by several collector processes and read by this one (the learner), over a real
``redis-server``: no row is overwritten by another writer, each writer's ``extend`` returns where its rows went,
strings of concurrent writers all survive."""

from __future__ import annotations

import multiprocessing as mp
import uuid

import pytest
import torch
from helpers.redis_server import redis_server, write_batches  # noqa: F401 (a fixture)

from torchrl.data import RandomSampler, ReplayBuffer, StoreStorage

WRITERS, BATCHES, BATCH = 3, 4, 25


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])  # ~40 s on 2 cores
def test_collector_processes_write_and_the_learner_samples_every_row(redis_server, start_method):  # noqa: F811
    td_id = f"collectors-{uuid.uuid4()}"
    learner_storage = StoreStorage(1000, host=redis_server.host, port=redis_server.port, td_id=td_id)
    ctx = mp.get_context(start_method)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=write_batches, args=(redis_server.port, td_id, w, BATCHES, BATCH, queue))
        for w in range(WRITERS)
    ]
    try:
        for p in procs:
            p.start()
        results = [queue.get(timeout=150) for _ in procs]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        total = WRITERS * BATCHES * BATCH
        assert len(learner_storage) == total
        stored = learner_storage[torch.arange(total)]
        assert sorted(stored["value"].tolist()) == sorted(v for _, _, values, _ in results for v in values)
        for _, indices, values, _ in results:  # each writer's indices name the rows that hold its items
            assert sorted(indices) == sorted(set(indices))
            assert learner_storage[torch.tensor(indices)]["value"].tolist() == values
        assert stored["name"] == [f"w{v}" for v in stored["value"].tolist()]
        learner = ReplayBuffer(storage=learner_storage, sampler=RandomSampler(), batch_size=64)
        batch = learner.sample()
        assert torch.equal(batch["obs"][:, 0], batch["value"].float())
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        learner_storage.close()
