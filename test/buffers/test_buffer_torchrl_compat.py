"""TorchRL's observable behaviour of the buffers (facts §1, §6, §7 prefetch and save hooks, §8 write state).

Each test states one behaviour that code written for TorchRL relies on; see
``shared/reference/torchrl_behaviour_facts.md`` for the list.
"""

from __future__ import annotations

import pickle
import threading
import warnings
from functools import partial

import pytest
import torch
from helpers.factories import make_buffer
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.envs.transforms import Transform


def _td(n: int, start: int = 0) -> TensorDict:
    obs = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(obs=obs.unsqueeze(-1).expand(n, 3).clone(), batch_size=[n])


def _tdprb(**kwargs):
    return make_buffer(cls=TensorDictPrioritizedReplayBuffer, alpha=0.7, beta=0.5, capacity=20, **kwargs)


# -- sample(include_info=...) -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ["tdrb", "tdprb"])
@pytest.mark.parametrize("include_info", [None, True, False])
def test_include_info_is_accepted_warns_and_controls_the_info_entries(cls, include_info):
    rb = (
        _tdprb(batch_size=4)
        if cls == "tdprb"
        else TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=4)
    )
    rb.extend(_td(10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = rb.sample(include_info=include_info)
    deprecations = [
        w for w in caught if issubclass(w.category, UserWarning) and "deprecated" in str(w.message)
    ]
    assert len(deprecations) == (0 if include_info is None else 1)
    assert "index" in batch.keys()  # stored by the TensorDict writer: there either way
    if cls == "tdprb":
        assert ("priority_weight" in batch.keys()) == (include_info is not False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, info = rb.sample(return_info=True, include_info=include_info)
    assert "index" in info  # the info itself is returned either way


def test_include_info_true_expands_info_to_trajectory_items():
    rb = _tdprb(batch_size=3)
    rb.extend(
        TensorDict(obs=torch.randn(6, 4, 2), batch_size=[6, 4])
    )  # 6 items, each a trajectory of 4 steps
    with pytest.warns(UserWarning, match="deprecated"):
        batch = rb.sample(include_info=True)
    assert batch["priority_weight"].shape == batch.batch_size == torch.Size([3, 4])
    assert (batch["priority_weight"] == batch["priority_weight"][:, :1]).all()  # one value per item


def test_include_info_false_on_a_prefetching_buffer_leaves_the_info_out():
    rb = _tdprb(batch_size=4, prefetch=2)
    rb.extend(_td(10))
    rb.sample()  # fills the queue
    with pytest.warns(UserWarning, match="deprecated"):
        batch = rb.sample(include_info=False)
    assert "priority_weight" not in batch.keys()
    assert "priority_weight" in rb.sample().keys()


# -- write_all of a read of the storage ----------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [1, 2])
def test_write_all_takes_views_of_the_storage_plus_a_new_key(ndim):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10, ndim=ndim))
    rb.extend(_td(6) if ndim == 1 else _td(6).reshape(2, 3))
    data = rb.read_all_in_order()
    data["value_target"] = data["obs"].sum(-1)
    rb.write_all(data)
    assert "value_target" in rb.storage[:].keys()
    torch.testing.assert_close(rb[:]["value_target"], rb[:]["obs"].sum(-1))


def test_write_all_with_end_writes_the_first_items_only():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(_td(6))
    data = rb.read_all_in_order(end=3)
    data["obs"] = data["obs"] + 100
    rb.write_all(data, end=3)
    assert rb[:]["obs"][:, 0].tolist() == [100.0, 101.0, 102.0, 3.0, 4.0, 5.0]


def test_setitem_of_a_clone_and_of_views_is_the_same():
    a, b = (TensorDictReplayBuffer(storage=LazyTensorStorage(10)) for _ in range(2))
    for rb in (a, b):
        rb.extend(_td(5))
    read = a[:]
    read["v"] = read["obs"] * 2
    a[:] = read
    cloned = b[:].clone()
    cloned["v"] = cloned["obs"] * 2
    b[:] = cloned
    assert (a[:] == b[:]).all()


# -- factories and delayed init -----------------------------------------------------------------------------------
def test_zero_argument_callables_are_accepted_as_components():
    rb = ReplayBuffer(
        storage=partial(ListStorage, 10), sampler=RandomSampler, writer=partial(RoundRobinWriter)
    )
    assert rb.initialized and isinstance(rb.storage, ListStorage) and rb.storage.max_size == 10
    rb.extend(torch.arange(3))
    assert len(rb) == 3


def test_transform_factory_delays_init_until_the_first_extend():
    factories = {
        "storage": partial(ListStorage, 10),
        "sampler": partial(RandomSampler),
        "writer": RoundRobinWriter,
    }
    rb = ReplayBuffer(**factories, transform_factory=lambda: lambda x: x * 10, batch_size=2)
    assert not rb.initialized
    for name in ("storage", "sampler", "writer"):
        assert not hasattr(rb, f"_{name}")
        assert getattr(rb, f"_init_{name}") is factories[name]
    rb.extend(torch.arange(3))
    assert rb.initialized and isinstance(rb.storage, ListStorage)
    assert set(rb.sample().tolist()) <= {0, 10, 20}


def test_delayed_init_false_builds_at_construction_even_with_a_transform_factory():
    rb = ReplayBuffer(
        storage=partial(ListStorage, 10), transform_factory=lambda: lambda x: x, delayed_init=False
    )
    assert rb.initialized and hasattr(rb, "_storage")


def test_stats_of_a_delayed_buffer_does_not_initialise_it():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), delayed_init=True)
    stats = rb.stats()
    assert stats["initialized"] is False and stats["size"] == 0
    assert stats["capacity"] == 10 and stats["utilization"] == 0.0
    assert not rb.initialized
    rb.extend(torch.arange(3))
    stats = rb.stats()
    assert stats["initialized"] is True and stats["size"] == 3


