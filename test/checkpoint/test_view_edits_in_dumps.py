"""Incremental dumps save in-place edits made through views of the storage (NOTE [edits through views]): the
rows of every view a storage hands out are checked by digest at each dump onto its checkpoint."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.storages import _incremental as inc


def _rows(start: int, n: int) -> TensorDict:
    return TensorDict(obs=torch.arange(start, start + n).float().unsqueeze(-1).expand(n, 3).clone(), batch_size=[n])


def _buffer(kind: str, tmp_path) -> ReplayBuffer:
    if kind == "memmap":
        return ReplayBuffer(storage=LazyMemmapStorage(2_000, scratch_dir=tmp_path / "live"))
    return ReplayBuffer(storage=LazyTensorStorage(2_000), shared=True)  # shared: row versions, incremental dumps


def _loaded(path, kind: str, tmp_path, name: str) -> torch.Tensor:
    rb = _buffer(kind, tmp_path / name)
    rb.loads(path)
    return rb[:]["obs"].clone()


def _patches(path) -> list:
    import json

    doc = json.loads((path / "metadata.json").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "leaves" in node and "saved_rows" in node:
                found.append(node.get("patches"))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    return found[0]


@pytest.mark.parametrize("kind", ["memmap", "tensor"])
def test_edits_through_views_reach_incremental_dumps(kind, tmp_path):
    rb = _buffer(kind, tmp_path)
    rb.extend(_rows(0, 1_500))
    path = tmp_path / "ckpt"
    rb.dumps(path, fsync=False)
    rb[0:10]["obs"].add_(1)  # a view dropped at once, edited before the dump
    held = rb[1_000:1_010]  # a view held across dumps
    rb.dumps(path, fsync=False)
    assert _patches(path) is not None  # still incremental
    held["obs"].mul_(0)  # edited after the dump that saw it
    rb.extend(_rows(5_000, 5))
    rb.dumps(path, fsync=False)
    patches = _patches(path)
    assert patches is not None and len(patches) < 6  # incremental: only the exposed blocks and new rows
    expected = rb[:]["obs"].clone()
    assert (expected[:10, 0] == torch.arange(1, 11).float()).all() and (expected[1_000:1_010] == 0).all()
    assert torch.equal(_loaded(path, kind, tmp_path, "a"), expected)


def test_get_entry_and_single_rows_count_as_views(tmp_path):
    rb = _buffer("memmap", tmp_path)
    rb.extend(_rows(0, 600))
    path = tmp_path / "ckpt"
    rb.dumps(path, fsync=False)
    rb.storage.get(5)["obs"].fill_(-1)
    rb.storage.get_entry("obs")[599].fill_(-2)
    rb.dumps(path, fsync=False)
    loaded = _loaded(path, "memmap", tmp_path, "b")
    assert (loaded[5] == -1).all() and (loaded[599] == -2).all()


def test_rows_never_viewed_are_not_read_for_digests(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(1_000, scratch_dir=tmp_path / "live"), batch_size=8)
    rb.extend(TensorDict(obs=torch.zeros(1_000, 3), episode=torch.zeros(1_000, dtype=torch.long), batch_size=[1_000]))
    storage = rb.storage
    keys = [("episode",), ("obs",)]
    rb.sample()  # gathers copy: nothing exposed
    assert not storage._exposed
    storage.get_entry("episode")  # a column read (what slice samplers do): that entry only
    digests = inc.block_digests(storage._storage, keys, 1_000, storage._exposed)
    assert {position for position, _ in digests} == {0} and len(digests) == -(-1_000 // inc.BLOCK_ROWS)
    rb[10:20]  # rows 10..19 of every entry
    digests = inc.block_digests(storage._storage, keys, 1_000, storage._exposed)
    assert {block for position, block in digests if position == 1} == {0}
