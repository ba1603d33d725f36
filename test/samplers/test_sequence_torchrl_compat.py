"""TorchRL's observable behaviour of the ``Sequence`` sample unit (facts §5) and of ``TED2Flat.done_keys`` (§7).

TorchRL's ``Sequence`` output is flat: ``B`` anchors give ``B * W`` records, window-major, and every info entry
is one value per record. The reference expansions below are the facts file's worked cases, one test each.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    DEFAULT_DONE_KEYS,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    Sequence,
    TED2Flat,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
)

T, F = True, False


def _storage(capacity: int, written: int, done_at=(), *, key=("next", "done"), flag_shape=(1,)):
    """A 1-D storage written with ``written`` steps (``obs`` = the step's time), in one ring pass or more."""
    storage = LazyTensorStorage(capacity)
    rb = TensorDictReplayBuffer(storage=storage)
    done = torch.zeros(written, *flag_shape, dtype=torch.bool)
    for t in done_at:
        done[t] = True
    for start in range(0, written, capacity):  # one extend per ring pass: no write overwrites itself
        stop = min(start + capacity, written)
        rb.extend(
            TensorDict({"obs": torch.arange(start, stop), key: done[start:stop]}, batch_size=[stop - start])
        )
    return storage


def _storage_2d(time: int, lanes: int, done_cells, *, capacity: int | None = None):
    """An ``ndim=2`` storage ``[time, lanes]`` (``obs`` = ``t * lanes + lane`` of the written step)."""
    storage = LazyTensorStorage(capacity or time * lanes, ndim=2)
    rb = TensorDictReplayBuffer(storage=storage, dim_extend=0)
    done = torch.zeros(time, lanes, dtype=torch.bool)
    for t, lane in done_cells:
        done[t, lane] = True
    obs = torch.arange(time * lanes).reshape(time, lanes)
    rb.extend(TensorDict({"obs": obs, ("next", "done"): done}, batch_size=[time, lanes]))
    return storage


def _expand(unit, anchors, storage, info=None):
    index, info = unit.expand(
        tuple(torch.tensor(a) for a in anchors) if isinstance(anchors, tuple) else torch.tensor(anchors),
        {} if info is None else info,
        storage,
    )
    return index, info


def _window(unit, anchor, storage):
    index, info = _expand(unit, [anchor], storage)
    return index.tolist(), info["validity_mask"].tolist()


# -- output shape and info entries ---------------------------------------------------------------------------------
def test_expand_returns_flat_window_major_records_with_the_added_entries():
    storage = _storage(10, 10, done_at=(5, 9))
    unit = Sequence(2, burn_in=1, bootstrap=1)  # W = 4
    index, info = _expand(unit, [1, 7, 4], storage)
    assert index.shape == torch.Size([12])
    assert index.tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 3, 4, 5, 5]  # anchor 1's records first
    assert info["sequence_id"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert info["step_in_sequence"].tolist() == [0, 1, 2, 3] * 3
    assert info["learning_mask"].tolist() == [F, T, T, F] * 3
    assert info["validity_mask"].tolist() == [T] * 11 + [F]
    assert info["anchor_index"].tolist() == [1] * 4 + [7] * 4 + [4] * 4
    dtypes = {key: info[key].dtype for key in info}
    assert dtypes == {
        "sequence_id": torch.int64,
        "step_in_sequence": torch.int64,
        "learning_mask": torch.bool,
        "validity_mask": torch.bool,
        "anchor_index": torch.int64,
    }
    assert all(info[key].shape == torch.Size([12]) for key in info)


def test_expand_of_a_tuple_index_returns_a_tuple_of_flat_tensors():
    storage = _storage(10, 10, done_at=(5, 9))
    index, info = Sequence(3).expand((torch.tensor([0, 6]),), {}, storage)
    assert isinstance(index, tuple) and len(index) == 1
    assert index[0].tolist() == [0, 1, 2, 6, 7, 8]
    assert Sequence(3).read(storage, index)["obs"].tolist() == [0, 1, 2, 6, 7, 8]
    storage2 = _storage_2d(4, 2, [])
    index, info = Sequence(2).expand((torch.tensor([0, 2]), torch.tensor([1, 0])), {}, storage2)
    assert isinstance(index, tuple) and [i.shape for i in index] == [torch.Size([4])] * 2
    assert info["anchor_index"].shape == torch.Size([4, 2])


def test_existing_info_entries_are_repeated_per_record_and_scalars_pass_through():
    storage = _storage(10, 10)
    info = {
        "scalar_meta": 3.0,
        "zero_dim": torch.tensor(7),
        "per_anchor": [1.0, 2.0],
        "weights": torch.tensor([[0.5, 1.5], [2.5, 3.5]]),
        "array": np.array([4, 5]),
    }
    _, out = _expand(Sequence(3), [0, 4], storage, info)
    assert out["scalar_meta"] == 3.0
    assert out["zero_dim"].ndim == 0 and int(out["zero_dim"]) == 7
    assert torch.as_tensor(out["per_anchor"]).tolist() == [1, 1, 1, 2, 2, 2]
    assert out["weights"].tolist() == [[0.5, 1.5]] * 3 + [[2.5, 3.5]] * 3
    assert out["array"].tolist() == [4, 4, 4, 5, 5, 5]


# -- through the buffer --------------------------------------------------------------------------------------------
def test_sample_through_a_buffer_returns_b_times_w_records_with_the_info_entries():
    rb = TensorDictReplayBuffer(
        storage=_storage(10, 10, done_at=(5, 9)), sample_unit=Sequence(3), batch_size=4
    )
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == torch.Size([12])
    assert sorted(info) == [
        "anchor_index",
        "index",
        "learning_mask",
        "sequence_id",
        "step_in_sequence",
        "validity_mask",
    ]
    assert info["index"].shape == torch.Size([12])
    for key in ("index", "anchor_index", "learning_mask", "validity_mask", "sequence_id", "step_in_sequence"):
        assert batch[key].shape == torch.Size([12]), key
        assert (batch[key] == info[key]).all(), key
    assert (batch["obs"] == batch["index"]).all()  # the records read are the expanded positions


def test_prioritized_sample_adds_block_constant_priority_weights():
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=_storage(10, 10, done_at=(5, 9)), sample_unit=Sequence(3), batch_size=4
    )
    rb.update_priority(torch.arange(10), torch.arange(1.0, 11.0))
    batch, info = rb.sample(return_info=True)
    assert sorted(info) == [
        "anchor_index",
        "index",
        "learning_mask",
        "priority_weight",
        "sequence_id",
        "step_in_sequence",
        "validity_mask",
    ]
    weights = info["priority_weight"]
    assert weights.shape == torch.Size([12]) and batch["priority_weight"].shape == torch.Size([12])
    assert (weights.view(4, 3) == weights.view(4, 3)[:, :1]).all()  # one weight per window, repeated