def test_a_bad_factory_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="`storage` must be a Storage instance or a zero-argument callable"):
        ReplayBuffer(storage=LazyTensorStorage)  # needs max_size
    with pytest.raises(TypeError, match="`sampler` factory"):
        ReplayBuffer(sampler=lambda: 3)


# -- direct service backend ---------------------------------------------------------------------------------------
def test_direct_backend_client_start_and_shutdown():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2, prefetch=1)
    assert rb.client() is rb and rb.start() is rb and rb.is_alive
    rb.shutdown()
    assert not rb.is_alive
    rb.shutdown()  # no-op
    assert not rb.is_alive


# -- TorchRL's phrases ----------------------------------------------------------------------------------------------
def test_add_of_a_batched_tensordict_warns_with_torchrl_phrase():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    with pytest.warns(UserWarning, match=r"Using `add\(\)` with a TensorDict that has batch_size"):
        rb.add(TensorDict(batch_size=[1]))


def test_batch_size_errors_carry_torchrl_phrases():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(torch.arange(4))
    with pytest.raises(
        RuntimeError, match="Cannot iterate over the replay buffer. Batch_size was not specified"
    ):
        next(iter(rb))
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.sample()
    with pytest.raises(
        ValueError, match="Samplers with drop_last=True must work with a predictable batch-size"
    ):
        ReplayBuffer(sampler=SamplerWithoutReplacement(drop_last=True))


@pytest.mark.parametrize("storage", [ListStorage, LazyTensorStorage, LazyMemmapStorage])
def test_ensemble_member_with_drop_last_and_no_batch_size_fails_at_construction(storage):
    with pytest.raises(
        ValueError, match="Samplers with drop_last=True must work with a predictable batch-size"
    ):
        ReplayBufferEnsemble(
            ReplayBuffer(
                storage=storage(10), sampler=SamplerWithoutReplacement(drop_last=True), batch_size=None
            ),
            ReplayBuffer(storage=storage(10)),
        )


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer, "tdprb"])
def test_prefetch_and_shared_is_refused_with_torchrl_phrase(cls):
    build = _tdprb if cls == "tdprb" else partial(cls, storage=LazyTensorStorage(4))
    with pytest.raises(ValueError, match="Cannot share prefetched replay buffers.*prefetch=0.*shared=False"):
        build(prefetch=1, shared=True)


