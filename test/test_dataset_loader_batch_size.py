"""``rb.as_dataset()`` read by a DataLoader that has a ``batch_size`` (torch's default of 1): a warning."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import LazyTensorStorage, ReplayBuffer, ReplayBufferDataset, tensordict_collate

MATCH = r"yields whole batches.*batch_size=None, collate_fn=tensordict_collate"


def _buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
    rb.extend(TensorDict(x=torch.arange(100), batch_size=[100]))
    return rb


@pytest.mark.parametrize("loader_batch_size", [1, 4])
def test_a_loader_batch_size_warns_once_per_dataset(loader_batch_size):
    loader = DataLoader(_buffer().as_dataset(num_batches=4), batch_size=loader_batch_size)
    with pytest.warns(UserWarning, match=MATCH) as record:
        shapes = {batch.shape for batch in loader}
        shapes |= {batch.shape for batch in loader}  # a second epoch does not warn again
    assert shapes == {torch.Size([loader_batch_size, 8])}
    assert sum("yields whole batches" in str(w.message) for w in record) == 1


def test_batch_size_none_does_not_warn():
    loader = DataLoader(_buffer().as_dataset(num_batches=3), batch_size=None, collate_fn=tensordict_collate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [batch.shape for batch in loader] == [torch.Size([8])] * 3


def test_iterating_the_dataset_directly_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(_buffer().as_dataset(num_batches=2))) == 2


class _Items(ReplayBufferDataset):
    """Yields single items: a loader batch_size is then what the user wants."""

    def items(self, batch):
        yield from batch.unbind(0)


def test_a_subclass_yielding_items_does_not_warn():
    loader = DataLoader(_Items(_buffer(), num_batches=2), batch_size=4, collate_fn=tensordict_collate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [batch.shape for batch in loader] == [torch.Size([4])] * 4


def test_stateful_dataloader_warns_too():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(_buffer().as_dataset(num_batches=2))
    with pytest.warns(UserWarning, match=MATCH):
        assert [batch.shape for batch in loader] == [torch.Size([1, 8])] * 2


@pytest.mark.timeout(120)
def test_a_worker_warns_on_its_stderr(capfd):
    # A spawned worker starts with Python's default warning filters, so its warning reaches its stderr (a forked
    # one would inherit pytest's recording of warnings, which stays in the worker).
    loader = DataLoader(
        _buffer().as_dataset(num_batches=2), num_workers=1, multiprocessing_context="spawn", timeout=60
    )
    assert [batch.shape for batch in loader] == [torch.Size([1, 8])] * 2
    assert "yields whole batches" in capfd.readouterr().err
