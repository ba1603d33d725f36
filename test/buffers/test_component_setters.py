"""``rb.set_storage``/``set_writer``/``set_sampler`` (TorchRL's component setters) and ``rb.shutdown``."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    DatasetStorage,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)


def _data(n: int, start: int = 0) -> TensorDict:
    return TensorDict(obs=torch.arange(start, start + n), reward=torch.arange(start, start + n).float(),
                      batch_size=[n])  # fmt: skip


def test_set_storage_returns_the_previous_one_and_the_writer_writes_to_the_new_one():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    rb.extend(_data(3))
    old = rb.storage
    assert rb.set_storage(LazyMemmapStorage(10)) is old
    rb.extend(_data(2, start=100))
    assert len(old) == 3 and torch.equal(old[:]["obs"], torch.arange(3))  # left as it was
    assert rb.storage is not old and len(rb) == 2
    assert rb[:]["obs"].tolist() == [100, 101]
    filled = LazyTensorStorage(10)
    filled.set(torch.arange(4), _data(4, start=50))
    rb.set_storage(filled)
    rb.extend(_data(1, start=7))  # after the four rows it holds
    assert rb[:]["obs"].tolist() == [50, 51, 52, 53, 7] and rb.writer.cursor == 5
    assert rb.sample()["obs"].shape == (4,)


def test_set_storage_detaches_the_old_storage_and_resets_the_collate_function():
    rb = ReplayBuffer(storage=ListStorage(10), sampler=PrioritizedSampler(10, 1.0, 1.0), batch_size=2)
    rb.extend([1, 2, 3])
    old = rb.set_storage(LazyTensorStorage(10))
    rb.extend(torch.arange(4))
    assert isinstance(rb.sample(), torch.Tensor)  # the tensor storage's collate (identity), not stacking
    before = rb.sampler.state_dict()["_sum_tree"]["values"].clone()
    old.set(0, 42)  # a write to the old storage no longer reaches this buffer's sampler
    assert torch.equal(rb.sampler.state_dict()["_sum_tree"]["values"], before)
    custom = ReplayBuffer(storage=LazyTensorStorage(4))
    custom.set_storage(LazyTensorStorage(4), collate_fn=lambda x: x + 1)
    custom.extend(torch.zeros(2))
    assert custom.collate_fn(torch.zeros(1)).item() == 1


def test_a_new_storage_with_items_is_known_to_the_sampler():
    filled = LazyTensorStorage(8)
    filled.set(torch.arange(5), torch.arange(5) * 10)
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(), batch_size=5)
    rb.set_storage(filled)
    assert sorted(rb.sample().tolist()) == [0, 10, 20, 30, 40]


def test_set_sampler_and_set_writer_return_the_previous_ones_and_are_wired():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6), batch_size=6)
    rb.extend(_data(6))
    assert isinstance(rb.set_sampler(SamplerWithoutReplacement()), RandomSampler)
    assert sorted(rb.sample()["obs"].tolist()) == list(range(6))  # one epoch of the new sampler
    prioritized = PrioritizedSampler(6, alpha=1.0, beta=1.0)
    rb.set_sampler(prioritized)
    assert torch.equal(prioritized.state_dict()["_priority"][:6], torch.ones(6))  # the stored items got priorities
    previous = rb.set_writer(TensorDictMaxValueWriter(rank_key="reward"))
    assert isinstance(previous, RoundRobinWriter)
    rb.set_storage(LazyTensorStorage(3))
    rb.extend(_data(6))  # the new writer keeps the three best rewards
    assert sorted(rb[:]["obs"].tolist()) == [3, 4, 5]
    generator = torch.Generator().manual_seed(0)
    rb.set_rng(generator)
    rb.set_sampler(RandomSampler())
    assert rb.sampler._rng is generator


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda rb: rb.set_storage(object()), TypeError, r"`storage` must be a Storage instance.*got object"),
        (lambda rb: rb.set_writer("writer"), TypeError, r"`writer` must be a Writer instance.*got str"),
        (lambda rb: rb.set_sampler(None), TypeError, r"`sampler` must be a Sampler instance.*got NoneType"),
        (lambda rb: rb.set_storage(DatasetStorage(torch.utils.data.TensorDataset(torch.zeros(3)))), TypeError,
         "PrioritizedSampler"),
        (lambda rb: rb.set_sampler(SamplerWithoutReplacement(drop_last=True)), ValueError, "Pass batch_size="),
        (lambda rb: rb.shutdown(timeout=-1), ValueError, "`timeout`"),
        (lambda rb: rb.shutdown(timeout="1"), ValueError, "`timeout`"),
    ],
    ids=["storage", "writer", "sampler", "storage-the-sampler-cannot-read", "drop-last", "timeout-neg", "timeout-str"],
)
def test_bad_components_are_refused_and_nothing_changes(call, error, match):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, 1.0, 1.0))
    rb.extend(_data(4))
    parts = (rb.storage, rb.sampler, rb.writer)
    with pytest.raises(error, match=match):
        call(rb)
    assert (rb.storage, rb.sampler, rb.writer) == parts and len(rb) == 4


def test_setters_on_an_ensemble_name_the_members():
    ensemble = ReplayBufferEnsemble(ReplayBuffer(storage=LazyTensorStorage(4)), ReplayBuffer(storage=LazyTensorStorage(4)))
    for call in (lambda: ensemble.set_storage(LazyTensorStorage(4)), lambda: ensemble.set_sampler(RandomSampler()),
                 lambda: ensemble.set_writer(RoundRobinWriter())):  # fmt: skip
        with pytest.raises(RuntimeError, match=r"rb_ensemble\[i\]\.set_"):
            call()


def test_swaps_drop_batches_sampled_ahead_from_the_old_component():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
    rb.extend(torch.arange(10))
    rb.sample()
    assert rb.stats()["prefetch_queue_size"] == 2
    rb.set_storage(LazyTensorStorage(10))
    assert rb.stats()["prefetch_queue_size"] == 0
    rb.extend(torch.arange(100, 110))
    assert (rb.sample() >= 100).all() and (rb.sample() >= 100).all()


def test_shutdown_stops_prefetching_and_the_buffer_still_samples():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=3)
    rb.extend(torch.arange(10))
    rb.sample()
    assert rb.stats()["prefetch_queue_size"] == 3
    rb.shutdown()
    assert rb.stats()["prefetch_queue_size"] == 0
    assert rb.sample().shape == (2,) and rb.stats()["prefetch_queue_size"] == 0  # no longer samples ahead
    rb.shutdown(timeout=0)  # nothing left to stop: a no-op
    ReplayBuffer().shutdown(timeout=1.5)


def test_a_shared_buffer_shares_the_new_components():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, shared=True)
    rb.extend(torch.arange(4))
    rb.set_storage(LazyTensorStorage(10))
    rb.extend(torch.arange(4))
    assert rb.storage.is_shared
    rb.set_sampler(PrioritizedSampler(10, 1.0, 1.0))
    assert rb.sampler.is_shared
