"""Writes and reads a storage refuses with an error that names the entry, the value and the fix, changing nothing.

- An integer written into a float entry must come back as the same integer: ``2**62 + 1`` in a float32 entry (it
  would read back as ``2**62``) is refused; every int up to ``2**24`` (float32) / ``2**53`` (float64) is accepted,
  and so are larger ints the dtype represents exactly (``2**40``): int rewards in a float32 entry keep working.
- A lone surrogate in a string entry (a file name decoded with ``surrogateescape``) cannot be stored as UTF-8.
- ``rb[None]`` (and other indices that are no integers) are refused as indices.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, ReplayBuffer

TENSOR_STORAGES = [LazyTensorStorage, LazyMemmapStorage]


def _float_buffer(cls, tmp_path, dtype=torch.float32) -> ReplayBuffer:
    storage = cls(8, scratch_dir=tmp_path) if cls is LazyMemmapStorage else cls(8)
    rb = ReplayBuffer(storage=storage)
    rb.extend(TensorDict({"reward": torch.zeros(2, dtype=dtype), "obs": torch.zeros(2, 3)}, [2]))
    return rb


@pytest.mark.parametrize("cls", TENSOR_STORAGES)
@pytest.mark.parametrize(
    "dtype, value", [(torch.float32, 2**62 + 1), (torch.float32, 2**24 + 1), (torch.float64, 2**53 + 1)]
)
def test_an_int_a_float_entry_cannot_hold_exactly_is_refused(cls, tmp_path, dtype, value):
    rb = _float_buffer(cls, tmp_path, dtype)
    before = rb[:]["reward"].clone()
    batch = TensorDict({"reward": torch.tensor([1, value]), "obs": torch.ones(2, 3)}, [2])
    with pytest.raises(ValueError, match=rf"Entry 'reward'.*cannot represent exactly.*{value}.*int64 or float64"):
        rb.extend(batch)
    assert len(rb) == 2 and torch.equal(rb[:]["reward"], before)  # nothing written


@pytest.mark.parametrize("cls", TENSOR_STORAGES)
def test_ints_a_float_entry_holds_exactly_are_written(cls, tmp_path):
    rb = _float_buffer(cls, tmp_path)
    values = [3, -(2**24), 2**24, 2**40, -(2**62)]  # exact in float32
    rb.extend(TensorDict({"reward": torch.tensor(values), "obs": torch.ones(5, 3)}, [5]))
    assert rb[2:]["reward"].tolist() == [float(v) for v in values]


def test_an_explicit_cast_accepts_the_rounding(tmp_path):
    rb = _float_buffer(LazyTensorStorage, tmp_path)
    rb.extend(TensorDict({"reward": torch.tensor([2**62 + 1]).to(torch.float32), "obs": torch.ones(1, 3)}, [1]))
    assert rb[-1]["reward"].item() == float(2**62)


def test_a_plain_tensor_storage_refuses_the_same_ints():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(torch.zeros(2))
    with pytest.raises(ValueError, match=r"The data written.*cannot represent exactly"):
        rb.extend(torch.tensor([2**62 + 1]))
    assert len(rb) == 2


@pytest.mark.parametrize("cls", TENSOR_STORAGES)
def test_a_lone_surrogate_in_a_string_entry_is_refused_naming_it(cls, tmp_path):
    rb = _float_buffer(cls, tmp_path)
    rb.extend(TensorDict({"reward": torch.zeros(2), "obs": torch.zeros(2, 3)}, [2]))
    bad = TensorDict({"reward": torch.zeros(2), "obs": torch.zeros(2, 3)}, [2])
    bad["text"] = NonTensorStack("fine", "file-\udcff.txt")
    with pytest.raises(ValueError, match=r"Entry 'text'.*item 1.*'\\udcff'.*lone surrogate.*surrogateescape"):
        rb.extend(bad)
    assert len(rb) == 4


@pytest.mark.parametrize("cls", [LazyTensorStorage, ListStorage])
@pytest.mark.parametrize("index", [None, [None], [1, None]])
def test_an_index_of_no_integers_is_refused(cls, index):
    rb = ReplayBuffer(storage=cls(8))
    rb.extend(torch.arange(4))
    with pytest.raises(TypeError, match=r"Cannot index a storage with .*None.*pass an int, a slice"):
        rb[index]
    with pytest.raises(TypeError, match=r"Cannot index a storage with .*None"):
        rb.storage[index]
