"""Groups of language-model completions: the bytes a ``PackedSequenceStorage`` holds, and its write and group
draw times against ``LazyStackStorage`` holding the same sequences.

Workload: ``--groups`` groups of ``--group-size`` completions (10,000 x 8 by default), each completion a token
sequence whose length is drawn from U[16, ``--max-length``] (U[16, 4096] by default). Tokens are **int32** (what
tokenizers' ids fit in; ``--dtype int64`` for the other case); each sequence also carries three fixed entries:
``reward`` (float32), ``prompt_id`` (int64) and ``policy_version`` (int64).

- memory: ``storage.nbytes()`` (arenas + slot table + fixed entries, at capacity) over the bytes of the tokens
  plus the fixed entries. The packed layout must stay within 1.02x.
- extend: the groups are written in chunks of ``--chunk`` groups, each chunk into both buffers, the order
  alternating from chunk to chunk (interleaved, so a change of machine load hits both). The packed buffer writes
  through ``GroupWriter`` (a group is kept and evicted whole); the lazy-stack buffer through the default writer.
- sample: one draw of ``--sample-groups`` whole groups, ``GroupSampler`` on the packed buffer and
  ``PromptGroupSampler(samples_per_group=G)`` on the lazy stack, timed in interleaved rounds; then the same draw
  followed by ``pad_sequences`` (the padded batch a model takes), on both.

``LazyStackStorage`` keeps the tensors it is given (its extend copies no token), the packed storage copies them
into its arena: the extend row compares a copy with a reference. The table gives the median time per call of
each side and the median of the per-round ratios packed / lazy (below 1: the packed storage is faster). Run::

    python benchmarks/packed_groups.py            # the full size (about 660 MB of int32 tokens, held twice)
    python benchmarks/packed_groups.py --quick    # 40 groups, seconds
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _timing import interleaved, median_ratio
from tensordict import TensorDict

from torchrl.data import (
    GroupSampler,
    GroupWriter,
    LazyStackStorage,
    PackedSequenceStorage,
    PromptGroupSampler,
    ReplayBuffer,
    pad_sequences,
)

FIXED_BYTES = 4 + 8 + 8  # reward float32, prompt_id int64, policy_version int64


def make_chunk(first_group: int, groups: int, group_size: int, max_length: int, dtype: torch.dtype,
               generator: torch.Generator) -> list[TensorDict]:
    """``groups`` groups of ``group_size`` items (one per completion), tokens drawn in one call."""
    n = groups * group_size
    lengths = torch.randint(16, max_length + 1, (n,), generator=generator)
    flat = torch.randint(0, 32_000, (int(lengths.sum()),), generator=generator, dtype=torch.int64).to(dtype)
    rewards = torch.rand(n, generator=generator)
    items = []
    for i, tokens in enumerate(flat.split(lengths.tolist())):
        items.append(TensorDict(tokens=tokens, reward=rewards[i], prompt_id=torch.tensor(first_group + i // group_size),
                                policy_version=torch.tensor(0)))  # fmt: skip
    return items


def _ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--dtype", choices=("int32", "int64"), default="int32")
    parser.add_argument("--chunk", type=int, default=100, help="groups per extend call")
    parser.add_argument("--sample-groups", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes: a check that runs in seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.chunk, args.sample_groups, args.rounds, args.number = 40, 10, 4, 3, 5
    dtype = getattr(torch, args.dtype)
    g = args.group_size
    generator = torch.Generator().manual_seed(0)
    chunks = [
        make_chunk(start, min(args.chunk, args.groups - start), g, args.max_length, dtype, generator)
        for start in range(0, args.groups, args.chunk)
    ]
    sequences = args.groups * g
    tokens = sum(int(item["tokens"].numel()) for chunk in chunks for item in chunk)
    packed = ReplayBuffer(
        storage=PackedSequenceStorage(tokens, max_sequences=sequences, token_keys=("tokens",)),
        writer=GroupWriter(group_key="prompt_id"), sampler=GroupSampler(), batch_size=args.sample_groups,
    )  # fmt: skip
    lazy = ReplayBuffer(
        storage=LazyStackStorage(sequences),
        sampler=PromptGroupSampler(samples_per_group=g, group_key="prompt_id"), batch_size=args.sample_groups * g,
    )  # fmt: skip
    for rb in (packed, lazy):
        rb.set_rng(torch.Generator().manual_seed(0))

    # -- extend: chunk by chunk, alternating which buffer writes first
    packed_s, lazy_s = [], []
    for i, chunk in enumerate(chunks):
        order = [(packed, packed_s), (lazy, lazy_s)]
        for rb, times in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            rb.extend(chunk)
            times.append(time.perf_counter() - start)
    assert len(packed) == len(lazy) == sequences, (len(packed), len(lazy), sequences)

    # -- memory
    token_bytes = tokens * dtype.itemsize
    payload = token_bytes + sequences * FIXED_BYTES
    storage_bytes = packed.storage.nbytes()
    ratio = storage_bytes / payload

    # -- sample: whole groups, then the padded batch
    def pad(rb):
        return lambda: pad_sequences(rb.sample(), keys=["tokens"])

    draws = {
        "sample": interleaved(packed.sample, lazy.sample, rounds=args.rounds, number=args.number, alternate=True),
        "sample + pad_sequences": interleaved(pad(packed), pad(lazy), rounds=args.rounds, number=args.number,
                                              alternate=True),
    }  # fmt: skip

    print(f"{args.groups} groups x {g} completions, lengths U[16, {args.max_length}], {args.dtype} tokens: "
          f"{sequences} sequences, {tokens} tokens")  # fmt: skip
    print(f"memory: storage {storage_bytes / 2**20:.1f} MiB / (tokens {token_bytes / 2**20:.1f} MiB + fixed entries "
          f"{sequences * FIXED_BYTES / 2**20:.2f} MiB) = {ratio:.4f}x (limit 1.02x)")  # fmt: skip
    rows = [(f"extend({args.chunk} groups = {args.chunk * g} sequences)", _ms(packed_s), _ms(lazy_s),
             median_ratio(packed_s, lazy_s))]  # fmt: skip
    for name, (a, b) in draws.items():
        rows.append((f"{name}({args.sample_groups} groups)", _ms(a), _ms(b), median_ratio(a, b)))
    width = max(len(r[0]) for r in rows)
    print(f"{'operation'.ljust(width)}  {'packed ms':>10}  {'lazy-stack ms':>13}  {'packed/lazy':>11}")
    for name, a, b, r in rows:
        print(f"{name.ljust(width)}  {a:10.3f}  {b:13.3f}  {r:11.2f}")
    seconds = sum(packed_s)
    print(f"packed extend: {sequences / seconds:,.0f} sequences/s, {tokens / seconds / 1e6:,.1f} M tokens/s; "
          f"lazy-stack extend: {sequences / sum(lazy_s):,.0f} sequences/s")  # fmt: skip
    if ratio > 1.02:
        raise SystemExit(f"storage bytes are {ratio:.4f}x the payload, above the 1.02x limit")


if __name__ == "__main__":
    main()
