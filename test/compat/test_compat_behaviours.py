"""Behaviours TorchRL code relies on (issue 12, "Behaviours that differ today"): each test pins one of them."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    SamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers.slice import SliceSampler

DONE = ("next", "done")
TRUNC = ("next", "truncated")
TERM = ("next", "terminated")
MASK = ("collector", "mask")


def _episodes(lengths, key="episode") -> LazyTensorStorage:
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    data = TensorDict({"obs": torch.arange(ids.numel())}, batch_size=[ids.numel()])
    data.set(key, ids)
    storage = LazyTensorStorage(100)
    storage.set(torch.arange(ids.numel()), data)
    return storage


# -- slice samplers --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["episode", ("collector", "traj_ids")])
def test_slice_sampler_exposes_the_probed_traj_key(key):
    sampler = SliceSampler(slice_len=5)
    assert sampler.traj_key is None
    _, info = sampler.sample(_episodes([10, 10], key), 10)
    assert sampler.traj_key == key
    assert {DONE, TRUNC, TERM} <= set(info)


def test_pad_output_mask_only_when_padded_and_last_real_step_truncated():
    sampler = SliceSampler(slice_len=4, strict_length=False, pad_output=True, traj_key="episode")
    _, info = sampler.sample(_episodes([10, 10]), 8)  # every trajectory holds a full slice
    assert MASK not in info
    _, info = sampler.sample(_episodes([2]), 8)  # one trajectory of 2 steps: 2 padded steps per slice
    assert info[MASK].view(2, 4).tolist() == [[True, True, False, False]] * 2
    assert info[TRUNC].view(2, 4).tolist() == [[False, True, False, False]] * 2


# -- prioritized sampler -----------------------------------------------------------------------------------------
def test_prioritized_sampler_takes_zero_dim_tensor_exponents():
    sampler = PrioritizedSampler(10, alpha=torch.tensor(0.5), beta=torch.tensor(0.4))
    assert (sampler.alpha, sampler.beta) == (0.5, pytest.approx(0.4))
    sampler.alpha = torch.tensor(0.7)  # what a parameter scheduler sets
    sampler.beta = torch.tensor(1.0)
    assert isinstance(sampler.alpha, float) and sampler.beta == 1.0


def test_prioritized_sampler_warns_when_alpha_leaves_zero():
    sampler = PrioritizedSampler(10, alpha=0.0, beta=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.alpha = 0.7  # no priority stored yet: nothing to warn about (as TorchRL)
    sampler.alpha = 0.0
    sampler.extend(torch.arange(3))
    with pytest.warns(UserWarning, match="away from 0"):
        sampler.alpha = 0.7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.alpha = 0.9  # not from 0: no warning


# -- buffers ------------------------------------------------------------------------------------------------------
def test_add_of_a_batched_tensordict_warns_and_names_extend():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.warns(UserWarning, match="extend"):
        rb.add(TensorDict(a=torch.zeros(3), batch_size=[3]))


def test_drop_last_without_batch_size_is_refused_at_construction():
    with pytest.raises(ValueError, match="batch_size"):
        ReplayBuffer(storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(drop_last=True))
    ReplayBuffer(storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(drop_last=True), batch_size=2)


# -- exception types: ours, and TorchRL's RuntimeError ------------------------------------------------------------
def test_max_value_writer_non_tensordict_is_type_and_runtime_error():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), writer=TensorDictMaxValueWriter())
    for exc in (TypeError, RuntimeError):
        with pytest.raises(exc, match="expects data to be a tensor collection"):
            rb.add(torch.zeros(3))


def test_end_key_with_end_keys_is_value_and_runtime_error():
    for exc in (ValueError, RuntimeError):
        with pytest.raises(exc, match="end_keys"):
            SliceSampler(slice_len=2, end_key=DONE, end_keys=[TERM])


def test_memmap_existsok_false_is_file_exists_and_runtime_error(tmp_path):
    (tmp_path / "old").write_text("x")
    for exc in (FileExistsError, RuntimeError):
        storage = LazyMemmapStorage(10, scratch_dir=str(tmp_path), existsok=False)
        with pytest.raises(exc, match="existsok"):
            storage.set(torch.arange(2), TensorDict(a=torch.zeros(2), batch_size=[2]))


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_iterating_with_prefetch_yields_exactly_one_epoch(prefetch):
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(), batch_size=2, prefetch=prefetch or None
    )
    rb.extend(torch.arange(10))
    for _ in range(3):  # batches prefetched past an epoch's end open the next epoch
        batches = list(rb)
        assert len(batches) == 5
        assert sorted(torch.cat(batches).tolist()) == list(range(10))


def test_prioritized_sampler_accepts_a_storage_larger_than_max_capacity():
    rb = ReplayBuffer(storage=LazyTensorStorage(12), sampler=PrioritizedSampler(4, alpha=0.7, beta=0.5))
    rb.extend(torch.arange(10))  # the trees hold 8 positions (TorchRL's capacity): items 8 and 9 get no priority
    _, info = rb.sample(256, return_info=True)
    assert info["index"].max() == 7 and info["priority_weight"].shape == (256,)


def test_priority_weight_has_the_full_batch_shape_of_trajectory_items():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0, storage=ListStorage(10))
    rb.extend(TensorDict(obs=torch.zeros(10, 4), batch_size=[10, 4]))  # 10 items of 4 steps
    batch = rb.sample(3)
    assert batch.batch_size == (3, 4)
    assert batch["priority_weight"].shape == (3, 4) and batch["index"].shape == (3, 4)
    batch["td_error"] = torch.rand(3, 4) + 1.0
    rb.update_tensordict_priority(batch)  # one priority per item: the max over its steps
    for row in range(3):
        assert rb.sampler._priority[int(batch["index"][row, 0])] == pytest.approx(
            float(batch["td_error"][batch["index"][:, 0] == batch["index"][row, 0]].amax(-1)[-1])
        )


def test_ensemble_sample_index_is_a_tensordict_of_index_and_buffer_ids():
    members = []
    for offset in (0, 100):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        rb.extend(TensorDict(obs=torch.arange(5) + offset, batch_size=[5]))
        members.append(rb)
    batch, info = ReplayBufferEnsemble(*members, batch_size=6).sample(return_info=True)
    assert set(batch["index"].keys()) == {"index", "buffer_ids"}
    assert set(info["index"].keys()) == {"index", "buffer_ids"}
    ids, rows = batch["index", "buffer_ids"], batch["index", "index"]
    assert ids.shape == rows.shape == batch.batch_size
    assert torch.equal(batch["obs"], rows + 100 * ids)


@pytest.mark.parametrize("end_keys", [None, [DONE, TERM]])
def test_slice_sampler_refuses_a_2d_end_signal(end_keys):
    data = TensorDict({DONE: torch.zeros(20, 2, dtype=torch.bool), TERM: torch.zeros(20, 1, dtype=torch.bool)},
                      batch_size=[20])
    storage = LazyTensorStorage(20)
    storage.set(torch.arange(20), data)
    sampler = SliceSampler(slice_len=4, end_key=None if end_keys else DONE, end_keys=end_keys)
    with pytest.raises(ValueError, match="one done flag per step"):
        sampler.sample(storage, 8)
