"""A writer that keeps the ``k`` items of highest rank: :class:`TensorDictMaxValueWriter`.

Data model: the writer keeps one rank per storage slot (``float64``, slot order) next to a fill cursor and a
write count. ``k`` is the storage capacity. While the storage is not full, items go to the next free slot;
once it is full, an item replaces the item of lowest rank only if its own rank is strictly larger.

A batch is decided at once, with no Python loop over items, and the result equals writing its items one by
one and keeping what survives (items that enter and are pushed out again by a later item of the same batch
count as not inserted):

1. while ``n`` new items fit in the free slots, they take them in order;
2. otherwise ``drop = n - free`` candidates must go. They are among the ``drop`` weakest stored items
   (:func:`torch.topk`, O(k)) and the ``n`` new items, so only that pool of at most ``2n`` ranks is sorted.
   Ties go to the incumbent: a stored item beats a new item of equal rank, and an earlier item of the batch
   beats a later one (one stable sort over the pool laid out as ``[new items, latest first; stored items]``).
3. the new items that survive fill the free slots, then the slots of the stored items that were dropped.

Once the storage is full the writer also keeps a lower bound of the stored ranks (updated from the sorted
pool at each overflow): items not above it cannot enter, so a batch that holds none above it is rejected in
O(n), without the O(k) ``topk`` scan.

So after any sequence of writes the stored ranks are exactly the ``k`` largest ranks written so far.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers.errors import TypeRuntimeError
from torchrl.data.replay_buffers.writers.writer import Writer

MAX_VALUE_WRITER_DATA = TorchRLPhrase(
    TypeRuntimeError,
    "expects data to be a tensor collection",
    "{cls} expects data to be a tensor collection (a TensorDict or a tensorclass holding the rank key), got "
    "{got}. Wrap the data in a TensorDict with the rank entry, or use a RoundRobinWriter for tensors and "
    "pytrees.",
)
MAX_VALUE_WRITER_SPAWN = TorchRLPhrase(
    RuntimeError,
    "cannot be shared between processes",
    "A {cls} cannot be shared between processes: its top-k decisions are not synchronized across processes. "
    "Write from one process: use num_workers=0, or the 'fork' start method for DataLoader workers that only "
    "sample, or a RoundRobinWriter.",
)
MAX_VALUE_WRITER_SHARED = TorchRLPhrase(
    RuntimeError,
    "cannot be shared between processes",
    "A {cls} cannot be shared between processes (the buffer got {how}): its top-k decisions are not "
    "synchronized across processes. Nothing was shared. Build the buffer with shared=False and write from one "
    "process, or use a RoundRobinWriter for a buffer written by several processes.",
)

_REDUCTIONS = ("max", "min", "mean", "median", "sum")
_UNBOUNDED = torch.iinfo(torch.int64).max


def _check_rank_key(rank_key):
    if rank_key is None:
        return ("next", "reward")
    if isinstance(rank_key, str):
        return rank_key
    if isinstance(rank_key, tuple) and rank_key and all(isinstance(k, str) for k in rank_key):
        return rank_key
    raise TypeError(
        f"`rank_key` must be a key of the written TensorDicts (a str or a tuple of str), got {rank_key!r}. "
        f"Pass e.g. rank_key=('next', 'reward')."
    )


def _reduce(flat: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduces ``[N, M]`` ranks to ``[N]``."""
    if reduction == "max":
        return flat.amax(-1)
    if reduction == "min":
        return flat.amin(-1)
    if reduction == "mean":
        return flat.mean(-1)
    if reduction == "median":
        return flat.median(-1).values
    return flat.sum(-1)


