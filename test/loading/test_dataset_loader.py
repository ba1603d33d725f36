"""``ReplayBufferDataset.loader(**kwargs)``: the DataLoader that yields the dataset's batches as they are."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.extras import require
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import ReplayBuffer, tensordict_collate

B = 8  # the buffer's batch size
TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging


def _buffer(seed: int = 0) -> ReplayBuffer:
    return make_buffer(capacity=100, batch_size=B, seed=seed, data=TensorDict(x=torch.arange(100), batch_size=[100]))


def test_loader_yields_the_batches_of_the_dataloader_built_by_hand():
    ours = list(_buffer().as_dataset(num_batches=5).loader())
    by_hand = DataLoader(_buffer().as_dataset(num_batches=5), batch_size=None, collate_fn=tensordict_collate)
    expected = list(by_hand)
    assert len(ours) == len(expected) == 5
    for got, want in zip(ours, expected):
        assert got.batch_size == want.batch_size == torch.Size([B])
        assert torch.equal(got["x"], want["x"])


def test_loader_is_a_dataloader_over_the_dataset_with_batch_size_none_and_tensordict_collate():
    dataset = _buffer().as_dataset(num_batches=2)
    loader = dataset.loader()
    assert type(loader) is DataLoader
    assert loader.dataset is dataset
    assert loader.batch_size is None
    assert loader.collate_fn is tensordict_collate


def test_each_call_builds_a_new_loader():
    dataset = _buffer().as_dataset(num_batches=2)
    assert dataset.loader() is not dataset.loader()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_loader_passes_the_dataloader_keywords_through(context):
    loader = _buffer().as_dataset(num_batches=6).loader(
        num_workers=2, multiprocessing_context=context, timeout=TIMEOUT, persistent_workers=False
    )
    assert loader.num_workers == 2 and loader.timeout == TIMEOUT
    batches = list(loader)
    assert len(batches) == 6  # num_batches is the total over the workers
    assert {batch.batch_size for batch in batches} == {torch.Size([B])}
    assert all(((batch["x"] >= 0) & (batch["x"] < 100)).all() for batch in batches)


@pytest.mark.parametrize(
    "keyword, value, match",
    [
        ("batch_size", 4, r"sets `batch_size`=None itself.*rb.batch_size=8.*got batch_size=4"),
        ("batch_size", None, r"sets `batch_size`=None itself"),
        ("collate_fn", tensordict_collate, r"sets `collate_fn`=tensordict_collate itself"),
        ("collate_fn", None, r"sets `collate_fn`=tensordict_collate itself"),
    ],
)
def test_loader_refuses_the_keywords_it_sets_naming_the_argument(keyword, value, match):
    dataset = _buffer().as_dataset(num_batches=2)
    with pytest.raises(TypeError, match=match):
        dataset.loader(**{keyword: value})


def test_a_dataloader_with_a_batch_size_stacks_the_batches_without_a_warning():
    # The dataset is not told the loader's batch size: the batches are stacked ([1, B]), silently. loader()
    # is the way to get the buffer's batches as they are.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shapes = [batch.shape for batch in DataLoader(_buffer().as_dataset(num_batches=2))]
    assert shapes == [torch.Size([1, B])] * 2


def test_loader_yields_the_batches_of_a_stateful_dataloader_built_alike():
    stateful = require("torchdata.stateful_dataloader")
    ours = list(_buffer().as_dataset(num_batches=3).loader())
    theirs = list(
        stateful.StatefulDataLoader(_buffer().as_dataset(num_batches=3), batch_size=None, collate_fn=tensordict_collate)
    )
    assert [torch.equal(a["x"], b["x"]) for a, b in zip(ours, theirs)] == [True] * 3
