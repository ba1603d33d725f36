"""Checkpoint bandwidth against numpy.save / numpy.load on the same disk, and peak RSS of a memmap dump.

Usage::

    python benchmarks/checkpoint_bandwidth.py                  # 1 GB, 5 rounds, in the system temp dir
    python benchmarks/checkpoint_bandwidth.py --quick          # 16 MiB, 2 rounds: checks that it runs
    python benchmarks/checkpoint_bandwidth.py --size-mb 64 --rounds 2 --dir /data/scratch

Each round runs every side once, in an order that alternates between rounds, and the table reports the
median bandwidth of each side and the median of the per-round ratios (ours / numpy). Rows:

- ``dumps``: ``write_checkpoint(path, {"x": t}, {})`` vs ``numpy.save`` of the same bytes, with ``fsync``
  on both sides or on neither;
- ``loads``: ``read_checkpoint(mmap=False)`` (validates, then reads every byte into RAM) vs ``numpy.load``
  (which reads every byte); ``--cold`` evicts both files from the page cache first (``posix_fadvise(DONTNEED)``, this file
  only), otherwise reads come from the page cache;
- ``loads (map only)``: ``read_checkpoint`` vs ``numpy.load(mmap_mode="r")``, both lazy: for information,
  it has no target (a fixed cost of validation, not a bandwidth);
- ``rb.loads, LazyTensorStorage``: ``rb.loads`` of a buffer of core transition data (observation, next
  observation, action, reward, done, terminated) into a fresh ``LazyTensorStorage`` buffer vs ``numpy.load``
  of the same leaves saved as ``.npy`` files (one per leaf); target >= 90% of numpy;
- ``rb.loads, LazyTensorStorage vs one .npy`` and ``... vs a plain read``: the same load vs ``numpy.load`` of
  one ``.npy`` file of the same number of bytes, and vs ``numpy.fromfile`` of that file (a plain read of the
  bytes into fresh memory, nothing parsed); target >= 90% of each. TorchRL loads a RAM storage's checkpoint by
  reading its memory-mapped files into RAM tensors: a plain read of the bytes is what any such load must at
  least do;
- ``rb.loads, LazyMemmapStorage``: the same data into a fresh ``LazyMemmapStorage`` buffer whose
  ``scratch_dir`` is another directory vs ``shutil.copyfile`` of the checkpoint's storage files into a fresh
  directory (the same bytes, the same number of files: what any load into new files must at least do);
  target >= 95% of the copy. Each side's new files are removed right after it is timed (untimed), so the
  other side never waits for their writeback.

The buffer rows are warm: each timed call is the second of two calls of the same side in a row (load the same
checkpoint twice, time the second), unless ``--cold`` evicts every file read before each timed call.

Then the peak resident memory added while a child process dumps a memory-mapped tensor of the same size
(``VmHWM`` after a reset), ours vs ``numpy.save`` of a ``numpy.memmap``. Targets: dumps and loads at >= 70%
of numpy's bandwidth; the memmap dump adds <= 10% of its size to the peak RSS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import ScratchDirs, child_output, has_peak_reset, median_ratio, peak_rss_added, timed  # noqa: E402

from torchrl.data.replay_buffers.checkpointers import read_checkpoint, write_checkpoint  # noqa: E402

TARGET = 0.70
BUFFER_TARGETS = {
    "rb.loads, LazyTensorStorage": 0.90,
    "rb.loads, LazyTensorStorage vs one .npy": 0.90,
    "rb.loads, LazyTensorStorage vs a plain read": 0.90,
    "rb.loads, LazyMemmapStorage": 0.95,
}


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _evict(path: str) -> None:
    """Drops ``path``'s clean pages from the page cache (after an fsync, so all of them are clean)."""
    _fsync_path(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _np_save(file: str, array: np.ndarray, fsync: bool) -> None:
    with open(file, "wb") as f:
        np.save(f, array)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    if fsync:
        _fsync_path(os.path.dirname(file))


def _bench(size: int, rounds: int, workdir: str, cold: bool) -> list[tuple[str, list[float], list[float]]]:
    tensor = torch.randint(0, 256, (size,), dtype=torch.uint8).view(torch.float32)
    array = tensor.numpy()
    ours_path, np_file = os.path.join(workdir, "ckpt"), os.path.join(workdir, "array.npy")
    ours_file = os.path.join(ours_path, "x.memmap")
    rows: dict[str, tuple[list[float], list[float]]] = {}

    def record(row: str, ours: float, theirs: float) -> None:
        rows.setdefault(row, ([], []))
        rows[row][0].append(ours)
        rows[row][1].append(theirs)

    for r in range(rounds):
        ours_first = r % 2 == 0
        for fsync in (False, True):
            sides = [
                lambda fsync=fsync: write_checkpoint(ours_path, {"x": tensor}, {}, fsync=fsync, progress=False),
                lambda fsync=fsync: _np_save(np_file, array, fsync),
            ]
            order = sides if ours_first else sides[::-1]
            times = [timed(fn) for fn in order]
            record(f"dumps, fsync={fsync}", *(times if ours_first else times[::-1]))
        for name, ours_fn, np_fn in (
            ("loads", lambda: read_checkpoint(ours_path, mmap=False, progress=False), lambda: np.load(np_file)),
            ("loads (map only)", lambda: read_checkpoint(ours_path), lambda: np.load(np_file, mmap_mode="r")),
        ):
            times = []
            for fn in (ours_fn, np_fn) if ours_first else (np_fn, ours_fn):
                if cold:
                    _evict(ours_file)
                    _evict(np_file)
                times.append(timed(fn))
            record(name + (", cold" if cold else ", page cache"), *(times if ours_first else times[::-1]))
    return [(name, ours, theirs) for name, (ours, theirs) in rows.items()]


def _transitions(size: int):
    """A TensorDict of about ``size`` bytes of core transition data (float32 observations, bool flags)."""
    from tensordict import TensorDict

    obs = 64
    row = 4 * (2 * obs + 8 + 1) + 2
    n = max(1, size // row)
    return TensorDict(
        observation=torch.randn(n, obs),
        next_observation=torch.randn(n, obs),
        action=torch.randn(n, 8),
        reward=torch.randn(n, 1),
        done=torch.rand(n, 1) < 0.01,
        terminated=torch.rand(n, 1) < 0.01,
        batch_size=[n],
    )


def _files_under(folder: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files)


def _bench_buffers(size: int, rounds: int, workdir: str, cold: bool) -> list[tuple[str, list[float], list[float]]]:
    """``rb.loads`` into a LazyTensorStorage (vs numpy.load) and into a LazyMemmapStorage in another directory
    (vs shutil.copyfile of the same files), the sides of each row alternating in order round by round."""
    import gc

    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

    data = _transitions(size)
    n = data.batch_size[0]
    ckpts = {}
    for kind, make in (("tensor", lambda: LazyTensorStorage(n)),
                       ("memmap", lambda: LazyMemmapStorage(n, scratch_dir=os.path.join(workdir, "mm-src")))):
        rb = ReplayBuffer(storage=make(), batch_size=32)
        rb.extend(data)
        ckpts[kind] = os.path.join(workdir, f"rb-{kind}")
        rb.dumps(ckpts[kind], fsync=False)
        del rb
        gc.collect()
    shutil.rmtree(os.path.join(workdir, "mm-src"), ignore_errors=True)
    np_dir = os.path.join(workdir, "npy")
    os.makedirs(np_dir)
    for i, (_, leaf) in enumerate(sorted(data.items(include_nested=True, leaves_only=True))):
        np.save(os.path.join(np_dir, f"{i}.npy"), leaf.numpy())
    del data
    np_files = _files_under(np_dir)
    storage_files = _files_under(os.path.join(ckpts["memmap"], "storage"))
    nbytes = sum(os.path.getsize(f) for f in storage_files)
    one_npy = os.path.join(workdir, "one.npy")  # the same number of bytes in one file
    np.save(one_npy, np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8))
    scratch = ScratchDirs(workdir)

    def load_tensor():
        rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=32)
        rb.loads(ckpts["tensor"])

    def load_numpy():
        return [np.load(f) for f in np_files]

    def load_one_npy():
        return np.load(one_npy)

    def read_plain():
        return np.fromfile(one_npy, dtype=np.uint8)

    def load_memmap():
        rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=scratch.new("mm-dst")), batch_size=32)
        rb.loads(ckpts["memmap"])

    def copy_files():
        target = scratch.new("copy")
        os.makedirs(target)
        for f in storage_files:
            shutil.copyfile(f, os.path.join(target, os.path.basename(f)))

    cases = (
        ("rb.loads, LazyTensorStorage", load_tensor, load_numpy, _files_under(ckpts["tensor"]), np_files),
        ("rb.loads, LazyTensorStorage vs one .npy", load_tensor, load_one_npy, _files_under(ckpts["tensor"]),
         [one_npy]),
        ("rb.loads, LazyTensorStorage vs a plain read", load_tensor, read_plain, _files_under(ckpts["tensor"]),
         [one_npy]),
        ("rb.loads, LazyMemmapStorage", load_memmap, copy_files, _files_under(ckpts["memmap"]), storage_files),
    )
    rows = {name: ([], []) for name, *_ in cases}

    once = scratch.timed  # frees the loaded buffer and removes its new files after each run

    def run(fn, files) -> float:
        """Warm: the second of two runs in a row. Cold: one run after evicting the files it reads."""
        if cold:
            for f in files:
                _evict(f)
        else:
            once(fn)
        return once(fn)

    os.sync()  # the checkpoints and .npy files reach the disk now, not while a side is timed
    for r in range(rounds):
        for name, ours, theirs, ours_files, their_files in cases:
            sides = [(ours, ours_files), (theirs, their_files)]
            times = [run(*side) for side in (sides if r % 2 == 0 else sides[::-1])]
            rows[name][0].append(times[0] if r % 2 == 0 else times[1])
            rows[name][1].append(times[1] if r % 2 == 0 else times[0])
    return [(name, ours, theirs, nbytes) for name, (ours, theirs) in rows.items()]


