"""torch.utils.data adapters: StorageDataset, ReplayBufferDataset and tensordict_collate (issue 7)."""

from __future__ import annotations

import functools
import importlib
import pickle

import pytest
import torch
from helpers.factories import data_storage, filled_buffer, make_buffer, make_data
from tensordict import LazyStackedTensorDict, TensorDict
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from torchrl.data import (
    LazyTensorStorage,
    ReplayBuffer,
    ReplayBufferDataset,
    SamplerWithoutReplacement,
    StorageDataset,
    TensorDictReplayBuffer,
    TensorStorage,
    tensordict_collate,
)
from torchrl.data import RandomSampler as RBRandomSampler
from torchrl.data.replay_buffers.loading.worker_threads import check_worker_threads, uses_openmp

TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging
N = 64


STORAGES = ["list", "tensor", "lazy", "memmap"]
START_METHODS = ["fork", "spawn"]


def assert_loader_raises(loader, exc: type, match: str) -> None:
    """Iterating ``loader`` raises ``exc``; its workers are freed at once (the traceback would keep the
    DataLoader iterator alive until a later garbage collection, which then waits 5 s for each worker)."""
    with pytest.raises(exc, match=match) as info:
        list(loader)
    info.value.__traceback__ = None


def loader_kwargs(num_workers: int, start_method: str) -> dict:
    if num_workers == 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers, "multiprocessing_context": start_method, "timeout": TIMEOUT}


# -- StorageDataset ---------------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("num_workers,start_method", [(0, "fork"), (2, "fork"), (2, "spawn")])
def test_storage_dataset_grid(kind, num_workers, start_method):
    rb = filled_buffer(kind)
    loader = DataLoader(
        rb.storage.as_dataset(), batch_size=16, shuffle=True, collate_fn=tensordict_collate,
        **loader_kwargs(num_workers, start_method),
    )
    if kind == "list" and start_method == "spawn" and num_workers:
        assert_loader_raises(loader, RuntimeError, "ListStorage.*spawn")
        return
    batches = list(loader)
    assert [b.batch_size for b in batches] == [torch.Size([16])] * (N // 16)
    seen = torch.cat([b["idx"] for b in batches])
    assert sorted(seen.tolist()) == list(range(N))  # every item exactly once per epoch
    for b in batches:  # rows are intact: obs matches the row's id
        assert (b["obs"][:, 0] == b["idx"].float()).all()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_storage_dataset_forkserver():
    rb = filled_buffer("memmap")
    loader = DataLoader(rb.storage.as_dataset(), batch_size=16, shuffle=True, collate_fn=tensordict_collate,
                        **loader_kwargs(2, "forkserver"))
    assert sorted(torch.cat([b["idx"] for b in loader]).tolist()) == list(range(N))


@pytest.mark.parametrize(
    "sampler_fn",
    [
        lambda ds: RandomSampler(ds),
        lambda ds: SequentialSampler(ds),
        lambda ds: SubsetRandomSampler(range(0, len(ds), 2)),
        lambda ds: WeightedRandomSampler(torch.ones(len(ds)), num_samples=len(ds)),
        lambda ds: DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True),
    ],
    ids=["random", "sequential", "subset", "weighted", "distributed"],
)
@pytest.mark.parametrize("collate", [tensordict_collate, None], ids=["tensordict_collate", "default"])
def test_storage_dataset_with_torch_samplers(sampler_fn, collate):
    rb = filled_buffer("lazy")
    ds = rb.storage.as_dataset()
    kwargs = {} if collate is None else {"collate_fn": collate}
    batches = list(DataLoader(ds, batch_size=8, sampler=sampler_fn(ds), **kwargs))
    assert all(isinstance(b, TensorDict) and b.batch_size[0] <= 8 for b in batches)
    assert all((b["obs"][:, 0] == b["idx"].float()).all() for b in batches)


def test_storage_dataset_with_batch_sampler():
    ds = filled_buffer("memmap").storage.as_dataset()
    loader = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), batch_size=10, drop_last=True),
                        collate_fn=tensordict_collate)
    batches = list(loader)
    assert len(batches) == N // 10
    assert batches[0]["idx"].tolist() == list(range(10))


def test_default_collate_gives_the_same_result():
    ds = filled_buffer("lazy").storage.as_dataset()
    a = next(iter(DataLoader(ds, batch_size=8)))
    b = next(iter(DataLoader(ds, batch_size=8, collate_fn=tensordict_collate)))
    assert (a == b).all()


