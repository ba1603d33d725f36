"""Crafted checkpoints whose metadata describes the data wrongly are refused with a ``CheckpointError`` naming the
field and the value, before the buffer changes.

Each checkpoint is a valid one edited as an attacker would (metadata rewritten, its ``COMPLETE`` marker re-signed):

- an entry of the storage description whose dtype is no tensor dtype (``object``);
- an entry retyped apart from its tensor (an ``int32`` entry described as ``float32``, the same byte size, or the
  tensor table's dtype edited): the bytes would be read as the other dtype;
- a pytree storage whose ``treespec`` torch cannot read, or whose leaf ``keys`` do not match it;
- a component state naming a dtype that is none.

A checkpoint whose description and tensor table agree is a checkpoint of that data: retyping both consistently
describes other (valid) data, which only the writer of the checkpoint can tell apart.

The epoch of a :class:`~torchrl.data.SamplerWithoutReplacement` state: ``_seed=-1`` is an epoch in storage order
(what a shared sampler with ``shuffle=False`` saves), other seeds are in ``[0, 2**62)``; ``len_storage`` is the
length of the storage the epoch was drawn over (at most ``2**32``), replaced by a new epoch at a draw from a
storage of another length (TorchRL's rule); a checkpoint's epoch may not cover more items than its storage holds.
"""

from __future__ import annotations

import pytest
import torch
from helpers.assertions import assert_same_state, observable_state
from helpers.factories import rewrite_checkpoint_metadata
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
)
from torchrl.data.replay_buffers._checkpoint import parts
from torchrl.data.replay_buffers.errors import CheckpointError

STORAGES = [LazyTensorStorage, LazyMemmapStorage]


def _storage(cls, tmp_path, name: str):
    return cls(10, scratch_dir=tmp_path / name) if cls is LazyMemmapStorage else cls(10)


def _saved(cls, tmp_path, data=None):
    rb = ReplayBuffer(storage=_storage(cls, tmp_path, "saved"))
    if data is None:
        data = TensorDict({"a": torch.arange(4, dtype=torch.int32), "b": torch.ones(4, 2)}, [4])
    rb.extend(data)
    rb.dumps(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _storage_doc(document: dict) -> dict:
    return document["metadata"]["component"]["doc"]["parts"]["storage"]["doc"]


def _leaf(document: dict, key: str) -> dict:
    return next(leaf for leaf in _storage_doc(document)["leaves"] if leaf["key"] == [key])


def _set_leaf_dtype(dtype):
    def mutate(document):
        _leaf(document, "a")["dtype"] = dtype

    return mutate


def _set_table_dtype(dtype):
    def mutate(document):
        document["tensors"]["storage/a"]["dtype"] = dtype

    return mutate


def _refused_and_unchanged(path, cls, tmp_path, match) -> None:
    """Loading ``path`` into a buffer holding other rows raises ``CheckpointError`` matching ``match``; the buffer
    is as it was."""
    rb = ReplayBuffer(storage=_storage(cls, tmp_path, "target"))
    rb.extend(TensorDict({"a": torch.full((2,), 7, dtype=torch.int32), "b": torch.zeros(2, 2)}, [2]))
    before = observable_state(rb)
    with pytest.raises(CheckpointError, match=match):
        rb.loads(path)
    assert_same_state(observable_state(rb), before)
    fresh = ReplayBuffer(storage=_storage(cls, tmp_path, "fresh"))  # a storage that takes its layout from it
    with pytest.raises(CheckpointError, match=match):
        fresh.loads(path)
    assert len(fresh) == 0


@pytest.mark.parametrize("cls", STORAGES)
def test_an_entry_of_no_tensor_dtype_is_refused(cls, tmp_path):
    path = _saved(cls, tmp_path)
    rewrite_checkpoint_metadata(path, _set_leaf_dtype("object"))
    _refused_and_unchanged(path, cls, tmp_path, r"entry \['a'\] has dtype 'object', which is not one of")


@pytest.mark.parametrize("cls", STORAGES)
@pytest.mark.parametrize("where", ["description", "tensor table"])
def test_an_entry_retyped_apart_from_its_tensor_is_refused(cls, tmp_path, where):
    path = _saved(cls, tmp_path)
    retype = _set_leaf_dtype if where == "description" else _set_table_dtype
    rewrite_checkpoint_metadata(path, retype("float32"))
    described, table = ("float32", "int32") if where == "description" else ("int32", "float32")
    _refused_and_unchanged(
        path, cls, tmp_path, rf"entry \['a'\] is described as {described} but its tensor 'storage/a' is {table}"
    )


@pytest.mark.parametrize("cls", STORAGES)
def test_the_unedited_checkpoint_loads(cls, tmp_path):
    path = _saved(cls, tmp_path)
    rb = ReplayBuffer(storage=_storage(cls, tmp_path, "fresh"))
    rb.loads(path)
    assert rb[:]["a"].tolist() == [0, 1, 2, 3] and rb[:]["a"].dtype == torch.int32


def _pytree_saved(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend({"obs": torch.zeros(3, 2), "act": (torch.ones(3), torch.arange(3))})
    rb.dumps(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _set_codec(field, value):
    def mutate(document):
        _storage_doc(document)["codec"][field] = value

    return mutate


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("treespec", '[1, {"type": "garbage"}]', r"`treespec` .*garbage.* is not one torch can read"),
        ("treespec", "not json", r"`treespec` \('not json'\) that is not one torch can read"),
        ("treespec", 7, r"`treespec` \(7\) that is a int, expected the str"),
        ("keys", [["obs"]], r"names 1 pytree leaf `keys` for a `treespec` of 3 leaves"),
        ("keys", "obs", r"`keys` 'obs', expected a list of lists of str"),
    ],
)
def test_a_pytree_structure_torch_cannot_read_is_refused(tmp_path, field, value, match):
    path = _pytree_saved(tmp_path)
    rewrite_checkpoint_metadata(path, _set_codec(field, value))
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend({"obs": torch.ones(1, 2), "act": (torch.ones(1), torch.arange(1))})
    before = observable_state(rb)
    with pytest.raises(CheckpointError, match=match):
        rb.loads(path)
    assert_same_state(observable_state(rb), before)


def test_a_state_naming_no_dtype_is_refused():
    assert parts.decode_state({"dtype": "float32"}, {}) is torch.float32
    with pytest.raises(ValueError, match=r"names the dtype 'object', which is not one of"):
        parts.decode_state({"dtype": "object"}, {})
    with pytest.raises(ValueError, match=r"names the dtype \['float32'\]"):
        parts.decode_state({"dtype": ["float32"]}, {})


# -- the epoch of a sampler without replacement: what its saved fields mean ---------------------------------------
def _epoch_state(**fields) -> dict:
    return {"len_storage": 5, "_sample_list": torch.tensor([3, 4]), "_ran_out": False, **fields}


def _five_items():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(5), torch.arange(5))
    return storage


