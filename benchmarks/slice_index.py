"""Slice sampling with writes in between: extend(200) + sample(256) at N stored rows (issue 30 item 1).

Each configuration has its own buffer of N small rows (4 floats, an episode id, a done flag; episodes of
``--episode`` steps) and runs the online pattern of RL training: a collector step ``extend``s 200 rows, then the
learner samples 256 steps. The configurations run interleaved (a block of each in turn, ``--reps`` times) so that
machine noise hits them alike; the table gives the median ms per extend + sample and the ratio to uniform
sampling. ``index B/row`` is the memory of the trajectory index per stored row (live index only).

``--workers`` adds a row per N: a DataLoader with 2 forked workers sampling slices while the main process
extends 200 rows after each batch it receives (ms per batch, end to end, including the IPC of the batch), and
how the workers' indexes followed the writes (rebuilds from the whole storage vs O(k) catch-ups).

Run: ``python benchmarks/slice_index.py --sizes 1e5,1e6,1e7 --workers`` (smoke: ``--sizes 1e5 --reps 2
--iters 20 --workers``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader, get_worker_info

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    RandomSampler,
    Sequence,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
    tensordict_collate,
)

WRITE, BATCH, SLICE = 200, 256, 32


def rows(n: int, first: int, episode: int) -> TensorDict:
    t = torch.arange(first, first + n)
    done = ((t + 1) % episode == 0).unsqueeze(-1)
    return TensorDict(
        obs=torch.randn(n, 4),
        episode=t // episode,
        next=TensorDict(done=done, batch_size=[n]),
        batch_size=[n],
    )


CONFIGS = {
    "uniform": lambda n: (RandomSampler(), None, BATCH),
    "slice": lambda n: (SliceSampler(slice_len=SLICE, traj_key="episode"), None, BATCH),
    "slice cached": lambda n: (
        SliceSampler(slice_len=SLICE, traj_key="episode", cache_values=True),
        None,
        BATCH,
    ),
    "slice w/o repl.": lambda n: (
        SliceSamplerWithoutReplacement(slice_len=SLICE, traj_key="episode"),
        None,
        BATCH,
    ),
    "prioritized slice": lambda n: (
        PrioritizedSliceSampler(n, 0.7, 0.5, slice_len=SLICE, traj_key="episode"),
        None,
        BATCH,
    ),
    "Sequence": lambda n: (RandomSampler(), Sequence(SLICE), BATCH // SLICE),
}


def build(name: str, n: int, episode: int):
    sampler, unit, batch = CONFIGS[name](n)
    kwargs = {} if unit is None else {"sample_unit": unit}
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=sampler, batch_size=batch, **kwargs)
    rb.extend(rows(n, 0, episode))
    rb.sample()
    return {"rb": rb, "t": n}


def run_block(state, iters: int, episode: int) -> float:
    rb = state["rb"]
    chunks = [rows(WRITE, state["t"] + i * WRITE, episode) for i in range(iters)]  # built outside the timing
    start = time.perf_counter()
    for chunk in chunks:
        rb.extend(chunk)
        rb.sample()
    elapsed = time.perf_counter() - start
    state["t"] += iters * WRITE
    return elapsed / iters * 1e3


def index_bytes_per_row(state, n: int) -> str:
    holder = state["rb"].sampler
    live = getattr(holder, "_live", None)
    if live is None:
        unit = state["rb"].sample_unit
        live = getattr(unit, "_live", None)
    if live is None or live.index is None:
        return "-"
    return f"{live.index.nbytes() / n:.3f}"


class _CountingSliceSampler(SliceSampler):
    """A SliceSampler whose worker copies publish their index counters in a shared table (for the table)."""

    table: torch.Tensor | None = None

    def sample(self, storage, batch_size):
        out = super().sample(storage, batch_size)
        worker = get_worker_info()
        if worker is not None and self.table is not None:
            stats = self.trajectory_index_stats
            self.table[worker.id, 0], self.table[worker.id, 1] = stats["rebuilds"], stats["catch_ups"]
        return out


def run_workers(n: int, batches: int, episode: int, workers: int = 2) -> tuple[float, str]:
    """ms per batch of a DataLoader over ``workers`` forked workers while the main process extends between
    batches, and ``rebuilds/catch-ups`` of the workers' indexes (beyond the copy made at the fork)."""
    sampler = _CountingSliceSampler(slice_len=SLICE, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=sampler, batch_size=BATCH)
    rb.extend(rows(n, 0, episode))
    rb.sample()
    sampler.table = torch.zeros(workers, 2, dtype=torch.long).share_memory_()
    loader = DataLoader(
        rb.as_dataset(num_batches=batches + 10),
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="fork",
        collate_fn=tensordict_collate,
        timeout=120,
    )
    chunks = [rows(WRITE, n + i * WRITE, episode) for i in range(batches + 10)]
    it = iter(loader)
    for i in range(10):  # warm-up: the workers start
        next(it)
        rb.extend(chunks[i])
    start = time.perf_counter()
    for i in range(10, batches + 10):
        next(it)
        rb.extend(chunks[i])
    elapsed = (time.perf_counter() - start) / batches * 1e3
    rebuilds, catch_ups = sampler.table.sum(0).tolist()
    del it, loader
    return elapsed, f"{rebuilds - workers}/{catch_ups}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated N (rows stored)")
    parser.add_argument("--reps", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--iters", type=int, default=50, help="extend + sample per block")
    parser.add_argument("--episode", type=int, default=100, help="steps per episode")
    parser.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    parser.add_argument(
        "--workers", action="store_true", help="add the DataLoader row (2 forked workers, extends in between)"
    )
    args = parser.parse_args()
    names = [name for name in CONFIGS if not args.only or name in args.only.split(",")]
    torch.set_num_threads(1)
    print(
        f"extend({WRITE}) + sample({BATCH}) (slice_len={SLICE}, episodes of {args.episode} steps), median ms"
    )
    print(f"{'N':>10} {'configuration':>18} {'ms':>9} {'x uniform':>10} {'index B/row':>12}")
    for size in args.sizes.split(","):
        n = int(float(size))
        states = {name: build(name, n, args.episode) for name in names}
        times = {name: [] for name in names}
        for _ in range(args.reps):
            for name in names:
                times[name].append(run_block(states[name], args.iters, args.episode))
        base = statistics.median(times["uniform"]) if "uniform" in times else float("nan")
        for name in names:
            ms = statistics.median(times[name])
            print(
                f"{n:>10} {name:>18} {ms:>9.3f} {ms / base:>10.2f} {index_bytes_per_row(states[name], n):>12}"
            )
        del states
        if args.workers:
            ms, counts = run_workers(n, args.iters * args.reps, args.episode)
            print(
                f"{n:>10} {'2 workers':>18} {ms:>9.3f} {ms / base:>10.2f} {'rebuilt/caught up ' + counts:>12}"
            )


if __name__ == "__main__":
    main()
