"""The samplers of issue 14 against ``RandomSampler``: a full draw (``sampler.sample`` + ``storage.get``).

Workload: the core transitions of the replay-buffer benchmarks (``obs: f32[84]``, ``action: i64``,
``reward: f32``, ``("next", "obs"): f32[84]``, ``("next", "done"): bool``, trajectories of 100 steps), 100k
entries in a ``LazyTensorStorage``, batch 256, plus what each sampler reads: a ``"policy_version"`` (versions
0-9) for the staleness-aware sampler, and a ``"query"`` (groups of 16 completions) for the prompt groups.

Each row times, in interleaved rounds, a full draw of ``RandomSampler`` and of the sampler, and reports the
median microseconds and the median of the per-round ratios. Targets (issue 14):

- ``ConsumingSampler(max_sample_count=1)``: <= 2x (each round starts from a refilled buffer: every item live);
- ``StreamingSliceSampler(slice_len=32)``: <= 2x, served from its queue of windows (each round starts with
  the whole storage freshly written; the writes are not timed), and, in a second row, the uniform fallback
  when the queue is empty (``cache_values=True``, as a learner that samples faster than actors write would
  run it; informative, no target);
- ``StalenessAwareSampler()`` (weights ``1 / (staleness + 1)``): <= 3x;
- ``PromptGroupSampler``, random strategy: <= 3x, for whole groups (``samples_per_group=16``, every completion
  of a prompt) and for half groups (``samples_per_group=8``: 8 of the 16 chosen); the other strategies' rows
  are informative.

Rows whose sampler cannot be imported (another part of the issue not merged yet) are skipped with a note.

Run ``python benchmarks/sampler_toolbox.py`` on an idle machine (``--rounds R``, ``--number N`` calls per
round side; ``--small`` for a quick check with 2,000 entries). Sizes also come from the environment:
``TOOLBOX_BENCH_ENTRIES`` (default 100_000) and ``TOOLBOX_BENCH_ROUNDS`` (default 15).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

import torch
from _timing import interleaved, median_ratio
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, RandomSampler

ENTRIES = int(os.environ.get("TOOLBOX_BENCH_ENTRIES", 100_000))
ROUNDS = int(os.environ.get("TOOLBOX_BENCH_ROUNDS", 15))
BATCH = 256
TRAJ_LEN = 100
GROUP = 16
SLICE_LEN = 32


def core_storage(n: int) -> LazyTensorStorage:
    """``n`` core steps in trajectories of ``TRAJ_LEN``, with a policy version and a prompt id per step."""
    gen = torch.Generator().manual_seed(0)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[TRAJ_LEN - 1 :: TRAJ_LEN] = True
    data = TensorDict(
        {
            "obs": torch.randn(n, 84, generator=gen),
            "action": torch.randint(0, 4, (n,), generator=gen),
            "reward": torch.randn(n, generator=gen),
            ("next", "obs"): torch.randn(n, 84, generator=gen),
            ("next", "done"): done,
            "policy_version": torch.randint(0, 10, (n,), generator=gen),
            "query": torch.arange(n) // GROUP,
            ("next", "reward"): torch.randn(n, 1, generator=gen),
        },
        batch_size=[n],
    )
    storage = LazyTensorStorage(n)
    storage.set(torch.arange(n), data)
    return storage


def _seeded(sampler):
    sampler._rng = torch.Generator().manual_seed(0)
    return sampler


class Case:
    """A sampler to time: ``draw()`` is one full draw; ``refill()`` (untimed) runs before each round."""

    def __init__(
        self, name: str, target: float | None, draw: Callable[[], object], refill: Callable[[], object]
    ):
        self.name, self.target, self.draw, self.refill = name, target, draw, refill


def _full_draw(sampler, storage) -> Callable[[], object]:
    def draw():
        index, _ = sampler.sample(storage, BATCH)
        return storage.get(index)

    return draw


def _nothing() -> None:
    return None


def cases(storage) -> tuple[list[Case], list[str]]:
    """The samplers that import, and a note for each one that does not."""
    n = len(storage)
    everything = torch.arange(n)
    out, notes = [], []
    try:
        from torchrl.data import ConsumingSampler
    except ImportError as err:
        notes.append(f"ConsumingSampler skipped: {err}")
    else:
        consuming = _seeded(ConsumingSampler(max_sample_count=1))
        out.append(
            Case(
                "ConsumingSampler(max_sample_count=1)",
                2.0,
                _full_draw(consuming, storage),
                lambda: consuming.mark_update(everything, storage=storage),  # every item drawable again
            )
        )
    try:
        from torchrl.data import StalenessAwareSampler
    except ImportError as err:
        notes.append(f"StalenessAwareSampler skipped: {err}")
    else:
        staleness = _seeded(StalenessAwareSampler())
        staleness.consumer_version = 10
        out.append(Case("StalenessAwareSampler()", 3.0, _full_draw(staleness, storage), _nothing))
    try:
        from torchrl.data import StreamingSliceSampler
    except ImportError as err:
        notes.append(f"StreamingSliceSampler skipped: {err}")
    else:
        streaming = _seeded(StreamingSliceSampler(slice_len=SLICE_LEN))

        def rewrite():  # the whole storage freshly written: its windows are queued at the next sample
            streaming.mark_update(everything, storage=storage)
            streaming.sample(storage, SLICE_LEN)  # cuts the windows (not timed)

        out.append(
            Case(
                f"StreamingSliceSampler(slice_len={SLICE_LEN}), queued",
                2.0,
                _full_draw(streaming, storage),
                rewrite,
            )
        )
        fallback = _seeded(StreamingSliceSampler(slice_len=SLICE_LEN, cache_values=True))
        out.append(
            Case(
                f"StreamingSliceSampler(slice_len={SLICE_LEN}), uniform fallback",
                None,
                _full_draw(fallback, storage),
                _nothing,
            )
        )
    try:
        from torchrl.data import PromptGroupSampler
    except ImportError as err:
        notes.append(f"PromptGroupSampler skipped: {err}")
    else:
        # whole groups (each prompt has GROUP completions, a batch takes them all), then half groups (a choice)
        for per_group, strategy in [(GROUP, s) for s in ("random", "recency", "reward")] + [
            (GROUP // 2, s) for s in ("random", "recency", "reward", "variance")
        ]:
            groups = _seeded(PromptGroupSampler(samples_per_group=per_group, strategy=strategy))
            groups.mark_update(everything, storage=storage)
            target = 3.0 if strategy == "random" else None
            name = f"PromptGroupSampler(samples_per_group={per_group}, {strategy!r})"
            out.append(Case(name, target, _full_draw(groups, storage), _nothing))
    return out, notes


def measure(storage, case: Case, *, rounds: int, number: int) -> tuple[float, float, float]:
    """Median us of RandomSampler's and the case's full draw, and the median of the per-round ratios."""
    baseline = _full_draw(_seeded(RandomSampler()), storage)
    case.refill()
    case.draw(), baseline()  # warm-up (caches, first allocation)
    base_s, case_s = interleaved(baseline, case.draw, rounds=rounds, number=number, before_round=case.refill)
    return statistics.median(base_s) * 1e6, statistics.median(case_s) * 1e6, median_ratio(case_s, base_s)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds per row")
    parser.add_argument("--number", type=int, default=100, help="full draws per round and side")
    parser.add_argument("--small", action="store_true", help="a quick check: 2,000 entries, 3 rounds of 5")
    args = parser.parse_args(argv)
    entries, rounds, number = (2_000, 3, 5) if args.small else (ENTRIES, args.rounds, args.number)
    # within a round, ConsumingSampler(1) must not run dry (entries // BATCH draws) nor the streaming queue
    # (TRAJ_LEN // SLICE_LEN windows per trajectory, BATCH // SLICE_LEN per draw)
    windows = entries // TRAJ_LEN * (TRAJ_LEN // SLICE_LEN)
    number = max(1, min(number, entries // BATCH - 1, windows // (BATCH // SLICE_LEN) - 1))
    storage = core_storage(entries)
    rows, notes = cases(storage)
    print(
        f"{entries} core entries, batch {BATCH}, {rounds} interleaved rounds of {number} full draws "
        f"(sample + storage.get); ratio: median of the per-round ratios to RandomSampler"
    )
    print(f"  {'sampler':<58} {'RandomSampler':>14} {'sampler':>10} {'ratio':>7} {'target':>7}")
    for case in rows:
        base, mine, ratio = measure(storage, case, rounds=rounds, number=number)
        target = "-" if case.target is None else f"<= {case.target:g}x"
        flag = "" if case.target is None or ratio <= case.target else "  (over target)"
        print(f"  {case.name:<58} {base:11.1f} us {mine:7.1f} us {ratio:6.2f}x {target:>7}{flag}")
    for note in notes:
        print(f"  note: {note}")


if __name__ == "__main__":
    main()
