"""Storages backed by preallocated tensors: :class:`TensorStorage` and :class:`LazyTensorStorage`.

Data model: whatever the user writes (tensor, TensorDict, tensorclass, pytree) is kept in ONE backing
:class:`~tensordict.TensorDict` whose batch size is the item grid (``[rows]``, or ``[rows, *extra]`` for
``ndim > 1``); see :mod:`._codec`. Reads of an index batch are one ``index_select`` per leaf (no Python loop
over items, no advanced indexing, which is ~20x slower on uint8 frames). Writes validate the whole batch
(keys, shapes) before any leaf is touched. The number of filled rows, the last written row and a write
revision live in shared memory (:class:`~torchrl.data.replay_buffers._shared.counters.SharedCounters`).
"""

from __future__ import annotations

import math
import os
import warnings
import weakref

import numpy as np
import torch
from tensordict import TensorDictBase

import torchrl.data.replay_buffers.storages._items as _items
import torchrl.data.replay_buffers.storages._nontensor as _nt
from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers._checkpoint.io import advise_private_tensors
from torchrl.data.replay_buffers._shared.cleanup import make_scratch_dir, remove_owned_path
from torchrl.data.replay_buffers._shared.counters import SharedCounters, is_spawning
from torchrl.data.replay_buffers._shared.lock import NULL_LOCK, ProcessLock
from torchrl.data.replay_buffers._shared.row_versions import RowVersions
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer
from torchrl.data.replay_buffers.storages._casts import check_cast
from torchrl.data.replay_buffers.storages._codec import DataCodec
from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds, check_int, is_int
from torchrl.data.replay_buffers.storages._reads import RowReads
from torchrl.data.replay_buffers.storages._shared_init import SharedInit
from torchrl.data.replay_buffers.storages._state import StorageState
from torchrl.data.replay_buffers.storages._writes import WriteEncoding
from torchrl.data.replay_buffers.storages.base import CheckedWrite, Storage, _check_max_size

_COUNTERS = ("rows", "last_row", "revision")


