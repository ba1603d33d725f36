"""ReplayBuffer / TensorDictReplayBuffer over the grid storage x sampler x writer x data kind.

Each item carries its id in every leaf (see ``helpers.factories``), so the tests check *which* items a buffer holds
and returns, not only shapes.
"""

from __future__ import annotations

import io
import pickle
import threading

import numpy as np
import pytest
import torch
from helpers.factories import (
    CASE_IDS,
    CASES,
    SAMPLERS,
    STORAGES,
    ids_of,
    make_batch,
    make_buffer,
    make_item,
    skip_tuple_of_items,
    snapshot,
)
from tensordict import TensorDict

from torchrl.data import (
    ImmutableDatasetWriter,
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    TensorStorage,
)

grid = pytest.mark.parametrize("kind,writer", CASES, ids=CASE_IDS)
storages = pytest.mark.parametrize("storage", STORAGES)
samplers = pytest.mark.parametrize("sampler", SAMPLERS)

@pytest.fixture(autouse=True)
def _pytree_batches_only(request):
    """The ``(list, tuple)`` pair of the grid writes a tuple of two items, not a batch: see is_tuple_of_items."""
    params = getattr(request.node, "callspec", None)
    if params is not None:
        skip_tuple_of_items(params.params.get("storage"), params.params.get("kind"))



def _stored_ids(rb, kind) -> list[int]:
    return ids_of(kind, rb[:]).tolist()


# -- the grid -----------------------------------------------------------------------------------------------


@grid
@samplers
@storages
def test_extend_returns_positions_and_stores_items(storage, sampler, kind, writer):
    rb = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4)
    assert len(rb) == 0
    index = rb.extend(make_batch(kind, 0, 6))
    assert index.tolist() == list(range(6))
    assert len(rb) == 6
    assert _stored_ids(rb, kind) == list(range(6))
    rb.extend(make_batch(kind, 6, 2))
    assert len(rb) == 8
    assert _stored_ids(rb, kind) == list(range(8))


@grid
@samplers
@storages
def test_add_writes_one_item_at_the_cursor(storage, sampler, kind, writer):
    rb = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4)
    for i in range(3):
        index = rb.add(make_item(kind, i))
        assert int(index) == i
    assert len(rb) == 3
    assert _stored_ids(rb, kind) == [0, 1, 2]
    assert ids_of(kind, rb[1]).item() == 1


@grid
@samplers
@storages
def test_sample_returns_stored_items_matching_info_index(storage, sampler, kind, writer):
    rb = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4, seed=0)
    rb.extend(make_batch(kind, 0, 7))
    for _ in range(3):
        batch, info = rb.sample(return_info=True)
        ids = ids_of(kind, batch)
        assert 1 <= ids.numel() <= 4
        assert set(ids.tolist()) <= set(range(7))
        # position i holds item i, so the sampled positions are the sampled ids
        assert torch.equal(torch.as_tensor(info["index"]), ids)
        if writer == "tensordict_round_robin":
            assert torch.equal(batch["index"], ids)
    assert ids_of(kind, rb.sample(2)).numel() == 2


@grid
@storages
def test_indexing_by_int_tensor_list_and_slice(storage, kind, writer):
    rb = make_buffer(storage=storage, sampler="random", kind=kind, writer=writer, batch_size=4)
    rb.extend(make_batch(kind, 0, 8))
    assert ids_of(kind, rb[3]).item() == 3
    assert ids_of(kind, rb[-1]).item() == 7
    assert ids_of(kind, rb[torch.tensor([5, 0, 5])]).tolist() == [5, 0, 5]
    assert ids_of(kind, rb[[2, 4]]).tolist() == [2, 4]
    assert ids_of(kind, rb[:]).tolist() == list(range(8))
    assert ids_of(kind, rb[2:5]).tolist() == [2, 3, 4]


@grid
@storages
def test_setitem_overwrites_in_place_without_changing_length(storage, kind, writer):
    rb = make_buffer(storage=storage, sampler="random", kind=kind, writer=writer, batch_size=4)
    rb.extend(make_batch(kind, 0, 5))
    new = make_batch(kind, 40, 2)
    if writer == "tensordict_round_robin":
        new.set("index", torch.tensor([1, 3]))
    rb[torch.tensor([1, 3])] = new
    assert len(rb) == 5
    assert _stored_ids(rb, kind) == [0, 40, 2, 41, 4]


