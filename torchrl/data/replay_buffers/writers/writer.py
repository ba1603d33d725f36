"""The writer contract: :class:`Writer` (TorchRL's path for it is ``writers.base``).

A writer decides where new data goes in a storage: ``add(item) -> index`` and ``extend(batch) -> index``
write through ``storage.write_rows`` (``set`` plus the slot generations) and then call
``storage.mark_update(index)``, which tells every buffer
attached to the storage (and through it, its sampler) what was written. A write is validated by the storage
before anything is stored, and a writer only moves its cursor after the storage accepted the data, so a bad
write leaves both unchanged.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from torchrl._validation import check_bool
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_state_counters
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers._shared.counters import SharedCounters
from torchrl.data.replay_buffers._shared.tensor_counters import COMPILABLE_SHARED, TensorCounters
from torchrl.data.replay_buffers.component import Component

# the positions of the writer's counters in ``SharedCounters.cells`` (see Writer._init_counters)
CURSOR, WRITE_COUNT = 0, 1


class Writer(Component):
    """Base class of replay-buffer writers (see the module docstring for the contract).

    Args:
        compilable (bool): whether the writer's writes are traced by ``torch.compile`` (the ring writers then
            keep their counters in a tensor: see the "On the GPU and under torch.compile" docs page); other
            writers accept it for TorchRL compatibility. Defaults to ``False``.

    Class attributes:
        tracks_generations (bool): whether the writer counts the writes of each slot (see
            :meth:`generations_of`). Defaults to ``False``.
    """

    _storage = None
    _compilable: bool = False  # TorchRL's `compilable=` keyword (the ring writers keep tensor counters with it)
    tracks_generations: bool = False
    _rng: torch.Generator | None = None
    _counters: SharedCounters | None = None  # "cursor" and "write_count", for writers that keep them
    checkpoint_role = "writer"

    def __init__(self, compilable: bool = False) -> None:
        self._compilable = False if compilable is None else check_bool("compilable", compilable)

    def check_shareable(self) -> None:
        """Raises a ``RuntimeError`` if this writer cannot serve a buffer written by several processes; what a
        buffer calls before ``share()`` (or ``shared=True``) changes anything. Every writer can, by default."""
        return None

    def register_storage(self, storage) -> None:
        """Sets the storage this writer writes into (and shares the writer's cursor if the storage is shared)."""
        self._storage = storage
        if storage.is_shared:
            self.share_memory_()

    def prepare(self, data):
        """The part of a write that does not depend on where the data goes, run before the write lock.

        Buffers call ``writer.extend(writer.prepare(data))``; the default returns ``data`` unchanged. A writer
        of a shared storage can validate the batch here (:meth:`~torchrl.data.Storage.check_write`) so that
        several writer processes overlap that work; ``extend`` accepts what ``prepare`` returned.
        """
        return data

    def _init_counters(self) -> None:
        """Gives the writer a cursor and a write count, both ``0`` (see :attr:`cursor`, :attr:`write_count`), at
        the positions ``CURSOR`` and ``WRITE_COUNT`` of ``self._counters.cells``."""
        self._counters = SharedCounters(("cursor", "write_count"))

    def _use_tensor_counters(self, storage) -> None:
        """Moves the cursor and the write count (values kept) into a tensor on ``storage``'s device, for
        compiled writes (see :class:`~torchrl.data.replay_buffers._shared.tensor_counters.TensorCounters`)."""
        device = getattr(storage, "device", None)
        device = device if isinstance(device, torch.device) else None
        counters = self._counters
        if isinstance(counters, TensorCounters):
            counters.to(device if device is not None else counters.tensor.device)
            return
        if counters.is_shared:
            raise COMPILABLE_SHARED.error(what="writer")
        values = counters.as_dict()
        self._counters = TensorCounters(tuple(values), device=device, what="writer")
        self._counters.load_dict(values)

    @property
    def cursor(self) -> int:
        """Where the next write goes: the next row of a ring-buffer writer, the number of filled slots of a
        :class:`~torchrl.data.TensorDictMaxValueWriter`; ``0`` for a writer that keeps no cursor."""
        return 0 if self._counters is None else self._counters["cursor"]

    @property
    def _cursor(self) -> int:
        """TorchRL's name of :attr:`cursor`, read and set by user code (an alias: both see the same value)."""
        return self.cursor

    @_cursor.setter
    def _cursor(self, value: int) -> None:
        if self._counters is None:
            raise AttributeError(f"{type(self).__name__} keeps no cursor: `_cursor` cannot be set.")
        self._counters["cursor"] = int(value)

    def generations_of(self, index) -> torch.Tensor:
        """How many times each slot of ``index`` was written (``int64``, the shape of the row index); ``-1``
        for every slot of a writer that does not track generations."""
        rows = _rows_of(index, 1 if self._storage is None else self._storage.ndim)
        return torch.full(rows.shape, -1, dtype=torch.long)

    # NOTE [slot generations] in storages/base.py: the write counts live on the storage, bumped by every writer.
    def _bump_generations(self, storage, rows: int, written) -> None:
        """Adds one to the generation of each row of ``written`` (repetitions count), if the storage keeps
        generations (allocating them for a writer that tracks generations)."""
        storage.bump_generations(written, rows, allocate=self.tracks_generations)

    def _bump_written_generations(self) -> None:
        """``empty()``: adds one to the generation of every row written so far (see NOTE [slot generations] in
        storages/base.py)."""
        storage = self._storage
        generations = None if storage is None else storage.slot_generations()
        if generations is not None:
            generations[generations >= 0] += 1

    @property
    def write_count(self) -> int:
        """The number of items written (offered, for a max-value writer) since creation or the last
        ``empty()``; ``0`` for a writer that keeps no count."""
        return 0 if self._counters is None else self._counters["write_count"]

    def share_memory_(self) -> Writer:
        """Moves the writer's cursor and write count to shared memory, for a storage written by several
        processes, so that they all write at the same cursor.

        A no-op for writers that keep no cursor.
        """
        if self._counters is not None:
            self._counters.share_memory_()
        generations = None if self._storage is None else self._storage.slot_generations()
        if generations is not None:
            generations.share_memory_()
        return self

    def _require_storage(self):
        if self._storage is None:
            raise RuntimeError(
                f"{type(self).__name__} has no storage: call writer.register_storage(storage) or use it "
                f"through a ReplayBuffer."
            )
        return self._storage

    @abc.abstractmethod
    def add(self, data) -> Any: ...

    @abc.abstractmethod
    def extend(self, data) -> torch.Tensor: ...

    def add_free_first(self, data, free_slots) -> Any:
        """:meth:`add` for a buffer whose sampler consumes items: a writer that can fill the consumed slots
        returned by ``free_slots(k)`` first overrides it (:class:`~torchrl.data.RoundRobinWriter`); this
        default writes as :meth:`add` does."""
        return self.add(data)

    def extend_free_first(self, data, free_slots) -> torch.Tensor:
        """:meth:`extend` for a buffer whose sampler consumes items (see :meth:`add_free_first`)."""
        return self.extend(data)

    #: Whether :meth:`add_free_first`/:meth:`extend_free_first` fill consumed slots first (``False``: they
    #: write as :meth:`add`/:meth:`extend` do).
    fills_free_slots: bool = False

    def _empty(self, empty_write_count: bool = True) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        """Checks the saved state like every component, and that its counters (``_cursor``, ``_write_count``)
        are ints >= 0, the cursor within the rows of the storage saved with it (in a buffer's checkpoint)."""
        super().check_checkpoint_part(doc, tensors, ctx)
        scalars = check_state_counters(self, doc, ctx, ("_cursor", "_write_count"))
        rows = ctx.facts.get("storage_rows")
        if rows is not None and "_cursor" in scalars:
            where = f"The {type(self).__name__} state in the checkpoint {ctx.path!r}"
            fix = f"The writer's cursor is a row of the storage, which has {rows} rows."
            check_int_field(scalars["_cursor"], "_cursor", where, 0, rows, fix=fix)

    def _replicate_index(self, index):
        """Row positions -> cell positions (``[N * cells, ndim]``) for storages with ``ndim > 1``."""
        storage = self._storage
        if storage is None or storage.ndim == 1:
            return index
        rows = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        extra = storage.shape[1:]
        grids = torch.meshgrid(*(torch.arange(s) for s in extra), indexing="ij")
        cells = torch.stack([g.reshape(-1) for g in grids], -1)  # [cells, ndim - 1]
        rows = rows.repeat_interleave(cells.shape[0]).unsqueeze(-1)
        return torch.cat([rows, cells.repeat(rows.shape[0] // cells.shape[0], 1)], -1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _rows_of(index, ndim: int) -> torch.Tensor:
    """The storage rows of ``index``: an int, a tensor of rows (a 1-D tensor is a batch of rows, whatever the
    storage's ``ndim``), a tuple of per-dim tensors (rows first; a tuple of 0-d tensors is one cell) or, for a
    storage with ``ndim > 1``, ``[N, ndim]`` cell coordinates (as ``rb.extend`` returns them)."""
    if isinstance(index, tuple):
        index = index[0]
    index = torch.as_tensor(index, dtype=torch.long)
    if ndim > 1 and index.ndim >= 2 and index.shape[-1] == ndim:
        index = index[..., 0]
    return index


def _generations_at(generations: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """The generation of each of ``rows`` (any shape); ``-1`` for rows out of range (negative included) or
    when there are no ``generations``."""
    out = torch.full(rows.shape, -1, dtype=torch.long)
    if generations is None:
        return out
    valid = (rows >= 0) & (rows < generations.numel())
    out[valid] = generations[rows[valid]]
    return out
