"""What the multiprocessing start method costs a DataLoader user: fork vs forkserver vs spawn.

TorchRL's ``import torchrl`` sets the global start method to ``"spawn"`` unless the user chose one, and so does
ours (docs/source/differences.rst, "Start method", says why). This script measures the price of that choice,
side by side and interleaved (fork, forkserver, spawn in turn, each round), on a 10,000-row LazyMemmapStorage
buffer read through ``DataLoader(rb.as_dataset(), num_workers=N, batch_size=None)``:

- ``first batch``: from ``iter(loader)`` to the first batch (worker start-up: spawn re-imports torch in each
  worker, fork copies the parent);
- ``epoch``: the first batch plus 200 more (start-up amortised over a short run);
- ``Process``: start and join of one ``multiprocessing.Process`` that does nothing.

Run it on an idle machine: ``python benchmarks/start_method.py [--rounds 5] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import LazyMemmapStorage, ReplayBuffer, tensordict_collate

METHODS = ("fork", "forkserver", "spawn")


def _noop() -> None:
    pass


def _buffer(scratch: str) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyMemmapStorage(10_000, scratch_dir=scratch), batch_size=64)
    rb.extend(TensorDict({"obs": torch.randn(10_000, 16), "action": torch.randint(0, 4, (10_000,))}, [10_000]))
    return rb


def _loader_times(rb: ReplayBuffer, method: str, workers: int, batches: int) -> tuple[float, float]:
    loader = DataLoader(
        rb.as_dataset(),
        batch_size=None,
        num_workers=workers,
        collate_fn=tensordict_collate,
        multiprocessing_context=method,
        timeout=120,
    )
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    for _ in range(batches):
        next(it)
    total = time.perf_counter() - start
    del it
    return first, total


def _process_time(method: str) -> float:
    start = time.perf_counter()
    p = mp.get_context(method).Process(target=_noop)
    p.start()
    p.join(60)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    results = {m: {"first": [], "epoch": [], "process": []} for m in METHODS}
    with tempfile.TemporaryDirectory() as scratch:
        rb = _buffer(scratch)
        for _ in range(args.rounds):
            for method in METHODS:  # interleaved: one of each per round
                first, epoch = _loader_times(rb, method, args.workers, args.batches)
                results[method]["first"].append(first)
                results[method]["epoch"].append(epoch)
                results[method]["process"].append(_process_time(method))
    fork = {k: statistics.median(v) for k, v in results["fork"].items()}
    print(f"DataLoader(num_workers={args.workers}) over a 10,000-row LazyMemmapStorage; medians of {args.rounds} rounds")
    print(f"{'method':<11} {'first batch (s)':>16} {'x fork':>7} {f'1+{args.batches} batches (s)':>20} {'x fork':>7}"
          f" {'Process (s)':>12} {'x fork':>7}")
    for method in METHODS:
        med = {k: statistics.median(v) for k, v in results[method].items()}
        print(
            f"{method:<11} {med['first']:>16.3f} {med['first'] / fork['first']:>7.1f} {med['epoch']:>20.3f}"
            f" {med['epoch'] / fork['epoch']:>7.1f} {med['process']:>12.3f} {med['process'] / fork['process']:>7.1f}"
        )


if __name__ == "__main__":
    main()
