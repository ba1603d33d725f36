"""The on-disk checkpoint format (``_checkpoint/``): round trips, validation, fuzzing, refusal of pickles, progress,
recovery. What components save into it: test_checkpoint_buffers.py."""

from __future__ import annotations

import os
import pickle
import random
import shutil
import sys
import zlib

import pytest
import torch
from helpers.extras import require
from helpers.factories import rewrite_checkpoint_metadata
from tensordict import MemoryMappedTensor

from torchrl.data.replay_buffers._checkpoint import fs as _checkpoint_fs
from torchrl.data.replay_buffers.checkpointers import (
    SUPPORTED_SCHEMA_VERSIONS,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip
SHAPES = [(), (0,), (0, 3), (7,), (3, 4, 2)]


def _random_tensor(dtype: torch.dtype, shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (max(1, torch.Size(shape).numel()) * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw[: torch.Size(shape).numel()] % 2).bool().reshape(shape)
    return raw.view(dtype)[: torch.Size(shape).numel()].reshape(shape).clone()  # compared bitwise: NaNs are fine


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)))


def _assert_same(loaded: dict, expected: dict) -> None:
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert _bitwise_equal(loaded[name].as_subclass(torch.Tensor), tensor.contiguous()), name


def _siblings(path) -> list[str]:
    parent, name = os.path.split(str(path))
    return sorted(e for e in os.listdir(parent) if e.startswith(name + "."))


# -- round trips ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_preserves_bytes_dtype_and_shape(tmp_path, dtype, shape):
    tensor = _random_tensor(dtype, shape)
    write_checkpoint(tmp_path / "c", {"x": tensor}, {"kind": "test"}, fsync=False)
    tensors, metadata = read_checkpoint(tmp_path / "c")
    assert metadata == {"kind": "test"}
    _assert_same(tensors, {"x": tensor})


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(24.0).reshape(4, 6).t(),
        lambda: torch.arange(40).reshape(8, 5)[::2, 1:4],
        lambda: torch.arange(6.0).expand(3, 6),
        lambda: torch.randn(3, 4, dtype=torch.complex64).conj(),
        lambda: torch.randn(3, 4, requires_grad=True),
        lambda: torch.randn(5)._neg_view(),
    ],
    ids=["transposed", "strided", "expanded", "conj-view", "requires-grad", "neg-view"],
)
def test_round_trip_of_views_saves_their_logical_content(tmp_path, make):
    tensor = make()
    write_checkpoint(tmp_path / "c", {"t": tensor}, {}, fsync=False)
    tensors, _ = read_checkpoint(tmp_path / "c")
    assert torch.equal(tensors["t"].as_subclass(torch.Tensor), tensor.detach().resolve_conj().resolve_neg())


def test_non_contiguous_tensor_larger_than_a_chunk_is_written_in_slices(tmp_path, monkeypatch):
    from torchrl.data.replay_buffers._checkpoint import io as _checkpoint_io

    monkeypatch.setattr(_checkpoint_io, "CHUNK_BYTES", 64)
    tensor = torch.arange(3 * 50 * 4, dtype=torch.int32).reshape(3, 50, 4).transpose(0, 1)
    write_checkpoint(tmp_path / "c", {"t": tensor, "c": torch.arange(100)}, {}, fsync=False)
    tensors, _ = read_checkpoint(tmp_path / "c")
    assert torch.equal(tensors["t"], tensor) and torch.equal(tensors["c"], torch.arange(100))


@pytest.mark.parametrize("offset", [0, 10])
def test_memory_mapped_source_is_copied_from_its_file(tmp_path, offset):
    source = MemoryMappedTensor.from_tensor(torch.arange(1000.0), filename=str(tmp_path / "src.memmap"))
    source[3] = -1.0  # a write through the shared map is in the file the kernel copies
    view = source[offset:]
    write_checkpoint(tmp_path / "c", {"m": view}, {}, fsync=False)
    tensors, _ = read_checkpoint(tmp_path / "c")
    assert torch.equal(tensors["m"], view)


