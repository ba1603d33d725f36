"""The ring-buffer writer: :class:`RoundRobinWriter` (TorchRL's path for it is ``writers.round_robin``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDictBase, is_tensorclass

from torchrl._validation import check_bool, is_int
from torchrl.data.replay_buffers.writers.writer import CURSOR, WRITE_COUNT, Writer, _generations_at, _rows_of


class RoundRobinWriter(Writer):
    """Writes at a cursor that wraps around the storage: once full, the oldest items are overwritten.

    Once the storage is shared with other processes (``shared=True``, memory-mapped storages, DataLoader
    datasets), the cursor and the write count live in shared memory too, so every process writes at the same
    cursor; a buffer holds the storage's write lock around each write.

    Args:
        compilable (bool): keep the cursor and the write count in a tensor on the storage's device, so that
            :meth:`extend` traces into one ``torch.compile(fullgraph=True)`` graph (see the "On the GPU and under
            torch.compile" docs page). A writer of a storage built with ``compilable=True`` does so whatever this
            flag. Such a writer cannot be shared with other processes. Defaults to ``False``.

    Keyword Args:
        track_generations (bool): count the writes of each slot, so that :meth:`generations_of` tells a
            reader whether a slot was overwritten since it read it (``-1`` for a slot never written, then
            ``0, 1, ...``; ``empty()`` bumps every written slot). Sets :attr:`tracks_generations`. The counts
            are part of ``state_dict()`` and checkpoints. Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, RoundRobinWriter
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(LazyTensorStorage(4))
        >>> writer.extend(torch.arange(3))
        tensor([0, 1, 2])
        >>> writer.extend(torch.arange(3))
        tensor([3, 0, 1])
        >>> writer.cursor, writer.write_count
        (2, 6)
    """

    fills_free_slots = True
    _pending_generations: torch.Tensor | None = None  # generations loaded before register_storage

    def __init__(self, compilable: bool = False, *, track_generations: bool = False) -> None:
        self._compilable = False if compilable is None else check_bool("compilable", compilable)
        self.tracks_generations = check_bool("track_generations", track_generations)
        self._init_counters()

    def register_storage(self, storage) -> None:
        """Sets the storage; a writer that tracks generations makes the storage keep them (see NOTE [slot
        generations] in :mod:`torchrl.data.replay_buffers.storages.base`)."""
        if self._compilable or storage.compilable:  # the counters as a tensor beside the data (see _extend_tensor)
            self._use_tensor_counters(storage)
        super().register_storage(storage)
        pending, self._pending_generations = self._pending_generations, None
        if pending is not None:  # loaded before the writer had a storage
            storage.load_slot_generations(pending)
        elif self.tracks_generations and storage.slot_generations() is None:
            rows = _known_rows(storage)
            if rows is not None:  # rows written before generations were kept count as written once
                storage.slot_generations(rows)[: storage.rows_written()] = 0

    def generations_of(self, index) -> torch.Tensor:
        """How many times each slot of ``index`` was written (``int64``), counted from ``0`` at the first write.

        ``-1`` for a slot never written, out of range (negative included) or a writer built without
        ``track_generations=True``. The counts live on the storage, so writes by another writer of the same
        storage count too, and ``empty()`` adds one to every written slot. ``index`` is an int (0-d result),
        a tensor of rows (a 1-D tensor is a batch of rows, also on ``ndim > 1`` storages), ``[N, ndim]`` cell
        coordinates (``[N]`` result) or a tuple of per-dim tensors (the shape of its tensors).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, RoundRobinWriter
            >>> writer = RoundRobinWriter(track_generations=True)
            >>> writer.register_storage(LazyTensorStorage(4))
            >>> _ = writer.extend(torch.arange(10))  # slots 0, 1 written 3 times, slots 2, 3 twice
            >>> writer.generations_of(torch.tensor([0, 1, 2, 3, -1, 4])).tolist()
            [2, 2, 1, 1, -1, -1]
        """
        storage = self._storage
        rows = _rows_of(index, 1 if storage is None else storage.ndim)
        if not self.tracks_generations or storage is None:
            return torch.full(rows.shape, -1, dtype=torch.long)
        return _generations_at(storage.slot_generations(), rows)

    def _prepare(self, data, index):
        """Hook for subclasses to edit the data knowing where it goes (``index`` a row or row tensor, or
        ``None`` before the write lock, when :meth:`_place` fills it in later)."""
        return data

    def add(self, data):
        storage = self._require_storage()
        with storage.write_lock:  # the cursor is read and moved under the lock that serializes writers
            return self._add(storage, data)

    def _add(self, storage, data):
        rows = storage._max_size_along_dim0(single_data=data)
        cursor = self._counters.cells[CURSOR] % rows
        storage.write_rows(cursor, self._prepare(data, cursor), track_generations=self.tracks_generations)
        return self._advance(storage, cursor, 1, rows, cursor, cursor)

    def prepare(self, data):
        """Validates a batch for a shared storage before the write lock (see :meth:`Writer.prepare`)."""
        storage = self._storage
        if storage is None:
            storage = self._require_storage()  # raises
        if not storage.is_shared:
            return data
        n = batch_len(data)
        if n == 0:
            return data
        rows = storage._max_size_along_dim0(batched_data=data)
        kept = take_last(data, rows) if n > rows else data
        checked = storage.check_write(self._prepare(kept, None), min(n, rows))
        return data if checked is None else _Prepared(n, rows, checked)

    def extend(self, data) -> torch.Tensor:
        storage = self._storage
        if storage is None:
            storage = self._require_storage()  # raises
        if storage.compilable:  # never shared: no lock to take
            n = batch_len(data)
            return self._extend_tensor(storage, data, n) if n else torch.zeros((0,), dtype=torch.long)
        if isinstance(data, _Prepared):
            with storage.write_lock:
                return self._extend_prepared(storage, data)
        n = batch_len(data)
        if n == 0:
            return torch.zeros((0,), dtype=torch.long)
        with storage.write_lock:
            return self._extend(storage, data, n)

    def _extend(self, storage, data, n: int) -> torch.Tensor:
        rows = storage._max_size_along_dim0(batched_data=data)
        cursor = self._counters.cells[CURSOR] % rows
        index = (torch.arange(n) + cursor) % rows
        if n > rows:  # only the last `rows` items survive a write larger than the storage
            data = take_last(data, rows)
            written, ring = index[-rows:], ((cursor + n - rows) % rows, rows)
        else:
            written, ring = index, (cursor, n)
        # every repetition of a row counts in its generation
        storage.write_rows(
            written, self._prepare(data, written), counted=index, track_generations=self.tracks_generations,
            ring=ring,
        )  # fmt: skip
        return self._advance(storage, cursor, n, rows, index, written)

    def _extend_tensor(self, storage, data, n: int) -> torch.Tensor:
        """:meth:`_extend` with the cursor a 0-d tensor (compilable storages): the same rows, no number read back
        to the host, traced whole by ``torch.compile``."""
        rows = storage._max_size_along_dim0(batched_data=data)
        counters = self._counters.tensor
        cursor = counters[CURSOR] % rows
        index = (torch.arange(n, device=counters.device) + cursor) % rows
        if n > rows:  # only the last `rows` items survive a write larger than the storage
            data = take_last(data, rows)
            written, ring = index[-rows:], ((cursor + (n - rows)) % rows, rows)
        else:
            written, ring = index, (cursor, n)
        storage.write_rows(
            written, self._prepare(data, written), counted=index, track_generations=self.tracks_generations,
            ring=ring,
        )  # fmt: skip
        counters.copy_(torch.stack([(cursor + n) % rows, counters[WRITE_COUNT] + n]))
        if storage.ndim > 1:
            written, index = self._replicate_index(written), self._replicate_index(index)
        storage.mark_update(written)
        return index

    def _extend_prepared(self, storage, prepared: _Prepared) -> torch.Tensor:
        n, rows = prepared.n, prepared.rows
        cursor = self._counters.cells[CURSOR] % rows
        index = (torch.arange(n) + cursor) % rows
        written = index[-rows:] if n > rows else index
        ring = ((cursor + n - rows) % rows, rows) if n > rows else (cursor, n)
        self._place(prepared.checked.data, written)
        storage.write_rows(
            written, prepared.checked, counted=index, track_generations=self.tracks_generations, ring=ring
        )
        return self._advance(storage, cursor, n, rows, index, written)

    def _place(self, data, index) -> None:
        """Hook for subclasses whose :meth:`_prepare` left a placeholder to fill once ``index`` is known."""

    def _advance(self, storage, cursor: int, n: int, rows: int, index, written):
        """After the storage took a write of ``n`` items at ``cursor``: moves the cursor past them, counts them,
        tells the storage's buffers of the rows ``written``; returns ``index`` (cells for ``ndim > 1``)."""
        cells = self._counters.cells  # (read now: a first write may have moved the counters to shared memory)
        cells[CURSOR] = (cursor + n) % rows
        cells[WRITE_COUNT] += n
        if storage.ndim > 1:
            written, index = self._replicate_index(written), self._replicate_index(index)
        storage.mark_update(written)
        return index

    # -- writes into given slots (consuming buffers) ---------------------------------------------------------------
    def write_at(self, index, data):
        """Writes ``data`` into slots that already hold data, without moving the cursor.

        ``index`` is an int (one item) or a 1-D index (a batch); every slot must be below
        ``storage.rows_written()`` (``IndexError`` otherwise, nothing written). Generations, the write count and
        the buffers attached to the storage are updated as for any write. Returns ``index`` (cell coordinates
        for ``ndim > 1`` storages, as :meth:`extend`).
        """
        storage = self._require_storage()
        with storage.write_lock:
            return self._write_at(storage, index, data)

    def _write_at(self, storage, index, data):
        single = is_int(index)
        slots = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        filled = storage.rows_written()
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= filled):
            raise IndexError(
                f"write_at() writes into slots that already hold data (0 to {filled - 1}); got {index!r}. Use "
                f"add() or extend() to write new slots."
            )
        target = int(index) if single else slots
        storage.write_rows(
            target, self._prepare(data, target), track_generations=self.tracks_generations, set_cursor=False
        )
        self._counters.cells[WRITE_COUNT] += slots.numel()
        index = self._replicate_index(target)
        storage.mark_update(index)
        return index

    def add_free_first(self, data, free_slots):
        """:meth:`add` into the oldest free slot if there is one (see :meth:`extend_free_first`)."""
        storage = self._require_storage()
        with storage.write_lock:
            free = free_slots(1)
            if not free.numel():
                return self._add(storage, data)
            return self._write_at(storage, int(free[0]), data)

    def extend_free_first(self, data, free_slots) -> torch.Tensor:
        """:meth:`extend` that fills free slots before it writes at the cursor (consuming buffers).

        ``free_slots(k)`` returns up to ``k`` slots holding items that may be replaced, oldest first
        (:meth:`~torchrl.data.ConsumingSampler.free_slots`). The first items of the batch go there; the rest go
        at the cursor, which skips the slots this call filled. A batch of at least the storage's rows is
        written at the cursor (it replaces everything). Returns the index of each item, in batch order.
        """
        storage = self._require_storage()
        n = batch_len(data)
        if n == 0:
            return torch.zeros((0,), dtype=torch.long)
        with storage.write_lock:
            rows = storage._max_size_along_dim0(batched_data=data)
            free = free_slots(n) if n < rows else ()
            k = len(free)
            if k == 0:
                return self._extend(storage, data, n)
            if k == n:
                return self._write_at(storage, free, data)
            cursor = self._counters.cells[CURSOR] % rows
            ahead = (torch.arange(n) + cursor) % rows
            ahead = ahead[~torch.isin(ahead, free)][: n - k]
            index = torch.cat([free, ahead])
            storage.write_rows(index, self._prepare(data, index), track_generations=self.tracks_generations)
            cells = self._counters.cells  # (after the write: a first write may move the counters to shared memory)
            cells[CURSOR] = (int(ahead[-1]) + 1) % rows
            cells[WRITE_COUNT] += n
            index = self._replicate_index(index)
            storage.mark_update(index)
            return index

    def _empty(self, empty_write_count: bool = True) -> None:
        self._counters["cursor"] = 0
        self._bump_written_generations()
        if empty_write_count:
            self._counters["write_count"] = 0

    def state_dict(self) -> dict[str, Any]:
        state = {"_cursor": self.cursor, "_write_count": self.write_count}
        generations = (
            None if self._storage is None or not self.tracks_generations else self._storage.slot_generations()
        )
        if generations is not None:
            state["_generation"] = generations.clone()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        generations = state_dict.get("_generation") if self.tracks_generations else None
        if generations is not None:
            generations = torch.as_tensor(generations, dtype=torch.long).reshape(-1).clone()
            rows = _known_rows(self._storage)
            if rows is not None and generations.numel() != rows:
                raise ValueError(
                    f"The writer state holds the generations of {generations.numel()} slots; this writer's "
                    f"storage has {rows} rows. Load a state saved with a storage of the same capacity."
                )
        self._counters["cursor"] = int(state_dict["_cursor"])
        self._counters["write_count"] = int(state_dict.get("_write_count", 0))
        if generations is not None:
            if self._storage is None:  # they live on the storage: installed by register_storage
                self._pending_generations = generations
            else:
                self._storage.load_slot_generations(generations)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cursor={self.cursor}, write_count={self.write_count})"


