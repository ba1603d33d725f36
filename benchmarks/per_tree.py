"""Prioritized sampling near the memory floor (issue 30, item 2): uniform vs prioritized ``sample`` +
``update_priority`` of 256, numpy vs numba vs torch tree loops, at N = 10^5, 10^6, 10^7.

Usage::

    python benchmarks/per_tree.py                          # N = 1e5, 1e6, 1e7
    python benchmarks/per_tree.py --sizes 100000 --rounds 3 --number 5    # a smoke run

Data: small rows (``observation: f32[4]`` and an ``episode: i64`` id), the buffer full, batch 256. Rows:

- ``uniform``: ``ReplayBuffer(RandomSampler)``, ``rb.sample()``;
- ``prioritized (numpy)`` / ``prioritized (numba)``: ``TensorDictReplayBuffer(PrioritizedSampler(alpha=0.7,
  beta=0.5))``, ``batch = rb.sample()`` then ``rb.update_priority(batch["index"], new)``, the sampler's trees
  built with ``kernel="numpy"`` or ``kernel="numba"`` (the numba row is left out when numba is not installed);
- ``plain RB prio (numpy)`` / ``plain RB prio (numba)``: the same draw through the uniform row's buffer class,
  ``ReplayBuffer(PrioritizedSampler(...))``: ``batch, info = rb.sample(return_info=True)`` then
  ``rb.update_priority(info["index"], new)`` (no info entries written into the batch, no stored ``"index"``);
- ``prioritized (torch)`` / ``plain RB prio (torch)``: the same two rows with the trees as torch tensors on the CPU
  (the ``torch`` kernel, ``TORCHRL_SEGMENT_TREE_KERNEL=torch``): the path that runs on a GPU without a host sync,
  here paying torch's per-op overhead on the CPU (``--kernels`` picks the kernels timed).

Each round times a block of ``--number`` calls of every row, interleaved (uniform, numpy, numba, uniform, ...),
so that a change of machine load hits all rows alike; the ``x uniform`` column is the median over rounds of the
per-round ratio to the uniform block of the same round. Targets: <= 4x (numpy) and <= 2.5x at 1e5 / <= 3x at
1e6 (numba).

``--floor`` adds the rows that bound what a numpy tree can reach (the reason the numpy target is not met):

- ``tree only (numpy)`` / ``tree only (numba)``: the prioritized sampler's two trees alone, one proportional
  draw of 256 (``draw_with_min``) and one update of the positions drawn (``update_sum_and_min``, repeats
  dropped with a sort, ~3 us), with no buffer, storage read, weights or checks around them;
- ``64-ary draw (numpy)`` (``32-ary`` for a power of 32 that is no power of 64): the draw alone on a wide
  layout of random priorities (at 2^18 rows: 2^18 leaves, 2^12 sums of 64 leaves, 2^6 sums of those), each
  level one gather of 256 rows of 64, one ``cumsum`` along the rows and one count of the prefix sums below the
  draw: about 5 numpy calls per level, as in the binary tree, but 3 levels instead of the 7 below the binary
  tree's flat level, each call on 64x more elements. Only for ``--sizes`` that are powers of 64 or 32
  (e.g. 262144 1048576).

``--interleave call`` times one call of each row in turn instead (``--number`` such turns per round, every call
timed alone): no row keeps its data in the caches from one call to its next, as in a training loop where the
learner's step runs between two draws. Both sides then pay cache misses: the uniform draw's gather costs more
(about 1.5x), and the ratios come out lower than with blocks. How cold depends on what the other rows touch
between two calls of a row (more rows, colder caches, lower ratios): ``--interleave flush`` removes that
dependence by reading 128 MiB (4x this machine's 32 MiB L3), untimed, before every call, as a learner's step
touching its model and activations would: every row starts with its data out of the caches. Quote which mode
a number comes from.

Run it on an idle machine: any other busy process stalls the draws by more than the trees cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import _tree_kernels
from torchrl.data.replay_buffers.samplers.segment_tree import draw_with_min, update_sum_and_min

BATCH = 256
EVICT_BYTES = 128 << 20  # read before each call with --interleave flush: 4x a 32 MiB last-level cache


def _rows(n: int) -> TensorDict:
    step = torch.arange(n)
    return TensorDict({"observation": torch.randn(n, 4), "episode": step // 100}, batch_size=[n])


def _buffer(n: int, sampler, buffer_cls) -> ReplayBuffer:
    rb = buffer_cls(storage=LazyTensorStorage(n), sampler=sampler, batch_size=BATCH)
    for start in range(0, n, 1_000_000):
        rb.extend(_rows(min(1_000_000, n - start)))
    return rb


def _prioritized(n: int, kernel: str, buffer_cls=TensorDictReplayBuffer) -> ReplayBuffer:
    previous = _tree_kernels.DEFAULT_KERNEL
    _tree_kernels.DEFAULT_KERNEL = kernel  # the trees read the default when they are built
    try:
        sampler = PrioritizedSampler(n, alpha=0.7, beta=0.5)
    finally:
        _tree_kernels.DEFAULT_KERNEL = previous
    assert sampler.kernel == kernel, (sampler.kernel, kernel)
    return _buffer(n, sampler, buffer_cls)


def _kernels(wanted: list[str] | None = None) -> list[str]:
    """The tree kernels timed: numpy, numba (when installed) and torch, or those of ``wanted`` available here."""
    available = ["numpy"] + (["numba"] if _tree_kernels.compiled_kernels() is not None else []) + ["torch"]
    return available if wanted is None else [k for k in available if k in wanted]


def _tree_only(rb: ReplayBuffer):
    """One draw of 256 and one update of the positions drawn, on ``rb``'s sampler's trees alone."""
    sums, mins = rb._sampler._sum_tree, rb._sampler._min_tree

    def step():
        index = np.sort(draw_with_min(sums, mins, np.random.random_sample(BATCH))[0])
        index = index[np.concatenate(([True], index[1:] != index[:-1]))]  # the trees take positions once
        update_sum_and_min(sums, mins, index, np.random.random_sample(index.size) + 0.01)

    return step


def _wide_draw(priorities: np.ndarray, arity: int = 64):
    """A proportional draw of 256 on an ``arity``-ary layout of ``priorities`` (a power of ``arity`` long)."""
    levels = [priorities]
    while levels[-1].size > arity:
        levels.append(levels[-1].reshape(-1, arity).sum(axis=1))
    top, inner = levels[-1], levels[-2::-1]  # the root's children, then each level from the top down
    rows = np.arange(BATCH) * arity

    def draw():
        prefix = np.cumsum(top)
        rest = (1.0 - np.random.random_sample(BATCH)) * prefix[-1]
        node = np.minimum(np.searchsorted(prefix, rest), top.size - 1)
        rest -= np.where(node > 0, prefix[node - 1], 0.0)
        for level in inner:
            sums = np.cumsum(level.reshape(-1, arity)[node], axis=1)
            child = np.minimum((sums < rest[:, None]).sum(axis=1), arity - 1)
            rest -= np.where(child > 0, sums.reshape(-1)[rows + child - 1], 0.0)
            node = node * arity + child
        return node

    return draw


def _calls(n: int, floor: bool = False, kernels: list[str] | None = None) -> dict:
    """row name -> a function doing one call of the row (with ``floor``, the rows that bound a numpy tree)."""
    uniform = _buffer(n, RandomSampler(), ReplayBuffer)
    rows = {"uniform": uniform.sample}
    for kernel in _kernels(kernels):
        rb = _prioritized(n, kernel)

        def step(rb=rb):
            batch = rb.sample()
            rb.update_priority(batch["index"], torch.rand(BATCH) + 0.01)

        rows[f"prioritized ({kernel})"] = step
        plain = _prioritized(n, kernel, ReplayBuffer)

        def plain_step(rb=plain):
            batch, info = rb.sample(return_info=True)
            rb.update_priority(info["index"], torch.rand(BATCH) + 0.01)

        rows[f"plain RB prio ({kernel})"] = plain_step
        if floor and kernel != "torch":
            rows[f"tree only ({kernel})"] = _tree_only(rb)
    bits = n.bit_length() - 1
    arity = 64 if bits % 6 == 0 else 32 if bits % 5 == 0 else None  # for n a power of 64 or of 32
    if floor and n == 1 << bits and arity is not None:
        rows[f"{arity}-ary draw (numpy)"] = _wide_draw(np.random.random_sample(n) + 0.01, arity)
    return rows


def _block(fn, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _turns(rows: dict, number: int, evict: np.ndarray | None = None) -> dict[str, float]:
    """``number`` turns of one call of each row, each call timed alone: seconds per call of each row. With
    ``evict`` (an array larger than the last-level cache), the array is read before every call, untimed."""
    spent = dict.fromkeys(rows, 0.0)
    clock = time.perf_counter
    for _ in range(number):
        for name, fn in rows.items():
            if evict is not None:
                evict.sum()
            start = clock()
            fn()
            spent[name] += clock() - start
    return {name: t / number for name, t in spent.items()}


def table(
    sizes: list[int], rounds: int, number: int, interleave: str = "block", floor: bool = False,
    kernels: list[str] | None = None,
) -> list[tuple]:  # fmt: skip
    out = []
    evict = np.ones(EVICT_BYTES // 8) if interleave == "flush" else None
    for n in sizes:
        rows = _calls(n, floor, kernels)
        for fn in rows.values():  # warm-up: compiled loops, first-draw checks
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(rounds):
            if interleave != "block":
                for name, t in _turns(rows, number, evict).items():
                    times[name].append(t)
                continue
            for name, fn in rows.items():
                times[name].append(_block(fn, number))
        for name in rows:
            ratios = [t / u for t, u in zip(times[name], times["uniform"])]
            out.append((f"{n:.0e}", name, statistics.median(times[name]) * 1e6, statistics.median(ratios)))
        del rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--number", type=int, default=20, help="calls per timed block (per round with 'call')"
    )
    parser.add_argument("--interleave", choices=["block", "call", "flush"], default="block",
                        help="time blocks of calls of each row (default), one call of each row in turn, or one call "
                             "of each row in turn after reading 128 MiB (see the doc)")  # fmt: skip
    parser.add_argument(
        "--floor", action="store_true", help="add the tree-only and 64-ary rows (see the doc)"
    )
    parser.add_argument("--kernels", nargs="+", choices=["numpy", "numba", "torch"], default=None,
                        help="the tree kernels timed (default: every one available)")  # fmt: skip
    args = parser.parse_args()
    print(f"interleave={args.interleave}")
    print(f"{'N':>6} | {'row':<22} | {'us/call':>8} | {'x uniform':>9}")
    print("-" * 56)
    for n, name, us, ratio in table(args.sizes, args.rounds, args.number, args.interleave, args.floor, args.kernels):
        print(f"{n:>6} | {name:<22} | {us:8.1f} | {ratio:9.2f}")


if __name__ == "__main__":
    main()