def test_copy_on_write_memmap_saves_the_tensor_not_its_file(tmp_path):
    MemoryMappedTensor.from_tensor(torch.zeros(100), filename=str(tmp_path / "src.memmap"))
    private = MemoryMappedTensor.from_filename(str(tmp_path / "src.memmap"), torch.float32, (100,), mode="r")
    private[:10] = 5.0  # stays in this process's private pages, the file still holds zeros
    write_checkpoint(tmp_path / "c", {"p": private}, {}, fsync=False)
    tensors, _ = read_checkpoint(tmp_path / "c")
    assert tensors["p"][:10].eq(5).all() and tensors["p"][10:].eq(0).all()


def test_nested_names_make_sub_directories_in_memmap_layout(tmp_path):
    tensors = {"storage/obs": torch.ones(2, 3), "storage/next/obs": torch.zeros(2, 3), "top": torch.arange(3)}
    write_checkpoint(tmp_path / "c", tensors, {}, fsync=False)
    assert (tmp_path / "c" / "storage" / "next" / "obs.memmap").is_file()
    loaded, _ = read_checkpoint(tmp_path / "c")
    _assert_same(loaded, tensors)


def test_loaded_tensors_are_copy_on_write_memory_maps(tmp_path):
    write_checkpoint(tmp_path / "c", {"x": torch.zeros(10)}, {}, fsync=False)
    tensors, _ = read_checkpoint(tmp_path / "c")
    assert isinstance(tensors["x"], MemoryMappedTensor)
    tensors["x"] += 1
    again, _ = read_checkpoint(tmp_path / "c")
    assert again["x"].eq(0).all()


def test_metadata_round_trips_as_json(tmp_path):
    metadata = {"type": "X", "config": {"capacity": 10, "keys": [["a", "b"]], "alpha": 0.5, "none": None}}
    write_checkpoint(tmp_path / "c", {}, {**metadata, "tuple": (1, 2)}, fsync=False)
    _, loaded = read_checkpoint(tmp_path / "c")
    assert loaded == {**metadata, "tuple": [1, 2]}


@pytest.mark.parametrize("use_exchange", [True, False], ids=["exchange", "two-renames"])
def test_rewrite_replaces_the_previous_checkpoint_and_leaves_no_siblings(tmp_path, monkeypatch, use_exchange):
    monkeypatch.setattr(_checkpoint_fs, "USE_EXCHANGE", use_exchange)
    path = tmp_path / "c"
    write_checkpoint(path, {"a": torch.ones(3), "old_only": torch.ones(1)}, {"v": 1})
    write_checkpoint(path, {"a": torch.zeros(3)}, {"v": 2})
    tensors, metadata = read_checkpoint(path)
    assert metadata == {"v": 2} and set(tensors) == {"a"} and tensors["a"].eq(0).all()
    assert _siblings(path) == [] and not (path / "old_only.memmap").exists()


def test_write_into_an_empty_directory_and_missing_parents(tmp_path):
    (tmp_path / "empty").mkdir()
    write_checkpoint(tmp_path / "empty", {"a": torch.ones(1)}, {})
    write_checkpoint(tmp_path / "x" / "y" / "c", {"a": torch.ones(1)}, {})
    assert read_checkpoint(tmp_path / "empty")[0]["a"].item() == 1
    assert read_checkpoint(tmp_path / "x" / "y" / "c")[0]["a"].item() == 1


