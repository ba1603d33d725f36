"""Issue 12, last items: strings in tensor storages, ``shared_init=True``, and the TED storage checkpointers.

- Tensor storages hold non-tensor entries (``NonTensorData``/``NonTensorStack`` of str) per row, read back as
  ``NonTensorStack`` (batch) / ``NonTensorData`` (item), through sharing, memory maps, DataLoader workers,
  ``state_dict``, pickle and the pickle-free checkpoint.
- ``LazyTensorStorage``/``LazyMemmapStorage(shared_init=True)``: the first write may come from any process.
- ``FlatStorageCheckpointer``, ``NestedStorageCheckpointer``, ``H5StorageCheckpointer``.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import pickle
import time

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from helpers.extras import needs, require
from helpers.factories import make_buffer
from tensordict import NonTensorData, NonTensorStack, TensorDict, lazy_stack, tensorclass
from torch.utils.data import DataLoader

from torchrl.data import (
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    ReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
    tensordict_collate,
)

TIMEOUT = 60
LAZY = [LazyTensorStorage, LazyMemmapStorage]


def texts(start: int, n: int) -> list[str]:
    return [f"item {i} é" for i in range(start, start + n)]  # non-ASCII: bytes != characters


def text_rows(start: int, n: int) -> TensorDict:
    """``n`` rows with ids ``start ..``: ``obs`` the id (float), ``text`` a non-ASCII string of it."""
    return TensorDict(
        obs=torch.arange(start, start + n, dtype=torch.float32),
        text=NonTensorStack.from_list(texts(start, n)),
        batch_size=[n],
    )


def values(entry) -> list:
    return entry.tolist() if isinstance(entry, NonTensorStack) else [entry.data]


# -- strings: round trips --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", LAZY)
def test_strings_round_trip_by_batch_item_and_slice(cls):
    storage = cls(10)
    storage.set(torch.arange(4), text_rows(0, 4))
    batch = storage.get(torch.tensor([3, 0, 3]))
    assert isinstance(batch.get("text"), NonTensorStack)
    assert batch.get("text").tolist() == [texts(3, 1)[0], texts(0, 1)[0], texts(3, 1)[0]]
    assert batch["obs"].tolist() == [3.0, 0.0, 3.0]
    item = storage.get(2)
    assert isinstance(item.get("text"), NonTensorData) and item["text"] == texts(2, 1)[0]
    assert storage.get(slice(1, 3)).get("text").tolist() == texts(1, 2)
    assert "_utf8" not in batch.keys()


def test_preallocated_tensor_storage_holds_strings():
    storage = TensorStorage(text_rows(0, 5))
    assert storage.get(torch.tensor([4, 1])).get("text").tolist() == [texts(4, 1)[0], texts(1, 1)[0]]
    storage.set(torch.tensor([0]), text_rows(7, 1))
    assert storage.get(0)["text"] == texts(7, 1)[0]


def test_buffer_samples_carry_the_strings_of_their_rows():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), batch_size=16)
    rb.extend(text_rows(0, 30))
    sample = rb.sample()
    assert [f"item {int(o)} é" for o in sample["obs"]] == sample.get("text").tolist()
    assert rb[torch.tensor([5])].get("text").tolist() == [texts(5, 1)[0]]


def test_lists_and_lazy_stacks_of_items_with_strings():
    items = [TensorDict(obs=torch.tensor(float(i)), text=NonTensorData(f"t{i}")) for i in range(3)]
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(3), lazy_stack(items))
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(items)  # a Python list is a batch of items
    rb.add(items[1])
    assert storage.get(torch.arange(3)).get("text").tolist() == ["t0", "t1", "t2"]
    assert rb.storage.get(torch.arange(4)).get("text").tolist() == ["t0", "t1", "t2", "t1"]


def test_nested_keys_none_values_and_one_value_for_the_batch():
    storage = LazyTensorStorage(8)
    data = TensorDict(obs=torch.zeros(3), batch_size=[3])
    data.set(("next", "text"), NonTensorStack.from_list(["a", None, "c"]))
    data.set_non_tensor("tag", "same")  # one NonTensorData for the whole batch: stored on every row
    storage.set(torch.arange(3), data)
    out = storage.get(torch.arange(3))
    assert out.get(("next", "text")).tolist() == ["a", None, "c"]
    assert values(out.get("tag")) in (["same"] * 3, ["same"])
    assert storage.get(1)["tag"] == "same"


def test_strings_per_cell_of_a_2d_storage():
    storage = LazyTensorStorage(8, ndim=2)
    data = TensorDict(obs=torch.zeros(2, 2), batch_size=[2, 2])
    data.set("text", NonTensorStack.from_list([["a", "b"], ["c", "d"]]))
    storage.set(torch.arange(2), data)
    assert storage.get((torch.tensor([1, 0]), torch.tensor([0, 1]))).get("text").tolist() == ["c", "b"]
    assert storage.flatten().get(torch.arange(4)).get("text").tolist() == ["a", "b", "c", "d"]


def test_tensorclass_string_fields_are_stored():
    @tensorclass
    class Step:
        obs: torch.Tensor
        text: str

    storage = LazyTensorStorage(4)
    storage.set(torch.arange(2), torch.stack([Step(obs=torch.zeros(()), text=t, batch_size=[]) for t in "xy"]))
    out = storage.get(torch.tensor([1, 0]))
    assert isinstance(out, Step) and list(out.text) == ["y", "x"]


def test_a_write_of_other_keys_leaves_the_strings_and_adds_new_ones():
    storage = LazyTensorStorage(6)
    storage.set(torch.arange(3), text_rows(0, 3))
    storage.set(torch.tensor([1]), TensorDict(obs=torch.tensor([9.0]), batch_size=[1]))  # no text: kept
    assert storage.get(1)["text"] == texts(1, 1)[0] and storage.get(1)["obs"] == 9.0
    extra = TensorDict(query=NonTensorStack("q"), batch_size=[1])
    storage.set(torch.tensor([2]), extra)  # a new string entry of a private storage
    assert storage.get(2)["query"] == "q" and storage.get(2)["text"] == texts(2, 1)[0]


def test_a_private_storage_widens_an_entry_for_a_longer_string():
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(2), text_rows(0, 2))
    long = "é" * 300  # 600 bytes
    storage.set(2, TensorDict(obs=torch.tensor(2.0), text=NonTensorData(long), batch_size=[]))
    assert storage.get(torch.arange(3)).get("text").tolist() == [*texts(0, 2), long]


@pytest.mark.parametrize("make", [lambda: LazyMemmapStorage(4), lambda: LazyTensorStorage(4, max_string_bytes=8)])
def test_a_storage_that_cannot_widen_refuses_a_longer_string_and_writes_nothing(make):
    storage = make()
    storage.set(torch.arange(2), TensorDict(obs=torch.zeros(2), text=NonTensorStack("a", "b"), batch_size=[2]))
    bad = TensorDict(obs=torch.ones(2), text=NonTensorStack("c", "x" * 1000), batch_size=[2])
    with pytest.raises(ValueError, match="max_string_bytes"):
        storage.set(torch.arange(2), bad)
    assert len(storage) == 2 and storage.get(torch.arange(2)).get("text").tolist() == ["a", "b"]
    assert storage.get(torch.arange(2))["obs"].tolist() == [0.0, 0.0]


def test_max_string_bytes_is_checked():
    with pytest.raises(ValueError, match="max_string_bytes"):
        LazyTensorStorage(4, max_string_bytes=0)
    with pytest.raises(ValueError, match="holds a string of 9 UTF-8 bytes"):
        LazyTensorStorage(4, max_string_bytes=8).set(0, TensorDict(t=NonTensorData("x" * 9), batch_size=[]))


def test_objects_other_than_strings_are_refused_naming_list_storage():
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(2), text_rows(0, 2))
    bad = TensorDict(obs=torch.ones(2), text=NonTensorStack("ok", {"a": 1}), batch_size=[2])
    with pytest.raises(TypeError, match=r"Entry 'text'.*dict.*ListStorage"):
        storage.set(torch.arange(2), bad)
    assert storage.get(torch.arange(2)).get("text").tolist() == texts(0, 2)
    with pytest.raises(TypeError, match="ListStorage"):
        LazyTensorStorage(4).set(0, TensorDict(meta=NonTensorData(3), batch_size=[]))


def test_the_reserved_key_is_refused():
    with pytest.raises(ValueError, match="_utf8"):
        LazyTensorStorage(4).set(0, TensorDict(_utf8=torch.zeros(()), t=NonTensorData("a"), batch_size=[]))


# -- strings: state, pickle, checkpoints -----------------------------------------------------------------------
def test_state_dict_and_pickle_keep_the_strings():
    storage = LazyTensorStorage(6)
    storage.set(torch.arange(3), text_rows(0, 3))
    fresh = LazyTensorStorage(6)
    fresh.load_state_dict(storage.state_dict())
    assert fresh.get(torch.arange(3)).get("text").tolist() == texts(0, 3)
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.get(torch.arange(3)).get("text").tolist() == texts(0, 3)


@pytest.mark.parametrize("cls", LAZY)
def test_dumps_and_loads_keep_the_strings_without_pickle(cls, tmp_path):
    rb = TensorDictReplayBuffer(storage=cls(10), batch_size=4)
    rb.extend(text_rows(0, 6))
    fresh = assert_checkpoint_round_trip(rb, lambda: TensorDictReplayBuffer(storage=cls(10), batch_size=4), tmp_path / "buffer")
    assert fresh.storage.get(torch.arange(6)).get("text").tolist() == texts(0, 6)
    names = [n for _, _, files in os.walk(tmp_path / "buffer" / "first") for n in files]
    assert all(n.endswith((".memmap", ".json", "COMPLETE")) for n in names), names
    storage = assert_checkpoint_round_trip(rb.storage, lambda: cls(10), tmp_path / "storage")
    assert storage.get(5)["text"] == texts(5, 1)[0]


# -- strings: other processes ----------------------------------------------------------------------------------
def _write_rows(storage, start, n):
    storage.set(torch.arange(start, start + n), text_rows(start, n))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", LAZY)
def test_strings_written_by_another_process_are_seen(cls):
    storage = cls(10)
    storage.set(torch.arange(2), text_rows(0, 2))
    storage.share_memory_()
    child = mp.get_context("fork").Process(target=_write_rows, args=(storage, 2, 3))
    child.start()
    child.join(TIMEOUT)
    assert child.exitcode == 0
    assert len(storage) == 5 and storage.get(torch.arange(5)).get("text").tolist() == texts(0, 5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", LAZY)
def test_dataloader_workers_read_strings(cls):
    rb = TensorDictReplayBuffer(storage=cls(64), batch_size=8)
    rb.extend(text_rows(0, 40))
    loader = DataLoader(
        rb.storage.as_dataset(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=TIMEOUT,
        collate_fn=tensordict_collate,
    )
    seen = 0
    for batch in loader:
        assert batch.get("text").tolist() == [f"item {int(o)} é" for o in batch["obs"]]
        seen += batch.batch_size[0]
    assert seen == 40
    stream = DataLoader(rb.as_dataset(num_batches=4), batch_size=None, num_workers=2,
                        multiprocessing_context="fork", timeout=TIMEOUT, collate_fn=tensordict_collate)
    for batch in stream:
        assert batch.get("text").tolist() == [f"item {int(o)} é" for o in batch["obs"]]


# -- shared_init -----------------------------------------------------------------------------------------------
def _first_write(storage, delay):
    time.sleep(delay)
    _write_rows(storage, 0, 3)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("cls", LAZY)
def test_shared_init_takes_its_first_write_from_another_process(cls, method):
    storage = cls(10, shared_init=True)
    assert not storage.initialized
    child = mp.get_context(method).Process(target=_first_write, args=(storage, 0.0))
    child.start()
    child.join(TIMEOUT)
    assert child.exitcode == 0
    assert storage.initialized and len(storage) == 3
    assert storage.get(torch.arange(3)).get("text").tolist() == texts(0, 3)
    _write_rows(storage, 3, 2)  # the parent writes into the files the child allocated
    assert storage.get(torch.arange(5))["obs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.timeout(120)
def test_a_read_of_a_shared_init_storage_waits_for_the_first_write():
    storage = LazyTensorStorage(10, shared_init=True)
    child = mp.get_context("fork").Process(target=_first_write, args=(storage, 0.3))
    child.start()
    try:
        assert storage.get(torch.tensor([2]))["obs"].tolist() == [2.0]  # blocks until the child wrote
    finally:
        child.join(TIMEOUT)
    assert child.exitcode == 0


def test_a_read_that_nobody_writes_times_out_clearly():
    storage = LazyMemmapStorage(4, shared_init=True)
    storage.shared_init_state.wait_s = 0.05
    with pytest.raises(TimeoutError, match="shared_init=True"):
        storage.get(0)


@pytest.mark.timeout(120)
def test_a_buffer_over_a_shared_init_storage_samples_what_a_worker_wrote():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20, shared_init=True), batch_size=4, shared=True)
    child = mp.get_context("fork").Process(target=rb.extend, args=(text_rows(0, 6),))
    child.start()
    child.join(TIMEOUT)
    assert child.exitcode == 0 and len(rb) == 6
    sample = rb.sample()
    assert sample.get("text").tolist() == [f"item {int(o)} é" for o in sample["obs"]]


def test_shared_init_directory_is_removed_with_the_storage():
    storage = LazyTensorStorage(4, shared_init=True)
    storage.set(torch.arange(2), text_rows(0, 2))
    directory = storage.shared_init_state.directory
    assert os.path.isfile(os.path.join(directory, "layout.json"))
    del storage
    gc.collect()
    assert not os.path.exists(directory)


def test_shared_init_keeps_data_on_the_host():
    storage = LazyTensorStorage(4, shared_init=True, device="meta")
    with pytest.warns(UserWarning, match="cannot be honored"):  # at the first write, as in TorchRL
        storage.set(torch.arange(2), torch.zeros(2))
    assert storage.device == torch.device("cpu")
    with pytest.raises(TypeError, match="shared_init"):
        LazyMemmapStorage(4, shared_init=1)


def test_shared_init_memmap_uses_scratch_dir(tmp_path):
    storage = LazyMemmapStorage(4, shared_init=True, scratch_dir=tmp_path / "s")
    storage.set(torch.arange(2), text_rows(0, 2))
    layout = json.loads((tmp_path / "s" / "layout.json").read_text())
    assert layout["batch_size"] == [4] and storage.memmap_dir == str(tmp_path / "s")


# -- TED checkpointers -----------------------------------------------------------------------------------------
def ted(n: int, start: int = 0) -> TensorDict:
    obs = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {"obs": obs.unsqueeze(-1).expand(n, 8).clone(), "action": obs * 2, "done": torch.zeros(n, dtype=torch.bool),
         "next": {"obs": (obs + 1).unsqueeze(-1).expand(n, 8).clone(), "done": obs % 4 == 3, "reward": -obs}},
        batch_size=[n],
    )


CHECKPOINTERS = [FlatStorageCheckpointer, NestedStorageCheckpointer,
                 pytest.param(H5StorageCheckpointer, marks=needs("h5py"))]  # fmt: skip


@pytest.mark.parametrize("n", [6, 13], ids=["partial", "wrapped"])
@pytest.mark.parametrize("ckpt", CHECKPOINTERS)
def test_ted_checkpointers_round_trip_storage_dumps(ckpt, n, tmp_path):
    storage = LazyTensorStorage(10)
    storage.checkpointer = ckpt()
    rb = ReplayBuffer(storage=storage)
    rb.extend(ted(n))
    storage.dumps(tmp_path / "s")
    fresh = LazyTensorStorage(10)
    fresh.checkpointer = ckpt()
    fresh.loads(tmp_path / "s")
    assert len(fresh) == len(storage) and fresh.last_written_row == storage.last_written_row
    rows = torch.arange(len(storage))
    assert (fresh.get(rows) == storage.get(rows)).all()


@pytest.mark.parametrize("ckpt", CHECKPOINTERS)
def test_ted_checkpointers_are_used_by_buffer_dumps(ckpt, tmp_path):
    rb = make_buffer(cls=TensorDictReplayBuffer, storage="memmap", capacity=16, batch_size=4)
    rb.storage.checkpointer = ckpt()
    rb.extend(ted(12))

    def fresh_buffer():
        fresh = make_buffer(cls=TensorDictReplayBuffer, storage="memmap", capacity=16, batch_size=4)
        fresh.storage.checkpointer = ckpt()
        return fresh

    fresh = assert_checkpoint_round_trip(rb, fresh_buffer, tmp_path, draws=0)
    doc = json.loads((tmp_path / "first" / "metadata.json").read_text())
    assert '"layout": "' in json.dumps(doc)
    assert (fresh.storage.get(torch.arange(12)) == rb.storage.get(torch.arange(12))).all()
    plain = TensorDictReplayBuffer(storage=LazyMemmapStorage(16), batch_size=4)
    with pytest.raises(ValueError, match=ckpt.__name__):
        plain.loads(tmp_path / "first")
    assert len(plain) == 0


def _size(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_the_flat_layout_is_smaller_than_the_standard_one(tmp_path):
    storage = LazyTensorStorage(1000)
    storage.set(torch.arange(1000), ted(1000))
    storage.dumps(tmp_path / "standard")
    storage.checkpointer = FlatStorageCheckpointer()
    storage.dumps(tmp_path / "flat")
    assert _size(tmp_path / "flat") < 0.7 * _size(tmp_path / "standard")


def test_ted_checkpointers_refuse_what_they_cannot_save(tmp_path):
    checkpointer = FlatStorageCheckpointer()
    grid = LazyTensorStorage(8, ndim=2)
    grid.set(torch.arange(2), ted(4).reshape(2, 2))
    with pytest.raises(ValueError, match="flatten"):
        checkpointer.dumps(grid, tmp_path / "a")
    tensors = LazyTensorStorage(4)
    tensors.set(torch.arange(2), torch.zeros(2, 3))
    with pytest.raises(TypeError, match="TensorDicts"):
        checkpointer.dumps(tensors, tmp_path / "b")
    strings = LazyTensorStorage(4)
    strings.set(torch.arange(2), text_rows(0, 2))
    with pytest.raises(TypeError, match="string entries"):
        checkpointer.dumps(strings, tmp_path / "c")
    no_done = LazyTensorStorage(4)
    no_done.set(torch.arange(2), TensorDict(obs=torch.zeros(2), batch_size=[2]))
    with pytest.raises(KeyError, match="done"):
        checkpointer.dumps(no_done, tmp_path / "d")
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_h5_checkpointer_file_and_arguments(tmp_path):
    h5py = require("h5py")
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(8), ted(8))
    storage.checkpointer = H5StorageCheckpointer(h5_kwargs={"compression": "gzip"})
    storage.dumps(tmp_path / "ckpt.h5")  # a path ending in .h5 is the file
    with h5py.File(tmp_path / "ckpt.h5", "r") as f:
        assert int(f.attrs["_len"]) == 8 and json.loads(f.attrs["torchrl_storage"])["layout"] == "nested"
        assert f["storage/obs"].compression == "gzip"
    fresh = LazyTensorStorage(10)
    H5StorageCheckpointer().loads(fresh, tmp_path / "ckpt.h5")
    assert (fresh.get(torch.arange(8)) == storage.get(torch.arange(8))).all()
    with pytest.raises(ValueError, match="checkpoint_file"):
        H5StorageCheckpointer(checkpoint_file="a/b.h5")
    with pytest.raises(TypeError, match="h5_kwargs"):
        H5StorageCheckpointer(h5_kwargs=["gzip"])
    with pytest.raises(FileNotFoundError, match="storage.dumps"):
        H5StorageCheckpointer().loads(fresh, tmp_path / "missing")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("x", data=[1, 2])
    with pytest.raises(ValueError, match="torchrl_storage"):
        H5StorageCheckpointer().loads(fresh, tmp_path / "other.h5")


def test_ted_checkpointers_are_exported_where_torchrl_has_them():
    import torchrl.data.replay_buffers as rb_module

    for cls in (FlatStorageCheckpointer, NestedStorageCheckpointer, H5StorageCheckpointer):
        assert getattr(rb_module, cls.__name__) is cls
    assert issubclass(H5StorageCheckpointer, NestedStorageCheckpointer)
    assert issubclass(NestedStorageCheckpointer, FlatStorageCheckpointer)
