"""How DataLoader workers send batches back: the ``transport`` of ``rb.as_dataset()`` / ``storage.as_dataset()``.

The ring (``transport="ring"``, the default) is observed through the main process's counters
(:func:`transport_stats`): ``received`` counts batches that came through a ring, ``maps`` the rings mapped.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
import subprocess
import sys
import threading
import warnings
import weakref
from types import SimpleNamespace

import pytest
import torch
from helpers.factories import filled_buffer, make_data
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, tensordict_collate
from torchrl.data.replay_buffers.loading import worker_transport as wt
from torchrl.data.replay_buffers.loading.worker_transport import transport_stats

TIMEOUT = 60
TRANSPORTS = ("ring", "consolidated", "torch")


def assert_intact(batches, batch_size: int = 8) -> None:
    assert all(isinstance(b, TensorDict) and b.batch_size == (batch_size,) for b in batches)
    assert all((b["obs"][:, 0] == b["idx"].float()).all() for b in batches)


def received_during(fn):
    """``(fn(), batches received through rings meanwhile, rings mapped meanwhile)``."""
    before = transport_stats()
    out = fn()
    after = transport_stats()
    return out, after["received"] - before["received"], after["maps"] - before["maps"]


def load(dataset, num_workers: int = 2, method: str = "fork", collate_fn=tensordict_collate, **kwargs) -> list:
    loader = DataLoader(dataset, batch_size=None, collate_fn=collate_fn, num_workers=num_workers,
                        multiprocessing_context=method, timeout=TIMEOUT, **kwargs)
    return list(loader)


# -- choosing the transport -------------------------------------------------------------------------------------
def test_unknown_transport_is_refused_with_the_choices():
    rb = filled_buffer("lazy")
    with pytest.raises(ValueError, match=r"`transport` must be one of 'ring', 'consolidated', 'torch', got 'fast'"):
        rb.as_dataset(transport="fast")
    with pytest.raises(ValueError, match="transport='torch'"):
        rb.storage.as_dataset(transport=None)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_delivers_intact_batches_and_only_the_ring_uses_rings(transport):
    rb = filled_buffer("lazy")
    batches, received, _ = received_during(lambda: load(rb.as_dataset(num_batches=8, transport=transport)))
    assert len(batches) == 8
    assert_intact(batches)
    assert received == (8 if transport == "ring" else 0)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_storage_dataset_batches_use_its_transport(transport):
    storage = filled_buffer("lazy").storage
    loader = DataLoader(storage.as_dataset(transport=transport), batch_size=16, shuffle=True,
                        collate_fn=tensordict_collate, num_workers=2, multiprocessing_context="fork",
                        timeout=TIMEOUT)
    batches, received, _ = received_during(lambda: list(loader))
    assert sorted(torch.cat([b["idx"] for b in batches]).tolist()) == list(range(64))
    assert_intact(batches, 16)
    assert received == (4 if transport == "ring" else 0)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_ring_works_under_spawn_and_forkserver(method):
    rb = filled_buffer("memmap")
    batches, received, maps = received_during(lambda: load(rb.as_dataset(num_batches=6), method=method))
    assert len(batches) == 6
    assert_intact(batches)
    assert received == 6 and maps == 2


# -- collate functions ------------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "collate,uses_ring",
    [(lambda b: tensordict_collate(b), True), (functools.partial(tensordict_collate), True),
     (lambda b: b.clone(), False), (lambda b: tensordict_collate(b).apply(lambda t: t + 0), False)],
    ids=["lambda", "partial", "new-batch", "transformed"],
)
def test_a_wrapped_collate_keeps_the_ring_and_a_new_batch_falls_back_to_torch(collate, uses_ring):
    rb = filled_buffer("lazy")
    batches, received, _ = received_during(lambda: load(rb.as_dataset(num_batches=6), collate_fn=collate))
    assert len(batches) == 6
    assert_intact(batches)
    assert received == (6 if uses_ring else 0)


def test_tensordict_collate_is_a_pure_function_in_a_worker(monkeypatch):
    monkeypatch.setattr(wt, "get_worker_info", lambda: SimpleNamespace(id=0, num_workers=1, seed=0))
    td = make_data(4)
    assert tensordict_collate(td) is td
    assert "getframe" not in inspect.getsource(sys.modules[tensordict_collate.__module__])


def test_a_buffer_collating_with_tensordict_collate_in_a_worker_samples_data():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32), batch_size=4, collate_fn=tensordict_collate)
    rb.extend(make_data(16))
    batches = load(rb.as_dataset(num_batches=4), num_workers=1)
    assert_intact(batches, 4)


# -- loader options ---------------------------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_persistent_workers_map_their_ring_once():
    rb = filled_buffer("lazy")
    loader = DataLoader(rb.as_dataset(num_batches=6), batch_size=None, collate_fn=tensordict_collate, num_workers=2,
                        multiprocessing_context="fork", timeout=TIMEOUT, persistent_workers=True)
    epochs, received, maps = received_during(lambda: [list(loader) for _ in range(3)])
    assert [len(e) for e in epochs] == [6, 6, 6]
    for epoch in epochs:
        assert_intact(epoch)
    assert received == 18 and maps == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_pin_memory_requested_on_cpu_keeps_the_transport():
    rb = filled_buffer("lazy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: no accelerator, pinning is skipped
        batches, received, _ = received_during(lambda: load(rb.as_dataset(num_batches=6), pin_memory=True))
    assert_intact(batches)
    assert received == 6


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory needs CUDA; the CPU variant runs above")
def test_pin_memory_pins_batches_received_through_the_ring():
    rb = filled_buffer("lazy")
    batches, received, _ = received_during(lambda: load(rb.as_dataset(num_batches=6), pin_memory=True))
    assert_intact(batches)
    assert received == 6  # unpickled (copied out of the ring) in torch's pin-memory thread
    assert all(b["obs"].is_pinned() and b["idx"].is_pinned() for b in batches)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_more_than_16_workers_map_each_ring_once():
    rb = filled_buffer("lazy", batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: more workers than cores
        batches, received, maps = received_during(
            lambda: load(rb.as_dataset(num_batches=60), num_workers=20, prefetch_factor=1))
    assert len(batches) == 60
    assert_intact(batches, 4)
    assert received == 60 and maps == 20  # one mapping per worker, kept for every batch after the first


@pytest.mark.skipif("worker_method" not in inspect.signature(DataLoader).parameters,
                    reason=f"torch {torch.__version__} has no thread workers (DataLoader(worker_method=...))")
@pytest.mark.timeout(120)
def test_thread_workers_get_batches_not_ring_messages():
    rb = filled_buffer("lazy")
    loader = DataLoader(rb.as_dataset(num_batches=6), batch_size=None, collate_fn=tensordict_collate,
                        num_workers=2, worker_method="thread", timeout=TIMEOUT)
    batches, received, _ = received_during(lambda: list(loader))
    assert_intact(batches)
    assert received == 0


@pytest.mark.parametrize("worker_method,marked", [("thread", False), ("multiprocessing", True), (None, False)])
def test_only_worker_processes_mark_batches_for_the_ring(monkeypatch, worker_method, marked):
    info = SimpleNamespace(id=0, num_workers=1, seed=0, worker_method=worker_method)
    monkeypatch.setattr(wt, "get_worker_info", lambda: info)
    sender = wt._RingSender()
    monkeypatch.setattr(wt, "_SENDER", sender)
    monkeypatch.setattr(sender, "mark", lambda batch: seen.append(batch))
    seen = []
    td = make_data(4)
    assert wt.prepare_batch(td, "ring") is td
    assert (seen == [td]) is marked
    consolidated = wt.prepare_batch(td, "consolidated")
    assert consolidated.is_consolidated() is marked


# -- the ring itself --------------------------------------------------------------------------------------------
def receive(message):
    return wt._receive(*message)


def test_batch_ring_round_trip_and_slot_reuse():
    ring = wt.BatchRing.for_batch(make_data(8))
    messages = [ring.put(make_data(8, start=10 * i)) for i in range(ring.slots)]
    assert all(m is not None for m in messages)
    assert ring.put(make_data(8)) is None  # every slot in flight: the batch travels torch's way
    received = receive(messages[0])  # receiving copies the slot out and frees it
    assert received["idx"].tolist() == list(range(8))
    assert_intact([received])
    again = ring.put(make_data(8, start=100))  # the freed slot is reused
    assert receive(again)["idx"].tolist() == list(range(100, 108))
    assert receive(messages[1])["idx"].tolist() == list(range(10, 18))  # untouched


def test_batch_ring_refuses_what_it_cannot_carry():
    ring = wt.BatchRing.for_batch(make_data(8))
    assert ring.put(make_data(4)) is None  # another shape
    assert ring.put(TensorDict(obs=torch.zeros(8, 3), batch_size=[8])) is None  # other keys
    lazy = tensordict_collate([TensorDict(x=torch.zeros(2)), TensorDict(x=torch.zeros(3))])
    for batch in (lazy, TensorDict(x=torch.zeros(2), s="text", batch_size=[]), torch.zeros(4, 2)):
        assert wt.BatchRing.for_batch(batch) is None


def test_batch_ring_carries_every_dtype_nested_keys_and_views():
    td = TensorDict({"b": torch.rand(4, 3) > 0.5, "h": torch.randn(4, 2).bfloat16(),
                     ("n", "d"): torch.randn(4).double(), "e": torch.zeros(4, 0),
                     "t": torch.randn(3, 4).t()}, batch_size=[4])  # "t" is a non-contiguous view
    ring = wt.BatchRing.for_batch(td)  # held: a ring closes when it is freed
    received = receive(ring.put(td))
    assert set(received.keys(True, True)) == set(td.keys(True, True))
    assert all(torch.equal(received[k], td[k]) and received[k].dtype == td[k].dtype for k in td.keys(True, True))


def test_a_marked_batch_pickles_as_a_ring_message_and_others_fall_back():
    sender = wt._RingSender()
    marked, other = make_data(4), make_data(4, start=50)
    sender.pending.append(weakref.ref(marked))  # what mark() does, without registering the reducer here
    sender.fallback = lambda td: ("fallback", td)
    fn, args = sender.reduce(marked)
    assert fn is wt._receive and fn(*args)["idx"].tolist() == [0, 1, 2, 3]
    assert sender.reduce(marked)[0] == "fallback"  # a mark is used once
    assert sender.reduce(other)[0] == "fallback"


def gone_message() -> tuple:
    ring = wt.BatchRing.for_batch(make_data(4))
    args = ring.put(make_data(4))
    del ring  # the ring is closed (as when its worker exits) before the message is received
    gc.collect()
    return args


def test_a_message_whose_ring_is_gone_raises_in_the_main_thread():
    args = gone_message()
    with pytest.raises(RuntimeError, match="worker that sent it has exited"):
        receive(args)
    assert not os.path.exists(args[0])


def test_a_message_whose_ring_is_gone_fails_when_torch_pins_it_in_its_thread():
    args = gone_message()
    out = []
    thread = threading.Thread(target=lambda: out.append(receive(args)))  # like torch's pin-memory thread
    thread.start()
    thread.join()
    with pytest.raises(RuntimeError, match="worker that sent it has exited"):
        out[0].pin_memory()  # torch re-raises this in the main thread
    with pytest.raises(RuntimeError, match="worker that sent it has exited"):
        out[0]["obs"]


_KILL_SCRIPT = """
import multiprocessing as mp, os, signal, sys, time
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torchrl.data import LazyTensorStorage, ReplayBuffer, tensordict_collate