@grid
@samplers
@storages
def test_empty_resets_length_cursor_and_sampler(storage, sampler, kind, writer):
    rb = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4)
    rb.extend(make_batch(kind, 0, 6))
    rb.sample()
    rb.empty()
    assert len(rb) == 0
    assert rb.writer.cursor == 0 and rb.write_count == 0
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    rb.extend(make_batch(kind, 50, 3))
    assert _stored_ids(rb, kind) == [50, 51, 52]
    assert set(ids_of(kind, rb.sample()).tolist()) <= {50, 51, 52}


@grid
@samplers
@storages
def test_state_dict_round_trip_restores_content_and_next_samples(storage, sampler, kind, writer):
    rb = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4, seed=1)
    rb.extend(make_batch(kind, 0, 7))
    rb.sample()  # move the sampler (epoch position) and the generator away from their start
    if kind in ("dict", "tuple") and storage != "list":  # TorchRL's rule: a pytree tensor storage has no state dict
        with pytest.raises(TypeError, match="are not supported by.*dumps"):
            rb.state_dict()
        return
    state = rb.state_dict()
    fresh = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4, seed=99)
    fresh.load_state_dict(state)
    assert len(fresh) == len(rb) == 7
    assert _stored_ids(fresh, kind) == _stored_ids(rb, kind)
    assert fresh.writer.cursor == rb.writer.cursor
    for _ in range(4):
        assert ids_of(kind, fresh.sample()).tolist() == ids_of(kind, rb.sample()).tolist()
    # the restored buffer keeps working and is independent of the original's content
    fresh.extend(make_batch(kind, 20, 2))
    assert len(fresh) == 9 and len(rb) == 7


@pytest.mark.parametrize("dump", ["pickle", "torch.save"])
@grid
@storages
def test_pickle_round_trip_copies_content(storage, kind, writer, dump):
    rb = make_buffer(storage=storage, sampler="without_replacement", kind=kind, writer=writer, batch_size=4, seed=2)
    rb.extend(make_batch(kind, 0, 6))
    if dump == "pickle":
        copy = pickle.loads(pickle.dumps(rb))
    else:
        buf = io.BytesIO()
        torch.save(rb, buf)
        buf.seek(0)
        copy = torch.load(buf, weights_only=False)
    assert type(copy) is type(rb)
    assert len(copy) == 6
    assert _stored_ids(copy, kind) == list(range(6))
    assert [ids_of(kind, copy.sample()).tolist() for _ in range(2)] == [
        ids_of(kind, rb.sample()).tolist() for _ in range(2)
    ]
    # counters are independent; new rows written by the copy are not seen by the original
    copy.extend(make_batch(kind, 30, 2))
    assert len(copy) == 8 and len(rb) == 6
    if storage != "memmap":  # memmap storages pickle as a reference to their files (test_pickling.py)
        copy[0] = rb[1]
        assert _stored_ids(rb, kind) == list(range(6))


# -- ring buffer --------------------------------------------------------------------------------------------


def _expected_ring(total: int, capacity: int) -> list[int]:
    """Which id each position holds after writing ids 0..total-1 round-robin."""
    return [max(k for k in range(total) if k % capacity == p) for p in range(min(total, capacity))]


@grid
@storages
@pytest.mark.parametrize("chunk", [1, 4])
def test_ring_buffer_keeps_the_last_items(storage, kind, writer, chunk):
    capacity, total = 10, 25
    rb = make_buffer(storage=storage, sampler="random", kind=kind, writer=writer, batch_size=4, capacity=capacity)
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        if n == 1 and chunk == 1:
            rb.add(make_item(kind, start))
        else:
            rb.extend(make_batch(kind, start, n))
    assert len(rb) == capacity
    assert rb.writer.cursor == total % capacity
    assert rb.write_count == total
    assert _stored_ids(rb, kind) == _expected_ring(total, capacity)
    assert set(ids_of(kind, rb.sample(50)).tolist()) <= set(range(total - capacity, total))


@grid
@pytest.mark.parametrize("storage", ["tensor", "lazy", "memmap"])
@pytest.mark.parametrize("filled", [0, 4])
def test_extend_larger_than_capacity_keeps_the_last_items(storage, kind, writer, filled):
    capacity = 10
    rb = make_buffer(storage=storage, sampler="random", kind=kind, writer=writer, batch_size=4, capacity=capacity)
    if filled:
        rb.extend(make_batch(kind, 0, filled))
    index = rb.extend(make_batch(kind, filled, 23))
    total = filled + 23
    assert index.tolist() == [(filled + i) % capacity for i in range(23)]
    assert len(rb) == capacity
    assert rb.writer.cursor == total % capacity
    assert _stored_ids(rb, kind) == _expected_ring(total, capacity)


