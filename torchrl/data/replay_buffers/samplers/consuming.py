"""The consuming sampler: every stored item can be drawn a bounded number of times until it is overwritten.

Data model (one slot = one row of a 1-D storage):

- ``_count[slot]``: the draws of the slot since it was last written;
- the *live list* ``_live[:_num_live]``: the slots that can still be drawn, in no particular order, with
  ``_live_pos[slot]`` its position there (``-1`` for a slot that is not live). A draw picks positions of this
  dense list, so it costs O(batch) whatever the storage size; a consumed slot leaves the list by swapping the
  list's tail into its place;
- the *free list*: the consumed slots, oldest first, in a ring ``_free_ring`` (head ``_free_head``, length
  ``_free_len``). A buffer writes new items into them before it moves its writer's cursor
  (:meth:`~torchrl.data.RoundRobinWriter.extend_free_first`), so a consuming buffer holds as many new items as
  its capacity allows before it overwrites an item that was not consumed.

A write of a slot (``mark_update``, which the writer triggers through the buffer) makes it live again with a
count of ``0`` and takes it off the free list. Every slot below ``_known_len`` was written at least once, so a
slot below it is live or free.

Sharing (:meth:`ConsumingSampler.share_memory_`): the tensors move to shared memory at their final size (the
storage's capacity, from :meth:`ConsumingSampler.reserve`), the four scalars to a
:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters`, and every public method holds one
``ProcessLock``: a draw in a DataLoader worker and a write in the main process each see and leave a consistent
state. Private samplers take a no-op lock.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_positive_int
from torchrl.data.replay_buffers._shared.counters import SharedCounters, is_spawning
from torchrl.data.replay_buffers._shared.lock import NULL_LOCK, ProcessLock
from torchrl.data.replay_buffers.errors import EpochEnded
from torchrl.data.replay_buffers.samplers.base import (
    CONSUMED_EMPTY,
    Sampler,
    check_batch_size,
    state_bool,
    state_index_tensor,
    state_int,
)

CONSUMING_NDIM = TorchRLPhrase(
    ValueError,
    "1-dimensional storages",
    "{cls} works on 1-dimensional storages, got a storage with ndim={ndim}. Use a storage built with ndim=1.",
)

__all__ = ["ConsumingSampler"]

_MIN_SLOTS = 1024


def _grown(tensor: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    out = torch.full((size,), fill, dtype=tensor.dtype)
    out[: tensor.numel()] = tensor
    return out


def distinct_positions(n: int, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """``k`` distinct positions drawn uniformly from ``range(n)`` (``k <= n``), in random order.

    For ``k`` small against ``n``, positions are drawn with replacement (a few more than ``k``, and more if
    needed) and the first ``k`` distinct values of that i.i.d. sequence, in the order they first appear, are
    returned: by symmetry, a uniformly random ordered ``k``-subset. Otherwise a permutation of ``range(n)`` is
    cut. Either way the cost stays O(k) when ``k`` is small. The random numbers come from ``generator``; the set
    operations run in numpy, whose calls on a few hundred numbers cost a fraction of torch's.
    """
    if 4 * k > n:
        return torch.randperm(n, generator=generator)[:k]
    draws = torch.randint(n, (k + 2 * k * k // n + 8,), generator=generator).numpy()
    while True:
        values, first = np.unique(draws, return_index=True)
        if values.size >= k:
            return torch.from_numpy(draws[np.sort(first)[:k]])
        extra = torch.randint(n, (k - values.size + 8,), generator=generator).numpy()
        draws = np.concatenate([draws, extra])


def _not_1d() -> ValueError:
    return ValueError(
        "ConsumingSampler tracks the items of a 1-D storage, and this one has more dimensions. Use a storage "
        "with ndim=1 (e.g. LazyTensorStorage(n) without `ndim`, or storage.flatten())."
    )


class ConsumingSampler(Sampler):
    """Draws each stored item at most ``max_sample_count`` times until it is overwritten.

    A batch holds distinct items, drawn uniformly among those not consumed yet. An item drawn
    ``max_sample_count`` times is *consumed*: it is not drawn again, and its slot joins a free list that the
    buffer's writer fills first, before it moves its cursor (so new data replaces consumed items, and an item
    that was never drawn is only overwritten once no consumed slot is left). Writing an item again (by the
    writer or ``rb[i] = ...``) makes it drawable again.

    In a :class:`~torchrl.data.ReplayBuffer`:

    - ``len(rb)`` is the number of items that can still be drawn;
    - a batch larger than that returns the items left (a short batch), and :attr:`ran_out` becomes ``True``
      once nothing is left, which ends an iteration over the buffer (``for batch in rb``); an iteration over a
      buffer with nothing left yields no batch;
    - ``rb.sample()`` with nothing left raises a ``RuntimeError``;
    - ``ReplayBuffer(consume_after_n_samples=n)`` builds this sampler with ``max_sample_count=n``.

    It needs a 1-D storage and a ring-buffer writer (:class:`~torchrl.data.RoundRobinWriter`, the default, or
    :class:`~torchrl.data.ImmutableDatasetWriter` for a fixed dataset). It refuses ``prefetch`` (a batch sampled
    ahead consumes its items before anyone receives it, and is lost with the queue) and priorities (it keeps
    none: a prioritized draw with consumption is not supported).

    Stateful: the draw counts and the free list are part of ``state_dict()``, checkpoints and pickles, and a
    private DataLoader worker's copy would consume items independently of the others
    (``requires_shared_state = True``). The state can live in shared memory (``can_share_state = True``):
    :meth:`~torchrl.data.ReplayBuffer.as_dataset` shares it (:meth:`share_memory_`), so the main process and
    every worker draw from one pool, each item at most ``max_sample_count`` times over all of them, and
    ``DataLoader(rb.as_dataset(), ...)`` (``num_batches=None``) ends once everything is consumed.

    Args:
        max_sample_count (int): how many times an item can be drawn before it is consumed. Defaults to ``1``.

    Examples:
        >>> import torch
        >>> from torchrl.data import ConsumingSampler, LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(6), sampler=ConsumingSampler(), batch_size=4)
        >>> _ = rb.extend(torch.arange(6))
        >>> first = rb.sample()
        >>> len(rb)
        2
        >>> second = rb.sample()  # the two items left
        >>> sorted(torch.cat([first, second]).tolist()), len(rb), rb.sampler.ran_out
        ([0, 1, 2, 3, 4, 5], 0, True)
        >>> _ = rb.extend(torch.tensor([10, 11]))  # written into consumed slots first: the cursor stays
        >>> rb.writer.cursor, len(rb), sorted(rb.sample().tolist())
        (0, 2, [10, 11])
    """

    requires_shared_state = True
    can_share_state = True
    consumes_items = True
    _TENSORS = ("_count", "_live", "_live_pos", "_free_ring", "_mark")

    def __init__(self, max_sample_count: int = 1):
        self.max_sample_count = check_positive_int(
            "max_sample_count", max_sample_count, hint="It is how many times an item can be drawn, e.g. 1."
        )
        self._n = SharedCounters(("known_len", "num_live", "free_head", "free_len"))
        self._lock: ProcessLock | None = None  # a cross-process lock once shared
        self._capacity: int | None = None  # slots to allocate when shared (see reserve)
        self._pinned = False
        for name in self._TENSORS:
            setattr(self, name, torch.zeros(0, dtype=torch.bool if name == "_mark" else torch.long))
        self._ran_out = False
        self._remaining_batches = 0

    # -- scalars (shared counters once shared) ------------------------------------------------------------------------
    def _scalar(name: str):  # noqa: N805 - a property factory used in the class body
        return property(lambda self: self._n[name], lambda self, value: self._n.__setitem__(name, value))

    _known_len = _scalar("known_len")
    _num_live = _scalar("num_live")
    _free_head = _scalar("free_head")
    _free_len = _scalar("free_len")
    del _scalar

    def _guard(self):
        return NULL_LOCK if self._lock is None else self._lock

    def _clear(self) -> None:
        """Forgets every slot (in place: shared tensors stay shared)."""
        self._count.zero_()
        self._live_pos.fill_(-1)
        self._n.load_dict({"known_len": 0, "num_live": 0, "free_head": 0, "free_len": 0})
        self._ran_out = False
        self._remaining_batches = 0

    # -- sharing with DataLoader workers ---------------------------------------------------------------------------
    def reserve(self, capacity: int) -> None:
        """Declares how many slots the storage can hold, so that :meth:`share_memory_` allocates them all.

        Buffers call it with their storage's capacity. A shared sampler cannot grow: a storage larger than the
        slots reserved raises a ``RuntimeError`` at its first write past them.
        """
        self._capacity = check_positive_int("capacity", capacity)

    @property
    def is_shared(self) -> bool:
        """Whether the counts, the live list and the free list live in shared memory (see :meth:`share_memory_`)."""
        return self._lock is not None

    def share_memory_(self) -> ConsumingSampler:
        """Moves the state to shared memory, in place: the main process and the processes that receive the
        sampler afterwards (DataLoader workers, under fork, spawn or forkserver) draw from one pool of items under
        a cross-process lock, so every item is drawn at most ``max_sample_count`` times over all of them, and the
        main process's writes refill it. ``rb.as_dataset()`` calls it; ``pickle``/``copy.deepcopy`` give a private
        copy. With ``num_batches=None``, a DataLoader iteration ends when nothing is left to draw.

        The slots are allocated once, for the storage's capacity (:meth:`reserve`, called by the buffer).

        Examples:
            >>> import torch
            >>> from torchrl.data import ConsumingSampler, LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=ConsumingSampler(), batch_size=2)
            >>> rb.sampler.share_memory_().is_shared
            True
        """
        if self._lock is not None:
            return self
        size = max(self._capacity or 0, self._known_len, 1)
        if self._capacity is None and self._known_len == 0:
            raise RuntimeError(
                "ConsumingSampler.share_memory_() allocates a slot per storage row and does not know the storage's "
                "capacity: use the sampler in a buffer (ReplayBuffer(storage=..., sampler=ConsumingSampler())), "
                "or call sampler.reserve(capacity) first."
            )
        self._ensure_slots(size)
        for name in self._TENSORS:
            getattr(self, name).share_memory_()
        self._n.share_memory_()
        self._lock = ProcessLock()
        return self

    def pin_epoch(self, key: int | None = None, readers: int = 1) -> None:
        """Makes :meth:`sample` raise :class:`~torchrl.data.replay_buffers.errors.EpochEnded` instead of a
        ``RuntimeError`` when nothing is left to draw, until :meth:`unpin_epoch`: a DataLoader iteration over
        ``rb.as_dataset()`` (``num_batches=None``) then ends in every worker once the items are consumed."""
        self._pinned = True

    def unpin_epoch(self) -> None:
        self._pinned = False

    def __getstate__(self):
        state = super().__getstate__()
        state["_pinned"] = False
        # a pickle or a deep copy is private: its own lock-free copy
        if self._lock is not None and not is_spawning():
            state["_lock"] = None
            for name in self._TENSORS:
                state[name] = getattr(self, name).clone()
            counters = SharedCounters(tuple(self._n.as_dict()))
            counters.load_dict(self._n.as_dict())
            state["_n"] = counters
        return state

    # -- bookkeeping (callers hold the lock) ---------------------------------------------------------------------------
    def _ensure_slots(self, size: int) -> None:
        if size <= self._count.numel():
            return
        if self._lock is not None:
            raise RuntimeError(
                f"The storage grew to {size} rows, past the {self._count.numel()} slots this shared ConsumingSampler "
                f"allocated. Reserve the storage's capacity before sharing (sampler.reserve(capacity); buffers do "
                f"it)."
            )
        size = max(size, 2 * self._count.numel(), _MIN_SLOTS)
        free = self._free_list()
        self._count = _grown(self._count, size, 0)
        self._live = _grown(self._live, size, 0)
        self._live_pos = _grown(self._live_pos, size, -1)
        self._free_ring = _grown(free, size, 0)
        self._mark = torch.zeros(size, dtype=torch.bool)
        self._free_head = 0

    def _free_list(self) -> torch.Tensor:
        """The free slots, oldest first (a copy)."""
        n = self._free_len
        if not n:
            return torch.zeros(0, dtype=torch.long)
        return self._peek_free(n)

    def _set_free_list(self, free: torch.Tensor) -> None:
        self._free_ring[: free.numel()] = free
        self._free_head, self._free_len = 0, int(free.numel())

    def _peek_free(self, k: int) -> torch.Tensor:
        k = min(int(k), self._free_len)
        if k <= 0:
            return torch.zeros(0, dtype=torch.long)
        head, cap = self._free_head, self._free_ring.numel()
        if head + k <= cap:
            return self._free_ring[head : head + k].clone()
        return self._free_ring[(head + torch.arange(k)) % cap]

    def free_slots(self, k: int) -> torch.Tensor:
        """The first ``k`` (or fewer) slots of the free list, oldest first, without taking them off the list.

        Writers call it (:meth:`~torchrl.data.RoundRobinWriter.extend_free_first`): writing a slot takes it off
        the list through :meth:`mark_update`.
        """
        with self._guard():
            return self._peek_free(k)

    @property
    def num_free(self) -> int:
        """The number of consumed slots waiting to be written."""
        return self._free_len

    def _drop_free(self, slots: torch.Tensor) -> None:
        """Takes ``slots`` (distinct free slots that were just written) off the free list."""
        r = slots.numel()
        mark = self._mark
        mark[slots] = True
        head = self._peek_free(r)
        if bool(mark[head].all()):  # the writer filled the head of the list (the usual case): O(r)
            mark[slots] = False
            self._free_head = (self._free_head + r) % self._free_ring.numel()
            self._free_len -= r
            return
        free = self._free_list()
        kept = free[~mark[free]]
        mark[slots] = False
        self._set_free_list(kept)

    def _make_live(self, slots: torch.Tensor) -> None:
        start = self._num_live
        self._live[start : start + slots.numel()] = slots
        self._live_pos[slots] = torch.arange(start, start + slots.numel())
        self._num_live = start + slots.numel()

    def _remove_live(self, positions: np.ndarray) -> None:
        """Takes the live-list entries at ``positions`` (distinct) off the list; the tail fills the holes.

        Runs on numpy views of the tensors (same memory, shared or not): a draw is a few dozen operations on a
        batch of indices, where numpy's per-call cost is a fraction of torch's.
        """
        live, live_pos, mark = self._live.numpy(), self._live_pos.numpy(), self._mark.numpy()
        num_live = self._num_live
        new_len = num_live - positions.size
        removed = live[positions]
        holes = positions[positions < new_len]
        tail = np.arange(new_len, num_live)
        mark[positions] = True  # positions < num_live <= len(mark)
        movers = tail[~mark[tail]]
        mark[positions] = False
        live_pos[removed] = -1
        if holes.size:
            moved = live[movers]
            live[holes] = moved
            live_pos[moved] = holes
        self._num_live = new_len

    def _written(self, slots: torch.Tensor) -> None:
        """Slots were written: they become live with a count of 0."""
        if not slots.numel():
            return
        top = int(slots.max()) + 1
        self._ensure_slots(top)
        self._count[slots] = 0
        new = slots[self._live_pos[slots] < 0]
        if new.numel() > 1:  # keep one of each slot, in order, without sorting
            order = torch.arange(new.numel())
            first = torch.full((top,), new.numel(), dtype=torch.long).scatter_reduce_(0, new, order, "amin")
            new = new[first[new] == order]
        known = self._known_len
        if new.numel():
            was_free = new[new < known]  # below _known_len, a slot that is not live is free
            if was_free.numel():
                self._drop_free(was_free)
            self._make_live(new)
        if top > known:
            self._known_len = top

    def _sync(self, storage) -> None:
        """Follows a storage whose length changed behind the sampler's back (no buffer told it)."""
        n = len(storage)
        known = self._known_len
        if n > known:
            self._written(torch.arange(known, n))
        elif n < known:  # rows dropped (storage emptied or loaded): forget the slots past the end
            live = self._live[: self._num_live]
            keep = live[live < n]
            free = self._free_list()
            free = free[free < n]
            count = self._count[:n].clone()
            self._clear()
            self._count[:n] = count
            self._make_live(keep)
            self._set_free_list(free)
            self._known_len = n

    @staticmethod
    def _slots(index) -> torch.Tensor:
        """The slots of a write index (possibly repeated)."""
        if isinstance(index, tuple) or (isinstance(index, torch.Tensor) and index.ndim > 1):
            raise _not_1d()
        return torch.as_tensor(index, dtype=torch.long).reshape(-1)

    # -- what the buffer calls --------------------------------------------------------------------------------
    def mark_update(self, index, *, storage=None) -> None:
        """Makes the written slots ``index`` drawable again (count reset), taking them off the free list."""
        slots = self._slots(index)
        with self._guard():
            self._written(slots)

    def add(self, index) -> None:
        self.mark_update(index)

    def extend(self, index) -> None:
        self.mark_update(index)

    def update_priority(self, index, priority, *, storage=None) -> None:
        raise RuntimeError(
            "ConsumingSampler keeps no priorities: it draws uniformly among the items not consumed yet, and a "
            "prioritized draw with consumption is not supported (the priority trees do not model items leaving "
            "the draw). Use PrioritizedSampler without consumption, or drop the update_priority() call."
        )

    def num_sampleable(self, storage=None) -> int:
        """The number of stored items that can still be drawn (``len(rb)`` of a consuming buffer).

        A read when the storage did not shrink: rows written and not announced yet count as live without being
        added to the live list, so a reader outside the buffer's lock (``len(rb)``, ``sample(wait=True)``
        polling :meth:`can_sample`) never edits the lists while a write or a draw of another thread does.
        """
        with self._guard():
            if storage is None:
                return self._num_live
            unannounced = len(storage) - self._known_len
            if unannounced < 0:  # rows dropped behind the sampler's back (storage emptied or loaded)
                self._sync(storage)
                return self._num_live
            return self._num_live + unannounced

    def can_sample(self, storage, batch_size: int) -> bool:
        """``True`` when at least ``batch_size`` items can still be drawn (:meth:`num_sampleable`): a waiting
        reader gets a full batch, never the short one an almost consumed buffer gives."""
        return self.num_sampleable(storage) >= batch_size

    def sample(self, storage, batch_size: int):
        batch_size = check_batch_size(batch_size)
        if storage.ndim != 1:
            raise CONSUMING_NDIM.error(cls=type(self).__name__, ndim=storage.ndim)
        with self._guard():
            return self._sample(storage, batch_size)

    def _sample(self, storage, batch_size: int):
        self._sync(storage)
        n_live = self._num_live
        if n_live == 0:
            if self._pinned:
                raise EpochEnded("Every item of the consuming buffer was consumed.")
            known = self._known_len
            what = "holds no data" if known == 0 else f"has consumed all its {known} items"
            raise CONSUMED_EMPTY.error(
                why=f"the buffer {what} (ConsumingSampler(max_sample_count={self.max_sample_count})). Write new "
                f"data first (rb.extend), or iterate with `for batch in rb`, which stops when nothing is left",
            )
        k = min(batch_size, n_live)
        positions = distinct_positions(n_live, k, self._rng).numpy()
        count = self._count.numpy()  # numpy views: see _remove_live
        slots = self._live.numpy()[positions]
        counts = count[slots] + 1
        count[slots] = counts
        done = counts >= self.max_sample_count
        if done.any():
            consumed = slots[done]
            self._remove_live(positions[done])
            ring, free_len = self._free_ring.numpy(), self._free_len
            ring[(self._free_head + free_len + np.arange(consumed.size)) % ring.size] = consumed
            self._free_len = free_len + consumed.size
        left = self._num_live
        self._ran_out = left == 0
        self._remaining_batches = math.ceil(left / batch_size)
        return torch.from_numpy(slots), {}

    # -- state ------------------------------------------------------------------------------------------------
    def _empty(self) -> None:
        with self._guard():
            self._clear()

    def state_dict(self) -> dict[str, Any]:
        """The draw counts, the live list (its order decides the next draws) and the free list."""
        with self._guard():
            n = self._known_len
            return {
                "max_sample_count": self.max_sample_count,
                "_known_len": n,
                "_sample_count": self._count[:n].clone(),
                "_live": self._live[: self._num_live].clone(),
                "_free": self._free_list(),
                "_ran_out": self._ran_out,
                "_remaining_batches": self._remaining_batches,
            }

    # load_state_dict: NOTE [sampler state validation] in samplers/base.py (check everything, then install)
    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        who = type(self).__name__
        max_count = state_int(state, "max_sample_count", who, 1, default=self.max_sample_count)
        n = state_int(state, "_known_len", who, 0)
        count = state.get("_sample_count")
        if not isinstance(count, torch.Tensor) or count.is_floating_point() or count.dtype is torch.bool:
            raise TypeError(
                f"{who} state_dict['_sample_count'] must be a 1-D integer tensor of draw counts, got "
                f"{type(count).__name__ if not isinstance(count, torch.Tensor) else count.dtype}. Load a state "
                f"saved by {who}.state_dict(). Nothing was changed."
            )
        count = count.detach().to("cpu", torch.long, copy=True).reshape(-1)
        live = state_index_tensor(state, "_live", who, n, unique=True)
        free = state_index_tensor(state, "_free", who, n, unique=True)
        slots = torch.cat([live, free])
        if count.numel() != n or slots.numel() != n or bool((count < 0).any()):
            raise ValueError(
                f"Inconsistent ConsumingSampler state: the live ({live.numel()}) and free ({free.numel()}) slots "
                f"must together be each of the {n} known slots once, with one draw count >= 0 each (got "
                f"{count.numel()} counts). Load a state_dict() saved by a ConsumingSampler. Nothing was changed."
            )
        if self._lock is not None and n > self._count.numel():
            raise ValueError(
                f"The state covers {n} slots and this shared ConsumingSampler allocated {self._count.numel()} (the "
                f"storage's capacity): load a state saved with the same capacity. Nothing was changed."
            )
        return {
            "max_sample_count": max_count,
            "_known_len": n,
            "_sample_count": count,
            "_live": live,
            "_free": free,
            "_ran_out": state_bool(state, "_ran_out", who, default=False),
            "_remaining_batches": state_int(state, "_remaining_batches", who, 0, default=0),
        }

    def _apply_state(self, state: dict[str, Any]) -> None:
        n = state["_known_len"]
        with self._guard():
            self._ensure_slots(n)  # cannot raise: a shared sampler holds the n slots (checked)
            self.max_sample_count = state["max_sample_count"]
            self._clear()
            self._count[:n] = state["_sample_count"]
            self._make_live(state["_live"])
            self._set_free_list(state["_free"])
            self._known_len = n
            self._ran_out = state["_ran_out"]
            self._remaining_batches = state["_remaining_batches"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_sample_count={self.max_sample_count})"
