"""Export to / import from Hugging Face datasets: bandwidth against the plain ``datasets`` path and ``rb.dumps``/
``rb.loads``, and the peak RSS of exporting a large memory-mapped buffer.

Usage::

    python benchmarks/hf_exchange.py                          # 1 GiB of core transitions, 3 rounds
    python benchmarks/hf_exchange.py --size-mb 64 --rounds 2  # a quick look
    python benchmarks/hf_exchange.py --only import            # only the import rows
    python benchmarks/hf_exchange.py --rss-gb 4               # only: peak RSS of exporting a 4 GiB memmap buffer

The data is core transition data in TED layout (observation and next observation of 64 float32, an action of 8
float32, reward, done and terminated flags), about ``--size-mb`` MiB, in a ``LazyTensorStorage`` buffer. Each
round runs every side of a row once, in an order that alternates between rounds; the table reports the
median bandwidth of each side and the median of the per-round ratios (reference time / our time, so > 1 means
we are faster). Rows:

- ``export vs datasets``: ``rb.export_hf(path, fsync=False)`` vs ``datasets.Dataset.from_dict(arrays,
  features=...).save_to_disk(path)`` of the same numpy arrays with the same features (target >= 0.50);
- ``export vs rb.dumps``: the same export vs ``rb.dumps(path, fsync=False)`` (for information);
- ``import vs rb.loads``: ``ReplayBuffer.from_hf(path, storage=LazyTensorStorage(n))`` vs ``rb.loads`` of the
  checkpoint into a fresh ``LazyTensorStorage`` buffer (target >= 0.50: within 2x of ``rb.loads``);
- ``import vs datasets numpy``: the same import vs ``load_from_disk(path).with_format("numpy")[:]`` (every
  column read into numpy arrays; for information).

Each side writes a new directory, removed (untimed) right after it is timed; reads come from the page cache.

``--rss-gb N`` instead fills a ``LazyMemmapStorage`` buffer of N GiB of uint8 frames in a child process and
measures what ``rb.export_hf`` adds to its peak resident memory (``VmHWM`` after a reset), and the peak of its
anonymous memory (``RssAnon``, sampled every 5 ms), which excludes the pages of the memory-mapped files it reads.
Target: the anonymous growth stays under 512 MiB for 4 GiB. It needs about 2 N GiB of free disk in ``--dir``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import ScratchDirs, child_output, has_peak_reset, median_ratio, peak_rss_added  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer  # noqa: E402

TARGETS = {"export vs datasets": 0.50, "import vs rb.loads": 0.50}
OBS = 64


def transitions(size: int) -> TensorDict:
    """About ``size`` bytes of core transition data in TED layout."""
    row = 4 * (2 * OBS + 8 + 1) + 2
    n = max(1, size // row)
    return TensorDict(
        observation=torch.randn(n, OBS),
        action=torch.randn(n, 8),
        next=TensorDict(observation=torch.randn(n, OBS), reward=torch.randn(n, 1), done=torch.rand(n, 1) < 0.01,
                        terminated=torch.rand(n, 1) < 0.01, batch_size=[n]),  # fmt: skip
        batch_size=[n],
    )


def bench(size: int, rounds: int, workdir: str, only: str | None = None) -> tuple[list, int]:
    import datasets

    data = transitions(size)
    n = data.batch_size[0]
    nbytes = sum(v.numel() * v.element_size() for v in data.values(True, True))
    rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=32)
    rb.extend(data)
    features = rb.export_hf(os.path.join(workdir, "probe"), fsync=False).features
    arrays = {".".join((k,) if isinstance(k, str) else k): v.numpy()
              for k, v in data.items(include_nested=True, leaves_only=True)}  # fmt: skip
    export_src = os.path.join(workdir, "export-src")
    rb.export_hf(export_src, fsync=False)
    ckpt = os.path.join(workdir, "ckpt")
    rb.dumps(ckpt, fsync=False)
    shutil.rmtree(os.path.join(workdir, "probe"))
    scratch = ScratchDirs(workdir)

    sides = {
        "export": lambda: rb.export_hf(scratch.new("export"), fsync=False),
        "datasets": lambda: datasets.Dataset.from_dict(arrays, features=features).save_to_disk(scratch.new("plain")),
        "rb.dumps": lambda: rb.dumps(scratch.new("dumps"), fsync=False),
        "import": lambda: ReplayBuffer.from_hf(export_src, storage=LazyTensorStorage(n)),
        "rb.loads": lambda: ReplayBuffer(storage=LazyTensorStorage(n), batch_size=32).loads(ckpt),
        "datasets numpy": lambda: datasets.load_from_disk(export_src).with_format("numpy")[:],
    }
    cases = [("export vs datasets", "export", "datasets"), ("export vs rb.dumps", "export", "rb.dumps"),
             ("import vs rb.loads", "import", "rb.loads"), ("import vs datasets numpy", "import", "datasets numpy")]

    if only is not None:  # the rows whose name holds `only`, and only their sides
        cases = [case for case in cases if only in case[0]]
        if not cases:
            raise SystemExit(f"--only {only!r} matches no row; the rows are: export vs datasets, export vs "
                             f"rb.dumps, import vs rb.loads, import vs datasets numpy.")
        sides = {name: fn for name, fn in sides.items() if any(name in case[1:] for case in cases)}

    def once(name: str) -> float:
        return scratch.timed(sides[name])  # then drops the new files: spares the next side their writeback

    for name in sides:  # warm-up: imports, page cache
        once(name)
    rows = {case: ([], []) for case, *_ in cases}
    for r in range(rounds):
        for case, ours, ref in cases:
            order = (ours, ref) if r % 2 == 0 else (ref, ours)
            times = dict(zip(order, (once(side) for side in order)))
            rows[case][0].append(times[ours])
            rows[case][1].append(times[ref])
    return [(case, *times) for case, times in rows.items()], nbytes


def rss_child(size: int, workdir: str) -> None:
    """In a fresh process: fills a LazyMemmapStorage of ``size`` bytes, exports it, prints the growth of the
    peak RSS and of the peak anonymous RSS during the export, in bytes."""
    frame = 3 * 96 * 96
    n = max(1, size // frame)
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(workdir, "scratch")), batch_size=32)
    chunk = 2048
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        rb.extend(TensorDict(pixels=torch.randint(0, 256, (k, 3, 96, 96), dtype=torch.uint8),
                             action=torch.randn(k, 4), batch_size=[k]))  # fmt: skip
    gc.collect()
    added = peak_rss_added(lambda: rb.export_hf(os.path.join(workdir, "export"), fsync=False), anonymous=True)
    print(n * (frame + 16), added.rss, added.anonymous, added.seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB of transition data (default 1024)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--dir", default=None, help="where files go (default: the system temp dir)")
    parser.add_argument("--only", default=None,
                        help="only the rows whose name contains this text, e.g. --only import")
    parser.add_argument("--rss-gb", type=float, default=None,
                        help="only measure the peak RSS of exporting a LazyMemmapStorage buffer of this many GiB")
    parser.add_argument("--rss-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(int(args.rss_child[0]), args.rss_child[1])
        return
    if args.rss_gb is not None:
        if args.rss_gb <= 0 or not has_peak_reset():
            parser.error("`--rss-gb` must be positive, on Linux (it reads /proc/self/status).")
        workdir = tempfile.mkdtemp(prefix="hf-bench-", dir=args.dir)
        try:
            out = child_output([os.path.abspath(__file__), "--rss-child", str(int(args.rss_gb * 2**30)),
                                workdir]).split()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        size, hwm, anon, elapsed = int(out[-4]), int(out[-3]), int(out[-2]), float(out[-1])
        ok = "yes" if anon < 512 * 2**20 else "NO"
        print(f"export_hf of a {size / 2**30:.2f} GiB LazyMemmapStorage buffer in {elapsed:.1f} s "
              f"({size / 1e6 / elapsed:.0f} MB/s):")
        print(f"  peak RSS added        {hwm / 2**20:8.1f} MiB (includes pages of the memory-mapped source)")
        print(f"  peak anonymous added  {anon / 2**20:8.1f} MiB (target < 512 MiB: {ok})")
        return
    if args.size_mb <= 0 or args.rounds <= 0:
        parser.error(f"`--size-mb` and `--rounds` must be positive; got {args.size_mb} and {args.rounds}.")
    workdir = tempfile.mkdtemp(prefix="hf-bench-", dir=args.dir)
    try:
        rows, nbytes = bench(args.size_mb << 20, args.rounds, workdir, args.only)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{nbytes / 2**20:.0f} MiB of transitions, {args.rounds} rounds, in {args.dir or tempfile.gettempdir()}")
    print(f"{'row':<26} {'ours MB/s':>10} {'ref MB/s':>9} {'ratio':>7} {'target':>7}  ok")
    for case, ours, ref in rows:
        ratio = median_ratio(ref, ours)
        bw_ours, bw_ref = (nbytes / 1e6 / statistics.median(t) for t in (ours, ref))
        target = TARGETS.get(case)
        check = "-" if target is None else "yes" if ratio >= target else "NO"
        target_text = "-" if target is None else f"{target:.2f}"
        print(f"{case:<26} {bw_ours:>10.0f} {bw_ref:>9.0f} {ratio:>7.2f} {target_text:>7}  {check}")


if __name__ == "__main__":
    np.random.seed(0)
    torch.manual_seed(0)
    main()
