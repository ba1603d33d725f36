"""The sample pipeline of a replay buffer, after the batch size is known: one draw, and the prefetch queue.

One draw: wait for this prefetch task's turn (NOTE [prefetch epochs] in ``_prefetch.py``), then, under the
buffer's lock, ``sampler.sample(storage, B)`` -> ``(index, info)`` -> the sample unit's expansion, if any ->
``info["index"]`` (and ``"index_generation"`` for a writer that tracks generations) -> one ``storage.get``; then,
outside the lock, ``collate_fn`` -> the forward transforms -> ``pin_memory``. The buffer's ``_sample`` holds the
lock and calls :func:`wait_for_turn`, :func:`read_drawn` and :func:`finish_batch`; ``_sample_prefetched`` holds
its futures lock and calls :func:`next_prefetched`; ``shutdown`` stops the prefetch tasks with
:func:`stop_prefetching`. Every function takes what it reads as arguments.
"""

from __future__ import annotations

import concurrent.futures
import functools
import numbers

import torch

import torchrl.data.replay_buffers.replay_buffers._prefetch as _prefetch
import torchrl.data.replay_buffers.replay_buffers._readiness as _readiness


def wait_for_turn() -> _prefetch.DrawTurn | None:
    """In a prefetch task, waits until the task submitted before it drew, and returns its turn (else ``None``)."""
    turn = _prefetch.current_turn()
    if turn is not None:
        turn.wait_previous()
    return turn


def read_drawn(sampler, storage, writer, batch_size: int, *, unit, turn) -> tuple:
    """``(data, info)``: ``batch_size`` positions drawn by ``sampler`` and read from ``storage`` (call it under the
    buffer's lock); ``turn`` (of :func:`wait_for_turn`) records whether the sampler ran out and is released."""
    try:
        index, info = sampler.sample(storage, batch_size)
        if turn is not None:
            turn.ran_out = sampler.ran_out
    finally:
        if turn is not None:
            turn.release()
    if unit is not None:  # see torchrl.data.replay_buffers.sample_units
        index, info = unit.expand(index, info, storage)
    info["index"] = index
    if writer.tracks_generations:
        info["index_generation"] = writer.generations_of(index)
    data = storage.get(index) if unit is None else unit.read(storage, index)
    return data, info


def finish_batch(data, info: dict, collate_fn, transform, pin_memory: bool) -> tuple:
    """``(batch, info)``: ``data`` collated (unless one item was read), through ``transform`` (``None``: no
    transform) and pinned when ``pin_memory`` and CUDA is available."""
    if not isinstance(info["index"], int):
        data = collate_fn(data)
    if transform is not None and len(transform):
        data = transform(data)
    if pin_memory and torch.cuda.is_available() and hasattr(data, "pin_memory"):
        data = data.pin_memory()
    return data, info


def next_prefetched(buffer, queue, bs: int, now, *, capacity: int, executor, sampler, limiter, flow, counted_draw,
                    sample, previous) -> tuple:  # fmt: skip
    """``(result, ended, last_turn)``: the next batch of ``buffer``'s prefetch ``queue`` (``now(bs)`` draws one
    when it is empty), whether that draw ended the sampler's epoch, and the turn of the last task queued.

    Tops the queue up to ``capacity`` tasks run by ``executor``, each after the one before it (``previous``: the
    last turn queued so far); with a rate ``limiter``, a task is only queued when ``flow`` reserves its records at
    once, and a task cancelled before it ran gives them back. Call it under the buffer's futures lock.
    """
    if queue:
        future = queue.popleft()
        result = future.result()
        turn = getattr(future, "draw_turn", None)
        ended = None if turn is None else turn.ran_out
    else:
        result, ended = now(bs), sampler.ran_out
    while len(queue) < capacity:
        if limiter is not None and not _readiness.try_reserve_sample(buffer, flow, limiter, bs):
            break
        if limiter is None:
            draw = counted_draw
        else:  # the reservation is the draw's: a task cancelled before it ran gives it back
            draw = functools.partial(_readiness.reserved_draw, flow, sample)
        future, previous = _prefetch.submit_in_order(executor, draw, bs, previous)
        if limiter is not None:
            future.add_done_callback(_readiness.release_if_cancelled(flow, bs))
        queue.append(future)
    return result, ended, previous


def check_shutdown_timeout(timeout) -> float | None:
    """``timeout`` of ``shutdown``, checked: ``None`` or a non-negative number of seconds (ValueError otherwise)."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
    ):
        raise ValueError(f"`timeout` must be None or a non-negative number of seconds, got {timeout!r}.")
    return timeout


def stop_prefetching(pending: list, executor, timeout: float | None) -> None:
    """Waits up to ``timeout`` seconds for the ``pending`` prefetch tasks, then shuts ``executor`` down (the
    tasks not started are cancelled); the buffer has already emptied its queue."""
    if pending:
        concurrent.futures.wait(pending, timeout=timeout)
    if executor is not None:
        executor.shutdown(wait=False, cancel_futures=True)
