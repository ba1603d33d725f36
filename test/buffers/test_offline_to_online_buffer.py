"""OfflineToOnlineReplayBuffer and prefill_replay_buffer (issue 27 item 3; TorchRL's behaviour, facts §2).

Offline rows carry ``src = 0`` and online rows ``src = 1``: every batch is counted, so the split is checked
exactly, batch by batch (Python's ``round``, offline rows first), over several kinds of offline data.
"""

from __future__ import annotations

import pytest
import torch
from helpers.extras import needs
from tensordict import TensorDict

from torchrl._phrases import TorchRLPhrase
from torchrl.data import (
    DatasetStorage,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    OfflineToOnlineReplayBuffer,
    ReplayBuffer,
    TensorDictReplayBuffer,
    prefill_replay_buffer,
)
from torchrl.data.replay_buffers import offline_to_online

OFFLINE = 40


def _rows(n: int, src: int, start: int = 0) -> TensorDict:
    return TensorDict(
        obs=torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1).expand(n, 2).clone(),
        src=torch.full((n,), src, dtype=torch.long),
        batch_size=[n],
    )


def _offline_td(tmp_path=None) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(OFFLINE))
    rb.extend(_rows(OFFLINE, 0))
    return rb


# -- the kinds of offline data --------------------------------------------------------------------------------------
def _tdrb(tmp_path):
    return _offline_td()


def _dataset_storage(tmp_path):
    storage = LazyTensorStorage(OFFLINE)
    storage.set(torch.arange(OFFLINE), _rows(OFFLINE, 0))
    return DatasetStorage(storage.as_dataset())


def _loaded_memmap_checkpoint(tmp_path):
    source = TensorDictReplayBuffer(storage=LazyMemmapStorage(OFFLINE, scratch_dir=tmp_path / "scratch"))
    source.extend(_rows(OFFLINE, 0))
    source.dumps(tmp_path / "ckpt")
    fresh = TensorDictReplayBuffer(storage=LazyMemmapStorage(OFFLINE, scratch_dir=tmp_path / "fresh"))
    fresh.loads(tmp_path / "ckpt")
    assert len(fresh) == OFFLINE
    return fresh


def _from_hf(tmp_path):
    import datasets

    rows = _rows(OFFLINE, 0)
    table = datasets.Dataset.from_dict({"obs": rows["obs"].tolist(), "src": rows["src"].tolist()})
    return TensorDictReplayBuffer.from_hf(table)


def _registered_string(tmp_path):
    from torchrl.data.datasets import register_dataset

    def factory(name, **kwargs):
        assert name == "toy/rows-v0" and kwargs == {"batch_size": 8}
        return _offline_td()

    register_dataset("o2otest", factory, replace=True)
    return "o2otest:toy/rows-v0"


OFFLINE_KINDS = [
    pytest.param(_tdrb, id="tdrb"),
    pytest.param(_dataset_storage, id="dataset_storage"),
    pytest.param(_loaded_memmap_checkpoint, id="memmap_checkpoint_loads"),
    pytest.param(_from_hf, id="from_hf", marks=needs("datasets")),
    pytest.param(_registered_string, id="load_dataset_string"),
]


def _assert_split(batch, n_off: int, n_on: int) -> None:
    assert batch.batch_size == torch.Size([n_off + n_on])
    assert batch["src"].tolist() == [0] * n_off + [1] * n_on  # exact, and offline rows first
    assert "index" not in batch.keys()


@pytest.mark.parametrize("make_offline", OFFLINE_KINDS)
def test_every_batch_holds_exactly_round_fraction_offline_rows(tmp_path, make_offline):
    rb = OfflineToOnlineReplayBuffer(make_offline(tmp_path), online_capacity=100, offline_fraction=0.3,
                                     batch_size=8)  # fmt: skip
    rb.extend(_rows(20, 1, start=1000))
    for _ in range(20):
        _assert_split(rb.sample(), round(0.3 * 8), 8 - round(0.3 * 8))
    for batch_size in range(1, 12):
        n_off = round(0.3 * batch_size)
        n_off = batch_size if n_off >= batch_size else n_off
        _assert_split(rb.sample(batch_size), n_off, batch_size - n_off)
    assert len(rb) == OFFLINE + 20
    assert len(rb.offline_buffer) == OFFLINE  # never written


def test_python_round_half_to_even():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=50, offline_fraction=0.5)
    rb.extend(_rows(10, 1))
    for batch_size, n_off in ((1, 0), (3, 2), (5, 2), (7, 4), (9, 4)):  # round(0.5)=0, round(1.5)=2, round(2.5)=2
        _assert_split(rb.sample(batch_size), n_off, batch_size - n_off)


