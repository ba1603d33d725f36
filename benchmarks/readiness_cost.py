"""What readiness and rate limiting cost ``rb.sample()`` when nobody waits (issue 27's target: <= 5%).

One process, one buffer per row, all built alike (``LazyTensorStorage`` of 100k rows of the core transitions,
full, ``batch_size=--batch``); every row is timed interleaved with its baseline, round by round (alternating
which side goes first), and the table prints the median of the per-round ratios row / baseline (1.00 = no cost):

- ``draw only``: the baseline, the buffer's draw (sampler, gather, collate) without the readiness counters:
  what ``rb.sample()`` did before readiness existed. Each row's baseline is the draw of *its own* buffer
  (``rb._sample``): a shared buffer's draw also reads the row versions of its shared storage, which is no
  readiness cost (comparing it with the private buffer's draw measured that too);
- ``rb.sample()``: the same draw plus the cumulative counters (``sample_calls``, ``samples_returned``);
- ``rb.sample(wait=True)``: the waiting path on a ready buffer (a readiness check, no wait);
- ``shared=True``: ``rb.sample()`` on a shared buffer (counters in shared memory, a cross-process lock);
- ``RateLimitedReplayBuffer``: a budget reserved and committed around every draw (a ratio that never binds);
- ``rate_limiter=SampleToInsertRatio``: Reverb's limiter, likewise never binding.

Read the ratios, not the absolute numbers; run on an idle machine.

Rounds are short (100 calls, ~10 ms a side) and many, so that both sides of a round see the same machine: with
15 rounds of 2000 calls, the ``rb.sample()`` row (0.7 us of counting beside an 85 us draw) read 1.02 to 1.09
on this 2-core VM; with 301 rounds of 100, 1.00 to 1.02.

Run: ``python benchmarks/readiness_cost.py [--rounds 301] [--number 100] [--batch 256]`` (``--smoke``: a few
calls, to check that the script runs).
"""

from __future__ import annotations

import argparse
import functools
import statistics

from _timing import interleaved, median_ratio

CAPACITY = 100_000


def _rows(n: int):
    import torch
    from tensordict import TensorDict

    return TensorDict(
        {"obs": torch.randn(n, 84), "action": torch.randint(4, (n,)), "reward": torch.randn(n),
         ("next", "obs"): torch.randn(n, 84), "done": torch.zeros(n, dtype=torch.bool)},
        batch_size=[n],
    )  # fmt: skip


def _buffers(batch: int, capacity: int) -> dict:
    import torch

    from torchrl.data import LazyTensorStorage, RateLimitedReplayBuffer, ReplayBuffer, SampleToInsertRatio

    def build(cls=ReplayBuffer, **kwargs):
        rb = cls(storage=LazyTensorStorage(capacity), batch_size=batch, generator=torch.Generator(), **kwargs)
        rb.extend(_rows(capacity))
        return rb

    plain = build()
    # ratios that never bind: the cost of the checks, not of waiting
    return {
        "draw only": (plain, lambda: plain._sample(batch)),
        "rb.sample()": (plain, plain.sample),
        "rb.sample(wait=True)": (plain, lambda: plain.sample(wait=True)),
        "shared=True": (shared := build(shared=True), shared.sample),
        "RateLimitedReplayBuffer": (limited := build(RateLimitedReplayBuffer, samples_per_insert=1e12), limited.sample),
        "rate_limiter=SampleToInsertRatio": (
            ratio := build(rate_limiter=SampleToInsertRatio(1e9, 1, 1e15)), ratio.sample,
        ),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=301)
    parser.add_argument("--number", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--smoke", action="store_true", help="a few calls on a small buffer")
    args = parser.parse_args()
    rounds, number, capacity = (3, 20, 1000) if args.smoke else (args.rounds, args.number, CAPACITY)
    rows = _buffers(args.batch, capacity)
    rows.pop("draw only")
    print(f"rb.sample() of {args.batch} rows from {capacity} (median of {rounds} interleaved rounds x {number} calls)")
    print(f"{'row':<36}{'us/call':>10}{'baseline us':>13}{'ratio':>8}")
    for name, (rb, fn) in rows.items():
        baseline = functools.partial(rb._sample, args.batch)  # this row's buffer's draw, no readiness
        a, b = interleaved(fn, baseline, rounds=rounds, number=number, alternate=True)
        print(f"{name:<36}{statistics.median(a) * 1e6:>10.1f}{statistics.median(b) * 1e6:>13.1f}"
              f"{median_ratio(a, b):>8.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
