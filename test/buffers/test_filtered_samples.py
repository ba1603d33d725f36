"""A TensorDictReplayBuffer whose forward transforms drop rows (PolicyAgeFilter on the sample path) returns the
smaller batch: the info entries with one value per drawn row are left out, the stored ``"index"`` stays."""

from __future__ import annotations

import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    SliceSampler,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.envs.transforms import PolicyAgeFilter


def _data(n: int = 8) -> TensorDict:
    return TensorDict(policy_version=torch.tensor([2, 3] * (n // 2)), obs=torch.arange(n), batch_size=[n])


def _aged_buffer(cls=TensorDictReplayBuffer, **kwargs):
    version = {"now": 3}
    rb = make_buffer(cls=cls, capacity=16, batch_size=8, data=_data(), **kwargs)  # no filter on the write path
    rb.append_transform(PolicyAgeFilter(lambda: version["now"], max_policy_lag=0))  # version 2 is stale
    return rb


def test_a_tensordict_buffer_returns_the_rows_the_filter_kept():
    rb = _aged_buffer(generator=torch.Generator().manual_seed(0))
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size[0] < 8 and (batch["policy_version"] == 3).all()
    # the stored index travels with each kept row: it names the row it was read from
    assert torch.equal(batch["obs"], batch["index"])
    assert info["index"].shape == (8,)  # the info still describes every drawn row


def test_a_batch_the_filter_keeps_whole_still_gets_the_info_entries():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(16), batch_size=4,
                                           transform=PolicyAgeFilter(3, max_policy_lag=5))  # fmt: skip
    _ = rb.extend(_data())
    batch = rb.sample()
    assert batch.batch_size == (4,) and batch["priority_weight"].shape == (4,)


def test_per_row_info_is_left_out_of_a_filtered_prioritized_batch():
    rb = _aged_buffer(TensorDictPrioritizedReplayBuffer, alpha=1.0, beta=1.0)
    for _ in range(5):
        batch = rb.sample()
        assert (batch["policy_version"] == 3).all() and "priority_weight" not in batch.keys()
        assert torch.equal(batch["obs"], batch["index"])


def test_sample_raw_of_a_filtering_buffer_keeps_its_info_entries():
    rb = _aged_buffer()
    assert rb.sample_raw()["index"].shape == (8,)  # no forward transform on the raw path


def test_a_filtered_slice_batch_drops_the_slice_flags():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=8, sampler=SliceSampler(slice_len=4))
    data = _data(16)
    data["episode"] = torch.arange(16) // 8
    _ = rb.extend(data)
    rb.append_transform(PolicyAgeFilter(3, max_policy_lag=0))
    batch = rb.sample()
    assert batch.batch_size == (4,) and (batch["policy_version"] == 3).all()
    assert ("next", "truncated") not in batch.keys(include_nested=True)