# -- write errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(path=3), TypeError, "`path`"),
        (dict(tensors=[torch.ones(1)]), TypeError, "`tensors`"),
        (dict(tensors={"a": [1.0]}), TypeError, "torch.Tensor"),
        (dict(tensors={"a": torch.ones(2, 2).to_sparse()}), TypeError, "dense"),
        (dict(tensors={"a": torch.empty(2, dtype=torch.bits8)}), TypeError, "dtypes"),
        (dict(tensors={"": torch.ones(1)}), ValueError, "empty"),
        (dict(tensors={"/abs": torch.ones(1)}), ValueError, "component"),
        (dict(tensors={"a/../../b": torch.ones(1)}), ValueError, r"'\.\.'"),
        (dict(tensors={"a\\b": torch.ones(1)}), ValueError, "character"),
        (dict(tensors={"a:b": torch.ones(1)}), ValueError, "character"),
        (dict(tensors={"a\nb": torch.ones(1)}), ValueError, "character"),
        (dict(tensors={1: torch.ones(1)}), ValueError, "not a str"),
        (dict(metadata=[("a", 1)]), TypeError, "`metadata`"),
        (dict(metadata={"a": torch.ones(1)}), TypeError, "JSON"),
        (dict(metadata={("a",): 1}), TypeError, "JSON"),
        (dict(fsync="yes"), TypeError, "`fsync`"),
        (dict(progress="auto"), TypeError, "`progress`"),
    ],
)
def test_write_rejects_bad_arguments_before_touching_the_disk(tmp_path, kwargs, error, match):
    args = dict(path=tmp_path / "c", tensors={"a": torch.ones(1)}, metadata={})
    args.update(kwargs)
    progress = args.pop("progress", None)
    fsync = args.pop("fsync", True)
    with pytest.raises(error, match=match):
        write_checkpoint(args["path"], args["tensors"], args["metadata"], fsync=fsync, progress=progress)
    assert os.listdir(tmp_path) == []


def test_write_refuses_to_replace_something_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    (tmp_path / "file").write_text("keep me")
    for target in ("data", "file"):
        with pytest.raises(FileExistsError, match="Remove it or choose another path"):
            write_checkpoint(tmp_path / target, {"a": torch.ones(1)}, {})
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["data", "file"]
    with pytest.raises(ValueError, match="root"):
        write_checkpoint("/", {}, {})


def test_failed_write_leaves_the_previous_checkpoint_and_no_tmp(tmp_path, monkeypatch):
    from torchrl.data.replay_buffers._checkpoint import io as _checkpoint_io

    path = tmp_path / "c"
    write_checkpoint(path, {"a": torch.ones(3)}, {"v": 1})

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_checkpoint_io, "write_all", fail)
    with pytest.raises(OSError, match="No space"):
        write_checkpoint(path, {"a": torch.zeros(3)}, {"v": 2})
    assert read_checkpoint(path)[1] == {"v": 1} and _siblings(path) == []


# -- read errors ----------------------------------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "c"
    tensors = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "sub/b": torch.arange(5)}
    write_checkpoint(path, tensors, {"v": 1}, fsync=False)
    return path, tensors


def test_read_of_a_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        read_checkpoint(tmp_path / "nothing")


def test_read_without_marker_says_incomplete(ckpt):
    path, _ = ckpt
    os.remove(path / "COMPLETE")
    with pytest.raises(CheckpointError, match="incomplete.*COMPLETE"):
        read_checkpoint(path)


@pytest.mark.parametrize("version", [0, 2, "1", None, True])
def test_unknown_schema_version_names_it_and_the_supported_ones(ckpt, version):
    path, _ = ckpt

    def mutate(doc):
        doc["schema_version"] = version

    rewrite_checkpoint_metadata(path, mutate)
    with pytest.raises(CheckpointError, match=rf"schema_version {version!r}.*{list(SUPPORTED_SCHEMA_VERSIONS)}"):
        read_checkpoint(path)


def _set(key, value, name="a"):
    def mutate(doc):
        doc["tensors"][name][key] = value

    return mutate


@pytest.mark.parametrize(
    "mutate, match",
    [
        (_set("nbytes", 44), "nbytes 44 does not match"),
        (_set("shape", [4, 4]), "does not match shape"),
        (_set("shape", [3, -4]), "non-negative"),
        (_set("shape", "3x4"), "non-negative"),
        (_set("dtype", "float64"), "does not match shape"),
        (_set("dtype", "object"), "dtype 'object' is not one of"),
        (_set("dtype", "torch.float32"), "is not one of"),
        (_set("crc32", [1, 2]), "corrupted"),
        (_set("crc32", [1]), "pair"),
        (_set("file", "../outside.memmap"), "refused"),
        (_set("file", "/etc/passwd"), "refused"),
        (_set("file", "a.bin"), "does not end in .memmap"),
        (_set("file", "a.memmap", name="sub/b"), "described twice"),
        (_set("file", "missing.memmap"), "missing"),
        (lambda doc: doc["tensors"].update({"../x": doc["tensors"]["a"]}), "unsafe"),
        (lambda doc: doc["tensors"]["a"].update(extra=1), "must be an object with keys"),
        (lambda doc: doc.update(tensors=[]), "no 'tensors' object"),
        (lambda doc: doc.update(metadata=3), "no 'metadata' object"),
        (lambda doc: doc.update(format="other"), "format"),
        (lambda doc: doc.update(checksum={"algorithm": "md5"}), "checksum"),
    ],
)
def test_crafted_metadata_is_refused_with_the_file_and_reason(ckpt, mutate, match):
    path, _ = ckpt
    rewrite_checkpoint_metadata(path, mutate)
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(path)


