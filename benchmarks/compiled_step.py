"""Throughput of a compiled replay step (issue 39): ``rb.extend(64 rows); rb.sample()`` (batch 256), eager and
under ``torch.compile``, side by side in one run.

Usage (on an otherwise idle machine)::

    .venv/bin/python benchmarks/compiled_step.py              # CPU, capacity 1000 and 100k
    .venv/bin/python benchmarks/compiled_step.py --smoke      # a quick check
    .venv/bin/python benchmarks/compiled_step.py --device cuda --mode reduce-overhead   # on a GPU

Rows: TensorDict rows ``obs: f32[84]``, ``action: f32[4]``, ``reward: f32[1]``. For each sampler (uniform,
without replacement, prioritized with ``update_priority`` of the drawn rows) and capacity, three buffers of the
same content: ``eager``, a ``TensorDictReplayBuffer`` built without ``compilable``; ``eager, compilable``, the
same with ``compilable=True`` (storage and buffer); ``compiled``, that buffer's step under
``torch.compile(fullgraph=True, mode=--mode)``. Each is warmed up (the compiled one compiles there), then
``--rounds`` rounds time ``--number`` steps of each, in an order that alternates between rounds. The table gives
each side's median steps per second and the ratios to ``eager`` (> 1 is faster).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch
from _timing import per_call
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

BATCH, WRITE = 256, 64
SAMPLERS = ("uniform", "without replacement", "prioritized")
FULL = {"capacities": (1_000, 100_000), "rounds": 5, "number": 200}
SMOKE = {"capacities": (1_000,), "rounds": 2, "number": 10}


def _rows(n: int, device) -> TensorDict:
    return TensorDict(
        obs=torch.randn(n, 84), action=torch.randn(n, 4), reward=torch.randn(n, 1), batch_size=[n]
    ).to(device)


def _sampler(kind: str, capacity: int):
    if kind == "uniform":
        return RandomSampler()
    if kind == "without replacement":
        return SamplerWithoutReplacement(drop_last=True)
    return PrioritizedSampler(capacity, alpha=0.7, beta=0.5)


def _buffer(kind: str, capacity: int, device, compilable: bool) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity, device=device, compilable=compilable),
        sampler=_sampler(kind, capacity),
        batch_size=BATCH,
        compilable=compilable,
    )
    rb.extend(_rows(capacity, device))  # full: the step's writes wrap the ring
    return rb


def _step(rb, kind: str, data: TensorDict):
    rb.extend(data)
    batch = rb.sample()
    if kind == "prioritized":
        rb.update_priority(batch["index"], batch["reward"].reshape(-1).abs() + 0.1)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default=None, help="torch.compile mode (e.g. reduce-overhead on CUDA)")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = SMOKE if args.smoke else FULL
    device = torch.device(args.device)
    data = _rows(WRITE, device)
    print(f"torch {torch.__version__}, device {device}, backend {args.backend}, mode {args.mode}, "
          f"{args.threads} thread(s), {cfg['rounds']} rounds x {cfg['number']} steps")  # fmt: skip
    print()
    print("| sampler | capacity | eager steps/s | eager, compilable | compiled | compilable / eager "
          "| compiled / eager |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in args.samplers:
        for capacity in cfg["capacities"]:
            torch._dynamo.reset()  # one step function per configuration, not recompiles of one code object
            eager = _buffer(kind, capacity, device, False)
            compilable = _buffer(kind, capacity, device, True)
            compiled_rb = _buffer(kind, capacity, device, True)
            step = torch.compile(_step, fullgraph=True, backend=args.backend, mode=args.mode)
            sides = {
                "eager": functools.partial(_step, eager, kind, data),
                "compilable": functools.partial(_step, compilable, kind, data),
                "compiled": functools.partial(step, compiled_rb, kind, data),
            }
            for fn in sides.values():  # warm-up (compiles)
                for _ in range(5):
                    fn()
            times = {name: [] for name in sides}
            for r in range(cfg["rounds"]):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    times[name].append(per_call(sides[name], cfg["number"]))
            rate = {name: 1.0 / statistics.median(t) for name, t in times.items()}
            print(f"| {kind} | {capacity} | {rate['eager']:.0f} | {rate['compilable']:.0f} | "
                  f"{rate['compiled']:.0f} | {rate['compilable'] / rate['eager']:.2f} | "
                  f"{rate['compiled'] / rate['eager']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
