"""Speed of the replay-buffer hot paths on two source trees, measured in one interleaved run (issues 24, 25).

Usage (on an otherwise idle machine; ``/tmp/rb_before`` a checkout of the code before the change, e.g. made
with ``git worktree add /tmp/rb_before <rev>``)::

    .venv/bin/python benchmarks/layout_before_after.py --before /tmp/rb_before --after .
    .venv/bin/python benchmarks/layout_before_after.py --before /tmp/rb_before --after . --smoke  # a quick check

Operations (public ``torchrl.data`` names only, so the same code runs on both trees); the data is TensorDict
rows of float fields (``obs: f32[84]``, ``action: f32[4]``, ``reward: f32[1]``, ``("next", "obs"): f32[84]``):

- ``rb.sample()``: a ``ReplayBuffer`` over a ``LazyTensorStorage`` of ``--rows`` rows (default 100k), uniform
  sampling, batch 256;
- ``rb.extend(200 rows)``: batches of 200 rows written into a full buffer of the same kind (the ring wraps);
- ``PER sample + update_priority``: a ``TensorDictPrioritizedReplayBuffer`` (alpha 0.7, beta 0.5) of
  ``--rows`` rows, batch 256: ``rb.sample()`` then ``rb.update_priority(batch["index"], td_error)``;
- ``SliceSampler sample``: a ``TensorDictReplayBuffer`` over a ``LazyTensorStorage`` of ``--rows`` rows holding
  episodes of 100 steps (``("next", "done")``), ``SliceSampler(slice_len=32)``, batch 256 (8 slices);
- ``rb.dumps`` / ``rb.loads``: a ``ReplayBuffer`` over a ``LazyMemmapStorage`` of about ``--memmap-mb`` MiB
  (default 100), dumped into a new directory (``fsync=False`` unless ``--fsync``), and loaded into a fresh
  ``LazyMemmapStorage`` buffer with its own scratch directory; the new directories are removed (untimed)
  after each call.

Each side runs in its own child process: this file with ``--child``, ``PYTHONPATH`` set to the side's tree
(the child checks that ``torchrl`` came from there), the interpreter that runs this script, ``--threads`` torch
threads (default 1). A round starts one child per side, in an order that alternates between rounds (before
then after, after then before, ...). A child builds the buffers, warms each operation up, times
``--repeats`` blocks of ``--number`` calls (``--io-repeats`` single calls for dumps/loads) and reports the
median time per call of each operation.

The table: per operation, the median of the round medians of each side, their ratio after / before (< 1 is
faster after), each side's spread (max - min of its round medians, in % of their median) and the range of
the per-round ratios (the two children of a round side by side). Read the ratios against the spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from _timing import ScratchDirs, child_output, repeat

OPERATIONS = (
    "rb.sample(), uniform, batch 256",
    "rb.extend(200 rows)",
    "PER sample + update_priority",
    "SliceSampler sample, 8 x 32",
    "rb.dumps, LazyMemmapStorage",
    "rb.loads, LazyMemmapStorage",
)
FULL = {"rows": 100_000, "memmap_mb": 100, "rounds": 6, "repeats": 30, "number": 100, "io_repeats": 5}
SMOKE = {"rows": 2_000, "memmap_mb": 2, "rounds": 2, "repeats": 3, "number": 5, "io_repeats": 2}
BATCH = 256
EXTEND_ROWS = 200


# -- the child: one side, one round ------------------------------------------------------------------------------


def _rows(n: int):
    import torch
    from tensordict import TensorDict

    return TensorDict(
        {"obs": torch.randn(n, 84), "action": torch.randn(n, 4), "reward": torch.randn(n, 1),
         ("next", "obs"): torch.randn(n, 84)},
        batch_size=[n],
    )


def _fill(rb, n: int, chunk: int = 10_000) -> None:
    for start in range(0, n, chunk):
        rb.extend(_rows(min(chunk, n - start)))


def _fast(fn, config: dict) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` blocks of ``number`` calls, after a warm-up."""
    for _ in range(max(10, config["number"])):  # first allocations, caches
        fn()
    return statistics.median(repeat(fn, config["repeats"], config["number"]))


def _uniform_sample(config: dict) -> float:
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(config["rows"]), batch_size=BATCH)
    _fill(rb, config["rows"])
    return _fast(rb.sample, config)


def _extend(config: dict) -> float:
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(config["rows"]), batch_size=BATCH)
    _fill(rb, config["rows"])
    new_rows = _rows(EXTEND_ROWS)
    return _fast(lambda: rb.extend(new_rows), config)


def _prioritized_step(config: dict) -> float:
    import torch

    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(config["rows"]),
                                           batch_size=BATCH)
    _fill(rb, config["rows"])
    td_error = torch.rand(BATCH)

    def step() -> None:
        batch = rb.sample()
        rb.update_priority(batch["index"], td_error)

    return _fast(step, config)


def _slice_sample(config: dict) -> float:
    import torch

    from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(config["rows"]), sampler=SliceSampler(slice_len=32),
                                batch_size=BATCH)
    for start in range(0, config["rows"], 10_000):
        rows = _rows(min(10_000, config["rows"] - start))
        done = torch.zeros(rows.shape[0], 1, dtype=torch.bool)
        done[99::100] = True
        rows["next", "done"] = done
        rb.extend(rows)
    return _fast(rb.sample, config)


