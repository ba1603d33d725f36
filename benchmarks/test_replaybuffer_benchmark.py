"""Benchmarks of the replay-buffer core: ``sample`` and ``extend`` for each storage and uniform sampler.

Data (issue 2):

- core transitions: ``{obs: f32[84], action: i64, reward: f32, ("next", "obs"): f32[84], done: bool}``,
  100k entries, batch 256;
- frames: uint8 ``[3, 96, 96]``, 10k entries, batch 32.

Two ways to run it:

- ``pytest benchmarks/test_replaybuffer_benchmark.py`` (pytest-benchmark): one benchmark per storage x
  sampler x data for ``sample``, and per storage x data for ``extend`` (256 or 32 items into a full buffer);
- ``python benchmarks/test_replaybuffer_benchmark.py``: prints the two ratio targets, each side measured in
  the same run, interleaved round by round, as the median of the per-round ratios:

  (a) ``rb.sample()`` (RandomSampler, LazyTensorStorage and LazyMemmapStorage) vs the bare gather ``td[idx]``
      of the same batch from the user's own TensorDict with a pre-drawn index: target <= 1.5x;
  (b) ``rb.sample()`` on the frames vs ``frames.index_select(0, idx)`` on the user's own uint8 tensor:
      target <= 2x.

Sizes come from the environment so a quick check can run small: ``RB_BENCH_ENTRIES`` (default 100_000),
``RB_BENCH_FRAMES`` (default 10_000) and, for the script, ``RB_BENCH_ROUNDS`` (default 30); the script's
``--small`` flag sets all three to tiny values, e.g.
``RB_BENCH_ENTRIES=2000 RB_BENCH_FRAMES=200 pytest benchmarks/test_replaybuffer_benchmark.py --benchmark-disable``
or ``python benchmarks/test_replaybuffer_benchmark.py --small``. Take real numbers on an idle machine: any
other busy process stalls multi-threaded torch ops.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

import torch
from _timing import interleaved, median_ratio
from tensordict import TensorDict

try:  # the script mode runs without pytest
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)

ENTRIES = int(os.environ.get("RB_BENCH_ENTRIES", 100_000))
FRAMES = int(os.environ.get("RB_BENCH_FRAMES", 10_000))
ROUNDS = int(os.environ.get("RB_BENCH_ROUNDS", 30))
CORE_BATCH = 256
FRAME_BATCH = 32
STORAGES = ("list", "tensor", "lazy", "memmap")
SAMPLERS = ("random", "without_replacement")
DATA = ("core", "frames")


def make_core(n: int) -> TensorDict:
    """``n`` core transitions."""
    return TensorDict(
        {
            "obs": torch.randn(n, 84),
            "action": torch.randint(0, 4, (n,)),
            "reward": torch.randn(n),
            ("next", "obs"): torch.randn(n, 84),
            "done": torch.rand(n) < 0.01,
        },
        batch_size=[n],
    )


def make_frames(n: int) -> torch.Tensor:
    """``n`` uint8 frames ``[3, 96, 96]``."""
    return torch.randint(0, 256, (n, 3, 96, 96), dtype=torch.uint8)


def _data(kind: str, n: int):
    return make_core(n) if kind == "core" else make_frames(n)


def make_storage(name: str, data):
    """A storage of type ``name`` filled with ``data`` (its length is the capacity)."""
    n = data.shape[0]
    if name == "list":
        storage = ListStorage(n)
    elif name == "tensor":
        storage = TensorStorage(data.clone().zero_())
    elif name == "lazy":
        storage = LazyTensorStorage(n)
    elif name == "memmap":
        storage = LazyMemmapStorage(n)
    else:
        raise ValueError(f"unknown storage {name!r}")
    storage.set(torch.arange(n), data)
    return storage


def make_buffer(storage, sampler: str, batch_size: int) -> ReplayBuffer:
    sampler_obj = RandomSampler() if sampler == "random" else SamplerWithoutReplacement()
    # The storage was filled directly: the writer starts at row 0, so extends overwrite the oldest rows.
    return ReplayBuffer(
        storage=storage, sampler=sampler_obj, batch_size=batch_size, generator=torch.Generator().manual_seed(0)
    )


def _batch_size(kind: str) -> int:
    return CORE_BATCH if kind == "core" else FRAME_BATCH


# -- pytest-benchmark -------------------------------------------------------------------------------------------

if pytest is not None:
    _STORAGE_CACHE: dict = {}

    def _filled_storage(name: str, kind: str):
        """One filled storage per (storage, data), shared by the benchmarks of a session."""
        key = (name, kind)
        if key not in _STORAGE_CACHE:
            n = ENTRIES if kind == "core" else FRAMES
            _STORAGE_CACHE[key] = make_storage(name, _data(kind, n))
        return _STORAGE_CACHE[key]

    @pytest.mark.parametrize("kind", DATA)
    @pytest.mark.parametrize("sampler", SAMPLERS)
    @pytest.mark.parametrize("storage", STORAGES)
    def test_sample(benchmark, storage, sampler, kind):
        benchmark.group = f"sample-{kind}"
        rb = make_buffer(_filled_storage(storage, kind), sampler, _batch_size(kind))
        batch = benchmark(rb.sample)
        assert batch.shape[0] == _batch_size(kind)

    @pytest.mark.parametrize("kind", DATA)
    @pytest.mark.parametrize("sampler", SAMPLERS)
    @pytest.mark.parametrize("storage", STORAGES)
    def test_extend(benchmark, storage, sampler, kind):
        benchmark.group = f"extend-{kind}"
        rb = make_buffer(_filled_storage(storage, kind), sampler, _batch_size(kind))
        new = _data(kind, _batch_size(kind))
        n = len(rb)
        index = benchmark(rb.extend, new)
        assert index.numel() == _batch_size(kind) and len(rb) == n


    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_replay_buffer_dataset_workers(benchmark, num_workers):
        """Batches delivered by DataLoader(rb.as_dataset()) with a per-frame resize on the sample path.

        ``benchmarks/dataloader_workers.py`` prints the same measurement for 0, 1, 2 and 4 workers against
        the in-process ceiling.
        """
        from torch.utils.data import DataLoader

        from torchrl.data import tensordict_collate
        from torchrl.envs.transforms import Resize

        benchmark.group = "dataloader-workers"
        frames = make_frames(min(FRAMES, 2_000))
        rb = ReplayBuffer(storage=LazyMemmapStorage(frames.shape[0]), batch_size=FRAME_BATCH,
                                    transform=Resize(128, 128, in_keys=["pixels"]))
        rb.extend(TensorDict(pixels=frames, batch_size=frames.shape[:1]))
        kwargs = {"num_workers": num_workers}
        if num_workers:
            kwargs.update(multiprocessing_context="fork", timeout=120, prefetch_factor=4)
        it = iter(DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate, **kwargs))
        for _ in range(4):
            next(it)
        batch = benchmark(lambda: next(it))
        assert batch["pixels"].shape == (FRAME_BATCH, 3, 128, 128)


# -- script: the ratio targets ------------------------------------------------------------------------------------


def compare(candidate, baseline, *, rounds: int, reps: int) -> tuple[float, float, float]:
    """Median per-call seconds of both sides and the median of per-round ratios, interleaved."""
    for _ in range(3):  # warm up both sides
        candidate()
        baseline()
    # the side that goes first alternates round by round
    a_times, b_times = interleaved(candidate, baseline, rounds=rounds, number=reps, alternate=True)
    return statistics.median(a_times), statistics.median(b_times), median_ratio(a_times, b_times)


def run_targets(entries: int, frames_n: int, rounds: int, reps: int = 20) -> list[dict]:
    rows = []
    core = make_core(entries)
    frames = make_frames(frames_n)
    generator = torch.Generator().manual_seed(0)
    for name in ("lazy", "memmap"):
        rb = make_buffer(make_storage(name, core), "random", CORE_BATCH)
        # a fresh pre-drawn index per call, as rb.sample() draws one: no side reads cache-hot rows
        idx = itertools.cycle([torch.randint(0, entries, (CORE_BATCH,), generator=generator) for _ in range(64)])
        cand, base, ratio = compare(rb.sample, lambda idx=idx: core[next(idx)], rounds=rounds, reps=reps)
        rows.append(
            {"target": "(a) core", "storage": name, "candidate": "rb.sample()", "baseline": "td[idx]",
             "cand_us": cand * 1e6, "base_us": base * 1e6, "ratio": ratio, "limit": 1.5}
        )
    for name in ("lazy", "memmap"):
        rb = make_buffer(make_storage(name, frames), "random", FRAME_BATCH)
        idx = itertools.cycle([torch.randint(0, frames_n, (FRAME_BATCH,), generator=generator) for _ in range(64)])
        cand, base, ratio = compare(
            rb.sample, lambda idx=idx: frames.index_select(0, next(idx)), rounds=rounds, reps=reps
        )
        rows.append(
            {"target": "(b) frames", "storage": name, "candidate": "rb.sample()",
             "baseline": "frames.index_select(0, idx)", "cand_us": cand * 1e6, "base_us": base * 1e6,
             "ratio": ratio, "limit": 2.0}
        )
    return rows


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'target':<11} {'storage':<7} {'candidate':<12} {'us/call':>9}  {'baseline':<28} {'us/call':>9}  "
        f"{'ratio':>6}  {'limit':>5}  ok"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['target']:<11} {r['storage']:<7} {r['candidate']:<12} {r['cand_us']:>9.1f}  {r['baseline']:<28} "
            f"{r['base_us']:>9.1f}  {r['ratio']:>6.2f}  {r['limit']:>5.1f}  {'yes' if r['ratio'] <= r['limit'] else 'NO'}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes, to check that the script runs")
    parser.add_argument("--entries", type=int, default=ENTRIES, help="core transitions (default %(default)s)")
    parser.add_argument("--frames", type=int, default=FRAMES, help="uint8 frames (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--reps", type=int, default=20, help="calls per side and round (default %(default)s)")
    args = parser.parse_args(argv)
    if args.small:
        args.entries, args.frames, args.rounds, args.reps = 2_000, 200, 3, 3
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.entries} transitions (batch "
        f"{CORE_BATCH}), {args.frames} frames (batch {FRAME_BATCH}); median of {args.rounds} interleaved rounds "
        f"of {args.reps} calls per side"
    )
    print(format_table(run_targets(args.entries, args.frames, args.rounds, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