def test_sample_through_an_ndim2_buffer_returns_tuple_index_and_pairs():
    storage = _storage_2d(8, 2, [(4, 0), (6, 1), (7, 0), (7, 1)])
    rb = TensorDictReplayBuffer(storage=storage, sample_unit=Sequence(2), batch_size=3)
    batch, info = rb.sample(return_info=True)
    assert isinstance(info["index"], tuple) and [i.shape for i in info["index"]] == [torch.Size([6])] * 2
    assert batch.batch_size == torch.Size([6])
    assert batch["index"].shape == batch["anchor_index"].shape == torch.Size([6, 2])
    rows, lanes = info["index"]
    assert (batch["obs"] == rows * 2 + lanes).all()
    assert (batch["anchor_index"][:, 1] == lanes).all()  # lanes preserved


# -- reference expansions: capacity 10, done at slots 5 and 9, length 4 --------------------------------------------
def test_pad_reference_expansions():
    storage = _storage(10, 10, done_at=(5, 9))
    assert _window(Sequence(4), 1, storage) == ([1, 2, 3, 4], [T] * 4)
    assert _window(Sequence(4), 4, storage) == ([4, 5, 5, 5], [T, T, F, F])


def test_stop_reference_expansions():
    storage = _storage(10, 10, done_at=(5, 9))
    assert _window(Sequence(4, episode_boundary="stop"), 4, storage) == ([2, 3, 4, 5], [T] * 4)
    short = _storage(10, 10, done_at=(1,))  # an episode shorter than the window: falls back to pad
    assert _window(Sequence(4, episode_boundary="stop"), 0, short) == ([0, 1, 1, 1], [T, T, F, F])


