"""What one shard actor of a :class:`~torchrl.data.ShardedRayReplayBuffer` holds: :class:`ShardHost`.

A shard is a whole buffer in its actor, hosted as :class:`~torchrl.data.replay_buffers._ray.host.BufferHost`
hosts one (every call of a :class:`~torchrl.data.RayReplayBuffer` actor works here too); a shard adds what the
two-level draw needs (NOTE [sharded draws] in ``shards.py``): its weight (:meth:`ShardHost.summary`) and a draw
of a given count that reports the minimum its importance weights were divided by (:meth:`ShardHost.draw`).

Restarts: an actor created with ``max_restarts > 0`` that Ray restarts after its process died builds its buffer
again from the constructors, then loads its own part of the last checkpoint that ``dumps``/``loads`` recorded in
the buffer's restore pointer (``shard_checkpoint.read_restore_pointer``); without one it starts empty.
"""

from __future__ import annotations

import os

from torchrl.data.replay_buffers._ray.host import BufferHost
from torchrl.data.replay_buffers._ray.runtime import import_ray
from torchrl.data.replay_buffers._ray.shard_checkpoint import read_restore_pointer, shard_part
from torchrl.data.replay_buffers._ray.wire import encode

__all__ = ["ShardHost"]


def _was_restarted() -> bool:
    """Whether Ray restarted this actor (its process died and ``max_restarts`` allowed a new one)."""
    try:
        return bool(import_ray().get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - outside an actor (a test builds a host directly): not a restart
        return False


class ShardHost(BufferHost):
    """The object a shard actor holds: a :class:`BufferHost` (the buffer and the calls clients make), plus the
    summary and the counted draw of a sharded buffer's two-level draw.

    Args:
        replay_buffer_cls (type), args (tuple), kwargs (dict): as :class:`BufferHost` takes them.
        shard (int): this shard's number, ``0 <= shard < num_shards``.
        num_shards (int): how many shards the buffer has.
        restore_pointer (str, optional): the file naming the buffer's last checkpoint; read only when Ray
            restarts this actor (see the module docstring). Defaults to ``None``.
        budget (RateLimiter, optional): the sharded buffer's rate limiter, kept by shard 0 with the counters
            of every shard's inserts and samples (NOTE [one budget over shards]). Defaults to ``None``.
    """

    def __init__(self, replay_buffer_cls: type, args: tuple, kwargs: dict, shard: int, num_shards: int,
                 restore_pointer: str | None = None, budget=None) -> None:  # fmt: skip
        super().__init__(replay_buffer_cls, args, kwargs)
        self.shard = shard
        self.num_shards = num_shards
        self.budget = budget  # the whole buffer's rate limiter, on shard 0 only: NOTE [one budget over shards]
        self.inserts = 0
        self.samples = 0
        self.restored_from: str | None = None
        self.restore_error: str | None = None
        if restore_pointer is not None and self.buffer is not None and _was_restarted():
            self._restore(restore_pointer)

    def _restore(self, restore_pointer: str) -> None:
        try:
            manifest_path = read_restore_pointer(restore_pointer)
            if manifest_path is None:
                return  # no checkpoint yet: the restarted shard starts empty
            part = shard_part(manifest_path, self.shard, self.num_shards)
            self.buffer.loads(part)
            self.restored_from = part
        except Exception as err:  # noqa: BLE001 - reported by restart_info(); the shard starts empty
            self.restore_error = f"{type(err).__name__}: {err}"

    def pid(self) -> int:
        """The process id of the actor (tests kill it)."""
        return os.getpid()

    def restart_info(self) -> dict:
        """``{"restarted": bool, "restored_from": path or None, "restore_error": message or None}``."""
        return {"restarted": _was_restarted(), "restored_from": self.restored_from,
                "restore_error": self.restore_error}  # fmt: skip

    def summary(self) -> tuple[int, float | None, float | None, float | None]:
        """``(len, mass, q_min, beta)``: the number of rows, and for a prioritized sampler (one with
        ``priority_mass``) the sum and the smallest positive ``q`` of its items and its ``beta``; ``None`` for the
        last three with another sampler."""
        buffer = self.buffer
        length = len(buffer)
        sampler = buffer.sampler
        if not callable(getattr(sampler, "priority_mass", None)):
            return length, None, None, None
        mass, smallest = sampler.priority_mass(buffer.storage)
        return length, mass, smallest, float(sampler.beta)

    def draw(self, count: int):
        """``(batch, index, weight, q_min)``: ``count`` items sampled (and transformed) by the buffer, the batch
        encoded for the object store (``wire.encode``), their positions in this shard, their importance weights
        (``None`` without a prioritized sampler) and the minimum ``q`` those weights were divided by, read in
        the same call (the actor runs one call at a time)."""
        batch, info = self.buffer.sample(count, return_info=True)
        weight = info.get("priority_weight") if isinstance(info, dict) else None
        index = info.get("index") if isinstance(info, dict) else None
        smallest = None
        if weight is not None:
            smallest = self.buffer.sampler.priority_mass(self.buffer.storage)[1]
        return encode(batch), index, weight, smallest

    # -- NOTE [one budget over shards]: a sharded buffer's rate limiter lives here, in shard 0's actor, which
    # counts the rows written (``inserts``) and the records drawn or reserved (``samples``) through every handle.
    # A handle reserves before it acts (one atomic call of this actor) and releases what it did not use, so that
    # clients never over-draw the budget. ``size`` of a sample is the shards' total read by the draw's first
    # round trip; an insert's ``size`` is ``inserts`` (an upper bound: rows overwritten in a full buffer are not
    # subtracted). The counters start at 0 when this actor starts (or restarts) and are not checkpointed.
    def _budget_state(self, size: int) -> str:
        return f"{self.budget!r}; inserts={self.inserts}, samples={self.samples}, size={size}"

    def reserve_samples(self, n: int, size: int) -> str | None:
        """Takes ``n`` records from the budget (``None``), or returns why it cannot now."""
        if self.budget.sample_permitted(inserts=self.inserts, samples=self.samples, size=size, n=n):
            self.samples += n
            return None
        return self._budget_state(size)

    def reserve_inserts(self, n: int) -> str | None:
        """Counts ``n`` rows about to be written (``None``), or returns why the limiter refuses them now."""
        if not self.budget.blocks_inserts or self.budget.insert_permitted(
            inserts=self.inserts, samples=self.samples, size=self.inserts, n=n
        ):
            self.inserts += n
            return None
        return self._budget_state(self.inserts)

    def release(self, inserts: int = 0, samples: int = 0) -> None:
        """Gives back reservations that were not used (a write or a draw that failed)."""
        self.inserts -= inserts
        self.samples -= samples

    def budget_stats(self) -> dict:
        """The budget's counters: ``write_count``, ``samples_returned`` and the limiter's ``sample_budget``
        (``inserts * samples_per_insert - samples - min_diff``, what a draw may still take)."""
        spi = self.budget.samples_per_insert
        return {"write_count": self.inserts, "samples_returned": self.samples,
                "sample_budget": self.inserts * spi - self.samples - self.budget.min_diff,
                "samples_per_insert": spi}  # fmt: skip
