"""Prioritized replay through DataLoader workers: a small network learns where it is wrong most.

1. A regression data set goes into a ``TensorDictPrioritizedReplayBuffer``: ``y = sin(x)`` on ``[-3, 3]``,
   except on a narrow band around ``x = 1`` where the target oscillates fast (the hard part).
2. Two DataLoader workers sample prioritized batches (and add a little input noise, a transform that runs in
   the workers)::

       loader = DataLoader(rb.as_dataset(), batch_size=None, num_workers=2, collate_fn=tensordict_collate)

   ``rb.as_dataset()`` moves the sampler's priority trees to shared memory, so the workers draw from the
   priorities the training loop sets.
3. The training loop (main process) weights each squared error by the batch's ``priority_weight`` and gives
   the sampled items their new priority, the absolute error, with the index that came back in the batch::

       rb.update_priority(batch["index"], error.abs())

   It also anneals ``beta`` towards 1 (``rb.sampler.beta = ...``): the workers see it at their next batch.

It prints, as training goes, the loss over the whole data set and the share of each batch drawn from the hard
band (a uniform sampler would draw ~3% there).

Run it (about a minute on a laptop CPU)::

    python examples/replay-buffers/prioritized_dataloader.py
    python examples/replay-buffers/prioritized_dataloader.py --smoke   # a few updates, for CI
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn
from torch.utils.data import DataLoader

from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, tensordict_collate

HARD_BAND = (0.9, 1.1)  # the x range where the target oscillates fast


@dataclass
class Args:
    items: int = 4096
    updates: int = 1500
    batch_size: int = 128
    workers: int = 2
    alpha: float = 0.7
    beta: float = 0.4  # annealed linearly to 1.0 over the run
    lr: float = 3e-3
    seed: int = 0
    log_every: int = 250


SMOKE = {"items": 512, "updates": 30, "log_every": 10}


def target(x: torch.Tensor) -> torch.Tensor:
    hard = (x > HARD_BAND[0]) & (x < HARD_BAND[1])
    return torch.where(hard, torch.sin(40 * x), torch.sin(x))


class InputNoise(nn.Module):
    """A transform run by the workers on every sampled batch: jitters the inputs a little."""

    def forward(self, batch: TensorDict) -> TensorDict:
        batch["x"] = batch["x"] + 1e-3 * torch.randn_like(batch["x"])
        return batch


def make_buffer(args: Args) -> TensorDictPrioritizedReplayBuffer:
    x = torch.linspace(-3, 3, args.items).unsqueeze(-1)
    rb = TensorDictPrioritizedReplayBuffer(
        storage=LazyTensorStorage(args.items), alpha=args.alpha, beta=args.beta, batch_size=args.batch_size,
        transform=InputNoise(), generator=torch.Generator().manual_seed(args.seed),
    )
    rb.extend(TensorDict(x=x, y=target(x), batch_size=[args.items]))  # new items get the max priority
    return rb


def full_loss(net: nn.Module, rb: TensorDictPrioritizedReplayBuffer) -> float:
    data = rb.storage.get(torch.arange(len(rb)))
    with torch.no_grad():
        return float((net(data["x"]) - data["y"]).pow(2).mean())


def train(args: Args) -> tuple[float, float]:
    torch.manual_seed(args.seed)
    rb = make_buffer(args)
    net = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optim = torch.optim.Adam(net.parameters(), lr=args.lr)
    loader = DataLoader(rb.as_dataset(), batch_size=None, num_workers=args.workers, collate_fn=tensordict_collate,
                        timeout=120 if args.workers else 0)
    first = full_loss(net, rb)
    print(f"initial loss over the data set: {first:.4f}")
    start, hard_share = time.perf_counter(), []
    for step, batch in zip(range(1, args.updates + 1), loader):
        error = net(batch["x"]) - batch["y"]
        loss = (batch["priority_weight"].unsqueeze(-1) * error.pow(2)).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        # the index that travelled with the batch tells the buffer which items these errors belong to
        rb.update_priority(batch["index"], error.detach().abs().squeeze(-1) + 1e-4)
        rb.sampler.beta = args.beta + (1.0 - args.beta) * step / args.updates  # shared: the workers see it
        x = batch["x"].squeeze(-1)
        hard_share.append(float(((x > HARD_BAND[0]) & (x < HARD_BAND[1])).float().mean()))
        if step % args.log_every == 0 or step == args.updates:
            recent = sum(hard_share[-args.log_every:]) / len(hard_share[-args.log_every:])
            print(f"update {step:5d}  loss over the data set {full_loss(net, rb):.4f}  "
                  f"batch share from the hard band {recent:.0%}  beta {rb.sampler.beta:.2f}")
    last = full_loss(net, rb)
    print(f"final loss over the data set: {last:.4f} ({time.perf_counter() - start:.1f} s)")
    return first, last


def parse_args(argv=None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few updates on little data (CI)")
    for name, value in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None)
    ns = parser.parse_args(argv)
    args = Args(**(SMOKE if ns.smoke else {}))
    for name in vars(Args()):
        given = getattr(ns, name)
        if given is not None:
            setattr(args, name, given)
    if args.updates <= 0 or args.items < args.batch_size or args.workers < 0:
        parser.error("--updates must be > 0, --items >= --batch-size and --workers >= 0")
    if not (0 <= args.beta <= 1 and args.alpha >= 0 and math.isfinite(args.lr)):
        parser.error("--beta must lie in [0, 1] and --alpha be >= 0")
    return args


if __name__ == "__main__":
    first_loss, last_loss = train(parse_args())
    if not last_loss < first_loss:
        raise SystemExit(f"the loss did not go down ({first_loss:.4f} -> {last_loss:.4f})")
