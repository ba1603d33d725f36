"""Writes and draws of tensor storages read no number back from a tensor (no device-to-host sync).

Counted at the dispatcher on the CPU with :class:`helpers.syncs.SyncCounter`: what would stall a GPU stream
(``.item()``, ``nonzero``, boolean-mask indexing, ``unique``, ...). Writers hand the storage their ring rows
(``write_rows(..., ring=(start, n))``) and this package's samplers draw in bounds (``draws_in_bounds``), so
neither side needs a bounds check on the tensors.
"""

from __future__ import annotations

import pytest
import torch
from helpers.syncs import SyncCounter
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)


def _rows(n: int) -> TensorDict:
    return TensorDict(obs=torch.randn(n, 4), action=torch.randint(0, 3, (n,)), batch_size=[n])


def _storage(kind, tmp_path):
    if kind == "memmap":
        return LazyMemmapStorage(300, scratch_dir=tmp_path / "mm")
    return LazyTensorStorage(300, compilable=kind == "compilable")


@pytest.mark.parametrize(
    "kind, sampler",
    [
        ("tensor", RandomSampler),
        ("compilable", RandomSampler),
        ("memmap", RandomSampler),
        ("tensor", SamplerWithoutReplacement),
        ("memmap", SamplerWithoutReplacement),
        ("compilable", SamplerWithoutReplacement),
    ],
)
def test_extend_and_sample_do_not_sync(kind, sampler, tmp_path):
    sampler = sampler(drop_last=True) if sampler is SamplerWithoutReplacement else sampler()
    rb = TensorDictReplayBuffer(storage=_storage(kind, tmp_path), sampler=sampler, batch_size=64)
    rb.extend(_rows(100))
    for _ in range(6):  # the ring wraps: 100 + 6 * 64 rows into 300
        with SyncCounter() as syncs:
            rb.extend(_rows(64))
        assert syncs.count == 0, syncs.ops
        with SyncCounter() as syncs:
            batch = rb.sample()
        assert syncs.count == 0, syncs.ops
        assert batch.batch_size == (64,)


def test_plain_buffer_of_tensors_does_not_sync():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=16)
    rb.extend(torch.arange(50))
    with SyncCounter() as syncs:
        rb.extend(torch.arange(64))
        rb.sample()
    assert syncs.count == 0, syncs.ops


def test_ring_writes_keep_the_bookkeeping_of_checked_writes():
    ring = LazyTensorStorage(10)
    checked = LazyTensorStorage(10)
    rb = ReplayBuffer(storage=ring)
    for n in (3, 4, 5, 12, 1):
        index = rb.extend(torch.arange(n))
        written = index[-10:]
        checked.set(written, torch.arange(n)[-10:])  # the same rows through the checked path
        assert ring.last_written_row == checked.last_written_row
        assert ring.append_state()[1:] == checked.append_state()[1:]
        assert len(ring) == len(checked)
    assert (ring[:] == checked[:]).all()


def test_indices_given_by_users_are_still_checked():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(3), torch.zeros(3))
    with pytest.raises(IndexError):
        storage.get(torch.tensor([0, 5]))  # row 5 holds no data
    with pytest.raises(IndexError):
        storage.set(torch.tensor([0, 12]), torch.zeros(2))
    assert len(storage) == 3
