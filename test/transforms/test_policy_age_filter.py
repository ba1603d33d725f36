"""PolicyAgeFilter (issue 26 item 2): stale rows dropped on the write path and on the sample path."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.envs.transforms import PolicyAgeFilter


def rows(versions, **extra) -> TensorDict:
    versions = torch.as_tensor(versions)
    return TensorDict(policy_version=versions, obs=torch.arange(versions.shape[0]), batch_size=versions.shape[:1],
                      **extra)


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_stale_rows_are_never_stored(cls):
    rb = cls(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(3, max_policy_lag=1))
    index = rb.extend(rows([0, 2, 2, 3]))
    assert len(rb) == 3 and index.numel() == 3
    assert rb.storage.get(torch.arange(3))["obs"].tolist() == [1, 2, 3]


def test_add_of_a_stale_row_stores_nothing():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(5, max_policy_lag=0))
    assert rb.add(rows([4])[0]).numel() == 0 and len(rb) == 0
    rb.add(rows([5])[0])
    assert len(rb) == 1


def test_an_all_stale_extend_stores_nothing():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(9, max_policy_lag=2))
    assert rb.extend(rows([0, 1, 6])).numel() == 0 and len(rb) == 0


def test_rows_stale_since_they_were_written_are_dropped_from_samples():
    version = {"now": 2}
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=64,
                      transform=PolicyAgeFilter(lambda: version["now"], max_policy_lag=1))
    rb.extend(rows([1, 1, 2, 2]))
    assert len(rb) == 4 and rb.sample().batch_size == torch.Size([64])
    version["now"] = 3  # the callable is read at each sample
    batch = rb.sample()
    assert 0 < batch.batch_size[0] < 64 and (batch["policy_version"] == 2).all()
    version["now"] = 10
    assert rb.sample().batch_size == torch.Size([0])  # every row is stale: an empty batch


def test_a_trajectory_row_is_as_old_as_its_oldest_step():
    data = TensorDict(policy_version=torch.tensor([[3, 3, 3], [3, 1, 3], [2, 2, 2]]), batch_size=[3, 3])
    out = PolicyAgeFilter(3, 1).inv(data)
    assert out.batch_size == torch.Size([2, 3]) and out["policy_version"].tolist() == [[3, 3, 3], [2, 2, 2]]
    versions = TensorDict(policy_version=torch.tensor([[3], [1]]), batch_size=[2])  # (B, 1) versions
    assert PolicyAgeFilter(3, 1)(versions).batch_size == torch.Size([1])


def test_a_fresh_batch_is_returned_as_is():
    data = rows([3, 3])
    assert PolicyAgeFilter(3, 0)(data) is data


def test_a_version_tensor_from_the_callable_is_accepted():
    assert PolicyAgeFilter(lambda: torch.tensor(3), 0)(rows([2, 3])).batch_size == torch.Size([1])


def test_declares_no_keys_so_that_it_is_opaque():
    transform = PolicyAgeFilter(0, 0)
    assert transform.in_keys == transform.out_keys == []
    assert "max_policy_lag=0" in repr(transform)


# -- errors --------------------------------------------------------------------------------------------------------
def test_negative_lag_is_refused():
    with pytest.raises(ValueError, match="must be non-negative"):
        PolicyAgeFilter(3, -1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"current_version": "3", "max_policy_lag": 0}, "`current_version` must be an int or"),
    ({"current_version": 3, "max_policy_lag": 0.5}, "`max_policy_lag` must be an int"),
    ({"current_version": 3, "max_policy_lag": 0, "strict": 1}, "`strict` must be a bool"),
    ({"current_version": 3, "max_policy_lag": 0, "policy_version_key": 1}, "`policy_version_key` must be a key"),
])
def test_bad_arguments_are_type_errors(kwargs, match):
    with pytest.raises(TypeError, match=match):
        PolicyAgeFilter(**kwargs)


def test_a_callable_that_returns_no_int_is_refused_before_anything_is_written():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(lambda: "v3", 1))
    with pytest.raises(TypeError, match="it must return an int"):
        rb.extend(rows([3]))
    assert len(rb) == 0


def test_strict_refuses_data_without_versions():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(3, 1, strict=True))
    with pytest.raises(KeyError, match="PolicyAgeFilter:"):
        rb.extend(TensorDict(obs=torch.arange(3), batch_size=[3]))
    assert len(rb) == 0


def test_without_strict_data_without_versions_passes_with_one_warning():
    transform = PolicyAgeFilter(3, 1, policy_version_key=("collector", "version"))
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=transform)
    with pytest.warns(UserWarning, match="PolicyAgeFilter: the data has no"):
        rb.extend(TensorDict(obs=torch.arange(3), batch_size=[3]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.extend(TensorDict(obs=torch.arange(3), batch_size=[3]))
    assert len(rb) == 6


def test_non_tensordict_and_misshaped_versions_are_refused():
    transform = PolicyAgeFilter(3, 1)
    with pytest.raises(TypeError, match="takes TensorDicts"):
        transform(torch.zeros(3))
    with pytest.raises(ValueError, match="batch dim"):
        transform(TensorDict(policy_version=torch.tensor(3)))
    bad = TensorDict(policy_version=torch.zeros(3, dtype=torch.long), batch_size=[3])
    bad.set_non_tensor("policy_version", "v1")
    with pytest.raises(ValueError, match="one version per row"):
        transform(bad)
