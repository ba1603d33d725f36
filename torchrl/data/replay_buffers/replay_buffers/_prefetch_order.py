"""The order of sampler draws in prefetch tasks, so that iterating a prefetching buffer yields one epoch.

NOTE [prefetch epochs]: prefetch tasks run in a thread pool, so without care they draw from the sampler in
any order, and the sampler's live ``ran_out`` flag says nothing about the batch the consumer is given: a
task may already have started the next epoch (and reset the flag) when the epoch's last batch is returned.
Each prefetch task therefore holds a :class:`DrawTurn`: it draws its indices only after the task submitted
before it has drawn, and records whether its own draw ended the sampler's epoch. ``ReplayBuffer.__iter__``
stops on the batch whose draw ended the epoch. Batches drawn after it stay queued for the next epoch.
"""

from __future__ import annotations

import threading


class DrawTurn:
    """The place of one prefetch task in the order of sampler draws."""

    def __init__(self, previous: DrawTurn | None):
        self._previous = previous
        self._drawn = threading.Event()
        self.ran_out: bool | None = None  # whether this task's draw ended the sampler's epoch

    def wait_previous(self) -> None:
        """Blocks until the task submitted before this one has drawn (or finished, or was cancelled)."""
        previous, self._previous = self._previous, None
        if previous is not None:
            previous._drawn.wait()

    def release(self, *_) -> None:
        """Lets the next task draw; called after the draw, and again (no-op) when the task ends."""
        self._previous = None
        self._drawn.set()


_local = threading.local()


def current_turn() -> DrawTurn | None:
    """The turn of the prefetch task running in this thread, if any."""
    return getattr(_local, "turn", None)


def run_in_turn(turn: DrawTurn, sample, batch_size: int):
    """Runs ``sample(batch_size)`` as a prefetch task holding ``turn``."""
    _local.turn = turn
    try:
        return sample(batch_size)
    finally:
        _local.turn = None
        turn.release()


def submit_in_order(executor, sample, batch_size: int, previous: DrawTurn | None):
    """Submits a prefetch task; returns ``(future, turn)``. ``future.draw_turn`` is the turn."""
    turn = DrawTurn(previous)
    future = executor.submit(run_in_turn, turn, sample, batch_size)
    future.draw_turn = turn
    future.add_done_callback(turn.release)  # also on cancel: later turns never wait for a cancelled one
    return future, turn
