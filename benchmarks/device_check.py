"""The GPU checks of issue 39 in one script, about 5 minutes on one GPU.

Usage::

    python benchmarks/device_check.py                      # capacity 10^6
    python benchmarks/device_check.py --capacity 100000 --seconds 0.5
    python benchmarks/device_check.py --device cpu --capacity 4096 --steps 20   # a smoke run of the code paths

Without a CUDA device it prints ``no CUDA device`` and exits 0. With one, each check runs on its own (a failure
is printed and the others still run) and the exit code is 1 if any failed:

- ``sync-free <sampler>``: 1000 ``sample()`` (+ ``update_priority`` for the prioritized sampler) of 256 under
  ``torch.cuda.set_sync_debug_mode("error")``, on ``TensorDictReplayBuffer(LazyTensorStorage(capacity,
  device="cuda"))`` with ``RandomSampler``, ``SamplerWithoutReplacement``, ``PrioritizedSampler(capacity, 0.7, 0.5,
  device="cuda")`` and ``SliceSampler(num_slices=8, traj_key="episode")``; the buffer is filled and drawn from once
  before the mode is set. ``sync-free extend(64)``: 100 writes of 64 rows under the same mode;
- ``compiled step``: ``torch.compile(step, mode="reduce-overhead")`` (CUDA graphs) of ``extend(64 rows); sample(256)``
  on ``TensorDictReplayBuffer(LazyTensorStorage(1000, device="cuda", compilable=True), compilable=True)``: equal to
  eager over ``--steps`` steps from the same seed (``fallback_random`` so that compiled random ops draw as eager
  ones), and steps/s of both;
- a table of ``sample()`` calls per second (batch 256; prioritized: ``sample`` + ``update_priority``) on ``cuda``
  and ``cpu`` storages of ``capacity`` rows, and whether TorchRL's compiled CUDA tree (``torchrl._torchrl``) is
  there to compare with.

``--device cpu`` runs the same code on the CPU (no sync debug mode, no CUDA graphs) to check the script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback

import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
)

BATCH = 256
EPISODE = 100  # steps per episode in the filled storage (slice draws)
_NO_SYNC_MODE = " (cpu: no sync debug mode)"


def rows(n: int, device, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n, device=device)
    return TensorDict(obs=torch.randn(n, 4, device=device), episode=ids // EPISODE, batch_size=[n], device=device)


def make_sampler(kind: str, capacity: int, device):
    if kind == "uniform":
        return RandomSampler()
    if kind == "without replacement":
        return SamplerWithoutReplacement()
    if kind == "prioritized":
        return PrioritizedSampler(capacity, 0.7, 0.5, device=device)
    if kind == "slice":
        return SliceSampler(num_slices=8, traj_key="episode")
    raise ValueError(kind)


def filled_buffer(kind: str, capacity: int, device) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device),
                                sampler=make_sampler(kind, capacity, device), batch_size=BATCH)
    rb.extend(rows(capacity, device))
    return rb


def draw(rb: TensorDictReplayBuffer, kind: str):
    batch = rb.sample()
    if kind == "prioritized":
        rb.update_priority(batch["index"], torch.rand(BATCH, device=batch["obs"].device) + 0.1)
    return batch


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def sync_debug_error(device):
    """``torch.cuda.set_sync_debug_mode("error")`` inside: any host sync raises. Nothing on the CPU."""
    if torch.device(device).type != "cuda":
        yield
        return
    synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


# -- the checks: each returns a list of (check, result) lines ----------------------------------------------------------
def check_sync_free(kind: str, args) -> list[tuple[str, str]]:
    rb = filled_buffer(kind, args.capacity, args.device)
    draw(rb, kind)  # first draw outside the mode (lazy indexes are built here)
    with sync_debug_error(args.device):
        for _ in range(1000):
            draw(rb, kind)
    synchronize(args.device)
    what = "1000 draws" + (" + update_priority" if kind == "prioritized" else "")
    return [(f"sync-free {kind}", f"ok: {what}{_NO_SYNC_MODE if args.device == 'cpu' else ''}")]


def check_sync_free_extend(args) -> list[tuple[str, str]]:
    rb = filled_buffer("uniform", args.capacity, args.device)
    new = rows(64, args.device)
    with sync_debug_error(args.device):
        for _ in range(100):
            rb.extend(new)
    synchronize(args.device)
    return [("sync-free extend(64)", f"ok: 100 writes{_NO_SYNC_MODE if args.device == 'cpu' else ''}")]


def compiled_step_buffer(device) -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(1000, device=device, compilable=True), batch_size=BATCH,
                                  compilable=True)


def run_steps(step, batches: list[TensorDict], seed: int) -> list[TensorDict]:
    torch.manual_seed(seed)
    return [step(data).clone() for data in batches]  # clone: a CUDA-graph output is overwritten by the next call


def steps_per_second(step, batches: list[TensorDict], device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for data in batches:
        step(data)
    synchronize(device)
    return len(batches) / (time.perf_counter() - start)


def check_compiled_step(args) -> list[tuple[str, str]]:
    import torch._inductor.config as inductor_config

    batches = [rows(64, args.device, start=64 * i) for i in range(args.steps)]

    def make_step(rb):
        def step(data):
            rb.extend(data)
            return rb.sample()
        return step

    eager_step = make_step(compiled_step_buffer(args.device))
    mode = "reduce-overhead" if torch.device(args.device).type == "cuda" else None
    graphs_before, skips_before = _compile_counts()
    with _fallback_random(inductor_config):
        compiled_step = torch.compile(make_step(compiled_step_buffer(args.device)), mode=mode)
        eager, compiled = run_steps(eager_step, batches, 0), run_steps(compiled_step, batches, 0)
    equal = all(a.batch_size == b.batch_size and bool((a == b).all()) for a, b in zip(eager, compiled))
    eager_rate = steps_per_second(eager_step, batches, args.device)
    compiled_rate = steps_per_second(compiled_step, batches, args.device)
    graphs, skips = (now - before for now, before in zip(_compile_counts(), (graphs_before, skips_before)))
    detail = (f"{args.steps} steps, equal to eager: {equal}; graphs compiled: {graphs}, CUDA-graph skips: {skips}; "
              f"steps/s eager {eager_rate:,.0f}, compiled {compiled_rate:,.0f}")
    if not equal:
        raise AssertionError(f"compiled step differs from eager ({detail})")
    return [(f"compiled step ({mode or 'default'})", "ok: " + detail)]


def _compile_counts() -> tuple[int, int]:
    """(graphs dynamo compiled, times inductor skipped CUDA graphs) so far: torch's own counters."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]