def test_empty_online_buffer_gives_offline_only_batches():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=50, offline_fraction=0.1, batch_size=6)
    _assert_split(rb.sample(), 6, 0)
    assert rb.counts() == (6, 0)
    rb.extend(_rows(3, 1))
    _assert_split(rb.sample(), 1, 5)


def test_fraction_rounding_to_the_whole_batch_or_to_zero():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=50, offline_fraction=0.95)
    rb.extend(_rows(5, 1))
    _assert_split(rb.sample(4), 4, 0)  # round(3.8) == 4 >= 4: all offline
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=50, offline_fraction=0.05)
    rb.extend(_rows(5, 1))
    _assert_split(rb.sample(4), 0, 4)  # round(0.2) == 0: all online


def test_anneal_schedule_is_followed_by_the_batches():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=50, offline_fraction=0.6, batch_size=10)
    rb.extend(_rows(20, 1))
    total = 100
    seen = []
    for step in range(0, 140, 10):
        rb.anneal(step, total)
        expected = 0.6 * max(0.0, 1 - step / total)
        assert rb.offline_fraction == pytest.approx(expected, abs=1e-12)
        assert rb.base_offline_fraction == 0.6
        n_off = round(expected * 10)
        batch = rb.sample()
        _assert_split(batch, n_off, 10 - n_off)
        seen.append(n_off)
    assert seen == [6, 5, 5, 4, 4, 3, 2, 2, 1, 1, 0, 0, 0, 0]
    rb.anneal(0, total)
    assert rb.offline_fraction == 0.6  # step 0: back to the base


def test_anneal_rejects_bad_steps():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=5)
    with pytest.raises(ValueError, match="total_steps"):
        rb.anneal(1, 0)
    with pytest.raises(ValueError, match="step"):
        rb.anneal(-1, 10)
    assert rb.offline_fraction == 0.5


def test_extend_writes_the_online_buffer_and_returns_its_indices():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_storage=ListStorage(10))
    index = rb.extend(_rows(3, 1))
    assert torch.as_tensor(index).tolist() == [0, 1, 2]
    assert len(rb.online_buffer) == 3 and len(rb.offline_buffer) == OFFLINE
    assert type(rb.online_buffer) is ReplayBuffer and isinstance(rb.online_buffer.storage, ListStorage)


def test_online_capacity_builds_a_lazy_tensor_storage():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=7)
    assert isinstance(rb.online_buffer.storage, LazyTensorStorage) and rb.online_buffer.storage.max_size == 7


def test_repr_and_properties():
    offline = _offline_td()
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=20, offline_fraction=0.25, batch_size=4)
    rb.extend(_rows(3, 1))
    assert rb.offline_buffer is offline and rb.batch_size == 4
    assert repr(rb) == (
        "OfflineToOnlineReplayBuffer(offline=TensorDictReplayBuffer, offline_fraction=0.250, online_size=3, "
        "batch_size=4)"
    )


def test_transform_runs_on_the_concatenated_batch():
    calls = []

    def transform(batch):
        calls.append(batch["src"].tolist())
        return batch.set("double", batch["obs"] * 2)

    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=20, batch_size=4, transform=transform)
    rb.extend(_rows(3, 1))
    batch = rb.sample()
    assert calls == [[0, 0, 1, 1]] and torch.equal(batch["double"], batch["obs"] * 2)


def test_source_key_tags_rows():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=20, batch_size=5, source_key="from")
    rb.extend(_rows(3, 1))
    assert rb.sample()["from"].tolist() == [0, 0, 1, 1, 1]


def test_index_key_of_the_dataset_is_dropped_not_an_error():
    """TorchRL's Odd: a dataset (TDRB) sample carries "index", the online RB's does not; here both concatenate."""
    offline = _offline_td()
    assert "index" in offline.sample(2).keys()
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=20, batch_size=4)
    rb.extend(_rows(4, 1))
    assert "index" not in rb.sample().keys()


# -- construction errors (TorchRL's phrases) -------------------------------------------------------------------------
def test_online_storage_and_capacity_together():
    with pytest.raises(ValueError, match="not both."):
        OfflineToOnlineReplayBuffer(_offline_td(), online_storage=LazyTensorStorage(3), online_capacity=3)


def test_neither_online_storage_nor_capacity():
    with pytest.raises(ValueError, match="Provide one of"):
        OfflineToOnlineReplayBuffer(_offline_td())


@pytest.mark.parametrize("fraction", [0, 1, 0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")])
def test_offline_fraction_outside_the_open_interval(fraction):
    with pytest.raises(ValueError, match="offline_fraction"):
        OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=3, offline_fraction=fraction)


def test_offline_fraction_not_a_number():
    with pytest.raises(TypeError, match="offline_fraction"):
        OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=3, offline_fraction="0.5")


