"""Checkpoints of memory-mapped and RAM buffers: incremental vs full dumps, re-dumps vs first dumps, loads vs a
file copy, durable saves vs copy+fsync.

Usage::

    python benchmarks/checkpoint_incremental.py                  # 1 GiB buffers, 5 rounds, in the system temp dir
    python benchmarks/checkpoint_incremental.py --quick          # 16 MiB, 2 rounds: checks that it runs
    python benchmarks/checkpoint_incremental.py --size-mb 64 --rounds 2 --dir /data/scratch

The buffers are ``ReplayBuffer`` s over a ``LazyMemmapStorage`` and over a ``LazyTensorStorage`` (RAM, private
memory), filled with core transition data (observation, next observation, action, reward, done, terminated;
~550 bytes a row). Each round times every row's two sides once, in an order that alternates between rounds; the
table reports the median of each side and the median of the per-round ratios. Rows:

- ``dumps, 1% new rows`` (memory-mapped) and ``RAM dumps, 1% new rows`` (``LazyTensorStorage``):
  ``rb.dumps(path)`` onto the buffer's own checkpoint after ``extend`` of 1% of the capacity (the incremental
  dump: only those rows and the metadata are written) vs ``rb.dumps(other, incremental=False)`` of the same
  buffer (every row, onto its own previous full checkpoint), both with ``fsync=True``; target: the incremental
  dump takes <= 10% of the full one;
- ``RAM re-dump vs first dump``: that incremental re-dump vs the first dump of the same buffer into a new
  directory (every row, nothing to replace); target: the re-dump is not slower (<= 1.00);
- ``rb.loads into another dir``: ``rb.loads`` of the full checkpoint into a fresh ``LazyMemmapStorage`` buffer
  whose ``scratch_dir`` is a new directory vs ``shutil.copyfile`` of the checkpoint's storage files into a new
  directory (the same bytes and files); target: >= 80% of the copy's bandwidth;
- ``durable rb.dumps``: ``rb.dumps(new path, fsync=True)`` (a full dump into a new directory) vs
  ``shutil.copyfile`` + ``fsync`` of the storage's files into a new directory plus a directory fsync (the floor
  of any durable save of these bytes); the ratio is reported (TorchRL's unsynced ``dumps`` is the bar the issue
  sets, not measured here).

New directories are removed right after each timed call (untimed), so no side waits for another's writeback.
``--load-threads 1`` measures loads copied by one thread (the default copies large loads with up to 4).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import ScratchDirs, median_ratio  # noqa: E402

TARGETS = {
    "dumps, 1% new rows": 0.10,
    "RAM dumps, 1% new rows": 0.10,
    "RAM re-dump vs first dump": 1.00,
    "rb.loads into another dir": 0.80,
    "durable rb.dumps": None,
}
#: rows whose ratio is ours / reference time (lower is better); the others compare bandwidths
_TIME_ROWS = ("dumps, 1% new rows", "RAM dumps, 1% new rows", "RAM re-dump vs first dump")
_OBS = 64


def _rows(n: int, start: int):
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(start)
    return TensorDict(
        observation=torch.randn(n, _OBS, generator=g),
        next_observation=torch.randn(n, _OBS, generator=g),
        action=torch.randn(n, 8, generator=g),
        reward=torch.randn(n, 1, generator=g),
        done=torch.rand(n, 1, generator=g) < 0.01,
        terminated=torch.rand(n, 1, generator=g) < 0.01,
        batch_size=[n],
    )


def _capacity(size: int) -> int:
    return max(100, size // (4 * (2 * _OBS + 8 + 1) + 2))


def _fill(rb, n: int) -> None:
    chunk = 65536
    for start in range(0, n, chunk):
        rb.extend(_rows(min(chunk, n - start), start))


def _files_under(folder: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)


def _copy(files: list[str], target: str, fsync: bool) -> None:
    os.makedirs(target)
    for f in files:
        out = os.path.join(target, os.path.basename(f))
        shutil.copyfile(f, out)
        if fsync:
            fd = os.open(out, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    if fsync:
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _full_dump(rb, path: str) -> None:
    """``rb.dumps(path)`` writing every row (the storage's checkpointer set to ``incremental=False``)."""
    from torchrl.data import TensorStorageCheckpointer

    rb.storage.checkpointer = TensorStorageCheckpointer(incremental=False)
    try:
        rb.dumps(path)
    finally:
        rb.storage.checkpointer = None


def _bench(size: int, rounds: int, workdir: str) -> tuple[list[tuple[str, list[float], list[float]]], int, int]:
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

    n = _capacity(size)
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(workdir, "live")), batch_size=32)
    _fill(rb, n)
    incremental, full = os.path.join(workdir, "ckpt-inc"), os.path.join(workdir, "ckpt-full")
    rb.dumps(incremental)
    rb.dumps(full)
    ram = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=32)
    _fill(ram, n)
    ram_incremental, ram_full = os.path.join(workdir, "ram-inc"), os.path.join(workdir, "ram-full")
    ram.dumps(ram_incremental)
    ram.dumps(ram_full)
    storage_files = _files_under(os.path.join(full, "storage"))
    nbytes = sum(os.path.getsize(f) for f in storage_files)
    step = max(1, n // 100)
    scratch = ScratchDirs(workdir)
    rows = {name: ([], []) for name in TARGETS}
    os.sync()

    def load_memmap():
        fresh = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=scratch.new("mm-dst")), batch_size=32)
        fresh.loads(full)

    cases = {
        "rb.loads into another dir": (load_memmap, lambda: _copy(storage_files, scratch.new("copy"), False)),
        "durable rb.dumps": (
            lambda: rb.dumps(scratch.new("dump"), fsync=True),
            lambda: _copy(_files_under(os.path.join(workdir, "live")), scratch.new("copy"), True),
        ),
    }
    def record(name: str, ours, theirs, first: bool) -> None:
        times = [scratch.timed(fn) for fn in ((ours, theirs) if first else (theirs, ours))]
        rows[name][0].append(times[0] if first else times[1])
        rows[name][1].append(times[1] if first else times[0])

    for r in range(rounds):
        first = r % 2 == 0
        rb.extend(_rows(step, 1_000_000 + r))  # 1% of the capacity: new rows since the last dumps
        record("dumps, 1% new rows", lambda: rb.dumps(incremental), lambda: _full_dump(rb, full), first)
        ram.extend(_rows(step, 2_000_000 + r))
        record("RAM dumps, 1% new rows", lambda: ram.dumps(ram_incremental), lambda: _full_dump(ram, ram_full), first)
        ram.extend(_rows(step, 3_000_000 + r))
        record("RAM re-dump vs first dump", lambda: ram.dumps(ram_incremental),
               lambda: ram.dumps(scratch.new("ram-first")), first)
        for name, (ours, theirs) in cases.items():
            scratch.timed(ours if first else theirs)  # warm-up of the side that goes first (page cache)
            times = [scratch.timed(fn) for fn in ((ours, theirs) if first else (theirs, ours))]
            rows[name][0].append(times[0] if first else times[1])
            rows[name][1].append(times[1] if first else times[0])
        gc.collect()
    return [(name, *sides) for name, sides in rows.items()], nbytes, step


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="buffer bytes, in MiB (default 1024)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--dir", default=None, help="where files go (default: the system temp dir)")
    parser.add_argument("--load-threads", type=int, default=None,
                        help="threads of rb.loads copies (default: the library's, min(4, cores))")
    parser.add_argument("--quick", action="store_true", help="16 MiB, 2 rounds: checks that the script runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mb, args.rounds = 16, 2
    if args.load_threads is not None:
        from torchrl.data.replay_buffers.storages import _checkpoint as storage_checkpoint

        storage_checkpoint.LOAD_THREADS = args.load_threads
    if args.size_mb <= 0 or args.rounds <= 0:
        parser.error(f"`--size-mb` and `--rounds` must be positive; got {args.size_mb} and {args.rounds}.")
    workdir = tempfile.mkdtemp(prefix="ckpt-inc-bench-", dir=args.dir)
    try:
        table, nbytes, step = _bench(args.size_mb << 20, args.rounds, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{nbytes / 2**20:.0f} MiB of storage files, {args.rounds} rounds, {step} new rows per round, in "
          f"{args.dir or tempfile.gettempdir()}")
    print(f"{'operation':<28} {'ours':>12} {'reference':>12} {'ratio':>7} {'target':>8}  ok  reference")
    for name, ours, theirs in table:
        if name in _TIME_ROWS:  # times: lower is better, the ratio is ours / the reference dump
            ratio = statistics.median(o / t for o, t in zip(ours, theirs))
            cells = f"{statistics.median(ours) * 1e3:>9.1f} ms {statistics.median(theirs) * 1e3:>9.1f} ms"
            ok = ratio <= TARGETS[name]
            reference = "the first dump" if "first" in name else "the full dump"
        else:  # bandwidths: higher is better, the ratio is ours / reference
            ratio = median_ratio(theirs, ours)
            bw = [nbytes / 1e6 / statistics.median(t) for t in (ours, theirs)]
            cells = f"{bw[0]:>7.0f} MB/s {bw[1]:>7.0f} MB/s"
            ok = TARGETS[name] is None or ratio >= TARGETS[name]
            reference = "shutil.copyfile" + (" + fsync" if "durable" in name else "")
        target = "-" if TARGETS[name] is None else (f"<={TARGETS[name]:.2f}" if name in _TIME_ROWS
                                                    else f">={TARGETS[name]:.2f}")
        check = "-" if TARGETS[name] is None else "yes" if ok else "NO"
        print(f"{name:<28} {cells} {ratio:>7.2f} {target:>8}  {check:<3} {reference}")


if __name__ == "__main__":
    main()
