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

The grid (``--grid``) answers "do DataLoader workers pay off, and with how many threads each?": batches/s of
``DataLoader(rb.as_dataset())`` for ``num_workers`` in {0, 1, 2, 4} x torch threads per worker in {1, 2} (set by
``worker_init_fn=functools.partial(_set_threads, n)``; for ``num_workers=0``, the main process's thread count)
x start method {fork, forkserver} (``--methods`` adds spawn), for four transforms on the sample path over the frames above:
``resize`` (the torch-op Resize, which torch parallelises across intra-op threads), ``io`` (a 4 ms sleep per
batch standing in for disk reads: releases the GIL), ``python`` (about 4 ms of pure-Python decoding per batch:
holds the GIL) and ``none`` (sampling alone). How to read it: ``vs 0`` is each cell's rate over the rate of
``num_workers=0`` with the main process's default thread count (what a user gets without a DataLoader);
above 1.00x the workers pay off. ``refused`` marks a forked worker with more than one thread: torch's OpenMP
runtime is not fork-safe there (it would hang), and the datasets refuse it with an error naming the fix. A
worker's start-up is not timed (the loader is warmed up first), so spawn and forkserver differ from fork in
steady state only by what they share.

The stateful-sampler tables (``--only-stateful``, issue 13) read the frames above through a
``TensorDictPrioritizedReplayBuffer`` (alpha 0.7, beta 0.5) and through a ``SamplerWithoutReplacement`` buffer,
whose sampler state ``rb.as_dataset()`` moves to shared memory. The training loop calls
``rb.update_priority(batch["index"], td_error)`` in the main process after every prioritized batch. R1 is the
same loop (sample + update) in one process with one thread and a private sampler; the table prints the rate of
1 and 2 fork workers and its ratio to R1 (median of per-round ratios, the sides interleaved in every round);
targets: 2 workers >= 1.6 x R1, 1 worker >= 0.9 x R1. A second table prices the shared state itself in one
process: sampler-only time per step (prioritized: sample 256 of 100k + update_priority; without replacement:
sample 256) for a private and a shared sampler, interleaved, and their ratio.

Run: ``python benchmarks/dataloader_workers.py [--seconds 3] [--size 10000] [--rounds 3]``
(``--only-consistent-reads`` / ``--only-transport`` / ``--only-stateful`` / ``--grid`` print that table alone; ``--grid`` takes
``--workers``, ``--threads``, ``--methods`` and ``--workloads`` to narrow it)
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import os
import statistics
import sys
import time

import torch
from _timing import median_ratio, rate, timed
from tensordict import TensorDict
from torch.utils.data import DataLoader, Dataset

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    SamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)
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
        return rate(rb.sample, seconds)
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
    return rate(it.__next__, seconds)


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
    batches = (batch for _ in itertools.count() for batch in loader)  # epoch after epoch
    return rate(batches.__next__, seconds)


def sample_time_us(rb, seconds: float) -> float:
    rb.sample()
    return 1e6 / rate(rb.sample, seconds, chunk=10)


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
            vs = [median_ratio(cell, ms[(case, base)]) for base in ("torch", "consolidated")]
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
        ratio = median_ratio(on, off)
        print(f"{case:>30} {statistics.median(on):>10.1f} {statistics.median(off):>10.1f} {ratio:>6.3f}x")


# -- workers x threads grid ------------------------------------------------------------------------------------
class SleepIO(torch.nn.Module):
    """Stands in for reading a batch from disk: releases the GIL for ``ms`` milliseconds."""

    def __init__(self, ms: float):
        super().__init__()
        self.ms = ms

    def forward(self, td):
        time.sleep(self.ms / 1e3)
        return td


class PythonWork(torch.nn.Module):
    """Stands in for decoding in pure Python: a fixed amount of bytecode that holds the GIL."""

    def __init__(self, loops: int):
        super().__init__()
        self.loops = loops

    def forward(self, td):
        total = 0
        for i in range(self.loops):
            total += i & 7
        td.set_non_tensor("decoded", total)
        return td


def _set_threads(threads: int, worker_id: int) -> None:
    torch.set_num_threads(threads)


def rate_grid_cell(rb, workers: int, threads: int, method: str | None, seconds: float) -> float | None:
    """Batches/s of ``DataLoader(rb.as_dataset())``; ``None`` when the combination is refused."""
    previous = torch.get_num_threads()
    kwargs = {"num_workers": workers}
    if workers:
        kwargs.update(multiprocessing_context=method, timeout=120, prefetch_factor=4,
                      worker_init_fn=functools.partial(_set_threads, threads))
    else:
        torch.set_num_threads(threads)
    try:
        loader = DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate, **kwargs)
        it = iter(loader)
        refused = False
        try:
            for _ in range(max(2, 2 * workers)):
                next(it)
        except RuntimeError as err:
            if "not fork-safe" not in str(err):
                raise
            refused = True
        if refused:  # shut the refused loader's workers down here, not in a later forked child
            del it, loader
            gc.collect()
            return None
        return rate(it.__next__, seconds)
    finally:
        torch.set_num_threads(previous)


