"""``ProcessLock.acquire(timeout=...)``: waits at most ``timeout`` seconds for a lock another process or thread
holds, then returns ``False`` (as ``threading.Lock.acquire``); what a call's ``timeout`` relies on to bound its wait
for a shared buffer's flow lock."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from torchrl.data.replay_buffers._shared.lock import ProcessLock


def _hold(lock, held, seconds: float) -> None:
    with lock:
        held.set()
        time.sleep(seconds)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_acquire_with_a_timeout_gives_up_on_a_lock_another_process_holds():
    lock = ProcessLock()
    ctx = mp.get_context("fork")
    held = ctx.Event()
    holder = ctx.Process(target=_hold, args=(lock, held, 30.0))
    holder.start()
    try:
        assert held.wait(30)
        begin = time.monotonic()
        assert lock.acquire(timeout=0.2) is False
        assert time.monotonic() - begin < 1.0  # a behaviour bound (0.2 s asked)
        assert lock.acquire(blocking=False) is False
        assert not lock.held
    finally:
        holder.kill()
        holder.join(30)
    assert lock.acquire(timeout=5.0) is True  # the kernel dropped the killed holder's lock
    assert lock.acquire(timeout=0.0) is True  # re-entrant: no wait
    lock.release()
    lock.release()
    assert not lock.held


def test_acquire_with_a_timeout_gives_up_on_a_lock_another_thread_holds():
    lock = ProcessLock()
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(30)
        assert lock.acquire(timeout=0.1) is False
    finally:
        done.set()
        thread.join(30)
    assert lock.acquire(timeout=1.0) is True
    lock.release()
