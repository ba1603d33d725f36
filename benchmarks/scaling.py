"""How the cost of a draw and of a checkpoint grows with the buffer (issue 30): a table for N = 10^5, 10^6, 10^7.

Usage::

    python benchmarks/scaling.py                        # N = 1e5, 1e6, 1e7; 1 GB for the dumps rows
    python benchmarks/scaling.py --sizes 100000 1000000 --dump-mb 256 --rounds 3

Data: small rows, as an online learner's buffer of low-dimensional transitions: ``observation: f32[4]`` and an
``episode: i64`` id, in episodes of 100 steps, plus ``("next", "done")`` flags. Each buffer is full (N rows
written, the ring has wrapped once by the first timed write), batch 256.

Rows, for each N, each timed in two modes:

- ``sample``: ``rb.sample()`` alone, the buffer unchanged between calls;
- ``extend(200) + sample``: a collector step writes 200 rows (a whole number of episodes is not assumed:
  wrap-around cuts the oldest trajectory) between two draws, the online pattern of RL training.

Samplers: uniform (``RandomSampler``), prioritized (``PrioritizedSampler`` + ``update_priority`` of the drawn
batch), ``PrioritizedSliceSampler(slice_len=32, traj_key="episode")`` + ``update_priority`` of the drawn steps
(``prio. slice + update``), ``SliceSampler(slice_len=32, traj_key="episode")`` with and without ``cache_values``, and
``Sequence(32, done_key=("next", "done"))``. The ``ratio`` column is the median of per-round ratios to uniform
in the same mode, the two measured round by round (interleaved), so machine load hits both alike.

Fragmented rows (interleaved trajectories, issue 41): the same steps written as 8 envs write them, one step of each
env in turn (``episode`` ids per env, a ``step_count`` per step), drawn by ``SliceSampler(slice_len=32,
traj_key="episode", fragmented=True)`` (``slice (fragmented)``) and ``PrioritizedSliceSampler(..., fragmented=True)``
+ ``update_priority`` (``prio. slice fragm. + upd.``); a second table gives each one's cost over its contiguous
row (``slice (no cache)``, ``prio. slice + update``) for the same N and mode (target: within 1.5x).

Then checkpoints of a ``LazyMemmapStorage`` buffer of ``--dump-mb`` MB (``observation: f32[256]``): a full
``rb.dumps(path)`` into a new directory vs an incremental ``rb.dumps(path)`` onto the buffer's previous
checkpoint at the same path after 1% of the rows were rewritten; target: incremental <= 10% of full.

Run it on an idle machine: any other busy process stalls multi-threaded torch ops by milliseconds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.sample_units import Sequence

BATCH = 256
EPISODE = 100
WRITE = 200


def _rows(start: int, n: int, width: int = 4) -> TensorDict:
    step = torch.arange(start, start + n)
    done = ((step + 1) % EPISODE == 0).unsqueeze(-1)
    return TensorDict(
        {"observation": torch.randn(n, width), "episode": step // EPISODE, ("next", "done"): done},
        batch_size=[n],
    )


ENVS = 8


def _interleaved_rows(start: int, n: int, width: int = 4) -> TensorDict:
    """Rows ``start .. start + n`` of ``ENVS`` envs writing one step each in turn: env ``i % ENVS`` plays episodes of
    ``EPISODE`` steps; ``episode`` ids are unique over envs, ``step_count`` counts the steps of each episode."""
    i = torch.arange(start, start + n)
    env, t = i % ENVS, i // ENVS
    step = t % EPISODE
    done = (step == EPISODE - 1).unsqueeze(-1)
    return TensorDict(
        {
            "observation": torch.randn(n, width),
            "episode": (t // EPISODE) * ENVS + env,
            "step_count": step,
            ("next", "done"): done,
        },
        batch_size=[n],
    )


#: fragmented row -> its contiguous row (the second table)
FRAGMENTED = {"slice (fragmented)": "slice (no cache)", "prio. slice fragm. + upd.": "prio. slice + update"}


def _buffer(n: int, sampler, *, buffer_cls=ReplayBuffer, rows=_rows, **kwargs) -> tuple[ReplayBuffer, list]:
    batch = BATCH // 32 if "sample_unit" in kwargs else BATCH  # a Sequence batch of B anchors has B * 32 rows
    rb = buffer_cls(storage=LazyTensorStorage(n), sampler=sampler, batch_size=batch, **kwargs)
    chunk = 1_000_000
    for start in range(0, n, chunk):
        rb.extend(rows(start, min(chunk, n - start)))
    return rb, [n, rows]


def _samplers(n: int) -> dict[str, tuple[ReplayBuffer, list[int], bool]]:
    """name -> (buffer, next step counter, whether the draw updates priorities)."""
    out = {}
    out["uniform"] = (*_buffer(n, RandomSampler()), False)
    out["prioritized + update"] = (
        *_buffer(n, PrioritizedSampler(n, alpha=0.7, beta=0.5), buffer_cls=TensorDictReplayBuffer),
        True,
    )
    out["prio. slice + update"] = (  # PrioritizedSliceSampler + update_priority of the drawn steps
        *_buffer(
            n,
            PrioritizedSliceSampler(n, alpha=0.7, beta=0.5, slice_len=32, traj_key="episode"),
            buffer_cls=TensorDictReplayBuffer,
        ),
        True,
    )
    out["slice (no cache)"] = (*_buffer(n, SliceSampler(slice_len=32, traj_key="episode")), False)
    out["slice (cache_values)"] = (
        *_buffer(n, SliceSampler(slice_len=32, traj_key="episode", cache_values=True)),
        False,
    )
    out["Sequence(32)"] = (
        *_buffer(n, RandomSampler(), sample_unit=Sequence(32, done_key=("next", "done"))),
        False,
    )
    out["slice (fragmented)"] = (
        *_buffer(n, SliceSampler(slice_len=32, traj_key="episode", fragmented=True), rows=_interleaved_rows),
        False,
    )
    out["prio. slice fragm. + upd."] = (
        *_buffer(
            n,
            PrioritizedSliceSampler(n, alpha=0.7, beta=0.5, slice_len=32, traj_key="episode", fragmented=True),
            buffer_cls=TensorDictReplayBuffer,
            rows=_interleaved_rows,
        ),
        True,
    )
    return out


def _draw(rb: ReplayBuffer, counter: list, update: bool, extend: bool) -> None:
    """One timed call; ``counter`` is ``[next row, rows function]``."""
    if extend:
        rb.extend(counter[1](counter[0], WRITE))
        counter[0] += WRITE
    if update:
        batch = rb.sample()
        rb.update_priority(batch["index"], torch.rand(batch.shape[0]) + 0.01)
    else:
        rb.sample()


def _time(fn, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def sampling_table(sizes: list[int], rounds: int, number: int) -> list[tuple]:
    rows = []
    for n in sizes:
        buffers = _samplers(n)
        for extend in (False, True):
            times: dict[str, list[float]] = {name: [] for name in buffers}
            ratios: dict[str, list[float]] = {name: [] for name in buffers}
            for rb, counter, update in buffers.values():  # warm-up: caches, first-draw checks
                _draw(rb, counter, update, extend)
            for _ in range(rounds):
                uniform = buffers["uniform"]
                for name, (rb, counter, update) in buffers.items():
                    base = _time(lambda u=uniform, e=extend: _draw(u[0], u[1], False, e), number)
                    t = _time(lambda rb=rb, c=counter, u=update, e=extend: _draw(rb, c, u, e), number)
                    times[name].append(t)
                    ratios[name].append(t / base)
            mode = f"extend({WRITE}) + sample" if extend else "sample"
            for name in buffers:
                rows.append(
                    (f"{n:.0e}", mode, name, statistics.median(times[name]) * 1e3, statistics.median(ratios[name]))
                )
        del buffers
    return rows


def dumps_table(dump_mb: int, rounds: int, workdir: Path) -> list[tuple]:
    width = 256
    n = dump_mb * 2**20 // (width * 4)
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=workdir / "scratch"), batch_size=BATCH)
    rb.extend(_rows(0, n, width))
    target = workdir / "ckpt"
    full, incremental = [], []
    written = n
    for r in range(rounds):
        fresh = workdir / f"full_{r}"
        start = time.perf_counter()
        rb.dumps(fresh)
        full.append(time.perf_counter() - start)
        shutil.rmtree(fresh)
        rb.dumps(target)  # the previous checkpoint of this buffer at `target`
        rb.extend(_rows(written, n // 100, width))  # 1% new rows
        written += n // 100
        start = time.perf_counter()
        rb.dumps(target)
        incremental.append(time.perf_counter() - start)
    f, i = statistics.median(full), statistics.median(incremental)
    return [
        (f"{dump_mb} MB", "full dumps (new directory)", f * 1e3, 1.0),
        (f"{dump_mb} MB", "incremental dumps (1% new rows)", i * 1e3, statistics.median(
            [b / a for a, b in zip(full, incremental)]
        )),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=50, help="draws per timed block")
    parser.add_argument("--dump-mb", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory for the dumps rows")
    args = parser.parse_args()

    print(f"{'N':>6} | {'mode':<26} | {'sampler':<26} | {'ms/call':>8} | {'x uniform':>9}")
    print("-" * 88)
    table = sampling_table(args.sizes, args.rounds, args.number)
    for n, mode, name, ms, ratio in table:
        print(f"{n:>6} | {mode:<26} | {name:<26} | {ms:8.3f} | {ratio:9.2f}")
    print()
    print(f"{'N':>6} | {'mode':<26} | {'fragmented sampler':<26} | {'ms/call':>8} | {'x contiguous':>12}")
    print("-" * 90)
    ms_of = {(n, mode, name): ms for n, mode, name, ms, _ in table}
    for n, mode, name, ms, _ in table:
        if name in FRAGMENTED:
            print(f"{n:>6} | {mode:<26} | {name:<26} | {ms:8.3f} | {ms / ms_of[n, mode, FRAGMENTED[name]]:12.2f}")
    if args.dump_mb > 0:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            print()
            print(f"{'buffer':>8} | {'checkpoint':<34} | {'ms':>9} | {'x full':>7}")
            print("-" * 70)
            for size, what, ms, ratio in dumps_table(args.dump_mb, max(1, args.rounds // 2), Path(tmp)):
                print(f"{size:>8} | {what:<34} | {ms:9.1f} | {ratio:7.3f}")


if __name__ == "__main__":
    main()