@pytest.mark.parametrize("filled", [0, 4])
def test_list_storage_extend_larger_than_capacity_keeps_the_last_items(filled):
    capacity = 10
    rb = ReplayBuffer(storage=ListStorage(capacity))
    if filled:
        rb.extend(torch.arange(filled))
    rb.extend(torch.arange(filled, filled + 23))
    assert len(rb) == capacity
    assert rb[:].tolist() == _expected_ring(filled + 23, capacity)


# -- ndim=2 storages ([time, envs]) -------------------------------------------------------------------------


def _grid_data(T: int, E: int, start_row: int = 0) -> TensorDict:
    """[T, E] cells whose id is ``t * E + e`` (t counted from ``start_row``)."""
    ids = torch.arange(start_row * E, (start_row + T) * E).reshape(T, E)
    return TensorDict(obs=ids.float().unsqueeze(-1).expand(T, E, 3).clone(), id=ids, batch_size=[T, E])


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
@pytest.mark.parametrize("layout", ["time_first", "envs_first"])
def test_ndim2_extend_counts_cells_and_samples_cells(storage_cls, layout):
    T, E = 7, 4
    data = _grid_data(T, E)
    if layout == "time_first":  # [T, envs]: extend along dim 0
        rb = ReplayBuffer(storage=storage_cls(40, ndim=2), dim_extend=0, batch_size=6)
        index = rb.extend(data)
    else:  # [envs, T] (a batched collector's layout): extend along dim 1, the default for ndim=2
        rb = ReplayBuffer(storage=storage_cls(40, ndim=2), batch_size=6)
        index = rb.extend(data.transpose(0, 1).contiguous())
    assert rb.dim_extend == (0 if layout == "time_first" else 1)
    assert len(rb) == T * E
    assert rb.storage.max_size == 40 and tuple(rb.storage.shape) == (10, E)
    assert index.shape == (T * E, 2)
    assert index[:5].tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0]]
    assert torch.equal(rb[:]["id"], data["id"])
    batch, info = rb.sample(return_info=True)
    assert batch.batch_size == torch.Size([6])
    rows, envs = info["index"]
    assert torch.equal(batch["id"], rows * E + envs)
    assert (rows < T).all() and (envs < E).all()
    assert (batch["obs"] == batch["id"].float().unsqueeze(-1)).all()


def test_ndim2_ring_wraps_rows_and_flatten_gives_filled_cells():
    T, E = 7, 4
    rb = ReplayBuffer(storage=LazyTensorStorage(40, ndim=2), dim_extend=0)
    rb.extend(_grid_data(T, E))
    flat = rb.storage.flatten()
    assert flat.ndim == 1 and len(flat) == T * E
    assert flat[:]["id"].tolist() == list(range(T * E))
    assert flat[torch.tensor([5, 27])]["id"].tolist() == [5, 27]
    rb.extend(_grid_data(T, E, start_row=T))  # 14 rows into 10: rows 7, 8, 9, 0, 1, 2, 3
    assert len(rb) == 40
    assert rb.writer.cursor == 4
    first_env = rb[:]["id"][:, 0] // E
    assert first_env.tolist() == [10, 11, 12, 13, 4, 5, 6, 7, 8, 9]


def test_ndim2_sampler_without_replacement_visits_every_cell_once():
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), sampler=SamplerWithoutReplacement(), batch_size=5)
    rb.extend(torch.arange(12).reshape(4, 3).T.contiguous())  # [envs=3, T=4] -> cells of a [4, 3] grid
    batches = list(rb)
    assert [b.numel() for b in batches] == [5, 5, 2]
    assert sorted(torch.cat(batches).tolist()) == list(range(12))


def test_tensordict_buffer_writes_cell_index_for_ndim2():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=5, dim_extend=0)
    rb.extend(_grid_data(3, 4))
    batch = rb.sample()
    assert batch["index"].shape == (5, 2)
    assert torch.equal(batch["id"], batch["index"][:, 0] * 4 + batch["index"][:, 1])


# -- randomness ---------------------------------------------------------------------------------------------