def _rss_child(side: str, source: str, target: str, size: int) -> None:
    """Runs in a fresh process: prints the peak RSS (bytes) added by dumping a memmap of ``source``."""
    if side == "ours":
        from tensordict import MemoryMappedTensor

        mapped = MemoryMappedTensor.from_filename(source, torch.uint8, (size,))
    else:
        mapped = np.memmap(source, dtype=np.uint8, mode="r+", shape=(size,))

    def dump() -> None:
        if side == "ours":
            write_checkpoint(target, {"x": mapped}, {}, fsync=False, progress=False)
        else:
            np.save(target, mapped)

    print(peak_rss_added(dump).rss)


def _peak_rss(size: int, workdir: str) -> dict[str, int] | None:
    if not has_peak_reset():
        return None
    source = os.path.join(workdir, "source.memmap")
    with open(source, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.write(block[: size % (1 << 20)])
    out = {}
    for side, target in (("ours", "rss_ckpt"), ("numpy", "rss.npy")):
        out[side] = int(child_output([os.path.abspath(__file__), "--rss-child", side, source,
                                      os.path.join(workdir, target), str(size)]))
    return out


def _buffer_rss_child(size: int, workdir: str) -> None:
    """Runs in a fresh process: fills a LazyMemmapStorage buffer of ``size`` bytes of uint8 frames, then prints
    the peak RSS (bytes) that ``rb.dumps`` adds on top of what the filled buffer already holds."""
    from tensordict import TensorDict

    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    frame = 3 * 96 * 96
    n = max(1, size // frame)
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(workdir, "scratch")), batch_size=32)
    chunk = 4096
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        rb.extend(TensorDict(pixels=torch.randint(0, 256, (k, 3, 96, 96), dtype=torch.uint8), batch_size=[k]))
    added = peak_rss_added(lambda: rb.dumps(os.path.join(workdir, "rb_ckpt"), fsync=False)).rss
    print(n * frame, added)


