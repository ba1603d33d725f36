"""TorchRL compatibility of the memory-mapped, list and compressed storages (behaviour facts §2, §7, §8), and the
scratch-directory defects of issue 29 item 7.

- ``LazyMemmapStorage(scratch_dir=..., auto_cleanup=...)``, ``cleanup()``, removal at exit and on garbage
  collection, ``_MEMMAP_STORAGE_REGISTRY``; a ``scratch_dir`` naming a file is refused at construction.
- ``ReplayBuffer(storage=ListStorage(...)).extend(range(2000))`` (TorchRL's tutorial) and other iterables.
- Pickling for a spawned process: a ListStorage and an uninitialised LazyMemmapStorage are refused with
  TorchRL's phrases.
- ``CompressedListStorage``: slots hold the compressed uint8 tensor, ``decompression_fn(compressed, metadata)``,
  its result returned unchanged, out-of-range writes and unset reads; reads of crafted sizes are bounded.
- ``cleanup_stale_scratch_dirs``: a name with a huge pid is skipped, a copied owner marker is not trusted.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import tracemalloc
import zlib

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers._shared.cleanup as _cleanup
import torchrl.data.replay_buffers.storages as storages_module
from torchrl.data import (
    CompressedListStorage,
    LazyMemmapStorage,
    ListStorage,
    ReplayBuffer,
    cleanup_stale_scratch_dirs,
)
from torchrl.data.replay_buffers.storages import _MEMMAP_STORAGE_REGISTRY

TIMEOUT = 60


def _write(storage, n: int = 3) -> None:
    storage.set(torch.arange(n), torch.ones(n, 2))


# -- auto_cleanup and cleanup() ---------------------------------------------------------------------------------
def test_auto_cleanup_defaults_to_true_without_scratch_dir_and_a_scratch_dir_may_be_auto_cleaned(tmp_path):
    assert LazyMemmapStorage(4).auto_cleanup is True
    assert LazyMemmapStorage(4, scratch_dir=tmp_path / "a").auto_cleanup is False
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "b", auto_cleanup=True)  # was NotImplementedError
    assert storage.auto_cleanup is True
    _write(storage)
    assert (tmp_path / "b").is_dir()


def test_cleanup_removes_the_scratch_dir_once(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "s", auto_cleanup=True)
    _write(storage)
    assert storage.cleanup() is True
    assert not (tmp_path / "s").exists()
    assert storage.cleanup() is False  # second call


def test_cleanup_is_false_on_an_uninitialised_storage_and_removes_nothing(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "mine.txt").write_text("keep")
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "s", auto_cleanup=False)
    assert storage.cleanup() is False
    assert (tmp_path / "s" / "mine.txt").exists()
    assert LazyMemmapStorage(4).cleanup() is False


def test_cleanup_is_false_when_the_directory_is_already_gone(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "s", auto_cleanup=True)
    _write(storage)
    shutil.rmtree(tmp_path / "s")
    assert storage.cleanup() is False


def test_an_explicit_cleanup_removes_a_user_scratch_dir_even_without_auto_cleanup(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "s")
    _write(storage)
    del_later = LazyMemmapStorage(4, scratch_dir=tmp_path / "kept")
    _write(del_later)
    assert storage.cleanup() is True and not (tmp_path / "s").exists()
    del del_later
    gc.collect()
    assert (tmp_path / "kept").is_dir()  # auto_cleanup=False: garbage collection keeps it


def test_cleanup_removes_the_temporary_directory_of_a_storage_without_scratch_dir():
    for auto_cleanup in (True, False):
        storage = LazyMemmapStorage(4, auto_cleanup=auto_cleanup)
        _write(storage)
        path = storage.memmap_dir
        assert os.path.isdir(path)
        assert storage.cleanup() is True and not os.path.exists(path)
        assert storage.get(torch.arange(3)).sum().item() == 6  # mapped data stays readable in this process


def test_garbage_collection_removes_an_auto_cleanup_scratch_dir_but_not_a_copy(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "s", auto_cleanup=True)
    _write(storage)
    copy = pickle.loads(pickle.dumps(storage))
    del copy
    gc.collect()
    assert (tmp_path / "s").is_dir()  # a copy never removes the directory
    del storage
    gc.collect()
    assert not (tmp_path / "s").exists()


EXIT_SCRIPT = """
import sys, torch
from torchrl.data import LazyMemmapStorage
KEEP = []
for path, auto in ((sys.argv[1], "1"), (sys.argv[2], "0")):
    storage = LazyMemmapStorage(4, scratch_dir=path, auto_cleanup=auto == "1")
    storage.set(torch.arange(2), torch.ones(2))
    KEEP.append(storage)  # alive at exit: only the atexit hook can remove the directory