@contextlib.contextmanager
def _fallback_random(inductor_config):
    before = inductor_config.fallback_random
    inductor_config.fallback_random = True
    try:
        yield
    finally:
        inductor_config.fallback_random = before


def calls_per_second(fn, device, seconds: float) -> float:
    for _ in range(3):
        fn()
    synchronize(device)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            fn()
        n += 10
        synchronize(device)
    return n / (time.perf_counter() - start)


def throughput_table(args) -> list[str]:
    devices = list(dict.fromkeys([args.device, "cpu"]))  # "--device cpu": one column
    header = " | ".join(f"{d} calls/s" for d in devices) + (f" | {devices[0]} / cpu" if len(devices) > 1 else "")
    lines = [f"| sampler (capacity {args.capacity:,}, batch {BATCH}) | {header} |",
             "|---|" + "---:|" * (len(devices) + (len(devices) > 1))]
    for kind in ("uniform", "prioritized", "slice"):
        rate = {}
        for device in devices:
            rb = filled_buffer(kind, args.capacity, device)
            rate[device] = calls_per_second(lambda rb=rb, kind=kind: draw(rb, kind), device, args.seconds)
            del rb
        cells = [f"{rate[d]:,.0f}" for d in devices]
        if len(devices) > 1:
            cells.append(f"{rate[devices[0]] / rate['cpu']:.2f}")
        lines.append(f"| {kind}{' + update_priority' if kind == 'prioritized' else ''} | {' | '.join(cells)} |")
    return lines


def torchrl_cuda_tree() -> str:
    try:
        import torchrl._torchrl as extension  # TorchRL's compiled extension: not part of this package
    except ImportError:
        return "not installed"
    return "installed" if getattr(extension, "CudaSumSegmentTreeFp32", None) is not None else "installed, no CUDA tree"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run of the script)")
    parser.add_argument("--capacity", type=int, default=10**6, help="rows of the sync and throughput buffers")
    parser.add_argument("--steps", type=int, default=200, help="steps of the compiled-step check")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing window of each throughput cell")
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    if args.capacity < 2 * BATCH:
        parser.error(f"--capacity must be at least {2 * BATCH}, got {args.capacity}")
    name = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else "cpu"
    print(f"# device check: {name}, torch {torch.__version__}\n")
    checks = [(f"sync-free {kind}", lambda kind=kind: check_sync_free(kind, args))
              for kind in ("uniform", "without replacement", "prioritized", "slice")]
    checks += [("sync-free extend(64)", lambda: check_sync_free_extend(args)),
               ("compiled step", lambda: check_compiled_step(args))]
    results, failed, started = [], [], time.perf_counter()
    for check, run in checks:
        try:
            results += run()
        except Exception as err:  # noqa: BLE001 - one failed check must not stop the others
            traceback.print_exc()
            results.append((check, f"FAILED: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"))
            failed.append(check)
    table = []
    try:
        table = throughput_table(args)
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        failed.append("throughput table")
        results.append(("throughput table", f"FAILED: {type(err).__name__}: {err}"))
    results.append(("TorchRL CUDA tree (torchrl._torchrl)", torchrl_cuda_tree()))
    print("| check | result |\n|---|---|")
    for check, result in results:
        print(f"| {check} | {result} |")
    if table:
        print("\n" + "\n".join(table))
    print(f"\n{len(failed)} failed check(s) in {time.perf_counter() - started:.0f} s" + (f": {', '.join(failed)}"
                                                                                       if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
