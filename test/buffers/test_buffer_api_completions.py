"""TorchRL's buffer API completed: ``extend(data, *, update_priority=...)`` (the priorities of the written items,
set with the write), ``update_(input_dict_or_td, ...)``, the ``dump``/``save``/``load`` aliases with TorchRL's
``*args, **kwargs``, :class:`ConditionalUpdateResult`'s count properties, :class:`PrioritizedReplayBuffer`'s explicit
keywords and ``prioritized_sampler``, and ``stats()``, which only reads (as TorchRL's)."""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import signal
import time

import pytest
import torch
from helpers.factories import make_buffer
from helpers.targets import PausingWriter, child_extend_paused
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.data.replay_buffers.replay_buffers import _readiness
from torchrl.data.replay_buffers.replay_buffers.conditional_update import ConditionalUpdateResult


def _prioritized(storage=None, **kwargs) -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=storage if storage is not None else LazyTensorStorage(10),
        generator=torch.Generator().manual_seed(0), **kwargs,
    )  # fmt: skip


def _weights(rb) -> list[float]:
    """The sum-tree leaf of each stored item: ``(priority + eps) ** alpha``, the priority itself with alpha=1."""
    return [round(float(rb.sampler._sum_tree[i]), 4) for i in range(len(rb))]


# -- extend(update_priority=) ---------------------------------------------------------------------------------------
def test_extend_sets_the_priorities_given_with_the_write():
    rb = _prioritized()
    index = rb.extend(torch.arange(3), update_priority=torch.tensor([0.0, 0.0, 5.0]))
    assert index.tolist() == [0, 1, 2] and _weights(rb) == [0.0, 0.0, 5.0]
    assert set(rb.sample(8).tolist()) == {2}
    rb.extend(torch.arange(3, 5), update_priority=2.0)  # one number for every item
    assert _weights(rb)[3:] == [2.0, 2.0]
    rb.extend(torch.arange(5, 6))  # without: the default (max) priority
    assert _weights(rb)[5] == 5.0


def test_extend_update_priority_reduces_trailing_dims_with_the_sampler_s_reduction():
    rb = _prioritized()
    rb.extend(torch.arange(2), update_priority=torch.tensor([[1.0, 4.0], [3.0, 2.0]]))  # reduction "max"
    assert _weights(rb) == [4.0, 3.0]


def test_extend_update_priority_follows_dim_extend_on_a_two_dim_storage():
    rb = _prioritized(LazyTensorStorage(12, ndim=2))  # dim_extend=1: data [envs, time]
    data = torch.arange(6).reshape(2, 3)
    priority = torch.zeros(2, 3)
    priority[0, 2] = 1.0  # env 0, step 2: the value 2
    rb.extend(data, update_priority=priority)
    assert set(rb.sample(6).tolist()) == {2}


def test_extend_update_priority_on_a_list_storage():
    rb = _prioritized(ListStorage(4))
    rb.extend([torch.zeros(2), torch.ones(2)], update_priority=[0.0, 1.0])
    assert rb.sample(4).sum().item() == 8.0


@pytest.mark.parametrize(
    "priority, error, match",
    [
        (
            torch.tensor([1.0, 2.0]),
            ValueError,
            r"`update_priority` has shape \[2\], for written items of shape \[3\]",
        ),
        (torch.tensor([1.0, float("nan"), 1.0]), ValueError, r"`update_priority` must be finite and >= 0"),
        (torch.tensor([1.0, -1.0, 1.0]), ValueError, r"must be finite and >= 0.*Nothing was written"),
        (True, TypeError, r"`update_priority`=True.*not a flag"),
    ],
    ids=["count", "nan", "negative", "flag"],
)
def test_bad_priorities_with_a_write_leave_the_buffer_unchanged(priority, error, match):
    rb = _prioritized()
    rb.extend(torch.arange(2), update_priority=torch.tensor([1.0, 2.0]))
    with pytest.raises(error, match=match):
        rb.extend(torch.arange(10, 13), update_priority=priority)
    assert len(rb) == 2 and rb.write_count == 2 and _weights(rb) == [1.0, 2.0]


def test_extend_update_priority_needs_a_prioritized_sampler():
    rb = make_buffer(cls=ReplayBuffer, kind="tensor", capacity=4)
    with pytest.raises(
        NotImplementedError, match=r"RandomSampler, which is not prioritized.*Nothing was written"
    ):
        rb.extend(torch.arange(2), update_priority=torch.ones(2))
    assert len(rb) == 0


def test_tensordict_buffers_keep_their_update_priority_flag():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(4))
    rb.extend(
        TensorDict(obs=torch.zeros(2), td_error=torch.tensor([3.0, 0.5]), batch_size=[2]),
        update_priority=False,
    )
    assert _weights(rb) == [1.0, 1.0]  # the default priority: the entry was not read