def test_include_reset_crosses_a_done():
    storage = _storage(10, 10, done_at=(5, 9))
    assert _window(Sequence(4, episode_boundary="include_reset"), 4, storage) == ([4, 5, 6, 7], [T] * 4)


def test_include_reset_never_crosses_the_write_seam():
    storage = _storage(10, 14)  # newest step in slot 3, oldest in slot 4
    unit = Sequence(4, episode_boundary="include_reset")
    assert _window(unit, 8, storage) == ([8, 9, 0, 1], [T] * 4)
    assert _window(unit, 2, storage) == ([2, 3, 3, 3], [T, T, F, F])
    assert _window(Sequence(2, burn_in=2, episode_boundary="include_reset"), 5, storage) == (
        [4, 4, 5, 6],
        [F, T, T, T],
    )


def test_include_reset_never_reads_unwritten_slots():
    storage = _storage(100, 10)
    assert _window(Sequence(4, episode_boundary="include_reset"), 8, storage) == ([8, 9, 9, 9], [T, T, F, F])
    index, valid = _window(Sequence(2, burn_in=2, episode_boundary="include_reset"), 1, storage)
    assert index == [0, 0, 1, 2] and valid == [F, T, T, T]  # burn-in before slot 0 clamps to 0, invalid


def test_burn_in_never_shifts_the_anchor():
    storage = _storage(10, 10, done_at=(5, 9))
    unit = Sequence(2, burn_in=2)
    index, info = _expand(unit, [8], storage)
    assert index.tolist() == [6, 7, 8, 9] and info["learning_mask"].tolist() == [F, F, T, T]
    assert info["anchor_index"].tolist() == [8] * 4
    assert _window(unit, 6, storage) == ([6, 6, 6, 7], [F, F, T, T])  # 6 starts an episode


def test_bootstrap_reference_expansions():
    storage = _storage(10, 10, done_at=(5, 9))
    index, info = _expand(Sequence(2, bootstrap=1), [6], storage)
    assert index.tolist() == [6, 7, 8] and info["learning_mask"].tolist() == [T, T, F]
    assert _window(Sequence(2, bootstrap=1), 8, storage) == ([8, 9, 9], [T, T, F])
    index, info = _expand(Sequence(2, bootstrap=1, episode_boundary="stop"), [4], storage)
    assert index.tolist() == [3, 4, 5] and info["validity_mask"].tolist() == [T] * 3
    assert info["anchor_index"].tolist() == [4, 4, 4]  # the drawn anchor, not the moved window start