def test_a_huge_batch_size_names_batch_size_before_allocating():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(torch.arange(4))
    with pytest.raises(ValueError, match=r"`batch_size`=1000000000000 cannot be sampled"):
        rb.sample(10**12)
    assert rb.sample(3).shape == (3,)
    with pytest.raises(ValueError, match=r"`batch_size`=1000000000000 cannot be sampled"):
        ReplayBuffer(batch_size=10**12)


# -- prefetch queue as state ----------------------------------------------------------------------------------------
def _prefetching(seed: int, prefetch: int = 2, cls=ReplayBuffer):
    kwargs = {"alpha": 0.7, "beta": 0.5} if cls is TensorDictPrioritizedReplayBuffer else {}
    rb = cls(
        storage=LazyTensorStorage(100),
        batch_size=4,
        prefetch=prefetch,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
    rb.extend(_td(100) if cls is not ReplayBuffer else torch.arange(100))
    return rb


def _restore(how: str, source, tmp_path, cls):
    if how == "pickle":
        return pickle.loads(pickle.dumps(source))
    dest = _prefetching(1, cls=cls)
    dest.sample()  # the destination has prefetches of its own in flight
    if how == "state_dict":
        dest.load_state_dict(source.state_dict())
    else:
        source.dumps(tmp_path / "ckpt")
        dest.loads(tmp_path / "ckpt")
    return dest


@pytest.mark.parametrize("how", ["state_dict", "dumps", "pickle"])
@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer, TensorDictPrioritizedReplayBuffer])
def test_a_restored_prefetching_buffer_yields_the_source_next_batches(how, cls, tmp_path):
    source = _prefetching(0, cls=cls)
    source.sample()
    source.sample()
    dest = _restore(how, source, tmp_path, cls)
    for _ in range(4):
        (want, want_info), (got, got_info) = source.sample(return_info=True), dest.sample(return_info=True)
        assert (want == got).all()
        assert torch.equal(want_info["index"], got_info["index"])


class _RecordingLock:
    """An RLock that records whether it was held while the destination waited for its prefetches."""

    def __init__(self):
        self._lock = threading.RLock()
        self.held = 0

    def __enter__(self):
        self._lock.acquire()
        self.held += 1
        return self

    def __exit__(self, *exc):
        self.held -= 1
        self._lock.release()


def test_load_state_dict_waits_for_in_flight_prefetches_holding_the_futures_lock():
    source, dest = _prefetching(0), _prefetching(1)
    source.sample()
    dest.sample()
    lock = dest._futures_lock = _RecordingLock()
    seen = []
    for future in list(dest._prefetch_queue):  # waiting for a prefetch: future.exception() (or result())
        original = future.exception

        def exception(timeout=None, _original=original):
            seen.append(lock.held)
            return _original(timeout)

        future.exception = exception
    dest.load_state_dict(source.state_dict())
    assert len(seen) == 2 and all(held > 0 for held in seen)
    assert torch.equal(source.sample(), dest.sample())


class _Grad(Transform):
    def forward(self, data):
        return data.float().requires_grad_()


def test_a_queued_tensor_requiring_grad_comes_back_a_leaf_requiring_grad(tmp_path):
    source = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2, transform=_Grad())
    source.extend(torch.arange(10))
    source.sample()
    restored = [pickle.loads(pickle.dumps(source))]
    plain = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
    plain.load_state_dict(source.state_dict())
    restored.append(plain)
    source.dumps(tmp_path / "ckpt")
    loaded = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
    loaded.loads(tmp_path / "ckpt")
    restored.append(loaded)
    for rb in restored:
        batch = rb.sample()
        assert batch.requires_grad and batch.is_leaf


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_loading_another_prefetch_capacity_is_refused_and_keeps_the_queue(how, tmp_path):
    source = _prefetching(0, prefetch=2)
    source.sample()
    dest = _prefetching(1, prefetch=1)
    dest.sample()
    before = [f.result()[0].clone() for f in dest._prefetch_queue]
    with pytest.raises(RuntimeError, match="prefetch queue with capacity 2"):
        if how == "state_dict":
            dest.load_state_dict(source.state_dict())
        else:
            source.dumps(tmp_path / "ckpt")
            dest.loads(tmp_path / "ckpt")
    after = [f.result()[0] for f in dest._prefetch_queue]
    assert len(after) == len(before) == 1 and torch.equal(after[0], before[0])
    assert torch.equal(dest.sample(), before[0])


