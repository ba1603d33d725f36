"""Incremental dumps: a dump onto a storage's own checkpoint rewrites only the rows written since.

What must hold: the checkpoint loads to exactly the dumped content whatever mix of full and incremental dumps
built it; files of the previous checkpoint are never modified (unchanged ones are hard-linked, same inode); only a
checkpoint this storage wrote, or loaded, is incremented (another storage's, a copy's, an edited one: full dump);
RAM storages, private or shared, increment too (``test_incremental_ram_dumps.py``), while
``TensorStorageCheckpointer(incremental=False)`` always dumps in full; crafted patch
descriptions are refused before anything is loaded; a writer killed at any moment leaves the previous or the new
checkpoint, loadable (see ``test_incremental_crash.py``).
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
from helpers.factories import rewrite_checkpoint_metadata
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorStorageCheckpointer,
)
from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
from torchrl.data.replay_buffers.checkpointers import CheckpointError
from torchrl.data.replay_buffers.storages import _incremental

CAPACITY = 400


def _rows(start: int, n: int) -> TensorDict:
    """Rows whose every value is a function of their write index (``start`` .. ``start + n - 1``)."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": ids.unsqueeze(-1).float() + torch.arange(3).float() / 10,
            ("next", "reward"): ids.double(),
            "done": ids % 5 == 0,
        },
        batch_size=[n],
    )


class Filled:
    """A buffer over a memory-mapped storage and a count of the rows written so far."""

    def __init__(self, tmp_path, name: str = "live", storage=None):
        self.storage = storage if storage is not None else LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path / name)
        self.rb = ReplayBuffer(storage=self.storage, batch_size=8)
        self.written = 0

    def extend(self, n: int) -> None:
        self.rb.extend(_rows(self.written, n))
        self.written += n


def _part(metadata: dict) -> dict:
    return metadata["component"]["doc"]["parts"]["storage"]["doc"]


def _storage_doc(path) -> dict:
    with open(os.path.join(path, "metadata.json")) as f:
        return _part(json.load(f)["metadata"])


def _inodes(path) -> dict[str, int]:
    out = {}
    for folder, _, files in os.walk(path):
        for f in files:
            full = os.path.join(folder, f)
            out[os.path.relpath(full, path)] = os.stat(full).st_ino
    return out


def _loaded(path, tmp_path, name: str = "fresh") -> ReplayBuffer:
    fresh = ReplayBuffer(storage=LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path / name), batch_size=8)
    fresh.loads(path)
    return fresh


def _assert_same(rb: ReplayBuffer, other: ReplayBuffer) -> None:
    assert len(rb) == len(other)
    rows = torch.arange(len(rb))  # a copy of the rows: rb[:] would hand out views, which later dumps check by digest
    assert (rb.storage.get(rows) == other.storage.get(rows)).all()
    assert rb.writer.state_dict() == other.writer.state_dict()


