"""Loading a checkpoint into a memory-mapped storage whose ``scratch_dir`` is the checkpoint's own ``storage``
directory never changes the checkpoint: a checkpoint of a full storage dumped in full is mapped in place; any
other is refused before a file is touched."""

from __future__ import annotations

import os

import pytest
import torch

from torchrl.data import LazyMemmapStorage, ReplayBuffer


def _sizes(path) -> dict:
    folder = os.path.join(path, "storage")
    return {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}


def _checkpoint(tmp_path, rows: int, incremental: bool) -> str:
    rb = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=tmp_path / "live"))
    rb.extend(torch.arange(rows).float())
    path = str(tmp_path / "ckpt")
    rb.dumps(path, fsync=False)
    if incremental:
        rb.extend(torch.arange(5).float())
        rb.dumps(path, fsync=False)  # base rows + a patch
    return path


@pytest.mark.parametrize("rows, incremental", [(50, False), (100, True), (50, True)], ids=["partial", "patched", "both"])
@pytest.mark.parametrize("existsok", [False, True])
def test_a_checkpoint_that_cannot_be_mapped_in_place_is_refused(tmp_path, rows, incremental, existsok):
    path = _checkpoint(tmp_path, rows, incremental)
    before = _sizes(path)
    own = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=os.path.join(path, "storage"), existsok=existsok))
    with pytest.raises(ValueError, match="holds the checkpoint's own files"):
        own.loads(path)
    assert _sizes(path) == before
    copy = ReplayBuffer(storage=LazyMemmapStorage(100))
    copy.loads(path)  # the checkpoint still loads, whole
    assert len(copy) == (rows + 5 if incremental and rows < 100 else rows)


def test_a_full_checkpoint_is_mapped_in_place_and_unchanged_by_the_load(tmp_path):
    path = _checkpoint(tmp_path, 100, incremental=False)
    before = _sizes(path)
    own = ReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=os.path.join(path, "storage"), existsok=True))
    own.loads(path)
    assert len(own) == 100 and own[:].tolist() == list(range(100))
    assert _sizes(path) == before
    copy = ReplayBuffer(storage=LazyMemmapStorage(100))
    copy.loads(path)
    assert copy[:].tolist() == list(range(100))