class TensorDictMaxValueWriter(Writer):
    """Keeps the ``k`` items of highest rank, where ``k`` is the storage capacity.

    Useful to hold the best episodes or transitions seen so far (e.g. for self-imitation): each written
    TensorDict is ranked by the entry ``rank_key``, reduced to one number per item by ``reduction``. While the
    storage has free slots every item is written; once it is full an item replaces the stored item of lowest
    rank only if its rank is strictly larger (ties keep the item already stored). See the module docstring
    for how a batch is decided.

    Like :class:`~torchrl.data.TensorDictRoundRobinWriter`, the writer sets the ``"index"`` entry of the
    written TensorDict in place: the slot of each item, or ``-1`` for an item that was not inserted.

    Args:
        rank_key (NestedKey, optional): the entry that ranks items. Defaults to ``("next", "reward")``.
        reduction (str): how an item's rank entry is reduced to one number when it holds several values
            (e.g. a reward per step): ``"max"``, ``"min"``, ``"mean"``, ``"median"`` or ``"sum"``. Defaults to
            ``"sum"``.

    Keyword Args:
        **kwargs: the keywords of :class:`~torchrl.data.Writer`: ``compilable`` (bool), accepted for TorchRL
            compatibility, no effect here. Defaults to ``False``.

    :attr:`cursor` is the number of filled slots: it moves with each item written while the storage fills,
    then stays at the capacity. ``_cursor`` (TorchRL's name, read by user code) is TorchRL's value: the slot
    the next item goes to while the storage fills, modulo the capacity, so ``0`` once the storage is full
    (a replacement reuses the slot it evicts). This writer does not track generations
    (``tracks_generations`` is ``False``), but its writes count in the generations of a storage it shares
    with a writer that does.

    .. note:: Only 1-D storages with a finite capacity are supported (``register_storage`` raises otherwise).
        The fill cursor and the write count live in shared memory like :class:`RoundRobinWriter`'s, and so
        do the ranks, but decisions are not synchronized across processes: write from one process. As in
        TorchRL, sending the writer (or a buffer holding it) to a spawned process raises ``RuntimeError``, and so
        does a buffer built with it and ``shared=True`` (or ``rb.share()``), before anything is shared.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictMaxValueWriter
        >>> writer = TensorDictMaxValueWriter(rank_key="score")
        >>> writer.register_storage(LazyTensorStorage(3))
        >>> writer.extend(TensorDict(score=torch.tensor([1.0, 5.0, 2.0, 4.0, 0.0]), batch_size=[5]))
        tensor([-1,  0,  1,  2, -1])
        >>> writer.ranks  # 1.0 was pushed out by 4.0 within the batch: it counts as not inserted
        tensor([5., 2., 4.], dtype=torch.float64)
        >>> writer.add(TensorDict(score=torch.tensor(3.0))), writer.add(TensorDict(score=torch.tensor(1.0)))
        (1, None)
    """

    def __init__(self, rank_key=None, reduction: str = "sum", **kwargs) -> None:
        unknown = sorted(set(kwargs) - {"compilable"})
        if unknown:
            raise TypeError(
                f"TensorDictMaxValueWriter got unexpected keyword arguments {unknown}: besides `rank_key` and "
                f"`reduction` it takes the keywords of Writer (compilable=...)."
            )
        super().__init__(**kwargs)
        if reduction not in _REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {list(_REDUCTIONS)}, got {reduction!r}.")
        self._rank_key = _check_rank_key(rank_key)
        self._reduction = reduction
        self._init_counters()
        self._ranks: torch.Tensor | None = None  # [capacity] float64, shared memory
        # a lower bound of the stored ranks once full: items not above it are rejected without an O(k) scan
        self._floor = torch.full((1,), float("-inf"), dtype=torch.float64).share_memory_()

    # -- properties ------------------------------------------------------------------------------------------
    @property
    def rank_key(self):
        """The entry that ranks items."""
        return self._rank_key

    @property
    def reduction(self) -> str:
        """How a rank entry is reduced to one number per item."""
        return self._reduction

    @property
    def _cursor(self) -> int:
        """TorchRL's cursor: the next free slot while the storage fills, ``0`` once it is full (read-only)."""
        filled = self.cursor
        capacity = 0 if self._ranks is None else self._ranks.numel()
        return filled % capacity if capacity else filled

    @property
    def ranks(self) -> torch.Tensor:
        """A copy of the rank of the item in each filled slot, in slot order."""
        if self._ranks is None:
            return torch.zeros((0,), dtype=torch.float64)
        return self._ranks[: self.cursor].clone()

    # -- storage ---------------------------------------------------------------------------------------------
    def register_storage(self, storage) -> None:
        """Sets the storage; it must be 1-D with a finite capacity (its ``max_size`` is ``k``)."""
        if storage.ndim > 1:
            raise ValueError(
                f"TensorDictMaxValueWriter needs a 1-D storage; got {type(storage).__name__} with "
                f"ndim={storage.ndim}. Build the storage with ndim=1, or use storage.flatten()."
            )
        capacity = storage.max_size
        if capacity >= _UNBOUNDED:
            raise ValueError(
                f"TensorDictMaxValueWriter keeps the top-k items of a storage of capacity k; got "
                f"{type(storage).__name__} with unbounded capacity. Pass a max_size (e.g. ListStorage(100))."
            )
        if self._ranks is None or self._ranks.numel() != capacity:
            if self.cursor:
                raise ValueError(
                    f"This writer holds {self.cursor} ranks for a storage of capacity {self._ranks.numel()}; "
                    f"got a storage of capacity {capacity}. Register a storage of capacity "
                    f"{self._ranks.numel()}, or empty the writer first."
                )
            self._ranks = _new_ranks(capacity)
            self._floor.fill_(float("-inf"))
        self._storage = storage

    def _capacity(self) -> int:
        self._require_storage()
        return self._ranks.numel()

    # -- ranks -----------------------------------------------------------------------------------------------
    def _ranks_of(self, data, batched: bool) -> torch.Tensor:
        """One float64 rank per item (``[N]`` for a batch, ``[1]`` for one item)."""
        if not is_tensor_collection(data):  # a TypeError, and the RuntimeError TorchRL raises here
            raise MAX_VALUE_WRITER_DATA.error(cls=type(self).__name__, got=_described(data))
        if batched and not data.batch_dims:
            raise ValueError(
                "extend() takes a batch whose first dim indexes items; got a TensorDict with no batch dim. "
                "Use add() to write one item, or give the data a batch dim (e.g. data.unsqueeze(0))."
            )
        value = data.get(self._rank_key, None)
        if value is None:
            keys = sorted(map(str, data.keys(include_nested=True, leaves_only=True)))
            raise KeyError(
                f"The `rank_key` entry {self._rank_key!r} is not in the data written (its keys: {keys}). "
                f"Write data holding it, or build the writer with rank_key=<the entry that ranks items>."
            )
        if not isinstance(value, torch.Tensor) or value.is_complex():
            raise TypeError(
                f"The `rank_key` entry {self._rank_key!r} must be a real tensor, got "
                f"{getattr(value, 'dtype', type(value).__name__)}."
            )
        n = data.batch_size[0] if batched else 1
        if n == 0:
            return torch.zeros((0,), dtype=torch.float64)
        flat = value.detach().to(device="cpu", dtype=torch.float64).reshape(n, -1)
        if flat.shape[1] == 0:
            raise ValueError(f"The `rank_key` entry {self._rank_key!r} is empty: each item needs a rank.")
        ranks = _reduce(flat, self._reduction)
        if torch.isnan(ranks).any():
            raise ValueError(
                f"The `rank_key` entry {self._rank_key!r} holds NaN ranks, which cannot be ordered. Replace "
                f"them (e.g. with -inf) before writing."
            )
        return ranks

    def _decide(self, ranks: torch.Tensor):
        """Where each of ``ranks`` goes, without changing state.

        Returns ``(index, slots, winners, floor)``: ``index[i]`` is item ``i``'s slot or ``-1``; ``slots[j]``
        is the slot of item ``winners[j]`` (winners in batch order); ``floor`` is a new lower bound of the
        stored ranks once the storage is full (``None`` to keep the current one).
        """
        n = ranks.numel()
        capacity = self._capacity()
        cursor = self.cursor
        free = capacity - cursor
        if n <= free:
            slots = torch.arange(cursor, cursor + n)
            return slots, slots, torch.arange(n), None
        index = torch.full((n,), -1, dtype=torch.long)
        if free == 0:  # items not above the floor (<= the stored minimum) lose to every stored item
            candidates = (ranks > float(self._floor)).nonzero().squeeze(-1)
            if candidates.numel() == 0:
                return index, candidates, candidates, None
        else:
            candidates = torch.arange(n)
        sub = ranks[candidates]
        n_sub = sub.numel()
        drop = n_sub - free
        stored = self._ranks[:cursor]
        m = min(drop, cursor)
        weakest = torch.topk(stored, m, largest=False, sorted=False).indices if m else torch.zeros(0).long()
        pool = torch.cat([sub.flip(0), stored[weakest]])
        order = torch.sort(pool, stable=True)
        keep = torch.ones(n_sub + m, dtype=torch.bool)
        keep[order.indices[:drop]] = False
        winners = candidates[keep[:n_sub].flip(0).nonzero().squeeze(-1)]
        slots = torch.cat([torch.arange(cursor, capacity), weakest[~keep[n_sub:]]])
        index[winners] = slots
        # stored items outside the pool rank >= the weakest m; the kept pool ranks >= its first kept rank
        floor = float(order.values[drop])
        if m:
            floor = min(floor, float(stored[weakest].max()))
        return index, slots, winners, floor

    def _commit(self, ranks: torch.Tensor, slots: torch.Tensor, winners: torch.Tensor, n: int, floor) -> None:
        if slots.numel():
            self._ranks[slots] = ranks[winners]
            self._counters["cursor"] = min(self._capacity(), self.cursor + n)
        if floor is not None:
            self._floor.fill_(floor)
        self._counters["write_count"] += n

    def check_shareable(self) -> None:
        """Raises TorchRL's ``RuntimeError``: the top-k decisions of this writer are made in one process."""
        raise MAX_VALUE_WRITER_SHARED.error(cls=type(self).__name__, how="shared=True or share()")

    # -- writes ----------------------------------------------------------------------------------------------
    def get_insert_index(self, data) -> int | None:
        """Decides where one item goes, as :meth:`add` does, and records it, without writing the storage.

        ``data`` (a TensorDict or tensorclass holding ``rank_key``; its rank is reduced to one number with
        ``reduction``) takes the next free slot while the storage fills; once it is full, it replaces the item of
        lowest rank if its own rank is strictly larger. The writer then counts it (``write_count``) and holds its
        rank for that slot, as TorchRL's does: the caller writes the item there (``storage.set(slot, data)``);
        :meth:`add` is this call plus the write. Nothing changes when the data is refused (no rank entry, NaN).

        Returns:
            the slot (int), or ``None`` when the item does not rank among the top ``k``.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, TensorDictMaxValueWriter
            >>> writer = TensorDictMaxValueWriter(rank_key="score")
            >>> writer.register_storage(LazyTensorStorage(2))
            >>> [writer.get_insert_index(TensorDict(score=torch.tensor(s))) for s in (3.0, 1.0, 0.5, 2.0)]
            [0, 1, None, 1]
        """
        self._require_storage()
        ranks = self._ranks_of(data, batched=False)
        index, slots, winners, floor = self._decide(ranks)
        self._commit(ranks, slots, winners, 1, floor)
        slot = int(index[0])
        return slot if slot >= 0 else None

    def add(self, data) -> int | None:
        """Writes one TensorDict if it ranks among the top ``k``; returns its slot, or ``None``."""
        storage = self._require_storage()
        ranks = self._ranks_of(data, batched=False)
        index, slots, winners, floor = self._decide(ranks)
        slot = int(index[0])
        _set_index(data, torch.tensor(slot))
        if slot >= 0:
            storage.set(slot, data)
        self._commit(ranks, slots, winners, 1, floor)
        if slot < 0:
            return None
        self._bump_generations(storage, self._capacity(), slot)
        storage.mark_update(slot)
        return slot

    def extend(self, data) -> torch.Tensor:
        """Writes the items of a batch that rank among the top ``k``.

        Returns:
            A ``[N]`` long tensor: the slot of each item, or ``-1`` for items not inserted.
        """
        storage = self._require_storage()
        ranks = self._ranks_of(data, batched=True)
        n = ranks.numel()
        if n == 0:
            return torch.zeros((0,), dtype=torch.long)
        index, slots, winners, floor = self._decide(ranks)
        _set_index(data, index)
        if slots.numel():
            storage.set(slots, data if winners.numel() == n else data[winners])
        self._commit(ranks, slots, winners, n, floor)
        if slots.numel():
            self._bump_generations(storage, self._capacity(), slots)
            storage.mark_update(slots)
        return index

    def _empty(self, empty_write_count: bool = True) -> None:
        self._counters["cursor"] = 0
        self._bump_written_generations()
        self._floor.fill_(float("-inf"))
        if self._ranks is not None:
            self._ranks.fill_(float("-inf"))
        if empty_write_count:
            self._counters["write_count"] = 0

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "_cursor": self.cursor,
            "_write_count": self.write_count,
            "_capacity": None if self._ranks is None else self._ranks.numel(),
            "_ranks": self.ranks,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = [k for k in ("_cursor", "_ranks", "_capacity") if k not in state_dict]
        if missing:
            raise KeyError(
                f"The writer state_dict lacks {missing}: pass what TensorDictMaxValueWriter.state_dict() "
                f"returns."
            )
        cursor = int(state_dict["_cursor"])
        ranks = torch.as_tensor(state_dict["_ranks"], dtype=torch.float64).reshape(-1)
        capacity = state_dict["_capacity"]
        capacity = cursor if capacity is None else int(capacity)
        if ranks.numel() != cursor or cursor > capacity:
            raise ValueError(
                f"Inconsistent writer state: `_cursor`={cursor}, {ranks.numel()} ranks, "
                f"`_capacity`={capacity}."
            )
        if capacity and self._ranks is not None and self._ranks.numel() != capacity:
            if self._storage is not None:
                raise ValueError(
                    f"The state was saved for a storage of capacity {capacity}; this writer's storage has "
                    f"capacity {self._ranks.numel()}. Load it into a writer whose storage has that capacity."
                )
            self._ranks = None
        if capacity and self._ranks is None:
            self._ranks = _new_ranks(capacity)
        if self._ranks is not None:
            self._ranks.fill_(float("-inf"))
            self._ranks[:cursor] = ranks
        self._counters["cursor"] = cursor
        self._floor.fill_(float(ranks.min()) if cursor and cursor == capacity else float("-inf"))
        self._counters["write_count"] = int(state_dict.get("_write_count", 0))

    def __getstate__(self):
        # as in TorchRL: decisions are not synchronized across processes, so a spawned process gets no copy
        if is_spawning():
            raise MAX_VALUE_WRITER_SPAWN.error(cls=type(self).__name__)
        return super().__getstate__()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rank_key={self._rank_key!r}, reduction={self._reduction!r}, "
            f"cursor={self.cursor}, write_count={self.write_count})"
        )


def _described(data) -> str:
    """What a write received, for the message refusing it (``"a Tensor of shape [3]"``, ``"a dict"``, ...)."""
    if isinstance(data, torch.Tensor):
        return f"a Tensor of shape {list(data.shape)}"
    if isinstance(data, (list, tuple)):
        inner = f" of {type(data[0]).__name__}" if data else ""
        return f"a {type(data).__name__}{inner} (a batch of items, as a ListStorage holds them)"
    return f"a {type(data).__name__}"


def _new_ranks(capacity: int) -> torch.Tensor:
    return torch.full((capacity,), float("-inf"), dtype=torch.float64).share_memory_()


def _set_index(data, index: torch.Tensor) -> None:
    """Writes the slot of each item (``-1`` if not inserted) in the ``"index"`` entry, over all batch dims (a
    tensorclass without an ``index`` field gets none)."""
    if not isinstance(data, TensorDictBase) and "index" not in {f.name for f in dataclasses.fields(data)}:
        return
    index = index.to(device=data.device) if data.device is not None else index
    if data.batch_dims > index.ndim:
        index = index.reshape(*index.shape, *([1] * (data.batch_dims - index.ndim)))
    data.set("index", index.expand(data.batch_size).clone())
