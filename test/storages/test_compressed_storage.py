"""CompressedListStorage: every tensor of every item compressed (zstd when installed, zlib otherwise, or the
user's functions); round trips of every kind, shape and dtype; refusals that change nothing; checkpoints of the
compressed bytes; state dicts, pickling, DataLoader workers and replay buffers over it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import zlib

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from tensordict import LazyStackedTensorDict, TensorDict, tensorclass
from torch.utils.data import DataLoader

from torchrl.data import (
    CompressedListStorage,
    CompressedListStorageCheckpointer,
    ListStorage,
    ListStorageCheckpointer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    tensordict_collate,
)
from torchrl.data.replay_buffers.checkpointers import CheckpointError, read_checkpoint, write_checkpoint

try:
    import zstandard  # noqa: F401

    HAS_ZSTD = True
except ImportError:
    HAS_ZSTD = False


@tensorclass
class Step:
    obs: torch.Tensor
    reward: torch.Tensor


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a == b).all()


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool, torch.complex64]


# -- round trips ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4)])
def test_every_dtype_and_shape_round_trips(dtype, shape):
    storage = CompressedListStorage(4)
    value = (torch.arange(max(1, torch.Size(shape).numel())) % 5)[: torch.Size(shape).numel()].reshape(shape).to(dtype)
    storage.set(0, value)
    assert _equal(storage.get(0), value)


def test_every_kind_of_item_round_trips():
    storage = CompressedListStorage(10)
    nested = TensorDict(a=torch.arange(6).reshape(3, 2), batch_size=[3])
    td = TensorDict(obs=torch.randn(3, 4), nested=nested, batch_size=[3])
    td.set_non_tensor("text", "a prompt")
    items = [
        torch.randn(2, 2),
        td,
        Step(obs=torch.zeros(3), reward=torch.ones(1)),
        {"a": torch.ones(2), "b": (torch.zeros(1, dtype=torch.int64), torch.tensor(True))},
    ]
    storage.set(torch.arange(4), items)
    out = storage.get(torch.arange(4))
    assert isinstance(out, list) and len(out) == 4
    assert _equal(out[0], items[0]) and _equal(out[3], items[3])
    assert (out[1] == td).all() and out[1]["text"] == "a prompt" and out[1].batch_size == torch.Size([3])
    assert type(out[2]) is Step and torch.equal(out[2].obs, items[2].obs)


def test_items_are_stored_compressed():
    storage = CompressedListStorage(10)
    frames = TensorDict(pixels=torch.zeros(4, 3, 32, 32, dtype=torch.uint8), batch_size=[4])
    storage.set(torch.arange(4), frames)
    assert 0 < storage.bytes() < frames.bytes() / 20
    state = storage.state_dict()
    payload = state["_storage"][0]["leaves"][0]["data"]
    assert payload.dtype == torch.uint8 and payload.numel() < 3 * 32 * 32


@pytest.mark.skipif(not HAS_ZSTD, reason="needs the optional extra 'zstd' (pip install -e '.[zstd]'): zstandard is not installed")
def test_default_codec_is_zstd_when_installed():
    storage = CompressedListStorage(4, compression_level=19)
    assert storage.codec == "zstd"
    data = torch.arange(1000) % 7
    storage.set(0, data)
    payload = storage.state_dict()["_storage"][0]["leaves"][0]["data"]
    assert bytes(payload.numpy()[:4]) == b"\x28\xb5\x2f\xfd"  # the zstd frame magic number


_FALLBACK = textwrap.dedent(
    """
    import sys
    sys.modules["zstandard"] = None  # as if it were not installed
    import torch
    from torchrl.data import CompressedListStorage
    storage = CompressedListStorage(4)
    assert storage.codec == "zlib", storage.codec
    storage.set(0, torch.arange(100) % 3)
    assert torch.equal(storage.get(0), torch.arange(100) % 3)
    payload = storage.state_dict()["_storage"][0]["leaves"][0]["data"]
    assert payload[0].item() == 0x78  # a zlib stream
    storage.dumps(sys.argv[1])
    import zlib
    state = storage.state_dict()
    leaf = state["_storage"][0]["leaves"][0]
    for data, message in [(leaf["data"][:5], "corrupted"), (zlib.compress(bytes(10**6)), "to more than 800 bytes")]:
        leaf["data"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        storage.load_state_dict(state)
        try:
            storage.get(0)
        except ValueError as err:
            assert message in str(err), str(err)
        else:
            raise AssertionError("not refused")
    print("ok")
    """
)


@pytest.mark.timeout(240)
def test_zlib_is_the_fallback_without_zstandard_and_its_checkpoint_needs_zlib(tmp_path):
    path = str(tmp_path / "zlib")
    out = subprocess.run([sys.executable, "-c", _FALLBACK, path], capture_output=True, text=True, timeout=200)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    if HAS_ZSTD:  # a zstd storage refuses a zlib checkpoint, and says why
        storage = CompressedListStorage(4)
        with pytest.raises(ValueError, match=r"codec.*'zlib'.*'zstd'.*zstandard"):
            storage.loads(path)
        assert len(storage) == 0


# -- custom functions ----------------------------------------------------------------------------------------
def test_custom_functions_returning_bytes_or_tensors():
    calls = []

    def compress(t):
        calls.append(t.shape)
        return zlib.compress(t.numpy().tobytes(), 9)

    storage = CompressedListStorage(
        4, compression_fn=compress, decompression_fn=lambda data, meta: zlib.decompress(data.numpy().tobytes())
    )
    assert storage.codec == "custom"
    storage.set(0, torch.arange(6.0).reshape(2, 3))
    assert calls == [torch.Size([2, 3])]
    assert torch.equal(storage.get(0), torch.arange(6.0).reshape(2, 3))

    def identity_bytes(t):
        return t.contiguous().view(-1).view(torch.uint8).clone()

    def restore(data, meta):
        return data.view(meta["dtype"]).reshape(meta["shape"])

    storage = CompressedListStorage(4, compression_fn=identity_bytes, decompression_fn=restore)
    storage.set(0, torch.arange(4, dtype=torch.int16))
    assert torch.equal(storage.get(0), torch.arange(4, dtype=torch.int16))


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"`compression_fn` was given without `decompression_fn`"):
        CompressedListStorage(4, compression_fn=lambda t: b"")
    with pytest.raises(ValueError, match=r"`decompression_fn` was given without `compression_fn`"):
        CompressedListStorage(4, decompression_fn=lambda d, m: b"")
    with pytest.raises(TypeError, match="`compression_fn` must be callable"):
        CompressedListStorage(4, compression_fn="zstd", decompression_fn=lambda d, m: b"")
    with pytest.raises(ValueError, match=r"`compression_level`=99 .*level in"):
        CompressedListStorage(4, compression_level=99)
    with pytest.raises(TypeError, match="compression_level"):
        CompressedListStorage(4, compression_level=1.5)
    with pytest.raises((TypeError, ValueError), match="max_size"):
        CompressedListStorage(0)


def test_a_compression_fn_returning_the_wrong_type_fails_before_anything_is_written():
    storage = CompressedListStorage(4, compression_fn=lambda t: t.float(), decompression_fn=lambda d, m: d)
    with pytest.raises(TypeError, match=r"`compression_fn` must return a uint8 tensor or bytes.*float32"):
        storage.set([0, 1], torch.zeros(2, 3))
    assert len(storage) == 0


def test_what_a_decompression_fn_returns_is_returned_as_it_is():  # TorchRL: the function owns the format
    storage = CompressedListStorage(
        4, compression_fn=lambda t: zlib.compress(t.numpy().tobytes()), decompression_fn=lambda d, m: torch.zeros(1)
    )
    storage.set(0, torch.zeros(2, 3))
    assert storage.get(0).shape == (1,)


def test_raw_bytes_of_the_wrong_size_from_a_decompression_fn_are_reported():
    storage = CompressedListStorage(
        4, compression_fn=lambda t: zlib.compress(t.numpy().tobytes()), decompression_fn=lambda d, m: b"1234"
    )
    storage.set(0, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"`decompression_fn`.*returned 4 bytes.*shape \[2, 3\]"):
        storage.get(0)


def test_corrupted_bytes_are_reported_not_misread():
    storage = CompressedListStorage(4)
    storage.set(0, torch.arange(100))
    state = storage.state_dict()
    leaf = state["_storage"][0]["leaves"][0]
    leaf["data"] = leaf["data"][: leaf["data"].numel() // 2]  # truncated
    storage.load_state_dict(state)
    with pytest.raises(ValueError, match="corrupted"):
        storage.get(0)


@pytest.mark.skipif(not HAS_ZSTD, reason="needs the optional extra 'zstd' (pip install -e '.[zstd]'): zstandard is not installed")
def test_a_zstd_frame_larger_than_the_item_is_refused_before_it_is_decompressed():
    import zstandard

    storage = CompressedListStorage(4)
    storage.set(0, torch.zeros(10))
    state = storage.state_dict()
    bomb = zstandard.ZstdCompressor().compress(bytes(10**7))
    state["_storage"][0]["leaves"][0]["data"] = torch.frombuffer(bytearray(bomb), dtype=torch.uint8)
    storage.load_state_dict(state)
    with pytest.raises(ValueError, match="corrupted or were not written by zstd"):
        storage.get(0)


def test_a_write_at_a_bad_position_changes_nothing():
    storage = CompressedListStorage(4)
    storage.set(0, torch.zeros(2))
    with pytest.raises(IndexError, match="position 3"):
        storage.set([1, 3], torch.ones(2, 2))
    assert len(storage) == 1
    with pytest.raises(TypeError, match="str"):
        storage.set(1, "text")
    assert len(storage) == 1


# -- replay buffers over it ----------------------------------------------------------------------------------
def test_replay_buffer_stacks_uniform_items_densely_and_ragged_ones_lazily():
    rb = ReplayBuffer(storage=CompressedListStorage(20), sampler=SamplerWithoutReplacement(), batch_size=4)
    rb.extend(TensorDict(obs=torch.arange(8.0).unsqueeze(-1).expand(8, 5), batch_size=[8]))
    batch, info = rb.sample(return_info=True)
    assert type(batch) is TensorDict and batch["obs"].shape == (4, 5)
    assert torch.equal(batch["obs"][:, 0], info["index"].float())
    # without replacement: 3 distinct items of 4 lengths are always ragged (3 equal draws would stack densely)
    ragged = ReplayBuffer(storage=CompressedListStorage(20), sampler=SamplerWithoutReplacement(), batch_size=3)
    ragged.extend([TensorDict(tokens=torch.arange(n)) for n in (1, 2, 3, 4)])
    batch, info = ragged.sample(return_info=True)
    assert isinstance(batch, LazyStackedTensorDict)
    assert [t.numel() for t in batch.get("tokens", as_list=True)] == (info["index"] + 1).tolist()


def test_ring_buffer_overwrites_and_slice_sampler_reads_episodes():
    rb = ReplayBuffer(storage=CompressedListStorage(12), sampler=SliceSampler(num_slices=2, traj_key="episode"),
                      batch_size=6)
    rb.extend([TensorDict(episode=torch.tensor(e), step=torch.tensor(t)) for e in range(3) for t in range(6)])
    assert rb.storage.get(0)["episode"].item() == 2  # the third episode overwrote the first
    for _ in range(5):
        batch = rb.sample()
        episodes, steps = batch["episode"].view(2, 3), batch["step"].view(2, 3)
        assert (episodes == episodes[:, :1]).all() and (steps.diff(dim=1) == 1).all()


# -- checkpoints ---------------------------------------------------------------------------------------------
def _filled(n=6) -> tuple[CompressedListStorage, list]:
    storage = CompressedListStorage(10)
    items = []
    for i in range(n):
        td = TensorDict(obs=torch.full((i % 3 + 1, 4), float(i)), action=torch.tensor(i))
        td.set_non_tensor("text", f"item {i}")
        items.append(td)
    storage.set(torch.arange(n), items)
    return storage, items


def test_dumps_loads_round_trips_and_saves_the_compressed_bytes(tmp_path):
    storage, items = _filled()
    fresh = assert_checkpoint_round_trip(storage, lambda: CompressedListStorage(10), tmp_path)
    assert len(fresh) == len(items)
    for i, item in enumerate(items):
        got = fresh.get(i)
        assert (got.exclude("text") == item.exclude("text")).all() and got["text"] == f"item {i}"
    tensors, metadata = read_checkpoint(tmp_path / "first")
    assert metadata["component"]["doc"]["codec"] == storage.codec
    values = [tensors[n] for n in tensors if n.endswith("/values")]
    assert all(v.dtype == torch.uint8 for v in values)
    assert sum(v.numel() for v in values) == storage.bytes()  # the bytes as stored, not recompressed
    assert isinstance(storage.checkpointer, CompressedListStorageCheckpointer)


def test_items_of_several_kinds_round_trip_through_a_checkpoint(tmp_path):
    storage = CompressedListStorage(6)
    items = [torch.randn(3, dtype=torch.float64), Step(obs=torch.ones(2), reward=torch.zeros(1)),
             {"a": torch.ones(2, dtype=torch.bfloat16)}, TensorDict(x=torch.zeros(0, 2), batch_size=[0])]
    storage.set(torch.arange(4), items)
    fresh = assert_checkpoint_round_trip(storage, lambda: CompressedListStorage(6), tmp_path)
    out = [fresh.get(i) for i in range(4)]
    assert _equal(out[0], items[0]) and _equal(out[2], items[2])
    assert type(out[1]) is Step and torch.equal(out[1].obs, items[1].obs)
    assert out[3].batch_size == torch.Size([0]) and out[3]["x"].shape == (0, 2)


def test_replay_buffer_dumps_loads_continues_identically(tmp_path):
    storage, _ = _filled(8)
    rb = ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=3)
    rb.set_rng(torch.Generator().manual_seed(3))
    rb.sample()
    assert_checkpoint_round_trip(rb, lambda: ReplayBuffer(storage=CompressedListStorage(10), sampler=SamplerWithoutReplacement(), batch_size=3), tmp_path, draws=3)


def test_a_non_json_value_is_refused_by_dumps_before_anything_is_written(tmp_path):
    storage = CompressedListStorage(4)
    td = TensorDict(x=torch.zeros(1))
    td.set_non_tensor("obj", object())
    storage.set(0, td)
    assert storage.get(0)["obj"] is not None  # kept verbatim in memory
    with pytest.raises(TypeError, match=r"'obj'.*pickle"):
        storage.dumps(tmp_path / "s")
    assert not os.path.exists(tmp_path / "s")


def test_loads_refuses_another_codec_or_capacity_and_changes_nothing(tmp_path):
    storage, _ = _filled(2)
    storage.dumps(tmp_path / "s")
    custom = CompressedListStorage(10, compression_fn=lambda t: zlib.compress(t.numpy().tobytes()),
                                   decompression_fn=lambda d, m: zlib.decompress(d.numpy().tobytes()))
    custom.set(0, torch.ones(1))
    with pytest.raises(ValueError, match=r"codec.*'custom'"):
        custom.loads(tmp_path / "s")
    with pytest.raises(ValueError, match="max_size"):
        CompressedListStorage(3).loads(tmp_path / "s")
    with pytest.raises(ValueError, match="class"):
        ListStorage(10).loads(tmp_path / "s")
    assert len(custom) == 1 and torch.equal(custom.get(0), torch.ones(1))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t, d: t.__setitem__("compressed_data/0/0/offsets", torch.tensor([0, 5, 3])), "offsets"),
        (lambda t, d: t.__setitem__("compressed_data/0/0/values", torch.zeros(3)), "dtype"),
        (lambda t, d: t.__setitem__("compressed_data/0/batch_sizes", torch.zeros(3, 1, dtype=torch.long)), "batch_sizes"),
        (lambda t, d: d["groups"][0]["leaves"][2].__setitem__("values", ["a"]), "JSON values"),
        (lambda t, d: d.__setitem__("layout", "stacked"), "layout"),
    ],
)
def test_loads_refuses_a_malformed_checkpoint(tmp_path, edit, match):
    storage, _ = _filled(2)
    storage.dumps(tmp_path / "good")
    tensors, metadata = read_checkpoint(tmp_path / "good", mmap=False)
    edit(tensors, metadata["component"]["doc"])
    write_checkpoint(tmp_path / "bad", tensors, metadata)
    with pytest.raises(CheckpointError, match=match):
        CompressedListStorage(10).loads(tmp_path / "bad")


def test_checkpointer_of_another_storage_kind_is_refused():
    storage = CompressedListStorage(4)
    with pytest.raises(TypeError, match=r"saves ListStorage, not a CompressedListStorage"):
        storage.checkpointer = ListStorageCheckpointer()
    with pytest.raises(TypeError, match="saves CompressedListStorage"):
        ListStorage(4).checkpointer = CompressedListStorageCheckpointer()


# -- state dicts, pickling, workers --------------------------------------------------------------------------
def test_state_dict_round_trip_and_refusal_of_a_foreign_state():
    storage, items = _filled(3)
    fresh = CompressedListStorage(10)
    fresh.load_state_dict(storage.state_dict())
    assert all(torch.equal(fresh.get(i)["obs"], items[i]["obs"]) for i in range(3))
    with pytest.raises(TypeError, match=r"state_dict\['_storage'\]\[0\]"):
        fresh.load_state_dict({"codec": fresh.codec, "_storage": [torch.zeros(2)]})
    with pytest.raises(ValueError, match="codec"):
        fresh.load_state_dict({"codec": "custom", "_storage": []})
    assert len(fresh) == 3


def test_pickle_round_trip_with_the_default_codec():
    storage, items = _filled(3)
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.codec == storage.codec and torch.equal(copy.get(2)["obs"], items[2]["obs"])
    copy.set(3, torch.ones(2))  # the copy's compressor works
    assert torch.equal(copy.get(3), torch.ones(2))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_dataloader_fork_workers_decompress_their_batches():
    storage = CompressedListStorage(16)
    storage.set(torch.arange(10), TensorDict(obs=torch.arange(10.0).unsqueeze(-1).expand(10, 3), batch_size=[10]))
    loader = DataLoader(storage.as_dataset(), batch_size=4, num_workers=2, collate_fn=tensordict_collate,
                        multiprocessing_context="fork", timeout=120)
    seen = torch.cat([batch["obs"][:, 0] for batch in loader])
    assert seen.tolist() == [float(i) for i in range(10)]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_spawn_workers_are_refused_with_the_way_out():
    storage = CompressedListStorage(8)
    storage.set(0, torch.zeros(1))
    loader = DataLoader(storage.as_dataset(), batch_size=1, num_workers=1, multiprocessing_context="spawn",
                        timeout=120)
    with pytest.raises(RuntimeError, match=r"Cannot share a storage of type CompressedListStorage.*fork"):
        next(iter(loader))


def test_per_step_strings_survive_dumps_and_loads(tmp_path):
    from tensordict import NonTensorStack

    storage = CompressedListStorage(4)
    item = TensorDict(obs=torch.randn(3, 2), batch_size=[3])
    item["text"] = NonTensorStack("a", "b", "c")
    storage.set(0, item)
    restored = assert_checkpoint_round_trip(storage, lambda: CompressedListStorage(4), tmp_path)
    assert list(restored.get(0)["text"]) == ["a", "b", "c"]
    assert torch.equal(restored.get(0)["obs"], item["obs"])