@grid
@samplers
@pytest.mark.parametrize("storage", ["list", "lazy"])
def test_equal_seeds_sample_equally_and_global_rngs_untouched(storage, sampler, kind, writer):
    draws = []
    np_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    for _ in range(2):
        rb = make_buffer(storage=storage, sampler=sampler, kind=kind, writer=writer, batch_size=4, seed=7)
        rb.extend(make_batch(kind, 0, 9))
        draws.append([ids_of(kind, rb.sample()).tolist() for _ in range(5)])
    assert draws[0] == draws[1]
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1]) and after[2:] == np_state[2:]
    assert torch.equal(torch.random.get_rng_state(), torch_state)


def test_set_rng_reroutes_draws():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
    rb.extend(torch.arange(100))
    rb.set_rng(torch.Generator().manual_seed(3))
    a = rb.sample()
    rb.set_rng(torch.Generator().manual_seed(3))
    assert torch.equal(rb.sample(), a)
    assert rb.sampler._rng is rb.storage._rng is rb.writer._rng


# -- iteration and prefetch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last,expected", [(False, [4, 4, 2]), (True, [4, 4])])
def test_iter_is_finite_with_sampler_without_replacement(drop_last, expected):
    rb = ReplayBuffer(
        storage=LazyTensorStorage(20), sampler=SamplerWithoutReplacement(drop_last=drop_last), batch_size=4
    )
    rb.extend(torch.arange(10))
    for _ in range(2):  # a second pass is a new epoch
        batches = list(rb)
        assert [b.numel() for b in batches] == expected
        seen = torch.cat(batches).tolist()
        assert len(set(seen)) == len(seen)


def test_iter_is_endless_with_random_sampler():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), batch_size=4)
    rb.extend(torch.arange(10))
    it = iter(rb)
    assert all(next(it).numel() == 4 for _ in range(50))


@pytest.mark.parametrize("storage", ["list", "lazy"])
def test_prefetch_returns_stored_items(storage):
    rb = make_buffer(
        storage=storage, sampler="random", kind="tensordict", batch_size=4, capacity=20, prefetch=2, seed=0
    )
    rb.extend(make_batch("tensordict", 0, 10))
    for _ in range(5):
        ids = ids_of("tensordict", rb.sample())
        assert ids.numel() == 4 and set(ids.tolist()) <= set(range(10))
    rb.extend(make_batch("tensordict", 10, 5))  # extending while prefetched samples are queued
    assert len(rb) == 15
    assert rb.sample(3).batch_size == torch.Size([3])  # another size bypasses the queue


def test_default_components_follow_torchrl():
    rb = ReplayBuffer()
    assert isinstance(rb.storage, ListStorage) and rb.storage.max_size == 1000
    assert isinstance(rb.sampler, RandomSampler) and isinstance(rb.writer, RoundRobinWriter)
    assert type(TensorDictReplayBuffer().writer).__name__ == "TensorDictRoundRobinWriter"
    assert TensorDictReplayBuffer().priority_key == "td_error"


# -- bad input ------------------------------------------------------------------------------------------------


@storages
def test_sampling_an_empty_buffer_says_to_add_data(storage):
    rb = make_buffer(storage=storage, sampler="random", kind="tensordict", batch_size=4)
    with pytest.raises(RuntimeError, match=r"empty.*rb\.add / rb\.extend"):
        rb.sample()
    assert len(rb) == 0


@pytest.mark.parametrize("batch_size", [0, -3, 2.0, "4", True])
@samplers
def test_bad_batch_size_is_refused(sampler, batch_size):
    rb = make_buffer(storage="lazy", sampler=sampler, kind="tensor", batch_size=4)
    rb.extend(make_batch("tensor", 0, 5))
    before = snapshot(rb, "tensor")
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int, got " + repr(batch_size)[:2]):
        rb.sample(batch_size)
    with pytest.raises(ValueError, match="`batch_size`"):
        ReplayBuffer(batch_size=batch_size)
    assert snapshot(rb, "tensor") == before


def test_missing_batch_size_says_where_to_pass_it():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(torch.arange(5))
    with pytest.raises(RuntimeError, match=r"batch_size not specified.*rb\.sample\(batch_size\)"):
        rb.sample()
    with pytest.raises(RuntimeError, match=r"Batch_size was not specified.*batch_size=\.\.\."):
        next(iter(rb))


def test_prefetch_without_batch_size_is_refused():
    with pytest.raises(ValueError, match=r"`prefetch`.*pass batch_size"):
        ReplayBuffer(storage=LazyTensorStorage(10), prefetch=2)