def _calibrate_python_loops(ms: float) -> int:
    work, loops = PythonWork(100_000), 100_000
    td = TensorDict(batch_size=[])
    return max(1000, int(loops * ms / 1e3 / timed(lambda: work(td))))


def grid_table(frames_rb, seconds: float, rounds: int, workers: list[int], threads: list[int],
               methods: list[str], workloads: list[str]) -> None:
    """One table: batches/s per workload x num_workers x threads per worker x start method, with the ratio
    to ``num_workers=0`` at the main process's default thread count."""
    default_threads = torch.get_num_threads()
    transforms = {"resize": frames_rb.transform, "io": SleepIO(4.0),
                  "python": PythonWork(_calibrate_python_loops(4.0)), "none": None}
    cells: dict[tuple, list[float | None]] = {}
    for _ in range(rounds):
        for workload in workloads:
            rb = TensorDictReplayBuffer(storage=frames_rb.storage, batch_size=frames_rb.batch_size,
                                        transform=transforms[workload])
            for w in [0] + [w for w in workers if w]:
                for t in threads:
                    for method in (methods if w else [None]):
                        rate = rate_grid_cell(rb, w, t, method, seconds)
                        cells.setdefault((workload, w, t, method), []).append(rate)
                        print(f"  {workload} workers={w} threads={t} {method or 'main'}: "
                              f"{'refused' if rate is None else f'{rate:.1f} batches/s'}", file=sys.stderr)
    print(f"\nworkers x threads grid (batches/s, medians of {rounds} round(s); 'vs 0' = ratio to num_workers=0 "
          f"with the default {default_threads} thread(s), median of per-round ratios; 'refused' = a forked "
          f"worker with >1 thread, which would hang)")
    print(f"{'workload':>9} {'workers':>8} {'threads':>8} " + " ".join(f"{m or 'main':>20}" for m in methods))
    for workload in workloads:
        base = cells[(workload, 0, default_threads, None)] if default_threads in threads else None
        for w in [0] + [w for w in workers if w]:
            for t in threads:
                row = []
                for method in (methods if w else [None]):
                    got = cells[(workload, w, t, method)]
                    if any(r is None for r in got):
                        row.append(f"{'refused':>20}")
                        continue
                    ratio = f"{median_ratio(got, base):.2f}x" if base else ""
                    row.append(f"{statistics.median(got):>11.1f} {ratio:>8}")
                print(f"{workload:>9} {w:>8} {t:>8} " + " ".join(row))


# -- stateful samplers in workers (issue 13) -------------------------------------------------------------------
STATEFUL_KINDS = ("prioritized", "without replacement")


def _stateful_buffer(storage, kind: str, batch_size: int = 32):
    """A buffer over the frames storage with a prioritized or without-replacement sampler and the resize."""
    transform = Resize(128, 128, in_keys=["pixels"])
    if kind == "prioritized":
        return TensorDictPrioritizedReplayBuffer(storage=storage, alpha=0.7, beta=0.5, batch_size=batch_size,
                                                 transform=transform)
    return TensorDictReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=batch_size,
                                  transform=transform)


def _learner_step(rb, batch, td_error: torch.Tensor) -> None:
    """What the training loop does with a batch besides training: the priority update, for prioritized buffers."""
    if isinstance(rb, TensorDictPrioritizedReplayBuffer):
        rb.update_priority(batch["index"], td_error)


