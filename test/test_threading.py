"""Thread safety: a buffer written by one thread while another samples (with and without prefetch)."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, TensorDictReplayBuffer


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
