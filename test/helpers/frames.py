"""Synthetic camera frames that move (so that video codecs cannot cheat on static content), and PSNR."""

from __future__ import annotations

import torch


def moving_frames(n: int, height: int = 64, width: int = 64, *, channels: int = 3, layout: str = "CHW",
                  start: int = 0) -> torch.Tensor:
    """``n`` uint8 frames of scrolling colour gradients with a moving square, ``[n, C, H, W]`` or ``[n, H, W, C]``.

    Frame ``t`` depends on ``start + t`` only, so two calls with the same arguments give the same frames.
    """
    t = torch.arange(start, start + n).view(n, 1, 1)
    y = torch.arange(height).view(1, height, 1)
    x = torch.arange(width).view(1, 1, width)
    r = (x * 4 + t * 3) % 256
    g = (y * 4 + t * 2) % 256
    b = ((x + y) * 2 + t * 5) % 256
    frames = torch.stack([r.expand(n, height, width), g.expand(n, height, width), b.expand(n, height, width)], -1)
    frames = frames.clone()
    for i in range(n):  # a 12x12 square crossing the frame
        cx, cy = (10 + (start + i) * 2) % width, (20 + start + i) % height
        frames[i, max(cy - 6, 0): cy + 6, max(cx - 6, 0): cx + 6] = torch.tensor([255, 40, 40])
    frames = frames.to(torch.uint8)
    if channels == 1:
        frames = frames[..., :1].contiguous()
    return frames.permute(0, 3, 1, 2).contiguous() if layout == "CHW" else frames


def psnr(decoded: torch.Tensor, reference: torch.Tensor) -> float:
    """The peak signal-to-noise ratio of ``decoded`` against ``reference`` (uint8), in dB (inf when equal)."""
    mse = (decoded.double() - reference.double()).pow(2).mean().item()
    return float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(255.0**2 / mse)).item()
