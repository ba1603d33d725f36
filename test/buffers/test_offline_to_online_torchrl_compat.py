"""OfflineToOnlineReplayBuffer and prefill_replay_buffer as TorchRL's own tests and tutorials use them (facts §2 of
torchrl_api_facts_wave3).

Each test is written the way TorchRL-written code would be: TorchRL's import paths, keywords and defaults,
attribute names, error types and phrases (``pytest.raises(match=...)``), shapes and values. Where this package
differs on purpose (docs/source/differences.rst), the tests only rely on what TorchRL documents.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    OfflineToOnlineReplayBuffer,
    RandomSampler,
    ReplayBuffer,
    TensorDictReplayBuffer,
    prefill_replay_buffer,
)


# =================================================================================================================
# §2 offline-to-online
# =================================================================================================================
def _tagged(n: int, source: int, width: int = 3) -> TensorDict:
    return TensorDict(
        {"obs": torch.randn(n, width), "source": torch.full((n,), source, dtype=torch.int64)}, batch_size=[n]
    )


def _offline(n: int = 100, cls=ReplayBuffer):
    rb = cls(storage=LazyTensorStorage(n))
    rb.extend(_tagged(n, 0))
    return rb


def test_online_capacity_builds_a_plain_replay_buffer_over_lazy_tensor_storage():
    rb = OfflineToOnlineReplayBuffer(_offline(), online_capacity=50)
    assert not isinstance(rb, ReplayBuffer)
    assert type(rb.online_buffer) is ReplayBuffer
    assert isinstance(rb.online_buffer.storage, LazyTensorStorage)
    assert rb.online_buffer.storage.max_size == 50
    assert isinstance(rb.online_buffer.sampler, RandomSampler)
    assert rb.offline_fraction == 0.5  # the default
    storage = LazyTensorStorage(20)
    rb = OfflineToOnlineReplayBuffer(_offline(), online_storage=storage)
    assert rb.online_buffer.storage is storage


def test_online_storage_and_capacity_errors():
    with pytest.raises(ValueError, match="not both."):
        OfflineToOnlineReplayBuffer(_offline(), online_storage=LazyTensorStorage(10), online_capacity=10)
    with pytest.raises(ValueError, match="Provide one of"):
        OfflineToOnlineReplayBuffer(_offline())


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_offline_fraction_must_be_strictly_between_0_and_1(fraction):
    with pytest.raises(ValueError, match="offline_fraction"):
        OfflineToOnlineReplayBuffer(_offline(), online_capacity=10, offline_fraction=fraction)


def test_dataset_kwargs_only_with_a_string_dataset():
    with pytest.raises(ValueError, match="dataset_kwargs are only forwarded when offline_dataset is a string"):
        OfflineToOnlineReplayBuffer(_offline(), online_capacity=10, root="/tmp/x")
    with pytest.raises(ValueError, match="batch_size must be provided when offline_dataset is a string"):
        OfflineToOnlineReplayBuffer("minari:mujoco/hopper/expert-v0", online_capacity=10)


def test_sample_without_batch_size():
    rb = OfflineToOnlineReplayBuffer(_offline(), online_capacity=10)
    with pytest.raises(ValueError, match=r"batch_size must be provided either in __init__ or sample\(\)"):
        rb.sample()


def test_extend_writes_online_only_and_returns_its_indices():
    offline = _offline(20)
    before = offline[:].clone()
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=10, batch_size=4)
    index = rb.extend(_tagged(6, 1))
    assert torch.equal(torch.as_tensor(index).reshape(-1), torch.arange(6))
    assert len(rb.online_buffer) == 6 and len(rb.offline_buffer) == 20 and len(rb) == 26
    assert (offline[:] == before).all()


@pytest.mark.parametrize("offline_cls", [ReplayBuffer, TensorDictReplayBuffer])
@pytest.mark.parametrize("fraction", [0.25, 0.3, 0.5, 0.7])
def test_each_call_has_exactly_round_fraction_offline_rows_first(offline_cls, fraction):
    torch.manual_seed(0)
    rb = OfflineToOnlineReplayBuffer(_offline(cls=offline_cls), online_capacity=100, offline_fraction=fraction)
    rb.extend(_tagged(30, 1))
    for batch_size in (1, 2, 5, 7, 8, 10, 33, 64):
        for _ in range(3):
            sample = rb.sample(batch_size)
            n_off = round(fraction * batch_size)
            if n_off >= batch_size:
                n_off = batch_size
            assert sample.batch_size == torch.Size([batch_size])
            assert int((sample["source"] == 0).sum()) == n_off
            assert (sample["source"][:n_off] == 0).all() and (sample["source"][n_off:] == 1).all()


def test_round_half_to_even_and_the_extremes():
    rb = OfflineToOnlineReplayBuffer(_offline(), online_capacity=100, offline_fraction=0.5)
    assert int((rb.sample(5)["source"] == 0).sum()) == 5  # online empty: all offline
    rb.extend(_tagged(10, 1))
    assert int((rb.sample(5)["source"] == 0).sum()) == 2  # round(2.5) == 2
    assert int((rb.sample(7)["source"] == 0).sum()) == 4  # round(3.5) == 4
    high = OfflineToOnlineReplayBuffer(_offline(), online_capacity=100, offline_fraction=0.9)
    high.extend(_tagged(10, 1))
    assert (high.sample(4)["source"] == 0).all()  # round(3.6) == 4 >= 4: all offline
    low = OfflineToOnlineReplayBuffer(_offline(), online_capacity=100, offline_fraction=0.1)
    low.extend(_tagged(10, 1))
    assert (low.sample(4)["source"] == 1).all()  # round(0.4) == 0: all online


def test_ctor_batch_size_and_transform_on_the_concatenated_batch():
    seen = []

    def transform(td):
        seen.append(td.batch_size)
        td["obs"] = td["obs"] * 0
        return td

    rb = OfflineToOnlineReplayBuffer(_offline(), online_capacity=100, batch_size=8, transform=transform)
    rb.extend(_tagged(10, 1))
    sample = rb.sample()
    assert sample.batch_size == torch.Size([8]) and seen == [torch.Size([8])]
    assert (sample["obs"] == 0).all()


def test_anneal_is_linear_from_the_base_fraction_and_clamps_at_zero():
    rb = OfflineToOnlineReplayBuffer(_offline(), online_capacity=100, offline_fraction=0.6)
    rb.anneal(0, 100)
    assert rb.offline_fraction == pytest.approx(0.6)
    rb.anneal(50, 100)
    assert rb.offline_fraction == pytest.approx(0.3)
    rb.anneal(25, 100)  # from the base value, not the current one
    assert rb.offline_fraction == pytest.approx(0.45)
    rb.anneal(100, 100)
    assert rb.offline_fraction == 0.0
    rb.anneal(300, 100)
    assert rb.offline_fraction == 0.0
    rb.extend(_tagged(10, 1))
    assert (rb.sample(6)["source"] == 1).all()


def test_repr():
    rb = OfflineToOnlineReplayBuffer(_offline(), online_capacity=100, offline_fraction=0.25, batch_size=16)
    rb.extend(_tagged(3, 1))
    text = repr(rb)
    assert text.startswith("OfflineToOnlineReplayBuffer(")
    for part in ("offline=ReplayBuffer", "offline_fraction=0.250", "online_size=3", "batch_size=16"):
        assert part in text


def _register(prefix: str, calls: list, n: int = 20):
    register = pytest.importorskip(
        "torchrl.data.datasets.utils", reason="torchrl.data.datasets.utils.register_dataset is not importable yet"
    ).register_dataset

    def factory(name, **kwargs):
        calls.append((name, kwargs))
        return _offline(n, TensorDictReplayBuffer)

    register(prefix, factory, replace=True)


def test_string_dataset_goes_through_load_dataset_with_batch_size():
    calls = []
    _register("o2ocompat", calls)
    rb = OfflineToOnlineReplayBuffer("o2ocompat:some/name", online_capacity=10, batch_size=7)
    assert calls == [("some/name", {"batch_size": 7})]
    assert len(rb.offline_buffer) == 20 and rb.sample().batch_size == torch.Size([7])


def test_prefill_replay_buffer_with_a_registered_dataset():
    calls = []
    _register("o2ocompatprefill", calls, n=30)
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    out = prefill_replay_buffer(rb, "o2ocompatprefill:d", n_samples=12, chunk_size=7)
    assert out is rb
    assert len(calls) == 1 and calls[0][1] == {"batch_size": 7}
    assert len(rb) == 12
    rb2 = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), _offline(30), chunk_size=8)
    assert len(rb2) == 30  # n_samples=None: len(dataset)
    rb3 = prefill_replay_buffer(ReplayBuffer(storage=LazyTensorStorage(100)), _offline(30), n_samples=500)
    assert len(rb3) == 30  # capped at len(dataset)
