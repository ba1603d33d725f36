"""Resume a training run exactly: checkpoint every k steps, get killed, resume with the same batches.

A small regression network trains on batches sampled from a replay buffer through torchdata's
``StatefulDataLoader`` with 2 worker processes, in epochs: the buffer samples without replacement, every item
once per epoch, and the workers draw by batch number, so their batches do not depend on their speed. Every ``--checkpoint-every`` steps the run saves its whole data
state with ``torchrl.data.save_training_state``: the buffer, the loader's position and the workers' random
streams, torch's global random state, and (as ``extra``) the model, the optimizer and the step. The checkpoint
is pickle-free and written atomically, so a kill at any moment leaves the last complete one.

The script runs three processes and compares them:

1. a reference run, uninterrupted, that logs a digest of every batch it trains on;
2. the same run, killed with SIGKILL at step ``--kill-at`` (between two checkpoints);
3. a run resumed from the last checkpoint of (2), which continues to the end.

The batches of (2) up to its checkpoint followed by those of (3) are exactly those of (1), and so are the final
weights. Run it with ``--smoke`` for a short version (CI does)::

    python examples/replay-buffers/resume_training.py --out /tmp/resume --smoke
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torchdata.stateful_dataloader import StatefulDataLoader

from torchrl.data import (
    LazyTensorStorage,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    load_training_state,
    save_training_state,
    tensordict_collate,
)


@dataclass
class Args:
    out: str
    steps: int = 200
    checkpoint_every: int = 25
    kill_at: int = 137
    batches_per_epoch: int = 60
    workers: int = 2
    items: int = 4096
    batch_size: int = 64


def make_buffer(args: Args, *, fill: bool) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(args.items), sampler=SamplerWithoutReplacement(),
                                batch_size=args.batch_size)
    if fill:  # y = x @ w + noise, from a fixed seed: the data a collector would have written
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.items, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(args.items, 1, generator=g)
        rb.extend(TensorDict(x=x, y=y, batch_size=[args.items]))
    return rb


def make_loader(rb, args: Args) -> StatefulDataLoader:
    return StatefulDataLoader(
        rb.as_dataset(num_batches=args.batches_per_epoch), batch_size=None, num_workers=args.workers,
        collate_fn=tensordict_collate, multiprocessing_context="fork" if args.workers else None,
        timeout=120 if args.workers else 0,
    )


def digest(batch) -> str:
    return hashlib.sha1(batch["x"].numpy().tobytes() + batch["index"].numpy().tobytes()).hexdigest()[:16]


def train(args: Args, *, log: str, resume: bool, kill_at: int | None) -> None:
    """One training process: fresh or resumed from ``args.out/checkpoint``; appends ``step digest`` lines."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    checkpoint = os.path.join(args.out, "checkpoint")
    step = 0
    if resume:
        rb = make_buffer(args, fill=False)  # the content comes from the checkpoint
        loader = make_loader(rb, args)  # shares the (empty) sampler with the workers to come
        extra = load_training_state(checkpoint, rb=rb, loader=loader)  # buffer, sampler, loader: one call
        model.load_state_dict(extra["model"])
        optimizer.load_state_dict(extra["optimizer"])
        step = extra["step"]
        with open(log) as f:  # drop what the killed run logged after its last checkpoint
            kept = [line for line in f if int(line.split()[0]) <= step]
        with open(log, "w") as f:
            f.writelines(kept)
    else:
        rb = make_buffer(args, fill=True)
        loader = make_loader(rb, args)
    with open(log, "a") as out:
        while step < args.steps:
            for batch in loader:
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])  # dropout: global RNG
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                out.write(f"{step} {digest(batch)}\n")
                out.flush()
                if step % args.checkpoint_every == 0:
                    save_training_state(checkpoint, rb=rb, loader=loader, extra={
                        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step})
                if step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # preemption, out of memory, a crash...
                if step == args.steps:
                    break
    torch.save(model.state_dict(), log + ".weights.pt")


def run_child(args: Args, *extra: str) -> int:
    cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--steps", str(args.steps),
           "--checkpoint-every", str(args.checkpoint_every), "--batches-per-epoch", str(args.batches_per_epoch),
           "--workers", str(args.workers), "--items", str(args.items), "--batch-size", str(args.batch_size), *extra]
    return subprocess.run(cmd, timeout=900).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="a directory for the checkpoint and the logs")
    parser.add_argument("--steps", type=int, default=Args.steps)
    parser.add_argument("--checkpoint-every", type=int, default=Args.checkpoint_every)
    parser.add_argument("--kill-at", type=int, default=Args.kill_at)
    parser.add_argument("--batches-per-epoch", type=int, default=Args.batches_per_epoch)
    parser.add_argument("--workers", type=int, default=Args.workers)
    parser.add_argument("--items", type=int, default=Args.items)
    parser.add_argument("--batch-size", type=int, default=Args.batch_size)
    parser.add_argument("--smoke", action="store_true", help="a short run: 24 steps, killed at step 13")
    parser.add_argument("--child", choices=["reference", "killed", "resumed"], help=argparse.SUPPRESS)
    ns = parser.parse_args()
    args = Args(ns.out, ns.steps, ns.checkpoint_every, ns.kill_at, ns.batches_per_epoch, ns.workers, ns.items,
                ns.batch_size)
    if ns.smoke:
        args.steps, args.checkpoint_every, args.kill_at, args.batches_per_epoch, args.items = 24, 5, 13, 9, 512
    os.makedirs(args.out, exist_ok=True)
    reference, interrupted = os.path.join(args.out, "reference.log"), os.path.join(args.out, "interrupted.log")
    if ns.child == "reference":
        train(args, log=reference, resume=False, kill_at=None)
        return 0
    if ns.child == "killed":
        train(args, log=interrupted, resume=False, kill_at=args.kill_at)
        return 0
    if ns.child == "resumed":
        train(args, log=interrupted, resume=True, kill_at=None)
        return 0

    for log in (reference, interrupted):
        if os.path.exists(log):
            os.remove(log)
    if run_child(args, "--child", "reference") != 0:
        return 1
    code = run_child(args, "--child", "killed", "--kill-at", str(args.kill_at))
    print(f"the interrupted run was killed at step {args.kill_at} (exit code {code})")
    if code != -signal.SIGKILL:
        return 1
    if run_child(args, "--child", "resumed") != 0:
        return 1
    with open(reference) as f:
        expected = f.read().splitlines()
    with open(interrupted) as f:
        got = f.read().splitlines()
    same_weights = all(torch.equal(a, b) for a, b in zip(
        torch.load(reference + ".weights.pt").values(), torch.load(interrupted + ".weights.pt").values()))
    print(f"steps: {len(expected)} reference, {len(got)} killed + resumed; identical batches: {expected == got}; "
          f"identical final weights: {same_weights}")
    return 0 if expected == got and same_weights else 1


if __name__ == "__main__":
    sys.exit(main())
