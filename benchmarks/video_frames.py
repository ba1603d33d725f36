"""Frames kept as video (:class:`~torchrl.data.EncodedFrameStorage`) against uint8 rows in memory-mapped files
(:class:`~torchrl.data.LazyMemmapStorage`): bytes per frame, frames read per second, and what a LeRobot import
costs with its videos kept encoded or decoded.

Synthetic episodes that move, so that a codec cannot cheat on static content: a smooth random texture seen
through a camera that pans (a new direction and speed per episode), three coloured discs bouncing across the view,
and a little noise (``N(0, 2)``). ``--frames`` steps per size (64x64 and 96x96, ``uint8 [3, H, W]``), in episodes
of ``--episode`` steps, with an action and ``("next", "done")``.

Storages compared, one buffer each over the same steps:

- ``uint8 memmap``: ``LazyMemmapStorage`` (the frames as rows);
- ``ffv1``: ``EncodedFrameStorage(codec="ffv1")`` (lossless: PSNR inf);
- ``h264`` / ``av1``: ``EncodedFrameStorage(codec=...)`` at the default quality (PSNR quoted, against what was
  written).

Columns: storage bytes per frame (the pixels only: the files of the closed segments, or ``3*H*W``), its ratio to
uint8, PSNR, the write rate (frames per second of ``rb.extend`` plus closing the segments), and frames read per
second in batches of ``--batch``: uniform draws and slices of 8 consecutive steps (``SliceSampler``), in the main
process and through ``DataLoader(rb.as_dataset(), num_workers=2)`` (fork). Decoding cost grows with the distance
to the keyframe before each frame read: uniform draws are the worst case of video storage, slices its best.

Then a LeRobot v3.0 dataset with one H.264 camera (the ``--frames`` steps at 96x96, exported from the h264
buffer: ``videos/.../file-000.mp4``) is imported with ``ReplayBuffer.from_hf(path, video=...)`` in a fresh process
per mode: ``"decode"`` (every frame decoded into uint8 rows) and ``"keep"`` (the file kept as segments, nothing
decoded): import seconds and the peak RSS the import adds.

Run: ``python benchmarks/video_frames.py`` (full sizes, about 3 minutes on 2 cores) or ``--quick`` (200 frames of
64x64 only, under a minute: checks that it runs; its numbers mean little).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import warnings

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import EncodedFrameStorage, LazyMemmapStorage, ReplayBuffer, SliceSampler
from torchrl.data.replay_buffers.loading import tensordict_collate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402
from _moving_episodes import moving_episodes  # noqa: E402

FPS = 30


# -- quality (the synthetic episodes are in _moving_episodes.py, shared with the tests) ---------------------------
def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


# -- the storages -----------------------------------------------------------------------------------------------
def build(name: str, steps: TensorDict, scratch: str) -> tuple[ReplayBuffer, float]:
    """A buffer of storage ``name`` holding ``steps``, and the seconds its writes took."""
    n = steps.batch_size[0]
    if name == "uint8 memmap":
        storage = LazyMemmapStorage(n, scratch_dir=tempfile.mkdtemp(dir=scratch))
    else:
        storage = EncodedFrameStorage(n, codec=name, fps=FPS, scratch_dir=tempfile.mkdtemp(dir=scratch))
    rb = ReplayBuffer(storage=storage)
    start = time.perf_counter()
    for lo in range(0, n, 1000):  # as a collector writes: batches of steps
        rb.extend(steps[lo : lo + 1000])
    if name != "uint8 memmap":
        storage.close_segments()
    return rb, time.perf_counter() - start


def pixel_bytes(rb: ReplayBuffer, steps: TensorDict) -> int:
    if isinstance(rb.storage, EncodedFrameStorage):
        return rb.storage.stats()["encoded_bytes"]
    return steps["pixels"].numel()


def main_rate(rb: ReplayBuffer, batch: int, seconds: float) -> float:
    rb.sample(batch)  # warm-up: decoders opened
    return batch * _timing.rate(lambda: rb.sample(batch), seconds)


def worker_rate(rb: ReplayBuffer, batch: int, batches: int, workers: int) -> float:
    loader = DataLoader(rb.as_dataset(num_batches=batches + 2 * workers), batch_size=None, num_workers=workers,
                        collate_fn=tensordict_collate, multiprocessing_context="fork", timeout=120)  # fmt: skip
    it = iter(loader)
    for _ in range(2 * workers):  # warm-up: the workers started and each sent a batch
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    del it
    return batch * batches / elapsed


def with_sampler(rb: ReplayBuffer, sampler, batch: int) -> ReplayBuffer:
    """A buffer over the same storage with another sampler (nothing copied)."""
    return ReplayBuffer(storage=rb.storage, sampler=sampler, batch_size=batch)


# -- the LeRobot import, in a child process ---------------------------------------------------------------------
def child_import(path: str, mode: str) -> None:
    import datasets  # noqa: F401  (imported before the measure: its import is not the import's cost)

    def run():
        rb = ReplayBuffer.from_hf(path, video=mode)
        assert len(rb) > 0

    added = _timing.peak_rss_added(run)
    print(json.dumps({"seconds": added.seconds, "rss": added.rss}))


def lerobot_import(rb: ReplayBuffer, scratch: str) -> dict:
    path = os.path.join(scratch, "lerobot")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        rb.export_hf(path, layout="lerobot", fps=FPS, task="look around")
    out = {"video bytes": sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(path, "videos"))
                              for f in fs)}  # fmt: skip
    for mode in ("decode", "keep"):
        line = _timing.child_output([os.path.abspath(__file__), "--child-import", path, mode])
        out[mode] = json.loads(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 frames of 64x64 only: checks that it runs")
    parser.add_argument("--frames", type=int, default=None, help="steps per size (default 3000; --quick: 200)")
    parser.add_argument("--episode", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=None, help="timing window per rate (default 1.5)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child-import", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_import:
        child_import(*args.child_import)
        return
    frames = args.frames or (200 if args.quick else 3000)
    seconds = args.seconds or (0.2 if args.quick else 1.5)
    worker_batches = 4 if args.quick else 40
    episode = min(args.episode, frames)
    storages = ["uint8 memmap", "ffv1", "h264", "av1"]
    print(f"frames={frames} per size, episodes of {episode}, batch={args.batch}, workers={args.workers}, "
          f"threads={torch.get_num_threads()}, moving content (pan + bouncing discs + noise)")
    header = (f"{'size':<6} {'storage':<13} {'B/frame':>8} {'vs uint8':>8} {'PSNR dB':>8} {'write f/s':>9} "
              f"{'uniform f/s':>11} {'slices f/s':>10} {f'uniform {args.workers}w f/s':>16} "
              f"{f'slices {args.workers}w f/s':>15}")
    print(header)
    print("-" * len(header))
    keep_for_lerobot = None
    with tempfile.TemporaryDirectory() as scratch:
        sizes = (64,) if args.quick else (64, 96)
        for size in sizes:
            steps = moving_episodes(frames, size, episode)
            base = None
            for name in storages:
                rb, write_seconds = build(name, steps, scratch)
                stored = pixel_bytes(rb, steps) / frames
                base = base or stored
                quality = psnr(rb.storage.get(torch.arange(frames))["pixels"], steps["pixels"])
                uniform = main_rate(rb, args.batch, seconds)
                slices = with_sampler(rb, SliceSampler(slice_len=8, traj_key="episode"), args.batch)
                slice_rate = main_rate(slices, args.batch, seconds)
                uniform_w = worker_rate(with_sampler(rb, None, args.batch), args.batch, worker_batches, args.workers)
                slices_w = worker_rate(slices, args.batch, worker_batches, args.workers)
                print(f"{size:<6} {name:<13} {stored:>8.0f} {stored / base:>7.3f}x {quality:>8.1f} "
                      f"{frames / write_seconds:>9.0f} {uniform:>11.0f} {slice_rate:>10.0f} {uniform_w:>16.0f} "
                      f"{slices_w:>15.0f}", flush=True)
                if size == sizes[-1] and name == "h264":
                    keep_for_lerobot = rb
        lerobot = lerobot_import(keep_for_lerobot, scratch)
    print()
    size = sizes[-1]
    print(f"LeRobot v3.0 import of {frames} frames of {size}x{size} (one H.264 camera, "
          f"{lerobot['video bytes'] / 2**20:.1f} MiB of video; uint8 rows would be "
          f"{frames * 3 * size * size / 2**20:.1f} MiB), one fresh process per mode:")
    for mode in ("decode", "keep"):
        result = lerobot[mode]
        print(f"  video={mode!r:<9} {result['seconds']:>7.2f} s   peak RSS added {result['rss'] / 2**20:>7.1f} MiB")


if __name__ == "__main__":
    main()
