"""Storage bytes saved by storing each observation once and rebuilding ``("next", obs)`` at sample time.

TED data stores every observation twice: at the root of its step and under ``"next"`` of the step before. With
:class:`~torchrl.envs.transforms.NextStateReconstructor` in the buffer (and a ``SliceSampler``), the ``"next"``
copy can be left out of the storage. For each observation layout below, the table gives the bytes of a full
``LazyTensorStorage`` of ``--rows`` TED steps (observation, action, ``("next", reward/done/terminated)``, the
trajectory id) with and without ``("next", "observation")``, their ratio, and the sampling rate (batches of
``--batch`` as ``--slices`` slices per second) of each buffer, the second one rebuilding the next observations.

Run: ``python benchmarks/next_state_bytes.py [--rows 20000] [--batch 256] [--slices 8] [--batches 50]``
(a smoke run: ``--rows 400 --batches 2``).
"""

from __future__ import annotations

import argparse
import time

import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
from torchrl.envs.transforms import NextStateReconstructor

LAYOUTS = {  # name: (observation shape, dtype, action dims)
    "MuJoCo state [17] f32": ((17,), torch.float32, 6),
    "Atari frames [4,84,84] u8": ((4, 84, 84), torch.uint8, 1),
    "DMC pixels [3,64,64] u8": ((3, 64, 64), torch.uint8, 6),
}


def make_steps(rows: int, obs_shape: tuple, dtype: torch.dtype, action_dims: int, seed: int = 0) -> TensorDict:
    """``rows`` TED steps in episodes of 50-500 steps, observations random."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(50, 501, (rows // 50 + 1,), generator=gen)
    episode = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)[: rows + 1]
    if dtype.is_floating_point:
        obs = torch.randn(rows + 1, *obs_shape, generator=gen).to(dtype)
    else:
        obs = torch.randint(0, 256, (rows + 1, *obs_shape), generator=gen, dtype=dtype)
    done = (episode[1:] != episode[:-1]).unsqueeze(-1)
    return TensorDict(
        {
            "observation": obs[:-1],
            "action": torch.randn(rows, action_dims, generator=gen),
            ("collector", "traj_ids"): episode[:-1],
            "next": {
                "observation": obs[1:],
                "reward": torch.randn(rows, 1, generator=gen),
                "done": done,
                "terminated": done.clone(),
            },
        },
        batch_size=[rows],
    )


def storage_bytes(data: TensorDict) -> int:
    """The bytes of a full ``LazyTensorStorage`` holding ``data``."""
    storage = LazyTensorStorage(data.batch_size[0])
    ReplayBuffer(storage=storage).extend(data)
    return storage.get(torch.arange(len(storage))).bytes()


def sample_rate(data: TensorDict, batch: int, slices: int, batches: int, rebuild: bool) -> float:
    fill = {} if data["observation"].is_floating_point() else {"fill_value": 0}
    rb = ReplayBuffer(
        storage=LazyTensorStorage(data.batch_size[0]),
        sampler=SliceSampler(num_slices=slices, traj_key=("collector", "traj_ids")),
        transform=NextStateReconstructor(**fill) if rebuild else None,
        batch_size=batch,
    )
    rb.extend(data.exclude(("next", "observation")) if rebuild else data)
    rb.sample()
    start = time.perf_counter()
    for _ in range(batches):
        rb.sample()
    return batches / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    header = (f"{'observation':<28} {'both (MB)':>10} {'once (MB)':>10} {'once/both':>10} "
              f"{'saved (MB)':>11} {'rate both':>10} {'rate once':>10}")
    print(f"{args.rows} TED steps per storage; sampling rates in batches/s ({args.batch} steps as "
          f"{args.slices} slices)")
    print(header)
    print("-" * len(header))
    for name, (shape, dtype, action_dims) in LAYOUTS.items():
        data = make_steps(args.rows, shape, dtype, action_dims)
        both = storage_bytes(data)
        once = storage_bytes(data.exclude(("next", "observation")))
        rates = [sample_rate(data, args.batch, args.slices, args.batches, rebuild) for rebuild in (False, True)]
        print(f"{name:<28} {both / 1e6:>10.2f} {once / 1e6:>10.2f} {once / both:>10.3f} "
              f"{(both - once) / 1e6:>11.2f} {rates[0]:>10.0f} {rates[1]:>10.0f}")


if __name__ == "__main__":
    main()