def _buffer_reference(name: str) -> str:
    if "plain read" in name:
        return "numpy.fromfile"
    if "one .npy" in name:
        return "numpy.load, 1 file"
    return "numpy.load" if "Tensor" in name else "shutil.copyfile"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="bytes written per side, in MiB (default 1024)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--dir", default=None, help="where files go (default: the system temp dir)")
    parser.add_argument("--cold", action="store_true", help="evict the files from the page cache before reads")
    parser.add_argument("--cases", choices=("all", "format", "buffers"), default="all",
                        help="the format rows and peak RSS, the rb.loads rows, or both (default all)")
    parser.add_argument("--quick", action="store_true", help="16 MiB, 2 rounds: checks that the script runs")
    parser.add_argument("--rss-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--buffer-rss-mb", type=int, default=None,
                        help="only measure the peak RSS that rb.dumps adds for a LazyMemmapStorage buffer of this size")
    parser.add_argument("--buffer-rss-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mb, args.rounds = 16, 2
    if args.buffer_rss_child:
        _buffer_rss_child(int(args.buffer_rss_child[0]), args.buffer_rss_child[1])
        return
    if args.buffer_rss_mb:
        workdir = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
        try:
            out = child_output([os.path.abspath(__file__), "--buffer-rss-child", str(args.buffer_rss_mb << 20),
                                workdir]).split()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        size, added = int(out[-2]), int(out[-1])
        print(f"rb.dumps of a {size / 2**30:.2f} GiB LazyMemmapStorage buffer: peak RSS added "
              f"{added / 2**20:.1f} MiB ({100 * added / size:.2f}% of its size; target <= 10%)")
        return
    if args.rss_child:
        side, source, target, size = args.rss_child
        _rss_child(side, source, target, int(size))
        return
    if args.size_mb <= 0 or args.rounds <= 0:
        parser.error(f"`--size-mb` and `--rounds` must be positive; got {args.size_mb} and {args.rounds}.")
    size = args.size_mb << 20
    workdir = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    rows, buffer_rows, rss = [], [], None
    try:
        if args.cases in ("all", "format"):
            rows = _bench(size, args.rounds, workdir, args.cold)
            rss = _peak_rss(size, workdir)
        if args.cases in ("all", "buffers"):
            buffer_rows = _bench_buffers(size, args.rounds, workdir, args.cold)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.size_mb} MiB, {args.rounds} rounds, in {args.dir or tempfile.gettempdir()}")
    print(f"{'operation':<50} {'ours MB/s':>10} {'ref MB/s':>9} {'ratio':>7} {'target':>7}  ok  reference")
    table = [(name, ours, theirs, size, "numpy") for name, ours, theirs in rows]
    table += [(name, ours, theirs, nbytes, _buffer_reference(name)) for name, ours, theirs, nbytes in buffer_rows]
    for name, ours, theirs, nbytes, reference in table:
        ratio = median_ratio(theirs, ours)
        bw_ours, bw_ref = (nbytes / 1e6 / statistics.median(t) for t in (ours, theirs))
        target = None if "map only" in name else BUFFER_TARGETS.get(name, TARGET)
        if "rb.loads" in name and not args.cold:
            name += ", warm"
        check = "-" if target is None else "yes" if ratio >= target else "NO"
        target_text = "-" if target is None else f"{target:.2f}"
        print(f"{name:<50} {bw_ours:>10.0f} {bw_ref:>9.0f} {ratio:>7.2f} {target_text:>7}  {check:<3} {reference}")
    if rss is not None:
        print(f"\npeak RSS added while dumping a {args.size_mb} MiB memmap (target <= 10% of its size):")
        for side, added in rss.items():
            print(f"  {side:<6} {added / 2**20:8.1f} MiB  ({100 * added / size:5.1f}%)")


if __name__ == "__main__":
    main()
