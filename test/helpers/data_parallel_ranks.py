"""The rank processes of ray_buffer/test_data_parallel_client.py (gloo, localhost): data-parallel learners that
draw their shares of global batches from one Ray-hosted buffer.

Child-process targets live here, not in the test module, so that a child imports only this module. Each rank
joins the test's Ray cluster through the clients it receives (they carry the cluster's address and the actor's
name and namespace) and saves what it saw in ``out_dir/rank{rank}.pt``.
"""

from __future__ import annotations

import os

ITEMS = 24  # items of each buffer
GLOBAL_BATCH = 8  # the global batch size of the epoch buffer
STEPS = ITEMS // GLOBAL_BATCH  # one epoch of the sampler without replacement
HOT_PRIORITY = 1e8  # the priority each rank gives its own item: the other items' mass is negligible next to it
PRIORITY_DRAWS = 64  # items a rank draws from the prioritized buffer after the updates (global batch)


def rank_main(rank: int, world_size: int, init_file: str, epoch_clients: list, priority_client, out_dir: str,
              ray_auth_mode: str | None = None) -> None:
    """``epoch_clients[rank]``: a :class:`~torchrl.data.DataParallelReplayBufferClient` built and pickled by the test
    process; ``priority_client``: a plain Ray client, which this rank wraps with ``.data_parallel(...)``;
    ``ray_auth_mode``: the cluster's ``RAY_AUTH_MODE`` (a forkserver child inherits the forkserver's environment,
    which may predate ``ray.init``)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before this process joins the cluster: nothing leaves the machine
    if ray_auth_mode is not None:
        os.environ["RAY_AUTH_MODE"] = ray_auth_mode
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        results = {}
        epoch = epoch_clients[rank]
        results["identity"] = (epoch.rank, epoch.world_size, epoch.batch_size, len(epoch))
        draws = []
        for _ in range(STEPS):
            draws.append(epoch.sample())  # batch_size // world_size items
            dist.barrier()  # the ranks step together, as data-parallel learners do
        mine = torch.stack(draws)
        gathered = [torch.zeros_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine)  # every rank sees the whole epoch, as a rank-0 logger would
        results["epoch"] = mine
        results["gathered"] = torch.stack(gathered)

        priority = priority_client.data_parallel(rank=rank, world_size=world_size)
        priority.update_priority(torch.tensor([rank]), torch.tensor([HOT_PRIORITY]))
        dist.barrier()  # every rank's update reached the owner before anyone draws
        batch, info = priority.sample(PRIORITY_DRAWS, return_info=True)
        results["priority_draw"] = batch
        results["priority_index"] = info["index"]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