@pytest.mark.parametrize(
    "bad",
    [
        # a subset of the keys or a new key is a partial write (issue 12, test_storage_writes_torchrl_compat.py); a wrong shape
        # in a subset (with or without a new key) is still refused before any write
        TensorDict(obs=torch.ones(2, 5), batch_size=[2]),
        TensorDict({("next", "obs"): torch.ones(2, 5), "extra": torch.ones(2)}, batch_size=[2]),
        TensorDict(
            {"obs": torch.ones(2, 5), "action": torch.ones(2, dtype=torch.long), ("next", "obs"): torch.ones(2, 3),
             "done": torch.ones(2, dtype=torch.bool)},
            batch_size=[2],
        ),  # a wrong shape
    ],
    ids=["subset_wrong_shape", "new_key_and_wrong_shape", "wrong_shape"],
)
@pytest.mark.parametrize("storage", ["tensor", "lazy", "memmap"])
def test_write_of_wrong_structure_is_refused_and_changes_nothing(storage, bad):
    rb = make_buffer(storage=storage, sampler="random", kind="tensordict", batch_size=4)
    rb.extend(make_batch("tensordict", 0, 4))
    before = snapshot(rb, "tensordict")
    with pytest.raises(ValueError, match=r"(keys of the first write|Nothing was written)"):
        rb.extend(bad)
    with pytest.raises(ValueError, match=r"(keys of the first write|Nothing was written)"):
        rb.add(bad[0])
    assert snapshot(rb, "tensordict") == before
    assert rb.write_count == 4


@pytest.mark.parametrize(
    "kind,bad",
    [
        ("tensor", torch.ones(2, 5)),
        ("dict", {"obs": torch.ones(2, 3)}),
        ("dict", {"obs": torch.ones(2, 3), "nested": {"reward": torch.ones(2, 2)}}),
        ("tuple", (torch.ones(2, 3),)),
    ],
    ids=["tensor_shape", "dict_missing", "dict_shape", "tuple_missing"],
)
def test_write_of_wrong_structure_for_other_kinds_changes_nothing(kind, bad):
    rb = make_buffer(storage="lazy", sampler="random", kind=kind, batch_size=4)
    rb.extend(make_batch(kind, 0, 4))
    before = snapshot(rb, kind)
    with pytest.raises(ValueError, match=r"(same keys|Nothing was written)"):
        rb.extend(bad)
    assert snapshot(rb, kind) == before


def test_write_of_another_kind_is_a_type_error():
    rb = make_buffer(storage="lazy", sampler="random", kind="tensordict", batch_size=4)
    rb.extend(make_batch("tensordict", 0, 3))
    before = snapshot(rb, "tensordict")
    with pytest.raises(TypeError, match="holds TensorDicts; got Tensor"):
        rb.extend(torch.ones(2, 3))
    assert snapshot(rb, "tensordict") == before


@storages
@pytest.mark.parametrize("index", [5, -6, [0, 7], torch.tensor([9])])
def test_reading_out_of_range_names_the_valid_positions(storage, index):
    rb = make_buffer(storage=storage, sampler="random", kind="tensor", batch_size=4)
    rb.extend(make_batch("tensor", 0, 5))
    with pytest.raises(IndexError, match=r"out of range.*0\.\.4"):
        rb[index]


@storages
def test_writing_beyond_capacity_is_refused_and_changes_nothing(storage):
    rb = make_buffer(storage=storage, sampler="random", kind="tensor", batch_size=4, capacity=10)
    rb.extend(make_batch("tensor", 0, 5))
    before = snapshot(rb, "tensor")
    with pytest.raises(IndexError, match="11"):
        rb[torch.tensor([0, 11])] = make_batch("tensor", 50, 2)
    assert snapshot(rb, "tensor") == before


@pytest.mark.parametrize("storage", ["tensor", "lazy", "memmap"])
def test_setitem_past_the_filled_part_is_refused(storage):
    rb = make_buffer(storage=storage, sampler="random", kind="tensor", batch_size=4, capacity=10)
    rb.extend(make_batch("tensor", 0, 5))
    before = snapshot(rb, "tensor")
    with pytest.raises(IndexError, match="out of range"):
        rb[7] = make_item("tensor", 70)
    assert snapshot(rb, "tensor") == before


