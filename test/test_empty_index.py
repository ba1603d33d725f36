"""An empty index selects nothing: ListStorage and the tensor storages return an empty batch for it.

``np.asarray([])`` is float64; storages read an empty Python list (or tuple of nothing, or nested empty list)
as an empty int64 index, as numpy does for ``array[[]]``, instead of refusing "a float64 index".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, ReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.storages._index import as_index_tensor

EMPTY = {
    "list": [],
    "nested-list": [[]],
    "long-tensor": torch.zeros(0, dtype=torch.long),
    "range": range(0),
    "int-ndarray": np.zeros(0, dtype=np.int64),
}

STORAGES = {
    "list": lambda: ListStorage(10),
    "lazy": lambda: LazyTensorStorage(10),
    "memmap": lambda: LazyMemmapStorage(10),
    "tensor": lambda: TensorStorage(TensorDict(obs=torch.zeros(10, 2), batch_size=[10])),
}


def _filled(name: str):
    storage = STORAGES[name]()
    storage.set(torch.arange(3), TensorDict(obs=torch.arange(6.0).view(3, 2), batch_size=[3]))
    return storage


@pytest.mark.parametrize("index", list(EMPTY.values()), ids=list(EMPTY))
def test_an_empty_index_is_a_long_tensor(index):
    out = as_index_tensor(index)
    assert out.dtype == torch.long and out.shape == (0,)


@pytest.mark.parametrize("index", [np.zeros(0), torch.zeros(0)], ids=["float-ndarray", "float-tensor"])
def test_an_explicitly_float_empty_index_is_still_refused(index):
    with pytest.raises(TypeError, match="indices must be integers"):
        as_index_tensor(index)


@pytest.mark.parametrize("index", list(EMPTY.values()), ids=list(EMPTY))
@pytest.mark.parametrize("name", sorted(STORAGES))
def test_storages_return_an_empty_batch(name, index):
    storage = _filled(name)
    got = storage.get(index)
    if name == "list":
        assert got == []
    else:
        assert got.batch_size == (0,) and got["obs"].shape == (0, 2)


@pytest.mark.parametrize("name", sorted(STORAGES))
def test_an_empty_list_reads_like_an_empty_long_tensor(name):
    storage = _filled(name)
    by_list, by_tensor = storage.get([]), storage.get(torch.zeros(0, dtype=torch.long))
    if name == "list":
        assert by_list == by_tensor == []
    else:
        assert by_list.batch_size == by_tensor.batch_size and set(by_list.keys()) == set(by_tensor.keys())


def test_list_storage_write_of_nothing_changes_nothing():
    storage = _filled("list")
    storage.set([], [])
    assert len(storage) == 3


def test_buffer_index_read_with_an_empty_list():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(torch.arange(5))
    assert rb[[]].shape == (0,)