def rate_stateful_in_process(rb, seconds: float) -> float:
    """R1: batches/s of sample + priority update in one process with one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    td_error = torch.rand(rb.batch_size)
    try:
        _learner_step(rb, rb.sample(), td_error)
        return rate(lambda: _learner_step(rb, rb.sample(), td_error), seconds)
    finally:
        torch.set_num_threads(previous)


def rate_stateful_loader(rb, workers: int, seconds: float) -> float:
    """Batches/s of a DataLoader over ``rb.as_dataset()`` (fork workers), updating priorities from the main
    process after every batch. The epochs without replacement run on (``num_batches`` is large)."""
    loader = DataLoader(rb.as_dataset(num_batches=1 << 40), batch_size=None, collate_fn=tensordict_collate,
                        num_workers=workers, multiprocessing_context="fork", timeout=120, prefetch_factor=4)
    td_error = torch.rand(rb.batch_size)
    it = iter(loader)
    for _ in range(max(2, 2 * workers)):  # warm up: workers started and queues full
        _learner_step(rb, next(it), td_error)
    batches_per_second = rate(lambda it=it: _learner_step(rb, next(it), td_error), seconds)
    del it
    return batches_per_second


STATEFUL_TARGETS = {1: 0.9, 2: 1.6}


def stateful_table(frames_storage, seconds: float, rounds: int, workers: tuple[int, ...] = (1, 2)) -> None:
    cells: dict[tuple[str, str], list[float]] = {}
    for kind in STATEFUL_KINDS:
        private = _stateful_buffer(frames_storage, kind)  # R1: today's private sampler
        shared = _stateful_buffer(frames_storage, kind)  # read by workers: as_dataset() shares its sampler
        for _ in range(rounds):  # interleaved: every round measures R1 and every worker count
            cells.setdefault((kind, "R1"), []).append(rate_stateful_in_process(private, seconds))
            for w in workers:
                cells.setdefault((kind, f"{w}"), []).append(rate_stateful_loader(shared, w, seconds))
    print("\nstateful samplers in workers (batch 32 uint8 3x96x96 -> 128x128; update_priority from the main "
          "process after every prioritized batch; medians, ratio = median of per-round ratios)")
    print(f"{'sampler':>20} {'workers':>8} {'batches/s':>10} {'vs R1':>7} {'target':>7}")
    for kind in STATEFUL_KINDS:
        r1 = cells[(kind, "R1")]
        print(f"{kind:>20} {'R1':>8} {statistics.median(r1):>10.1f} {'':>7} {'':>7}")
        for w in workers:
            cell = cells[(kind, f"{w}")]
            ratio = median_ratio(cell, r1)
            target = STATEFUL_TARGETS.get(w)
            shown = "" if target is None else f"{target:.1f}x"
            print(f"{kind:>20} {w:>8} {statistics.median(cell):>10.1f} {ratio:>6.2f}x {shown:>7}")


def _sampler_step_us(sampler, storage, batch: int, td_error, seconds: float) -> float:
    def step():
        index, _ = sampler.sample(storage, batch)
        if td_error is not None:
            sampler.update_priority(index, td_error)

    step()
    return 1e6 / rate(step, seconds, chunk=20)


def shared_sampler_cost_table(seconds: float, rounds: int, entries: int = 100_000, batch: int = 256) -> None:
    """What sharing costs in one process: the same sampler calls on a private and on a shared sampler."""
    storage = LazyTensorStorage(entries)
    storage.set(torch.arange(entries), core_data(entries))
    td_error = torch.rand(batch)
    cases = {}
    for kind in STATEFUL_KINDS:
        pair = []
        for share in (False, True):
            if kind == "prioritized":
                sampler = PrioritizedSampler(entries, alpha=0.7, beta=0.5)
                sampler.extend(torch.arange(entries))
                sampler.update_priority(torch.arange(entries), torch.rand(entries))
            else:
                sampler = SamplerWithoutReplacement()
            pair.append(sampler.share_memory_() if share else sampler)
        cases[kind] = pair
    cells: dict[tuple[str, bool], list[float]] = {}
    for _ in range(rounds):
        for kind, pair in cases.items():
            for shared, sampler in zip((False, True), pair):
                error = td_error if kind == "prioritized" else None
                cells.setdefault((kind, shared), []).append(_sampler_step_us(sampler, storage, batch, error, seconds))
    print(f"\nshared sampler state in one process ({entries} entries, batch {batch}; sampler calls only; medians)")
    print(f"{'sampler':>20} {'private us':>11} {'shared us':>10} {'ratio':>7}")
    for kind in STATEFUL_KINDS:
        private, shared = cells[(kind, False)], cells[(kind, True)]
        ratio = median_ratio(shared, private)
        print(f"{kind:>20} {statistics.median(private):>11.1f} {statistics.median(shared):>10.1f} {ratio:>6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement time per cell")
    parser.add_argument("--size", type=int, default=10_000, help="frames in the buffer")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--only-consistent-reads", action="store_true", help="print the last table alone")
    parser.add_argument("--only-transport", action="store_true", help="print the transport table alone")
    parser.add_argument("--only-stateful", action="store_true",
                        help="print the stateful-sampler tables alone (prioritized / without replacement in workers)")
    parser.add_argument("--grid", action="store_true",
                        help="print the workers x threads x start method grid alone")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="grid: torch threads per worker")
    parser.add_argument("--methods", nargs="+", default=["fork", "forkserver"],
                        help="grid: worker start methods (spawn runs like forkserver once started, and starts "
                             "more slowly: add it with --methods fork forkserver spawn)")
    parser.add_argument("--workloads", nargs="+", default=["resize", "io", "python", "none"],
                        choices=["resize", "io", "python", "none"], help="grid: transforms on the sample path")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    rb = make_buffer(args.size)
    if args.only_consistent_reads:
        consistent_reads_table(rb, args.seconds, args.rounds)
        return
    if args.grid:
        grid_table(rb, args.seconds, args.rounds, args.workers, args.threads, args.methods, args.workloads)
        return
    if args.only_transport:
        transport_table(rb, args.seconds, args.rounds)
        return
    if args.only_stateful:
        stateful_table(rb.storage, args.seconds, args.rounds)
        shared_sampler_cost_table(args.seconds, args.rounds)
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
    ratio = median_ratio([f for f, _ in per_round], [s for _, s in per_round])
    print(f"\nStorageDataset batch 256: {fast:.1f} batches/s; per-item __getitem__: {slow:.1f} batches/s; "
          f"speed-up {ratio:.1f}x (median of per-round ratios)")
    transport_table(rb, args.seconds, args.rounds)
    consistent_reads_table(rb, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