def test_list_storage_setitem_past_the_end_is_refused():
    rb = make_buffer(storage="list", sampler="random", kind="tensor", batch_size=4, capacity=10)
    rb.extend(make_batch("tensor", 0, 5))
    before = snapshot(rb, "tensor")
    with pytest.raises(IndexError, match="next free one"):
        rb[7] = make_item("tensor", 70)
    assert snapshot(rb, "tensor") == before


@pytest.mark.parametrize("writes", ["extend", "add", "empty"])
def test_immutable_dataset_writer_refuses_writes(writes):
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), torch.arange(4))
    rb = ReplayBuffer(storage=storage, writer=ImmutableDatasetWriter(), batch_size=2)
    with pytest.raises(RuntimeError, match=r"read-only.*writer=RoundRobinWriter\(\)"):
        if writes == "extend":
            rb.extend(torch.arange(2))
        elif writes == "add":
            rb.add(torch.tensor(1))
        else:
            rb.empty()
    assert rb[:].tolist() == [0, 1, 2, 3]
    assert set(rb.sample().tolist()) <= {0, 1, 2, 3}


@pytest.mark.parametrize("data", [torch.zeros(3, 2), {"obs": torch.zeros(3, 2)}, [torch.zeros(2)]])
def test_tensordict_buffer_refuses_non_tensordicts(data):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(make_batch("tensordict", 0, 2))
    with pytest.raises(TypeError, match=r"extend\(\) takes a TensorDict.*use ReplayBuffer"):
        rb.extend(data)
    with pytest.raises(TypeError, match=r"add\(\) takes a TensorDict"):
        rb.add(data)
    assert len(rb) == 2


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"storage": [0] * 3}, "storage"),
        ({"storage": LazyTensorStorage}, "storage"),
        ({"sampler": "random"}, "sampler"),
        ({"writer": RandomSampler()}, "writer"),
        ({"generator": 0}, "generator"),
        ({"transform": 3}, "transform"),
    ],
)
def test_wrong_component_types_are_type_errors_naming_the_argument(kwargs, name):
    with pytest.raises(TypeError, match=f"`{name}` must be"):
        ReplayBuffer(**kwargs)


@pytest.mark.parametrize("kwargs,name", [({"prefetch": -1}, "prefetch"), ({"dim_extend": -1}, "dim_extend")])
def test_bad_buffer_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}` must be"):
        ReplayBuffer(batch_size=2, **kwargs)


def test_preallocated_tensor_storage_in_a_buffer_samples_written_items_only():
    storage = TensorStorage(torch.full((10,), -1))
    rb = ReplayBuffer(storage=storage, batch_size=50)
    rb.empty()
    rb.extend(torch.arange(3))
    assert set(rb.sample().tolist()) <= {0, 1, 2}


def test_sample_raw_skips_the_transforms_and_keeps_the_info():
    from tensordict import TensorDict

    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4,
                                transform=lambda td: td.set("obs", td["obs"] * 0 - 1))
    rb.extend(TensorDict(obs=torch.arange(16), batch_size=[16]))
    raw, info = rb.sample_raw(return_info=True)
    assert bool((raw["obs"] >= 0).all()) and torch.equal(raw["index"], info["index"])
    assert bool((rb.sample()["obs"] == -1).all())
    with pytest.raises(ValueError, match="batch_size"):
        rb.sample_raw(0)


# -- thread safety: a buffer written by one thread while another samples (with and without prefetch) ---------------
def _chunk(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(id=ids, obs=ids.float().unsqueeze(-1).expand(n, 8).clone(), batch_size=[n])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [None, 2])
@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage, ListStorage])
def test_extend_while_sampling_keeps_every_row_whole(storage, prefetch):
    rb = TensorDictReplayBuffer(storage=storage(500), batch_size=32, prefetch=prefetch)
    rb.extend(_chunk(0, 64))
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer():
        start = 64
        try:
            # at least 40 writes (more rows than the capacity), then until sampling is over
            while (start < 64 + 16 * 40 or not stop.is_set()) and start < 50_000:
                rb.extend(_chunk(start, 16))
                start += 16
        except BaseException as err:  # noqa: BLE001 - reported to the main thread
            errors.append(err)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(300):
            batch = rb.sample()
            # a row is never half-written: its obs always matches its id
            assert (batch["obs"] == batch["id"].float().unsqueeze(-1)).all()
            assert batch.batch_size == (32,)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert len(rb) == 500  # the ring buffer filled up while sampling went on
