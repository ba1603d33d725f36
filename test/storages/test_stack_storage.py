"""LazyStackStorage: ragged TensorDicts read as lazy stacks; writes that refuse what cannot be stacked; checkpoints
in the flat-buffer + offsets layout; state dicts, pickling, DataLoader workers and replay buffers over it."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from tensordict import LazyStackedTensorDict, TensorDict, lazy_stack, tensorclass
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyStackStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers.checkpointers import CheckpointError, read_checkpoint, write_checkpoint


@tensorclass
class Step:
    obs: torch.Tensor
    reward: torch.Tensor


def _ragged(n: int, *, text: bool = False) -> list[TensorDict]:
    """Item i: tokens = arange(i + 1) (ragged), a fixed-shape reward, a nested ragged entry."""
    items = []
    for i in range(n):
        td = TensorDict(
            tokens=torch.arange(i + 1),
            reward=torch.tensor([float(i)]),
            nested=TensorDict(mask=torch.ones(i % 3 + 1, 2, dtype=torch.bool)),
        )
        if text:
            td["text"] = f"prompt {i}"
        items.append(td)
    return items


def _assert_same_items(storage, items):
    assert len(storage) == len(items)
    for i, expected in enumerate(items):
        got = storage.get(i)
        assert set(got.keys(True, True)) == set(expected.keys(True, True))
        assert (got == expected).all(), i


# -- reads ---------------------------------------------------------------------------------------------------
def test_get_of_an_index_returns_a_lazy_stack_of_ragged_items():
    storage = LazyStackStorage(10)
    items = _ragged(4)
    storage.set(torch.arange(4), items)
    batch = storage.get(torch.tensor([3, 0, 2]))
    assert isinstance(batch, LazyStackedTensorDict) and batch.batch_size == torch.Size([3])
    assert [t.tolist() for t in batch.get("tokens", as_list=True)] == [[0, 1, 2, 3], [0], [0, 1, 2]]
    assert batch["reward"].tolist() == [[3.0], [0.0], [2.0]]  # one shape: stacks densely
    assert storage.get(1) is items[1]  # an int returns the item as written
    assert isinstance(storage.get(slice(0, 2)), LazyStackedTensorDict)
    assert isinstance(storage.get([1]), LazyStackedTensorDict)


def test_empty_index_returns_an_empty_lazy_stack():
    storage = LazyStackStorage(10)
    storage.set(0, _ragged(1)[0])
    out = storage.get(torch.tensor([], dtype=torch.long))
    assert isinstance(out, LazyStackedTensorDict) and out.batch_size == torch.Size([0])


@pytest.mark.parametrize("stack_dim", [1, -1])
def test_stack_dim_places_the_items_along_that_dim(stack_dim):
    storage = LazyStackStorage(10, stack_dim=stack_dim)
    storage.set([0, 1], [TensorDict(x=torch.zeros(2, 3), batch_size=[2]),
                         TensorDict(x=torch.ones(4, 3), batch_size=[4])])
    batch = storage.get([0, 1])
    assert batch.stack_dim == 1 and batch.batch_size[1] == 2
    assert [t.shape for t in batch.get("x", as_list=True)] == [torch.Size([2, 3]), torch.Size([4, 3])]


def test_tensorclass_items_are_lazily_stacked():
    storage = LazyStackStorage(4)
    storage.set([0, 1], [Step(obs=torch.zeros(2), reward=torch.ones(1)),
                         Step(obs=torch.zeros(5), reward=torch.ones(1))])
    batch = storage.get([0, 1])
    assert type(batch) is Step
    assert batch.reward.tolist() == [[1.0], [1.0]]


# -- writes that are refused leave the storage unchanged -----------------------------------------------------
def test_a_non_tensordict_item_is_refused_and_nothing_is_written():
    storage = LazyStackStorage(10)
    storage.set(0, _ragged(1)[0])
    with pytest.raises(TypeError, match=r"item 1 .*Tensor.*TensorDict\(x=tensor\)"):
        storage.set([1, 2], [TensorDict(tokens=torch.arange(2)), torch.zeros(3)])
    with pytest.raises(TypeError, match="str"):
        storage.set(1, "text")
    assert len(storage) == 1


def test_items_with_another_number_of_batch_dims_are_refused():
    storage = LazyStackStorage(10)
    storage.set(0, TensorDict(x=torch.zeros(3)))
    with pytest.raises(ValueError, match=r"batch_size \[2\] \(1 batch dims\).*0 batch dims"):
        storage.set([1, 2], [TensorDict(x=torch.zeros(1)), TensorDict(x=torch.zeros(2, 1), batch_size=[2])])
    assert len(storage) == 1
    # overwriting the only item with another ndim is fine: no stored item keeps the old one
    storage.set(0, TensorDict(x=torch.zeros(2, 1), batch_size=[2]))
    assert storage.get(0).batch_size == torch.Size([2])


def test_a_stack_dim_that_does_not_fit_the_items_is_refused_at_write():
    storage = LazyStackStorage(10, stack_dim=2)
    with pytest.raises(ValueError, match=r"`stack_dim`=2 .*\[-2, 1\]"):
        storage.set(0, TensorDict(x=torch.zeros(3, 1), batch_size=[3]))
    assert len(storage) == 0
    with pytest.raises(TypeError, match="stack_dim"):
        LazyStackStorage(10, stack_dim=0.5)


def test_extend_accepts_a_lazy_stack_or_a_batched_tensordict():
    rb = ReplayBuffer(storage=LazyStackStorage(10), batch_size=2)
    items = _ragged(3)
    assert rb.extend(lazy_stack(items)).tolist() == [0, 1, 2]
    assert rb.extend(TensorDict(x=torch.zeros(2, 3), batch_size=[2])).tolist() == [3, 4]
    assert rb.storage.get(2)["tokens"].tolist() == [0, 1, 2] and rb.storage.get(4)["x"].shape == (3,)


def test_ring_buffer_overwrites_oldest_items():
    rb = ReplayBuffer(storage=LazyStackStorage(3), batch_size=2)
    rb.extend(_ragged(5))
    assert [rb.storage.get(i)["tokens"].numel() for i in range(3)] == [4, 5, 3]  # items 3, 4 overwrote 0, 1


# -- replay buffers over it ----------------------------------------------------------------------------------
def test_replay_buffer_samples_lazy_stacks_with_random_and_without_replacement_samplers():
    items = _ragged(6)
    for sampler in (RandomSampler(), SamplerWithoutReplacement()):
        rb = ReplayBuffer(storage=LazyStackStorage(10), sampler=sampler, batch_size=3)
        rb.extend(items)
        batch, info = rb.sample(return_info=True)
        assert isinstance(batch, LazyStackedTensorDict)
        for tokens, index in zip(batch.get("tokens", as_list=True), info["index"].tolist()):
            assert tokens.tolist() == list(range(index + 1))


def test_slice_sampler_reads_episodes_from_a_lazy_stack_storage():
    sampler = SliceSampler(num_slices=2, traj_key="episode")
    rb = ReplayBuffer(storage=LazyStackStorage(30), sampler=sampler, batch_size=6)
    rb.extend([
        TensorDict(episode=torch.tensor(e), step=torch.tensor(t), obs=torch.arange(t + 1))
        for e in range(3) for t in range(6)
    ])
    torch.manual_seed(0)
    for _ in range(5):
        batch = rb.sample()
        episodes, steps = batch["episode"].view(2, 3), batch["step"].view(2, 3)
        assert (episodes == episodes[:, :1]).all()  # a slice never crosses an episode
        assert (steps.diff(dim=1) == 1).all()
        assert [t.numel() for t in batch.get("obs", as_list=True)] == (batch["step"] + 1).tolist()


# -- checkpoints ---------------------------------------------------------------------------------------------
def test_dumps_loads_round_trips_ragged_items_nested_keys_and_strings(tmp_path):
    storage = LazyStackStorage(10)
    items = _ragged(5, text=True)
    storage.set(torch.arange(5), items)
    fresh = assert_checkpoint_round_trip(storage, lambda: LazyStackStorage(10), tmp_path)
    _assert_same_items(fresh, items)
    assert fresh.get(4)["text"] == "prompt 4"
    # one flat buffer per entry, not one file per item
    tensors, _ = read_checkpoint(tmp_path / "first")
    values = [name for name in tensors if name.endswith("/values")]
    assert len(values) == 3 and all(tensors[n].ndim == 1 for n in values)  # tokens, reward, nested.mask
    expected = sum(1 + i for i in range(5)) + 5 + 2 * sum(i % 3 + 1 for i in range(5))
    assert sum(tensors[n].numel() for n in values) == expected


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int64,
              torch.bool, torch.complex64],
)
def test_dumps_loads_keeps_every_dtype(tmp_path, dtype):
    storage = LazyStackStorage(4)
    items = [TensorDict(x=(torch.arange(n * 2).reshape(n, 2) % 3).to(dtype)) for n in (1, 3, 0)]
    storage.set([0, 1, 2], items)
    fresh = assert_checkpoint_round_trip(storage, lambda: LazyStackStorage(4), tmp_path)
    for i in range(3):
        got = fresh.get(i)["x"]
        assert got.dtype == dtype and got.shape == items[i]["x"].shape and torch.equal(got, items[i]["x"])


def test_items_of_different_structures_go_to_separate_groups(tmp_path):
    storage = LazyStackStorage(6)
    items = [TensorDict(a=torch.zeros(2)), TensorDict(b=torch.ones(3, dtype=torch.int32)), TensorDict(a=torch.ones(1)),
             Step(obs=torch.zeros(4), reward=torch.ones(1))]
    storage.set(torch.arange(4), items)
    fresh = assert_checkpoint_round_trip(storage, lambda: LazyStackStorage(6), tmp_path)
    for i, item in enumerate(items):
        got = fresh.get(i)
        assert type(got) is type(item) and (got == item).all()


def test_dumps_loads_of_an_empty_storage(tmp_path):
    LazyStackStorage(5).dumps(tmp_path / "s")
    fresh = LazyStackStorage(5)
    fresh.set(0, TensorDict(x=torch.zeros(1)))
    fresh.loads(tmp_path / "s")
    assert len(fresh) == 0


def test_replay_buffer_dumps_loads_continues_identically(tmp_path):
    rb = ReplayBuffer(storage=LazyStackStorage(20), sampler=SamplerWithoutReplacement(), batch_size=3)
    rb.extend(_ragged(9, text=True))
    rb.set_rng(torch.Generator().manual_seed(1))
    rb.sample()
    assert_checkpoint_round_trip(rb, lambda: ReplayBuffer(storage=LazyStackStorage(20), sampler=SamplerWithoutReplacement(), batch_size=3), tmp_path, draws=3)


def test_an_item_with_a_non_json_value_is_refused_before_anything_is_written(tmp_path):
    storage = LazyStackStorage(4)
    td = TensorDict(x=torch.zeros(1))
    td.set_non_tensor("obj", object())
    storage.set(0, td)
    with pytest.raises(TypeError, match=r"'obj'.*item 0.*pickle"):
        storage.dumps(tmp_path / "s")
    assert not os.path.exists(tmp_path / "s")


def test_loads_refuses_another_max_size_and_class_and_changes_nothing(tmp_path):
    storage = LazyStackStorage(4)
    storage.set(0, TensorDict(x=torch.zeros(2)))
    storage.dumps(tmp_path / "s")
    other = LazyStackStorage(5)
    other.set(0, TensorDict(y=torch.ones(1)))
    with pytest.raises(ValueError, match="max_size"):
        other.loads(tmp_path / "s")
    with pytest.raises(ValueError, match="class"):
        ListStorage(4).loads(tmp_path / "s")
    with pytest.raises(ValueError, match=r"stack_dim=3.*\[-1, 0\]"):
        LazyStackStorage(4, stack_dim=3).loads(tmp_path / "s")
    assert list(other.get(0).keys()) == ["y"]


def _tampered(tmp_path, edit):
    """A checkpoint of a 3-item storage whose description or tensors ``edit`` changed, correctly signed."""
    storage = LazyStackStorage(4)
    storage.set([0, 1, 2], [TensorDict(x=torch.arange(n)) for n in (1, 2, 3)])
    storage.dumps(tmp_path / "good")
    tensors, metadata = read_checkpoint(tmp_path / "good", mmap=False)
    edit(tensors, metadata["component"]["doc"])
    write_checkpoint(tmp_path / "bad", tensors, metadata)
    return tmp_path / "bad"


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t, d: t.__setitem__("storage/0/0/offsets", torch.tensor([0, 1, 3, 7])), "offsets"),
        (lambda t, d: t.__setitem__("storage/0/0/shapes", torch.tensor([[1], [2], [4]])), "number of values"),
        (lambda t, d: t.__setitem__("storage/0/positions", torch.tensor([0, 1, 1])), "exactly once"),
        (lambda t, d: t.__setitem__("storage/0/positions", torch.tensor([0, 1, 9])), "outside"),
        (lambda t, d: d.__setitem__("count", 7), "count"),
        (lambda t, d: d["groups"][0].__setitem__("codec", {"kind": "tensor"}), "kind"),
        (lambda t, d: d["groups"][0]["leaves"][0].__setitem__("dtype", "float32"), "dtype"),
        (lambda t, d: t.pop("storage/0/0/shapes"), "missing"),
    ],
)
def test_loads_refuses_a_malformed_checkpoint_and_changes_nothing(tmp_path, edit, match):
    path = _tampered(tmp_path, edit)
    storage = LazyStackStorage(4)
    storage.set(0, TensorDict(x=torch.full((2,), 7)))
    with pytest.raises(CheckpointError, match=match):
        storage.loads(path)
    assert len(storage) == 1 and storage.get(0)["x"].tolist() == [7, 7]


# -- state dicts, pickling, workers --------------------------------------------------------------------------
def test_state_dict_round_trip_and_refusal_of_bad_items():
    storage = LazyStackStorage(10)
    items = _ragged(3)
    storage.set(torch.arange(3), items)
    fresh = LazyStackStorage(10)
    fresh.load_state_dict(storage.state_dict())
    _assert_same_items(fresh, items)
    with pytest.raises(TypeError, match="item 1"):
        fresh.load_state_dict({"_storage": [items[0], torch.zeros(2)]})
    _assert_same_items(fresh, items)


def test_pickle_round_trip():
    storage = LazyStackStorage(10, stack_dim=0)
    items = _ragged(3)
    storage.set(torch.arange(3), items)
    copy = pickle.loads(pickle.dumps(storage))
    _assert_same_items(copy, items)
    assert copy.stack_dim == 0 and "LazyStackStorage" in repr(copy)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_dataloader_fork_workers_read_lazy_stacks():
    storage = LazyStackStorage(16)
    storage.set(torch.arange(10), _ragged(10))
    loader = DataLoader(storage.as_dataset(), batch_size=4, num_workers=2, collate_fn=tensordict_collate,
                        multiprocessing_context="fork", timeout=120)
    seen = []
    for batch in loader:
        assert isinstance(batch, LazyStackedTensorDict)
        seen += [t.tolist() for t in batch.get("tokens", as_list=True)]
    assert seen == [list(range(i + 1)) for i in range(10)]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_spawn_workers_are_refused_with_the_way_out():
    storage = LazyStackStorage(8)
    storage.set(0, TensorDict(x=torch.zeros(1)))
    loader = DataLoader(storage.as_dataset(), batch_size=1, num_workers=1, collate_fn=tensordict_collate,
                        multiprocessing_context="spawn", timeout=120)
    with pytest.raises(RuntimeError, match=r"Cannot share a storage of type LazyStackStorage.*fork"):
        next(iter(loader))


def test_entries_set_on_a_sample_never_reach_the_stored_items():
    """A lazy-stack read holds shallow copies: the buffer's info entries (``priority_weight``) and the user's own
    entries stay on the sample, and an item drawn twice is two members (one's info does not overwrite the other's)."""
    rb = TensorDictReplayBuffer(
        storage=LazyStackStorage(10), batch_size=6, sampler=PrioritizedSampler(10, alpha=0.7, beta=0.5)
    )
    rb.extend(lazy_stack([TensorDict(obs=torch.randn(i + 1)) for i in range(4)]))
    stored_keys = [sorted(rb.storage[i].keys()) for i in range(4)]
    sample = rb.sample()
    sample.set("advantage", torch.arange(6.0))
    assert {"priority_weight", "advantage"} <= set(sample.keys())
    assert [sorted(rb.storage[i].keys()) for i in range(4)] == stored_keys == [["index", "obs"]] * 4
    assert sample["advantage"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # six members, even for repeated items