default = LazyMemmapStorage(4)
default.set(torch.arange(2), torch.ones(2))
KEEP.append(default)
print(default.memmap_dir, flush=True)
"""


@pytest.mark.timeout(TIMEOUT)
def test_interpreter_exit_removes_the_directories_of_auto_cleanup_storages_only(tmp_path):
    auto, kept = tmp_path / "auto", tmp_path / "kept"
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(auto), str(kept)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    temp_dir = proc.stdout.split()[0]
    assert not auto.exists() and not os.path.exists(temp_dir)
    assert kept.is_dir() and any(kept.iterdir())


def test_the_registry_holds_exactly_the_auto_cleanup_storages(tmp_path):
    assert storages_module._MEMMAP_STORAGE_REGISTRY is _MEMMAP_STORAGE_REGISTRY
    auto = [LazyMemmapStorage(4), LazyMemmapStorage(4, scratch_dir=tmp_path / "a", auto_cleanup=True)]
    manual = [LazyMemmapStorage(4, auto_cleanup=False), LazyMemmapStorage(4, scratch_dir=tmp_path / "m")]
    assert all(s in _MEMMAP_STORAGE_REGISTRY for s in auto)
    assert not any(s in _MEMMAP_STORAGE_REGISTRY for s in manual)
    members = set(map(id, _MEMMAP_STORAGE_REGISTRY))
    assert {id(s) for s in auto} <= members and not ({id(s) for s in manual} & members)


def test_a_scratch_dir_naming_a_file_is_refused_at_construction(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad in (afile, afile / "sub"):
        with pytest.raises(NotADirectoryError, match=r"`scratch_dir`=.*afile.* is a file, not a directory"):
            LazyMemmapStorage(10, scratch_dir=bad)
    assert afile.read_text() == "x"
    with pytest.raises(TypeError, match="`scratch_dir` must be a str or a path-like"):
        LazyMemmapStorage(10, scratch_dir=5)


# -- ListStorage: extend of any iterable of items -------------------------------------------------------------
def test_a_list_storage_buffer_extends_with_a_range_as_in_the_tutorial():
    torch.manual_seed(0)
    rb = ReplayBuffer(storage=ListStorage(max_size=1000), batch_size=5)
    index = rb.extend(range(2000))
    assert index.shape == (2000,) and len(rb) == 1000
    sample = rb.sample()
    assert sample.shape == (5,) and bool(((sample >= 1000) & (sample < 2000)).all())  # the newest 1000 items


@pytest.mark.parametrize(
    "make", [tuple, list, lambda r: (i for i in r), set], ids=["tuple", "list", "gen", "set"]
)
def test_a_list_storage_buffer_extends_with_any_iterable_of_items(make):
    rb = ReplayBuffer(storage=ListStorage(10))
    assert rb.extend(make(range(3))).tolist() == [0, 1, 2]
    assert sorted(rb[i] for i in range(3)) == [0, 1, 2]
    assert set(rb.sample(8).tolist()) <= {0, 1, 2}
    if make is not set:  # tensors are not hashable by value
        tensors = ReplayBuffer(storage=ListStorage(10))
        tensors.extend(make([torch.zeros(2), torch.ones(2)]))
        assert len(tensors) == 2 and tensors.sample(4).shape == (4, 2)


# -- pickling for a spawned process -------------------------------------------------------------------------------
def _noop(obj):
    pass


def _spawn_with(obj) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_noop, args=(obj,))
    try:
        proc.start()
    finally:
        if proc._popen is not None:
            proc.join(TIMEOUT)


@pytest.mark.timeout(TIMEOUT)
def test_a_list_storage_sent_to_a_spawned_process_is_refused():
    with pytest.raises(RuntimeError, match="Cannot share a storage of type ListStorage") as err:
        _spawn_with(ListStorage(4))
    assert "LazyMemmapStorage" in str(err.value)  # what to use instead


@pytest.mark.timeout(TIMEOUT)
def test_an_uninitialised_memmap_storage_sent_to_a_spawned_process_is_refused(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "s")
    with pytest.raises(RuntimeError, match="it has not been initialized yet") as err:
        _spawn_with(storage)
    assert "shared_init=True" in str(err.value)
    pickle.dumps(storage)  # a plain pickle (not for a spawned process) is fine
    _write(storage)
    _spawn_with(storage)  # initialised: shared
    _spawn_with(LazyMemmapStorage(4, shared_init=True))


# -- CompressedListStorage ------------------------------------------------------------------------------------------
def test_a_slot_holds_what_the_compression_fn_returned_and_the_decompression_fn_gets_it_with_metadata():
    calls = []

    def compress(t):
        out = torch.frombuffer(bytearray(zlib.compress(t.numpy().tobytes())), dtype=torch.uint8)
        calls.append(("c", out))
        return out

    def decompress(data, metadata):
        calls.append(("d", data, metadata))
        raw = zlib.decompress(data.numpy().tobytes())
        return torch.frombuffer(bytearray(raw), dtype=metadata["dtype"]).reshape(metadata["shape"])

    storage = CompressedListStorage(5, compression_fn=compress, decompression_fn=decompress)
    item = torch.arange(12.0).reshape(3, 4)
    storage.set(0, item)
    slot = storage._storage[0]
    assert isinstance(slot, torch.Tensor) and slot.dtype == torch.uint8 and slot is calls[0][1]
    assert 0 < slot.numel() < item.numel() * 4
    assert storage.get(0).equal(item)
    _, data, metadata = calls[1]
    assert data is slot
    assert metadata == {
        "type": torch.Tensor,
        "shape": torch.Size([3, 4]),
        "dtype": torch.float32,
        "device": torch.device("cpu"),
    }


def test_the_result_of_the_decompression_fn_is_returned_unchanged():
    marker = object()
    storage = CompressedListStorage(
        5, compression_fn=lambda t: zlib.compress(t.numpy().tobytes()), decompression_fn=lambda d, m: marker
    )
    storage.set(0, torch.zeros(2, 3))
    assert storage.get(0) is marker


def test_the_default_codec_slot_is_a_uint8_tensor_smaller_than_the_item():
    storage = CompressedListStorage(5)
    item = torch.zeros(64, 64)
    storage.set(0, item)
    assert storage._storage[0].dtype == torch.uint8 and storage._storage[0].numel() < item.numel()
    assert storage.get(0).equal(item)


def test_a_write_past_max_size_is_a_runtime_error_and_an_unset_read_an_index_error():
    storage = CompressedListStorage(5)
    with pytest.raises(RuntimeError, match="position 10.*max_size=5"):
        storage.set(10, torch.zeros(3))
    assert len(storage) == 0
    with pytest.raises(IndexError):
        storage.get(0)
    storage.set(0, torch.zeros(3))
    with pytest.raises(IndexError):
        storage.get(1)


def _declare_shape(storage, shape) -> None:
    state = storage.state_dict()
    state["_storage"][0]["leaves"][0]["shape"] = list(shape)
    storage.load_state_dict(state)


def test_a_declared_size_the_stored_bytes_cannot_hold_is_refused_before_allocating():
    storage = CompressedListStorage(4)
    storage.set(0, torch.randn(8192))  # 32 KB, stored in about as many compressed bytes
    _declare_shape(storage, [2**28])  # declared as 1 GiB
    tracemalloc.start()
    try:
        with pytest.raises(
            ValueError, match=r"declared as a torch.float32 tensor of shape \[268435456\].*cannot expand"
        ):
            storage.get(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_read_allocates_the_declared_size_once():
    storage = CompressedListStorage(4)
    item = torch.zeros(1 << 22)  # 16 MiB
    storage.set(0, item)
    tracemalloc.start()  # Python-level buffers: the old read held the bytes twice (bytes + bytearray)
    try:
        out = storage.get(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.equal(item)
    assert peak < 4 << 20  # a chunk at most, never the 16 MiB in Python objects


def test_a_declared_size_larger_than_what_the_bytes_hold_is_reported():
    storage = CompressedListStorage(4)
    storage.set(0, torch.zeros(4096))
    _declare_shape(storage, [8192])
    with pytest.raises(ValueError, match="corrupted|decompress to"):
        storage.get(0)


def test_dumps_writes_torchrl_s_layout_and_loads_it_back(tmp_path):
    storage = CompressedListStorage(10)
    items = [torch.arange(6.0).reshape(2, 3), torch.zeros(5, dtype=torch.uint8)]
    for i, item in enumerate(items):
        storage.set(i, item)
    storage.dumps(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "compressed_data").is_dir()
    assert (tmp_path / "ckpt" / "metadata.json").is_file()
    assert json.loads((tmp_path / "ckpt" / "data_indices.json").read_text()) == {"0": 0, "1": 1}
    fresh = CompressedListStorage(10)
    fresh.loads(tmp_path / "ckpt")
    assert len(fresh) == 2 and all(fresh.get(i).equal(item) for i, item in enumerate(items))
    assert fresh._storage[0].dtype == torch.uint8
    storage.dumps(tmp_path / "ckpt")  # a checkpoint is replaced in place
    fresh.loads(tmp_path / "ckpt")
    assert len(fresh) == 2


# -- cleanup_stale_scratch_dirs --------------------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _scratch_dir(root, pid: int, suffix: str) -> str:
    path = os.path.join(root, f"torchrl-memmap-{pid}-{suffix}")
    os.mkdir(path)
    _cleanup._write_marker(path, pid)
    return path


def test_a_name_with_a_huge_pid_is_skipped_and_the_other_entries_are_processed(tmp_path):
    dead = _dead_pid()
    before = _scratch_dir(tmp_path, dead, "a")
    huge = tmp_path / f"torchrl-memmap-{10**30}-b"
    huge.mkdir()
    _cleanup._write_marker(str(huge), 10**30)  # a marker otherwise valid: os.kill(10**30) overflowed
    huge_first = tmp_path / f"torchrl-memmap-{int('1' + '0' * 40)}-c"  # sorted before the others
    huge_first.mkdir()
    after = _scratch_dir(tmp_path, dead, "zzz")
    assert cleanup_stale_scratch_dirs(tmp_path, dry_run=True) == sorted([before, after])  # no OverflowError
    assert cleanup_stale_scratch_dirs(tmp_path) == sorted([before, after])
    assert huge.is_dir() and huge_first.is_dir()


def test_a_copied_owner_marker_does_not_get_a_directory_removed(tmp_path):
    dead = _dead_pid()
    original = _scratch_dir(tmp_path, dead, "orig")
    copied_marker = tmp_path / f"torchrl-memmap-{dead}-copy"
    copied_marker.mkdir()
    shutil.copy2(os.path.join(original, _cleanup._MARKER), copied_marker / _cleanup._MARKER)
    (copied_marker / "precious.txt").write_text("mine")
    copied_tree = tmp_path / f"torchrl-memmap-{dead}-tree"
    shutil.copytree(original, copied_tree)  # copy2 of every file: same content, same mtimes
    assert cleanup_stale_scratch_dirs(tmp_path, dry_run=True) == [original]
    assert cleanup_stale_scratch_dirs(tmp_path) == [original]
    assert (copied_marker / "precious.txt").exists() and copied_tree.is_dir()


# -- exception types (from the behaviours TorchRL code relies on, issue 12) ------------------------------------------
def test_memmap_existsok_false_is_file_exists_and_runtime_error(tmp_path):
    (tmp_path / "old").write_text("x")
    for exc in (FileExistsError, RuntimeError):
        storage = LazyMemmapStorage(10, scratch_dir=str(tmp_path), existsok=False)
        with pytest.raises(exc, match="existsok"):
            storage.set(torch.arange(2), TensorDict(a=torch.zeros(2), batch_size=[2]))