class TensorStorage(RowReads, WriteEncoding, StorageState, Storage):
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
        compilable (bool): accepted for TorchRL compatibility (see :class:`~torchrl.data.Storage`).
            Defaults to ``False``.

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
        self._versions: RowVersions | None = None
        self._creator_pid = os.getpid()
        self.device = torch.device(device) if device not in (None, "auto") else device
        if storage is None and max_size is None:
            raise ValueError("Pass `storage` (a preallocated tensor/TensorDict) or `max_size`, or both.")
        self._counters = SharedCounters(_COUNTERS)
        self._counters["last_row"] = -1
        self._storage: TensorDictBase | None = None
        self._share_on_init = False
        self._codec: DataCodec | None = None
        self._keys: list = []
        self._key_set: set = set()
        self._extra_shape = torch.Size([])
        if storage is not None:
            codec = DataCodec.for_data(storage)
            backing = codec.encode(storage, batch_dims=self.ndim)
            if backing.batch_dims < self.ndim:
                raise ValueError(
                    f"`storage` must have at least ndim={self.ndim} leading dims shared by all its leaves; "
                    f"got batch size {list(backing.batch_size)}."
                )
            inferred = backing.batch_size.numel() if self.ndim > 1 else backing.batch_size[0]
            if max_size is not None and _check_max_size(max_size) != inferred:
                raise ValueError(
                    f"`max_size`={max_size} does not match the preallocated `storage`, which holds {inferred} "
                    f"items. Omit `max_size` or pass {inferred}."
                )
            super().__init__(inferred, compilable=self._compilable)
            self._adopt(backing, codec)
            # a preallocated storage holds a dataset: every row counts as filled
            self._counters["rows"] = backing.batch_size[0]
            self._counters["last_row"] = backing.batch_size[0] - 1
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
        if self._share_on_init and backing.device.type == "cpu" and not (backing.is_shared() or backing.is_memmap()):
            backing.share_memory_()
        if self._counters.is_shared and backing.device.type == "cpu" and self._versions is None:
            self._versions = RowVersions(backing.batch_size[0])
        self._storage = backing
        self._keys = list(backing.keys(include_nested=True, leaves_only=True))
        self._key_set = set(self._keys)
        self._use_codec(codec)
        self._extra_shape = backing.batch_size[1 : self.ndim]
        self.max_size = backing.batch_size[: self.ndim].numel()
        if bump:
            self._counters["revision"] += 1

    def _publish_shared_init(self) -> None:
        """After the first write (or load) of a ``shared_init`` storage, lets the other copies map its files."""
        state = self.shared_init_state
        if state is not None and self._storage is not None and not state.ready:
            state.publish(self._storage, self._codec)

    def _use_codec(self, codec: DataCodec) -> None:
        """Installs ``codec``, with the string entries of the backing and the storage's string width."""
        codec.strings = _nt.string_widths(self._storage) if self._storage is not None else {}
        codec.fixed_width = self.max_string_bytes
        self._codec = codec

    def _sync_shared_init(self, wait: bool = False) -> None:
        """Maps the files that another process allocated at the first write of a ``shared_init`` storage."""
        state = self.shared_init_state
        if wait and not state.ready:
            state.wait(type(self).__name__)
        if self._storage is None and state.ready:
            backing, codec = state.open()
            self._adopt(backing, codec, bump=False)

    def _allocate(self, item: TensorDictBase, rows: int) -> TensorDictBase:
        """Preallocates the backing for ``rows`` rows shaped like ``item`` (overridden by memmap storages)."""
        device = item.device if self.device in (None, "auto") else self.device
        return item.apply(
            lambda t: torch.empty((rows, *t.shape), dtype=t.dtype, device=device),
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
        item = item if item.batch_dims == self.ndim - 1 else _items.with_batch(item, extra)
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
        extra = _items.leading_shape(td)[skip : skip + self.ndim - 1]
        return -(-self.max_size // max(1, math.prod(extra)))

    def rows_written(self) -> int:
        return self._counters["rows"]

    @property
    def last_written_row(self) -> int:
        return self._counters["last_row"]

    @property
    def write_revision(self) -> int:
        return self._counters["revision"]

    def get_entry(self, key):
        """The stored values of entry ``key`` over every row of the backing, or ``None`` if there is none.

        A view of the backing (no copy): rows from :meth:`rows_written` on hold no data yet. ``None`` when the
        storage holds no data yet, holds plain tensors (no entries), or its items have no entry ``key``.

        Args:
            key (NestedKey): the entry, a str or a tuple of str.
        """
        if (self._storage is None and not self.initialized) or self._codec.kind == "tensor":
            return None
        return self._storage.get(key, None)

    def __len__(self) -> int:
        rows = self._counters["rows"]
        return rows * math.prod(self._extra_shape) if self.ndim > 1 else rows

    # -- writes -------------------------------------------------------------------------------------------------
    @property
    def write_lock(self):
        """The lock that serializes writes from every thread and process sharing this storage.

        A :class:`~torchrl.data.replay_buffers._shared.lock.ProcessLock` once the storage is shared (memory-mapped
        storages always are), a no-op context manager before. :meth:`set` takes it; buffers hold it around a
        whole write (writer cursor, storage rows, counters, sampler update).
        """
        lock = self._lock
        return NULL_LOCK if lock is None else lock

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Writes ``data`` at ``cursor`` (an int for one item, an index for a batch).

        A TensorDict may carry a subset of the stored keys (only those entries are written) or new keys (new
        entries, zero in the other rows; dropped, as in TorchRL, once the storage is shared or memory-mapped), so
        ``TensorStorage(TensorDict(batch_size=[N]))`` takes the keys of its first write. A Python ``list`` is a
        batch of items, stacked first; a lazily stacked TensorDict with ragged entries is refused (``ValueError``
        naming ``ListStorage``). The whole write is validated before any row is touched: keys that differ
        (tensors, tensorclasses, pytrees), wrong shapes, and values the stored dtype cannot hold (``7.9`` or
        ``NaN`` into an int64 entry, ``300`` into uint8) raise a ``ValueError`` and nothing is written. On a
        shared storage it runs under :attr:`write_lock`, and each written row is marked mid-write while it is
        copied (see ``consistent_reads``).
        """
        data = _items.as_batch(data)  # a list of items is a batch; a ragged lazy stack is refused
        lock = self._lock
        if lock is None:
            return self._write(cursor, data, set_cursor)
        with lock:
            return self._write(cursor, data, set_cursor)

    def check_write(self, data, n: int) -> CheckedWrite | None:
        if self._storage is None or self.ndim > 1:
            return None
        data = _items.as_batch(data)
        td, keys = self._encode_checked(data, batch=(n,))
        # a write of other keys than the stored ones may grow the backing: checked again under the lock
        return None if keys is None else CheckedWrite(data, td, self._keys)

    def _write(self, cursor, data, set_cursor: bool) -> None:
        checked = None
        if isinstance(data, CheckedWrite):
            checked = data if data.layout is self._keys else None  # re-checked if the layout changed since
            data = data.data
        single = is_int(cursor)
        if self._storage is None and self.shared_init_state is not None:
            self._init_shared(data, single)
        elif self._storage is None:
            if self._lock is not None and os.getpid() != self._creator_pid:
                raise RuntimeError(
                    f"This {type(self).__name__} is shared between processes but holds no data yet, and its first "
                    f"write comes from process {os.getpid()}, not from the one that shared it: each process would "
                    f"allocate its own tensors. Write a first batch (rb.extend) in the process that builds the "
                    f"buffer before starting the other processes."
                )
            self._init(data, batched=not single)
        # item assignment (set_cursor=False) may only overwrite filled rows; writers may also append
        rows = self._storage.batch_size[0] if set_cursor else self._counters["rows"]
        if isinstance(cursor, slice):
            cursor = range(*cursor.indices(rows))
        if single:
            cursor = check_int(cursor, rows, "cursor")
            td, keys = self._encode_checked(data, batch=())
            keys = keys if keys is not None else self._grow(td, self.ndim - 1)
            versions = self._versions
            if versions is not None:
                versions.begin(cursor)
            for key in keys:
                self._storage.get(key)[cursor].copy_(td.get(key), non_blocking=False)
            if versions is not None:
                versions.end()
            top = last = cursor
        elif isinstance(cursor, tuple):
            td = self._codec.encode(data, batch_dims=0)
            versions = self._versions
            written = None
            if versions is not None:
                written = np.unique(torch.as_tensor(cursor[0]).reshape(-1).numpy() % self._storage.batch_size[0])
                versions.begin(written)
            self._storage[cursor] = td
            if versions is not None:
                versions.end()
            top = last = rows - 1
        else:
            index = check_bounds(as_index_tensor(cursor, device=self._storage.device), rows, "cursor")
            if checked is not None and checked.encoded.batch_size[:1] == index.shape:
                td, keys = checked.encoded, self._keys
            else:
                td, keys = self._encode_checked(data, batch=(index.numel(),))
            keys = keys if keys is not None else self._grow(td, self.ndim)
            versions = self._versions
            if versions is not None:
                written = index.numpy()
                versions.begin(written)
            for key in keys:
                dst = self._storage.get(key)
                src = td.get(key)
                if src.dtype != dst.dtype or src.device != dst.device:
                    src = src.to(device=dst.device, dtype=dst.dtype)
                dst.index_copy_(0, index, src)
            if versions is not None:
                versions.end()
            # the last row written is the newest (a wrapped write [8, 9, 0, 1] ends at row 1)
            top, last = (int(index.max()), int(index[-1])) if index.numel() else (-1, -1)
        counters = self._counters
        if top + 1 > counters["rows"]:
            counters["rows"] = top + 1
        if set_cursor and last >= 0:
            counters["last_row"] = last
        counters["revision"] += 1
        if self.shared_init_state is not None:
            self._publish_shared_init()

    def _init_shared(self, data, single: bool) -> None:
        """The first write of a ``shared_init`` storage in this process (under the write lock): maps the files
        another process allocated, or allocates and publishes them."""
        self._sync_shared_init()
        if self._storage is None:
            self._init(data, batched=not single)

    def _check_entries(self, td: TensorDictBase, batch: tuple, expected_batch: torch.Size, keys: list):
        for key in keys:
            src = td.get(key)
            dst = self._storage.get(key)
            want = expected_batch + dst.shape[self.ndim :]
            if src.shape != want:
                raise ValueError(
                    f"Entry {key!r} of the data written has shape {list(src.shape)}; the storage expects "
                    f"{list(want)} ({'one item' if not batch else f'{batch[0]} items'} of shape "
                    f"{list(dst.shape[1:])}). Nothing was written."
                )
            if src.dtype != dst.dtype:  # refuse casts that would change values (7.9 or NaN into int64)
                what = "The data written" if self._codec.kind == "tensor" else f"Entry {key!r} of the data written"
                check_cast(src, dst.dtype, what)
        return td

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
        rows = self._counters["rows"]
        if isinstance(index, tuple):
            if len(index) == 1:
                index = index[0]
            elif len(index) == self.ndim and not any(isinstance(i, (slice, type(Ellipsis))) for i in index):
                return self._gather_cells(index, rows)
            else:
                return self._codec.decode(self._storage[:rows][index])
        if is_int(index):
            return self._codec.decode(self._storage[check_int(index, rows)])
        if isinstance(index, slice):
            return self._codec.decode(self._storage[:rows][index])
        if index is Ellipsis:
            return self._codec.decode(self._storage[:rows])
        index = check_bounds(as_index_tensor(index, device=self._storage.device), rows)
        if self._versions is not None and self.consistent_reads:
            return self._gather_consistent(self._storage, index, index.numpy())
        return self._gather(self._storage, index)

    def flatten(self) -> TensorStorage:
        """A 1-D :class:`TensorStorage` over the filled cells, sharing memory with this storage."""
        if self.ndim == 1:
            return self
        if not self.initialized:
            raise RuntimeError("Cannot flatten an uninitialized storage: write data first.")
        rows = self._counters["rows"]
        view = self._storage[:rows].reshape(-1, *self._storage.batch_size[self.ndim :])
        flat = TensorStorage(None, max_size=max(1, view.batch_size[0]), device=self.device)
        flat._adopt(view, self._codec)
        flat._counters["rows"] = view.batch_size[0]
        flat._counters["last_row"] = view.batch_size[0] - 1
        return flat

    def contains(self, item) -> bool:
        rows = self._counters["rows"]
        if is_int(item):
            return -rows <= int(item) < rows
        return super().contains(item)

    @property
    def is_shared(self) -> bool:
        """Whether the content and counters are shared with other processes (see :meth:`share_memory_`)."""
        return self._counters.is_shared

    def share_memory_(self) -> TensorStorage:
        """Moves the backing and the counters to shared memory (in place), so other processes see later writes.

        On a lazy storage that holds no data yet, the backing is allocated in shared memory at the first write,
        which must then come from the process that called this method. From then on writes take
        :attr:`write_lock`, and the buffers using the storage share their writer's cursor too.
        """
        self._share_on_init = True
        backing = self._storage
        if backing is not None and backing.device.type == "cpu" and not (backing.is_shared() or backing.is_memmap()):
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
        self._lock = ProcessLock()
        self._creator_pid = os.getpid()
        if self._storage is not None and self._storage.device.type == "cpu" and self._versions is None:
            self._versions = RowVersions(self._storage.batch_size[0])
        for entity in self._attached_entities:  # buffers share their writer's cursor from now on
            share = getattr(entity, "share_memory_", None)
            if share is not None:
                share()

    # -- state --------------------------------------------------------------------------------------------------
    def _empty(self) -> None:
        with self.write_lock:
            self._counters["rows"] = 0
            self._counters["last_row"] = -1
            self._counters["revision"] += 1

    def __getstate__(self):
        if is_spawning() and not self.is_shared:
            # a process being started receives the content through shared memory anyway (torch's reducers):
            # share the counters and the write lock with it too, so both see one length and one cursor
            self.share_memory_()
        return super().__getstate__()

    def __setstate__(self, state):
        super().__setstate__(state)
        if not self._counters.is_shared:  # a copy by value (pickle, torch.save): private from now on
            self._lock = None
            self._versions = None

    def __repr__(self) -> str:
        fields = "uninitialized" if self._storage is None else f"shape={list(self.shape)}"
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)}, {fields}, device={self.device})"


class LazyTensorStorage(TensorStorage):
    """A :class:`TensorStorage` that allocates its tensors at the first write, shaped like that data.

    Args:
        max_size (int): the capacity in items (cells for ``ndim > 1``).

    Keyword Args:
        device (torch.device or str): where the data lives; ``"auto"`` takes the first datum's device.
            Defaults to ``"cpu"``.
        ndim (int): how many leading dims index items. Defaults to ``1``.
        compilable (bool): accepted for TorchRL compatibility (see :class:`~torchrl.data.Storage`).
            Defaults to ``False``.
        shared_init (bool): let the first write come from any process that shares the storage (DataLoader
            workers, ``multiprocessing`` children started before any write). The storage is shared from
            construction; the first writer allocates memory-mapped files in a temporary directory that this
            storage removes with it, and the other processes map them (a read waits for that first write).
            Data then lives in those files on the host, whatever ``device``. Defaults to ``False``: a storage
            shared before its first write must receive that write from the process that shared it.
        consistent_reads (bool): see :class:`TensorStorage`. Defaults to ``True``.
        max_string_bytes (int, optional): the width, in UTF-8 bytes, of each string entry
            (``NonTensorData``/``NonTensorStack`` of str); longer strings are refused. ``None`` sizes each entry
            at its first write (at least 256 bytes) and lets a private storage widen it for longer strings
            later; a shared storage cannot widen it (see :mod:`~torchrl.data.replay_buffers.storages._nontensor`).
            Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(torch.arange(3), {"obs": torch.randn(3, 4), "reward": torch.zeros(3)})
        >>> storage.get(torch.tensor([2, 0]))["obs"].shape
        torch.Size([2, 4])

        String entries are kept too, one per item:

        >>> from tensordict import NonTensorStack, TensorDict
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(torch.arange(2), TensorDict(obs=torch.zeros(2), text=NonTensorStack("hi", "ho"), batch_size=[2]))
        >>> storage.get(torch.tensor([1, 0]))["text"].tolist()
        ['ho', 'hi']
    """

    def __init__(
        self,
        max_size: int,
        *,
        device="cpu",
        ndim: int = 1,
        compilable: bool = False,
        shared_init: bool = False,
        consistent_reads: bool = True,
        max_string_bytes: int | None = None,
    ):
        self.shared_init = check_bool("shared_init", shared_init)
        if max_string_bytes is not None:
            self.max_string_bytes = check_positive_int("max_string_bytes", max_string_bytes)
        if self.shared_init and device not in ("cpu", "auto", None) and torch.device(device).type != "cpu":
            warnings.warn(
                f"{type(self).__name__}(shared_init=True) keeps its data in memory-mapped files on the host: "
                f"`device`={device!r} is replaced by 'cpu'. Move sampled batches with `.to(device)`.",
                stacklevel=2,
            )
            device = "cpu"
        super().__init__(
            None, max_size=max_size, device=device, ndim=ndim, compilable=compilable, consistent_reads=consistent_reads
        )
        if self.shared_init:
            self.shared_init_state = SharedInit(self._shared_init_dir())
            self._make_shared()
            self._versions = RowVersions(self.max_size)  # one set of row versions seen by every copy

    def _shared_init_dir(self) -> str:
        """The directory where the first writer of a ``shared_init`` storage allocates its files."""
        path = make_scratch_dir()  # removed at exit, on SIGTERM and with this storage, by this process only
        weakref.finalize(self, remove_owned_path, path)
        return path

    def _allocate(self, item: TensorDictBase, rows: int) -> TensorDictBase:
        state = self.shared_init_state
        if state is None:
            return super()._allocate(item, rows)
        return item.expand(rows, *item.batch_size).memmap_like(prefix=state.directory, existsok=True)