def batch_len(data) -> int:
    """The number of items in a batch (first dim of a tensor/TensorDict/tensorclass, length of a list, first
    dim of the first leaf of a pytree)."""
    if isinstance(data, (torch.Tensor, TensorDictBase)) or is_tensorclass(data):
        if not data.shape:
            raise ValueError(
                "extend() takes a batch whose first dim indexes items; got data with no batch dim. Use add() to "
                "write one item, or give the data a batch dim (e.g. data.unsqueeze(0))."
            )
        return data.shape[0]
    if isinstance(data, list):
        return len(data)
    leaves = pytree.tree_leaves(data)
    if not leaves or not isinstance(leaves[0], torch.Tensor) or not leaves[0].ndim:
        raise TypeError(
            f"extend() takes a tensor, a TensorDict, a tensorclass, a list of items or a pytree of batched "
            f"tensors; got {type(data).__name__}."
        )
    return leaves[0].shape[0]


def take_last(data, n: int):
    """The last ``n`` items of a batch."""
    if isinstance(data, (torch.Tensor, TensorDictBase, list)) or is_tensorclass(data):
        return data[-n:]
    return pytree.tree_map(lambda t: t[-n:], data)


def _known_rows(storage) -> int | None:
    """The rows of ``storage``, or ``None`` without a storage or before an ``ndim > 1`` lazy storage sized
    them (at its first write)."""
    if storage is None:
        return None
    try:
        return storage._max_size_along_dim0()
    except RuntimeError:
        return None


class _Prepared:
    """What :meth:`RoundRobinWriter.prepare` hands to :meth:`RoundRobinWriter.extend`."""

    __slots__ = ("n", "rows", "checked")

    def __init__(self, n: int, rows: int, checked):
        self.n = n
        self.rows = rows
        self.checked = checked