def _dumps_loads(config: dict) -> tuple[float, float, int]:
    """Median seconds of ``rb.dumps`` and of ``rb.loads`` of a LazyMemmapStorage buffer, and its bytes."""
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    workdir, fsync = config["workdir"], config["fsync"]
    row_bytes = _rows(1).bytes()
    n = max(1, (config["memmap_mb"] << 20) // row_bytes)
    scratch = ScratchDirs(workdir)

    def median_once(fn) -> float:
        scratch.timed(fn)  # warm-up
        return statistics.median(scratch.timed(fn) for _ in range(config["io_repeats"]))

    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(workdir, "source")), batch_size=BATCH)
    _fill(rb, n)
    dumps = median_once(lambda: rb.dumps(scratch.new("dumps"), fsync=fsync, progress=False))
    checkpoint = os.path.join(workdir, "checkpoint")
    rb.dumps(checkpoint, fsync=fsync, progress=False)

    def load() -> None:
        target = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=scratch.new("loads")), batch_size=BATCH)
        target.loads(checkpoint)

    return dumps, median_once(load), n * row_bytes


def child(config: dict) -> dict:
    """Times every operation with the ``torchrl`` on ``sys.path``; returns the median seconds per call."""
    import torch

    import torchrl

    torch.set_num_threads(config["threads"])
    torch.manual_seed(0)
    medians = {
        OPERATIONS[0]: _uniform_sample(config),
        OPERATIONS[1]: _extend(config),
        OPERATIONS[2]: _prioritized_step(config),
        OPERATIONS[3]: _slice_sample(config),
    }
    medians[OPERATIONS[4]], medians[OPERATIONS[5]], nbytes = _dumps_loads(config)
    return {"torchrl": os.path.dirname(os.path.abspath(torchrl.__file__)), "torch": torch.__version__,
            "memmap_bytes": nbytes, "medians": medians}


# -- the parent: interleaved rounds, the table -------------------------------------------------------------------


def _run_side(tree: str, config: dict, parent_dir: str) -> dict:
    """One child process on ``tree``: its result, after checking that it imported that tree's torchrl."""
    workdir = tempfile.mkdtemp(prefix="side-", dir=parent_dir)
    try:
        env = dict(os.environ, PYTHONPATH=tree)
        line = child_output([os.path.abspath(__file__), "--child", json.dumps(dict(config, workdir=workdir))],
                            env=env, cwd=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = json.loads(line)
    expected = os.path.join(os.path.realpath(tree), "torchrl")
    if os.path.realpath(result["torchrl"]) != expected:
        raise SystemExit(f"the child for {tree} imported torchrl from {result['torchrl']}, not {expected}")
    return result


def _time_text(seconds: float) -> str:
    if seconds >= 0.1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _spread(values: list[float]) -> float:
    return 100 * (max(values) - min(values)) / statistics.median(values)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the source tree before the change (holds torchrl/)")
    parser.add_argument("--after", help="the source tree after the change (holds torchrl/)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and 2 rounds: checks that it runs")
    parser.add_argument("--rows", type=int, help=f"rows of the in-memory buffers (default {FULL['rows']})")
    parser.add_argument("--memmap-mb", type=int, help=f"MiB of the dumped buffer (default {FULL['memmap_mb']})")
    parser.add_argument("--rounds", type=int, help=f"rounds, one child per side each (default {FULL['rounds']})")
    parser.add_argument("--repeats", type=int, help=f"timed blocks per fast operation (default {FULL['repeats']})")
    parser.add_argument("--number", type=int, help=f"calls per block (default {FULL['number']})")
    parser.add_argument("--io-repeats", type=int, help=f"timed dumps/loads calls (default {FULL['io_repeats']})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the children (default 1)")
    parser.add_argument("--fsync", action="store_true", help="rb.dumps with fsync=True (default False)")
    parser.add_argument("--dir", default=None, help="where the files go (default: the system temp dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if not args.before or not args.after:
        parser.error("`--before` and `--after` are required (two source trees, each holding torchrl/).")
    for tree in (args.before, args.after):
        if not os.path.isfile(os.path.join(tree, "torchrl", "__init__.py")):
            parser.error(f"{tree!r} holds no torchrl/__init__.py.")
    config = dict(SMOKE if args.smoke else FULL)
    for key in config:
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if min(config.values()) <= 0 or args.threads <= 0:
        parser.error(f"the sizes, counts and --threads must be positive; got {config}, threads {args.threads}.")
    rounds = config.pop("rounds")
    config.update(threads=args.threads, fsync=args.fsync)
    sides = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}

    parent_dir = tempfile.mkdtemp(prefix="layout-bench-", dir=args.dir)
    results: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        for r in range(rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                results[side].append(_run_side(sides[side], config, parent_dir))
                print(f"  round {r + 1}/{rounds}: {side} done", file=sys.stderr)
    finally:
        shutil.rmtree(parent_dir, ignore_errors=True)

    first = results["before"][0]
    print(f"\nbefore: {sides['before']}\nafter:  {sides['after']}")
    print(f"torch {first['torch']}, {args.threads} thread(s); {config['rows']} rows in memory, "
          f"{first['memmap_bytes'] / 2**20:.0f} MiB dumped (fsync={args.fsync}); {rounds} rounds, one child per "
          f"side each, order alternating; fast operations: median of {config['repeats']} blocks of "
          f"{config['number']} calls, dumps/loads: median of {config['io_repeats']} calls")
    print(f"{'operation':<34} {'before':>10} {'after':>10} {'after/before':>13} {'spread b':>9} {'spread a':>9}"
          f"  {'round ratios':>13}")
    for name in OPERATIONS:
        before = [res["medians"][name] for res in results["before"]]
        after = [res["medians"][name] for res in results["after"]]
        b, a = statistics.median(before), statistics.median(after)
        paired = [x / y for x, y in zip(after, before)]
        print(f"{name:<34} {_time_text(b):>10} {_time_text(a):>10} {a / b:>13.3f} {_spread(before):>8.1f}% "
              f"{_spread(after):>8.1f}%  {min(paired):.3f}-{max(paired):.3f}")


if __name__ == "__main__":
    main()