def test_dilation_reference_expansion():
    storage = _storage(10, 10, done_at=(5, 9))
    index, info = _expand(Sequence(3, dilation=2), [0], storage)
    assert index.tolist() == [0, 2, 4] and info["step_in_sequence"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("flag_shape", [(), (1,)], ids=["[N]", "[N,1]"])
def test_any_nested_done_key_works_and_n_by_1_flags_are_squeezed(flag_shape):
    key = ("stats", "episode_end")
    storage = _storage(10, 10, done_at=(5, 9), key=key, flag_shape=flag_shape)
    assert _window(Sequence(4, done_key=key), 4, storage) == ([4, 5, 5, 5], [T, T, F, F])
    with pytest.raises(KeyError, match="done_key"):  # the default key is not stored here
        Sequence(4).expand(torch.tensor([4]), {}, storage)


# -- ndim=2 ([time, lanes]) ----------------------------------------------------------------------------------------
def test_ndim2_pad_with_burn_in_bootstrap_and_dilation_keeps_lanes():
    storage = _storage_2d(8, 2, [(4, 0), (6, 1), (7, 0), (7, 1)])
    unit = Sequence(2, burn_in=1, bootstrap=1, dilation=2)
    (time, lanes), info = _expand(unit, ([2, 2], [0, 1]), storage)
    assert time.tolist() == [0, 2, 4, 4, 0, 2, 4, 6]
    assert lanes.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert info["validity_mask"].tolist() == [T, T, T, F, T, T, T, T]
    assert info["anchor_index"].tolist() == [[2, 0]] * 4 + [[2, 1]] * 4


def test_ndim2_stop_keeps_the_drawn_anchor():
    storage = _storage_2d(8, 2, [(4, 0), (6, 1), (7, 0), (7, 1)])
    (time, lanes), info = _expand(Sequence(3, episode_boundary="stop"), ([4], [0]), storage)
    assert time.tolist() == [2, 3, 4] and lanes.tolist() == [0, 0, 0]
    assert info["anchor_index"].tolist() == [[4, 0]] * 3


def test_ndim2_include_reset_on_a_wrapped_storage():
    storage = _storage_2d(8, 2, [], capacity=12)  # 6 rows: time 6, 7 in rows 0, 1 (newest), 2..5 in rows 2..5
    unit = Sequence(3, episode_boundary="include_reset")
    (time, lanes), info = _expand(unit, ([5], [1]), storage)
    assert (
        time.tolist() == [5, 0, 1]
        and lanes.tolist() == [1, 1, 1]
        and info["validity_mask"].tolist() == [T] * 3
    )
    (time, _), info = _expand(unit, ([1], [1]), storage)
    assert time.tolist() == [1, 1, 1] and info["validity_mask"].tolist() == [T, F, F]


# -- done_key=None ---------------------------------------------------------------------------------------------------
def test_done_key_none_makes_the_written_span_one_trajectory():
    storage = _storage(10, 5, done_at=(1,))  # the done flag at 1 is ignored
    assert _window(Sequence(3, done_key=None), 3, storage) == ([3, 4, 4], [T, T, F])
    assert _window(Sequence(3, done_key=None, episode_boundary="stop"), 3, storage) == ([2, 3, 4], [T] * 3)
    assert Sequence(3, done_key=None).done_key is None


def test_done_key_none_reads_a_storage_of_plain_tensors_up_to_the_seam():
    storage = TensorStorage(torch.zeros(4))
    storage.set(torch.arange(4), torch.arange(4.0))
    storage.set(torch.arange(2), torch.tensor([4.0, 5.0]))  # wrapped: slot 1 newest, slot 2 oldest
    index, info = Sequence(3, done_key=None).expand(torch.tensor([0]), {}, storage)
    assert index.tolist() == [0, 1, 1] and info["validity_mask"].tolist() == [T, T, F]


# -- refusals --------------------------------------------------------------------------------------------------------
def test_expand_on_a_list_storage_raises_type_error_naming_tensor_storage():
    storage = ListStorage(4)
    storage.set(0, TensorDict({("next", "done"): torch.tensor([False])}, []))
    with pytest.raises(TypeError, match="TensorStorage") as err:
        Sequence(2).expand(torch.tensor([0]), {}, storage)
    assert "ListStorage" in str(err.value)


def test_expand_on_a_plain_tensor_storage_raises_type_error_naming_tensordict():
    storage = LazyTensorStorage(4)
    storage.set(torch.arange(3), torch.arange(3.0))
    with pytest.raises(TypeError, match="TensorDict") as err:
        Sequence(2).expand(torch.tensor([0]), {}, storage)
    assert "done_key=None" in str(err.value)


def test_expand_refuses_anchors_outside_the_written_data():
    storage = _storage(10, 5)
    with pytest.raises(IndexError, match="anchor 7"):
        Sequence(2).expand(torch.tensor([1, 7]), {}, storage)


# -- priorities ------------------------------------------------------------------------------------------------------
def _prioritized(storage, unit):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=storage, sample_unit=unit)
    return rb


def _priorities(rb, n):
    return [round(float(rb.sampler._sum_tree[i]), 5) for i in range(n)]


def test_update_tensordict_priority_writes_the_max_valid_priority_to_anchor_slots_only():
    rb = _prioritized(_storage(10, 10, done_at=(8,)), Sequence(4))
    before = _priorities(rb, 10)
    batch = TensorDict(
        {
            "anchor_index": torch.tensor([7] * 8),
            "validity_mask": torch.tensor([T, T, T, F, T, T, T, F]),
            "td_error": torch.tensor([1.0, 2.0, 3.0, 50.0, 4.0, 5.0, 6.0, 60.0]),
            "index": torch.tensor([7, 8, 9, 9, 7, 8, 9, 9]),
        },
        batch_size=[8],
    )
    rb.update_tensordict_priority(batch)
    after = _priorities(rb, 10)
    assert after[7] == 6.0
    assert [a for i, a in enumerate(after) if i != 7] == [b for i, b in enumerate(before) if i != 7]