# -- datasets never carry prefetched batches ------------------------------------------------------------------------
def test_a_pickled_dataset_leaves_the_prefetched_batches_out():
    sizes = {}
    for prefetch in (0, 3):
        rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=64, prefetch=prefetch)
        rb.extend(torch.randn(100, 1000))
        rb.sample()
        sizes[prefetch] = len(pickle.dumps(rb.as_dataset(num_batches=2)))
        if prefetch:
            assert len(pickle.dumps(rb)) > sizes[0] + 3 * 64 * 1000 * 4  # the buffer itself keeps them
            assert len(rb._prefetch_queue) == 3  # and its queue is untouched
            copy = pickle.loads(pickle.dumps(rb.as_dataset(num_batches=2)))
            assert type(copy.replay_buffer) is ReplayBuffer and not copy.replay_buffer._prefetch_queue
            assert [batch.shape for batch in copy] == [torch.Size([64, 1000])] * 2
    assert sizes[3] < sizes[0] * 1.01  # 3 batches of 64 x 1000 floats would add 0.77 MB


# -- save hooks ---------------------------------------------------------------------------------------------------
class _Hook:
    def __init__(self, factor=1):
        self.shift = self.is_full = None
        self.calls = []
        self.factor = factor

    def __call__(self, data, path=None):
        self.calls.append(path)
        return data if self.factor == 1 else data * self.factor


def test_a_save_hook_gets_shift_and_is_full_and_its_result_is_saved(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(10))
    rb.extend(torch.arange(5))
    hook = _Hook(factor=3)
    rb.register_save_hook(hook)
    rb.dumps(tmp_path / "ckpt")
    assert hook.shift == 5 and hook.is_full is False and len(hook.calls) == 1
    fresh = ReplayBuffer(storage=LazyMemmapStorage(10))
    fresh.loads(tmp_path / "ckpt")
    assert fresh[:].tolist() == [0, 3, 6, 9, 12]
    assert rb[:].tolist() == [0, 1, 2, 3, 4]  # the buffer itself is unchanged


def test_a_save_hook_returning_another_layout_is_refused_before_saving(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(10))
    rb.extend(torch.arange(5))
    rb.register_save_hook(lambda data, path=None: torch.zeros(2, 7))
    with pytest.raises(ValueError, match="stored layout"):
        rb.dumps(tmp_path / "ckpt")
    assert rb[:].tolist() == [0, 1, 2, 3, 4] and not (tmp_path / "ckpt").exists()


# -- transforms with a write state ---------------------------------------------------------------------------------
class _WriteState(Transform):
    requires_shared_write_state = True


class _SharedWriteState(_WriteState):
    shared = False

    def share_memory_(self):
        self.shared = True
        return self


def test_share_refuses_a_write_state_transform_without_share_memory():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), transform=_WriteState())
    with pytest.raises(RuntimeError, match="write state"):
        rb.share()
    with pytest.raises(RuntimeError, match="write state"):
        ReplayBuffer(storage=LazyTensorStorage(4), transform=_WriteState(), shared=True)


@pytest.mark.parametrize("method", ["append_transform", "insert_transform"])
def test_adding_a_write_state_transform_to_a_shared_buffer(method):
    rb = ReplayBuffer(storage=LazyTensorStorage(4), shared=True)
    add = getattr(rb, method) if method == "append_transform" else partial(rb.insert_transform, 0)
    with pytest.raises(RuntimeError, match="write state"):
        add(_WriteState())
    assert len(rb.transform) == 0
    transform = _SharedWriteState()
    add(transform)
    assert transform.shared and len(rb.transform) == 1
    ReplayBuffer(storage=LazyTensorStorage(4)).append_transform(_WriteState())  # not shared: accepted