def test_seed_minus_one_is_an_epoch_in_storage_order():
    sampler = SamplerWithoutReplacement()
    sampler.share_memory_()
    sampler.load_state_dict(_epoch_state(_seed=-1))
    assert sampler.state_dict()["_seed"] == -1  # kept as a seed: the permutation 0..4 ends with [3, 4]
    assert sampler.sample(_five_items(), 2)[0].tolist() == [3, 4]


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"_seed": -2}, r"\['_seed'\] is -2, expected an int in \[-1, "),
        ({"_seed": 2**62}, r"\['_seed'\] is 4611686018427387904, expected an int in \[-1, "),
        ({"len_storage": 2**32 + 1}, r"\['len_storage'\] is 4294967297, expected an int in \[0, 4294967296\]"),
        ({"len_storage": 1}, r"_sample_list"),  # positions beyond the items the epoch covers
    ],
)
def test_an_epoch_field_out_of_its_range_is_refused(fields, match):
    sampler = SamplerWithoutReplacement()
    with pytest.raises(ValueError, match=match):
        sampler.load_state_dict(_epoch_state(**fields))
    assert sampler.state_dict()["_sample_list"] is None  # nothing loaded


def test_an_epoch_over_another_storage_length_is_replaced_at_the_next_draw():
    """``len_storage`` is the length of the storage the epoch was drawn over; a sampler whose next draw sees a
    storage of another length draws a new epoch over it (TorchRL's rule), so a large one is accepted and costs
    nothing in a private sampler."""
    sampler = SamplerWithoutReplacement(shuffle=False)
    sampler.load_state_dict(_epoch_state(len_storage=10**9))
    assert sampler.state_dict()["len_storage"] == 10**9
    assert sampler.sample(_five_items(), 5)[0].tolist() == [0, 1, 2, 3, 4]
    assert sampler.state_dict()["len_storage"] == 5


def _sampler_doc(document: dict) -> dict:
    return document["metadata"]["component"]["doc"]["parts"]["sampler"]["doc"]


def _epoch_buffer(cls, tmp_path, name: str) -> ReplayBuffer:
    storage = ListStorage(10) if cls is ListStorage else _storage(cls, tmp_path, name)
    return ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=2)


def _long_epoch(document: dict) -> None:
    state = _sampler_doc(document)["state"]
    state["dict"] = [[k, {"value": 10**9} if k == "len_storage" else v] for k, v in state["dict"]]


@pytest.mark.parametrize("cls", [*STORAGES, ListStorage])
def test_a_checkpoint_epoch_longer_than_its_storage_can_hold_is_refused(cls, tmp_path):
    rb = _epoch_buffer(cls, tmp_path, "saved")
    rb.extend(torch.arange(6))
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    rewrite_checkpoint_metadata(tmp_path / "ckpt", _long_epoch)
    target = _epoch_buffer(cls, tmp_path, "target")
    target.extend(torch.arange(3))
    before = observable_state(target)
    match = r"`len_storage` = 1000000000, an epoch over more items than its storage can hold \(max_size=10\)"
    with pytest.raises(CheckpointError, match=match):
        target.loads(tmp_path / "ckpt")
    assert_same_state(observable_state(target), before)
    rb.dumps(tmp_path / "ckpt")  # the control: the unedited checkpoint loads
    target.loads(tmp_path / "ckpt")
    assert target.sampler.state_dict()["len_storage"] == 6
