"""Non-tensor entries (strings, None, numbers) of the items of a ListStorage survive ``dumps``/``loads``.

The checkpoint format uses no pickle: tensor leaves are saved as tensors, non-tensor entries of TensorDict and
tensorclass items as JSON values in the metadata (as LazyStackStorage and CompressedListStorage do).
"""

from __future__ import annotations

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from tensordict import NonTensorData, NonTensorStack, TensorDict, is_leaf_nontensor, tensorclass

from torchrl.data import LazyStackStorage, ListStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers.checkpointers import CheckpointError, read_checkpoint, write_checkpoint


@tensorclass
class Turn:
    tokens: torch.Tensor
    text: str


def _item(i: int, text) -> TensorDict:
    return TensorDict(
        obs=torch.full((2,), float(i)),
        text=NonTensorData(text),
        meta=TensorDict(prompt=NonTensorData(f"prompt {i}"), step=torch.tensor(i)),
    )


def _leaves(td) -> dict:
    return dict(td.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))


def _assert_same_item(got, want) -> None:
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    assert set(got_leaves) == set(want_leaves)
    assert any(not isinstance(v, torch.Tensor) for v in want_leaves.values())  # the test holds non-tensor data
    for key, b in want_leaves.items():
        a = got_leaves[key]
        if isinstance(b, torch.Tensor):
            assert torch.equal(a, b), key
        elif b.data != b.data:  # NaN
            assert a.data != a.data, key
        else:
            assert isinstance(a, NonTensorData) and a.data == b.data and type(a.data) is type(b.data), key


ITEMS = {
    # one structure: the tensors are stacked, the strings are one JSON list per entry
    "stacked": lambda: [_item(0, "hello"), _item(1, "wörld ✓"), _item(2, None), _item(3, "")],
    # different structures: one entry per item
    "items": lambda: [_item(0, "hello"), TensorDict(text="alone"), TensorDict(obs=torch.ones(3), n=NonTensorData(7))],
    "numbers": lambda: [TensorDict(x=torch.ones(1), v=NonTensorData(v)) for v in (1, 2.5, True, float("nan"))],
}


@pytest.mark.parametrize("layout", sorted(ITEMS))
def test_storage_dumps_and_loads_keep_string_entries(tmp_path, layout):
    items = ITEMS[layout]()
    storage = ListStorage(10)
    storage.set(list(range(len(items))), items)
    fresh = assert_checkpoint_round_trip(storage, lambda: ListStorage(10), tmp_path)
    assert len(fresh) == len(items)
    for i, want in enumerate(items):
        got = fresh.get(i)
        assert "_utf8" not in got.keys()
        _assert_same_item(got, want)
    _, metadata = read_checkpoint(tmp_path / "first", mmap=False)
    assert metadata["component"]["doc"]["layout"] == layout.replace("numbers", "stacked")


def test_a_nested_string_comes_back_as_a_python_string(tmp_path):
    storage = ListStorage(4)
    storage.set([0, 1], [_item(0, "a"), _item(1, None)])
    fresh = assert_checkpoint_round_trip(storage, lambda: ListStorage(4), tmp_path)
    assert fresh.get(0)["meta", "prompt"] == "prompt 0"
    assert fresh.get(0)["text"] == "a"
    assert fresh.get(1)["text"] is None


def test_tensorclass_items_keep_their_string_fields(tmp_path):
    items = [Turn(tokens=torch.arange(3), text="first", batch_size=[]), Turn(tokens=torch.arange(5), text="second",
                                                                           batch_size=[])]
    storage = ListStorage(4)
    storage.set([0, 1], items)
    fresh = assert_checkpoint_round_trip(storage, lambda: ListStorage(4), tmp_path)
    assert [type(fresh.get(i)) for i in range(2)] == [Turn, Turn]
    assert [fresh.get(i).text for i in range(2)] == ["first", "second"]
    assert torch.equal(fresh.get(1).tokens, torch.arange(5))


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_buffer_dumps_and_loads_keep_string_entries(tmp_path, cls):
    rb = cls(storage=ListStorage(8), batch_size=2)
    batch = TensorDict(obs=torch.arange(4.0)[:, None], text=["a", "b", None, "ü"], batch_size=[4])
    rb.extend(batch)
    fresh = assert_checkpoint_round_trip(rb, lambda: cls(storage=ListStorage(8), batch_size=2), tmp_path)
    assert len(fresh) == 4
    assert [fresh.storage.get(i)["text"] for i in range(4)] == ["a", "b", None, "ü"]
    sample = fresh.sample()
    assert sample["obs"].shape == (2, 1)
    assert list(sample["text"]) == [["a", "b", None, "ü"][int(i)] for i in sample["obs"].view(-1).tolist()]


