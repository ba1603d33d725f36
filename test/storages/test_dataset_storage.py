"""DatasetStorage: a read-only storage over a map-style dataset (TensorDataset, datasets.Dataset, custom)."""

from __future__ import annotations

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip
from helpers.extras import require
from tensordict import TensorDict
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from torchrl.data import (
    DatasetStorage,
    ImmutableDatasetWriter,
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
    tensordict_collate,
)

TIMEOUT = 60


class CountingDataset(Dataset):
    """Items are TensorDicts; counts the calls of __getitem__ and __getitems__."""

    def __init__(self, n: int = 10, batched: bool = True):
        self.n = n
        self.getitem_calls = 0
        self.getitems_calls = 0
        if not batched:
            self.__getitems__ = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.getitem_calls += 1
        return TensorDict(obs=torch.full((3,), float(i)), idx=torch.tensor(i))

    def __getitems__(self, indices):
        self.getitems_calls += 1
        return [TensorDict(obs=torch.full((3,), float(i)), idx=torch.tensor(i)) for i in indices]


class NoisyDataset(Dataset):
    """A stochastic __getitem__: item i is i plus fresh noise on every read."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": torch.tensor(float(i)) + torch.rand(()) * 0.1}


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(1)


def tensor_dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32), torch.arange(n) % 3)


def test_length_and_reads_of_a_tensor_dataset():
    storage = DatasetStorage(tensor_dataset())
    assert len(storage) == 10 and storage.max_size == 10
    obs, label = storage.get(3)
    assert obs.item() == 3.0 and label.item() == 0
    obs, label = storage.get(torch.tensor([1, 4, -1]))
    assert obs.tolist() == [1.0, 4.0, 9.0] and label.tolist() == [1, 1, 0]
    obs, _ = storage.get(slice(2, 5))
    assert obs.tolist() == [2.0, 3.0, 4.0]
    obs, _ = storage[[0, 0]]
    assert obs.tolist() == [0.0, 0.0]


def test_a_batch_is_one_getitems_call_when_the_dataset_has_it():
    dataset = CountingDataset()
    batch = DatasetStorage(dataset).get(torch.tensor([2, 5, 7]))
    assert dataset.getitems_calls == 1 and dataset.getitem_calls == 0
    assert batch.batch_size == torch.Size([3]) and batch["idx"].tolist() == [2, 5, 7]


def test_a_batch_loops_over_getitem_without_getitems():
    dataset = CountingDataset(batched=False)
    batch = DatasetStorage(dataset).get([1, 2])
    assert dataset.getitem_calls == 2 and batch["obs"].shape == (2, 3)


def test_reads_out_of_range_or_empty_raise_index_error():
    storage = DatasetStorage(tensor_dataset(4))
    with pytest.raises(IndexError, match="out of range"):
        storage.get(4)
    with pytest.raises(IndexError, match="out of range"):
        storage.get(torch.tensor([0, 7]))
    with pytest.raises(IndexError, match="empty index"):
        storage.get([])
    with pytest.raises(IndexError, match="one dimension"):
        storage.get((torch.tensor([0]), torch.tensor([0])))


@pytest.mark.parametrize(
    "dataset, error, match",
    [
        (Stream(), TypeError, "IterableDataset"),
        (object(), TypeError, "map-style"),
        (TensorDataset(torch.zeros(0)), ValueError, "at least one item"),
    ],
)
def test_bad_datasets_are_refused(dataset, error, match):
    with pytest.raises(error, match=match):
        DatasetStorage(dataset)


def test_writes_are_refused_and_the_default_writer_is_immutable():
    storage = DatasetStorage(tensor_dataset())
    rb = ReplayBuffer(storage=storage, batch_size=2)
    assert isinstance(rb.writer, ImmutableDatasetWriter)
    with pytest.raises(RuntimeError, match="read-only"):
        rb.extend(torch.zeros(2))
    with pytest.raises(RuntimeError, match="read-only"):
        rb.add(torch.zeros(()))
    with pytest.raises(RuntimeError, match="read-only"):
        storage.set(0, torch.zeros(()))
    with pytest.raises(RuntimeError, match="read-only"):
        storage._empty()
    rb_rr = ReplayBuffer(storage=DatasetStorage(tensor_dataset()), writer=RoundRobinWriter())
    with pytest.raises(RuntimeError, match="DatasetStorage is read-only"):
        rb_rr.extend(torch.zeros(2))
    assert storage.get(0)[0].item() == 0.0  # nothing changed


def test_random_sampler_draws_valid_items():
    rb = ReplayBuffer(storage=DatasetStorage(tensor_dataset()), sampler=RandomSampler(), batch_size=16)
    obs, label = rb.sample()
    assert obs.shape == (16,) and ((obs >= 0) & (obs < 10)).all()
    assert torch.equal(label, obs.long() % 3)


def test_sampler_without_replacement_sees_every_item_once_per_epoch():
    rb = ReplayBuffer(storage=DatasetStorage(CountingDataset(10)), sampler=SamplerWithoutReplacement(), batch_size=4)
    seen = torch.cat([batch["idx"] for batch in rb])
    assert sorted(seen.tolist()) == list(range(10))


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda: PrioritizedSampler(10, alpha=0.7, beta=0.5),
        lambda: SliceSampler(slice_len=2),
        lambda: SliceSamplerWithoutReplacement(slice_len=2),
    ],
    ids=["prioritized", "slice", "slice-without-replacement"],
)
def test_trajectory_and_prioritized_samplers_are_refused(make_sampler):
    with pytest.raises(TypeError, match="trajectory metadata.*priority applies to an index"):
        ReplayBuffer(storage=DatasetStorage(tensor_dataset()), sampler=make_sampler())


def test_prioritized_buffer_is_refused():
    with pytest.raises(TypeError, match="cannot be sampled by PrioritizedSampler"):
        PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=DatasetStorage(tensor_dataset()))


def test_stochastic_getitem_gives_a_new_draw_on_every_read():
    storage = DatasetStorage(NoisyDataset())
    first, second = storage.get(3)["x"], storage.get(3)["x"]
    assert 3.0 <= first < 3.1 and 3.0 <= second < 3.1
    assert first != second  # documented: a read is a new draw
    batch = storage.get(torch.arange(8))["x"]
    assert torch.equal(batch.floor(), torch.arange(8, dtype=torch.float32))


def test_hugging_face_dataset_in_torch_format():
    datasets = require("datasets")
    hf = datasets.Dataset.from_dict({"obs": [[float(i)] * 3 for i in range(12)], "r": list(range(12))})
    storage = DatasetStorage(hf.with_format("torch"))
    batch = storage.get(torch.tensor([1, 11]))
    assert batch["obs"].shape == (2, 3) and batch["r"].tolist() == [1, 11]
    rb = ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=5)
    seen = torch.cat([b["r"] for b in rb])
    assert sorted(seen.tolist()) == list(range(12))


def test_tensordict_buffer_over_a_tensordict_dataset_adds_the_index():
    rb = TensorDictReplayBuffer(storage=DatasetStorage(CountingDataset(10)), batch_size=4)
    batch = rb.sample()
    assert torch.equal(batch["index"], batch["idx"])


def test_dumps_writes_a_reference_and_loads_checks_it(tmp_path):
    rb = ReplayBuffer(storage=DatasetStorage(tensor_dataset(10)), batch_size=2)
    assert_checkpoint_round_trip(rb, lambda: ReplayBuffer(storage=DatasetStorage(tensor_dataset(10)), batch_size=2), tmp_path)
    assert not list((tmp_path / "first").rglob("*.memmap"))  # no data embedded
    other = ReplayBuffer(storage=DatasetStorage(tensor_dataset(7)), batch_size=2)
    with pytest.raises(ValueError, match="7 items.*export_hf"):
        other.loads(tmp_path / "first")
    assert other.storage.state_dict()["length"] == 7
    with pytest.raises(ValueError, match="must describe a DatasetStorage"):
        other.storage.load_state_dict({"length": 7})


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_through_as_dataset(context):
    storage = DatasetStorage(tensor_dataset(24))
    loader = DataLoader(storage.as_dataset(), batch_size=6, shuffle=False, num_workers=2,
                        multiprocessing_context=context, collate_fn=tensordict_collate, timeout=TIMEOUT)  # fmt: skip
    seen = []
    for obs, label in loader:
        assert torch.equal(label, obs.long() % 3)
        seen += obs.long().tolist()
    assert sorted(seen) == list(range(24))


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_dataloader_workers_over_a_tensordict_dataset():
    storage = DatasetStorage(CountingDataset(20))
    loader = DataLoader(storage.as_dataset(), batch_size=5, shuffle=True, num_workers=2,
                        multiprocessing_context="fork", collate_fn=tensordict_collate, timeout=TIMEOUT)  # fmt: skip
    seen = torch.cat([batch["idx"] for batch in loader])
    assert sorted(seen.tolist()) == list(range(20))


def test_export_of_a_dataset_storage_copies_the_items(tmp_path):
    require("datasets")
    rb = ReplayBuffer(storage=DatasetStorage(CountingDataset(9)), batch_size=3)
    rb.export_hf(tmp_path / "export", chunk_bytes=40)
    copy = ReplayBuffer.from_hf(tmp_path / "export", storage=LazyTensorStorage(9))
    assert torch.equal(copy[:]["idx"], torch.arange(9))
    assert torch.equal(copy[:]["obs"][:, 0], torch.arange(9, dtype=torch.float32))


def test_export_of_tuple_items_asks_for_named_fields(tmp_path):
    require("datasets")
    rb = ReplayBuffer(storage=DatasetStorage(tensor_dataset(4)))
    with pytest.raises(TypeError, match="a tuple has no names"):
        rb.export_hf(tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_repr_names_the_dataset():
    assert repr(DatasetStorage(tensor_dataset(3))) == "DatasetStorage(dataset=TensorDataset, len=3)"


# -- prioritized and trajectory samplers used directly on a storage with stable_items = False ----------------------
# A buffer refuses these samplers over a DatasetStorage when it is built; a sampler used on its own
# (``sampler.sample(storage, n)``) must refuse it too, with the same message, instead of failing later with an
# unrelated error (e.g. "every priority is zero").
def dataset_storage(n: int = 10) -> DatasetStorage:
    return DatasetStorage(TensorDataset(torch.arange(n, dtype=torch.float32)))


UNSTABLE_SAMPLERS = {
    "prioritized": lambda: PrioritizedSampler(10, alpha=0.7, beta=0.5),
    "prioritized-slice": lambda: PrioritizedSliceSampler(10, alpha=0.7, beta=0.5, slice_len=2, traj_key="ep"),
    "slice": lambda: SliceSampler(slice_len=2, traj_key="ep"),
    "slice-without-replacement": lambda: SliceSamplerWithoutReplacement(slice_len=2, traj_key="ep"),
}


@pytest.mark.parametrize("name", sorted(UNSTABLE_SAMPLERS))
def test_sampler_used_directly_refuses_an_unstable_storage(name):
    sampler = UNSTABLE_SAMPLERS[name]()
    sampler.extend(torch.arange(10))  # what a buffer would do after a write: the priorities are not zero
    storage = dataset_storage()
    with pytest.raises(TypeError) as info:
        sampler.sample(storage, 4)
    message = str(info.value)
    assert f"DatasetStorage cannot be sampled by {type(sampler).__name__}" in message
    assert "RandomSampler() or SamplerWithoutReplacement()" in message


@pytest.mark.parametrize("name", sorted(UNSTABLE_SAMPLERS))
def test_the_direct_and_the_buffer_refusals_say_the_same(name):
    with pytest.raises(TypeError) as at_build:
        ReplayBuffer(storage=dataset_storage(), sampler=UNSTABLE_SAMPLERS[name]())
    sampler = UNSTABLE_SAMPLERS[name]()
    sampler.extend(torch.arange(10))
    with pytest.raises(TypeError) as at_sample:
        sampler.sample(dataset_storage(), 4)
    assert str(at_build.value) == str(at_sample.value)


@pytest.mark.parametrize("sampler", [RandomSampler(), SamplerWithoutReplacement()], ids=["random", "without"])
def test_uniform_samplers_still_sample_an_unstable_storage(sampler):
    index, _ = sampler.sample(dataset_storage(), 4)
    assert index.shape == (4,) and bool(((index >= 0) & (index < 10)).all())


@pytest.mark.parametrize("name", sorted(UNSTABLE_SAMPLERS))
def test_the_same_samplers_still_sample_a_stable_storage(name):
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(10), TensorDict(ep=torch.arange(10) // 5, obs=torch.arange(10.0), batch_size=[10]))
    sampler = UNSTABLE_SAMPLERS[name]()
    sampler.extend(torch.arange(10))
    index, _ = sampler.sample(storage, 4)
    flat = index[0] if isinstance(index, tuple) else index
    assert flat.numel() == 4
