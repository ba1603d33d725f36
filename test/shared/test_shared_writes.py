"""Several processes writing one buffer, readers racing writers, and forked copies of private buffers.

Every row written here is tagged (:func:`helpers.factories.tagged_rows`): each leaf encodes the writer id and a
sequence number, so a test can check that every row written is present exactly once and that no row mixes
two writes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch
import torch.multiprocessing as torch_mp
from helpers.factories import make_buffer, tagged_rows, torn_rows
from helpers.targets import child_extend_and_report, child_hold_write_lock, child_write_tagged
from torch.utils.data import DataLoader

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    tensordict_collate,
)
from torchrl.data.replay_buffers._shared.lock import ProcessLock
from torchrl.data.replay_buffers._shared.row_versions import RowVersions
from torchrl.data.replay_buffers.errors import TornReadError

pytestmark = pytest.mark.multiprocess

BATCHES, BATCH = 40, 3


def _shared_buffer(storage: str, capacity: int, tmp_path, **kwargs):
    if storage == "lazy":
        backing = LazyTensorStorage(capacity, **kwargs)
    else:
        backing = LazyMemmapStorage(capacity, scratch_dir=tmp_path / "rb", **kwargs)
    # a lazy storage allocates at its first write: in this process
    return make_buffer(cls=TensorDictReplayBuffer, storage=backing, batch_size=16, shared=True, data=tagged_rows(99, 0, 2))


def _run_writers(ctx, rb, n_writers: int, *, batches: int = BATCHES, timeout: float = 60) -> None:
    start = ctx.Event()
    procs = [
        ctx.Process(target=child_write_tagged, args=(rb, w, batches, BATCH, start)) for w in range(n_writers)
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} writer(s) still running after {timeout} s: a deadlock"
    assert [p.exitcode for p in procs] == [0] * n_writers


def _rows_by_tag(rb) -> list[tuple[int, int]]:
    data = rb[:]
    assert torn_rows(data) == 0, "a stored row mixes two writes"
    return list(zip(data["writer"].tolist(), data["seq"].tolist()))


GRID = [
    ("fork", "lazy", 2),
    ("fork", "memmap", 4),
    ("spawn", "memmap", 2),
    ("forkserver", "lazy", 3),
]
SLOW_GRID = [
    (method, storage, n)
    for method in ("fork", "spawn", "forkserver")
    for storage in ("lazy", "memmap")
    for n in (2, 4)
    if (method, storage, n) not in GRID
]


def _check_every_row_once(method, storage, n_writers, tmp_path):
    ctx = mp.get_context(method)
    capacity = 2 + n_writers * BATCHES * BATCH
    rb = _shared_buffer(storage, capacity, tmp_path)
    _run_writers(ctx, rb, n_writers)
    assert len(rb) == capacity
    assert rb.writer.cursor == 0 and rb.write_count == capacity
    tags = _rows_by_tag(rb)
    expected = [(99, 0), (99, 1)] + [(w, s) for w in range(n_writers) for s in range(BATCHES * BATCH)]
    assert sorted(tags) == sorted(expected)  # each row written is present exactly once


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method,storage,n_writers", GRID)
def test_every_row_written_by_several_processes_is_stored_once(method, storage, n_writers, tmp_path):
    _check_every_row_once(method, storage, n_writers, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method,storage,n_writers", SLOW_GRID)
def test_every_row_written_by_several_processes_is_stored_once_full_grid(method, storage, n_writers, tmp_path):
    _check_every_row_once(method, storage, n_writers, tmp_path)


@pytest.mark.timeout(120)
def test_torch_multiprocessing_writers_share_the_lock(tmp_path):
    _check_every_row_once_with = _run_writers
    ctx = torch_mp.get_context("forkserver")  # torch's reductions; spawn is tested with plain multiprocessing
    rb = _shared_buffer("lazy", 2 + 2 * 10 * BATCH, tmp_path)
    _check_every_row_once_with(ctx, rb, 2, batches=10)
    assert len(_rows_by_tag(rb)) == 2 + 2 * 10 * BATCH


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["lazy", "memmap"])
def test_writers_wrapping_a_full_ring_leave_no_torn_and_no_duplicate_rows(storage, tmp_path):
    rb = _shared_buffer(storage, 50, tmp_path)
    _run_writers(mp.get_context("fork"), rb, 3)
    tags = _rows_by_tag(rb)
    assert len(rb) == 50 and len(set(tags)) == 50
    assert rb.write_count == 2 + 3 * BATCHES * BATCH
    # the writer's cursor and the storage's newest row agree: one ring, advanced by every process
    assert rb.writer.cursor == rb.write_count % 50


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_a_writer_killed_while_holding_the_lock_does_not_block_the_others(method, tmp_path):
    ctx = mp.get_context(method)
    rb = _shared_buffer("memmap", 2 + 2 * BATCHES * BATCH, tmp_path)
    held = ctx.Event()
    holder = ctx.Process(target=child_hold_write_lock, args=(rb, held, 60))
    holder.start()
    assert held.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    _run_writers(ctx, rb, 2, timeout=30)
    expected = [(99, 0), (99, 1)] + [(w, s) for w in range(2) for s in range(BATCHES * BATCH)]
    assert sorted(_rows_by_tag(rb)) == sorted(expected)


@pytest.mark.timeout(120)
def test_a_writer_killed_mid_extend_leaves_consistent_rows_for_the_others(tmp_path):
    ctx = mp.get_context("fork")
    rb = _shared_buffer("lazy", 5000, tmp_path)
    victim = ctx.Process(target=child_write_tagged, args=(rb, 5, 100_000, BATCH))
    victim.start()
    deadline = time.monotonic() + 30
    while rb.write_count < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    _run_writers(ctx, rb, 2, timeout=30)
    tags = _rows_by_tag(rb)  # also asserts that no row is torn
    assert len(tags) == len(set(tags))
    survivors = {(w, s) for w, s in tags if w in (0, 1)}
    assert survivors == {(w, s) for w in (0, 1) for s in range(BATCHES * BATCH)}


# -- a forked copy of a private buffer --------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_private_buffer_sent_to_another_process(method):
    ctx = mp.get_context(method)
    rb = ReplayBuffer(storage=LazyTensorStorage(20), batch_size=4)
    rb.extend(tagged_rows(1, 0, 2))
    before = rb[:].clone()
    queue = ctx.Queue()
    child = ctx.Process(target=child_extend_and_report, args=(rb, queue))
    child.start()
    child_len, child_cursor = queue.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0 and (child_len, child_cursor) == (5, 5)
    if method == "fork":
        # the copy is private: its writes stay in the child, the parent's length and rows do not move
        assert not rb.storage.is_shared
        assert len(rb) == 2 and rb.writer.cursor == 2
        assert (rb[:] == before).all()
    else:
        # spawn/forkserver send the content through shared memory: the counters and the lock go with it
        assert rb.storage.is_shared
        assert len(rb) == 5 and rb.writer.cursor == 5
        assert _rows_by_tag(rb) == [(1, 0), (1, 1), (7, 0), (7, 1), (7, 2)]


def test_first_write_of_a_shared_lazy_storage_from_another_process_is_refused():
    storage = LazyTensorStorage(10).share_memory_()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def target():
        try:
            storage.set(torch.arange(2), tagged_rows(1, 0, 2))
        except RuntimeError as err:
            queue.put(str(err))
        else:
            queue.put("written")

    child = ctx.Process(target=target)
    child.start()
    message = queue.get(timeout=30)
    child.join(10)
    assert "holds no data yet" in message and "Write a first batch" in message


# -- readers racing a writer ------------------------------------------------------------------------------------
def _overwrite_until(rb, stop: threading.Event) -> None:
    seq = 0
    while not stop.is_set():
        rb.extend(tagged_rows(3, seq, 32))
        seq += 32


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "method,storage",
    [("fork", "lazy"), ("fork", "memmap"), ("spawn", "memmap"), pytest.param("spawn", "lazy", marks=pytest.mark.slow)],
)
def test_dataloader_workers_never_see_torn_rows_while_the_main_process_overwrites(method, storage, tmp_path):
    rb = _shared_buffer(storage, 64, tmp_path)
    rb.extend(tagged_rows(3, -64, 64))  # full ring: every later write overwrites rows the workers read
    loader = DataLoader(
        rb.as_dataset(num_batches=60), batch_size=None, num_workers=2, collate_fn=tensordict_collate,
        multiprocessing_context=method, timeout=60,
    )
    stop = threading.Event()
    writer = threading.Thread(target=_overwrite_until, args=(rb, stop))
    writer.start()
    try:
        torn = sum(torn_rows(batch) for batch in loader)
    finally:
        stop.set()
        writer.join()
    assert torn == 0


def _shared_storage_with_rows(n=8):
    storage = LazyTensorStorage(n).share_memory_()
    storage.set(torch.arange(n), tagged_rows(1, 0, n))
    return storage


def _write_behind_versions(storage, rows, new, delay: float) -> threading.Thread:
    """Starts a thread that writes ``new`` into ``rows`` as a slow writer would: mid-write for ``delay`` s."""
    versions = storage._versions
    index = torch.as_tensor(rows)
    versions.begin(index.numpy())
    backing = storage._storage
    backing["writer"][index] = new["writer"]  # half of the row: the other leaves still hold the old write

    def finish():
        time.sleep(delay)
        for key in backing.keys(include_nested=True, leaves_only=True):
            backing.get(key)[index] = new.get(key)
        versions.end()

    thread = threading.Thread(target=finish)
    thread.start()
    return thread


def test_a_read_waits_for_rows_mid_write_and_returns_them_complete():
    storage = _shared_storage_with_rows()
    thread = _write_behind_versions(storage, [2, 5], tagged_rows(4, 0, 2), delay=0.05)
    batch = storage.get(torch.tensor([0, 2, 5, 7]))
    thread.join()
    assert torn_rows(batch) == 0
    assert batch["writer"].tolist() == [1, 4, 4, 1]


def test_a_read_without_consistent_reads_can_return_a_torn_row():
    storage = _shared_storage_with_rows()
    storage.consistent_reads = False
    thread = _write_behind_versions(storage, [2], tagged_rows(4, 0, 1), delay=0.2)
    batch = storage.get(torch.tensor([2]))
    thread.join()
    assert torn_rows(batch) == 1


def test_a_row_left_mid_write_by_a_dead_writer_raises_after_the_wait(monkeypatch):
    storage = _shared_storage_with_rows()
    monkeypatch.setattr(RowVersions, "max_wait_s", 0.05)
    storage._versions.begin(3)  # a writer that died inside its write never ends it
    with pytest.raises(TornReadError, match="stayed mid-write.*consistent_reads = False"):
        storage.get(torch.tensor([1, 3]))
    assert storage.get(torch.tensor([1]))["writer"].tolist() == [1]  # other rows read as usual
    storage.set(3, tagged_rows(2, 0, 1)[0])  # the next write of the row completes it
    assert storage.get(torch.tensor([3]))["writer"].tolist() == [2]


def test_ndim2_storage_reads_check_the_rows_of_the_cells():
    storage = LazyTensorStorage(12, ndim=2).share_memory_()
    data = tagged_rows(1, 0, 12).reshape(4, 3)
    storage.set(torch.arange(4), data)
    thread = _write_behind_versions(storage, [1], tagged_rows(4, 0, 3).unsqueeze(0), delay=0.05)
    batch = storage.get((torch.tensor([0, 1, 1]), torch.tensor([2, 0, 1])))
    thread.join()
    assert torn_rows(batch) == 0 and batch["writer"].tolist() == [1, 4, 4]


# -- the lock itself ---------------------------------------------------------------------------------------------
def test_process_lock_is_reentrant_and_excludes_a_forked_child():
    lock = ProcessLock()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def child():
        queue.put(lock.acquire(blocking=False))

    with lock, lock:
        p = ctx.Process(target=child)
        p.start()
        assert queue.get(timeout=30) is False  # the parent holds it: the child cannot take it
        p.join(10)
    p = ctx.Process(target=child)
    p.start()
    assert queue.get(timeout=30) is True
    p.join(10)


def test_process_lock_release_without_acquire_is_an_error():
    with pytest.raises(RuntimeError, match="does not hold"):
        ProcessLock().release()
    lock = ProcessLock()
    lock.acquire()
    other = threading.Thread(target=lambda: errors.append(_release_error(lock)))
    errors: list = []
    other.start()
    other.join()
    assert errors == ["does not hold"]  # another thread cannot release it
    assert lock.held
    lock.release()
    assert not lock.held


def _release_error(lock) -> str:
    try:
        lock.release()
    except RuntimeError as err:
        return "does not hold" if "does not hold" in str(err) else str(err)
    return "released"


def test_lock_file_is_removed_when_its_owner_drops_it():
    lock = ProcessLock()
    path = lock.path
    assert os.path.exists(path)
    del lock
    assert not os.path.exists(path)


def test_private_storages_take_no_process_lock():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    assert not rb.storage.is_shared and repr(rb.write_lock) == "NULL_LOCK"
    rb.share()
    assert isinstance(rb.write_lock, ProcessLock) and rb.writer._counters.is_shared


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_shared_buffer_shares_its_sampler_state_with_writer_processes(method):
    from helpers.targets import child_set_priority

    from torchrl.data import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(alpha=1.0, beta=0.5, storage=LazyTensorStorage(64), batch_size=64)
    rb.extend(torch.arange(16))
    rb.share()
    assert rb.sampler.is_shared
    process = mp.get_context(method).Process(target=child_set_priority, args=(rb, 3, 1e6))
    process.start()
    process.join(timeout=100)
    assert process.exitcode == 0
    drawn = rb.sample()
    assert (drawn == 3).float().mean() > 0.9  # the priority set in the other process reached this one
