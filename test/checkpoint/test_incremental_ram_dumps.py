"""Incremental dumps of RAM tensor storages (``LazyTensorStorage`` in private memory): a dump onto the storage's
own checkpoint writes only the rows written since, as for memory-mapped storages.

What must hold: the second dump writes one patch file per entry holding exactly the new rows and hard-links the
rest (same inodes); the checkpoint loads bit for bit into a fresh RAM storage (rows never written read as zero);
ring writes that wrap are stamped on both sides of the wrap; in-place edits through views are saved (NOTE [edits
through views]); the row stamps survive ``share_memory_`` (the lineage goes on) and a copy by value starts afresh;
a writer killed during an incremental dump of a RAM storage leaves the previous or the new checkpoint, loadable.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import signal
import sys
import time

import numpy as np
import pytest
import torch
from helpers.factories import make_buffer
from tensordict import NonTensorStack, TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
from torchrl.data.replay_buffers._shared.row_versions import RowVersions

CAPACITY = 400
_CTX = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None


def _rows(start: int, n: int) -> TensorDict:
    """Rows whose values follow from their write index; ``obs`` holds a NaN bit pattern too (bit-identical check)."""
    ids = torch.arange(start, start + n)
    obs = ids.unsqueeze(-1).float() + torch.arange(3).float() / 10
    obs[ids % 7 == 0, 2] = float("nan")
    return TensorDict(
        {"obs": obs, ("next", "reward"): ids.double(), "done": ids % 5 == 0, "step": ids},
        batch_size=[n],
    )


def _buffer(capacity: int = CAPACITY) -> ReplayBuffer:
    return make_buffer(storage=LazyTensorStorage(capacity), batch_size=8)


def _storage_doc(path) -> dict:
    with open(os.path.join(path, "metadata.json")) as f:
        return json.load(f)["metadata"]["component"]["doc"]["parts"]["storage"]["doc"]


def _inodes(path) -> dict[str, int]:
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            out[os.path.relpath(full, path)] = os.stat(full).st_ino
    return out


def _bits(rb: ReplayBuffer) -> dict:
    """Every entry of every written row, as raw bytes (NaNs compare equal); read as a copy (a gather), since a
    view would mark the rows exposed, which the next dump then reads again (NOTE [edits through views])."""
    rows = rb.storage.get(torch.arange(len(rb)))
    return {
        key: rows.get(key).contiguous().view(-1).view(torch.uint8)
        for key in ("obs", ("next", "reward"), "done", "step")
    }


def _loaded(path, capacity: int = CAPACITY) -> ReplayBuffer:
    fresh = _buffer(capacity)
    fresh.loads(path)
    return fresh


def _assert_bit_identical(rb: ReplayBuffer, other: ReplayBuffer) -> None:
    assert len(rb) == len(other)
    assert rb.writer.state_dict() == other.writer.state_dict()
    mine, theirs = _bits(rb), _bits(other)
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


def test_a_ram_storage_re_dumped_writes_only_the_new_rows_and_links_the_rest(tmp_path):
    rb, path = _buffer(), tmp_path / "ckpt"
    rb.extend(_rows(0, 300))
    rb.dumps(path)
    assert "patches" not in _storage_doc(path)  # the first dump is full
    before = _inodes(path)
    rb.extend(_rows(300, 20))
    rb.dumps(path)
    doc = _storage_doc(path)
    assert doc["base_rows"] == 300 and doc["patches"] == [[300, 320]] and doc["saved_rows"] == 320
    after = _inodes(path)
    for name in (
        "storage/obs.memmap",
        "storage/next/reward.memmap",
        "storage/done.memmap",
        "storage/step.memmap",
    ):
        assert after[name] == before[name]  # the base rows: the same files, not a byte copied
    new = sorted(name for name in after if name not in before)
    assert len(new) == 4 and all(name.startswith("storage_patches/") for name in new)
    sizes = {os.path.getsize(path / name) for name in new}
    assert sizes == {20 * 3 * 4, 20 * 8, 20 * 1}  # obs (3 float32), reward and step (8 bytes), done (1 byte)
    _assert_bit_identical(rb, _loaded(path))


def test_rows_never_written_load_as_zero_and_a_loaded_ram_storage_increments_its_checkpoint(tmp_path):
    rb, path = _buffer(), tmp_path / "ckpt"
    rb.extend(_rows(0, 120))
    rb.dumps(path)
    assert (_loaded(path).storage.get_entry("step")[120:] == 0).all()  # the rows past the saved ones: zero
    resumed = _loaded(path)
    _assert_bit_identical(rb, resumed)
    resumed.extend(_rows(120, 5))  # a run resumed from `path` checkpoints there again: only the new rows
    resumed.dumps(path)
    assert _storage_doc(path)["patches"] == [[120, 125]]
    rb.extend(_rows(120, 5))
    _assert_bit_identical(rb, _loaded(path))


def test_ring_writes_that_wrap_are_patched_on_both_sides_of_the_wrap(tmp_path):
    rb, path = _buffer(), tmp_path / "ckpt"
    rb.extend(_rows(0, 390))
    rb.dumps(path)
    rb.extend(_rows(390, 25))  # rows 390..399, then 0..14
    rb.dumps(path)
    assert _storage_doc(path)["patches"] == [[0, 15], [390, 400]]
    _assert_bit_identical(rb, _loaded(path))
    rb[torch.tensor([50, 51, 200])] = _rows(9_000, 3)  # item assignment: an index, not a ring
    rb.dumps(path)
    patches = _storage_doc(path)["patches"]
    assert [50, 52] in patches and [200, 201] in patches
    _assert_bit_identical(rb, _loaded(path))


def test_edits_through_views_of_a_private_ram_storage_are_saved(tmp_path):
    rb, path = _buffer(), tmp_path / "ckpt"
    rb.extend(_rows(0, 300))
    rb.dumps(path, fsync=False)
    rb[0:10]["obs"].add_(1)  # a view edited then dropped
    held = rb[200:205]  # a view held across dumps
    rb.storage.get_entry("step")[250] = -1  # a column handed out whole
    rb.dumps(path, fsync=False)
    held["obs"].fill_(0)  # edited after the dump that saw it
    rb.dumps(path, fsync=False)
    assert "patches" in _storage_doc(path)  # still incremental: only the exposed blocks were read again
    loaded = _loaded(path)
    _assert_bit_identical(rb, loaded)
    assert int(loaded.storage.get_entry("step")[250]) == -1 and (loaded[200:205]["obs"] == 0).all()


def test_row_stamps_survive_sharing_and_a_copy_by_value_dumps_in_full_first(tmp_path):
    rb, path = _buffer(), tmp_path / "ckpt"
    rb.extend(_rows(0, 100))
    rb.dumps(path)
    rb.storage.share_memory_()  # the same stamps, now in shared memory: the checkpoint stays this storage's
    rb.extend(_rows(100, 10))
    rb.dumps(path)
    assert _storage_doc(path)["patches"] == [[100, 110]]

    private, other = _buffer(), tmp_path / "other"
    private.extend(_rows(0, 100))
    private.dumps(other)
    # a copy by value: its own rows and fresh stamps, so it cannot tell what changed
    copy = pickle.loads(pickle.dumps(private.storage))
    copy.set(torch.arange(100, 103), _rows(100, 3))
    copy.dumps(other)
    assert "patches" not in json.loads((other / "metadata.json").read_text())["metadata"]["component"]["doc"]
    copy.set(torch.arange(103, 105), _rows(103, 2))
    copy.dumps(other)  # its own checkpoint now: incremental
    assert json.loads((other / "metadata.json").read_text())["metadata"]["component"]["doc"]["patches"] == [
        [103, 105]
    ]


def test_grids_of_cells_and_string_entries_increment_and_load(tmp_path):
    grid, path = make_buffer(storage=LazyTensorStorage(400, ndim=2), batch_size=4), tmp_path / "grid"
    grid.extend(TensorDict(obs=torch.arange(200.0).reshape(2, 100), batch_size=[2, 100]))  # [envs, time]
    grid.dumps(path)
    grid.extend(TensorDict(obs=-torch.arange(4.0).reshape(2, 2), batch_size=[2, 2]))
    grid.dumps(path)
    assert _storage_doc(path)["patches"] == [[100, 102]]  # rows of the [time, envs] grid
    fresh = make_buffer(storage=LazyTensorStorage(400, ndim=2), batch_size=4)
    fresh.loads(path)
    assert len(fresh) == len(grid) and torch.equal(
        fresh.storage.get_entry("obs"), grid.storage.get_entry("obs")
    )

    texts, path = _buffer(), tmp_path / "texts"
    texts.extend(
        TensorDict(obs=torch.arange(100.0), text=NonTensorStack(*map(str, range(100))), batch_size=[100])
    )
    texts.dumps(path)
    texts.extend(TensorDict(obs=torch.zeros(2), text=NonTensorStack("x", "y"), batch_size=[2]))
    texts.dumps(path)
    assert _storage_doc(path)["patches"] == [[100, 102]]
    fresh = _buffer()
    fresh.loads(path)
    assert fresh.storage.get(torch.arange(98, 102))["text"].tolist() == ["98", "99", "x", "y"]


def test_a_compilable_ram_storage_dumps_in_full_and_loads(tmp_path):
    storage, path = LazyTensorStorage(CAPACITY, compilable=True), tmp_path / "s"
    storage.set(torch.arange(50), _rows(0, 50))
    storage.dumps(path)
    storage.set(torch.arange(50, 60), _rows(50, 10))
    storage.dumps(path)  # compiled ring writes stamp no rows: always a full dump
    assert "patches" not in json.loads((path / "metadata.json").read_text())["metadata"]["component"]["doc"]
    fresh = LazyTensorStorage(CAPACITY)
    fresh.set(0, _rows(0, 1)[0])
    fresh.loads(path)
    assert len(fresh) == 60 and torch.equal(fresh[:]["step"], torch.arange(60))


def test_private_row_versions_stamp_ring_writes_share_in_place_and_pickle_afresh():
    versions = RowVersions(6, shared=False)
    assert not versions.is_shared
    snap = versions.snapshot()
    versions.begin_ring(4, 3)  # rows 4, 5, then 0
    versions.end()
    assert versions.torn(snap, np.arange(6)).tolist() == [True, False, False, False, True, True]
    snap = versions.snapshot()
    versions.begin_ring(2, 9)  # more rows than the ring: every row
    versions.end()
    assert versions.torn(snap, np.arange(6)).all()
    snap = versions.snapshot()
    versions.begin(np.array([1]))
    versions.end()
    assert versions.share_memory_() is versions and versions.is_shared
    assert versions.torn(snap, np.arange(6)).tolist() == [False, True, False, False, False, False]  # kept
    private = RowVersions(3, shared=False)
    private.begin(np.array([0]))
    private.end()
    copy = pickle.loads(pickle.dumps(private))
    assert not copy.is_shared and len(copy) == 3 and copy.snapshot() == 0


# -- crash safety (SIGKILL of a forked writer; see test_incremental_crash.py for the memory-mapped case) ---------
_STEP = 17
_CRASH_CAPACITY = 512


def _crash_rows(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(obs=ids.unsqueeze(-1).float().expand(n, 16).clone(), step=ids, batch_size=[n])


def _crash_buffer() -> ReplayBuffer:
    return make_buffer(storage=LazyTensorStorage(_CRASH_CAPACITY), batch_size=4)


def _check_crash_checkpoint(path) -> int:
    rb = _crash_buffer()
    rb.loads(path)
    total = rb.writer.write_count
    assert len(rb) == min(total, _CRASH_CAPACITY)
    steps = rb[:]["step"]
    expected = torch.tensor(
        [row + (total - 1 - row) // _CRASH_CAPACITY * _CRASH_CAPACITY for row in range(len(rb))]
    )
    assert torch.equal(steps, expected)
    assert (rb[:]["obs"] == steps.unsqueeze(-1).float()).all()
    return total


def _ram_writer_loop(path: str, done, step_kill, seed: int) -> None:
    torch.set_num_threads(1)  # OpenMP's pool does not survive fork
    rb = _crash_buffer()
    rb.extend(_crash_rows(0, 300))
    rb.dumps(path, fsync=False)
    done.value = rb.writer.write_count
    rng = random.Random(seed)
    if step_kill is None:
        _checkpoint_fs.STEP_HOOK = lambda name: time.sleep(rng.uniform(0, 0.003))
    else:
        step, nth = step_kill
        seen = [0]

        def hook(name: str) -> None:
            if name == step:
                seen[0] += 1
                if seen[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

        _checkpoint_fs.STEP_HOOK = hook
    while True:
        rb.extend(_crash_rows(rb.writer.write_count, _STEP))
        rb.dumps(path, fsync=rng.random() < 0.5)
        done.value = rb.writer.write_count


def _after_the_kill(path, committed: int) -> None:
    total = _check_crash_checkpoint(path)
    assert total in (committed, committed + _STEP), (total, committed)
    other = _crash_buffer()  # the next writer recovers and writes
    other.extend(_crash_rows(0, 50))
    other.dumps(path)
    assert _check_crash_checkpoint(path) == 50


_CRASH_STEPS = [
    ("tensor_written", 7),
    ("metadata_written", 3),
    ("before_switch", 3),
    ("after_parent_sync", 3),
]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.skipif(_CTX is None, reason="forks writers and sends SIGKILL")
@pytest.mark.parametrize("step, nth", _CRASH_STEPS, ids=[s for s, _ in _CRASH_STEPS])
def test_a_kill_during_an_incremental_ram_dump_leaves_a_loadable_checkpoint(tmp_path, step, nth):
    path = str(tmp_path / "ckpt")
    done = _CTX.Value("q", 0, lock=False)
    child = _CTX.Process(target=_ram_writer_loop, args=(path, done, (step, nth), 0))
    child.start()
    child.join(60)
    assert not child.is_alive() and child.exitcode == -signal.SIGKILL, child.exitcode
    assert done.value > 300  # the kill came during an incremental dump (the first two completed)
    _after_the_kill(path, done.value)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.skipif(_CTX is None, reason="forks writers and sends SIGKILL")
@pytest.mark.parametrize("trial", range(6))
def test_a_kill_at_a_random_time_during_ram_dumps_leaves_the_old_or_the_new_checkpoint(tmp_path, trial):
    rng = random.Random(trial)
    path = str(tmp_path / "ckpt")
    done = _CTX.Value("q", 0, lock=False)
    child = _CTX.Process(target=_ram_writer_loop, args=(path, done, None, trial))
    child.start()
    deadline = time.monotonic() + 30
    while done.value < 300 + _STEP * (1 + trial % 3) and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.05))
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    _after_the_kill(path, done.value)


def test_deferred_ring_stamps_are_seen_by_every_reader_of_the_versions():
    """Private ring writes are stamped when the versions are read (NOTE [deferred ring stamps]): a snapshot
    taken before them sees exactly their rows as written since, wraps and continued writes included."""
    versions = RowVersions(10, shared=False)
    before = versions.snapshot()
    versions.stamp_ring(8, 3)  # rows 8, 9, 0
    versions.stamp_ring(1, 2)  # continues it: rows 1, 2
    versions.stamp_ring(5, 1)  # a write elsewhere: row 5
    assert versions.torn(before, np.arange(10)).tolist() == [True, True, True, False, False, True, False, False,
                                                             True, True]  # fmt: skip
    after = versions.snapshot()
    assert versions.torn(after, np.arange(10)) is None  # nothing since
    for _ in range(3 * RowVersions._MAX_PENDING):  # many writes that do not continue each other
        versions.stamp_ring(3, 1)
        versions.stamp_ring(6, 1)
    assert versions.torn(after, np.arange(10)).nonzero()[0].tolist() == [3, 6]
    shared_later = versions.snapshot()
    versions.stamp_ring(4, 1)
    versions.share_memory_()  # sharing stamps what was deferred
    assert versions.torn(shared_later, np.arange(10)).nonzero()[0].tolist() == [4]
