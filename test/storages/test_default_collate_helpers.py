"""TorchRL's private collate helpers at ``storages.utils`` (``_get_default_collate`` and the collate functions it
picks), mapped onto this package's storages."""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from torchrl.data import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    StorageEnsemble,
    TensorStorage,
)


def _storages():
    ensemble = StorageEnsemble(ListStorage(2), ListStorage(2))
    return {
        "tensor": (TensorStorage(torch.zeros(4)), "_collate_id"),
        "lazy_tensor": (LazyTensorStorage(4), "_collate_id"),
        "lazy_memmap": (LazyMemmapStorage(4), "_collate_id"),
        "lazy_stack": (LazyStackStorage(4), "_collate_id"),
        "compressed": (CompressedListStorage(4), "lazy_stack"),
        "list": (ListStorage(4), "_stack_anything"),
        "ensemble": (ensemble, "_stack_anything"),
    }


@pytest.mark.parametrize("kind", list(_storages()))
def test_the_default_collate_of_each_storage_kind(kind):
    from torchrl.data.replay_buffers.storages.utils import _get_default_collate

    storage, expected = _storages()[kind]
    assert _get_default_collate(storage).__name__ == expected
    assert _get_default_collate(storage, _is_tensordict=True).__name__ == expected


def test_the_collate_helpers_stack_as_their_names_say():
    from torchrl.data.replay_buffers.storages.utils import (
        _collate_id,
        _collate_list_tensordict,
        _stack_anything,
    )

    items = [TensorDict(x=torch.full((2,), float(i))) for i in range(3)]
    assert _collate_id(items) is items
    assert torch.equal(_collate_list_tensordict(items)["x"][:, 0], torch.arange(3.0))
    dense = _stack_anything(items)
    assert dense.batch_size == (3,) and not isinstance(dense, LazyStackedTensorDict)
    ragged = _stack_anything([TensorDict(x=torch.zeros(2)), TensorDict(x=torch.zeros(3))])
    assert isinstance(ragged, LazyStackedTensorDict)  # items of different shapes: a lazy stack
    assert torch.equal(_stack_anything([torch.zeros(2), torch.ones(2)]), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))


def test_no_default_collate_for_an_unknown_storage():
    from torchrl.data.replay_buffers.storages.utils import _get_default_collate

    with pytest.raises(NotImplementedError, match="No default collate_fn for a storage of type str: pass collate_fn"):
        _get_default_collate("not a storage")