@pytest.mark.parametrize("data", ["tensor", "pytree"])
def test_storage_dataset_tensor_and_pytree_data_with_both_collates(data):
    storage = LazyTensorStorage(50)
    values = torch.arange(20.0).unsqueeze(-1)
    storage.set(torch.arange(20), values if data == "tensor" else {"x": values, "y": (values * 2,)})
    ds = storage.as_dataset()
    for collate in (None, tensordict_collate):
        kwargs = {} if collate is None else {"collate_fn": collate}
        batch = next(iter(DataLoader(ds, batch_size=5, **kwargs)))
        x = batch if data == "tensor" else batch["x"]
        assert x.shape == (5, 1) and x.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        if data == "pytree":
            assert (batch["y"][0] == 2 * x).all()


def counting_storage() -> tuple[LazyTensorStorage, list]:
    """A filled storage that records every ``get`` call."""
    calls = []

    class Counting(LazyTensorStorage):
        def get(self, index):
            calls.append(index)
            return super().get(index)

    storage = Counting(256)
    storage.set(torch.arange(N), make_data(N))
    return storage, calls


def test_getitems_calls_storage_get_once():
    storage, calls = counting_storage()
    batch = next(iter(DataLoader(storage.as_dataset(), batch_size=32, collate_fn=tensordict_collate)))
    assert batch.batch_size == (32,)
    assert len(calls) == 1


def test_storage_without_adapter_keeps_per_item_reads():
    storage, calls = counting_storage()
    assert not hasattr(storage, "__getitems__")
    assert not isinstance(storage, torch.utils.data.Dataset)
    next(iter(DataLoader(storage, batch_size=8, collate_fn=tensordict_collate)))
    assert len(calls) == 8  # one read per item: the adapter is opt-in


def test_storage_dataset_len_and_getitem():
    rb = filled_buffer("memmap", n=10)
    ds = rb.storage.as_dataset()
    assert len(ds) == 10
    assert ds[3]["idx"] == 3
    rb.extend(make_data(5, start=10))
    assert len(ds) == 15


def test_storage_dataset_rejects_ndim2_and_ensembles():
    storage = LazyTensorStorage(20, ndim=2)
    storage.set(torch.arange(5), torch.zeros(5, 2, 3))
    with pytest.raises(ValueError, match=r"storage\.flatten\(\)\.as_dataset\(\)"):
        storage.as_dataset()
    flat = storage.flatten().as_dataset()
    assert len(flat) == 10
    with pytest.raises(TypeError, match="must be a Storage"):
        StorageDataset([1, 2, 3])


def test_storage_dataset_rejects_storage_ensemble():
    ensemble_mod = pytest.importorskip("torchrl.data.replay_buffers.storages.ensemble")
    a, b = LazyTensorStorage(10), LazyTensorStorage(10)
    ensemble = ensemble_mod.StorageEnsemble(a, b)
    with pytest.raises(TypeError, match="ConcatDataset"):
        StorageDataset(ensemble)


def test_concat_dataset_of_storage_datasets():
    a, b = data_storage("lazy"), data_storage("list")
    a.set(torch.arange(10), make_data(10))
    b.set(torch.arange(10), make_data(10, start=10))
    loader = DataLoader(ConcatDataset([a.as_dataset(), b.as_dataset()]), batch_size=20,
                        collate_fn=tensordict_collate)
    batch = next(iter(loader))
    assert sorted(batch["idx"].tolist()) == list(range(20))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["tensor", "lazy", "memmap"])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_storage_dataset_workers_see_rows_written_after_start(kind, start_method):
    storage = data_storage(kind)
    with_index = kind == "tensor"  # the preallocated storage has an "index" entry
    storage.set(torch.arange(16), make_data(16, with_index=with_index))
    ds = storage.as_dataset()
    loader = DataLoader(ds, batch_size=16, num_workers=1, persistent_workers=True,
                        collate_fn=tensordict_collate, **{k: v for k, v in loader_kwargs(1, start_method).items()
                                                           if k != "num_workers"})
    first = list(loader)  # workers started and read epoch 1
    assert sorted(torch.cat([b["idx"] for b in first]).tolist()) == list(range(16))
    # overwrite existing rows and grow the storage after the workers started
    storage.set(torch.arange(32), make_data(32, start=100, with_index=with_index))
    second = torch.cat([b["idx"] for b in loader])
    assert sorted(second.tolist()) == list(range(100, 132))