def test_a_non_json_entry_is_refused_before_anything_is_written(tmp_path):
    storage = ListStorage(4)
    storage.set([0, 1], [_item(0, "fine"), TensorDict(x=torch.ones(1), obj=NonTensorData({"a": object()}))])
    with pytest.raises(TypeError, match=r"'obj' of item 1 of the ListStorage.*dict.*would need pickle"):
        storage.dumps(tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda leaf: leaf.__setitem__("values", ["only one"]), "list of 2 JSON values"),
        (lambda leaf: leaf.__setitem__("values", [{"a": 1}, "b"]), "not a str, int, float, bool or None"),
        (lambda leaf: leaf.__setitem__("values", "ab"), "list of 2 JSON values"),
    ],
    ids=["too-few", "not-a-scalar", "not-a-list"],
)
def test_loads_refuses_malformed_json_leaves_and_changes_nothing(tmp_path, edit, match):
    storage = ListStorage(4)
    storage.set([0, 1], [_item(0, "a"), _item(1, "b")])
    storage.dumps(tmp_path / "good")
    tensors, metadata = read_checkpoint(tmp_path / "good", mmap=False)
    leaves = metadata["component"]["doc"]["entries"][0]["leaves"]
    edit(next(leaf for leaf in leaves if leaf.get("kind") == "json" and leaf["key"] == ["text"]))
    write_checkpoint(tmp_path / "bad", tensors, metadata)
    target = ListStorage(4)
    target.set(0, torch.zeros(1))
    with pytest.raises(CheckpointError, match=match):
        target.loads(tmp_path / "bad")
    assert len(target) == 1 and torch.equal(target.get(0), torch.zeros(1))


# -- per-step strings: a NonTensorStack entry of items with batch dims (trajectories) ---------------------------
def _trajectory(steps: int, texts) -> TensorDict:
    return TensorDict(obs=torch.arange(float(steps))[:, None], text=texts, batch_size=[steps])


TRAJECTORIES = {
    "stacked": lambda: [_trajectory(3, ["a", None, "c"]), _trajectory(3, ["d", "e", "ü"])],
    "items": lambda: [_trajectory(3, ["a", None, "c"]), _trajectory(2, ["x", "y"]),
                      TensorDict(obs=torch.ones(2, 1), text=[["q"], ["r"]], batch_size=[2, 1])],
}


@pytest.mark.parametrize("layout", sorted(TRAJECTORIES))
def test_per_step_strings_of_trajectory_items_survive(tmp_path, layout):
    items = TRAJECTORIES[layout]()
    storage = ListStorage(10)
    for i, item in enumerate(items):
        storage.set(i, item)
    fresh = assert_checkpoint_round_trip(storage, lambda: ListStorage(10), tmp_path)
    _, metadata = read_checkpoint(tmp_path / "first", mmap=False)
    assert metadata["component"]["doc"]["layout"] == layout
    for i, want in enumerate(items):
        got = fresh.get(i)
        assert got.batch_size == want.batch_size
        assert isinstance(got.get("text"), NonTensorStack)
        assert got.get("text").tolist() == want.get("text").tolist()
        assert torch.equal(got["obs"], want["obs"])


def test_lazy_stack_storage_keeps_per_step_strings(tmp_path):
    storage = LazyStackStorage(10)
    storage.set(0, _trajectory(3, ["a", None, "c"]))
    storage.set(1, _trajectory(2, ["x", "y"]))
    fresh = assert_checkpoint_round_trip(storage, lambda: LazyStackStorage(10), tmp_path)
    assert fresh.get(0).get("text").tolist() == ["a", None, "c"]
    assert fresh.get(1).get("text").tolist() == ["x", "y"]


def test_a_stack_of_non_json_values_is_refused(tmp_path):
    storage = ListStorage(4)
    storage.set(0, TensorDict(obs=torch.ones(2, 1), tag=NonTensorStack(NonTensorData({"a": 1}), NonTensorData(3)),
                              batch_size=[2]))
    with pytest.raises(TypeError, match=r"'tag' of item 0 of the ListStorage: it holds a dict"):
        storage.dumps(tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "stack, match",
    [
        ([["a", "b"]], "shaped"),  # one step too few
        (["a", ["b"]], "shaped"),  # nested deeper than the batch
        (["a", {"x": 1}], "shaped"),  # not a scalar
    ],
    ids=["too-short", "too-deep", "not-a-scalar"],
)
def test_loads_refuses_a_stack_that_does_not_fit_its_item(tmp_path, stack, match):
    storage = ListStorage(4)
    storage.set(0, _trajectory(2, ["a", "b"]))
    storage.dumps(tmp_path / "good")
    tensors, metadata = read_checkpoint(tmp_path / "good", mmap=False)
    leaf = next(leaf for leaf in metadata["component"]["doc"]["entries"][0]["leaves"] if leaf.get("kind") == "json")
    leaf["values"] = [{"stack": stack}]
    write_checkpoint(tmp_path / "bad", tensors, metadata)
    with pytest.raises(CheckpointError, match=match):
        ListStorage(4).loads(tmp_path / "bad")