def test_a_dump_onto_its_own_checkpoint_writes_only_the_new_rows_and_links_the_rest(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(300)
    buf.rb.dumps(path)
    assert "patches" not in _storage_doc(path)  # the first dump is full
    before = _inodes(path)
    buf.extend(20)
    buf.rb.dumps(path)
    doc = _storage_doc(path)
    assert doc["base_rows"] == 300 and doc["patches"] == [[300, 320]] and doc["saved_rows"] == 320
    after = _inodes(path)
    for name in ("storage/obs.memmap", "storage/next/reward.memmap", "storage/done.memmap"):
        assert after[name] == before[name]  # the base rows: the same files, not a byte copied
    new = sorted(name for name in after if name not in before)
    assert new and all(name.startswith("storage_patches/") for name in new)
    assert os.path.getsize(path / new[0]) < os.path.getsize(path / "storage/done.memmap")
    _assert_same(buf.rb, _loaded(path, tmp_path))


def test_wrapping_writes_and_scattered_item_assignments_round_trip_through_patches(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(CAPACITY)
    buf.rb.dumps(path)
    buf.extend(30)  # rows 0..29 overwritten
    buf.rb.dumps(path)
    assert _storage_doc(path)["patches"] == [[0, 30]]
    buf.rb[torch.tensor([50, 51, 120, 390])] = _rows(10_000, 4)  # item assignment: stamped rows too
    buf.rb.dumps(path)
    doc = _storage_doc(path)
    assert doc["patches"][:1] == [[0, 30]] and [50, 52] in doc["patches"] and [390, 391] in doc["patches"]
    _assert_same(buf.rb, _loaded(path, tmp_path))
    buf.rb.dumps(path)  # nothing written since: everything linked, the same patches
    assert _storage_doc(path)["patches"] == doc["patches"]
    _assert_same(buf.rb, _loaded(path, tmp_path, "fresh2"))


def test_many_scattered_rows_are_merged_into_a_bounded_number_of_patches(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(CAPACITY)
    buf.rb.dumps(path)
    rows = torch.arange(0, 60, 3)  # 20 separate rows
    buf.rb[rows] = _rows(5_000, rows.numel())
    buf.rb.dumps(path)
    patches = _storage_doc(path)["patches"]
    assert len(patches) <= _incremental.MAX_NEW_PATCHES
    covered = {r for start, stop in patches for r in range(start, stop)}
    assert set(rows.tolist()) <= covered
    _assert_same(buf.rb, _loaded(path, tmp_path))


def test_patches_are_compacted_into_a_full_dump_past_a_quarter_of_the_rows(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(CAPACITY)
    buf.rb.dumps(path)
    kinds = []
    for _ in range(6):
        buf.extend(CAPACITY // 20)  # 5% each: the sixth dump would patch 30% of the rows
        buf.rb.dumps(path)
        kinds.append("patches" in _storage_doc(path))
    assert kinds == [True] * 5 + [False]
    assert not os.path.exists(path / "storage_patches")
    _assert_same(buf.rb, _loaded(path, tmp_path))


def test_only_a_checkpoint_of_this_storage_is_incremented(tmp_path):
    path = tmp_path / "ckpt"
    mine, other = Filled(tmp_path, "a"), Filled(tmp_path, "b")
    mine.extend(100)
    other.extend(100)
    mine.rb.dumps(path)
    other.rb.dumps(path)  # another storage's checkpoint: full
    assert "patches" not in _storage_doc(path)
    mine.extend(5)
    mine.rb.dumps(path)  # the checkpoint at `path` is not mine any more: full
    assert "patches" not in _storage_doc(path)
    _assert_same(mine.rb, _loaded(path, tmp_path))


def test_a_copy_with_its_own_row_versions_dumps_in_full(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(100)
    buf.rb.dumps(path)
    copy = pickle.loads(pickle.dumps(buf.storage))  # same files, fresh row versions: it cannot tell what changed
    copy.set(torch.arange(100, 103), _rows(100, 3))
    copy.dumps(path)
    assert "patches" not in json.loads((path / "metadata.json").read_text())["metadata"]["component"]["doc"]


def test_private_and_shared_ram_storages_increment_and_the_opt_out_dumps_in_full(tmp_path):
    path = tmp_path / "ckpt"
    private = Filled(tmp_path, storage=LazyTensorStorage(CAPACITY))
    private.extend(100)
    private.rb.dumps(path)
    private.extend(5)
    private.rb.dumps(path)
    assert _storage_doc(path)["patches"] == [[100, 105]]  # private row versions say which rows changed

    shared = Filled(tmp_path, storage=LazyTensorStorage(CAPACITY))
    shared.extend(100)
    shared.storage.share_memory_()
    shared.rb.dumps(path)
    shared.extend(5)
    shared.rb.dumps(path)
    assert _storage_doc(path)["patches"] == [[100, 105]]

    opted_out = Filled(tmp_path)
    opted_out.storage.checkpointer = TensorStorageCheckpointer(incremental=False)
    opted_out.extend(100)
    opted_out.rb.dumps(path)
    opted_out.extend(5)
    opted_out.rb.dumps(path)
    assert "patches" not in _storage_doc(path)
    with pytest.raises(TypeError, match="incremental"):
        TensorStorageCheckpointer(incremental="yes")


def test_storage_dumps_increment_too_and_load_through_the_checkpointer(tmp_path):
    storage, path = LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path / "live"), tmp_path / "s"
    storage.set(torch.arange(50), _rows(0, 50))
    storage.dumps(path)
    storage.set(torch.arange(50, 60), _rows(50, 10))
    storage.dumps(path)
    doc = json.loads((path / "metadata.json").read_text())["metadata"]["component"]["doc"]
    assert doc["patches"] == [[50, 60]]
    fresh = LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path / "fresh")
    fresh.set(0, _rows(0, 1)[0])
    fresh.loads(path)
    assert len(fresh) == 60 and (fresh[:] == storage[:]).all()


def test_a_storage_loaded_from_a_checkpoint_increments_it_and_forgets_the_others(tmp_path):
    first, a, b = Filled(tmp_path, "first"), tmp_path / "a", tmp_path / "b"
    first.extend(200)
    first.rb.dumps(a)
    first.extend(50)
    first.rb.dumps(b)

    resumed = Filled(tmp_path, "resumed")
    resumed.rb.loads(a)
    resumed.written = 200
    resumed.extend(10)
    resumed.rb.dumps(a)  # a run resumed from `a` checkpoints there again: only the new rows
    assert _storage_doc(a)["patches"][-1] == [200, 210]
    _assert_same(resumed.rb, _loaded(a, tmp_path))

    first.rb.loads(a)  # content replaced without row writes: `b` must not be taken as up to date
    first.rb.dumps(b)
    assert "patches" not in _storage_doc(b)
    _assert_same(resumed.rb, _loaded(b, tmp_path, "fresh2"))


def test_an_edited_file_of_the_previous_checkpoint_is_never_reused(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(100)
    buf.rb.dumps(path)
    target = path / "storage" / "obs.memmap"
    with open(target, "r+b") as f:  # someone edits the checkpoint (its mtime changes)
        f.write(b"\0" * 12)
    os.utime(target, ns=(0, 0))
    buf.extend(5)
    buf.rb.dumps(path)
    assert "patches" not in _storage_doc(path)
    _assert_same(buf.rb, _loaded(path, tmp_path))


def test_a_previous_checkpoint_removed_during_the_dump_gives_a_full_dump(tmp_path):
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(100)
    buf.rb.dumps(path)
    buf.extend(5)
    removed = []

    def remove_base_files(step):  # another writer replaced the checkpoint after this one read it
        if step == "tmp_created" and not removed:
            removed.append(step)
            os.remove(path / "storage" / "obs.memmap")

    _checkpoint_fs.STEP_HOOK = remove_base_files
    try:
        buf.rb.dumps(path)
    finally:
        _checkpoint_fs.STEP_HOOK = None
    assert removed and "patches" not in _storage_doc(path)
    _assert_same(buf.rb, _loaded(path, tmp_path))


def _crafted(tmp_path, edit) -> str:
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(100)
    buf.rb.dumps(path)
    buf.extend(10)
    buf.rb.dumps(path)
    rewrite_checkpoint_metadata(path, lambda document: edit(_part(document["metadata"])))
    return path


CRAFTED = {
    "uncovered-rows": (lambda d: d.update(base_rows=90), CheckpointError, "neither base rows nor in a patch"),
    "base-rows-above-saved": (lambda d: d.update(base_rows=111), CheckpointError, "base_rows"),
    "reversed-range": (lambda d: d["patches"].__setitem__(0, [105, 100]), CheckpointError, r"patches\[0\]\[1\]"),
    "range-past-rows": (lambda d: d["patches"].__setitem__(0, [100, 120]), CheckpointError, r"patches\[0\]\[1\]"),
    "not-a-range": (lambda d: d["patches"].__setitem__(0, "0-10"), CheckpointError, "expected \\[start, stop\\]"),
    "patches-not-a-list": (lambda d: d.update(patches={"a": 1}), CheckpointError, "`patches` is not a list"),
    "missing-patch-tensor": (lambda d: d["leaves"][0].update(patches=[]), CheckpointError, "one tensor per patch"),
    "wrong-patch-shape": (lambda d: d["patches"].__setitem__(0, [99, 110]), ValueError, "does not match"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_patch_descriptions_are_refused_before_anything_is_loaded(tmp_path, case):
    edit, error, match = CRAFTED[case]
    path = _crafted(tmp_path, edit)
    target = Filled(tmp_path, "target")
    target.extend(7)
    before = target.rb[:].clone()
    with pytest.raises(error, match=match):
        target.rb.loads(path)
    assert len(target.rb) == 7 and (target.rb[:] == before).all()


def test_an_incremental_checkpoint_is_not_loaded_into_its_own_files(tmp_path):
    # issue 40: mapping it in place wrote the patches into the base files, changing the checkpoint (its base
    # file no longer matched its metadata); the load is refused before a file is touched
    buf, path = Filled(tmp_path), tmp_path / "ckpt"
    buf.extend(CAPACITY)
    buf.rb.dumps(path)
    buf.extend(10)
    buf.rb.dumps(path)
    assert _storage_doc(path)["patches"] == [[0, 10]]
    adopted = LazyMemmapStorage(CAPACITY, scratch_dir=path / "storage", existsok=True)
    with pytest.raises(ValueError, match="an incremental checkpoint"):
        ReplayBuffer(storage=adopted, batch_size=8).loads(path)
    _assert_same(buf.rb, _loaded(path, tmp_path))  # the checkpoint loads as saved
    full = path.with_name("full")
    buf.rb.dumps(full)  # a full dump of the same rows...
    adopted = LazyMemmapStorage(CAPACITY, scratch_dir=full / "storage", existsok=True)
    rb = ReplayBuffer(storage=adopted, batch_size=8)
    rb.loads(full)  # ...is mapped in place
    assert os.path.samefile(adopted.get_entry("obs").filename, full / "storage" / "obs.memmap")
    _assert_same(buf.rb, rb)
    rb.extend(_rows(7_000, 3))
    rb.dumps(full)  # the storage lives in the checkpoint: linked whole, no patches
    assert "patches" not in _storage_doc(full)
    _assert_same(rb, _loaded(full, tmp_path, "fresh_full"))


@pytest.mark.parametrize("kind", ["memmap", "ram"])
def test_loads_copied_by_several_threads_in_row_ranges_give_the_saved_rows(tmp_path, monkeypatch, kind):
    from torchrl.data.replay_buffers.storages import _checkpoint as storage_checkpoint

    monkeypatch.setattr(storage_checkpoint, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(storage_checkpoint, "_PARALLEL_CHUNK_BYTES", 1000)  # many ranges per leaf
    make = (lambda name: LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path / name)) if kind == "memmap" else (
        lambda name: LazyTensorStorage(CAPACITY)
    )
    buf, path = Filled(tmp_path, storage=make("live")), tmp_path / "ckpt"
    buf.storage.share_memory_()
    buf.extend(CAPACITY)
    buf.rb.dumps(path)
    buf.extend(20)
    buf.rb.dumps(path)
    fresh = ReplayBuffer(storage=make("fresh"), batch_size=8)
    fresh.loads(path)
    _assert_same(buf.rb, fresh)
