"""A storage backed by preallocated tensors: :class:`TensorStorage` (its lazy form is in :mod:`.lazy_tensor`).

Data model: whatever the user writes (tensor, TensorDict, tensorclass, pytree) is kept in ONE backing
:class:`~tensordict.TensorDict` whose batch size is the item grid (``[rows]``, or ``[rows, *extra]`` for
``ndim > 1``); see :mod:`._codec`. The number of filled rows, the last written row and a write revision live
in shared memory (:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters`).

- A write is checked in one pass before any leaf is touched: items, the reserved key, the cursor, string
  entries, keys, shapes and dtype casts (NOTE [one pass checks a write] in :mod:`._write_check`); then its
  leaves are copied (one ``index_copy_`` per leaf for a batch) and the counters move.
- Reads of an index batch are one ``index_select`` per leaf (no Python loop over items, no advanced indexing,
  which is ~20x slower on uint8 frames). With row versions (a storage shared between processes,
  ``consistent_reads``), a gather that a write overlapped reads the rows that write stamped again; see
  :class:`~torchrl.data.replay_buffers._shared.row_versions.RowVersions`.
- The checkpoint part follows the protocol of :mod:`torchrl.data.replay_buffers._checkpoint.parts`; its layout
  is described in :mod:`._checkpoint`. A storage whose ``checkpointer`` saves another layout
  (:class:`~torchrl.data.FlatStorageCheckpointer` and its subclasses: a ``storage_layout`` attribute and
  ``dump/check/load_storage_part`` methods) hands its part to it, so that ``storage.dumps`` and ``rb.dumps``
  both write that layout; a checkpoint records the layout it was written in and loads only through a
  checkpointer of that layout.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any

import numpy as np
import torch
from tensordict import (
    LazyStackedTensorDict,
    TensorDict,
    TensorDictBase,
    is_tensor_collection,
    is_tensorclass,
    lazy_stack,
)

import torchrl.data.replay_buffers.storages._checkpoint as _ckpt
from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers._checkpoint.format import read_checkpoint
from torchrl.data.replay_buffers._checkpoint.io import advise_private_tensors
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, mismatch
from torchrl.data.replay_buffers._shared.counters import SharedCounters, is_spawning
from torchrl.data.replay_buffers._shared.lock import NULL_LOCK, ProcessLock
from torchrl.data.replay_buffers._shared.row_versions import RowVersions
from torchrl.data.replay_buffers._shared.tensor_counters import TensorCounters
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._codec import DataCodec
from torchrl.data.replay_buffers.storages._index import (
    as_index_tensor,
    check_bounds,
    check_int,
    is_int,
    layout_index,
)
from torchrl.data.replay_buffers.storages._nontensor import string_widths
from torchrl.data.replay_buffers.storages._write_check import (
    WriteCheck,
    as_batch,
    cells_index,
    check_reserved,
    is_ragged_stack,
    ring_rows,
)
from torchrl.data.replay_buffers.storages.base import CheckedWrite, Storage, _check_max_size

_EVERY_ROW = slice(None)

# rows: the rows counted in len() (and sampled); last_row: the newest; written: one past the highest row holding
# data, which a write with set_cursor=False may raise without counting the row in len(); appended: the rows
# written by appends (writes continuing the ring after its newest row); append_break: the last revision made
# by anything else (see append_state)
_COUNTERS = ("rows", "last_row", "revision", "written", "appended", "append_break")
# their positions in SharedCounters.cells, which the write path reads and writes directly
_ROWS, _LAST_ROW, _REVISION, _WRITTEN, _APPENDED, _APPEND_BREAK = range(len(_COUNTERS))

STORAGE_NONE = TorchRLPhrase(
    ValueError,
    "Expected storage to be non-null",
    "Expected storage to be non-null: TensorStorage(storage=None). Pass a tensor, a TensorDict or a "
    "tensorclass to wrap, or use LazyTensorStorage(max_size) to allocate on the first write.",
)
STORAGE_MAX_SIZE = TorchRLPhrase(
    ValueError,
    "The max-size and the storage shape mismatch",
    "The max-size and the storage shape mismatch: max_size={max_size} but the storage holds {rows} rows along "
    "its first dim. Pass max_size={rows}, or leave it out.",
)
STORAGE_PYTREE_STATE_DICT = TorchRLPhrase(
    TypeError,
    "are not supported by",
    "Pytree contents are not supported by {cls}.state_dict() (which holds tensors, TensorDicts and "
    "tensorclasses); got {got}. Save it with storage.dumps(path) or rb.dumps(path), or store TensorDicts.",
)
STORAGE_FILL_UNINITIALIZED = TorchRLPhrase(
    RuntimeError,
    "Cannot fill a non-initialized pytree-based TensorStorage",
    "Cannot fill a non-initialized pytree-based TensorStorage: the checkpoint holds {got}, and {cls}.loads "
    "(and its checkpointer's loads) fills a storage that already holds data of that layout. Write one item "
    "first, then load; or load the whole buffer with rb.loads(path), which rebuilds the layout.",
)


class TensorStorage(Storage):
    """A storage over preallocated tensors.

    Args:
        storage (Tensor, TensorDict, tensorclass or pytree of tensors, optional): the preallocated backing,
            whose first ``ndim`` dims index items. ``None`` for a lazy storage (see :class:`LazyTensorStorage`).
        max_size (int, optional): the capacity in items. Inferred from ``storage`` when omitted; must match
            its leading dims when both are given.

    Keyword Args:
        device (torch.device or str): where the data lives. Defaults to ``"cpu"``.
        ndim (int): how many leading dims index items (``2`` for ``[time, envs]`` data). Defaults to ``1``.
        consistent_reads (bool): once the storage is shared with other processes, re-read the rows that a
            concurrent write changed during a batch read, so that no sampled row mixes two writes (see
            :ref:`the write and read guarantees <shared-writes>`). Costs a few microseconds per batch; only
            shared CPU storages pay it. Defaults to ``True``.
        compilable (bool): keep the counters as a tensor on the storage's device, for compiled writes and draws
            (see :class:`~torchrl.data.Storage`). Defaults to ``False``.

    A storage built over preallocated data counts every row as filled: it wraps a dataset that can be sampled
    at once. A buffer writing into it starts at row 0 and overwrites the rows in turn.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorStorage
        >>> storage = TensorStorage(TensorDict(obs=torch.arange(10.0), batch_size=[10]))
        >>> len(storage)
        10
        >>> storage.get(torch.tensor([0, 3]))["obs"]
        tensor([0., 3.])
    """

    _default_checkpointer = TensorStorageCheckpointer
    #: the width in bytes of string entries (``None``: sized by the data; see :mod:`._nontensor`)
    max_string_bytes: int | None = None
    #: the publication of the first allocation of a ``shared_init`` storage (``None`` without shared_init)
    shared_init_state = None

    def __init__(
        self,
        storage=None,
        max_size: int | None = None,
        *,
        device="cpu",
        ndim: int = 1,
        compilable: bool = False,
        consistent_reads: bool = True,
    ):
        self._compilable = False if compilable is None else check_bool("compilable", compilable)
        self.ndim = check_positive_int("ndim", ndim, type_error=False)
        self.consistent_reads = check_bool("consistent_reads", consistent_reads)
        self._lock: ProcessLock | None = None
        self.write_lock = NULL_LOCK  # see the write_lock attribute's docs below
        # row stamps (NOTE [row versions of tensor storages] below): _seqlock when shared, _stamps when private
        self._versions: RowVersions | None = None
        self._seqlock: RowVersions | None = None
        self._stamps: RowVersions | None = None
        self._creator_pid = os.getpid()
        self.device = torch.device(device) if device not in (None, "auto") else device
        if storage is None and max_size is None:
            raise STORAGE_NONE.error()
        if self._compilable:  # the counters as a tensor on the data's device (see _write_ring_tensor)
            on = self.device if isinstance(self.device, torch.device) else None
            self._counters = TensorCounters(_COUNTERS, device=on)
        else:
            self._counters = SharedCounters(_COUNTERS)
        self._counters["last_row"] = -1
        self._holds_rows = False  # compilable storages: whether len() > 0, known on the host (see has_rows)
        self.is_shared = False
        self._storage: TensorDictBase | None = None
        self._share_on_init = False
        self._codec: DataCodec | None = None
        self._check: WriteCheck | None = None  # built with the backing (see _use_codec)
        self._extra_shape = torch.Size([])
        if storage is not None:
            check_reserved(storage)
            codec = DataCodec.for_data(storage)
            backing = codec.encode(storage, batch_dims=self.ndim)
            if backing.batch_dims < self.ndim:
                raise ValueError(
                    f"`storage` must have at least ndim={self.ndim} leading dims shared by all its leaves; "
                    f"got batch size {list(backing.batch_size)}."
                )
            inferred = backing.batch_size.numel() if self.ndim > 1 else backing.batch_size[0]
            if max_size is not None and _check_max_size(max_size) != inferred:
                raise STORAGE_MAX_SIZE.error(max_size=max_size, rows=inferred)
            super().__init__(inferred, compilable=self._compilable)
            self._adopt(backing, codec)
            # a preallocated storage holds a dataset: every row counts as filled
            self._counters["rows"] = self._counters["written"] = backing.batch_size[0]
            self._counters["last_row"] = backing.batch_size[0] - 1
            self._holds_rows = backing.batch_size[0] > 0
        else:
            super().__init__(max_size, compilable=self._compilable)

    # -- backing ------------------------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        if self._storage is None and self.shared_init_state is not None:
            self._sync_shared_init()
        return self._storage is not None

    def _adopt(self, backing: TensorDictBase, codec: DataCodec, *, bump: bool = True) -> None:
        if self.device not in (None, "auto") and backing.device != self.device:
            backing = backing.to(self.device)
        if (
            self._share_on_init
            and backing.device.type == "cpu"
            and not (backing.is_shared() or backing.is_memmap())
        ):
            backing.share_memory_()
        if backing.device.type == "cpu" and self._versions is None and not self._compilable:
            self._use_versions(RowVersions(backing.batch_size[0], shared=self._counters.is_shared))
        self._exposed = self._whole_columns = None  # views of another backing, if any, are not this one's
        if self._compilable:
            self._counters.to(backing.device)
        self._storage = backing
        self._use_codec(codec)
        self._extra_shape = backing.batch_size[1 : self.ndim]
        self.max_size = backing.batch_size[: self.ndim].numel()
        if bump:
            self._bump_revision()

    # NOTE [row versions of tensor storages]: every CPU tensor storage but a compilable one stamps the rows each
    # write touches with a sequence number (RowVersions), so that a dump onto a checkpoint it wrote or loaded
    # saves only the rows written since (storages/_incremental.py). A private storage keeps them in its own
    # memory (``_stamps``) and pays one call per write: a slice fill for a writer's ring write (about a
    # microsecond, whatever the rows), one numpy scatter of an index otherwise. Once shared (share_memory_,
    # memory-mapped storages) the same versions move to shared memory, and a write brackets its copy with
    # begin/end so that gathers re-read the rows a concurrent write touched (``_seqlock``). A compilable
    # storage's ring writes run as tensor ops without host work, so it keeps none and dumps in full.
    def _use_versions(self, versions: RowVersions | None) -> None:
        """Installs the row stamps ``versions`` (NOTE [row versions of tensor storages]): a seqlock for writes
        and reads once shared, one stamp per write while private."""
        shared = versions is not None and versions.is_shared
        self._versions = versions
        self._seqlock = versions if shared else None
        self._stamps = None if shared else versions

    def _publish_shared_init(self) -> None:
        """After the first write (or load) of a ``shared_init`` storage, lets the other copies map its files."""
        state = self.shared_init_state
        if state is not None and self._storage is not None and not state.ready:
            state.publish(self._storage, self._codec)

    def _use_codec(self, codec: DataCodec) -> None:
        """Installs ``codec``, with the string entries of the backing and the storage's string width, and the
        check of writes into the backing."""
        backing = self._storage
        codec.strings = string_widths(backing) if backing is not None else {}
        codec.fixed_width = self.max_string_bytes
        self._codec = codec
        if backing is not None:
            self._check = WriteCheck(backing, codec, self.ndim, self._counters)

    def _sync_shared_init(self, wait: bool = False) -> None:
        """Maps the files that another process allocated at the first write of a ``shared_init`` storage."""
        state = self.shared_init_state
        if wait and not state.ready:
            state.wait(type(self).__name__)
        if self._storage is None and state.ready:
            if self.device not in (None, "auto") and self.device.type != "cpu":
                self.device = torch.device(
                    "cpu"
                )  # shared_init data live in files on the host (warned at init)
            backing, codec = state.open()
            self._adopt(backing, codec, bump=False)

    def _allocate(self, item: TensorDictBase, rows: int) -> TensorDictBase:
        """Preallocates the backing for ``rows`` rows shaped like ``item`` (overridden by memmap storages).

        Zero-filled, like memory-mapped files: a cell no write reached (a write lacking some stored keys, rows
        skipped by an index) reads as zero in every storage, never as uninitialised memory. A lazy stack of
        members of different shapes (``item.get(key)`` ragged) gets a lazy stack of one backing per member.
        """
        if is_ragged_stack(item):
            members = [self._allocate(member, rows) for member in item.tensordicts]
            return lazy_stack(members, dim=item.stack_dim + 1)
        device = item.device if self.device in (None, "auto") else self.device
        return item.apply(
            lambda t: torch.zeros((rows, *t.shape), dtype=t.dtype, device=device),
            batch_size=[rows, *item.batch_size],
            device=device,
        )

    def _init(self, data, batched: bool) -> None:
        codec = DataCodec.for_data(data)
        codec.fixed_width = self.max_string_bytes
        td = codec.encode(data, batch_dims=self.ndim if batched else self.ndim - 1)
        item = td[0] if batched else td
        extra = item.batch_size[: self.ndim - 1]
        if item.batch_dims < self.ndim - 1:
            lead = self.ndim if batched else self.ndim - 1
            raise ValueError(
                f"A storage with ndim={self.ndim} stores a grid of cells ([time, env] for ndim=2) and needs data "
                f"whose first {lead} dim(s) are shared by all leaves; got data of batch size {list(td.batch_size)}. "
                f"Write data with these leading dims (rb.extend takes [env, time, ...] batches with the default "
                f"`dim_extend`=ndim - 1), or use a storage with ndim=1 for flat data."
            )
        # an item keeps its own batch dims past the grid's: TensorDict items of batch [4] -> backing [rows, 4]
        cells = math.prod(extra) if self.ndim > 1 else 1
        rows = -(-self.max_size // cells)  # ceil: the grid holds at least max_size cells
        if rows < 1:
            raise ValueError(
                f"`max_size`={self.max_size} is smaller than one row of {cells} cells ({list(extra)})."
            )
        self._adopt(self._allocate(item, rows), codec)

    @property
    def shape(self) -> torch.Size:
        if self._storage is None and not self.initialized:
            return super().shape
        return self._storage.batch_size[: self.ndim]

    def _max_size_along_dim0(self, *, single_data=None, batched_data=None) -> int:
        if self._storage is not None or self.initialized:
            return self._storage.batch_size[0]
        if self.ndim == 1:
            return self.max_size
        data = single_data if single_data is not None else batched_data
        if data is None:
            raise RuntimeError("The storage is not initialized: pass the data to size its rows.")
        skip = 0 if single_data is not None else 1
        td = DataCodec.for_data(data).encode(data, batch_dims=0)
        extra = _leading_shape(td)[skip : skip + self.ndim - 1]
        return -(-self.max_size // max(1, math.prod(extra)))

    def rows_written(self) -> int:
        return self._counters.cells[_ROWS]

    def _readable_rows(self) -> int:
        """The rows that hold data: those counted in ``len()``, and rows ``set(..., set_cursor=False)`` wrote."""
        cells = self._counters.cells
        return max(cells[_ROWS], cells[_WRITTEN])

    @property
    def last_written_row(self) -> int:
        return self._counters["last_row"]

    @property
    def write_revision(self) -> int:
        return self._counters["revision"]

    def append_state(self) -> tuple[int, int, int]:
        """``(revision, appended, append_break)``: lets a reader that follows the writes (a slice sampler's
        trajectory index, in any process sharing the storage) catch up on appends in ``O(rows appended)``.

        ``appended`` counts the rows written by appends: ``set`` of ``0 < n < capacity`` rows with
        ``set_cursor=True`` exactly after the newest row, in order (wrapping around). ``append_break`` is the last
        revision made by anything else (other writes, ``empty``, loads). A reader that saw revision ``r`` and
        ``appended == a`` knows, while ``append_break <= r``, that the rows written since are the
        ``appended - a`` rows after the newest row it saw. Writers store these before ``revision``; this reads
        ``revision``, then ``appended``, then ``append_break``, so no break before the appends seen is missed.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(4), torch.zeros(4, 2))
            >>> rev, appended, _ = storage.append_state()
            >>> storage.set(torch.arange(4, 7), torch.zeros(3, 2))  # 3 rows after the newest: an append
            >>> storage.append_state()[1] - appended, storage.append_state()[2] <= rev
            (3, True)
            >>> storage.set(torch.tensor([0]), torch.zeros(1, 2))  # elsewhere: a break
            >>> storage.append_state()[2] == storage.write_revision
            True
        """
        counters = self._counters
        revision = counters["revision"]
        appended = counters["appended"]
        return revision, appended, counters["append_break"]

    def _bump_revision(self, appended: int = 0) -> None:
        """Publishes a change of the content: ``appended`` rows appended (see :meth:`append_state`), else a
        break; ``revision`` last, after the other counters."""
        counters = self._counters
        if appended:
            counters["appended"] += appended
        else:
            counters["append_break"] = counters["revision"] + 1
        counters["revision"] += 1

    def get_entry(self, key):
        """The stored values of entry ``key`` over every row of the backing, or ``None`` if there is none.

        A view of the backing (no copy): rows from :meth:`rows_written` on hold no data yet. ``None`` when the
        storage holds no data yet, holds plain tensors (no entries), or its items have no entry ``key``.

        Args:
            key (NestedKey): the entry, a str or a tuple of str.
        """
        if (self._storage is None and not self.initialized) or self._codec.kind == "tensor":
            return None
        column = self._storage.get(key, None)
        if column is not None:  # a view of every row of that entry (NOTE [edits through views])
            self._expose(slice(None), key=key if isinstance(key, tuple) else (key,))
        return column

    def __len__(self) -> int:
        rows = self._counters.cells[_ROWS]
        return rows * math.prod(self._extra_shape) if self.ndim > 1 else rows

    def len_tensor(self) -> torch.Tensor:
        if not self._compilable:
            return super().len_tensor()
        rows = self._counters.tensor[_ROWS]  # the storage's own counter: no host sync, traced by torch.compile
        return rows * math.prod(self._extra_shape) if self.ndim > 1 else rows

    @property
    def has_rows(self) -> bool:
        if self._compilable:  # known on the host: len() would read the device counter
            return self._holds_rows
        return self._counters.cells[_ROWS] > 0

    # -- writes -------------------------------------------------------------------------------------------------
    #: The lock that serializes writes from every thread and process sharing this storage: a
    #: :class:`~torchrl.data.replay_buffers._shared.lock.ProcessLock` once the storage is shared (memory-mapped
    #: storages always are), ``NULL_LOCK`` (a no-op context manager) before. :meth:`set` takes it; buffers hold it
    #: around a whole write (writer cursor, storage rows, counters, sampler update). A plain attribute, set with
    #: :attr:`is_shared` (reading either runs no code).
    write_lock = NULL_LOCK

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Writes ``data`` at ``cursor`` (an int for one item, an index for a batch) of the allocated rows.

        ``set_cursor=False`` writes the same rows but skips the bookkeeping: the length (``len``, the rows
        sampled) and the newest row do not move; such rows still read back. The first write of a lazy storage
        allocates it, whatever ``set_cursor`` (zero-filled: cells no write reaches read as zero).

        A TensorDict may carry a subset of the stored keys (only those entries are written) or new keys (new
        entries, zero in the other rows; dropped, as in TorchRL, once the storage is shared or memory-mapped), so
        ``TensorStorage(TensorDict(batch_size=[N]))`` takes the keys of its first write. TensorDict and
        tensorclass items keep their own batch dims (items of batch ``[4]``: a backing of batch
        ``[rows, 4]``). A Python ``list`` is a batch of items, stacked first (``RuntimeError`` if they do not
        stack). A lazy stack whose members differ in shape along an inner dim is kept as a lazy stack of one
        backing per member; one whose items differ in shape is refused (``ValueError`` naming ``ListStorage``).
        The whole write is validated before any row is touched: keys that differ (tensors, tensorclasses,
        pytrees), the reserved key ``"_utf8"``, wrong shapes, boolean masks of another length, and values the
        stored dtype cannot hold (``7.9`` or ``NaN`` into an int64 entry, ``300`` into uint8) raise and nothing
        is written. On a shared storage it runs under :attr:`write_lock`, and each written row is marked
        mid-write while it is copied (see ``consistent_reads``).
        """
        self._locked_write(cursor, data, set_cursor, filled_only=False)

    def __setitem__(self, index, value) -> None:
        """Item assignment: overwrites rows that already hold data (``IndexError`` past them), without moving
        the length or the newest row (``set(index, value, set_cursor=False)`` may also write new rows)."""
        self._locked_write(index, value, False, filled_only=True)

    def _write_rows(self, rows, data, set_cursor: bool, ring) -> None:
        self._locked_write(rows, data, set_cursor, False, ring)

    def _locked_write(self, cursor, data, set_cursor: bool, filled_only: bool, ring=None) -> None:
        lock = self._lock
        if lock is None:
            return self._write(cursor, data, set_cursor, filled_only, ring)
        if isinstance(data, list):  # a list of items is stacked before the lock, which stays short
            data = as_batch(data)
        with lock:
            return self._write(cursor, data, set_cursor, filled_only, ring)

    def check_write(self, data, n: int) -> CheckedWrite | None:
        check = self._check
        if check is None or self.ndim > 1 or check.members:
            return None
        # a write of other keys than the stored ones may grow the backing: checked again under the lock
        return check.prepare(data, n)

    def _write(self, cursor, data, set_cursor: bool, filled_only: bool = False, ring=None) -> None:
        """One write, under the write lock: checked in one pass (NOTE [one pass checks a write] in
        ``_write_check.py``), copied, then counted. ``ring``: ``(start, n)`` of a writer's ring write (see
        :meth:`~torchrl.data.Storage.write_rows`), whose rows need no bounds check and whose bookkeeping needs
        no number read from ``cursor``."""
        if self._storage is None:
            data = self._first_write(cursor, data)
        if ring is not None and self._compilable and set_cursor:
            return self._write_ring_tensor(cursor, data, ring)
        cells = self._counters.cells
        readable = max(cells[_ROWS], cells[_WRITTEN])  # rows holding data, set_cursor=False writes included
        capacity = self._storage.batch_size[0]
        # item assignment may only overwrite rows holding data; set() may write any allocated row
        rows = readable if filled_only else capacity
        # appends (see append_state) are counted only by writes that move the newest row
        last_row = cells[_LAST_ROW] if set_cursor else None
        index, td, keys, appended = self._check(cursor, data, rows, readable, last_row, ring=ring)
        backing = self._storage
        versions, stamps = self._seqlock, self._stamps  # NOTE [row versions of tensor storages]
        if isinstance(index, int):  # one item
            if versions is not None:
                versions.begin(index)
            elif stamps is not None:
                stamps.stamp(index)
            if keys is None:
                backing[index] = td
            else:
                for key in keys:
                    backing.get(key)[index].copy_(td.get(key), non_blocking=False)
            top = last = index
        elif isinstance(index, tuple):  # cells of rows that hold data: no bookkeeping
            if versions is not None or stamps is not None:
                touched = np.unique(torch.arange(rows)[index[0]].reshape(-1).numpy())
                (stamps.stamp if versions is None else versions.begin)(touched)
            backing[index] = td
            top = last = -1
        else:
            if versions is not None:
                if ring is not None:  # a writer's consecutive rows: slice stores, no index array
                    versions.begin_ring(*ring)
                else:
                    versions.begin(index.numpy())
            elif stamps is not None:
                if ring is not None:
                    stamps.stamp_ring(*ring)
                else:
                    stamps.stamp(index.numpy())
            _copy_rows(backing, index, td, keys)
            # the last row written is the newest (a wrapped write [8, 9, 0, 1] ends at row 1)
            if ring is not None:
                top, last = ring_rows(*ring, capacity)
            else:
                top, last = (int(index.max()), int(index[-1])) if index.numel() else (-1, -1)
        if versions is not None:
            versions.end()
        # the counters, as _bump_revision publishes them (revision last); set_cursor=False skips the length and
        # newest-row bookkeeping
        if set_cursor:
            if top >= cells[_ROWS]:
                cells[_ROWS] = top + 1
                self._holds_rows = True
            if last >= 0:
                cells[_LAST_ROW] = last
        if top >= cells[_WRITTEN]:
            cells[_WRITTEN] = top + 1
        if appended:
            cells[_APPENDED] += appended
        else:
            cells[_APPEND_BREAK] = cells[_REVISION] + 1
        cells[_REVISION] += 1
        if self.shared_init_state is not None:
            self._publish_shared_init()

    def _write_ring_tensor(self, index: torch.Tensor, data, ring) -> None:
        """A writer's ring write into a compilable storage: ``n`` rows from ``start`` (a 0-d tensor), checked
        (keys, shapes, casts: decided by shapes, no host sync), copied, and counted with tensor ops on
        :attr:`TensorCounters.tensor` (what :meth:`_write` does with Python ints), so the whole write traces into
        one ``torch.compile`` graph."""
        start, n = ring
        backing = self._storage
        capacity = backing.batch_size[0]
        index, td, keys, _ = self._check(index, data, capacity, capacity, None, ring=ring)
        _copy_rows(backing, index, td, keys)
        counters = self._counters.tensor
        rows, last_row, revision, written, appended, append_break = counters.unbind()
        end = start + n
        top = end.clamp(max=capacity)  # the highest row written, plus one
        if 0 < n < capacity:  # an append when it starts right after the newest row (see append_state)
            append = start == (last_row + 1) % capacity
            appended = appended + append * n
            append_break = torch.where(append, append_break, revision + 1)
        else:
            append_break = revision + 1
        counters.copy_(torch.stack([
            torch.maximum(rows, top), (end - 1) % capacity, revision + 1, torch.maximum(written, top), appended,
            append_break,
        ]))  # fmt: skip
        self._holds_rows = True

    def _first_write(self, cursor, data):
        """Allocates the backing for the first write (or maps the one another process allocated, for a
        ``shared_init`` storage); returns ``data`` as one batch."""
        data = as_batch(data)  # a list of items is a batch; a lazy stack of ragged items is refused
        check_reserved(data)
        single = is_int(cursor)
        if self.shared_init_state is not None:
            self._init_shared(data, single)
            return data
        if self._lock is not None and os.getpid() != self._creator_pid:
            raise RuntimeError(
                f"This {type(self).__name__} is shared between processes but holds no data yet, and its first "
                f"write comes from process {os.getpid()}, not from the one that shared it: each process would "
                f"allocate its own tensors. Write a first batch (rb.extend) in the process that builds the "
                f"buffer before starting the other processes."
            )
        self._init(data, batched=not single)
        return data

    def get_in_layout(self, index, dim_extend: int = 0):
        """Reads ``index`` given in the layout of the data ``extend`` receives (see
        :meth:`Storage.get_in_layout`).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(6, ndim=2)  # 3 steps x 2 envs
            >>> storage.set(torch.arange(3), TensorDict(t=torch.arange(3).expand(2, 3).T, batch_size=[3, 2]))
            >>> storage.get_in_layout((0, slice(1, 3)), dim_extend=1)["t"]  # env 0, steps 1 and 2
            tensor([1, 2])
            >>> storage.get_in_layout((slice(None), slice(0, 2)), dim_extend=1)["t"].shape  # [envs, steps]
            torch.Size([2, 2])
        """
        if self.ndim == 1 or not dim_extend or not isinstance(index, tuple):
            return self[index]
        backing_index, position = layout_index(index, self.ndim, dim_extend)
        out = self.get(backing_index)
        if not position:
            return out
        return self._codec.decode(_move_dim(self._codec.encode(out, batch_dims=0), 0, position))

    def set_in_layout(self, index, value, dim_extend: int = 0) -> None:
        """Writes ``value`` at ``index``, both in the layout of the data ``extend`` receives (see
        :meth:`Storage.set_in_layout`); ``value`` broadcasts to the cells selected.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(6, ndim=2)  # 3 steps x 2 envs
            >>> storage.set(torch.arange(3), TensorDict(t=torch.zeros(3, 2), batch_size=[3, 2]))
            >>> storage.set_in_layout((1, slice(0, 2)), TensorDict(t=torch.tensor(5.0)), dim_extend=1)
            >>> storage.get(slice(None))["t"]  # [steps, envs]: env 1 at steps 0 and 1
            tensor([[0., 5.],
                    [0., 5.],
                    [0., 0.]])
        """
        backing = self._storage
        if self.ndim == 1 or not dim_extend or not isinstance(index, tuple) or backing is None:
            self[index] = value
            return
        backing_index, position = layout_index(index, self.ndim, dim_extend)
        if position:
            grid = torch.empty((self._readable_rows(), *backing.batch_size[1 : self.ndim]), device="meta")
            target = list(grid[cells_index(backing_index, grid.shape[0], backing, self.ndim)].shape)
            target.insert(position, target.pop(0))  # the cells selected, in the caller's layout
            td = self._codec.encode(as_batch(value), batch_dims=0)
            shapes = {
                key if isinstance(key, tuple) else (key,): torch.Size([*target, *leaf.shape[self.ndim :]])
                for key, leaf in backing.items(include_nested=True, leaves_only=True)
            }
            td = _move_dim(_broadcast_leaves(td, shapes, target), position, 0)
            value = self._codec.decode(td)
        elif is_tensor_collection(value):  # no transpose: a TensorDict of fewer batch dims broadcasts
            cells = backing[backing_index].batch_size
            if value.batch_dims < len(cells):
                value = value.expand(cells)
        self[backing_index] = value

    def _init_shared(self, data, single: bool) -> None:
        """The first write of a ``shared_init`` storage in this process (under the write lock): maps the files
        another process allocated, or allocates and publishes them."""
        self._sync_shared_init()
        if self._storage is None:
            self._init(data, batched=not single)

    # -- reads --------------------------------------------------------------------------------------------------
    def get(self, index):
        """Reads one item (int), a view (slice) or a batch (index tensor/list; per-dim tuple for ndim > 1).

        TensorDict items read back their string entries (see :mod:`._nontensor`): a ``NonTensorStack`` for a
        batch, a ``NonTensorData`` for one item. A ``shared_init`` storage that no process has written yet
        waits for the first write.
        """
        if self._storage is None and self.shared_init_state is not None:
            self._sync_shared_init(wait=True)
        if self._storage is None:
            raise RuntimeError(
                "Cannot read from an uninitialized storage: write data first (rb.extend / rb.add)."
            )
        cells = self._counters.cells
        rows = max(cells[_ROWS], cells[_WRITTEN])  # the rows holding data (see _readable_rows)
        backing = self._storage
        if (
            type(index) is torch.Tensor
            and index.ndim == 1
            and index.dtype is torch.long
            and index.device == backing.device
        ):  # a sampler's draw, the common case: what as_index_tensor and check_bounds do below, inline
            if index.numel():
                lo, hi = index.aminmax()
                if int(lo) < 0 or int(hi) >= rows:
                    index = check_bounds(index, rows)  # raises, or maps negative positions
        else:
            if isinstance(index, tuple):
                if len(index) == 1:
                    index = index[0]
                elif len(index) == self.ndim and not any(isinstance(i, (slice, type(Ellipsis))) for i in index):
                    return self._gather_cells(index, rows)
                else:
                    self._expose(slice(0, rows))
                    return self._codec.decode(backing[:rows][index])
            if is_int(index):  # views of the rows from here on (NOTE [edits through views])
                row = check_int(index, rows)
                self._expose(row)
                return self._codec.decode(backing[row])
            if isinstance(index, slice):
                self._expose(slice(0, rows), index)
                return self._codec.decode(backing[:rows][index])
            if index is Ellipsis:
                self._expose(slice(0, rows))
                return self._codec.decode(backing[:rows])
            masks = (rows, backing.batch_size[0])
            index = check_bounds(as_index_tensor(index, device=backing.device, mask_sizes=masks), rows)
        if self._seqlock is not None and self.consistent_reads:
            return self._gather_consistent(backing, index, index.numpy())
        return self._gather(backing, index)

    def read_rows(self, index):
        if (
            type(index) is not torch.Tensor
            or index.ndim != 1
            or index.dtype is not torch.long
            or self._storage is None
            or index.device != self._storage.device
        ):
            return self.get(index)
        # a sampler's draw: in bounds by construction
        if self._seqlock is not None and self.consistent_reads:
            return self._gather_consistent(self._storage, index, index.numpy())
        return self._gather(self._storage, index)

    #: The rows handed out as views, for storages dumped incrementally (those with row versions): a mask of
    #: rows per entry key (``None``: every entry). NOTE [edits through views] in ``_incremental.py``.
    _exposed: dict | None = None
    #: the entry keys whose every row is exposed (a column handed out by ``get_entry``): marked once, so that
    #: samplers reading a column at each draw pay nothing more
    _whole_columns: set | None = None

    def _expose(self, rows, within: slice | None = None, key=None) -> None:
        """Marks ``rows`` (an int or a slice; ``within`` a slice of that slice) of entry ``key`` (``None``:
        every entry) as handed out in a view."""
        if self._versions is None:
            return
        whole = within is None and rows == _EVERY_ROW
        if whole and self._whole_columns is not None and key in self._whole_columns:
            return
        if self._exposed is None:
            self._exposed = {}
        mask = self._exposed.get(key)
        if mask is None or mask.size != self._storage.batch_size[0]:
            mask = self._exposed[key] = np.zeros(self._storage.batch_size[0], dtype=bool)
        if whole:
            if self._whole_columns is None:
                self._whole_columns = set()
            self._whole_columns.add(key)
        if within is None:
            mask[rows] = True
        else:
            mask[rows][within] = True

    def _select(self, backing: TensorDictBase, index: torch.Tensor):
        """The rows ``index`` of ``backing``: a tensor for tensor data, else a TensorDict (not decoded)."""
        if self._codec.kind == "tensor":
            return backing.get("_tensor").index_select(0, index)
        if isinstance(backing, LazyStackedTensorDict):  # items that are lazy stacks: member by member
            return backing[index]
        n = index.numel()
        return backing.apply(
            lambda t: t.index_select(0, index), batch_size=[n, *backing.batch_size[1:]], device=backing.device
        )

    def _gather(self, backing: TensorDictBase, index: torch.Tensor):
        out = self._select(backing, index)
        return out if self._codec.kind == "tensor" else self._codec.decode(out)

    def _gather_consistent(self, backing: TensorDictBase, index: torch.Tensor, rows: np.ndarray):
        """:meth:`_gather`, reading again the rows that a write touched during the read (see ``RowVersions``)."""
        versions = self._versions
        snapshot = versions.snapshot()
        out = self._select(backing, index)
        torn = versions.torn(snapshot, rows)
        attempt, started = 0, None
        while torn is not None and torn.any():
            if started is None:
                started = time.monotonic()
            positions = np.flatnonzero(torn)
            versions.wait(attempt, started, rows[positions])
            attempt += 1
            snapshot = versions.snapshot()
            where = torch.from_numpy(positions)
            out[where] = self._select(backing, index[where])
            sub_torn = versions.torn(snapshot, rows[positions])
            if sub_torn is None:
                break
            torn = np.zeros(rows.shape, dtype=bool)
            torn[positions[sub_torn]] = True
        return out if self._codec.kind == "tensor" else self._codec.decode(out)

    def _gather_cells(self, index: tuple, rows: int):
        """Reads cells given per-dimension index tensors (ndim > 1) through one flat gather."""
        shape = self._storage.batch_size[: self.ndim]
        parts = []
        for d, idx in enumerate(index):
            size = rows if d == 0 else shape[d]
            parts.append(check_bounds(as_index_tensor(idx, device=self._storage.device), size))
        flat = torch.zeros_like(parts[0])
        for d, idx in enumerate(parts):
            flat = flat * shape[d] + idx
        flat_backing = self._storage.reshape(-1, *self._storage.batch_size[self.ndim :])
        if self._seqlock is not None and self.consistent_reads:
            return self._gather_consistent(flat_backing, flat, parts[0].numpy())
        return self._gather(flat_backing, flat)

    def flatten(self) -> TensorStorage:
        """A 1-D :class:`TensorStorage` over the filled cells, sharing memory with this storage."""
        if self.ndim == 1:
            return self
        if not self.initialized:
            raise RuntimeError("Cannot flatten an uninitialized storage: write data first.")
        rows = self._counters["rows"]
        self._expose(slice(0, rows))  # the flat storage writes into these rows (NOTE [edits through views])
        view = self._storage[:rows].reshape(-1, *self._storage.batch_size[self.ndim :])
        flat = TensorStorage(None, max_size=max(1, view.batch_size[0]), device=self.device)
        flat._adopt(view, self._codec)
        flat._counters["rows"] = flat._counters["written"] = view.batch_size[0]
        flat._counters["last_row"] = view.batch_size[0] - 1
        return flat

    def shares_memory_with(self, value) -> bool:
        """Whether a tensor leaf of ``value`` (a tensor, TensorDict or tensorclass) lives in the memory of this
        storage's data: a read of the storage about to be written back, e.g. ``rb[idx] = rb[:]``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(4)
            >>> storage.set(torch.arange(2), torch.zeros(2, 3))
            >>> storage.shares_memory_with(storage[:]), storage.shares_memory_with(torch.zeros(2, 3))
            (True, False)
        """
        backing = self._storage
        if backing is None:
            return False
        if isinstance(value, torch.Tensor):
            leaves = [value]
        elif isinstance(value, TensorDictBase) or is_tensorclass(value):
            leaves = [v for v in value.values(include_nested=True, leaves_only=True) if isinstance(v, torch.Tensor)]
        else:
            return False
        stored = backing.values(include_nested=True, leaves_only=True)
        ptrs = {leaf.untyped_storage().data_ptr() for leaf in stored if leaf.device.type != "meta"}
        return any(leaf.device.type != "meta" and leaf.untyped_storage().data_ptr() in ptrs for leaf in leaves)

    def contains(self, item) -> bool:
        rows = self._counters["rows"]
        if is_int(item):
            return -rows <= int(item) < rows
        return super().contains(item)

    # -- sharing with other processes ---------------------------------------------------------------------------
    #: Whether the content and counters are shared with other processes (see :meth:`share_memory_`); a plain
    #: attribute, set with :attr:`write_lock`.
    is_shared: bool = False

    def share_memory_(self) -> TensorStorage:
        """Moves the backing and the counters to shared memory (in place), so other processes see later writes.

        On a lazy storage that holds no data yet, the backing is allocated in shared memory at the first write,
        which must then come from the process that called this method. From then on writes take
        :attr:`write_lock`, and the buffers using the storage share their writer's cursor too.
        """
        if self._compilable:  # checked before anything moves to shared memory
            self._counters.share_memory_()  # raises: a compilable storage stays in this process
        self._share_on_init = True
        backing = self._storage
        if (
            backing is not None
            and backing.device.type == "cpu"
            and not (backing.is_shared() or backing.is_memmap())
        ):
            backing.share_memory_()
        self._make_shared()
        return self

    def advise_huge_pages(self) -> bool:
        """Asks Linux to use transparent huge pages for this storage's private CPU memory (faster bulk fills:
        NOTE [huge pages for bulk fills] in ``_checkpoint_io.py``); returns whether the storage held such memory.

        Examples:
            >>> import torch; from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(1000); storage.set(torch.arange(10), torch.zeros(10, 3))
            >>> storage.advise_huge_pages(), LazyTensorStorage(10).advise_huge_pages()  # the latter holds nothing
            (True, False)
        """
        return advise_private_tensors(self._storage)

    def _make_shared(self) -> None:
        if self._counters.is_shared and self._lock is not None:
            return
        self._counters.share_memory_()
        self._lock = self.write_lock = ProcessLock()
        self.is_shared = True
        self._creator_pid = os.getpid()
        if self._versions is not None:  # a private storage's stamps, kept (its checkpoints stay incremental)
            self._use_versions(self._versions.share_memory_())
        elif self._storage is not None and self._storage.device.type == "cpu":
            self._use_versions(RowVersions(self._storage.batch_size[0]))
        for entity in self._attached_entities:  # buffers share their writer's cursor from now on
            share = getattr(entity, "share_memory_", None)
            if share is not None:
                share()

    # -- state --------------------------------------------------------------------------------------------------
    def _empty(self) -> None:
        with self.write_lock:
            self._counters["rows"] = self._counters["written"] = 0
            self._counters["last_row"] = -1
            self._holds_rows = False
            self._bump_revision()

    def _layout_checkpointer(self):
        """The storage's checkpointer when it saves a layout of its own (``None`` for the default one)."""
        checkpointer = self._checkpointer
        return checkpointer if getattr(checkpointer, "storage_layout", None) is not None else None

    def state_dict(self) -> dict[str, Any]:
        """The content (a clone of the backing), the data codec and the counters.

        Pytree contents are refused (``TypeError``, as in TorchRL): save them with :meth:`dumps`.
        """
        self.initialized  # noqa: B018 (maps the files of a shared_init storage written by another process)
        if self._codec is not None and self._codec.kind == "pytree":
            raise STORAGE_PYTREE_STATE_DICT.error(cls=type(self).__name__, got="a pytree of tensors")
        return {
            "_storage": None if self._storage is None else self._storage.clone(),
            "_codec": None if self._codec is None else self._codec.to_json(),
            "_len": self._counters["rows"],
            "_last_row": self._counters["last_row"],
            "max_size": self.max_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        backing = state_dict.get("_storage")
        if backing is None:
            self._empty()
            return
        if not isinstance(backing, TensorDictBase):
            backing = TensorDict.from_dict(backing)
        codec = self._codec_for_load(state_dict["_codec"])
        if not self.initialized:
            rows = backing.batch_size[0]
            self._adopt(self._allocate(backing[0], rows), codec)
        _ckpt.check_same_layout(self._storage, backing)
        with self.write_lock:
            versions = self._versions
            everything = slice(None)
            if versions is not None:
                versions.begin(everything)
            self._storage.update_(backing)
            if versions is not None:
                versions.end()
            self._use_codec(codec)
            self._counters["rows"] = self._counters["written"] = int(state_dict["_len"])
            self._counters["last_row"] = int(state_dict.get("_last_row", int(state_dict["_len"]) - 1))
            self._holds_rows = int(state_dict["_len"]) > 0
            self._bump_revision()
        self._publish_shared_init()

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        self.initialized  # noqa: B018 (maps the files of a shared_init storage written by another process)
        ctx.hold(self.write_lock)  # no write until the rows are copied (NOTE [consistent dumps] in format.py)
        layout = self._layout_checkpointer()
        if layout is not None:
            return layout.dump_storage_part(self, ctx)
        rows, last_row = self._counters["rows"], self._counters["last_row"]
        # row stamps: what makes dumps onto this storage's checkpoints incremental (unless its checkpointer says no)
        versions = self._versions if getattr(self._checkpointer, "incremental", True) else None
        return _ckpt.tensor_storage_part(
            self, self._storage, self._codec, rows, last_row, ctx, versions=versions, exposed=self._exposed
        )

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self.initialized  # noqa: B018
        saved = doc.get("layout")
        if saved is not None:
            layout = self._layout_checkpointer()
            here = None if layout is None else layout.storage_layout
            if here != saved:
                fix = (
                    f"Set `storage.checkpointer` to a checkpointer of the {saved!r} layout (e.g. "
                    f"{doc.get('checkpointer', 'FlatStorageCheckpointer')}(...)) before loading."
                )
                raise mismatch("the storage layout", saved, here or "standard", fix)
            return layout.check_storage_part(self, doc, tensors, ctx)
        _ckpt.check_tensor_storage_part(self, self._storage, doc, tensors, ctx)
        if doc.get("initialized"):
            self._codec_for_load(doc["codec"], warn=False)

    def check_fillable(self, path) -> None:
        """Raises ``RuntimeError`` if this storage holds no data and the storage checkpoint at ``path`` holds
        tensors or a pytree: as in TorchRL, :class:`~torchrl.data.TensorStorageCheckpointer` fills such data only
        into a storage that holds data already. (``rb.loads`` of a whole buffer rebuilds any layout.)

        Examples:
            >>> import os, tempfile, torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(4)
            >>> storage.set(range(4), torch.arange(4.0))
            >>> with tempfile.TemporaryDirectory() as d:
            ...     storage.dumps(os.path.join(d, "s"))
            ...     storage.check_fillable(os.path.join(d, "s"))  # holds data: fine
            ...     try:
            ...         LazyTensorStorage(4).check_fillable(os.path.join(d, "s"))
            ...     except RuntimeError as err:
            ...         print("refused:", "LazyTensorStorage.loads" in str(err))
            refused: True
        """
        if self.initialized:
            return
        _, metadata = read_checkpoint(path, verify=False)
        component = metadata.get("component")
        doc = component.get("doc") if isinstance(component, dict) else None
        codec = doc.get("codec") if isinstance(doc, dict) and doc.get("initialized") else None
        kind = codec.get("kind") if isinstance(codec, dict) else None
        if kind in ("tensor", "pytree"):
            got = "a tensor" if kind == "tensor" else "a pytree of tensors"
            raise STORAGE_FILL_UNINITIALIZED.error(got=got, cls=type(self).__name__)

    def _codec_for_load(self, desc: dict, warn: bool = True) -> DataCodec:
        """The codec of saved data described by ``desc``: the storage's own for its tensorclass (one that cannot
        be imported, e.g. defined in a function, loads into a storage that holds it); else resolved by name,
        with a tensorclass this process does not define loaded as TensorDicts (``UserWarning``)."""
        mine = self._codec
        if (
            mine is not None
            and mine.kind == "tensorclass"
            and isinstance(desc, dict)
            and desc == mine.to_json()
        ):
            return DataCodec("tensorclass", tensorclass=mine.tensorclass)
        try:
            return DataCodec.from_json(desc)
        except CheckpointError:  # a name that is something else here: a crafted checkpoint, not a missing class
            raise
        except ValueError:
            if not isinstance(desc, dict) or desc.get("kind") != "tensorclass":
                raise
        if warn:
            warnings.warn(
                f"The saved data are instances of the tensorclass {desc.get('tensorclass')!r}, which this "
                f"process cannot import (e.g. a class defined inside a function): {type(self).__name__} loads "
                f"them as TensorDicts. Write one instance into the storage before loading to get that class back.",
                UserWarning,
                stacklevel=4,
            )
        return DataCodec("tensordict")

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        if doc.get("layout") is not None:
            return self._layout_checkpointer().load_storage_part(self, doc, tensors, ctx)
        if not doc.get("initialized"):
            return self._empty()
        codec = self._codec_for_load(doc["codec"])
        if self._storage is None:  # filled before it is adopted: a read that fails leaves the storage empty
            backing = self._backing_for_checkpoint(doc, tensors)
            _ckpt.copy_saved_rows(doc, tensors, backing)
            self._adopt(backing, codec)
        else:
            versions = self._versions
            if versions is not None:  # every row changes: readers re-read, older checkpoints see every row as new
                versions.begin(slice(None))
            try:
                _ckpt.copy_saved_rows(doc, tensors, self._storage)
            finally:
                if versions is not None:
                    versions.end()
        versions = self._versions
        if versions is not None:
            _ckpt.remember_loaded(versions, self._storage, doc, tensors, ctx)
        self._use_codec(codec)
        self._counters["rows"], self._counters["last_row"] = doc["rows"], doc["last_row"]
        self._counters["written"] = doc["rows"]
        self._holds_rows = doc["rows"] > 0
        self._bump_revision()
        self._publish_shared_init()

    def _backing_for_checkpoint(self, doc: dict, tensors) -> TensorDictBase:
        """The backing a checkpoint is loaded into, for a storage that holds no data yet."""
        return self._allocate(_ckpt.item_template(doc), doc["batch_size"][0])

    def __getstate__(self):
        if is_spawning() and not self.is_shared:
            # a process being started receives the content through shared memory anyway (torch's reducers):
            # share the counters and the write lock with it too, so both see one length and one cursor
            self.share_memory_()
        return super().__getstate__()

    def __setstate__(self, state):
        super().__setstate__(state)
        versions = self._versions
        if not self._counters.is_shared:  # a copy by value (pickle, torch.save): private from now on
            self._lock = None
            if versions is not None and versions.is_shared:  # fresh private stamps: it dumps in full first
                versions = RowVersions(len(versions), shared=False)
        self._use_versions(versions)
        self.is_shared = self._counters.is_shared
        self.write_lock = NULL_LOCK if self._lock is None else self._lock

    def __repr__(self) -> str:
        fields = "uninitialized" if self._storage is None else f"shape={list(self.shape)}"
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)}, {fields}, device={self.device})"