def test_string_dataset_without_batch_size():
    with pytest.raises(ValueError, match="batch_size must be provided when offline_dataset is a string"):
        OfflineToOnlineReplayBuffer("minari:mujoco/hopper/expert-v0", online_capacity=3)


def test_string_dataset_gets_batch_size_and_kwargs_through_load_dataset():
    from torchrl.data.datasets import register_dataset

    received = {}

    def factory(name, **kwargs):
        received.update(name=name, **kwargs)
        return _offline_td()

    register_dataset("o2otest", factory, replace=True)
    OfflineToOnlineReplayBuffer("o2otest:a/b", online_capacity=3, batch_size=4, root="/nowhere")
    assert received == {"name": "a/b", "batch_size": 4, "root": "/nowhere"}
    received.clear()
    OfflineToOnlineReplayBuffer("o2otest:a/b", online_capacity=3, batch_size=16)
    assert received == {"name": "a/b", "batch_size": 16}


def test_dataset_kwargs_with_a_non_string_dataset():
    with pytest.raises(ValueError, match="dataset_kwargs are only forwarded when offline_dataset is a string"):
        OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=3, root="/tmp")


def test_sample_without_any_batch_size():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=3)
    with pytest.raises(ValueError, match=r"batch_size must be provided either in __init__ or sample\(\)"):
        rb.sample()


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"online_storage": torch.zeros(3)}, TypeError),
        ({"online_capacity": 0}, ValueError),
        ({"online_capacity": 2.5}, TypeError),
        ({"online_capacity": 3, "batch_size": 0}, ValueError),
    ],
)
def test_bad_online_arguments(kwargs, error):
    with pytest.raises(error):
        OfflineToOnlineReplayBuffer(_offline_td(), **kwargs)


def test_offline_dataset_of_an_unknown_kind():
    with pytest.raises(TypeError, match="offline_dataset"):
        OfflineToOnlineReplayBuffer(object(), online_capacity=3)


def test_bad_sample_batch_size():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=3)
    with pytest.raises(ValueError, match="batch_size"):
        rb.sample(0)


def test_the_phrases_are_module_constants():
    for name in ("O2O_BOTH_ONLINE", "O2O_NO_ONLINE", "O2O_STRING_BATCH_SIZE", "O2O_DATASET_KWARGS",
                 "O2O_SAMPLE_BATCH_SIZE"):  # fmt: skip
        assert isinstance(getattr(offline_to_online, name), TorchRLPhrase)


# -- prefill_replay_buffer ----------------------------------------------------------------------------------------------
def test_prefill_copies_n_samples_in_chunks():
    dataset = _offline_td()
    sizes = []

    class Counting(ReplayBuffer):
        def extend(self, data, *args, **kwargs):
            sizes.append(data.shape[0])
            return super().extend(data, *args, **kwargs)

    rb = Counting(storage=LazyTensorStorage(100))
    assert prefill_replay_buffer(rb, dataset, n_samples=25, chunk_size=10) is rb
    assert sizes == [10, 10, 5] and len(rb) == 25
    assert "index" not in rb[:].keys() and set(rb[:]["src"].tolist()) == {0}


def test_prefill_defaults_to_the_dataset_length_and_caps_n_samples():
    rb = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), _offline_td())
    assert len(rb) == OFFLINE
    rb = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), _offline_td(), n_samples=1000)
    assert len(rb) == OFFLINE
    rb = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), _offline_td(), n_samples=0)
    assert len(rb) == 0


def test_prefill_of_a_string_passes_only_the_chunk_size():
    from torchrl.data.datasets import register_dataset

    received = {}

    def factory(name, **kwargs):
        received.update(kwargs)
        return _offline_td()

    register_dataset("o2otest", factory, replace=True)
    rb = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), "o2otest:toy", n_samples=9, chunk_size=7)
    assert received == {"batch_size": 7} and len(rb) == 9


def test_prefill_then_mix():
    rb = OfflineToOnlineReplayBuffer(_offline_td(), online_capacity=100, offline_fraction=0.5, batch_size=6)
    prefill_replay_buffer(rb.online_buffer, _offline_td(), n_samples=10)
    assert len(rb.online_buffer) == 10 and rb.counts() == (3, 3)


@pytest.mark.parametrize(
    "args,error",
    [
        ((object(), "dataset"), TypeError),
        (("rb", object()), TypeError),
        (("rb", "dataset", -1), ValueError),
        (("rb", "dataset", None, 0), ValueError),
        (("rb", "dataset", 2.5), TypeError),
    ],
)
def test_prefill_bad_arguments_change_nothing(args, error):
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    dataset = _offline_td()
    args = tuple(rb if a == "rb" else dataset if a == "dataset" else a for a in args)
    with pytest.raises(error):
        prefill_replay_buffer(*args)
    assert len(rb) == 0
