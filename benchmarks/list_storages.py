"""What the ragged and compressed list storages cost: a full draw (``rb.sample()``: sampler + ``storage.get`` +
collate) and a write, against the storages they stand in for, plus the memory the compressed one saves.

Workloads:

- frames: Atari-like observations (``pixels: u8[4, 84, 84]`` mostly flat with a few moving blocks, ``action``,
  ``reward``), batch 32. ``CompressedListStorage`` (zstd when installed, and zlib) vs ``ListStorage`` and
  ``LazyTensorStorage`` holding the same items; memory = compressed bytes / raw bytes.
- ragged tokens: TensorDicts with ``tokens: i64[n]``, ``n`` in 16..512, batch 64. ``LazyStackStorage`` vs a
  ``ListStorage`` (whose default collate also lazy-stacks ragged items).

Each pair is timed in interleaved rounds (A then B, each ``number`` calls); the table gives the median time per
call of each side and the median of the per-round ratios B / A. Run::

    python benchmarks/list_storages.py              # full size: 20_000 frames, 20_000 token items, 15 rounds
    python benchmarks/list_storages.py --items 500 --rounds 2 --number 5   # a quick check
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _timing import interleaved, median_ratio
from tensordict import TensorDict

from torchrl.data import (
    CompressedListStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
)
from torchrl.data.replay_buffers.storages._compression import default_codec_name


def _frames(n: int, generator: torch.Generator) -> TensorDict:
    pixels = torch.full((n, 4, 84, 84), 40, dtype=torch.uint8)
    xs = torch.randint(0, 76, (n, 4), generator=generator)
    for i in range(n):  # a few bright blocks per frame, as sprites on a flat background
        for j in range(4):
            x = int(xs[i, j])
            pixels[i, j, x : x + 8, x : x + 8] = 200
    return TensorDict(
        pixels=pixels,
        action=torch.randint(0, 6, (n,), generator=generator),
        reward=torch.randn(n, generator=generator),
        batch_size=[n],
    )


def _tokens(n: int, generator: torch.Generator) -> list[TensorDict]:
    lengths = torch.randint(16, 513, (n,), generator=generator).tolist()
    return [
        TensorDict(tokens=torch.randint(0, 32_000, (k,), generator=generator), reward=torch.randn(()))
        for k in lengths
    ]


def _buffer(storage, data, batch: int) -> ReplayBuffer:
    rb = ReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=batch)
    rb.extend(data)
    rb.set_rng(torch.Generator().manual_seed(0))
    return rb


def _interleaved(a, b, *, rounds: int, number: int) -> tuple[float, float, float]:
    a_s, b_s = interleaved(a, b, rounds=rounds, number=number)
    return statistics.median(a_s) * 1e6, statistics.median(b_s) * 1e6, median_ratio(b_s, a_s)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=50)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    n = args.items
    rows = []

    frames = _frames(n, generator)
    raw = frames.bytes()
    baseline = {
        "LazyTensorStorage": _buffer(LazyTensorStorage(n), frames, 32),
        "ListStorage": _buffer(ListStorage(n), frames, 32),
    }
    codecs = [default_codec_name()] + (["zlib (custom fns)"] if default_codec_name() == "zstd" else [])
    for codec in codecs:
        if codec == default_codec_name():
            storage = CompressedListStorage(n)
        else:
            import zlib

            storage = CompressedListStorage(
                n, compression_fn=lambda t: zlib.compress(t.numpy().tobytes(), 3),
                decompression_fn=lambda d, m: zlib.decompress(d.numpy().tobytes()),
            )
        rb = _buffer(storage, frames, 32)
        memory = storage.bytes() / raw
        for name, base in baseline.items():
            a, b, ratio = _interleaved(base.sample, rb.sample, rounds=args.rounds, number=args.number)
            rows.append((f"frames: sample(32), {name} -> Compressed[{codec}]", a, b, ratio, f"memory {memory:.3f}x"))
        chunk = frames[:256]
        write_base = ReplayBuffer(storage=ListStorage(n))
        a, b, ratio = _interleaved(lambda w=write_base, c=chunk: w.extend(c), lambda r=rb, c=chunk: r.extend(c),
                                   rounds=args.rounds, number=max(1, args.number // 10))
        rows.append((f"frames: extend(256), ListStorage -> Compressed[{codec}]", a, b, ratio, ""))

    tokens = _tokens(n, generator)
    lazy = _buffer(LazyStackStorage(n), tokens, 64)
    plain = _buffer(ListStorage(n), tokens, 64)
    a, b, ratio = _interleaved(plain.sample, lazy.sample, rounds=args.rounds, number=args.number)
    rows.append(("tokens: sample(64), ListStorage -> LazyStackStorage", a, b, ratio, ""))

    width = max(len(r[0]) for r in rows)
    print(f"{'comparison (A -> B)'.ljust(width)}  {'A us':>10}  {'B us':>10}  {'B/A':>6}  notes")
    for name, a, b, ratio, note in rows:
        print(f"{name.ljust(width)}  {a:10.1f}  {b:10.1f}  {ratio:6.2f}  {note}")


if __name__ == "__main__":
    main()