# -- add, drop_last, iteration, ensemble index (from the behaviours TorchRL code relies on, issue 12) ----------------
def test_add_of_a_batched_tensordict_warns_and_names_extend():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.warns(UserWarning, match="extend"):
        rb.add(TensorDict(a=torch.zeros(3), batch_size=[3]))


def test_drop_last_without_batch_size_is_refused_at_construction():
    with pytest.raises(ValueError, match="batch_size"):
        ReplayBuffer(storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(drop_last=True))
    ReplayBuffer(storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(drop_last=True), batch_size=2)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_iterating_with_prefetch_yields_exactly_one_epoch(prefetch):
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(), batch_size=2, prefetch=prefetch or None
    )
    rb.extend(torch.arange(10))
    for _ in range(3):  # batches prefetched past an epoch's end open the next epoch
        batches = list(rb)
        assert len(batches) == 5
        assert sorted(torch.cat(batches).tolist()) == list(range(10))


def test_ensemble_sample_index_is_a_tensordict_of_index_and_buffer_ids():
    members = []
    for offset in (0, 100):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        rb.extend(TensorDict(obs=torch.arange(5) + offset, batch_size=[5]))
        members.append(rb)
    batch, info = ReplayBufferEnsemble(*members, batch_size=6).sample(return_info=True)
    assert set(batch["index"].keys()) == {"index", "buffer_ids"}
    assert set(info["index"].keys()) == {"index", "buffer_ids"}
    ids, rows = batch["index", "buffer_ids"], batch["index", "index"]
    assert ids.shape == rows.shape == batch.batch_size
    assert torch.equal(batch["obs"], rows + 100 * ids)


# -- prefetched batches are state (from the behaviours TorchRL code relies on, issue 12) -----------------------------
def _prefetching_buffer():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100), batch_size=4, prefetch=3, generator=torch.Generator().manual_seed(0)
    )
    rb.extend(torch.arange(100))
    rb.sample()  # fills the prefetch queue
    return rb


def test_state_dict_keeps_prefetched_batches():
    rb = _prefetching_buffer()
    state = rb.state_dict()
    assert state["_prefetch_state"]["version"] == 1 and len(state["_prefetch_state"]["queue"]) == 3
    restored = ReplayBuffer(
        storage=LazyTensorStorage(100), batch_size=4, prefetch=3, generator=torch.Generator()
    )
    restored.load_state_dict(state)
    assert [restored.sample().tolist() for _ in range(6)] == [rb.sample().tolist() for _ in range(6)]
    other = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, prefetch=2)
    with pytest.raises(ValueError, match="prefetch=3"):
        other.load_state_dict(state)


def test_pickled_buffer_returns_the_same_next_batches():
    rb = _prefetching_buffer()
    copy = pickle.loads(pickle.dumps(rb))
    assert len(copy._prefetch_queue) == 3
    assert [copy.sample().tolist() for _ in range(6)] == [rb.sample().tolist() for _ in range(6)]
    worker_copy = pickle.loads(pickle.dumps(rb))
    worker_copy.prepare_worker_copy(seed=1)  # a DataLoader worker never sees the parent's prefetched batches
    assert len(worker_copy._prefetch_queue) == 0


@pytest.mark.parametrize("tensordict_items", [False, True])
def test_dumps_keeps_prefetched_batches_without_pickle(tmp_path, tensordict_items):
    def build(prefetch=3):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(100),
            batch_size=4,
            prefetch=prefetch,
            generator=torch.Generator().manual_seed(0),
        )
        data = torch.arange(100)
        rb.extend(
            TensorDict(a=data, nested={"b": data.float()}, batch_size=[100]) if tensordict_items else data
        )
        return rb

    rb = build()
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").rglob("*.pkl"))
    restored = build()
    restored.loads(tmp_path / "ckpt")
    for _ in range(6):
        (want, want_info), (got, got_info) = rb.sample(return_info=True), restored.sample(return_info=True)
        assert (want == got).all() and torch.equal(want_info["index"], got_info["index"])
    with pytest.raises(RuntimeError, match="prefetch queue with capacity 3.*prefetch=3"):  # TorchRL's type
        build(prefetch=2).loads(tmp_path / "ckpt")