# -- tensordict_collate -----------------------------------------------------------------------------------------
def test_tensordict_collate_returns_batches_unchanged():
    td = make_data(4)
    t = torch.zeros(4, 2)
    assert tensordict_collate(td) is td
    assert tensordict_collate(t) is t
    pair = (td, t)
    assert tensordict_collate(pair) is pair


def test_tensordict_collate_stacks_lists():
    dense = tensordict_collate([TensorDict(x=torch.zeros(3)), TensorDict(x=torch.ones(3))])
    assert isinstance(dense, TensorDict) and dense.batch_size == (2,)
    ragged = tensordict_collate([TensorDict(x=torch.zeros(3)), TensorDict(x=torch.ones(5))])
    assert isinstance(ragged, LazyStackedTensorDict)
    mapping = tensordict_collate([{"a": torch.zeros(2)}, {"a": torch.ones(2)}])
    assert mapping["a"].shape == (2, 2)
    tuples = tensordict_collate([(torch.zeros(2), torch.zeros(1)), (torch.ones(2), torch.ones(1))])
    assert tuples[0].shape == (2, 2) and tuples[1].shape == (2, 1)


# -- ReplayBufferDataset ----------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("num_workers,start_method", [(0, "fork"), (2, "fork"), (2, "spawn")])
def test_replay_buffer_dataset_grid(kind, num_workers, start_method):
    rb = filled_buffer(kind)
    loader = DataLoader(rb.as_dataset(num_batches=6), batch_size=None, collate_fn=tensordict_collate,
                        **loader_kwargs(num_workers, start_method))
    if kind == "list" and start_method == "spawn" and num_workers:
        assert_loader_raises(loader, RuntimeError, "ListStorage.*spawn")
        return
    batches = list(loader)
    assert len(batches) == 6
    for b in batches:
        assert b.batch_size == (8,)
        assert (b["obs"][:, 0] == b["idx"].float()).all()
        assert (b["index"] == b["idx"]).all()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("num_batches", [1, 5, 7])
def test_num_batches_is_the_total_over_workers(num_workers, num_batches):
    rb = filled_buffer("lazy")
    loader = DataLoader(rb.as_dataset(num_batches=num_batches), batch_size=None, collate_fn=tensordict_collate,
                        **loader_kwargs(num_workers, "fork"))
    assert len(list(loader)) == num_batches
    assert len(list(loader)) == num_batches  # every epoch


def test_num_batches_none_is_endless():
    rb = filled_buffer("lazy")
    it = iter(DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate))
    assert len([next(it) for _ in range(50)]) == 50
    with pytest.raises(TypeError, match="endless"):
        len(rb.as_dataset())


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["lazy", "memmap"])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_replay_buffer_dataset_workers_see_rows_written_after_start(kind, start_method):
    rb = TensorDictReplayBuffer(storage=data_storage(kind, capacity=1000), batch_size=32)
    rb.extend(make_data(8))
    it = iter(DataLoader(rb.as_dataset(), batch_size=None, collate_fn=tensordict_collate,
                         **loader_kwargs(1, start_method)))
    assert next(it)["idx"].max() < 8  # the worker is running on the first 8 rows
    rb.extend(make_data(900, start=8))
    seen_new = False
    for _ in range(20):
        if next(it)["idx"].max() >= 8:
            seen_new = True
            break
    assert seen_new


def _indices(loader) -> list[list[int]]:
    return [b["index"].tolist() for b in loader]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_workers_draw_distinct_streams_reproducibly():
    rb = filled_buffer("lazy", n=1000, generator=torch.Generator().manual_seed(0))

    def make_loader(seed, persistent=False):
        return DataLoader(rb.as_dataset(num_batches=4), batch_size=None, collate_fn=tensordict_collate,
                          num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                          generator=torch.Generator().manual_seed(seed), persistent_workers=persistent)

    a = _indices(make_loader(1))
    # batches alternate between worker 0 and worker 1: their streams differ
    assert a[0] != a[1] and a[2] != a[3]
    assert a == _indices(make_loader(1))  # a fixed DataLoader seed reproduces the stream
    assert a != _indices(make_loader(2))
    loader = make_loader(1)
    assert _indices(loader) != _indices(loader)  # epochs differ
    persistent = make_loader(1, persistent=True)
    assert _indices(persistent) != _indices(persistent)


