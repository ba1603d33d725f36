"""Waiting on a buffer in a Ray actor without blocking the actor: the client polls, the actor never waits.

NOTE [waiting through a Ray actor]: the actor runs one call at a time (``max_concurrency=1``, the default), so a
``sample(wait=True)`` or a limited ``extend`` that waited inside the actor would stop every other client,
including the writers it waits for. A waiting call therefore stays in the caller: it sends short attempts that
never wait (:meth:`BufferHost.poll_sample <torchrl.data.replay_buffers._ray.host.BufferHost.poll_sample>`,
:meth:`~torchrl.data.replay_buffers._ray.host.BufferHost.poll_write`) and sleeps between them here, with a
backoff from :data:`FIRST_POLL_S` to :data:`MAX_POLL_S`, until one succeeds, its ``cancel_event`` is set (checked
here: an event object cannot travel to the actor) or its deadline passed. The first attempt runs the buffer's
own zero-timeout wait, so the buffer counts the call in ``sample_wait_count`` / ``insert_wait_count`` once and
writes the ``TimeoutError`` message that this module raises at the deadline, with the caller's timeout in it
(the message of a local buffer; its counters are those of the first attempt). The next attempts ask the buffer
whether it can serve first (``can_sample``, the limiter's insert rule), so they count nothing. Every attempt
is one atomic step of the actor: clients of one budget never over-draw it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torchrl.data.replay_buffers.replay_buffers._readiness import RATE_CANCELLED

__all__ = ["FIRST_POLL_S", "MAX_POLL_S", "poll_until", "with_timeout"]

#: The first pause between two attempts (seconds); it doubles up to :data:`MAX_POLL_S`.
FIRST_POLL_S = 0.001
#: The longest pause between two attempts: the latency of a wake-up, and one actor call per client per period.
MAX_POLL_S = 0.02
#: The timeout of the buffer's own attempt, as its messages write it.
_ATTEMPT_TIMEOUT = 0.0


def with_timeout(message: str, timeout: float) -> str:
    """The message of a zero-timeout attempt (:data:`_ATTEMPT_TIMEOUT`) as the caller's wait of ``timeout``
    seconds writes it."""
    return message.replace(f" {_ATTEMPT_TIMEOUT} seconds", f" {timeout} seconds")  # every mention of the wait


def poll_until(
    attempt: Callable[[bool], tuple[bool, Any, str | None]],
    *,
    timeout: float | None,
    cancel_event=None,
) -> Any:
    """Calls ``attempt(first)`` until it reports ``(True, value, _)``; returns ``value``.

    ``attempt(first)`` returns ``(done, value, message)``: ``message`` is the ``TimeoutError`` text of a refused
    first attempt. Raises ``RuntimeError`` (TorchRL's phrase) once ``cancel_event.is_set()``, and
    ``TimeoutError`` with that message once ``timeout`` seconds passed (``None``: no deadline). See
    NOTE [waiting through a Ray actor].
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = FIRST_POLL_S
    message = None
    first = True
    while True:
        if not first and cancel_event is not None and cancel_event.is_set():
            raise RATE_CANCELLED.error()
        done, value, text = attempt(first)
        if done:
            return value
        first = False
        message = text or message
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(
                with_timeout(message, timeout) if message else f"The wait did not end within {timeout} seconds."
            )
        time.sleep(delay if remaining is None else min(delay, remaining))
        delay = min(delay * 2, MAX_POLL_S)
