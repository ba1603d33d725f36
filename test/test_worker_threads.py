"""A forked DataLoader worker with more than one torch thread is refused instead of hanging (issue 18).

GNU OpenMP is not fork-safe: a forked worker that raises its thread count after the parent ran a parallel
region waits forever at its first parallel op. The datasets raise an error naming the fix instead. Each test
gives the DataLoader a timeout, so that a regression (the check gone) fails with a timeout, not a hang.
"""

from __future__ import annotations

import functools
import pickle

import pytest
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import LazyTensorStorage, ReplayBuffer, tensordict_collate
from torchrl.data.replay_buffers.loading.worker_threads import check_worker_threads, uses_openmp

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not uses_openmp(), reason="the hang is specific to torch's OpenMP backend"),
]

TIMEOUT = 60


def _set_threads(threads: int, worker_id: int) -> None:
    torch.set_num_threads(threads)


def _buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=16)
    rb.extend(TensorDict(obs=torch.randn(256, 8, 8), batch_size=[256]))
    return rb


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


@pytest.mark.parametrize("kind", ["replay_buffer", "storage"])
def test_forked_worker_with_two_threads_is_refused_with_the_fix(kind):
    dataset, kwargs = _datasets()[kind]
    _use_thread_team()
    loader = DataLoader(dataset, num_workers=1, multiprocessing_context="fork", timeout=TIMEOUT,
                        worker_init_fn=functools.partial(_set_threads, 2), collate_fn=tensordict_collate,
                        **kwargs)
    with pytest.raises(RuntimeError, match="not fork-safe") as err:
        next(iter(loader))
    message = str(err.value)
    assert type(dataset).__name__ in message
    assert "multiprocessing_context='spawn'" in message and "2 torch threads" in message


@pytest.mark.parametrize("kind", ["replay_buffer", "storage"])
def test_forked_worker_with_one_thread_reads(kind):
    dataset, kwargs = _datasets()[kind]
    _use_thread_team()
    loader = DataLoader(dataset, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                        worker_init_fn=functools.partial(_set_threads, 1), collate_fn=tensordict_collate,
                        **kwargs)
    batches = list(loader)
    assert batches and all(batch.batch_size == torch.Size([16]) for batch in batches)


def test_spawned_worker_may_use_two_threads():
    dataset, kwargs = _datasets()["replay_buffer"]
    _use_thread_team()
    loader = DataLoader(dataset, num_workers=1, multiprocessing_context="spawn", timeout=TIMEOUT,
                        worker_init_fn=functools.partial(_set_threads, 2), collate_fn=tensordict_collate,
                        **kwargs)
    assert len(list(loader)) == 4


def test_the_check_is_silent_outside_workers_and_for_unpickled_copies():
    rb = _buffer()
    dataset = rb.as_dataset(num_batches=1)
    check_worker_threads(dataset, origin_pid=-1)  # not a worker: nothing to check
    copy = pickle.loads(pickle.dumps(rb.storage.as_dataset()))
    assert copy.__getitems__([0, 1]).batch_size == torch.Size([2])