def test_main_process_iteration_keeps_the_buffer_stream():
    rb = filled_buffer("lazy", n=1000, generator=torch.Generator().manual_seed(0))
    ds = rb.as_dataset(num_batches=3)
    a = _indices(DataLoader(ds, batch_size=None, collate_fn=tensordict_collate))
    rb.set_rng(torch.Generator().manual_seed(0))
    expected = [rb.sample()["index"].tolist() for _ in range(3)]
    assert a == expected


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_stateful_sampler_is_refused_with_workers_when_not_shared(start_method):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=SamplerWithoutReplacement(), batch_size=4)
    rb.extend(make_data(20))
    loader = DataLoader(rb.as_dataset(num_batches=2, share_sampler=False), batch_size=None,
                        collate_fn=tensordict_collate, **loader_kwargs(1, start_method))
    assert_loader_raises(
        loader, RuntimeError, r"SamplerWithoutReplacement.*share_sampler=False.*num_workers=0.*stateless sampler"
    )
    # num_workers=0 always works, and keeps the epoch semantics of the sampler
    assert len(list(DataLoader(rb.as_dataset(num_batches=5), batch_size=None,
                                collate_fn=tensordict_collate))) == 5


def test_unknown_sampler_is_assumed_stateful():
    class MySampler(RBRandomSampler.__mro__[1]):  # a direct Sampler subclass that declares nothing
        def sample(self, storage, batch_size):
            return torch.zeros(batch_size, dtype=torch.long), {}

    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=MySampler(), batch_size=2)
    rb.extend(torch.arange(5))
    loader = DataLoader(rb.as_dataset(num_batches=1), batch_size=None, collate_fn=tensordict_collate,
                        **loader_kwargs(1, "fork"))
    # it cannot share its state either (can_share_state defaults to False): the error names those that can
    assert_loader_raises(loader, RuntimeError, "MySampler.*samplers that can are PrioritizedSampler")


def test_stateful_storage_is_refused_with_workers():
    class StreamStorage(LazyTensorStorage):
        requires_shared_state = True

    rb = ReplayBuffer(storage=StreamStorage(10), batch_size=2)
    rb.extend(torch.arange(5))
    loader = DataLoader(rb.as_dataset(num_batches=1), batch_size=None, collate_fn=tensordict_collate,
                        **loader_kwargs(1, "fork"))
    assert_loader_raises(loader, RuntimeError, "storage StreamStorage")


def test_tensor_batches_pass_default_convert():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    rb.extend(torch.arange(10))
    batches = list(DataLoader(rb.as_dataset(num_batches=2), batch_size=None))
    assert [b.shape for b in batches] == [torch.Size([4])] * 2


def test_replay_buffer_dataset_bad_arguments():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(ValueError, match="batch_size=N"):
        rb.as_dataset()
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_batches"):
            rb.as_dataset(num_batches=bad)
    with pytest.raises(TypeError, match="ReplayBuffer"):
        ReplayBufferDataset(object())


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_prefetch_queue_is_not_sent_to_workers():
    rb = filled_buffer("lazy", prefetch=3)
    rb.sample()  # fills the prefetch queue
    assert len(rb._prefetch_queue) == 3
    # plain pickling of the buffer keeps the prefetched batches (issue 12, as TorchRL); a pickled dataset leaves
    # them out (issue 25: test/buffers/test_buffer_torchrl_compat.py), and a spawned worker never receives them
    state = pickle.loads(pickle.dumps(rb.as_dataset(num_batches=2)))
    assert len(state.replay_buffer._prefetch_queue) == 0
    state.replay_buffer.prepare_worker_copy(seed=0)
    assert len(state.replay_buffer._prefetch_queue) == 0
    batches = list(DataLoader(rb.as_dataset(num_batches=4), batch_size=None, collate_fn=tensordict_collate,
                              **loader_kwargs(2, "fork")))
    assert len(batches) == 4
    batches = list(DataLoader(rb.as_dataset(num_batches=4), batch_size=None, collate_fn=tensordict_collate,
                              **loader_kwargs(2, "spawn")))
    assert len(batches) == 4
    assert len(rb._prefetch_queue) == 3  # the parent's queue is untouched


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_spawn_dataloader_pickling_regressions():
    # a TensorStorage over a plain tensor, and a buffer with a generator, through a real spawn DataLoader
    rb = ReplayBuffer(storage=TensorStorage(torch.arange(100).float()), batch_size=10,
                      generator=torch.Generator().manual_seed(3))
    batches = list(DataLoader(rb.as_dataset(num_batches=4), batch_size=None, **loader_kwargs(2, "spawn")))
    assert len(batches) == 4
    for b in batches:  # the preallocated rows are the data: values are their own positions
        assert b.shape == (10,) and (b == b.round()).all() and ((b >= 0) & (b < 100)).all()
    assert not torch.equal(batches[0], batches[1])  # the two workers draw different streams


