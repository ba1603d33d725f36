"""Dumps of a buffer that another process writes meanwhile: every saved row is whole (NOTE [consistent dumps]).

A writer process extends a shared buffer with tagged rows (every leaf of a row encodes the same tag) while this
process dumps it again and again, onto new directories (full dumps) and onto the same one (incremental dumps);
each checkpoint is loaded into a fresh buffer and every row checked.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
from helpers.factories import tagged_rows, torn_rows
from helpers.targets import child_write_tagged

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

CAPACITY, BATCH, DUMPS = 2_000, 50, 8


def _buffer(kind: str, tmp_path, name: str) -> ReplayBuffer:
    if kind == "memmap":
        return ReplayBuffer(storage=LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path / name))
    return ReplayBuffer(storage=LazyTensorStorage(CAPACITY), shared=True)


@pytest.mark.parametrize("kind", ["memmap", "tensor"])
def test_dumps_during_writes_hold_no_torn_row(kind, tmp_path):
    rb = _buffer(kind, tmp_path, "live")
    rb.extend(tagged_rows(9, 0, CAPACITY))  # full: every dump saves every row
    ctx = mp.get_context("fork")
    writer = ctx.Process(target=child_write_tagged, args=(rb, 1, 1_000_000, BATCH), daemon=True)
    writer.start()
    try:
        for i in range(DUMPS):
            path = tmp_path / ("same" if i % 2 else f"full{i}")  # odd dumps: incremental onto one directory
            rb.dumps(path, fsync=False)
            loaded = _buffer(kind, tmp_path, f"loaded{i}")
            loaded.loads(path)
            rows = loaded.storage[:]
            assert len(rows) == CAPACITY
            assert torn_rows(rows) == 0, f"dump {i}: {torn_rows(rows)} torn rows"
        assert writer.is_alive(), "the writer ended before the dumps: the test saw no concurrent write"
    finally:
        writer.kill()
        writer.join(10)

