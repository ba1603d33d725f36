"""Frame stacks rebuilt at sample time from frames stored once, against a buffer that stores the stacks.

Atari-like data: ``--rows`` steps of ``uint8 [1, size, size]`` frames (84x84 by default) in episodes of 20-200
steps, with an action, a reward and ``("next", "done")`` per step; stacks of ``k`` frames (4), batches of
``--batch`` (32). Three buffers over the same steps, each a ``LazyTensorStorage``:

- ``stacked store``: the stacks computed once at write time (``pixels: uint8 [k, 1, H, W]`` per step, padded with
  the episode's first frame), sampled with the default ``RandomSampler``: what storing stacks costs;
- ``FrameStack``: frames stored once, ``sample_unit=FrameStack(k, traj_key="episode")`` (uniform steps, stacks
  ``[B, k, 1, H, W]`` read in one gather);
- ``CatFrames + SliceSampler``: frames stored once, TorchRL's recipe
  (``CatFrames(k, dim=-3).make_rb_transform_and_sampler(traj_key="episode")``; stacks ``[B, k, H, W]``).

The table prints each buffer's storage bytes (and their ratio to the stacked store: the target is ``1/k``) and
its sampling rate in batches per second, in the main process (``rb.sample()``) and through
``DataLoader(rb.as_dataset(), num_workers=--workers)`` (fork), with the ratio of its rate to the stacked
store's (the target is ``>= 0.5x``): the median of per-round ratios, the three buffers interleaved in every
round so that a change of machine load hits them alike.

Run: ``python benchmarks/frame_stacks.py [--rows 20000] [--size 84] [--k 4] [--batch 32] [--rounds 5]
[--batches 200] [--workers 2]`` (a smoke run: ``--rows 600 --size 16 --rounds 1 --batches 5``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.loading import tensordict_collate
from torchrl.data.replay_buffers.sample_units import FrameStack
from torchrl.envs.transforms import CatFrames


def make_steps(rows: int, size: int, seed: int = 0) -> TensorDict:
    """``rows`` steps of random uint8 frames in episodes of 20-200 steps."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 201, (rows // 20 + 1,), generator=gen)
    episode = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)[:rows]
    done = torch.ones(rows, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]
    return TensorDict(
        {
            "pixels": torch.randint(0, 256, (rows, 1, size, size), generator=gen, dtype=torch.uint8),
            "episode": episode,
            "action": torch.randint(0, 18, (rows,), generator=gen),
            "reward": torch.randn(rows, 1, generator=gen),
            ("next", "done"): done.unsqueeze(-1),
        },
        batch_size=[rows],
    )


def stacked(steps: TensorDict, k: int) -> TensorDict:
    """The steps with ``pixels`` replaced by the stacks of their last ``k`` frames (episode start repeated)."""
    episode = steps["episode"]
    start = torch.ones_like(episode, dtype=torch.bool)
    start[1:] = episode[1:] != episode[:-1]
    t = torch.arange(episode.numel())
    first = torch.cummax(torch.where(start, t, 0), 0).values
    source = torch.maximum(t.unsqueeze(-1) + torch.arange(1 - k, 1), first.unsqueeze(-1))
    out = steps.clone()
    out["pixels"] = steps["pixels"][source]
    return out


def storage_bytes(rb: ReplayBuffer) -> int:
    data = rb.storage.get(slice(None))
    return sum(v.numel() * v.element_size() for v in data.values(True, True))


def build(steps: TensorDict, k: int, batch: int) -> dict[str, ReplayBuffer]:
    rows = steps.batch_size[0]
    buffers = {}
    rb = ReplayBuffer(storage=LazyTensorStorage(rows), batch_size=batch)
    rb.extend(stacked(steps, k))
    buffers["stacked store"] = rb
    rb = ReplayBuffer(storage=LazyTensorStorage(rows), batch_size=batch, sample_unit=FrameStack(k, traj_key="episode"))
    rb.extend(steps)
    buffers["FrameStack"] = rb
    transform, sampler = CatFrames(k, dim=-3).make_rb_transform_and_sampler(traj_key="episode")
    rb = ReplayBuffer(storage=LazyTensorStorage(rows), batch_size=batch, sampler=sampler, transform=transform)
    rb.extend(steps)
    buffers["CatFrames + SliceSampler"] = rb
    return buffers


def main_process_rate(rb: ReplayBuffer, batches: int) -> float:
    rb.sample()  # warm-up
    start = time.perf_counter()
    for _ in range(batches):
        rb.sample()
    return batches / (time.perf_counter() - start)


def worker_rate(rb: ReplayBuffer, batches: int, workers: int) -> float:
    loader = DataLoader(rb.as_dataset(num_batches=batches + 2 * workers), batch_size=None, num_workers=workers,
                        collate_fn=tensordict_collate, multiprocessing_context="fork", timeout=120)
    it = iter(loader)
    for _ in range(2 * workers):  # warm-up: the workers started and each sent a batch
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    del it
    return batches / elapsed


def interleaved_rates(buffers: dict, rounds: int, fn) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in buffers}
    names = list(buffers)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            rates[name].append(fn(buffers[name]))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=84)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    buffers = build(make_steps(args.rows, args.size), args.k, args.batch)
    shapes = {name: tuple(rb.sample()["pixels"].shape) for name, rb in buffers.items()}
    sizes = {name: storage_bytes(rb) for name, rb in buffers.items()}
    main_rates = interleaved_rates(buffers, args.rounds, lambda rb: main_process_rate(rb, args.batches))
    work_rates = interleaved_rates(buffers, args.rounds, lambda rb: worker_rate(rb, args.batches, args.workers))

    base = "stacked store"
    print(f"rows={args.rows} frames=uint8[1,{args.size},{args.size}] k={args.k} batch={args.batch} "
          f"rounds={args.rounds} batches/round={args.batches} workers={args.workers} threads={torch.get_num_threads()}")
    header = (f"{'buffer':<26} {'batch pixels':<22} {'storage MiB':>11} {'vs stacked':>10} "
              f"{'main b/s':>9} {'vs stacked':>10} {f'{args.workers}w b/s':>9} {'vs stacked':>10}")
    print(header)
    print("-" * len(header))
    for name in buffers:
        main_ratio = statistics.median(a / b for a, b in zip(main_rates[name], main_rates[base]))
        work_ratio = statistics.median(a / b for a, b in zip(work_rates[name], work_rates[base]))
        print(f"{name:<26} {str(list(shapes[name])):<22} {sizes[name] / 2**20:>11.1f} "
              f"{sizes[name] / sizes[base]:>9.2f}x {statistics.median(main_rates[name]):>9.0f} {main_ratio:>9.2f}x "
              f"{statistics.median(work_rates[name]):>9.0f} {work_ratio:>9.2f}x")


if __name__ == "__main__":
    main()
