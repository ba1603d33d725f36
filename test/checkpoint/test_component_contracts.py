"""The contracts every component keeps, run over every storage, sampler and writer class that ``torchrl.data``
exports: the checkpoint round trip (``dumps``/``loads`` and ``state_dict``/``load_state_dict``) and the worker copy
(``../shared/design.md``, "Sharing with worker processes").

Each class has an entry in :data:`STORAGES`, :data:`SAMPLERS` or :data:`WRITERS`: how to build it with small valid
arguments and how to give it some state. A public component added to ``torchrl.data`` without an entry fails
:func:`test_every_public_component_has_an_entry`, so the contracts keep covering every class.

Worker copies: a DataLoader worker receives its copy of a dataset through ``multiprocessing``'s pickler (spawn,
forkserver). The storage checks unpickle that copy in this process (the same object a worker unpickles) and start one
real worker per storage; the sampler checks run the draw in a real worker (forkserver), since a sampler may keep its
state in memory that only another process maps as a worker does. Every process start has a timeout.
"""

from __future__ import annotations

import inspect
import multiprocessing
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_sharer
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from helpers.assertions import assert_checkpoint_round_trip, assert_same_state, observable_state
from helpers.factories import make_buffer
from tensordict import TensorDict
from torch.utils.data import TensorDataset

import torchrl.data as data
from torchrl.data import (
    CompressedListStorage,
    ConsumingSampler,
    DatasetStorage,
    EncodedFrameStorage,
    GeometricTrajectoryWindowSampler,
    GroupSampler,
    GroupWriter,
    ImmutableDatasetWriter,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    PackedSequenceStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    PromptGroupSampler,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    Sampler,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StalenessAwareSampler,
    Storage,
    StorageEnsemble,
    StreamingSliceSampler,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
    TensorStorage,
    Writer,
    WriterEnsemble,
)

N = 12


def rows(n: int = N, start: int = 0) -> TensorDict:
    """``n`` steps holding every key a sampler of the tables reads: episodes of 4 steps (with their step counts), prompts of 4 completions,
    policy versions, rewards and done flags."""
    ids = torch.arange(start, start + n)
    done = (ids % 4 == 3).unsqueeze(-1)
    return TensorDict(
        {
            "obs": ids.float().unsqueeze(-1).expand(n, 3).clone(),
            "episode": ids // 4,
            "step_count": ids % 4,
            "query": ids // 4,
            "policy_version": ids // 6,
            "reward": (ids % 5).float(),
            ("next", "reward"): (ids % 5).float().unsqueeze(-1),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
        },
        batch_size=[n],
    )


@dataclass
class Case:
    """How to build a component with small valid arguments, and how to give it state (a write, a draw)."""

    build: Callable[[], object]
    fill: Callable[[object], None] = lambda component: None


# -- storages ----------------------------------------------------------------------------------------------------------
def _set_rows(storage) -> None:
    storage.set(torch.arange(N), rows())


def _set_tensors(storage) -> None:  # list storages keep items of any kind: plain tensors here
    storage.set(list(range(5)), [torch.full((2,), float(i)) for i in range(5)])