pids = mp.get_context("fork").Array("i", 2)
def record(worker_id):
    pids[worker_id] = os.getpid()

rb = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=32)
rb.extend(TensorDict(x=torch.arange(256.0), y=torch.zeros(256, 64), batch_size=[256]))
it = iter(DataLoader(rb.as_dataset(), batch_size=None, num_workers=2, collate_fn=tensordict_collate,
                     multiprocessing_context="fork", worker_init_fn=record, timeout=30))
for _ in range(6):
    next(it)
print("pids", *pids, flush=True)
os.kill(pids[0], signal.SIGKILL)
try:
    for _ in range(1000):
        next(it)
        time.sleep(0.01)
    print("no error", flush=True)
except RuntimeError as err:
    print("error", str(err).splitlines()[0], flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.slow  # a child interpreter (~3 s to import torch) and torch's detection of the dead worker
@pytest.mark.timeout(120)
def test_a_worker_killed_mid_epoch_gives_a_clear_error_and_leaves_no_file():
    before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = proc.communicate(timeout=100)
    lines = out.splitlines()
    assert lines and lines[0].startswith("pids"), err
    pids = [*lines[0].split()[1:], str(proc.pid)]
    assert lines[-1].startswith("error DataLoader worker (pid"), (lines, err[-2000:])
    assert "killed by signal" in lines[-1] or "exited unexpectedly" in lines[-1]
    # torch names its segments torch_<pid>_..., torchrl its files torchrl-<what>-<pid>-...; the ring has no name.
    # Other processes on the machine may create files meanwhile: only names with our pids count.
    new = set(os.listdir("/dev/shm")) - before
    assert not [name for name in new if any(f"_{pid}_" in name or f"-{pid}-" in name for pid in pids)], (new, pids)