# -- update_(input_dict_or_td) -------------------------------------------------------------------------------------
def test_update_takes_a_dict_or_a_tensordict():
    assert list(inspect.signature(ReplayBuffer.update_).parameters)[:3] == [
        "self",
        "input_dict_or_td",
        "clone",
    ]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(
        TensorDict(obs=torch.zeros(3), nested=TensorDict(a=torch.zeros(3), batch_size=[3]), batch_size=[3])
    )
    rb.update_({"obs": torch.tensor([1.0, 2.0, 3.0]), "nested": {"a": torch.ones(3)}}, clone=True)
    assert rb[:]["obs"].tolist() == [1.0, 2.0, 3.0] and rb[:]["nested", "a"].tolist() == [1.0] * 3
    rb.update_(TensorDict(obs=torch.zeros(3), batch_size=[3]), keys_to_update=["nested"])
    assert rb[:]["obs"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="`input_dict_or_td` must be a TensorDict or a dict"):
        rb.update_(torch.zeros(3))


# -- dump / save / load -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alias", ["dump", "save", "load"])
def test_buffer_aliases_take_torchrl_s_args_and_kwargs(alias):
    kinds = [p.kind for p in inspect.signature(getattr(ReplayBuffer, alias)).parameters.values()][1:]
    assert kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def test_buffer_aliases_forward_to_dumps_and_loads(tmp_path):
    rb = make_buffer(cls=ReplayBuffer, kind="tensor", capacity=4, data=torch.arange(3))
    rb.dump(tmp_path / "a", fsync=False)
    rb.save(path=tmp_path / "b")
    for name in ("a", "b"):
        fresh = make_buffer(cls=ReplayBuffer, kind="tensor", capacity=4, data=torch.arange(1))
        fresh.load(tmp_path / name)
        assert fresh[:].tolist() == [0, 1, 2]


# -- ConditionalUpdateResult ------------------------------------------------------------------------------------------
def test_conditional_update_result_counts_are_properties():
    for name in ("updated_count", "version_rejected_count", "stale_count"):
        assert isinstance(inspect.getattr_static(ConditionalUpdateResult, name), property)
    result = ConditionalUpdateResult(
        updated=torch.tensor([True, False, False, True]),
        version_rejected=torch.tensor([False, True, False, False]),
    )
    assert (result.updated_count, result.version_rejected_count, result.stale_count) == (2, 1, 1)
    assert ConditionalUpdateResult(updated=torch.tensor([False, True])).version_rejected_count == 0


def test_update_if_present_reports_its_counts():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(2), writer=TensorDictRoundRobinWriter(track_generations=True)
    )
    rb.extend(TensorDict(obs=torch.arange(2), batch_size=[2]))
    rb.add(TensorDict(obs=torch.tensor(7)))  # row 0 overwritten: stale
    result = rb.update_if_present(index=torch.arange(2), generation=torch.zeros(2, dtype=torch.long),
                                  patch={"obs": torch.full((2,), -1)})  # fmt: skip
    assert (result.updated_count, result.stale_count, result.version_rejected_count) == (1, 1, 0)


# -- PrioritizedReplayBuffer's keywords ----------------------------------------------------------------------------
TORCHRL_PRB_KEYWORDS = {
    "sampler": None,
    "sample_unit": None,
    "collate_fn": None,
    "pin_memory": False,
    "prefetch": None,
    "transform": None,
    "batch_size": None,
    "dim_extend": None,
    "delayed_init": False,
    "transport": "auto",
    "transport_options": None,
}


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer])
def test_prioritized_buffers_take_torchrl_s_keywords_explicitly(cls):
    params = inspect.signature(cls.__init__).parameters
    expected = dict(TORCHRL_PRB_KEYWORDS)
    if cls is TensorDictPrioritizedReplayBuffer:  # TorchRL's: no sampler nor delayed_init, but these
        del expected["sampler"], expected["delayed_init"]
        expected.update(generator=None, shared=False, compilable=False)
    assert {name: params[name].default for name in expected} == expected


def test_prioritized_buffer_keywords_reach_the_buffer():
    rb = _prioritized(batch_size=3, dim_extend=0, collate_fn=lambda x: x + 100)
    rb.extend(torch.arange(4))
    assert rb.batch_size == 3 and bool((rb.sample() >= 100).all())
    assert rb.prioritized_sampler is rb.sampler
    with pytest.raises(TypeError, match="builds its own PrioritizedSampler"):
        _prioritized(sampler=rb.sampler)  # as before: the buffer builds its own


# -- stats() only reads ---------------------------------------------------------------------------------------------
def _shared_limited_buffer() -> ReplayBuffer:
    limiter = SampleToInsertRatio(samples_per_insert=1, min_size_to_sample=8, error_buffer=32)
    rb = ReplayBuffer(storage=LazyTensorStorage(128), writer=PausingWriter(), batch_size=8, shared=True,
                      rate_limiter=limiter)  # fmt: skip
    rb.extend(torch.zeros(1, dtype=torch.long))
    rb.empty()
    return rb


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_stats_does_not_give_back_a_dead_process_s_reservation():
    ctx = mp.get_context("fork")
    rb = _shared_limited_buffer()
    paused = ctx.Event()
    victim = ctx.Process(target=child_extend_paused, args=(rb, paused, 40))
    victim.start()
    try:
        assert paused.wait(60)
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not _readiness._is_dead(victim.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = rb.stats()
        assert before["reserved_inserts"] == 40 and rb.stats() == before  # a read: nothing given back
        rb.extend(torch.arange(8), timeout=30.0)  # refused at first (40 held): the refusal gives it back
        assert rb.stats()["reserved_inserts"] == 0 and len(rb) == 8
    finally:
        if victim.is_alive():
            victim.kill()
        victim.join(30)