def _copy_rows(backing: TensorDictBase, index: torch.Tensor, td: TensorDictBase, keys) -> None:
    """Writes the checked batch ``td`` into the rows ``index`` of ``backing``: whole, or leaf by leaf for
    ``keys`` (cast to the stored dtype and device)."""
    if keys is None:
        backing[index] = td
        return
    for key in keys:
        dst = backing.get(key)
        src = td.get(key)
        if src.dtype != dst.dtype or src.device != dst.device:
            src = src.to(device=dst.device, dtype=dst.dtype)
        dst.index_copy_(0, index, src)


def _leading_shape(td: TensorDictBase) -> torch.Size:
    """The batch size of ``td``, or the shape of its first leaf when the batch size is empty."""
    if td.batch_dims:
        return td.batch_size
    for value in td.values(include_nested=True, leaves_only=True):
        return value.shape
    return torch.Size([])


def _move_dim(td: TensorDictBase, src: int, dst: int) -> TensorDictBase:
    """``td`` with batch dim ``src`` of every leaf moved to ``dst`` (its batch size permuted alike when it
    covers both dims, else cleared)."""
    if src == dst:
        return td
    batch = list(td.batch_size)
    if len(batch) > max(src, dst):
        batch.insert(dst, batch.pop(src))
    else:
        batch = []
    return td.apply(lambda t: t.movedim(src, dst), batch_size=batch)


def _broadcast_leaves(td: TensorDictBase, shapes: dict, batch) -> TensorDictBase:
    """``td`` with each leaf ``key`` broadcast to ``shapes[key]`` (``ValueError`` naming the key if it cannot)."""
    out = TensorDict(batch_size=batch, device=td.device)
    for key, leaf in td.items(include_nested=True, leaves_only=True):
        want = shapes.get(key if isinstance(key, tuple) else (key,))
        if want is None:
            out.set(key, leaf)
            continue
        try:
            out.set(key, leaf.expand(want))
        except RuntimeError:
            raise ValueError(
                f"Entry {key!r} of the value assigned has shape {list(leaf.shape)}, which does not broadcast to "
                f"the {list(want)} cells selected. Nothing was written."
            ) from None
    return out