def _sequences(n: int = 8) -> list:  # ragged items: tokens of 1 to n tokens, a per-sequence reward and group
    return [TensorDict(tokens=torch.arange(i + 1), reward=torch.tensor(float(i)), prompt_id=torch.tensor(i // 2))
            for i in range(n)]  # fmt: skip


def _set_sequences(storage) -> None:
    storage.extend_sequences(_sequences())


def _grouped_buffer(sampler=None, writer=None):
    rb = ReplayBuffer(storage=PackedSequenceStorage(64, max_sequences=8), writer=writer or GroupWriter(),
                      sampler=sampler or GroupSampler(1))  # fmt: skip
    rb.extend(_sequences())
    rb.sample()
    return rb


STORAGES: dict[str, Case] = {
    "ListStorage": Case(lambda: ListStorage(8), _set_tensors),
    "TensorStorage": Case(lambda: TensorStorage(rows().zero_()), _set_rows),
    "LazyTensorStorage": Case(lambda: LazyTensorStorage(16), _set_rows),
    "LazyTensorStorage-ndim2": Case(
        lambda: LazyTensorStorage(12, ndim=2),
        lambda s: s.set(torch.arange(3), TensorDict(obs=torch.arange(12.0).reshape(3, 4), batch_size=[3, 4])),
    ),
    "LazyMemmapStorage": Case(lambda: LazyMemmapStorage(16), _set_rows),
    "LazyStackStorage": Case(lambda: LazyStackStorage(8), lambda s: s.set(list(range(4)), list(rows(4).unbind(0)))),
    "CompressedListStorage": Case(lambda: CompressedListStorage(8), _set_tensors),
    "EncodedFrameStorage": Case(
        lambda: EncodedFrameStorage(16, segment_frames=3),
        lambda s: s.set(torch.arange(N), rows().set("pixels", (torch.arange(N * 48) % 251).to(torch.uint8).view(N, 3, 4, 4))),
    ),
    "StorageEnsemble": Case(
        lambda: StorageEnsemble(LazyTensorStorage(8), LazyTensorStorage(8)),
        lambda s: [member.set(torch.arange(4), rows(4, 10 * i)) for i, member in enumerate(s.storages)],
    ),
    # read-only: its state is the dataset it reads, which a fresh one holds too
    "DatasetStorage": Case(lambda: DatasetStorage(TensorDataset(torch.arange(10.0), torch.arange(10) % 3))),
    "PackedSequenceStorage": Case(lambda: PackedSequenceStorage(64, max_sequences=8), lambda s: _set_sequences(s)),
}


# -- samplers: given state through a buffer (a write, priorities, a draw) ---------------------------------------------
def _primed_through_a_buffer(sampler) -> None:
    rb = make_buffer(cls=TensorDictReplayBuffer, capacity=16, sampler=sampler, batch_size=4, seed=0, data=rows())
    if isinstance(sampler, (PrioritizedSampler, PrioritizedSliceSampler)):
        rb.update_priority(torch.arange(N), torch.arange(N).float() + 1)
    rb.sample()


def _primed_ensemble(ensemble) -> None:
    ensemble[0].sample(make_buffer(capacity=16, data=rows()).storage, 4)
    ensemble[1].extend(torch.arange(N))
    ensemble[1].update_priority(torch.arange(N), torch.arange(N).float() + 1)


SAMPLERS: dict[str, Case] = {
    "RandomSampler": Case(RandomSampler, _primed_through_a_buffer),
    "SamplerWithoutReplacement": Case(SamplerWithoutReplacement, _primed_through_a_buffer),
    "SliceSampler": Case(lambda: SliceSampler(slice_len=2, traj_key="episode"), _primed_through_a_buffer),
    "SliceSamplerWithoutReplacement": Case(
        lambda: SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode"), _primed_through_a_buffer
    ),
    "SamplerEnsemble": Case(
        lambda: SamplerEnsemble(SamplerWithoutReplacement(), PrioritizedSampler(16, 0.7, 0.5)), _primed_ensemble
    ),
    "PrioritizedSampler": Case(lambda: PrioritizedSampler(16, alpha=0.7, beta=0.5), _primed_through_a_buffer),
    "PrioritizedSliceSampler": Case(
        lambda: PrioritizedSliceSampler(16, 0.7, 0.5, slice_len=2, traj_key="episode"), _primed_through_a_buffer
    ),
    "ConsumingSampler": Case(lambda: ConsumingSampler(2), _primed_through_a_buffer),
    "StalenessAwareSampler": Case(StalenessAwareSampler, lambda s: (setattr(s, "consumer_version", 2),
                                                                    _primed_through_a_buffer(s))),  # fmt: skip
    "StreamingSliceSampler": Case(lambda: StreamingSliceSampler(slice_len=2), _primed_through_a_buffer),
    "GeometricTrajectoryWindowSampler": Case(
        lambda: GeometricTrajectoryWindowSampler(1, 2, 0.5, trajectory_key="episode"), _primed_through_a_buffer
    ),
    "PromptGroupSampler": Case(
        lambda: PromptGroupSampler(samples_per_group=2, strategy="recency"), _primed_through_a_buffer
    ),
    "GroupSampler": Case(lambda: GroupSampler(1, strategy="recency"), lambda s: _grouped_buffer(sampler=s)),
}


# -- writers: registered on a storage of their own -------------------------------------------------------------------
def _registered(writer_cls: Callable[[], Writer]) -> Callable[[], Writer]:
    def build():
        writer = writer_cls()
        writer.register_storage(LazyTensorStorage(8))
        return writer

    return build


def _registered_ensemble() -> WriterEnsemble:
    members = RoundRobinWriter(), RoundRobinWriter()
    for member in members:
        member.register_storage(LazyTensorStorage(8))
    return WriterEnsemble(*members)


WRITERS: dict[str, Case] = {
    "RoundRobinWriter": Case(_registered(RoundRobinWriter), lambda w: w.extend(rows())),
    "TensorDictRoundRobinWriter": Case(_registered(TensorDictRoundRobinWriter), lambda w: w.extend(rows())),
    "TensorDictMaxValueWriter": Case(
        _registered(lambda: TensorDictMaxValueWriter(rank_key="reward")), lambda w: w.extend(rows())
    ),
    "ImmutableDatasetWriter": Case(_registered(ImmutableDatasetWriter)),  # refuses every write: no state to give
    "WriterEnsemble": Case(_registered_ensemble, lambda w: w[1].extend(torch.arange(5))),
    "GroupWriter": Case(lambda: _grouped_buffer(writer=GroupWriter(max_groups=2)).writer, lambda w: w.extend(_sequences(2))),
}

CASES = {**STORAGES, **SAMPLERS, **WRITERS}


def _public_components(base: type) -> set[str]:
    return {
        name
        for name in data.__all__
        if inspect.isclass(getattr(data, name))
        and issubclass(getattr(data, name), base)
        and getattr(data, name) is not base
    }


#: Components that need a server to be built at all: their round trips are tested beside that server.
SERVER_BACKED = {
    "StoreStorage": "rows on a redis-server: test/storages/test_store_storage.py starts one and checks dumps/loads "
    "and state_dict round trips",
}


@pytest.mark.parametrize("base, table", [(Storage, STORAGES), (Sampler, SAMPLERS), (Writer, WRITERS)],
                         ids=["storages", "samplers", "writers"])  # fmt: skip
def test_every_public_component_has_an_entry(base, table):
    classes = {name.split("-")[0] for name in table}
    missing = _public_components(base) - classes - set(SERVER_BACKED)
    assert not missing, f"add an entry (how to build it and give it state) to this file's table for {sorted(missing)}"
    assert classes <= _public_components(base), sorted(classes - _public_components(base))
    for name, case in table.items():  # each entry builds the class it is named after
        assert type(case.build()).__name__ == name.split("-")[0]


def _filled(case: Case):
    component = case.build()
    case.fill(component)
    return component


# -- the checkpoint round trip -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_dumps_and_loads_round_trip(tmp_path, name):
    assert_checkpoint_round_trip(_filled(CASES[name]), CASES[name].build, tmp_path)


@pytest.mark.parametrize("name", list(CASES))
def test_state_dict_and_load_state_dict_round_trip(name):
    component = _filled(CASES[name])
    expected = observable_state(component)
    state = component.state_dict()
    fresh = CASES[name].build()
    fresh.load_state_dict(state)
    assert_same_state(observable_state(fresh), expected, "after load_state_dict")
    fresh.load_state_dict(state)  # loading is idempotent
    assert_same_state(observable_state(fresh), expected, "after a second load_state_dict")
    assert_same_state(observable_state(component), expected, "the source after its state was taken")


# -- the worker copy ---------------------------------------------------------------------------------------------------
class _StartingProcess:
    """Stands for the process being started while its arguments are pickled: file descriptors go through the
    resource sharer, as they do for any other process."""

    @staticmethod
    def DupFd(fd):  # noqa: N802 (multiprocessing's name)
        return resource_sharer.DupFd(fd)

    @staticmethod
    def duplicate_for_child(fd):  # the child would inherit ``fd``: in this process, it is ``fd`` itself
        return fd


def worker_copy(dataset, *, spawning: bool = False):
    """What a spawn / forkserver DataLoader worker unpickles: ``dataset`` through ``multiprocessing``'s pickler
    (with ``spawning``, as while a process is being started, which is when the refusals are made)."""
    if not spawning:
        return pickle.loads(ForkingPickler.dumps(dataset))
    multiprocessing.context.set_spawning_popen(_StartingProcess())
    try:
        return pickle.loads(ForkingPickler.dumps(dataset))
    finally:
        multiprocessing.context.set_spawning_popen(None)


#: Storages whose content a worker shares (CPU tensor storages in shared memory, memory-mapped ones re-opened from
#: their files). A ListStorage is a snapshot under fork and refused under spawn; the compressed and stacked list
#: storages and a DatasetStorage (read-only) hold no shared content either.
SHARED_STORAGES = ("TensorStorage", "LazyTensorStorage", "LazyMemmapStorage")


def _buffer(storage_name: str = "LazyTensorStorage", sampler=None):
    rb = make_buffer(cls=TensorDictReplayBuffer, storage=STORAGES[storage_name].build(), sampler=sampler,
                     batch_size=4, seed=0)  # fmt: skip
    if isinstance(rb.sampler, StalenessAwareSampler):
        rb.sampler.consumer_version = 2
    rb.extend(rows(8))
    return rb


@pytest.mark.parametrize("name", SHARED_STORAGES)
def test_a_worker_copy_shares_the_storage_content(name):
    rb = _buffer(name)
    dataset = rb.as_dataset(num_batches=4)
    copy = worker_copy(dataset).replay_buffer
    assert_same_state(copy[:], rb[:], "the copy's rows")
    index = rb.extend(rows(2, 100))  # written by the main process after the copy was made: seen by the worker
    assert len(copy) == len(rb)
    assert copy.storage.get(index)["obs"][:, 0].tolist() == [100.0, 101.0]
    copy.storage.set(torch.tensor([0]), rows(1, 500))  # written through the copy: seen by the main process
    assert rb.storage.get(torch.tensor([0]))["obs"][0, 0].item() == 500.0
    storage_copy = worker_copy(rb.storage.as_dataset())  # the map-style dataset of the storage alone
    assert_same_state(storage_copy[list(range(len(rb)))], rb.storage.get(torch.arange(len(rb))), "the rows")


def test_a_list_storage_is_refused_for_a_spawned_worker():
    rb = make_buffer(storage=ListStorage(8), batch_size=4, data=torch.arange(4))
    with pytest.raises(RuntimeError, match="Cannot share a storage of type ListStorage between processes"):
        worker_copy(rb.as_dataset(num_batches=4), spawning=True)


def _sampler_kind(name: str) -> str:
    sampler = _buffer(sampler=SAMPLERS[name].build()).sampler  # some know whether they can share once they hold data
    if not sampler.requires_shared_state:
        return "stateless"
    return "shared" if sampler.can_share_state else "unshareable"


#: Ensembles sample a StorageEnsemble: they are read through a ReplayBufferEnsemble, whose members are the cases above.
#: GroupSampler draws from a PackedSequenceStorage only: its worker copies are tested in test/llm/test_packed_groups.py.
WORKER_SAMPLERS = [name for name in SAMPLERS if name not in ("SamplerEnsemble", "GroupSampler")]
#: What each process keeps of its own last draw (whether it ended an epoch, the batches left in it): not shared.
PER_PROCESS = ("_ran_out", "_remaining_batches")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", [n for n in WORKER_SAMPLERS if _sampler_kind(n) == "shared"])
def test_a_worker_copy_shares_the_sampler_state(name):
    """A draw (and a priority update) made by a worker process (forkserver) moves the main process's sampler."""
    from helpers.targets import child_draw_and_report_sampler_state

    rb = _buffer(sampler=SAMPLERS[name].build())
    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.Queue()
    prioritized = isinstance(rb.sampler, (PrioritizedSampler, PrioritizedSliceSampler))
    proc = ctx.Process(
        target=child_draw_and_report_sampler_state, args=(rb.as_dataset(num_batches=4), queue, prioritized), daemon=True
    )
    proc.start()
    try:
        status, payload = queue.get(timeout=60)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert status == "ok", payload
    worker_state = {k: v for k, v in pickle.loads(payload).items() if k not in PER_PROCESS}
    main_state = {k: v for k, v in rb.sampler.state_dict().items() if k not in PER_PROCESS}
    assert_same_state(main_state, worker_state, "the sampler state")


@pytest.mark.parametrize("name", [n for n in WORKER_SAMPLERS if _sampler_kind(n) == "stateless"])
def test_a_sampler_without_shared_state_draws_from_content_and_configuration(name):
    """Its worker copy draws what the original draws from the same generator state: nothing else to share."""
    rb = _buffer(sampler=SAMPLERS[name].build())
    copy = worker_copy(rb.as_dataset(num_batches=4)).replay_buffer
    copy.set_rng(torch.Generator().manual_seed(3))
    rb.set_rng(torch.Generator().manual_seed(3))
    assert_same_state(copy.sample(), rb.sample(), "a draw")


@pytest.mark.parametrize("name", [n for n in WORKER_SAMPLERS if _sampler_kind(n) == "unshareable"])
def test_a_sampler_that_cannot_share_its_state_is_refused_for_workers(name):
    rb = _buffer(sampler=SAMPLERS[name].build())
    with pytest.raises(RuntimeError, match=f"{type(rb.sampler).__name__} requires shared state"):
        worker_copy(rb.as_dataset(num_batches=4), spawning=True)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", SHARED_STORAGES)
def test_a_started_worker_sees_rows_written_after_it_started(name):
    """A real process (forkserver, as a DataLoader worker) holding the storage reads rows written after its start."""
    from helpers.targets import child_read_after

    ctx = multiprocessing.get_context("forkserver")
    rb = _buffer(name)
    queue, event = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=child_read_after, args=(rb.storage, event, queue), daemon=True)
    proc.start()
    try:
        rb.extend(rows(2, 100))
        event.set()
        status, length, content = queue.get(timeout=60)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert status == "ok", content
    assert length == len(rb) and content == rb.storage.get(torch.arange(len(rb)))["obs"][:, 0].tolist()
