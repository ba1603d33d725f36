"""Buffers built with ``compilable=True``: one ``torch.compile(fullgraph=True)`` graph for a write and a draw,
results equal to eager, counters kept as tensors, and the combinations a traced buffer cannot honour refused.

Graphs are counted with dynamo's ``CompileCounter`` backend (eager execution, no inductor): cheap, and a graph
break fails at once under ``fullgraph=True``.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.testing import CompileCounter

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SampleToInsertRatio,
    TensorDictReplayBuffer,
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rows(step: int, n: int = 64) -> TensorDict:
    start = step * n
    obs = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(obs=obs.unsqueeze(-1).expand(n, 4).clone(), reward=obs.unsqueeze(-1), batch_size=[n])


def _storage(kind: str, capacity: int, tmp_path):
    if kind == "memmap":
        return LazyMemmapStorage(capacity, compilable=True, scratch_dir=tmp_path / "mm")
    return LazyTensorStorage(capacity, compilable=True)


def _tdrb(kind: str, tmp_path, sampler=RandomSampler, capacity: int = 1000) -> TensorDictReplayBuffer:
    sampler = SamplerWithoutReplacement(drop_last=True) if sampler is SamplerWithoutReplacement else sampler()
    rb = TensorDictReplayBuffer(
        storage=_storage(kind, capacity, tmp_path), sampler=sampler, batch_size=256, compilable=True
    )
    if kind == "memmap" or isinstance(sampler, SamplerWithoutReplacement):  # files made by an eager first write;
        rb.extend(_rows(-4, 256))  # a batch without replacement needs 256 items
    return rb


@pytest.mark.parametrize(
    "kind, sampler",
    [("tensor", RandomSampler), ("memmap", RandomSampler), ("tensor", SamplerWithoutReplacement)],
)
def test_extend_and_sample_compile_to_one_graph_and_match_eager(kind, sampler, tmp_path):
    compiled_rb, eager_rb = _tdrb(kind, tmp_path / "c", sampler), _tdrb(kind, tmp_path / "e", sampler)

    def step(rb, data):
        rb.extend(data)
        return rb.sample()

    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    frames = []
    for i in range(200):  # 200 x 64 rows: the ring wraps 12 times
        torch.manual_seed(i)
        out = compiled(compiled_rb, _rows(i))
        frames.append(counter.frame_count)
        torch.manual_seed(i)
        expected = step(eager_rb, _rows(i))
        assert (out == expected).all(), f"step {i}"
    assert frames[2] == frames[-1], f"new graphs after the third call: {frames[:5]} ... {frames[-1]}"
    assert frames[-1] <= 2
    assert len(compiled_rb) == len(eager_rb) == 1000
    assert compiled_rb.writer.cursor == eager_rb.writer.cursor
    assert compiled_rb.writer.write_count == eager_rb.writer.write_count


def test_plain_replay_buffer_of_tensors_compiles():
    rb = ReplayBuffer(storage=LazyTensorStorage(100, compilable=True), batch_size=32, compilable=True)

    def step(x):
        rb.extend(x)
        return rb.sample()

    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for i in range(20):
        out = compiled(torch.arange(i * 16, i * 16 + 16))
        assert out.shape == (32,)
        assert bool((out < (i + 1) * 16).all()) and bool((out >= max(0, (i + 1) * 16 - 100)).all())
    assert counter.frame_count <= 2
    assert len(rb) == 100 and rb.writer.cursor == 20 and rb.writer.write_count == 320


def test_compiled_counters_match_a_buffer_built_without_compilable():
    compiled = ReplayBuffer(storage=LazyTensorStorage(10, compilable=True), compilable=True)
    plain = ReplayBuffer(storage=LazyTensorStorage(10))
    extend = torch.compile(lambda rb, x: rb.extend(x), backend="eager", fullgraph=True)
    for n in (3, 4, 5, 12, 1):
        x = torch.arange(n)
        assert extend(compiled, x).tolist() == plain.extend(x).tolist()
        for attr in ("last_written_row", "write_revision"):
            assert getattr(compiled.storage, attr) == getattr(plain.storage, attr), attr
        assert compiled.storage.append_state() == plain.storage.append_state()
        assert len(compiled) == len(plain) and compiled.writer.cursor == plain.writer.cursor
        assert compiled.storage.len_tensor() == len(plain)
    assert (compiled.storage[:] == plain.storage[:]).all()


def test_compilable_storage_state_pickle_and_empty():
    rb = ReplayBuffer(storage=LazyTensorStorage(8, compilable=True), batch_size=4, compilable=True)
    rb.extend(torch.arange(6))
    copy = pickle.loads(pickle.dumps(rb.storage))
    assert len(copy) == 6 and copy.compilable and copy.last_written_row == 5
    state = rb.state_dict()
    other = ReplayBuffer(storage=LazyTensorStorage(8, compilable=True), batch_size=4, compilable=True)
    other.load_state_dict(state)
    assert len(other) == 6 and other.writer.cursor == 6 and other.storage.has_rows
    rb.empty()
    assert len(rb) == 0 and not rb.storage.has_rows
    with pytest.raises(RuntimeError, match="add data first"):
        rb.sample()  # the emptiness a compilable sampler checks is known on the host: no silent stale rows


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shared=True),
        dict(prefetch=2, batch_size=4),
        dict(rate_limiter=SampleToInsertRatio(1.0, min_size_to_sample=1, error_buffer=8)),
    ],
    ids=["shared", "prefetch", "rate_limiter"],
)
def test_compilable_buffer_refuses_what_a_trace_cannot_hold(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"`{name}` is not supported with it"):
        ReplayBuffer(storage=LazyTensorStorage(8, compilable=True), compilable=True, **kwargs)


def test_compilable_buffer_refuses_waiting_draws():
    rb = ReplayBuffer(storage=LazyTensorStorage(8, compilable=True), batch_size=2, compilable=True)
    rb.extend(torch.arange(4))
    for kwargs in (dict(wait=True), dict(timeout=1.0)):
        with pytest.raises(ValueError, match="compilable=True draws at once"):
            rb.sample(**kwargs)
    assert rb.sample().shape == (2,)


def test_compilable_storage_is_not_shared_between_processes():
    with pytest.raises(RuntimeError, match="Cannot share a compilable storage between processes"):
        LazyTensorStorage(8, compilable=True, shared_init=True)
    storage = LazyTensorStorage(8, compilable=True)
    storage.set(torch.arange(2), torch.zeros(2))
    with pytest.raises(RuntimeError, match="Cannot share a compilable storage between processes"):
        storage.share_memory_()
    assert not storage.is_shared and len(storage) == 2  # refused before anything moved
    writer = RoundRobinWriter(compilable=True)
    writer.register_storage(LazyTensorStorage(8))
    with pytest.raises(RuntimeError, match="a writer built with compilable=True"):
        writer.share_memory_()


def test_memmap_storage_built_compilable_keeps_private_counters(tmp_path):
    storage = LazyMemmapStorage(8, compilable=True, scratch_dir=tmp_path / "mm")
    assert not storage.is_shared
    storage.set(torch.arange(3), torch.ones(3, 2))
    assert len(storage) == 3 and storage.len_tensor().item() == 3
    assert (storage.get(torch.arange(3)) == 1).all()


def _filled_wor_buffer(n: int = 12, **sampler_kwargs) -> ReplayBuffer:
    sampler = SamplerWithoutReplacement(**{"drop_last": True, **sampler_kwargs})
    rb = ReplayBuffer(storage=LazyTensorStorage(16, compilable=True), sampler=sampler, batch_size=4, compilable=True)
    rb.extend(torch.arange(n))
    return rb


def test_without_replacement_on_a_compilable_storage_visits_each_item_once_per_epoch():
    rb = _filled_wor_buffer()
    sample = torch.compile(lambda: rb.sample(), backend="eager", fullgraph=True)
    for _ in range(3):  # three epochs of 12 items in batches of 4
        drawn = torch.cat([sample() for _ in range(3)])
        assert sorted(drawn.tolist()) == list(range(12))
    ordered = _filled_wor_buffer(shuffle=False)
    assert [ordered.sample().tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_without_replacement_on_a_compilable_storage_resumes_from_its_state():
    rb = _filled_wor_buffer()
    first = rb.sample()
    state = rb.sampler.state_dict()
    assert state["len_storage"] == 12 and state["_sample_list"].numel() == 8
    assert not set(first.tolist()) & set(state["_sample_list"].tolist())
    resumed = _filled_wor_buffer()
    resumed.sampler.load_state_dict(state)
    rest = torch.cat([resumed.sample(), resumed.sample()])
    assert rest.tolist() == state["_sample_list"].tolist()  # the epoch goes on where it was saved


def test_without_replacement_on_a_compilable_storage_refuses_short_batches():
    rb = _filled_wor_buffer(drop_last=False)
    with pytest.raises(ValueError, match="build it with drop_last=True"):
        rb.sample()
    small = _filled_wor_buffer(n=2)
    with pytest.raises(RuntimeError, match="fewer items than batch_size"):
        small.sample()  # on the CPU the async assert raises at once


def test_one_compiled_step_serves_buffers_of_several_capacities():
    # dynamo makes the capacity symbolic at the second buffer: draws of a symbolic size must still trace
    counter = CompileCounter()

    def step(rb, data):
        rb.extend(data)
        return rb.sample()

    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for capacity in (300, 700, 1500):
        for sampler in (RandomSampler(), SamplerWithoutReplacement(drop_last=True)):
            rb = TensorDictReplayBuffer(
                storage=LazyTensorStorage(capacity, compilable=True), sampler=sampler, batch_size=64, compilable=True
            )
            rb.extend(_rows(-8, capacity))
            for i in range(3):
                assert compiled(rb, _rows(i, 16)).batch_size == (64,)
    assert counter.frame_count <= 8
