"""Collectors and a learner: two collector processes write into one shared buffer, a learner samples it through
two DataLoader workers, and a rate limiter holds the sample-to-insert ratio.

1. The buffer lives in shared memory (``LazyTensorStorage(..., shared_init=True)``, ``shared=True``) and carries a
   Reverb-style limiter::

       limiter = SampleToInsertRatio(samples_per_insert=4.0, min_size_to_sample=256, error_buffer=512.0)
       rb = TensorDictReplayBuffer(storage=..., batch_size=64, shared=True, rate_limiter=limiter)

   Each learner record sampled costs 1/4 of an inserted transition: when the learner runs ahead it waits for the
   collectors, and when the collectors run ahead their ``rb.extend(..., timeout=...)`` waits for the learner.
2. Two collector processes (``multiprocessing``, fork or spawn) play a toy environment (a noisy linear system,
   ``next_obs = obs @ A + noise``) and extend the buffer with chunks of transitions.
3. The learner reads batches through ``rb.as_dataset(wait=True).loader(num_workers=2)``: each worker's
   ``sample(wait=True)`` reserves its records from the one shared budget, so the workers never over-draw it.
   It fits a linear model of the dynamics (it should recover ``A``).

It prints, as training goes, the observed samples per insert (``rb.stats()["samples_per_insert"]``), which
stays within ``error_buffer`` of the target, and the model's error.

Run it (20 to 45 seconds on a 2-core machine, collectors forked, the default)::

    python examples/replay-buffers/collectors_and_learner.py
    python examples/replay-buffers/collectors_and_learner.py --smoke   # a few updates, for CI
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from torchrl.data import LazyTensorStorage, SampleToInsertRatio, TensorDictReplayBuffer

OBS = 4


@dataclass
class Args:
    chunks: int = 200  # per collector
    chunk_size: int = 64
    batch_size: int = 64
    samples_per_insert: float = 4.0
    min_size_to_sample: int = 256
    error_buffer: float = 512.0
    workers: int = 2
    start_method: str = "fork"
    seed: int = 0
    log_every: int = 250


SMOKE = {"chunks": 12, "log_every": 20, "min_size_to_sample": 64}


def dynamics(seed: int) -> torch.Tensor:
    """The true transition matrix ``A`` of the toy system."""
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(OBS, OBS, generator=g))[0] * 0.9  # stable


def collector(rb: TensorDictReplayBuffer, worker: int, args: Args) -> None:
    """One collector process: rolls the toy system out and writes chunks of transitions."""
    a = dynamics(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1 + worker)
    obs = torch.randn(args.chunk_size, OBS, generator=g)
    for _ in range(args.chunks):
        nxt = obs @ a + 0.05 * torch.randn(obs.shape, generator=g)
        rb.extend(TensorDict({"obs": obs, ("next", "obs"): nxt}, batch_size=[args.chunk_size]), timeout=120.0)
        obs = torch.where(torch.rand(args.chunk_size, 1, generator=g) < 0.05, torch.randn(obs.shape, generator=g), nxt)


def main(args: Args) -> dict:
    torch.manual_seed(args.seed)
    limiter = SampleToInsertRatio(args.samples_per_insert, args.min_size_to_sample, args.error_buffer)
    capacity = 2 * args.chunks * args.chunk_size
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity, shared_init=True), batch_size=args.batch_size, shared=True,
        rate_limiter=limiter,
    )  # fmt: skip
    ctx = mp.get_context(args.start_method)
    collectors = [ctx.Process(target=collector, args=(rb, i, args)) for i in range(2)]
    for p in collectors:
        p.start()
    # The learner takes every record the inserts pay for (inserts * samples_per_insert - min_diff at most): then
    # the collectors always finish (they wait only while inserts * spi - samples > max_diff).
    inserts = 2 * args.chunks * args.chunk_size
    updates = int((inserts * args.samples_per_insert - limiter.min_diff) // args.batch_size)
    loader = rb.as_dataset(num_batches=updates, wait=True, timeout=120.0).loader(
        num_workers=args.workers, multiprocessing_context=args.start_method if args.workers else None,
    )  # fmt: skip
    model = nn.Linear(OBS, OBS, bias=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    a = dynamics(args.seed)
    print(f"{updates} updates of {args.batch_size} records from {inserts} inserted transitions")
    for step, batch in enumerate(loader, 1):
        loss = nn.functional.mse_loss(model(batch["obs"]), batch["next", "obs"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == updates:
            stats = rb.stats()
            error = (model.weight.detach().T - a).abs().max().item()
            print(f"step {step:5d}  loss {loss.item():.4f}  |A - A_hat| {error:.3f}  inserts {stats['write_count']:6d}  "
                  f"samples/insert {stats['samples_per_insert']:.2f} (target {args.samples_per_insert})")  # fmt: skip
    for p in collectors:
        p.join(120)
    rb.shutdown()  # had a collector still waited for the learner, its extend would end (RuntimeError)
    assert all(p.exitcode == 0 for p in collectors), [p.exitcode for p in collectors]
    stats = rb.stats()
    assert abs(stats["sample_insert_diff"] - args.samples_per_insert * args.min_size_to_sample) <= args.error_buffer
    return stats


def parse() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Args()
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--smoke", action="store_true", help="a few updates, for CI")
    ns = vars(parser.parse_args())
    smoke = ns.pop("smoke")
    args = Args(**ns)
    if smoke:
        args = Args(**{**vars(args), **SMOKE})
    return args


if __name__ == "__main__":
    main(parse())