def test_metadata_edited_without_resigning_the_marker_is_refused(ckpt):
    path, _ = ckpt
    text = (path / "metadata.json").read_text().replace('"v": 1', '"v": 7')
    (path / "metadata.json").write_text(text)
    with pytest.raises(CheckpointError, match="does not match its completion marker"):
        read_checkpoint(path)


@pytest.mark.parametrize("what", ["file", "directory", "metadata"])
def test_symlinks_inside_a_checkpoint_are_never_followed(ckpt, tmp_path, what):
    path, _ = ckpt
    outside = tmp_path / "outside"
    outside.mkdir()
    if what == "file":
        shutil.copy(path / "a.memmap", outside / "a.memmap")
        os.remove(path / "a.memmap")
        os.symlink(outside / "a.memmap", path / "a.memmap")
    elif what == "directory":
        shutil.move(str(path / "sub"), str(outside / "sub"))
        os.symlink(outside / "sub", path / "sub")
    else:
        shutil.move(str(path / "metadata.json"), str(outside / "metadata.json"))
        os.symlink(outside / "metadata.json", path / "metadata.json")
    with pytest.raises(CheckpointError, match="symlink"):
        read_checkpoint(path)


def test_verify_false_skips_only_the_checksums(ckpt):
    path, tensors = ckpt
    with open(path / "a.memmap", "r+b") as f:
        f.write(b"\xff")
    with pytest.raises(CheckpointError, match="checksum of its first"):
        read_checkpoint(path)
    loaded, _ = read_checkpoint(path, verify=False)
    assert loaded["sub/b"].tolist() == tensors["sub/b"].tolist()


# -- fuzzing --------------------------------------------------------------------------------------------------------
def _files(path) -> list[str]:
    out = []
    for folder, _, names in os.walk(path):
        out += [os.path.relpath(os.path.join(folder, n), path) for n in names]
    return sorted(out)


