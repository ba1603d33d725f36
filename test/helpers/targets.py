"""Child-process targets: what a spawned child, a forked one or a DataLoader worker runs.

They live here, not in the test modules, so that a ``spawn`` child only imports this light module (and the
factories) to unpickle them: a target must stay importable by module name in a fresh interpreter.
"""

from __future__ import annotations

import gc
import os
import time

import torch

from helpers.factories import tagged_rows
from torchrl.data import RoundRobinWriter


def child_read_storage(storage, queue) -> None:
    """Sends back the content (as a list: a tensor would be lost when the child exits) and the length."""
    try:
        queue.put(("ok", storage.get(torch.arange(len(storage))).tolist(), len(storage)))
    except Exception as err:  # the parent reports it
        queue.put(("error", repr(err), -1))


def child_sample(rb, queue) -> None:
    """Sends back one batch of 4 sampled from a buffer received from the parent."""
    try:
        queue.put(("ok", rb.sample(4).tolist(), len(rb)))
    except Exception as err:
        queue.put(("error", repr(err), -1))


def child_share_and_drop(rb, queue, event) -> None:
    """Exercises a buffer shared with the parent, step by step.

    Reports the length; waits for the parent to write; reports the length and content; writes ids
    100..104 and reports the length; then drops its copy of the buffer, collects garbage and reports
    whether the memmap directory (if any) still exists.
    """
    queue.put(len(rb))
    event.wait(30)
    queue.put((len(rb), rb[:].tolist()))
    rb.extend(torch.arange(100, 105))
    queue.put(len(rb))
    path = getattr(rb.storage, "memmap_dir", None)
    del rb
    gc.collect()
    queue.put(path is None or os.path.isdir(path))


def child_write_tagged(rb, writer_id: int, batches: int, batch: int, start=None) -> None:
    """Writes ``batches`` x ``batch`` tagged rows into ``rb``; waits for ``start`` (an Event) first."""
    if start is not None:
        start.wait(30)
    for b in range(batches):
        rb.extend(tagged_rows(writer_id, b * batch, batch))


def child_hold_write_lock(rb, held, seconds: float) -> None:
    """Takes the buffer's write lock, sets ``held`` and sleeps holding it (the test kills this process)."""
    with rb.write_lock:
        held.set()
        time.sleep(seconds)


def child_extend_and_report(rb, queue) -> None:
    """Extends ``rb`` (whatever it shares with the parent) and reports the child's own view of it."""
    rb.extend(tagged_rows(7, 0, 3))
    queue.put((len(rb), rb.writer.cursor))


def child_set_priority(rb, index: int, priority: float) -> None:
    """Sets one priority of a shared prioritized buffer from another process."""
    rb.update_priority(torch.tensor([index]), torch.tensor([priority]))


def child_read_after(storage, event, queue) -> None:
    """Waits for the parent to write (``event``), then sends back the length and the first ``obs`` column."""
    try:
        event.wait(30)
        queue.put(("ok", len(storage), storage.get(torch.arange(len(storage)))["obs"][:, 0].tolist()))
    except Exception as err:  # the parent reports it
        queue.put(("error", len(storage), repr(err)))


def child_draw_and_report_sampler_state(dataset, queue, prioritized: bool) -> None:
    """A DataLoader worker's draw: samples (and sets priorities, with ``prioritized``) through the buffer of
    ``dataset``, then sends back the sampler's ``state_dict`` (pickled: its tensors may be freed when this exits)."""
    import pickle

    try:
        rb = dataset.replay_buffer
        rb.prepare_worker_copy(seed=1)
        rb.sample()
        if prioritized:  # the learner's update, made from the worker
            rb.update_priority(torch.arange(4), torch.tensor([5.0, 0.5, 2.0, 1.0]))
        queue.put(("ok", pickle.dumps(rb.sampler.state_dict())))
    except Exception as err:  # the parent reports it
        queue.put(("error", repr(err)))


# -- flow reservations of processes killed inside them (buffers/test_flow_reservations.py) ---------------------------
class PausingWriter(RoundRobinWriter):
    """A round-robin writer that, once a process set its ``pause`` (an Event), sets it inside the next write's
    ``prepare()`` (under the rate limiter's insert reservation, before the write lock) and sleeps there: a
    process to kill while it holds the reservation."""

    pause = None

    def prepare(self, data):
        if self.pause is not None:
            self.pause.set()
            time.sleep(120)
        return super().prepare(data)


class PauseOnSample:
    """A sample transform that sets ``event`` and sleeps: a draw to kill while it holds its sample reservation."""

    def __init__(self, event) -> None:
        self.event = event

    def __call__(self, data):
        self.event.set()
        time.sleep(120)
        return data


def child_extend_paused(rb, paused, n: int) -> None:
    """Extends ``rb`` (a buffer with a :class:`PausingWriter`) by ``n`` items, pausing inside the reservation."""
    rb.writer.pause = paused
    rb.extend(torch.arange(n), timeout=60.0)


def child_sample_paused(rb, paused, batch_size: int) -> None:
    """``rb.sample(batch_size, wait=True)``, pausing inside the draw (after the reservation was taken)."""
    rb.append_transform(PauseOnSample(paused))
    rb.sample(batch_size, wait=True, timeout=60.0)


def child_extend_batches(rb, batches: int, batch: int, start) -> None:
    """Waits for ``start``, then writes ``batches`` x ``batch`` items, each write waiting 30 s at most."""
    start.wait(60)
    for b in range(batches):
        rb.extend(torch.arange(b * batch, (b + 1) * batch), timeout=30.0)


def child_hold_flow_lock(rb, held, seconds: float) -> None:
    """Takes the buffer's flow lock (its readiness and rate-limiter counters), sets ``held`` and sleeps."""
    with rb._flow.lock:
        held.set()
        time.sleep(seconds)
