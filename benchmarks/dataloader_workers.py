"""Batches per second of ``DataLoader(rb.as_dataset())`` for 0, 1, 2 and 4 workers.

The sample path does real work per batch: 32 uint8 ``3x96x96`` frames are gathered from a
``LazyMemmapStorage`` and resized to ``128x128`` (a :class:`~torchrl.envs.transforms.Resize` transform that
keeps uint8, so a quarter of the float bytes cross the process boundary). R1 is the in-process rate of the
same sample+resize loop with ``torch.set_num_threads(1)``, i.e. what one worker can produce; ``min(N, cores) x
R1`` is the ceiling for N workers. Also compares ``StorageDataset`` (one gather per batch of 256) with the
same storage read through per-item ``__getitem__``, on 100k transitions of the core benchmark data
(``obs: f32[84], action: i64, reward: f32, ("next", "obs"): f32[84], done: bool``).

The transport table compares how worker processes send batches to the main process
(``rb.as_dataset(transport=...)``): (a) ``"torch"``, torch's default, a new shared-memory segment per tensor;
(b) ``"consolidated"``, one new segment per batch (``TensorDict.consolidate(share_memory=True)``); (c)
``"ring"``, a per-worker ring of reusable slots. It prints ms per batch as the training loop sees it (2 workers),
for the frames above and for the core data (batch 256, no transform), and each option's ratio to (a), the median
of per-round ratios with the options interleaved in every round.

The last table prices ``consistent_reads`` (the per-row version check that keeps a batch from mixing two
writes, on by default for shared storages): ``rb.sample()`` time per batch with the check on and off, in
alternating rounds, for the core data (batch 256, shared ``LazyTensorStorage``) and the frames above through 2
workers.

Run: ``python benchmarks/dataloader_workers.py [--seconds 3] [--size 10000] [--rounds 3]``
(``--only-consistent-reads`` / ``--only-transport`` print that table alone)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader, Dataset

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer, tensordict_collate
from torchrl.envs.transforms import Resize


def make_buffer(size: int, batch_size: int = 32) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(size), batch_size=batch_size,
                                transform=Resize(128, 128, in_keys=["pixels"]))
    chunk = 1000
    for start in range(0, size, chunk):
        n = min(chunk, size - start)
        rb.extend(TensorDict(pixels=torch.randint(0, 256, (n, 3, 96, 96), dtype=torch.uint8),
                             action=torch.randint(0, 4, (n,)), batch_size=[n]))
    return rb


def rate_in_process(rb, seconds: float, threads: int = 1) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rb.sample()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            rb.sample()
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)


def rate_loader(rb, workers: int, seconds: float, transport: str = "ring") -> float:
    kwargs = {"num_workers": workers}
    if workers:
        kwargs.update(multiprocessing_context="fork", timeout=120, prefetch_factor=4, persistent_workers=False)
    loader = DataLoader(rb.as_dataset(transport=transport), batch_size=None, collate_fn=tensordict_collate, **kwargs)
    it = iter(loader)
    for _ in range(max(2, 2 * workers)):  # warm up: workers started and queues full
        next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(it)
        n += 1
    elapsed = time.perf_counter() - start
    del it
    return n / elapsed


class _PerItem(Dataset):
    """The same storage read one item at a time (what DataLoader does without ``__getitems__``)."""

    def __init__(self, storage):
        self.storage = storage

    def __len__(self):
        return len(self.storage)

    def __getitem__(self, i):
        return self.storage.get(i)


def rate_storage_dataset(dataset, batch_size: int, seconds: float) -> float:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=tensordict_collate, drop_last=True)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in loader:
            n += 1
            if time.perf_counter() - start >= seconds:
                break
    return n / (time.perf_counter() - start)


def sample_time_us(rb, seconds: float) -> float:
    rb.sample()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            rb.sample()
        n += 10
    return (time.perf_counter() - start) / n * 1e6


def core_data(n: int) -> TensorDict:
    return TensorDict(
        {"obs": torch.randn(n, 84), "action": torch.randint(0, 4, (n,)), "reward": torch.randn(n),
         ("next", "obs"): torch.randn(n, 84), "done": torch.zeros(n, dtype=torch.bool)}, batch_size=[n])


TRANSPORTS = (("a", "torch"), ("b", "consolidated"), ("c", "ring"))


def transport_table(frames_rb, seconds: float, rounds: int, workers: int = 2) -> None:
    core = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    core.extend(core_data(100_000))
    cases = {"frames 32x3x128x128 u8": frames_rb, "core batch 256": core}
    ms: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for case, rb in cases.items():
            for _, transport in TRANSPORTS:  # interleaved: every round measures every option
                ms.setdefault((case, transport), []).append(1e3 / rate_loader(rb, workers, seconds, transport))
    print(f"\nworker -> main transport, {workers} workers (ms per batch, medians; ratios of ms per batch, medians "
          f"of per-round ratios)")
    print(f"{'case':>24} {'option':>18} {'ms/batch':>9} {'batches/s':>10} {'vs (a)':>7} {'vs (b)':>7}")
    for case in cases:
        for label, transport in TRANSPORTS:
            cell = ms[(case, transport)]
            vs = [statistics.median(x / b for x, b in zip(cell, ms[(case, base)])) for base in ("torch", "consolidated")]
            median = statistics.median(cell)
            print(f"{case:>24} {f'({label}) {transport}':>18} {median:>9.2f} {1e3 / median:>10.1f} "
                  f"{vs[0]:>6.2f}x {vs[1]:>6.2f}x")


def consistent_reads_table(frames_rb, seconds: float, rounds: int) -> None:
    core = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256, shared=True)
    core.extend(core_data(100_000))
    cells: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for flag in (True, False):
            core.storage.consistent_reads = flag
            frames_rb.storage.consistent_reads = flag
            cells.setdefault(("core in-process, us/batch", flag), []).append(sample_time_us(core, seconds))
            cells.setdefault(("frames 2 workers, batches/s", flag), []).append(rate_loader(frames_rb, 2, seconds))
    print("\nconsistent_reads (medians; ratio = on / off, per round)")
    print(f"{'case':>30} {'on':>10} {'off':>10} {'ratio':>7}")
    for case in ("core in-process, us/batch", "frames 2 workers, batches/s"):
        on, off = cells[(case, True)], cells[(case, False)]
        ratio = statistics.median(a / b for a, b in zip(on, off))
        print(f"{case:>30} {statistics.median(on):>10.1f} {statistics.median(off):>10.1f} {ratio:>6.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement time per cell")
    parser.add_argument("--size", type=int, default=10_000, help="frames in the buffer")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--only-consistent-reads", action="store_true", help="print the last table alone")
    parser.add_argument("--only-transport", action="store_true", help="print the transport table alone")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    rb = make_buffer(args.size)
    if args.only_consistent_reads:
        consistent_reads_table(rb, args.seconds, args.rounds)
        return
    if args.only_transport:
        transport_table(rb, args.seconds, args.rounds)
        return
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):  # interleave the sides of every ratio
        results.setdefault("R1", []).append(rate_in_process(rb, args.seconds, threads=1))
        for w in args.workers:
            results.setdefault(f"loader-{w}", []).append(rate_loader(rb, w, args.seconds))
    r1 = statistics.median(results["R1"])
    print(f"\ncores={cores}  R1 (in-process, 1 thread) = {r1:.1f} batches/s  (batch 32 uint8 3x96x96 -> 128x128)")
    print(f"{'workers':>8} {'batches/s':>10} {'ceiling':>9} {'of ceiling':>11}")
    for w in args.workers:
        rate = statistics.median(results[f"loader-{w}"])
        ceiling = (min(w, cores) if w else 1) * r1
        print(f"{w:>8} {rate:>10.1f} {ceiling:>9.1f} {rate / ceiling:>10.0%}")

    storage = LazyMemmapStorage(100_000)
    n = 100_000
    storage.set(torch.arange(n), core_data(n))
    per_round = []
    for _ in range(args.rounds):
        fast = rate_storage_dataset(storage.as_dataset(), 256, args.seconds)
        slow = rate_storage_dataset(_PerItem(storage), 256, args.seconds)
        per_round.append((fast, slow))
    fast = statistics.median(f for f, _ in per_round)
    slow = statistics.median(s for _, s in per_round)
    ratio = statistics.median(f / s for f, s in per_round)
    print(f"\nStorageDataset batch 256: {fast:.1f} batches/s; per-item __getitem__: {slow:.1f} batches/s; "
          f"speed-up {ratio:.1f}x (median of per-round ratios)")
    transport_table(rb, args.seconds, args.rounds)
    consistent_reads_table(rb, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
