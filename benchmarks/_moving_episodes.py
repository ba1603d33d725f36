"""The synthetic episodes of ``benchmarks/video_frames.py``, in a module of their own so that the tests of the
default video quality (``test/storages/test_encoded_frames.py``) check the very frames the benchmark quotes.

A smooth random texture seen through a camera that pans (a new direction and speed per episode), three coloured
discs bouncing across the view, and a little noise (``N(0, 2)``): content a codec cannot cheat on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDict

__all__ = ["moving_episodes"]


def moving_episodes(frames: int, size: int, episode: int, seed: int = 0) -> TensorDict:
    """``frames`` steps of a panning camera over a textured world with bouncing discs (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    world = 4 * size
    coarse = torch.rand(1, 3, world // 16, world // 16, generator=gen)
    fine = torch.rand(1, 3, world // 4, world // 4, generator=gen)
    texture = (F.interpolate(coarse, size=(world, world), mode="bicubic", align_corners=False) * 170
               + F.interpolate(fine, size=(world, world), mode="bilinear", align_corners=False) * 60)[0]  # fmt: skip
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    pixels = torch.empty(frames, 3, size, size, dtype=torch.uint8)
    steps = torch.arange(frames)
    for start in range(0, frames, episode):
        length = min(episode, frames - start)
        origin = torch.randint(0, world, (2,), generator=gen)
        speed = (torch.rand(2, generator=gen) * 4 - 2)  # pixels per step
        discs = [(torch.rand(2, generator=gen) * size, torch.rand(2, generator=gen) * 6 - 3,
                  torch.randint(40, 256, (3,), generator=gen).float(), 4 + size // 12) for _ in range(3)]  # fmt: skip
        for t in range(length):
            y0, x0 = (origin + speed * t).long().tolist()
            rows = (torch.arange(size) + y0) % world
            cols = (torch.arange(size) + x0) % world
            frame = texture[:, rows][:, :, cols].clone()
            for position, velocity, colour, radius in discs:
                p = position + velocity * t
                p = size - (p % (2 * size) - size).abs()  # bouncing between the edges
                mask = (yy - p[0]) ** 2 + (xx - p[1]) ** 2 < radius**2
                frame[:, mask] = colour[:, None]
            frame += torch.randn(frame.shape, generator=gen) * 2
            pixels[start + t] = frame.round().clamp(0, 255).to(torch.uint8)
    episode_id = steps // episode
    done = torch.ones(frames, dtype=torch.bool)
    done[:-1] = episode_id[1:] != episode_id[:-1]
    return TensorDict({"pixels": pixels, "episode": episode_id, "action": torch.randn(frames, 2, generator=gen),
                       ("next", "done"): done.unsqueeze(-1)}, batch_size=[frames])  # fmt: skip
