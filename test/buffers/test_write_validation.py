"""A refused write changes nothing: bad priorities, unwritten positions, lossy casts, crafted checkpoints.

Every failure mode below asserts the exception type, that the message names the argument or key at fault
(and its value), and that the buffer is exactly as before: length, content, writer cursor and sampler
priorities. Issue 19, items 4, 5 and 7.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from helpers.factories import make_buffer, rewrite_checkpoint_metadata
from tensordict import TensorDict

from torchrl._validation import (
    check_bool,
    check_int,
    check_members,
    check_per_member,
    check_positive_int,
    is_int,
    is_real,
    member_at,
)
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.checkpointers import CheckpointError
from torchrl.data.replay_buffers.samplers.prioritized import check_priorities
from torchrl.data.replay_buffers.samplers.prioritized_slice import PrioritizedSliceSampler
from torchrl.data.replay_buffers.storages import _write_check as write_check_module

CAPACITY = 20
BAD_PRIORITIES = {"nan": float("nan"), "inf": float("inf"), "negative": -3.0}


# -- snapshots ------------------------------------------------------------------------------------------------------
def _sampler_state(sampler) -> dict | None:
    if not isinstance(sampler, PrioritizedSampler):
        return None
    return {
        "priority": sampler._priority.copy(),
        "sum": sampler._sum_tree._leaves.copy(),
        "min": sampler._min_tree._leaves.copy(),
        "max": (sampler._max_priority, sampler._max_priority_index),
        "written_end": sampler._written_end,
    }


def _content(rb):
    if not len(rb):
        return None
    data = rb.storage.get(slice(None))
    if hasattr(data, "clone"):
        return data.clone()
    return [x.clone() for x in pytree.tree_leaves(data)]  # a list of items, or a pytree of tensors


def _snapshot(rb) -> dict:
    return {
        "len": len(rb),
        "content": _content(rb),
        "writer": dict(rb.writer.state_dict()),
        "sampler": _sampler_state(rb.sampler),
        "batch_size": rb.batch_size,
    }


def _assert_unchanged(rb, before: dict) -> None:
    after = _snapshot(rb)
    assert after["len"] == before["len"]
    assert after["writer"] == before["writer"]
    assert after["batch_size"] == before["batch_size"]
    if before["content"] is None:
        assert after["content"] is None
    elif isinstance(before["content"], list):
        assert len(after["content"]) == len(before["content"])
        assert all((a == b).all() for a, b in zip(after["content"], before["content"]))
    else:
        assert (after["content"] == before["content"]).all()
    if before["sampler"] is not None:
        for name in ("priority", "sum", "min"):
            np.testing.assert_array_equal(after["sampler"][name], before["sampler"][name])
        assert after["sampler"]["max"] == before["sampler"]["max"]
        assert after["sampler"]["written_end"] == before["sampler"]["written_end"]


# -- item 4: priorities read from the data are checked before the write ----------------------------------------------
def _prioritized_td_buffer(kind: str, storage, key="td_error"):
    if kind == "td_prioritized":
        return make_buffer(cls=TensorDictPrioritizedReplayBuffer, alpha=0.7, beta=0.5, storage=storage, priority_key=key,
                           batch_size=4)  # fmt: skip
    sampler = PrioritizedSampler(storage.max_size, alpha=0.7, beta=0.5)
    return make_buffer(cls=TensorDictReplayBuffer, storage=storage, sampler=sampler, priority_key=key, batch_size=4)


def _items(start: int, n: int, key="td_error", priority=None) -> TensorDict:
    ids = torch.arange(start, start + n)
    td = TensorDict(obs=ids.float().unsqueeze(-1).expand(n, 2).clone(), batch_size=[n])
    td.set(key, torch.rand(n) + 0.1 if priority is None else torch.as_tensor(priority, dtype=torch.float32))
    return td


STORAGES = {
    "lazy": lambda tmp: LazyTensorStorage(CAPACITY),
    "memmap": lambda tmp: LazyMemmapStorage(CAPACITY, scratch_dir=tmp),
    "list": lambda tmp: ListStorage(CAPACITY),
}


@pytest.mark.parametrize("bad", list(BAD_PRIORITIES))
@pytest.mark.parametrize("key", ["td_error", "my_error", ("next", "error")], ids=str)
@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("kind", ["td_prioritized", "td_with_prioritized_sampler"])
def test_extend_with_a_bad_priority_writes_nothing_and_names_the_key(tmp_path, kind, storage, key, bad):
    rb = _prioritized_td_buffer(kind, STORAGES[storage](tmp_path), key=key)
    rb.extend(_items(0, 5, key=key))
    before = _snapshot(rb)
    name = key if isinstance(key, str) else ".".join(key)
    with pytest.raises(ValueError, match=f"`{name}` must be finite and >= 0") as err:
        rb.extend(_items(5, 2, key=key, priority=[1.0, BAD_PRIORITIES[bad]]))
    message = str(err.value)
    assert str(BAD_PRIORITIES[bad]) in message and "priority_key" in message
    assert "update_priority=False" in message and "Nothing was written" in message
    _assert_unchanged(rb, before)


@pytest.mark.parametrize("bad", list(BAD_PRIORITIES))
@pytest.mark.parametrize("kind", ["td_prioritized", "td_with_prioritized_sampler"])
def test_add_with_a_bad_priority_writes_nothing_and_names_the_key(kind, bad):
    rb = _prioritized_td_buffer(kind, LazyTensorStorage(CAPACITY))
    rb.extend(_items(0, 5))
    before = _snapshot(rb)
    with pytest.raises(ValueError, match="`td_error` must be finite and >= 0") as err:
        rb.add(_items(5, 1, priority=[BAD_PRIORITIES[bad]])[0])
    assert str(BAD_PRIORITIES[bad]) in str(err.value)
    _assert_unchanged(rb, before)


def test_a_bad_priority_hidden_by_the_reduction_is_refused_when_it_is_the_reduced_value():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY), reduction="mean")
    rb.extend(_items(0, 3))
    before = _snapshot(rb)
    data = TensorDict(obs=torch.zeros(2, 2), td_error=torch.tensor([[1.0, 2.0], [1.0, float("nan")]]), batch_size=[2])
    with pytest.raises(ValueError, match=r"`td_error` must be finite and >= 0, got \[nan\]"):
        rb.extend(data)
    _assert_unchanged(rb, before)


def test_extend_on_an_ndim_2_storage_with_a_bad_priority_writes_nothing():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY, ndim=2))
    good = TensorDict(obs=torch.zeros(2, 3), td_error=torch.ones(2, 3), batch_size=[2, 3])  # [env, time]
    rb.extend(good)
    before = _snapshot(rb)
    bad = good.clone()
    bad["td_error"][1, 2] = -3.0
    with pytest.raises(ValueError, match="`td_error`.*-3.0"):
        rb.extend(bad)
    _assert_unchanged(rb, before)


def test_a_bool_priority_entry_is_refused_before_the_write():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY))
    rb.extend(_items(0, 3))
    before = _snapshot(rb)
    data = TensorDict(obs=torch.zeros(2, 2), td_error=torch.tensor([True, False]), batch_size=[2])
    with pytest.raises(TypeError, match="`td_error`"):
        rb.extend(data)
    _assert_unchanged(rb, before)


def test_extend_with_update_priority_false_ignores_a_bad_priority_entry():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY))
    rb.extend(_items(0, 3, priority=[1.0, 2.0, 3.0]))
    rb.extend(_items(3, 2, priority=[float("nan"), -1.0]), update_priority=False)
    assert len(rb) == 5
    np.testing.assert_allclose(rb.sampler._priority[3:5], [3.0, 3.0])  # the default (max) priority


def test_valid_priorities_read_from_the_data_are_written_after_the_rows():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, storage=LazyTensorStorage(CAPACITY))
    index = rb.extend(_items(0, 4, priority=[0.0, 1.0, 2.0, 3.0]))
    assert index.tolist() == [0, 1, 2, 3] and len(rb) == 4
    np.testing.assert_allclose(rb.sampler._priority[:4], [0.0, 1.0, 2.0, 3.0])


@pytest.mark.parametrize("bad", list(BAD_PRIORITIES))
def test_update_priority_with_a_bad_priority_names_priority_and_changes_nothing(bad):
    # a guard: update_priority already refused such values; the trees must stay as they were
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(CAPACITY))
    rb.extend(torch.arange(10))
    rb.update_priority(torch.arange(10), torch.arange(10.0) + 1)
    before = _snapshot(rb)
    with pytest.raises(ValueError, match="`priority` must be finite and >= 0") as err:
        rb.update_priority(torch.tensor([1, 2]), torch.tensor([5.0, BAD_PRIORITIES[bad]]))
    assert str(BAD_PRIORITIES[bad]) in str(err.value)
    _assert_unchanged(rb, before)


def test_check_priorities_returns_the_values_and_counts_the_bad_ones():
    np.testing.assert_array_equal(check_priorities(torch.tensor([0.0, 2.5])), [0.0, 2.5])
    with pytest.raises(ValueError, match=r"`reward` must be .* got \[nan, -1.0, inf\] \(4 of 5 values\): do this"):
        check_priorities([1.0, float("nan"), -1.0, float("inf"), -2.0], "reward", fix="do this")


# -- item 5: priorities only for written positions -------------------------------------------------------------------
@pytest.mark.parametrize(
    "index, shown",
    [([15], "15"), (torch.tensor([3, 15]), "15"), (10, "10"), (torch.tensor([-1, 12, 19]), "12, 19")],
    ids=["list", "tensor-mixed", "int-at-len", "skip-and-unwritten"],
)
def test_update_priority_of_an_unwritten_position_is_refused(index, shown):
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.5, storage=LazyTensorStorage(CAPACITY), batch_size=4)
    rb.extend(torch.arange(10))
    before = _snapshot(rb)
    with pytest.raises(IndexError, match=r"`index`") as err:
        rb.update_priority(index, 1e6)
    message = str(err.value)
    assert shown in message and "len(rb) == 10" in message and "[0, 10)" in message
    _assert_unchanged(rb, before)
    assert rb.sampler.default_priority == 1.0


def test_a_refused_update_does_not_make_the_next_row_win_every_draw():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.5, storage=LazyTensorStorage(CAPACITY), batch_size=200)
    rb.extend(torch.arange(10))
    with pytest.raises(IndexError):
        rb.update_priority([15], 1e6)
    rb.extend(torch.tensor([10]))
    rb.set_rng(torch.Generator().manual_seed(0))
    drawn = rb.sample()
    assert (drawn == 10).sum() < 100  # equal priorities: about 200 / 11 draws each


def test_update_priority_on_an_ndim_2_storage_refuses_cells_of_unwritten_rows():
    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY, ndim=2), sampler=PrioritizedSampler(CAPACITY, 0.7, 0.5))
    rb.extend(torch.arange(6).reshape(2, 3))  # [env, time]: 3 rows of 2 cells
    assert len(rb) == 6
    rb.update_priority(torch.tensor([[2, 1], [0, 0]]), torch.tensor([2.0, 3.0]))  # written cells: accepted
    before = _snapshot(rb)
    for index in (torch.tensor([[0, 1], [4, 0]]), (torch.tensor([4]), torch.tensor([1]))):
        with pytest.raises(IndexError, match=r"`index`.*\[4, \d\].*len\(rb\) == 6"):
            rb.update_priority(index, torch.ones(len(index) if isinstance(index, torch.Tensor) else 1))
        _assert_unchanged(rb, before)


def test_prioritized_slice_sampler_refuses_unwritten_positions():
    sampler = PrioritizedSliceSampler(CAPACITY, alpha=1.0, beta=0.5, slice_len=2, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY), sampler=sampler, batch_size=4)
    rb.extend(TensorDict(episode=torch.arange(8) // 4, batch_size=[8]))
    before = _snapshot(rb)
    with pytest.raises(IndexError, match=r"`index`.*\[9\].*len\(rb\) == 8"):
        rb.update_priority(torch.tensor([1, 9]), torch.tensor([1.0, 5.0]))
    _assert_unchanged(rb, before)


def test_a_standalone_sampler_still_takes_any_position_its_trees_hold():
    # a guard: without a storage, only the trees bound the positions (the next power of two above max_capacity)
    sampler = PrioritizedSampler(CAPACITY, alpha=1.0, beta=0.5)
    sampler.update_priority(torch.tensor([15]), 2.0)
    assert sampler._priority[15] == 2.0
    tree = sampler._sum_tree.capacity
    with pytest.raises(IndexError, match=f"`index` {tree} is out of range"):
        sampler.update_priority(torch.tensor([tree]), 2.0)


@pytest.mark.parametrize("ndim", [1, 2])
def test_writes_that_wrap_the_ring_still_reach_the_sampler(ndim):
    storage = LazyTensorStorage(6, ndim=ndim)
    rb = ReplayBuffer(storage=storage, sampler=PrioritizedSampler(6, 1.0, 0.5), batch_size=4)
    data = torch.arange(10) if ndim == 1 else torch.arange(10).reshape(2, 5)
    index = rb.extend(data)
    assert len(rb) == 6
    rb.update_priority(index[-6:] if ndim == 1 else index[-6:], torch.full((6,), 2.0))
    assert np.isfinite(rb.sampler._priority[:6]).all()  # every stored item (positions past them hold none)


# -- item 7a: lossy casts into a stored dtype ------------------------------------------------------------------------
REFUSED = {
    "fraction-inf-nan-into-int64": (torch.int64, torch.tensor([7.9, 2.0**70, float("nan")]), "7.9"),
    "inf-into-int32": (torch.int32, torch.tensor([1.0, float("-inf")]), "-inf"),
    "300-into-uint8": (torch.uint8, torch.tensor([1, 300]), "300"),
    "minus-one-into-uint8": (torch.uint8, torch.tensor([-1, 4]), "-1"),
    "128.0-into-int8": (torch.int8, torch.tensor([128.0, 0.0]), "128.0"),
    "2**63-into-int64": (torch.int64, torch.tensor([2.0**63], dtype=torch.float64), "9.223372036854776e+18"),
    "2**40-into-int32": (torch.int32, torch.tensor([2**40]), str(2**40)),
    "2.0-into-bool": (torch.bool, torch.tensor([1.0, 2.0]), "2.0"),
    "0.5-into-bool": (torch.bool, torch.tensor([0.5, 0.0]), "0.5"),
    "2-into-bool": (torch.bool, torch.tensor([2, 0]), "2"),
    "1e300-into-float32": (torch.float32, torch.tensor([1e300], dtype=torch.float64), "1e+300"),
    "70000-into-float16": (torch.float16, torch.tensor([70000]), "70000"),
    "complex-into-float32": (torch.float32, torch.tensor([1 + 2j]), "(1+2j)"),
}
ACCEPTED = {
    "integral-floats-into-int64": (torch.int64, torch.tensor([3.0, -2.0])),
    "ints-into-float32": (torch.float32, torch.tensor([1, 2**40])),
    "zeros-and-ones-into-bool": (torch.bool, torch.tensor([0.0, 1.0])),
    "uint8-bounds": (torch.uint8, torch.tensor([0, 255])),
    "rounding-into-float32": (torch.float32, torch.tensor([0.1, 1e-50], dtype=torch.float64)),
    "non-finite-floats-into-float32": (torch.float32, torch.tensor([float("nan"), float("inf")], dtype=torch.float64)),
    "large-integral-float-into-int64": (torch.int64, torch.tensor([2.0**62, -(2.0**63)], dtype=torch.float64)),
    "bool-into-int8": (torch.int8, torch.tensor([True, False])),
}


def _typed_buffer(dtype: torch.dtype, storage: str, tmp_path, *, td: bool = True) -> ReplayBuffer:
    made = LazyTensorStorage(10) if storage == "lazy" else LazyMemmapStorage(10, scratch_dir=tmp_path)
    first = torch.zeros(2, dtype=dtype)
    return make_buffer(storage=made, data=TensorDict(x=first, n=torch.arange(2), batch_size=[2]) if td else first)


@pytest.mark.parametrize("storage", ["lazy", "memmap"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_extend_with_values_the_stored_dtype_cannot_hold_is_refused(tmp_path, case, storage):
    dtype, values, shown = REFUSED[case]
    rb = _typed_buffer(dtype, storage, tmp_path)
    before = _snapshot(rb)
    with pytest.raises(ValueError, match=f"Entry 'x' .* stored dtype {dtype}") as err:
        rb.extend(TensorDict(x=values, n=torch.arange(len(values)), batch_size=[len(values)]))
    assert shown in str(err.value) and "Nothing was written" in str(err.value)
    _assert_unchanged(rb, before)


@pytest.mark.parametrize(
    "case, item, shown",
    [("fraction-inf-nan-into-int64", 7.9, "7.9"), ("300-into-uint8", 300, "300"), ("2.0-into-bool", 2.0, "2.0")],
)
def test_add_and_plain_tensors_refuse_lossy_casts_too(tmp_path, case, item, shown):
    dtype, values, _ = REFUSED[case]
    rb = _typed_buffer(dtype, "lazy", tmp_path, td=False)
    before = _snapshot(rb)
    with pytest.raises(ValueError, match=f"The data written .* stored dtype {dtype}"):
        rb.extend(values)
    with pytest.raises(ValueError, match=rf"The data written .* stored dtype {dtype} .* e.g. \[{shown}"):
        rb.add(torch.tensor(item))
    _assert_unchanged(rb, before)


def test_direct_storage_set_refuses_a_lossy_cast_and_keeps_the_rows():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(3), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"torch.int64.*7.9"):
        storage.set(torch.arange(3, 5), torch.tensor([7.9, 1.0]))
    assert len(storage) == 3 and storage.get(slice(None)).tolist() == [1, 2, 3]


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_casts_that_keep_every_value_are_accepted(tmp_path, case):
    dtype, values = ACCEPTED[case]
    rb = _typed_buffer(dtype, "lazy", tmp_path)
    rb.extend(TensorDict(x=values, n=torch.arange(len(values)), batch_size=[len(values)]))
    stored = rb.storage.get(slice(None))["x"][2:]
    assert stored.dtype == dtype and len(rb) == 2 + len(values)
    expected = values.to(dtype)
    assert torch.equal(stored, expected) or (stored.isnan() == expected.isnan()).all()


def test_the_cast_check_is_skipped_when_dtypes_match(monkeypatch):
    calls = []
    monkeypatch.setattr(write_check_module, "check_cast", lambda *args: calls.append(args))
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    data = TensorDict(x=torch.zeros(2, dtype=torch.uint8), y=torch.zeros(2, 3), batch_size=[2])
    rb.extend(data)
    rb.extend(data)
    rb.add(data[0])
    assert calls == []
    rb.extend(TensorDict(x=torch.zeros(2, dtype=torch.int64), y=torch.zeros(2, 3), batch_size=[2]))
    assert [(args[1], args[2]) for args in calls] == [(torch.uint8, "Entry 'x' of the data written")]


# -- item 7b: counters of a crafted checkpoint -----------------------------------------------------------------------
def _rewrite_metadata(path, mutate) -> None:
    """Edits the component description of a checkpoint with ``mutate(doc)`` and re-signs the checkpoint."""
    rewrite_checkpoint_metadata(path, lambda document: mutate(document["metadata"]["component"]["doc"]))


def _storage_doc(doc):
    return doc["parts"]["storage"]["doc"]


def _set_writer(field: str, value):
    def mutate(doc):
        for key, node in doc["parts"]["writer"]["doc"]["state"]["dict"]:
            if key == field:
                node["value"] = value

    return mutate


CRAFTED = {
    "rows-above-capacity": (lambda d: _storage_doc(d).update(rows=11), "`rows` is 11", "[0, 10]"),
    "negative-rows": (lambda d: _storage_doc(d).update(rows=-1), "`rows` is -1", "[0, 10]"),
    "string-rows": (lambda d: _storage_doc(d).update(rows="4"), "`rows` is '4' (str)", "[0, 10]"),
    "last-row-past-rows": (lambda d: _storage_doc(d).update(last_row=50), "`last_row` is 50", "[-1, 5]"),
    "negative-last-row": (lambda d: _storage_doc(d).update(last_row=-5), "`last_row` is -5", "[-1, 5]"),
    "saved-rows-below-rows": (lambda d: _storage_doc(d).update(saved_rows=2), "`saved_rows` is 2", "[6, 10]"),
    "storage-grid-of-zero": (lambda d: _storage_doc(d).update(batch_size=[0]), "`batch_size[0]` is 0", ">= 1"),
    "storage-grid-too-large": (lambda d: _storage_doc(d).update(batch_size=[1000]), "`batch_size[0]` is 1000", "[10, 10]"),
    "cursor-above-capacity": (_set_writer("_cursor", 50), "`_cursor` is 50", "[0, 10]"),
    "negative-cursor": (_set_writer("_cursor", -2), "`_cursor` is -2", ">= 0"),
    "non-integer-cursor": (_set_writer("_cursor", "abc"), "`_cursor` is 'abc' (str)", ">= 0"),
    "fractional-cursor": (_set_writer("_cursor", 2.5), "`_cursor` is 2.5 (float)", ">= 0"),
    "negative-write-count": (_set_writer("_write_count", -3), "`_write_count` is -3", ">= 0"),
    "batch-size-zero": (lambda d: d.update(batch_size=0), "`batch_size` is 0", ">= 1"),
    "batch-size-string": (lambda d: d.update(batch_size="4"), "`batch_size` is '4' (str)", ">= 1"),
    "batch-size-bool": (lambda d: d.update(batch_size=True), "`batch_size` is True (bool)", ">= 1"),
}


@pytest.fixture
def saved_buffer(tmp_path):
    rb = make_buffer(capacity=10, batch_size=4, data=torch.arange(6))
    rb.dumps(tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.mark.parametrize("fresh", [True, False], ids=["into-fresh", "into-filled"])
@pytest.mark.parametrize("case", list(CRAFTED))
def test_loads_of_crafted_counters_raises_checkpoint_error_and_changes_nothing(saved_buffer, case, fresh):
    mutate, field, allowed = CRAFTED[case]
    _rewrite_metadata(saved_buffer, mutate)
    target = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=3)
    if not fresh:
        target.extend(torch.arange(100, 102))
    before = _snapshot(target)
    with pytest.raises(CheckpointError) as err:
        target.loads(saved_buffer)
    message = str(err.value)
    assert field in message and allowed in message and "Nothing was loaded" in message
    _assert_unchanged(target, before)


def test_an_untouched_checkpoint_still_loads(saved_buffer):
    target = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=3)
    target.loads(saved_buffer)
    assert len(target) == 6 and target.batch_size == 4 and target.writer.cursor == 6


def test_a_writer_checkpoint_with_a_non_integer_cursor_names_the_field(tmp_path):
    writer = RoundRobinWriter()
    writer.register_storage(LazyTensorStorage(10))
    writer.extend(torch.arange(3))
    writer.dumps(tmp_path / "w")
    _rewrite_metadata(tmp_path / "w", lambda d: d["state"]["dict"][0][1].update(value="3x"))
    target = RoundRobinWriter()
    with pytest.raises(CheckpointError, match=r"`_cursor` is '3x' \(str\), expected an int >= 0"):
        target.loads(tmp_path / "w")
    assert target.cursor == 0 and target.write_count == 0


@pytest.mark.parametrize(
    "mutate, field",
    [(lambda d: d.update(count=11), "`count` is 11"), (lambda d: d.update(count=2), "`count` is 2 but")],
    ids=["count-above-capacity", "count-not-the-items"],
)
def test_list_storage_checkpoint_with_a_wrong_count_is_refused(tmp_path, mutate, field):
    storage = ListStorage(10)
    storage.set(list(range(4)), [torch.ones(2)] * 4)
    storage.dumps(tmp_path / "s")
    _rewrite_metadata(tmp_path / "s", mutate)
    target = ListStorage(10)
    with pytest.raises(CheckpointError, match=field):
        target.loads(tmp_path / "s")
    assert len(target) == 0


# -- item 7c: 1-D data into an ndim=2 storage ------------------------------------------------------------------------
ONE_D = {
    "tensor": lambda: torch.randn(10),
    "tensordict": lambda: TensorDict(a=torch.randn(10), batch_size=[10]),
    "pytree": lambda: {"a": torch.randn(10)},
}


@pytest.mark.parametrize("initialized", [False, True], ids=["lazy", "initialized"])
@pytest.mark.parametrize("kind", list(ONE_D))
def test_one_dimensional_data_into_an_ndim_2_storage_names_dim_extend_and_the_fix(kind, initialized):
    rb = ReplayBuffer(storage=LazyTensorStorage(100, ndim=2))
    if initialized:
        first = {"tensor": torch.zeros(2, 5), "tensordict": TensorDict(a=torch.zeros(2, 5), batch_size=[2, 5])}
        rb.extend(first.get(kind, {"a": torch.zeros(2, 5)}))
    before = _snapshot(rb)
    with pytest.raises(ValueError, match=r"`dim_extend`=1.*batch shape \[10\].*ndim=1") as err:
        rb.extend(ONE_D[kind]())
    assert "unsqueeze(0)" in str(err.value) and "dim0 and dim1" not in str(err.value)
    _assert_unchanged(rb, before)
    assert rb.storage.initialized == initialized


def test_one_dimensional_data_with_dim_extend_0_names_ndim_and_the_fix():
    rb = ReplayBuffer(storage=LazyTensorStorage(100, ndim=2), dim_extend=0)
    with pytest.raises(ValueError, match=r"ndim=2 .*first 2 dim\(s\).*batch size \[10\].*ndim=1"):
        rb.extend(TensorDict(a=torch.randn(10), batch_size=[10]))
    assert len(rb) == 0 and not rb.storage.initialized


def test_two_dimensional_data_into_an_ndim_2_storage_is_still_accepted():
    rb = ReplayBuffer(storage=LazyTensorStorage(100, ndim=2))
    rb.extend(torch.randn(10).unsqueeze(0))  # the fix the message suggests: one env, 10 steps
    assert len(rb) == 10 and list(rb.storage.shape) == [100, 1]
    assert math.prod(rb.storage.shape) == 100


# -- the shared argument checks (torchrl._validation) and the ensemble member checks -------------------------------
@pytest.mark.parametrize("value, expected", [(3, True), (np.int64(3), True), (True, False), (3.0, False), ("3", False)])
def test_is_int_takes_ints_and_numpy_integers_but_not_bools(value, expected):
    assert is_int(value) is expected


@pytest.mark.parametrize("value, expected", [(0.5, True), (2, True), (np.float32(1), True), (True, False), ("1", False)])
def test_is_real_takes_numbers_but_not_bools(value, expected):
    assert is_real(value) is expected


def test_check_int_returns_a_python_int_and_none_when_allowed():
    assert check_int("k", np.int32(4), minimum=0) == 4 and type(check_int("k", np.int32(4))) is int
    assert check_int("k", None, allow_none=True) is None


@pytest.mark.parametrize(
    "value, kwargs, error, message",
    [
        (True, {}, TypeError, r"^`k` must be a positive int, got True \(bool\)\.$"),
        (2.5, {"type_error": False}, ValueError, r"^`k` must be a positive int, got 2\.5 \(float\)\.$"),
        (0, {"hint": "Pass k=1."}, ValueError, r"^`k` must be a positive int, got 0\. Pass k=1\.$"),
        (None, {}, TypeError, r"^`k` must be a positive int, got None \(NoneType\)\.$"),
        (-1, {"allow_none": True}, ValueError, r"^`k` must be a positive int or None, got -1\.$"),
    ],
)
def test_errors_name_the_argument_show_the_value_and_the_fix(value, kwargs, error, message):
    with pytest.raises(error, match=message):
        check_positive_int("k", value, **kwargs)


@pytest.mark.parametrize("minimum, words", [(0, "a non-negative int"), (3, "an int >= 3"), (None, "an int")])
def test_check_int_says_the_bound(minimum, words):
    with pytest.raises((TypeError, ValueError), match=f"`k` must be {words}, got"):
        check_int("k", -5 if minimum is not None else "x", minimum=minimum)


def test_check_bool_refuses_ints():
    assert check_bool("flag", np.bool_(True)) is True
    with pytest.raises(TypeError, match=r"`flag` must be a bool, got 1 \(int\)\. Pass flag=True\."):
        check_bool("flag", 1, hint="Pass flag=True.")


def test_member_checks():
    assert check_members("Thing", (1, 2), int) == [1, 2]
    with pytest.raises(ValueError, match="at least one member int"):
        check_members("Thing", (), int)
    with pytest.raises(TypeError, match="Member 1 of a Thing must be a int, got str"):
        check_members("Thing", (1, "a"), int)
    with pytest.raises(ValueError, match=r"`fns` must have one entry per member \(2\), got 3"):
        check_per_member("fns", [None] * 3, 2)
    assert member_at("Thing", ["a", "b"], -1) == "b"
    with pytest.raises(IndexError, match="Member 2 is out of range for an ensemble of 2 members"):
        member_at("Thing", ["a", "b"], 2)
    with pytest.raises(TypeError, match=r"Index a Thing with an int \(a member\), got bool\. Read a member\."):
        member_at("Thing", ["a", "b"], True, hint="Read a member.")
