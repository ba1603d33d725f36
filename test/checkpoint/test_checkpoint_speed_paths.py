"""The fast paths of checkpoint loads: one read into the destination, huge-page advice, file-to-file copies.

Every fast path must give the bytes that were saved, touch no memory outside its destination, and keep what
validation refuses refused: a truncated or corrupted checkpoint raises ``CheckpointError`` and leaves the
buffer as it was. A memory-mapped buffer loaded into another directory gets files of its own.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import MemoryMappedTensor, TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers._checkpoint import io as _io
from torchrl.data.replay_buffers.checkpointers import CheckpointError, read_checkpoint

MIB = 1 << 20
SENTINEL = 0xAB


def _random_bytes(nbytes: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _write_file(path, data: torch.Tensor) -> str:
    with open(path, "wb") as f:
        f.write(data.numpy().tobytes())
    return str(path)


def _transitions(n: int, start: int = 0) -> TensorDict:
    """Core transition data whose leaves cover the read paths: a leaf above the huge-page threshold (64 float32
    columns), small leaves, several dtypes and a nested key. Every value is a function of the row id."""
    ids = torch.arange(start, start + n)
    obs = (ids.unsqueeze(-1) * 64 + torch.arange(64)).to(torch.float32)
    return TensorDict(
        {
            "observation": obs,
            ("next", "observation"): obs + 0.5,
            "action": ids.unsqueeze(-1).expand(n, 3).to(torch.bfloat16),
            "reward": ids.to(torch.float64),
            "step": ids.clone(),
            "done": ids % 7 == 0,
        },
        batch_size=[n],
    )


ROWS, CAPACITY = 20_000, 24_000  # the observation leaf holds 20_000 * 64 * 4 bytes, ~4.9 MiB


def _buffer(kind: str, tmp_path, name: str) -> ReplayBuffer:
    if kind == "lazy":
        storage = LazyTensorStorage(CAPACITY)
    else:
        storage = LazyMemmapStorage(CAPACITY, scratch_dir=str(tmp_path / name))
    return make_buffer(storage=storage, batch_size=8)


def _content(rb: ReplayBuffer) -> TensorDict:
    return rb.storage.get(torch.arange(len(rb))).clone()


def _assert_same_content(a: TensorDict, b: TensorDict) -> None:
    assert a.batch_size == b.batch_size
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(params=["lazy", "memmap"])
def saved(request, tmp_path):
    """``(kind, checkpoint path, content)`` of a buffer of ``kind`` holding ``ROWS`` rows, saved once."""
    rb = _buffer(request.param, tmp_path, "source")
    rb.extend(_transitions(ROWS))
    path = tmp_path / "ckpt"
    rb.dumps(path, fsync=False)
    return request.param, path, _content(rb)


# -- read_into: the destination and nothing else ---------------------------------------------------------------
@pytest.mark.parametrize("nbytes", [1000, 4 * MIB + 123, 9 * MIB])
@pytest.mark.parametrize("offset", [0, 1, 4096 + 64])
def test_read_into_fills_exactly_the_destination_bytes(tmp_path, nbytes, offset):
    data = _random_bytes(nbytes)
    path = _write_file(tmp_path / "x.memmap", data)
    memory = torch.full((offset + nbytes + 4096,), SENTINEL, dtype=torch.uint8)
    _io.read_into(path, memory[offset : offset + nbytes])
    assert torch.equal(memory[offset : offset + nbytes], data)
    assert (memory[:offset] == SENTINEL).all() and (memory[offset + nbytes :] == SENTINEL).all()


def test_read_into_a_fresh_tensor_of_another_dtype_reads_its_bytes(tmp_path):
    data = _random_bytes(6 * MIB, seed=1)
    path = _write_file(tmp_path / "x.memmap", data)
    target = torch.empty(3 * MIB // 2, 2, dtype=torch.bfloat16)
    _io.read_into(path, target)
    assert torch.equal(target.reshape(-1).view(torch.uint8), data)


def test_read_into_a_file_backed_tensor_copies_file_to_file(tmp_path, monkeypatch):
    data = _random_bytes(5 * MIB + 7, seed=2)
    path = _write_file(tmp_path / "x.memmap", data)
    target = MemoryMappedTensor.empty((data.numel() + 4096,), dtype=torch.uint8, filename=str(tmp_path / "t.memmap"))
    target.fill_(SENTINEL)
    reads = []
    monkeypatch.setattr(_io, "_preadv_all", lambda *args: reads.append(args))
    _io.read_into(path, target[4096:])
    assert reads == []  # the kernel copied the bytes: none went through this process's memory
    assert torch.equal(target[4096:].as_subclass(torch.Tensor), data)
    assert (target[:4096] == SENTINEL).all()


def test_read_into_the_tensor_that_maps_the_file_itself_writes_nothing(tmp_path):
    data = _random_bytes(3 * MIB, seed=3)
    path = _write_file(tmp_path / "x.memmap", data)
    before = os.stat(path).st_mtime_ns
    mapped = MemoryMappedTensor.from_filename(path, dtype=torch.uint8, shape=(data.numel(),), mode="r+")
    _io.read_into(path, mapped)
    assert torch.equal(mapped.as_subclass(torch.Tensor), data)
    assert os.stat(path).st_mtime_ns == before


@pytest.mark.parametrize("target", ["ram", "memmap"])
def test_a_file_shorter_than_its_tensor_raises_checkpoint_error(tmp_path, target):
    """A file truncated after validation (by another process) is detected by the read itself."""
    path = _write_file(tmp_path / "x.memmap", _random_bytes(MIB))
    if target == "ram":
        tensor = torch.empty(2 * MIB, dtype=torch.uint8)
    else:
        tensor = MemoryMappedTensor.empty((2 * MIB,), dtype=torch.uint8, filename=str(tmp_path / "t.memmap"))
    with pytest.raises(CheckpointError, match="early"):
        _io.read_into(path, tensor)


# -- the helpers of the fast paths -----------------------------------------------------------------------------
def _fields(mapping) -> tuple:
    return tuple(getattr(mapping, name) for name in mapping.__slots__)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps (Linux)")
def test_mapping_at_finds_what_the_full_parse_finds(tmp_path):
    mapped = MemoryMappedTensor.empty((3 * MIB,), dtype=torch.uint8, filename=str(tmp_path / "m.memmap"))
    address = mapped[MIB:].data_ptr()
    expected = [m for m in _io.read_file_mappings() if m.start <= address < m.end]
    found = _io.mapping_at(address)
    assert len(found) == 1 and [_fields(m) for m in found] == [_fields(m) for m in expected]
    assert _io.file_source(mapped[MIB:], found) == (str(tmp_path / "m.memmap"), MIB)
    anonymous = torch.empty(8 * MIB, dtype=torch.uint8)
    assert _io.mapping_at(anonymous.data_ptr()) == []
    assert _io.mapping_at(0) == []


def test_huge_page_advice_changes_no_content_and_accepts_any_range():
    memory = _random_bytes(16 * MIB, seed=4)
    copy = memory.clone()
    for start, nbytes in ((0, 16 * MIB), (12345, 5 * MIB), (7, 100), (0, 0)):
        _io.advise_huge_pages(memory.data_ptr() + start, nbytes)
    assert torch.equal(memory, copy)


@pytest.mark.skipif(_io._HUGE_PAGES is None, reason="no transparent huge pages (Linux only)")
def test_a_large_read_into_fresh_memory_asks_for_huge_pages(tmp_path):
    nbytes = 6 * _io._HUGE_PAGES[2]
    path = _write_file(tmp_path / "x.memmap", _random_bytes(nbytes, seed=5))
    target = torch.empty(nbytes, dtype=torch.uint8)
    _io.read_into(path, target)
    # the advice covers the whole huge pages inside the tensor: the mapping holding the first one is flagged
    size = _io._HUGE_PAGES[2]
    boundary = -(-target.data_ptr() // size) * size
    holds_boundary = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                holds_boundary = lo <= boundary < hi
            elif line.startswith("VmFlags:") and holds_boundary:
                assert "hg" in line.split(), line
                return
    pytest.fail("the tensor's memory is not in /proc/self/smaps")


def test_without_huge_page_support_reads_still_work(tmp_path, monkeypatch):
    monkeypatch.setattr(_io, "_HUGE_PAGES", None)
    data = _random_bytes(9 * MIB, seed=6)
    target = torch.empty(9 * MIB, dtype=torch.uint8)
    _io.read_into(_write_file(tmp_path / "x.memmap", data), target)
    assert torch.equal(target, data)


# -- whole buffers ---------------------------------------------------------------------------------------------
def test_buffer_loads_the_saved_content(saved, tmp_path):
    kind, path, content = saved
    rb = _buffer(kind, tmp_path, "fresh")
    rb.loads(path)
    assert len(rb) == ROWS
    _assert_same_content(_content(rb), content)


def test_buffer_holding_other_data_is_overwritten_by_the_load(saved, tmp_path):
    kind, path, content = saved
    rb = _buffer(kind, tmp_path, "busy")
    rb.extend(_transitions(CAPACITY, start=10**6))
    rb.loads(path)
    assert len(rb) == ROWS
    _assert_same_content(_content(rb), content)


def _inodes(folder) -> set[int]:
    return {os.stat(os.path.join(d, f)).st_ino for d, _, files in os.walk(folder) for f in files}


def test_memmap_buffer_loaded_into_another_directory_gets_files_of_its_own(tmp_path):
    source = _buffer("memmap", tmp_path, "source")
    source.extend(_transitions(ROWS))
    path = tmp_path / "ckpt"
    source.dumps(path, fsync=False)
    rb = _buffer("memmap", tmp_path, "other")
    rb.loads(path)
    _assert_same_content(_content(rb), _content(source))
    assert os.path.realpath(rb.storage.memmap_dir) == os.path.realpath(tmp_path / "other")
    mine = _inodes(rb.storage.memmap_dir)
    assert len(mine) >= 6 and not mine & _inodes(path)
    rb.extend(_transitions(CAPACITY, start=10**6))  # writes to the loaded buffer never reach the checkpoint
    tensors, _ = read_checkpoint(path)
    assert torch.equal(tensors["storage/observation"].as_subclass(torch.Tensor), _content(source)["observation"])


def _damage(path, how: str) -> None:
    file = os.path.join(path, "storage", "observation.memmap")
    size = os.path.getsize(file)
    assert size > 2 * _io.CHECKSUM_WINDOW  # the head and tail windows are distinct
    if how == "truncated":
        os.truncate(file, size - 4096)
        return
    offset = 10 if how == "head" else size - 10
    with open(file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("how", ["truncated", "head", "tail"])
@pytest.mark.parametrize("start", ["empty", "holding data"])
def test_damaged_checkpoint_is_refused_and_the_buffer_is_unchanged(saved, tmp_path, how, start):
    kind, path, _ = saved
    _damage(path, how)
    rb = _buffer(kind, tmp_path, "target")
    if start == "holding data":
        rb.extend(_transitions(100, start=10**6))
    before = _content(rb) if len(rb) else None
    with pytest.raises(CheckpointError):
        rb.loads(path)
    if before is None:
        assert len(rb) == 0 and not rb.storage.initialized
    else:
        assert len(rb) == 100
        _assert_same_content(_content(rb), before)
