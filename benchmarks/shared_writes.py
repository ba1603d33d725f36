"""Throughput of ``rb.extend`` in one process, and of several writer processes sharing one buffer.

Rows are the core benchmark transitions (``obs: f32[84], action: i64, reward: f32, ("next", "obs"): f32[84],
done: bool``), written in batches of ``--batch`` rows into a ring of 100k rows.

Tables:

1. One process, rows/s of ``rb.extend``: a private ``LazyTensorStorage`` buffer, the same with
   ``shared=True`` (cross-process write lock, shared counters and row versions) and a ``LazyMemmapStorage``
   buffer (always shared). With ``--before PATH`` (a checkout of an older revision, e.g. made with
   ``git worktree add /tmp/before HEAD~1``) each cell is also measured with that revision's ``torchrl``, in
   alternating subprocesses, and the ratio new / old is printed (median of per-round ratios; > 1 is faster).
2. ``N`` writer processes (fork) extending one shared buffer at the same time: total rows/s, and the ratio
   to one writer process measured in the same round.

Read the ratios, not the absolute numbers: they move with the machine's load. Run on an idle machine.

Run: ``python benchmarks/shared_writes.py [--seconds 2] [--rounds 5] [--batch 1 64] [--before PATH]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics

from _timing import child_output, median_ratio, rate

CAPACITY = 100_000
STORAGES = ("lazy", "lazy-shared", "memmap")


def _imports():
    import torch
    from tensordict import TensorDict

    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

    return torch, TensorDict, LazyMemmapStorage, LazyTensorStorage, ReplayBuffer


def make_rows(n: int):
    torch, TensorDict, *_ = _imports()
    return TensorDict(
        {"obs": torch.randn(n, 84), "action": torch.randint(4, (n,)), "reward": torch.randn(n),
         ("next", "obs"): torch.randn(n, 84), "done": torch.zeros(n, dtype=torch.bool)},
        batch_size=[n],
    )


def make_buffer(storage: str):
    torch, _, LazyMemmapStorage, LazyTensorStorage, ReplayBuffer = _imports()
    if storage == "memmap":
        rb = ReplayBuffer(storage=LazyMemmapStorage(CAPACITY))
    else:
        rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    rb.extend(make_rows(2))  # allocate in this process
    if storage == "lazy-shared":
        rb.share()
    return rb


def rows_per_second(rb, batch: int, seconds: float) -> float:
    data = make_rows(batch)
    for _ in range(20):
        rb.extend(data)
    return rate(lambda: rb.extend(data), seconds, chunk=20) * batch


def _writer(rb, batch: int, seconds: float, start, queue) -> None:
    import torch

    torch.set_num_threads(1)
    start.wait(60)
    queue.put(rows_per_second(rb, batch, seconds))


def multi_writer_rate(storage: str, writers: int, batch: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    rb = make_buffer(storage)
    if storage == "lazy":
        rb.share()
    start, queue = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(rb, batch, seconds, start, queue)) for _ in range(writers)]
    for p in procs:
        p.start()
    start.set()
    rates = [queue.get(timeout=seconds * 10 + 60) for _ in procs]
    for p in procs:
        p.join(30)
    return sum(rates)


def _single_cell(storage: str, batch: int, seconds: float) -> float:
    import torch

    torch.set_num_threads(1)
    return rows_per_second(make_buffer(storage), batch, seconds)


def _run_in(tree: str, storage: str, batch: int, seconds: float) -> float:
    """One single-process cell measured with the ``torchrl`` of ``tree``, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=tree)
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import shared_writes as b; "
        "print(json.dumps(b._single_cell(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    return json.loads(child_output(["-c", code, here, storage, str(batch), str(seconds)], env=env, cwd=tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement time per cell")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are printed")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="rows per extend call")
    parser.add_argument("--writers", type=int, nargs="+", default=[2], help="writer processes for table 2")
    parser.add_argument("--before", default=None, help="a checkout of an older revision to compare with")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    single: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for batch in args.batch:
            for storage in STORAGES:
                if args.before and storage == "lazy-shared":
                    pass
                new = _run_in(here, storage, batch, args.seconds)
                single.setdefault((storage, batch, "new"), []).append(new)
                if args.before:
                    old = _run_in(args.before, storage, batch, args.seconds)
                    single.setdefault((storage, batch, "old"), []).append(old)
    print(f"\n1. one process, rb.extend rows/s (median of {args.rounds} rounds, 1 torch thread)")
    header = f"{'storage':>12} {'batch':>6} {'rows/s':>12}"
    if args.before:
        header += f" {'before':>12} {'new/before':>11}"
    print(header)
    for batch in args.batch:
        for storage in STORAGES:
            new = single[(storage, batch, "new")]
            line = f"{storage:>12} {batch:>6} {statistics.median(new):>12,.0f}"
            if args.before:
                old = single[(storage, batch, "old")]
                ratio = median_ratio(new, old)
                line += f" {statistics.median(old):>12,.0f} {ratio:>10.2f}x"
            print(line)

    print("\n2. writer processes sharing one buffer (fork): total rows/s, vs 1 writer process in the same round")
    print(f"{'storage':>12} {'batch':>6} {'writers':>8} {'rows/s':>12} {'vs 1 writer':>12}")
    for batch in args.batch:
        for storage in ("lazy", "memmap"):
            for writers in args.writers:
                pairs = []
                for _ in range(args.rounds):
                    one = multi_writer_rate(storage, 1, batch, args.seconds)
                    many = multi_writer_rate(storage, writers, batch, args.seconds)
                    pairs.append((one, many))
                total = statistics.median(m for _, m in pairs)
                ratio = median_ratio([m for _, m in pairs], [o for o, _ in pairs])
                print(f"{storage:>12} {batch:>6} {writers:>8} {total:>12,.0f} {ratio:>11.2f}x")


if __name__ == "__main__":
    main()
