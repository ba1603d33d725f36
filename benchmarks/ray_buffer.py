"""Batches per second of a :class:`~torchrl.data.RayReplayBuffer` against the same buffer in-process.

Table 1, ``sample()``: 100k transitions of the core benchmark data (``obs: f32[84], action: i64, reward: f32,
("next", "obs"): f32[84], done: bool``), batch 256, in a ``TensorDictReplayBuffer`` over a
``LazyTensorStorage``: (a) the buffer in this process; (b) a ``RayReplayBuffer`` sampled from the driver; (c)
the same actor sampled by 2 clients in 2 Ray tasks at once (total batches/s of both). Each ratio is to (a).

Table 2, ``as_dataset()`` with the image workload of ``benchmarks/dataloader_workers.py``: 32 uint8
``3x96x96`` frames per batch, resized to ``128x128`` by a :class:`~torchrl.envs.transforms.Resize` transform.
R1 is the in-process rate of the local buffer's sample+resize with ``torch.set_num_threads(1)`` (what one
worker can produce); then ``DataLoader(ray_rb.as_dataset(), num_workers=N, multiprocessing_context="spawn")``
for N = 1 and 2: each worker draws raw frames from the actor and resizes them itself, with the pipelining
options ``p/k`` = ``as_dataset(prefetch=p, batches_per_call=k)`` of ``--configs`` (``0/1``: one batch per
call, nothing in flight; ``1/8``: 8 batches per call, the next call sent before the last batch is used).
Target: 2 workers >= 1.5 x R1.

Every round measures every option (interleaved); the tables print medians and the medians of per-round ratios.
The loaders' workers are started once and kept for all rounds (their start is not timed); before each timed
window the batches already queued are drained.

Run: ``python benchmarks/ray_buffer.py [--seconds 3] [--rounds 3] [--size 10000] [--transitions 100000]``
(``--only-sample`` / ``--only-dataset`` print one table; ``--configs 0/1 1/8`` picks the rows of table 2).
Usage statistics are off (``RAY_USAGE_STATS_ENABLED=0``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before ray is imported

import ray  # noqa: E402
import torch  # noqa: E402
from _timing import median_ratio, rate  # noqa: E402  (same folder)
from dataloader_workers import core_data, make_buffer, rate_in_process  # noqa: E402  (same folder)
from tensordict import TensorDict  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyTensorStorage,
    RayReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.envs.transforms import Resize  # noqa: E402


def rate_sample(rb, seconds: float) -> float:
    rb.sample()
    return rate(rb.sample, seconds)


@ray.remote(num_cpus=0)
def _client_rate(client, seconds: float) -> float:
    return rate_sample(client, seconds)


def rate_clients(clients, seconds: float) -> float:
    """Total batches/s of the clients sampling at the same time, each in its own Ray task."""
    return sum(ray.get([_client_rate.remote(c, seconds) for c in clients], timeout=seconds * 10 + 120))


def sample_table(n: int, seconds: float, rounds: int) -> None:
    data = core_data(n)
    local = TensorDictReplayBuffer(storage=LazyTensorStorage(n), batch_size=256)
    local.extend(data)
    remote = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, n), batch_size=256,
                             replay_buffer_cls=TensorDictReplayBuffer)
    for start in range(0, n, 10_000):
        remote.extend(data[start:start + 10_000])
    clients = remote.clients(2)
    rate_clients(clients, 0.2)  # warm up: the tasks' worker processes import torchrl once
    cells: dict[str, list[float]] = {}
    for _ in range(rounds):
        cells.setdefault("(a) in-process", []).append(rate_sample(local, seconds))
        cells.setdefault("(b) Ray, driver", []).append(rate_sample(remote, seconds))
        cells.setdefault("(c) Ray, 2 clients", []).append(rate_clients(clients, seconds))
    remote.close()
    print(f"\nsample(), batch 256 of {n} core transitions (batches/s, medians of {rounds} rounds; ratio to (a): "
          f"median of per-round ratios)")
    print(f"{'option':>22} {'batches/s':>10} {'vs (a)':>7}")
    for name, cell in cells.items():
        ratio = median_ratio(cell, cells["(a) in-process"])
        print(f"{name:>22} {statistics.median(cell):>10.1f} {ratio:>6.2f}x")


def _ray_frames_buffer(local: TensorDictReplayBuffer, size: int) -> RayReplayBuffer:
    rb = RayReplayBuffer(storage=functools.partial(LazyMemmapStorage, size), batch_size=local.batch_size,
                         transform=functools.partial(Resize, 128, 128, in_keys=["pixels"]),
                         replay_buffer_cls=TensorDictReplayBuffer)
    frames = local.storage.get(torch.arange(len(local)))
    for start in range(0, size, 1000):
        chunk = frames[start:start + 1000]
        rb.extend(TensorDict(pixels=chunk["pixels"], action=chunk["action"], batch_size=chunk.batch_size))
    return rb


def _loader(rb: RayReplayBuffer, workers: int, prefetch: int, batches_per_call: int):
    dataset = rb.as_dataset(prefetch=prefetch, batches_per_call=batches_per_call)
    loader = DataLoader(dataset, batch_size=None, collate_fn=tensordict_collate, num_workers=workers,
                        multiprocessing_context="spawn", prefetch_factor=4, timeout=120)
    it = iter(loader)
    for _ in range(2 * workers):  # workers started, connected to the cluster and producing
        next(it)
    return it


def rate_iterator(it, workers: int, seconds: float) -> float:
    for _ in range(4 * workers):  # drain what was queued while another option was measured
        next(it)
    return rate(it.__next__, seconds)


def _config_name(workers: int, prefetch: int, batches_per_call: int) -> str:
    return f"Ray, {workers} worker(s), {prefetch}/{batches_per_call}"


def dataset_table(size: int, seconds: float, rounds: int, workers: list[int],
                  configs: list[tuple[int, int]]) -> None:
    local = make_buffer(size)
    remote = _ray_frames_buffer(local, size)
    options = [(w, p, k) for w in workers for p, k in configs]
    iterators = {option: _loader(remote, *option) for option in options}
    cells: dict[str, list[float]] = {}
    for _ in range(rounds):
        cells.setdefault("R1", []).append(rate_in_process(local, seconds, threads=1))
        for option in options:
            cells.setdefault(_config_name(*option), []).append(rate_iterator(iterators[option], option[0], seconds))
    del iterators
    remote.close()
    cores = len(os.sched_getaffinity(0))
    print(f"\nas_dataset() over the Ray buffer, spawn workers, batch 32 uint8 3x96x96 -> 128x128 resized in the "
          f"workers (cores={cores}; batches/s, medians of {rounds} rounds; ratio to R1: median of per-round "
          f"ratios; p/k: as_dataset(prefetch=p, batches_per_call=k); target: 2 workers >= 1.5 x R1)")
    print(f"{'option':>30} {'batches/s':>10} {'vs R1':>7}")
    print(f"{'R1 (local, 1 thread)':>30} {statistics.median(cells['R1']):>10.1f} {'1.00x':>7}")
    for option in options:
        cell = cells[_config_name(*option)]
        ratio = median_ratio(cell, cells["R1"])
        print(f"{_config_name(*option):>30} {statistics.median(cell):>10.1f} {ratio:>6.2f}x")


def _config(text: str) -> tuple[int, int]:
    prefetch, _, per_call = text.partition("/")
    return int(prefetch), int(per_call or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement time per cell")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--size", type=int, default=10_000, help="frames in the image buffers")
    parser.add_argument("--transitions", type=int, default=100_000, help="core transitions in table 1")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="table 2: DataLoader workers")
    parser.add_argument("--configs", type=_config, nargs="+", default=[(0, 1), (1, 4), (1, 8)],
                        help="table 2: as_dataset(prefetch=p, batches_per_call=k) options, written p/k")
    parser.add_argument("--only-sample", action="store_true", help="print table 1 alone")
    parser.add_argument("--only-dataset", action="store_true", help="print table 2 alone")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    ray.init(num_cpus=max(cores, 2), include_dashboard=False, log_to_driver=False)
    try:
        if not args.only_dataset:
            sample_table(args.transitions, args.seconds, args.rounds)
        if not args.only_sample:
            dataset_table(args.size, args.seconds, args.rounds, args.workers, args.configs)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
