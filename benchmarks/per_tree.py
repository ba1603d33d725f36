"""Prioritized sampling near the memory floor (issue 30, item 2): uniform vs prioritized ``sample`` +
``update_priority`` of 256, numpy vs numba tree loops, at N = 10^5, 10^6, 10^7.

Usage::

    python benchmarks/per_tree.py                          # N = 1e5, 1e6, 1e7
    python benchmarks/per_tree.py --sizes 100000 --rounds 3 --number 5    # a smoke run

Data: small rows (``observation: f32[4]`` and an ``episode: i64`` id), the buffer full, batch 256. Rows:

- ``uniform``: ``ReplayBuffer(RandomSampler)``, ``rb.sample()``;
- ``prioritized (numpy)`` / ``prioritized (numba)``: ``TensorDictReplayBuffer(PrioritizedSampler(alpha=0.7,
  beta=0.5))``, ``batch = rb.sample()`` then ``rb.update_priority(batch["index"], new)``, the sampler's trees
  built with ``kernel="numpy"`` or ``kernel="numba"`` (the numba row is left out when numba is not installed);
- ``plain RB prio (numpy)`` / ``plain RB prio (numba)``: the same draw through the uniform row's buffer class,
  ``ReplayBuffer(PrioritizedSampler(...))``: ``batch, info = rb.sample(return_info=True)`` then
  ``rb.update_priority(info["index"], new)`` (no info entries written into the batch, no stored ``"index"``).

Each round times a block of ``--number`` calls of every row, interleaved (uniform, numpy, numba, uniform, ...),
so that a change of machine load hits all rows alike; the ``x uniform`` column is the median over rounds of the
per-round ratio to the uniform block of the same round. Targets: <= 4x (numpy) and <= 2.5x at 1e5 / <= 3x at
1e6 (numba).

``--interleave call`` times one call of each row in turn instead (``--number`` such turns per round, every call
timed alone): no row keeps its data in the caches from one call to its next, as in a training loop where the
learner's step runs between two draws. Both sides then pay cache misses: the uniform draw's gather costs more
(about 1.5x), and the ratios come out lower than with blocks. Quote which mode a number comes from.

Run it on an idle machine: any other busy process stalls the draws by more than the trees cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import _tree_kernels

BATCH = 256


def _rows(n: int) -> TensorDict:
    step = torch.arange(n)
    return TensorDict({"observation": torch.randn(n, 4), "episode": step // 100}, batch_size=[n])


def _buffer(n: int, sampler, buffer_cls) -> ReplayBuffer:
    rb = buffer_cls(storage=LazyTensorStorage(n), sampler=sampler, batch_size=BATCH)
    for start in range(0, n, 1_000_000):
        rb.extend(_rows(min(1_000_000, n - start)))
    return rb


def _prioritized(n: int, kernel: str, buffer_cls=TensorDictReplayBuffer) -> ReplayBuffer:
    previous = _tree_kernels.DEFAULT_KERNEL
    _tree_kernels.DEFAULT_KERNEL = kernel  # the trees read the default when they are built
    try:
        sampler = PrioritizedSampler(n, alpha=0.7, beta=0.5)
    finally:
        _tree_kernels.DEFAULT_KERNEL = previous
    return _buffer(n, sampler, buffer_cls)


def _calls(n: int) -> dict:
    """row name -> a function doing one call of the row."""
    uniform = _buffer(n, RandomSampler(), ReplayBuffer)
    rows = {"uniform": uniform.sample}
    kernels = ["numpy"] + (["numba"] if _tree_kernels.compiled_kernels() is not None else [])
    for kernel in kernels:
        rb = _prioritized(n, kernel)

        def step(rb=rb):
            batch = rb.sample()
            rb.update_priority(batch["index"], torch.rand(BATCH) + 0.01)

        rows[f"prioritized ({kernel})"] = step
        plain = _prioritized(n, kernel, ReplayBuffer)

        def plain_step(rb=plain):
            batch, info = rb.sample(return_info=True)
            rb.update_priority(info["index"], torch.rand(BATCH) + 0.01)

        rows[f"plain RB prio ({kernel})"] = plain_step
    return rows


def _block(fn, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _turns(rows: dict, number: int) -> dict[str, float]:
    """``number`` turns of one call of each row, each call timed alone: seconds per call of each row."""
    spent = dict.fromkeys(rows, 0.0)
    clock = time.perf_counter
    for _ in range(number):
        for name, fn in rows.items():
            start = clock()
            fn()
            spent[name] += clock() - start
    return {name: t / number for name, t in spent.items()}


def table(sizes: list[int], rounds: int, number: int, interleave: str = "block") -> list[tuple]:
    out = []
    for n in sizes:
        rows = _calls(n)
        for fn in rows.values():  # warm-up: compiled loops, first-draw checks
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(rounds):
            if interleave == "call":
                for name, t in _turns(rows, number).items():
                    times[name].append(t)
                continue
            for name, fn in rows.items():
                times[name].append(_block(fn, number))
        for name in rows:
            ratios = [t / u for t, u in zip(times[name], times["uniform"])]
            out.append((f"{n:.0e}", name, statistics.median(times[name]) * 1e6, statistics.median(ratios)))
        del rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--number", type=int, default=20, help="calls per timed block (per round with 'call')")
    parser.add_argument("--interleave", choices=["block", "call"], default="block",
                        help="time blocks of calls of each row (default), or one call of each row in turn")  # fmt: skip
    args = parser.parse_args()
    print(f"interleave={args.interleave}")
    print(f"{'N':>6} | {'row':<22} | {'us/call':>8} | {'x uniform':>9}")
    print("-" * 56)
    for n, name, us, ratio in table(args.sizes, args.rounds, args.number, args.interleave):
        print(f"{n:>6} | {name:<22} | {us:8.1f} | {ratio:9.2f}")


if __name__ == "__main__":
    main()
