"""ConsumingSampler: bounded draws per item, the free list the writer fills first, len(rb), exhaustion (issue 14)."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip, assert_same_state, chi2, chi2_crit
from helpers.factories import make_buffer
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import (
    ConsumingSampler,
    ImmutableDatasetWriter,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    TensorStorage,
    tensordict_collate,
)
from torchrl.data.replay_buffers.samplers.consuming import distinct_positions

TIMEOUT = 60


def consuming_rb(capacity=8, n=None, max_sample_count=1, batch_size=3, seed=0, storage=None, **kwargs):
    storage = LazyTensorStorage(capacity) if storage is None else storage
    data = torch.arange(n) if n else None
    sampler = ConsumingSampler(max_sample_count)
    return make_buffer(storage=storage, sampler=sampler, batch_size=batch_size, seed=seed, data=data, **kwargs)


# -- what is drawn ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_sample_count", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 7])
def test_each_item_is_drawn_exactly_max_sample_count_times_then_the_buffer_runs_out(max_sample_count, batch_size):
    rb = consuming_rb(capacity=10, n=10, max_sample_count=max_sample_count, batch_size=batch_size)
    seen = torch.zeros(10, dtype=torch.long)
    batches = 0
    for batch in rb:
        assert batch.unique().numel() == batch.numel(), "a batch repeats an item"
        seen += torch.bincount(batch, minlength=10)
        batches += 1
    assert seen.tolist() == [max_sample_count] * 10
    assert len(rb) == 0 and rb.sampler.ran_out
    assert list(rb) == []  # an exhausted buffer yields no batch
    assert rb.next() is None


def test_len_counts_the_items_left_and_the_last_batch_is_short():
    rb = consuming_rb(capacity=10, n=7, batch_size=3)
    assert len(rb) == 7
    assert rb.sample().numel() == 3 and len(rb) == 4 and not rb.sampler.ran_out
    assert rb.sample().numel() == 3 and len(rb) == 1
    last = rb.sample()
    assert last.numel() == 1 and len(rb) == 0 and rb.sampler.ran_out
    assert rb.stats()["size"] == 0


def test_sampling_an_exhausted_buffer_raises_and_says_what_to_do():
    rb = consuming_rb(capacity=4, n=4, batch_size=4)
    rb.sample()
    with pytest.raises(RuntimeError, match=r"consumed all its 4 items.*rb\.extend.*for batch in rb"):
        rb.sample()
    with pytest.raises(RuntimeError, match="holds no data"):
        consuming_rb().sample()


def test_draws_are_uniform_over_the_items_left():
    rb = consuming_rb(capacity=12, n=12, max_sample_count=10**9, batch_size=1, seed=3)
    rb.sampler.sample(rb.storage, 1)
    counts = torch.bincount(torch.cat([rb.sample() for _ in range(6000)]), minlength=12).double()
    uniform = torch.full((12,), 1 / 12, dtype=torch.float64)
    assert chi2(counts, uniform) < chi2_crit(11)


@pytest.mark.parametrize("n,k", [(8, 2), (40, 3), (6, 4)])  # rejection path (4k <= n) and permutation path
def test_distinct_positions_is_a_uniform_subset(n, k):
    gen = torch.Generator().manual_seed(11)
    pairs = torch.zeros(n, n, dtype=torch.float64)
    singles = torch.zeros(n, dtype=torch.float64)
    for _ in range(4000):
        drawn = distinct_positions(n, k, gen)
        assert drawn.unique().numel() == k and int(drawn.min()) >= 0 and int(drawn.max()) < n
        singles += torch.bincount(drawn, minlength=n).double()
        pairs[drawn[0], drawn[1]] += 1
    assert chi2(singles, torch.full((n,), 1 / n, dtype=torch.float64)) < chi2_crit(n - 1)
    off = ~torch.eye(n, dtype=torch.bool)  # (first, second) is uniform over ordered pairs: the order is random too
    cells = pairs[off]
    assert chi2(cells, torch.full_like(cells, 1 / cells.numel())) < chi2_crit(cells.numel() - 1)


def test_consumed_items_are_never_drawn_again():
    rb = consuming_rb(capacity=20, n=20, batch_size=4, seed=5)
    first = rb.sample()
    rest = torch.cat([rb.sample() for _ in range(4)])
    assert not torch.isin(first, rest).any()
    assert sorted(torch.cat([first, rest]).tolist()) == list(range(20))


# -- the free list and the writer -----------------------------------------------------------------------------------
def test_new_data_fills_consumed_slots_first_oldest_first():
    rb = consuming_rb(capacity=10, n=6, batch_size=2)
    first, second = rb.sample(), rb.sample()
    assert rb.sampler.free_slots(10).tolist() == first.tolist() + second.tolist()
    cursor = rb.writer.cursor
    index = rb.extend(torch.tensor([100, 101, 102]))
    assert index.tolist() == first.tolist() + second.tolist()[:1]  # the oldest consumed slots
    assert rb.writer.cursor == cursor  # everything fitted in free slots: the cursor did not move
    assert rb[index].tolist() == [100, 101, 102]
    assert rb.sampler.free_slots(10).tolist() == second.tolist()[1:]
    assert len(rb) == 2 + 3
    slot = rb.add(torch.tensor(103))
    assert slot == second.tolist()[1] and rb.sampler.num_free == 0
    assert rb.add(torch.tensor(104)) == cursor  # no consumed slot left: at the cursor
    assert rb.writer.cursor == cursor + 1


def test_a_batch_larger_than_the_free_list_continues_at_the_cursor_skipping_the_slots_it_filled():
    rb = consuming_rb(capacity=4, n=4, batch_size=1)  # full: the cursor is back at slot 0
    drawn = int(rb.sample())
    index = rb.extend(torch.tensor([10, 11, 12]))
    assert int(index[0]) == drawn
    cursor_slots = [s for s in range(4) if s != drawn][:2]
    assert index[1:].tolist() == cursor_slots  # the oldest items that were not consumed are overwritten
    assert rb.writer.cursor == (cursor_slots[-1] + 1) % 4
    assert sorted(rb[:].tolist()) == sorted([10, 11, 12] + [x for x in range(4) if x != drawn][2:])
    assert len(rb) == 4


def test_ring_wrap_overwrites_items_that_were_not_consumed_and_they_count_as_new():
    rb = consuming_rb(capacity=4, n=4, max_sample_count=2, batch_size=4)
    rb.sample()  # every item drawn once of twice
    rb.extend(torch.tensor([10, 11]))  # no free slot: slots 0 and 1 are overwritten at the cursor
    assert rb[:].tolist() == [10, 11, 2, 3]
    drawn = rb.sample()  # 2 and 3 are consumed now; 10 and 11 were drawn once
    assert sorted(drawn.tolist()) == [2, 3, 10, 11]
    assert len(rb) == 2 and sorted(rb.sampler.free_slots(4).tolist()) == [2, 3]
    assert sorted(rb.sample().tolist()) == [10, 11]
    assert len(rb) == 0


def test_a_batch_as_large_as_the_storage_overwrites_everything():
    rb = consuming_rb(capacity=4, n=4, batch_size=2)
    rb.sample()
    rb.extend(torch.arange(10, 16))  # more than the capacity: only the last 4 survive
    assert sorted(rb[:].tolist()) == [12, 13, 14, 15]
    assert len(rb) == 4 and rb.sampler.num_free == 0


def test_item_assignment_makes_an_item_drawable_again():
    rb = consuming_rb(capacity=4, n=4, batch_size=4)
    rb.sample()
    rb[2] = torch.tensor(42)
    assert len(rb) == 1 and rb.sample().tolist() == [42]


def test_tensordict_buffers_write_the_index_of_reused_slots():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6), consume_after_n_samples=1, batch_size=2,
                                generator=torch.Generator().manual_seed(0))
    assert isinstance(rb.sampler, ConsumingSampler) and rb.sampler.max_sample_count == 1
    rb.extend(TensorDict(a=torch.arange(6), batch_size=[6]))
    drawn = rb.sample()["index"]
    new = TensorDict(a=torch.tensor([10, 11]), batch_size=[2])
    rb.extend(new)
    assert new["index"].tolist() == drawn.tolist()
    assert rb[:]["index"].tolist() == list(range(6))
    assert sorted(rb[drawn]["a"].tolist()) == [10, 11]


def test_list_storage_and_a_fixed_dataset():
    rb = consuming_rb(storage=ListStorage(5), batch_size=2)
    rb.extend([torch.tensor(i) for i in range(5)])
    drawn = rb.sample()
    assert rb.extend([torch.tensor(7), torch.tensor(8)]).tolist() == [int(x) for x in drawn]
    fixed = ReplayBuffer(storage=TensorStorage(torch.arange(5)), writer=ImmutableDatasetWriter(),
                         sampler=ConsumingSampler(), batch_size=2)
    assert len(fixed) == 5
    assert sorted(torch.cat(list(fixed)).tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="read-only"):
        fixed.extend(torch.arange(2))


def test_a_sampler_alone_follows_the_storage():
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), torch.arange(4))
    sampler = ConsumingSampler()
    assert sorted(sampler.sample(storage, 10)[0].tolist()) == [0, 1, 2, 3] and sampler.ran_out
    storage.set(torch.arange(4, 6), torch.arange(4, 6))
    assert sorted(sampler.sample(storage, 10)[0].tolist()) == [4, 5]
    assert sampler.num_sampleable(storage) == 0


def test_empty_starts_over():
    rb = consuming_rb(capacity=4, n=4, batch_size=2)
    rb.sample()
    rb.empty()
    assert len(rb) == 0 and rb.sampler.num_free == 0
    assert rb.extend(torch.arange(3)).tolist() == [0, 1, 2] and len(rb) == 3


def test_write_at_writes_filled_slots_without_moving_the_cursor():
    writer = RoundRobinWriter(track_generations=True)
    writer.register_storage(LazyTensorStorage(6))
    writer.extend(torch.arange(4))
    assert writer.write_at(torch.tensor([2, 0]), torch.tensor([20, 10])).tolist() == [2, 0]
    assert writer.write_at(1, torch.tensor(11)) == 1
    assert (writer.cursor, writer.write_count) == (4, 7)
    assert writer.generations_of(torch.arange(4)).tolist() == [1, 1, 1, 0]
    assert writer._storage[:].tolist() == [10, 11, 20, 3]
    with pytest.raises(IndexError, match=r"write_at\(\) writes into slots that already hold data \(0 to 3\)"):
        writer.write_at(torch.tensor([1, 4]), torch.tensor([0, 0]))
    assert writer._storage[:].tolist() == [10, 11, 20, 3] and writer.write_count == 7


def test_extend_free_first_takes_any_source_of_free_slots():
    writer = RoundRobinWriter()
    writer.register_storage(LazyTensorStorage(6))
    writer.extend(torch.arange(6))  # full: the cursor is back at 0
    index = writer.extend_free_first(torch.tensor([7, 8, 9]), lambda k: torch.tensor([4, 0])[:k])
    assert index.tolist() == [4, 0, 1] and writer.cursor == 2
    assert writer._storage[:].tolist() == [8, 9, 2, 3, 7, 5]
    assert writer.add_free_first(torch.tensor(42), lambda k: torch.tensor([3])[:k]) == 3
    assert writer.extend_free_first(torch.zeros(0), lambda k: torch.tensor([3])).numel() == 0


# -- refusals ---------------------------------------------------------------------------------------------------
def test_consume_after_n_samples_builds_the_sampler_and_refuses_other_samplers():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), consume_after_n_samples=3)
    assert isinstance(rb.sampler, ConsumingSampler) and rb.sampler.max_sample_count == 3
    rb = ReplayBuffer(storage=LazyTensorStorage(4), sampler=RandomSampler(), consume_after_n_samples=2)
    assert rb.sampler.max_sample_count == 2
    same = ConsumingSampler(2)
    assert ReplayBuffer(sampler=same, consume_after_n_samples=2).sampler is same
    with pytest.raises(ValueError, match=r"`consume_after_n_samples`=3 contradicts.*max_sample_count=2"):
        ReplayBuffer(sampler=ConsumingSampler(2), consume_after_n_samples=3)
    only_random = "only supports the default RandomSampler, got {}.*ConsumingSampler\\(1\\) is built for you"
    with pytest.raises(ValueError, match=only_random.format("PrioritizedSampler")):
        ReplayBuffer(sampler=PrioritizedSampler(4, 0.6, 0.4), consume_after_n_samples=1)
    with pytest.raises(ValueError, match=only_random.format("PrioritizedSampler")):
        PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(4), consume_after_n_samples=1)
    with pytest.raises(ValueError, match=only_random.format("SamplerWithoutReplacement")):
        ReplayBuffer(sampler=SamplerWithoutReplacement(), consume_after_n_samples=1)
    for bad, exc in ((0, ValueError), (True, TypeError), (1.5, TypeError)):
        with pytest.raises(exc, match="consume_after_n_samples"):
            ReplayBuffer(consume_after_n_samples=bad)


def test_prefetch_priorities_and_other_layouts_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"Prefetching is not supported.*consumes its items before anyone receives"):
        ReplayBuffer(sampler=ConsumingSampler(), prefetch=2, batch_size=2)
    with pytest.raises(ValueError, match="Prefetching is not supported"):
        ReplayBuffer(consume_after_n_samples=1, prefetch=2, batch_size=2)
    with pytest.raises(ValueError, match="1-dimensional storages, got a storage with ndim=2"):
        ReplayBuffer(storage=LazyTensorStorage(8, ndim=2), sampler=ConsumingSampler())
    with pytest.raises(TypeError, match="requires a writer with a callable `write_at.*TensorDictMaxValueWriter"):
        ReplayBuffer(sampler=ConsumingSampler(), writer=TensorDictMaxValueWriter())
    rb = consuming_rb(n=4)
    with pytest.raises(RuntimeError, match="keeps no priorities"):
        rb.update_priority(torch.tensor([0]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="1-dimensional storages"):
        ConsumingSampler().sample(LazyTensorStorage(8, ndim=2), 2)


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (True, TypeError), (2.0, TypeError)])
def test_max_sample_count_is_validated(bad, exc):
    with pytest.raises(exc, match=r"`max_sample_count` must be a positive int"):
        ConsumingSampler(bad)


def test_an_inconsistent_state_is_refused_and_changes_nothing():
    rb = consuming_rb(n=4)
    rb.sample()
    before = rb.sampler.state_dict()
    bad = dict(before, _free=torch.tensor([0]))
    with pytest.raises(ValueError, match="Inconsistent ConsumingSampler state"):
        rb.sampler.load_state_dict(bad)
    assert_same_state(rb.sampler.state_dict(), before)


# -- state, checkpoints, pickling -------------------------------------------------------------------------------------
def _stream(rb, steps=6):
    """Draws and writes mixed, until the buffer runs dry or ``steps`` steps."""
    out = []
    for i in range(steps):
        if len(rb):
            out.append(rb.sample().tolist())
        if i % 2:
            out.append(rb.extend(torch.arange(2) + 100 * i).tolist())
    return out, rb[:].tolist(), len(rb)


def test_state_dict_round_trip_mid_stream_continues_identically():
    rb = consuming_rb(capacity=8, n=8, max_sample_count=2, batch_size=3, seed=1)
    rb.sample(), rb.sample(), rb.extend(torch.tensor([50]))
    state = rb.state_dict()
    fresh = consuming_rb(capacity=8, max_sample_count=2, batch_size=3, seed=99)
    fresh.load_state_dict(state)
    assert len(fresh) == len(rb)
    assert _stream(fresh) == _stream(rb)


def test_dumps_round_trip_mid_stream_continues_identically(tmp_path):
    rb = consuming_rb(capacity=8, n=8, max_sample_count=2, batch_size=3, seed=2)
    rb.sample(), rb.sample(), rb.extend(torch.tensor([50, 51]))
    fresh = assert_checkpoint_round_trip(rb, lambda: consuming_rb(capacity=8, max_sample_count=2, batch_size=3, seed=77), tmp_path, draws=0)
    assert _stream(fresh) == _stream(rb)


def test_the_sampler_alone_satisfies_the_checkpoint_contract(tmp_path):
    rb = consuming_rb(capacity=8, n=8, batch_size=3)
    rb.sample()
    assert_checkpoint_round_trip(rb.sampler, ConsumingSampler, tmp_path / "sampler")
    assert_checkpoint_round_trip(rb, lambda: consuming_rb(capacity=8, batch_size=3), tmp_path / "buffer")


def test_a_checkpoint_with_another_max_sample_count_loads_it(tmp_path):
    sampler = ConsumingSampler(3)
    sampler.dumps(tmp_path / "s")
    other = ConsumingSampler(1)
    other.loads(tmp_path / "s")
    assert other.max_sample_count == 3


def test_pickling_keeps_the_state_and_continues_identically():
    rb = consuming_rb(capacity=8, n=8, max_sample_count=2, batch_size=3, seed=4)
    rb.sample()
    copy = pickle.loads(pickle.dumps(rb))
    assert repr(copy.sampler) == "ConsumingSampler(max_sample_count=2)"
    assert_same_state(copy.sampler.state_dict(), rb.sampler.state_dict())
    assert _stream(copy) == _stream(rb)
    sampler = pickle.loads(pickle.dumps(rb.sampler))
    assert_same_state(sampler.state_dict(), rb.sampler.state_dict())


# -- DataLoader workers ------------------------------------------------------------------------------------------------
def _epoch(loader) -> list[int]:
    return [x for batch in loader for x in batch.tolist()]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_dataloader_workers_share_one_pool_and_the_iteration_ends_when_it_is_consumed(start_method):
    rb = consuming_rb(capacity=64, n=40, batch_size=3)
    loader = DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate, num_workers=2,
                        multiprocessing_context=start_method, timeout=TIMEOUT, persistent_workers=True)
    assert rb.sampler.is_shared
    first = _epoch(loader)
    assert sorted(first) == list(range(40))  # every item exactly once over both workers
    assert len(rb) == 0 and rb.sampler.num_free == 40
    oldest = rb.sampler.free_slots(20)  # in the order the workers consumed them
    assert rb.extend(torch.arange(100, 120)).tolist() == oldest.tolist()  # the main process refills them
    assert sorted(_epoch(loader)) == list(range(100, 120))
    assert len(rb) == 0 and sorted(_epoch(loader)) == []  # nothing left: an empty epoch


@pytest.mark.timeout(60)
def test_the_main_process_dataset_ends_when_everything_is_consumed():
    rb = consuming_rb(capacity=16, n=10, batch_size=4)
    loader = DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate)
    assert sorted(_epoch(loader)) == list(range(10))
    with pytest.raises(RuntimeError, match="consumed all"):  # outside an iteration, sampling still raises
        rb.sample()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_dataset_that_does_not_share_the_sampler_is_refused_with_workers():
    rb = consuming_rb(capacity=16, n=16, batch_size=2)
    loader = DataLoader(rb.as_dataset(num_batches=2, share_sampler=False), batch_size=None,
                        collate_fn=tensordict_collate, num_workers=1, multiprocessing_context="fork", timeout=TIMEOUT)
    with pytest.raises(RuntimeError, match=r"ConsumingSampler requires shared state.*share_sampler=True") as info:
        list(loader)
    info.value.__traceback__ = None
    assert len(rb) == 16  # nothing was consumed


def test_sharing_allocates_the_reserved_slots_and_a_pickle_is_private():
    with pytest.raises(RuntimeError, match=r"does not know the storage's capacity.*reserve\(capacity\)"):
        ConsumingSampler().share_memory_()
    rb = consuming_rb(capacity=8, n=5, batch_size=2)
    rb.sample()
    before = rb.sampler.state_dict()
    assert rb.sampler.share_memory_().is_shared and rb.sampler.share_memory_().is_shared
    assert_same_state(rb.sampler.state_dict(), before)  # the state carries over
    private = pickle.loads(pickle.dumps(rb.sampler))
    assert not private.is_shared
    private.sample(rb.storage, 3)
    assert rb.sampler.num_sampleable() == 3 and private.num_sampleable() == 0
    rb.extend(torch.arange(3))
    assert len(rb) == 6
    standalone = ConsumingSampler()
    standalone.reserve(4)
    standalone.share_memory_()
    slots = standalone._count.numel()  # at least the 4 reserved
    with pytest.raises(RuntimeError, match=rf"grew to {slots + 1} rows, past the {slots} slots"):
        standalone.mark_update(torch.tensor([slots]))
    with pytest.raises(ValueError, match="`capacity` must be a positive int"):
        standalone.reserve(0)


# -- the free list, as a property ------------------------------------------------------------------------------------
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 9)),
        st.tuples(st.just("add"), st.just(1)),
        st.tuples(st.just("sample"), st.integers(1, 5)),
        st.tuples(st.just("set"), st.integers(0, 7)),
        st.tuples(st.just("empty"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, max_sample_count=st.integers(1, 3), seed=st.integers(0, 2**16), shared=st.booleans())
def test_free_list_model(ops, max_sample_count, seed, shared):
    """Against a model: draws per item since its last write, the slots consumed (oldest first), the cursor."""
    capacity = 8
    rb = consuming_rb(capacity=capacity, max_sample_count=max_sample_count, batch_size=1, seed=seed)
    if shared:  # the same bookkeeping, in shared memory under a cross-process lock
        rb.sampler.share_memory_()
    sampler = rb.sampler
    draws: dict[int, int] = {}  # slot -> draws since its last write
    free: list[int] = []  # consumed slots, oldest first
    value = 0

    def written(slots):
        for s in slots:
            draws[s] = 0
            if s in free:
                free.remove(s)

    for op, arg in ops:
        if op in ("extend", "add"):
            cursor = rb.writer.cursor
            data = torch.arange(value, value + arg)
            value += arg
            index = rb.extend(data) if op == "extend" else torch.tensor([rb.add(data[0])])
            index = index.tolist()
            if arg < capacity:
                k = min(arg, len(free))
                assert index[:k] == free[:k], "consumed slots are filled first, oldest first"
                at_cursor = [s for s in ((cursor + i) % capacity for i in range(arg + k)) if s not in free[:k]]
                assert index[k:] == at_cursor[: arg - k]
            written(index)
            assert rb[torch.tensor(index[-min(arg, capacity):])].tolist() == data[-min(arg, capacity):].tolist()
        elif op == "sample":
            live = [s for s, d in draws.items() if d < max_sample_count]
            if not live:
                with pytest.raises(RuntimeError, match="consumed|no data"):
                    rb.sample(arg)
                continue
            drawn = rb.sample(arg)
            stored = rb[:]  # every stored value is distinct: a value tells its slot
            drawn_slots = [int(torch.nonzero(stored == v)) for v in drawn.tolist()]
            assert len(set(drawn_slots)) == len(drawn_slots)
            assert len(drawn_slots) == len(drawn) == min(arg, len(live)), "distinct items, as many as possible"
            for s in drawn_slots:
                assert s in live
                draws[s] += 1
                if draws[s] == max_sample_count:
                    free.append(s)
            assert sampler.ran_out == (len(live) - sum(draws[s] == max_sample_count for s in drawn_slots) == 0)
        elif op == "empty":
            rb.empty()
            draws.clear()
            free.clear()
        elif op == "set" and arg < len(rb.storage):
            rb[arg] = torch.tensor(value)
            value += 1
            written([arg])
        assert len(rb) == sum(d < max_sample_count for d in draws.values())
        consumed = sorted(s for s, d in draws.items() if d >= max_sample_count)
        assert sorted(free) == consumed and sampler.free_slots(capacity).tolist() == free
        assert sampler.num_free == len(free)