def _corrupt(path, rng: random.Random) -> str:
    """Applies one random corruption to the checkpoint at ``path``; returns a description."""
    rel = rng.choice(_files(path))
    target = os.path.join(path, rel)
    size = os.path.getsize(target)
    op = rng.choice(["flip", "flip", "replace", "truncate", "delete", "append", "garbage", "symlink", "empty"])
    if op in ("flip", "replace") and size:
        at = rng.randrange(size)
        with open(target, "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8)) if op == "flip" else rng.randrange(256)]))
    elif op == "truncate":
        os.truncate(target, rng.randrange(size + 1))
    elif op == "delete":
        os.remove(target)
    elif op == "append":
        with open(target, "ab") as f:
            f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 9))))
    elif op == "garbage":
        with open(target, "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(rng.randint(0, size + 8))))
    elif op == "symlink":
        os.remove(target)
        os.symlink(os.path.join(path, _files(path)[0]) if _files(path) else "/dev/null", target)
    else:
        open(target, "wb").close()
    return f"{op} {rel}"


_CRAFTED = [
    lambda d, n, r: d["tensors"][n].update(nbytes=d["tensors"][n]["nbytes"] + r.choice([-1, 1, 8])),
    lambda d, n, r: d["tensors"][n].update(shape=d["tensors"][n]["shape"] + [2]),
    lambda d, n, r: d["tensors"][n].update(dtype=r.choice(["str", "object", "", "float", "torch.int64", "complex32"])),
    lambda d, n, r: d["tensors"][n].update(file=r.choice(["../x.memmap", "/tmp/x.memmap", "a/../../x.memmap"])),
    lambda d, n, r: d["tensors"][n].update(file=r.choice(["./a.memmap", "a//b.memmap", "x\\..\\y.memmap"])),
    lambda d, n, r: d["tensors"][n].update(shape=[-1] + d["tensors"][n]["shape"]),
    lambda d, n, r: d["tensors"][n].update(shape=[True, 12]),
    lambda d, n, r: d["tensors"][n].pop(r.choice(["file", "dtype", "shape", "nbytes", "crc32"])),
    lambda d, n, r: d["tensors"].update({r.choice(["..", "/abs", "a/./b", ""]): d["tensors"][n]}),
    lambda d, n, r: d.update(schema_version=r.choice([2, 99, -1, "one"])),
    lambda d, n, r: d["tensors"][n].update(crc32=[r.randrange(2**32), r.randrange(2**32)]),
]


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "base"
    tensors = {
        "a": _random_tensor(torch.float32, (64, 33), seed=1),
        "nested/b": _random_tensor(torch.int64, (100,), seed=2),
        "c": _random_tensor(torch.bool, (17,), seed=3),
        "d": _random_tensor(torch.bfloat16, (), seed=4),
        "e": torch.empty(0, 4),
    }
    write_checkpoint(path, tensors, {"config": {"capacity": 64}}, fsync=False)
    return path, tensors


@pytest.mark.parametrize("seed", range(160))
def test_fuzz_random_corruption_reads_identical_data_or_raises_checkpoint_error(fuzz_base, tmp_path, seed):
    base, tensors = fuzz_base
    rng = random.Random(seed)
    path = tmp_path / "c"
    shutil.copytree(base, path, symlinks=True)
    what = [_corrupt(path, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    try:
        loaded, metadata = read_checkpoint(path)
    except CheckpointError:
        return
    assert metadata == {"config": {"capacity": 64}}, what
    _assert_same(loaded, tensors)


@pytest.mark.parametrize("seed", range(60))
def test_fuzz_crafted_metadata_is_always_refused(fuzz_base, tmp_path, seed):
    base, _ = fuzz_base
    rng = random.Random(1000 + seed)
    path = tmp_path / "c"
    shutil.copytree(base, path)
    name = rng.choice(["a", "nested/b", "c", "d"])
    mutation = _CRAFTED[seed % len(_CRAFTED)]
    rewrite_checkpoint_metadata(path, lambda doc: mutation(doc, name, rng))
    with pytest.raises(CheckpointError):
        read_checkpoint(path)


# -- no pickle ------------------------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this creates the file ``target``."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (exec, (f"open({self.target!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("replaced", ["tensors", "metadata", "everything", "same-size-resigned"])
def test_pickle_payload_in_place_of_files_runs_no_code(ckpt, tmp_path, replaced):
    path, _ = ckpt
    evidence = tmp_path / "evidence"
    payload = pickle.dumps(_Payload(str(evidence)))
    pickle.loads(payload)  # the payload works: unpickling it creates the file
    assert evidence.exists()
    os.remove(evidence)
    targets = {
        "tensors": ["a.memmap", "sub/b.memmap"],
        "metadata": ["metadata.json"],
        "everything": _files(path),
        "same-size-resigned": ["sub/b.memmap"],
    }[replaced]
    for rel in targets:
        with open(path / rel, "wb") as f:
            f.write(payload)
    if replaced == "same-size-resigned":  # a crafted checkpoint whose metadata describes the payload exactly
        crc = zlib.crc32(payload)
        n = len(payload)
        rewrite_checkpoint_metadata(path, _set_all("sub/b", shape=[n], dtype="uint8", nbytes=n, crc32=[crc, crc]))
        tensors, _ = read_checkpoint(path)
        assert bytes(tensors["sub/b"].tolist()) == payload  # just bytes
    else:
        with pytest.raises(CheckpointError):
            read_checkpoint(path)
    assert not evidence.exists()


def _set_all(name, **values):
    def mutate(doc):
        doc["tensors"][name].update(values)

    return mutate


def test_read_never_calls_an_unpickler(ckpt, monkeypatch):
    path, tensors = ckpt

    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling during read_checkpoint")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    loaded, _ = read_checkpoint(path)
    _assert_same(loaded, tensors)


# -- progress -------------------------------------------------------------------------------------------------------
def test_progress_true_shows_a_bar_and_none_is_silent_off_a_terminal(tmp_path, capsys):
    require("tqdm")
    write_checkpoint(tmp_path / "a", {"x": torch.ones(1000)}, {}, fsync=False, progress=True)
    assert "dumps" in capsys.readouterr().err
    write_checkpoint(tmp_path / "b", {"x": torch.ones(1000)}, {}, fsync=False, progress=None)
    write_checkpoint(tmp_path / "c", {"x": torch.ones(1000)}, {}, fsync=False, progress=False)
    assert capsys.readouterr().err == ""


def test_progress_true_without_tqdm_warns_and_still_writes(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.warns(UserWarning, match="needs tqdm"):
        write_checkpoint(tmp_path / "a", {"x": torch.ones(3)}, {}, fsync=False, progress=True)
    assert read_checkpoint(tmp_path / "a")[0]["x"].sum() == 3


# -- recovery rules -------------------------------------------------------------------------------------------------
def test_reader_uses_the_checkpoint_left_aside_and_the_next_writer_restores_then_replaces_it(tmp_path):
    path = tmp_path / "c"
    write_checkpoint(path, {"a": torch.ones(2)}, {"v": 1})
    os.rename(path, f"{path}.old-abc")  # a crash between the two renames of a switch
    before = sorted(os.listdir(tmp_path))
    assert read_checkpoint(path)[1] == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == before  # readers never modify the disk
    write_checkpoint(path, {"a": torch.zeros(2)}, {"v": 2})
    assert read_checkpoint(path)[1] == {"v": 2} and _siblings(path) == []


def test_writer_removes_stale_leftovers_but_not_a_live_writers_tmp(tmp_path):
    import fcntl

    path = tmp_path / "c"
    write_checkpoint(path, {"a": torch.ones(2)}, {"v": 1})
    shutil.copytree(path, f"{path}.old-111")  # a crash after a switch, before the aside was removed
    os.mkdir(f"{path}.tmp-dead")  # a writer killed while streaming
    os.mkdir(f"{path}.tmp-live")
    fd = os.open(f"{path}.tmp-live", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a writer still streaming
    try:
        assert read_checkpoint(path)[1] == {"v": 1}
        write_checkpoint(path, {"a": torch.zeros(2)}, {"v": 2})
        assert _siblings(path) == ["c.tmp-live"]
    finally:
        os.close(fd)
    write_checkpoint(path, {"a": torch.zeros(2)}, {"v": 3})
    assert _siblings(path) == [] and read_checkpoint(path)[1] == {"v": 3}


def test_incomplete_tmp_is_never_read_when_no_checkpoint_was_committed(tmp_path):
    path = tmp_path / "c"
    write_checkpoint(path, {"a": torch.ones(2)}, {"v": 1})
    os.rename(path, f"{path}.tmp-abc")  # complete, but never switched into place
    with pytest.raises(FileNotFoundError):
        read_checkpoint(path)


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_memmap_write_and_read_do_not_grow_resident_memory(tmp_path):
    size = 64 << 20
    source_file = tmp_path / "src.memmap"
    with open(source_file, "wb") as f:
        for i in range(size >> 20):
            f.write(bytes([i % 251]) * (1 << 20))
    source = MemoryMappedTensor.from_filename(str(source_file), torch.uint8, (size,))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak resident size (VmHWM)
    base = _rss_bytes("VmRSS")
    write_checkpoint(tmp_path / "c", {"big": source}, {}, fsync=False)
    tensors, _ = read_checkpoint(tmp_path / "c")
    assert _rss_bytes("VmHWM") - base < size // 10
    assert tensors["big"][-1].item() == (size >> 20) - 1
