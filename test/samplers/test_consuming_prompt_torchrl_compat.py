"""TorchRL behaviours of ConsumingSampler (an exhausted buffer, the constructor refusals) and PromptGroupSampler (its
refusals at sample(), the stateless random strategy, pickling without the group cache)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from torchrl.data import (
    ConsumingSampler,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers.prompt_group import PromptGroupSampler


# -- ConsumingSampler ----------------------------------------------------------------------------------------------
def test_sampling_a_consumed_buffer_raises_cannot_sample_from_an_empty_storage():
    rb = ReplayBuffer(storage=ListStorage(5), batch_size=3, consume_after_n_samples=1)
    rb.extend(list(range(5)))
    first, second = rb.sample(), rb.sample()
    assert len(first) == 3 and len(second) == 2 and sorted(list(first) + list(second)) == list(range(5))
    assert len(rb) == 0
    with pytest.raises(
        RuntimeError, match="Cannot sample from an empty storage: the buffer has consumed all its 5"
    ):
        rb.sample()
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage: the buffer holds no data"):
        ReplayBuffer(storage=ListStorage(5), batch_size=3, consume_after_n_samples=1).sample()
    rb.extend([7])  # new data can be drawn again
    assert list(rb.sample()) == [7]


def test_consumption_constructor_refusals_carry_torchrl_phrases():
    for kwargs in ({"consume_after_n_samples": 1}, {"sampler": ConsumingSampler()}):
        for batch_size in (None, 2):  # refused for prefetching, whether a batch size is given or not
            with pytest.raises(ValueError, match="Prefetching is not supported.*prefetch=2"):
                ReplayBuffer(storage=ListStorage(5), prefetch=2, batch_size=batch_size, **kwargs)
    for sampler in (SamplerWithoutReplacement(), PrioritizedSampler(5, 0.6, 0.4)):
        name = type(sampler).__name__
        with pytest.raises(ValueError, match=f"only supports the default RandomSampler, got {name}"):
            ReplayBuffer(storage=ListStorage(5), sampler=sampler, consume_after_n_samples=1)
    with pytest.raises(ValueError, match="only supports the default RandomSampler, got PrioritizedSampler"):
        PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(5), consume_after_n_samples=1)
    with pytest.raises(ValueError, match="ConsumingSampler works on 1-dimensional storages.*ndim=2"):
        ReplayBuffer(storage=LazyTensorStorage(8, ndim=2), sampler=ConsumingSampler())
    with pytest.raises(ValueError, match="1-dimensional storages"):
        ReplayBuffer(storage=LazyTensorStorage(8, ndim=2), consume_after_n_samples=1)


class _NoWriteAt(RoundRobinWriter):
    write_at = None  # not callable


def test_a_writer_without_a_callable_write_at_is_refused_at_construction():
    for exc in (TypeError, RuntimeError):
        with pytest.raises(exc, match="requires a writer with a callable `write_at.*got _NoWriteAt"):
            ReplayBuffer(storage=ListStorage(5), writer=_NoWriteAt(), consume_after_n_samples=1)
    ReplayBuffer(storage=ListStorage(5), writer=_NoWriteAt())  # without consumption, write_at is not needed


# -- PromptGroupSampler --------------------------------------------------------------------------------------------
def _completions(n_groups: int = 2, per_group: int = 4) -> TensorDict:
    n = n_groups * per_group
    td = TensorDict(query=torch.arange(n) // per_group, uid=torch.arange(n), batch_size=[n])
    td["next", "reward"] = torch.arange(n, dtype=torch.float32).unsqueeze(-1)
    return td


def test_a_plain_list_storage_is_refused_at_sample():
    rb = TensorDictReplayBuffer(
        storage=ListStorage(8), sampler=PromptGroupSampler(num_groups=1), batch_size=4
    )
    rb.extend(_completions())  # accepted: the storage is only refused when sampled
    with pytest.raises(TypeError, match="Plain ListStorage is not supported by PromptGroupSampler"):
        rb.sample()
    stacked = TensorDictReplayBuffer(
        storage=LazyStackStorage(8), sampler=PromptGroupSampler(num_groups=1), batch_size=4
    )
    stacked.extend(_completions())
    assert stacked.sample()["query"].unique().numel() == 1


# whole groups (nothing to choose), or a choice inside each group
@pytest.mark.parametrize("per_group", [4, 6])
@pytest.mark.parametrize("strategy", ["reward", "variance"])
def test_reward_strategies_refuse_non_tensor_rewards(per_group, strategy):
    n = 2 * per_group
    numbers = _completions(2, per_group)  # Python floats, in a storage of TensorDicts stacked lazily
    numbers["next", "reward"] = NonTensorStack(*[NonTensorData(float(i)) for i in range(n)])
    strings = _completions(2, per_group)  # strings, in a tensor storage
    strings["next", "reward"] = NonTensorStack(*[f"r{i}" for i in range(n)])
    for storage, data in ((LazyStackStorage(16), numbers), (LazyTensorStorage(16), strings)):
        sampler = PromptGroupSampler(samples_per_group=4, strategy=strategy)
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=8)
        rb.extend(data)
        expected = rf"strategy='{strategy}' requires reward_key=\('next', 'reward'\).*got non-tensor values"
        with pytest.raises(TypeError, match=expected):
            rb.sample()


def test_random_strategy_has_no_state_and_its_dumps_and_loads_do_nothing(tmp_path):
    sampler = PromptGroupSampler(num_groups=2)
    assert sampler.state_dict() == {}
    sampler.load_state_dict({})
    sampler.dumps(tmp_path / "sampler")
    assert not os.path.exists(tmp_path / "sampler")  # nothing written
    sampler.loads(tmp_path / "never_written")  # nothing read
    recency = PromptGroupSampler(num_groups=2, strategy="recency")  # stateful: saved and loaded
    recency.dumps(tmp_path / "recency")
    assert os.path.isdir(tmp_path / "recency")
    recency.loads(tmp_path / "recency")


def test_pickling_drops_the_group_cache():
    sampler = PromptGroupSampler(num_groups=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler, batch_size=8)
    rb.extend(_completions())
    rb.sample()
    assert sampler._group_index is not None  # the grouping is cached between draws
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._group_index is None
    assert sampler._group_index is not None
    index, _ = copy.sample(rb.storage, 8)  # the copy groups the storage again
    assert sorted(index.tolist()) == list(range(8)) and copy._group_index is not None


# -- loaded state: checked whole before anything changes (NOTE [sampler state validation]) ----------------------------
def _consumed_once() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=3, consume_after_n_samples=1)
    rb.extend(torch.arange(6))
    rb.sample()
    return rb


@pytest.mark.parametrize(
    "edit, error, match",
    [
        ({"_live": torch.tensor([0, 9, 1])}, ValueError, r"positions out of \[0, 6\)"),
        ({"_live": torch.tensor([0, 0, 1])}, ValueError, "repeats positions"),
        ({"_live": torch.tensor([0.0, 1.0, 2.0])}, TypeError, "integer positions"),
        ({"_sample_count": torch.full((6,), 0.5)}, TypeError, "draw counts"),
        ({"_sample_count": torch.full((6,), -1)}, ValueError, "draw count >= 0"),
        ({"_known_len": -1}, ValueError, "_known_len"),
        ({"_known_len": True}, TypeError, "_known_len"),
        ({"_ran_out": "yes"}, TypeError, "_ran_out"),
        ({"max_sample_count": 0}, ValueError, "max_sample_count"),
    ],
)
def test_crafted_consuming_states_are_refused_and_change_nothing(edit, error, match):
    rb = _consumed_once()
    before = rb.sampler.state_dict()
    with pytest.raises(error, match=match):
        rb.sampler.load_state_dict({**before, **edit})
    after = rb.sampler.state_dict()
    assert after.keys() == before.keys()
    assert all(str(after[key]) == str(before[key]) for key in before)
    assert len(rb) == 3


def test_crafted_recency_states_are_refused_and_change_nothing():
    sampler = PromptGroupSampler(num_groups=1, strategy="recency")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler, batch_size=4)
    rb.extend(_completions())
    before = sampler.state_dict()
    for state, error in (
        ({"position_recency": torch.ones(8) * 0.5, "recency_clock": 8}, TypeError),
        ({"position_recency": [1, 2], "recency_clock": 8}, TypeError),
        ({"position_recency": torch.tensor([9]), "recency_clock": 8}, ValueError),
    ):
        with pytest.raises(error, match="position_recency|recency_clock"):
            sampler.load_state_dict(state)
        assert torch.equal(sampler.state_dict()["position_recency"], before["position_recency"])
    assert sampler.validate_state_dict(before)["recency_clock"] == 8