def test_update_tensordict_priority_of_a_real_sample_updates_each_anchor():
    rb = _prioritized(_storage(10, 10, done_at=(5, 9)), Sequence(3))
    batch = rb.sample(4)
    batch["td_error"] = batch["obs"].float().unsqueeze(-1)  # [B*W, 1]: reduced per record
    rb.update_tensordict_priority(batch)
    after = _priorities(rb, 10)
    anchors = set(batch["anchor_index"].tolist())
    for a in anchors:
        records = (batch["anchor_index"] == a) & batch["validity_mask"]
        assert after[a] == float(batch["obs"][records].max())
    assert all(after[i] == 1.0 for i in range(10) if i not in anchors)


def test_update_tensordict_priority_on_ndim2_maps_time_and_lane_to_the_flat_slot():
    storage = _storage_2d(4, 3, [])
    rb = _prioritized(storage, Sequence(2))
    batch = TensorDict(
        {
            "anchor_index": torch.tensor([[1, 2], [1, 2], [0, 1], [0, 1]]),
            "validity_mask": torch.tensor([T, T, T, F]),
            "td_error": torch.tensor([3.0, 4.0, 2.0, 9.0]),
        },
        batch_size=[4],
    )
    rb.update_tensordict_priority(batch)
    after = _priorities(rb, 12)
    assert after[1 * 3 + 2] == 4.0 and after[0 * 3 + 1] == 2.0
    assert [after[i] for i in range(12) if i not in (5, 1)] == [1.0] * 10


def test_anchor_priorities_refuses_a_priority_of_another_length():
    batch = TensorDict(anchor_index=torch.tensor([1, 1]), validity_mask=torch.tensor([T, T]), batch_size=[2])
    with pytest.raises(ValueError, match="priority"):
        Sequence(2).anchor_priorities(batch, torch.ones(3))


# -- the boundary cache and writes from another process ----------------------------------------------------------
def _set_done_at_1(rb):
    rb[1] = TensorDict({"obs": torch.tensor(1), ("next", "done"): torch.tensor([True])}, [])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_boundary_cache_sees_writes_of_another_process_on_a_shared_storage():
    storage = LazyTensorStorage(10)
    rb = TensorDictReplayBuffer(storage=storage, shared=True)
    rb.extend(
        TensorDict({"obs": torch.arange(6), ("next", "done"): torch.zeros(6, 1, dtype=torch.bool)}, [6])
    )
    unit = Sequence(4)
    assert _window(unit, 0, storage) == ([0, 1, 2, 3], [T] * 4)  # the boundaries are cached now
    proc = mp.get_context("fork").Process(target=_set_done_at_1, args=(rb,))
    proc.start()
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        pytest.fail("the writer process did not finish within 60 s")
    assert proc.exitcode == 0
    assert _window(unit, 0, storage) == ([0, 1, 1, 1], [T, T, F, F])


# -- §7: TED2Flat.done_keys ------------------------------------------------------------------------------------------
def test_ted2flat_done_keys_is_the_set_of_default_done_names():
    keys = TED2Flat().done_keys
    assert keys == set(DEFAULT_DONE_KEYS) == {"done", "truncated", "terminated"}
    assert isinstance(keys, set) and all(isinstance(k, str) for k in keys)
    assert TED2Flat(done_keys=["done", ("agents", "done")]).done_keys == {"done", ("agents", "done")}


def test_sampler_used_directly_with_the_unit_gives_flat_records():
    storage = _storage(10, 10, done_at=(5, 9))
    sampler = PrioritizedSampler(10, alpha=1.0, beta=1.0)
    sampler.mark_update(torch.arange(10), storage=storage)
    index, info = sampler.sample(storage, 3)
    index, info = Sequence(2).expand(index, info, storage)
    assert index.shape == info["priority_weight"].shape == torch.Size([6])