# -- the public hooks: a user's own datasets ---------------------------------------------------------------------
def test_adapters_live_beside_what_they_adapt():
    import torchrl.data.replay_buffers as rbs
    from torchrl.data.replay_buffers.loading import tensordict_collate as loading_collate
    from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset as Beside
    from torchrl.data.replay_buffers.storages.storage_dataset import StorageDataset as StorageBeside

    assert ReplayBufferDataset is Beside is rbs.ReplayBufferDataset
    assert StorageDataset is StorageBeside is rbs.StorageDataset
    assert loading_collate is tensordict_collate
    with pytest.raises(ImportError):  # the former home of the adapters is gone (issue 24)
        importlib.import_module("torchrl.data.replay_buffers.dataloader")


class PidDataset(torch.utils.data.IterableDataset):
    """A user's dataset over a buffer, built on the buffer's public hooks only."""

    def __init__(self, rb, n: int):
        if rb.stateful_component() is not None:
            raise RuntimeError(f"{rb.stateful_component()[0]} is stateful")
        self.rb, self.n, self.ready = rb, n, False

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and not self.ready:
            self.rb.prepare_worker_copy(info.seed)
            self.ready = True
        for _ in range(self.n):
            yield self.rb.sample()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_user_dataset_on_the_buffer_hooks_draws_distinct_reproducible_streams():
    rb = filled_buffer("lazy", n=1000, generator=torch.Generator().manual_seed(0))

    def run(seed):
        return _indices(DataLoader(PidDataset(rb, 2), batch_size=None, collate_fn=tensordict_collate,
                                   num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                                   generator=torch.Generator().manual_seed(seed)))

    a = run(1)
    assert len(a) == 4 and a[0] != a[1]  # the two workers were reseeded differently
    assert a == run(1) and a != run(2)
    with pytest.raises(RuntimeError, match="sampler is stateful"):
        PidDataset(ReplayBuffer(sampler=SamplerWithoutReplacement(), batch_size=2), 1)


def test_prepare_worker_copy_reseeds_and_turns_prefetch_off():
    rb = filled_buffer("lazy", n=100, prefetch=2, generator=torch.Generator().manual_seed(0))
    copy = pickle.loads(pickle.dumps(rb))
    copy.prepare_worker_copy(seed=5)
    first = copy.sample()["index"]
    copy.prepare_worker_copy(seed=5)
    assert torch.equal(copy.sample()["index"], first)
    copy.sample()
    assert len(copy._prefetch_queue) == 0  # no thread pool sampling ahead in a worker


def test_stateful_component_names_the_sampler_or_the_storage():
    assert filled_buffer("lazy").stateful_component() is None
    name, sampler = ReplayBuffer(sampler=SamplerWithoutReplacement()).stateful_component()
    assert name == "sampler" and isinstance(sampler, SamplerWithoutReplacement)

    class StreamStorage(LazyTensorStorage):
        requires_shared_state = True

    assert ReplayBuffer(storage=StreamStorage(4)).stateful_component()[0] == "storage"
    sampler.share_memory_()  # one copy of the state for every process: nothing left to refuse
    assert ReplayBuffer(sampler=sampler).stateful_component() is None


class Items(ReplayBufferDataset):
    """A subclass on the dataset hooks: batches of 4 drawn, yielded one item at a time."""

    refuse_stateful = False

    def draw(self):
        return self.replay_buffer.sample(4)

    def items(self, batch):
        yield from batch.unbind(0)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_subclass_on_draw_items_and_refuse_stateful(num_workers):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=SamplerWithoutReplacement())
    rb.extend(make_data(16))  # no batch size: draw() is overridden, so the buffer's is not needed
    ds = Items(rb, num_batches=4)
    batches = list(DataLoader(ds, batch_size=4, collate_fn=tensordict_collate, **loader_kwargs(num_workers, "fork")))
    assert [b.batch_size for b in batches] == [torch.Size([4])] * 4
    assert all((b["obs"][:, 0] == b["idx"].float()).all() for b in batches)
    # one copy of the stateful sampler (shared with the workers): one epoch covers every item once
    assert sorted(torch.cat([b["idx"] for b in batches]).tolist()) == list(range(16))


