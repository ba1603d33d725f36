"""``LazyTensorStorage(consolidated=True)``: every entry a view into one buffer, through writes, sharing and
checkpoints; TorchRL's ``cleanup_memmap`` keyword accepted; ``CompressedListStorage.to_bytestream``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchrl.data import CompressedListStorage, LazyTensorStorage, TensorDictReplayBuffer


def _rows(n, start=0):
    return TensorDict(
        obs=torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1).expand(n, 3).clone(),
        action=torch.arange(start, start + n),
        batch_size=[n],
    )


def _one_buffer(td: TensorDict) -> bool:
    return len({leaf.untyped_storage().data_ptr() for leaf in td.values(True, True)}) == 1


@pytest.mark.parametrize("shared", [False, True])
def test_consolidated_storage_keeps_one_buffer_through_wrapping_writes(shared):
    storage = LazyTensorStorage(8, consolidated=True)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=4, shared=shared)
    rb.extend(_rows(6))
    rb.extend(_rows(6, start=6))  # wraps: rows 8..11 land in slots 0..3
    assert _one_buffer(storage._storage)  # the backing TorchRL's code reads; still one buffer once shared
    assert storage._storage["obs"].is_shared() is shared
    backing = storage.get(slice(None))
    assert torch.equal(backing["action"], torch.tensor([8, 9, 10, 11, 4, 5, 6, 7]))
    assert torch.equal(backing["obs"][:, 0], backing["action"].float())
    sample = rb.sample()
    assert torch.equal(sample["obs"][:, 0], sample["action"].float())


def test_consolidated_backing_is_one_contiguous_buffer():
    storage = LazyTensorStorage(8, consolidated=True)
    storage.set(torch.arange(3), _rows(3))
    plain = LazyTensorStorage(8)
    plain.set(torch.arange(3), _rows(3))
    assert _one_buffer(storage._storage) and not _one_buffer(plain._storage)


def test_consolidated_storage_round_trips_a_checkpoint(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8, consolidated=True), batch_size=2)
    rb.extend(_rows(5))
    rb.dumps(tmp_path / "ckpt")
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(8, consolidated=True), batch_size=2)
    other.loads(tmp_path / "ckpt")
    assert torch.equal(other.storage.get(slice(0, 5))["action"], torch.arange(5))


def test_consolidated_with_shared_init_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="consolidated=True with shared_init=True"):
        LazyTensorStorage(8, consolidated=True, shared_init=True)


@pytest.mark.parametrize("keyword", ["consolidated", "cleanup_memmap"])
def test_non_bool_keywords_are_refused(keyword):
    with pytest.raises(TypeError, match=keyword):
        LazyTensorStorage(8, **{keyword: "yes"})


def test_cleanup_memmap_is_accepted_and_changes_nothing():
    storage = LazyTensorStorage(4, cleanup_memmap=False)
    storage.set(torch.arange(2), _rows(2))
    assert storage.cleanup_memmap is False and len(storage) == 2


def test_to_bytestream_gives_the_raw_bytes_of_tensors_and_arrays():
    storage = CompressedListStorage(4)
    assert storage.to_bytestream(torch.tensor([1, 2], dtype=torch.uint8)) == b"\x01\x02"
    values = torch.tensor([[1.5, -2.0], [3.0, 4.0]]).t()  # not contiguous: memory order of a contiguous copy
    assert storage.to_bytestream(values) == values.contiguous().numpy().tobytes()
    assert storage.to_bytestream(np.arange(3, dtype=np.int16)) == np.arange(3, dtype=np.int16).tobytes()


def test_to_bytestream_refuses_what_would_need_pickle():
    with pytest.raises(TypeError, match="torch.Tensor or a numpy array, got dict"):
        CompressedListStorage(4).to_bytestream({"a": 1})