def test_replay_buffer_dataset_reads_any_object_with_the_buffer_hooks():
    class Source:
        storage, batch_size = None, 3

        def sample(self):
            return torch.zeros(3)

        def stateful_component(self):
            return None

        def prepare_worker_copy(self, seed):
            pass

    assert [b.shape for b in ReplayBufferDataset(Source(), num_batches=2)] == [torch.Size([3])] * 2
    with pytest.raises(TypeError, match=r"prepare_worker_copy\(seed\)\), got object"):
        ReplayBufferDataset(object())


# -- a forked worker with more than one torch thread is refused instead of hanging (issue 18) ----------------------
# GNU OpenMP is not fork-safe: a forked worker that raises its thread count after the parent ran a parallel
# region waits forever at its first parallel op. The datasets raise an error naming the fix instead. Each test
# gives the DataLoader a timeout, so that a regression (the check gone) fails with a timeout, not a hang.
def _openmp_worker_test(test):
    """The marks of the tests below: they start workers, get 180 s, and run where torch uses OpenMP."""
    for mark in (
        pytest.mark.multiprocess,
        pytest.mark.timeout(180),
        pytest.mark.skipif(not uses_openmp(), reason="the hang is specific to torch's OpenMP backend"),
    ):
        test = mark(test)
    return test


def _set_threads(threads: int, worker_id: int) -> None:
    torch.set_num_threads(threads)


def _threads_loader(dataset, kwargs: dict, *, workers: int, context: str, threads: int) -> DataLoader:
    """A DataLoader of ``workers`` workers started by ``context``, each setting ``threads`` torch threads."""
    return DataLoader(dataset, num_workers=workers, multiprocessing_context=context, timeout=TIMEOUT,
                      worker_init_fn=functools.partial(_set_threads, threads), collate_fn=tensordict_collate,
                      **kwargs)


def _buffer() -> ReplayBuffer:
    return make_buffer(capacity=256, batch_size=16, data=TensorDict(obs=torch.randn(256, 8, 8), batch_size=[256]))


def _use_thread_team() -> None:
    """Run a parallel region in this (the parent) process, as any training loop does before its loader."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.nn.functional.interpolate(torch.rand(32, 3, 64, 64), size=(96, 96))
    finally:
        torch.set_num_threads(previous)


def _datasets():
    rb = _buffer()
    return {
        "replay_buffer": (rb.as_dataset(num_batches=4), {"batch_size": None}),
        "storage": (rb.storage.as_dataset(), {"batch_size": 16}),
    }


@_openmp_worker_test
@pytest.mark.parametrize("kind", ["replay_buffer", "storage"])
def test_forked_worker_with_two_threads_is_refused_with_the_fix(kind):
    dataset, kwargs = _datasets()[kind]
    _use_thread_team()
    loader = _threads_loader(dataset, kwargs, workers=1, context="fork", threads=2)
    with pytest.raises(RuntimeError, match="not fork-safe") as err:
        next(iter(loader))
    message = str(err.value)
    assert type(dataset).__name__ in message
    assert "multiprocessing_context='spawn'" in message and "2 torch threads" in message


@_openmp_worker_test
@pytest.mark.parametrize("kind", ["replay_buffer", "storage"])
def test_forked_worker_with_one_thread_reads(kind):
    dataset, kwargs = _datasets()[kind]
    _use_thread_team()
    loader = _threads_loader(dataset, kwargs, workers=2, context="fork", threads=1)
    batches = list(loader)
    assert batches and all(batch.batch_size == torch.Size([16]) for batch in batches)


@_openmp_worker_test
def test_spawned_worker_may_use_two_threads():
    dataset, kwargs = _datasets()["replay_buffer"]
    _use_thread_team()
    loader = _threads_loader(dataset, kwargs, workers=1, context="spawn", threads=2)
    assert len(list(loader)) == 4


@_openmp_worker_test
def test_the_check_is_silent_outside_workers_and_for_unpickled_copies():
    rb = _buffer()
    dataset = rb.as_dataset(num_batches=1)
    check_worker_threads(dataset, origin_pid=-1)  # not a worker: nothing to check
    copy = pickle.loads(pickle.dumps(rb.storage.as_dataset()))
    assert copy.__getitems__([0, 1]).batch_size == torch.Size([2])
