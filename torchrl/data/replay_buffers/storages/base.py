"""The storage contract.

A storage holds the data of a replay buffer and knows nothing of samplers, writers or buffers. It is
indexed along its first dimension(s): a 1-D storage holds ``max_size`` items, an ``ndim=2`` storage holds a
``[max_size // n, n]`` grid (time x environments) and counts every cell in ``len()`` and ``max_size``.

Contract for subclasses:

- ``set(cursor, data, *, set_cursor=True)`` writes one item (``cursor`` an int) or a batch (a 1-D index
  tensor, a list or a range); it validates the whole write before touching stored data, so a bad write
  raises and leaves the storage unchanged;
- ``get(index)`` reads an int, a slice, a 1-D index (tensor/list/ndarray) or, for ``ndim > 1``, a tuple of
  per-dimension index tensors; tensor storages read a batch with one vectorized gather;
- ``__len__``, ``state_dict()``/``load_state_dict()``, ``_empty()``.

What readers other than ``get`` use (slice samplers finding trajectories): :meth:`Storage.rows_written`,
:attr:`Storage.last_written_row` (where a full ring buffer wrapped), :attr:`Storage.write_revision` (what
caches key on) and, on tensor storages, :meth:`TensorStorage.get_entry` (one entry over all rows, no copy).
A ring-buffer subclass that wraps overrides the first three.

Writers store a write with :meth:`Storage.write_rows` (``set`` plus the slot generations) and then call
:meth:`Storage.mark_update`, which forwards the written index to every
attached entity (the buffers that use the storage; they forward it to their sampler). When a storage moves to
shared memory (:meth:`share_memory_`), it calls ``entity.share_memory_()`` on each attached entity, so a buffer
shares its writer's cursor from the same moment.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers._shared.lock import NULL_LOCK
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
from torchrl.data.replay_buffers.component import Component
from torchrl.data.replay_buffers.storages.storage_dataset import StorageDataset


class Storage(Component):
    """Base class of replay-buffer storages.

    Args:
        max_size (int): the capacity, counted in items (cells for ``ndim > 1``).
        checkpointer (StorageCheckpointerBase, optional): what :meth:`dumps` and :meth:`loads` delegate to (see
            :attr:`checkpointer`). Defaults to ``None`` (the storage class's own).
        compilable (bool): tensor storages (RAM and memory-mapped) keep their length and counters in a tensor
            on their device (:meth:`len_tensor`), so that a buffer's writes and draws trace into one
            ``torch.compile(fullgraph=True)`` graph; such a storage stays private to its process (sharing it
            raises a ``RuntimeError``). See the "On the GPU and under torch.compile" docs page. Other storages
            accept it for TorchRL compatibility. Defaults to ``False``.

    Class attributes:
        ndim (int): the number of leading dimensions that index items. Defaults to ``1``.
        requires_shared_state (bool): ``True`` for a storage whose reads depend on per-process state (a
            stream position), which a DataLoader worker copy would duplicate. Defaults to ``False``.
        is_ensemble (bool): ``True`` for a storage whose items live in several member storages with their own
            indices (:class:`~torchrl.data.StorageEnsemble`), which :meth:`as_dataset` refuses. Defaults to
            ``False``.
        writable (bool): ``False`` for a read-only storage (:class:`~torchrl.data.DatasetStorage`): a buffer
            built over it without a writer gets an :class:`~torchrl.data.ImmutableDatasetWriter`, so writes
            raise. Defaults to ``True``.
        stable_items (bool): ``False`` when reading index ``i`` twice may return two different items (a
            dataset with random augmentation) and the storage has no trajectory metadata to index: a buffer
            over it accepts only samplers that draw indices uniformly (:class:`~torchrl.data.RandomSampler`,
            :class:`~torchrl.data.SamplerWithoutReplacement`) and raises ``TypeError`` for the others.
            Defaults to ``True``.
    """

    ndim: int = 1
    requires_shared_state: bool = False
    is_ensemble: bool = False
    writable: bool = True
    stable_items: bool = True
    checkpoint_role = "storage"
    _rng: torch.Generator | None = None
    _default_checkpointer: type[StorageCheckpointerBase] = StorageCheckpointerBase
    _checkpointer: StorageCheckpointerBase | None = None

    _compilable: bool = False
    #: Whether the storage was built with ``compilable=True`` (tensor storages then keep their counters as
    #: tensors on their device: see :meth:`len_tensor` and the "On the GPU and under torch.compile" docs page);
    #: ``_compilable`` is TorchRL's name of it. A plain attribute: reading it runs no code.
    compilable: bool = False

    def __init__(
        self, max_size: int, checkpointer: StorageCheckpointerBase | None = None, compilable: bool = False
    ):
        self.max_size = _check_max_size(max_size)
        self._compilable = False if compilable is None else check_bool("compilable", compilable)
        self.compilable = self._compilable
        self._attached_entities: list[Any] = []
        if checkpointer is not None:
            self.checkpointer = checkpointer  # checked by the setter

    # -- contract ------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def set(self, cursor, data, *, set_cursor: bool = True) -> None: ...

    @abc.abstractmethod
    def get(self, index): ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def _empty(self) -> None: ...

    def contains(self, item) -> bool:
        """Whether ``item`` (an int or an index tensor) designates filled slots."""
        n = len(self)
        if isinstance(item, int):
            return -n <= item < n
        item = torch.as_tensor(item)
        return bool(((item >= -n) & (item < n)).all()) if item.numel() else True

    # -- sharing with other processes ---------------------------------------------------------------------------
    #: Whether other processes holding a copy of this storage see its writes (``False`` here). A plain attribute
    #: (reading it runs no code), set by storages that can be shared.
    is_shared: bool = False
    #: The context manager a writer holds around a write: a no-op for storages that are never shared. A plain
    #: attribute, set by storages that can be shared.
    write_lock = NULL_LOCK

    def check_shareable(self) -> None:
        """Raises a ``RuntimeError`` if other processes cannot write this storage; what a buffer calls before
        :meth:`ReplayBuffer.share <torchrl.data.ReplayBuffer.share>` (or ``shared=True``) changes anything.

        Every storage may be shared by default; a storage that lives in one process's memory
        (:class:`~torchrl.data.ListStorage` and its subclasses) refuses.
        """
        return None

    def check_write(self, data, n: int) -> CheckedWrite | None:
        """Validates a batch of ``n`` items for a later :meth:`set`, without the write lock.

        Writers of a shared storage call it before taking :attr:`write_lock`, so that the validation of one
        process's write overlaps another process's write instead of lengthening the locked section; ``set``
        then accepts the result in place of the data. ``None`` means nothing was prepared (the default, and
        a storage that holds no data yet): pass the data itself to ``set``.
        """
        return None

    # -- entities notified of writes --------------------------------------------------------------------------
    def attach(self, buffer) -> None:
        """Registers ``buffer`` to be told of every write through ``buffer.mark_update(index)``.

        Attaching the same object twice is a no-op.
        """
        if not any(entity is buffer for entity in self._attached_entities):
            self._attached_entities.append(buffer)

    def detach(self, buffer) -> None:
        """Stops telling ``buffer`` of writes (the reverse of :meth:`attach`); a buffer not attached is ignored."""
        self._attached_entities[:] = [entity for entity in self._attached_entities if entity is not buffer]

    def mark_update(self, index) -> None:
        """Tells every attached entity that ``index`` was written."""
        for entity in self._attached_entities:
            entity.mark_update(index)

    def write_rows(
        self, rows, data, *, counted=None, track_generations: bool = False, set_cursor: bool = True, ring=None
    ):
        """A writer's write: :meth:`set` ``data`` at ``rows``, then count it in :meth:`slot_generations`.

        The call a writer makes once it chose the rows (it then moves its cursor and calls :meth:`mark_update`):
        the write is checked before anything is stored, so a refused write raises here and counts nothing.

        Args:
            rows: where ``data`` goes, as :meth:`set` takes it (an int or a 1-D index).
            data: the data, or what :meth:`check_write` returned for it.

        Keyword Args:
            counted: the rows whose generation gains one per time they appear (a ring write larger than the
                storage lists a row several times). Defaults to ``rows``.
            track_generations (bool): allocate the generations if the storage does not keep them yet (a writer
                built with ``track_generations=True``). Defaults to ``False``.
            set_cursor (bool): see :meth:`set`. Defaults to ``True``.
            ring (tuple, optional): ``(start, n)`` when ``rows`` (a 1-D index) are the ``n`` consecutive rows
                from ``start`` of a ring write, wrapping at the rows the storage cycles over (what a
                :class:`~torchrl.data.RoundRobinWriter` writes). A tensor storage then skips the bounds check and
                counts the write from ``start`` and ``n`` (no number read from the index: no host sync); a
                compilable one counts it with tensor ops (``start`` a 0-d tensor). Defaults to ``None``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(4)
            >>> storage.write_rows(torch.arange(2), torch.zeros(2), track_generations=True)
            >>> storage.slot_generations().tolist()
            [0, 0, -1, -1]
        """
        self._write_rows(rows, data, set_cursor, ring)
        if track_generations or self._slot_generations is not None:
            self.bump_generations(rows if counted is None else counted, allocate=track_generations)

    def _write_rows(self, rows, data, set_cursor: bool, ring) -> None:
        """The :meth:`set` of :meth:`write_rows` (tensor storages use ``ring``)."""
        self.set(rows, data, set_cursor=set_cursor)

    def read_rows(self, index):
        """Reads the items at ``index``, drawn by one of this package's samplers (``Sampler.draws_in_bounds``):
        :meth:`get` without the bounds check a tensor storage makes on other indices (it reads numbers from the
        index: a host sync). What a buffer's ``sample`` calls.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(4)
            >>> storage.set(torch.arange(3), torch.arange(3) * 10)
            >>> storage.read_rows(torch.tensor([2, 0]))
            tensor([20,  0])
        """
        return self.get(index)

    # -- slot generations (kept here so every writer of the storage bumps the same counts) ----------------------
    # NOTE [slot generations]: the write count of each storage row lives on the storage (``slot_generations``),
    # allocated once a writer built with ``track_generations=True`` uses it. Every writer of that storage bumps it,
    # tracking or not: a write adds 1 per time a row is written (a row written 3 times by one ``extend`` gains 3),
    # ``empty()`` adds 1 to every row written. So a buffer's handles go stale when another buffer (or another
    # writer) overwrites rows of a storage they share.
    _slot_generations: torch.Tensor | None = None

    def bump_generations(self, written, rows: int | None = None, *, allocate: bool = False) -> None:
        """Adds one to the generation of each row of ``written`` (repetitions count), if the storage keeps
        generations for its ``rows`` rows (defaults to the rows it cycles over); ``allocate`` makes it keep them
        (NOTE [slot generations])."""
        if rows is None:
            rows = self._max_size_along_dim0()
        generations = self.slot_generations(rows if allocate else None)
        if generations is None or generations.numel() != rows:
            return
        written = torch.as_tensor(written, dtype=torch.long).reshape(-1)
        if written.numel() == 1:
            generations[int(written)] += 1
        else:
            generations.index_add_(0, written, torch.ones_like(written))

    def slot_generations(self, rows: int | None = None) -> torch.Tensor | None:
        """The write count ("generation") of each row, ``-1`` for a row never written: one ``[rows]`` int64
        tensor that every writer of this storage bumps (see
        :meth:`RoundRobinWriter.generations_of <torchrl.data.RoundRobinWriter.generations_of>`).

        ``None`` until a writer built with ``track_generations=True`` asks for it by passing ``rows``, which
        allocates it (all ``-1``; in shared memory for a shared storage). Writers update it in place.
        """
        generations = self._slot_generations
        if rows is not None and (generations is None or generations.numel() != rows):
            generations = torch.full((int(rows),), -1, dtype=torch.long)
            if self.is_shared:
                generations.share_memory_()
            self._slot_generations = generations
        return generations

    def load_slot_generations(self, generations: torch.Tensor | None) -> None:
        """Replaces :meth:`slot_generations` (a writer restoring its checkpoint)."""
        if generations is not None and self.is_shared:
            generations.share_memory_()
        self._slot_generations = generations

    # -- conveniences built on the contract -------------------------------------------------------------------
    def __getitem__(self, index):
        return self.get(index)

    def get_in_layout(self, index, dim_extend: int = 0):
        """``self[index]``, with ``index`` given in the layout of the data a buffer's ``extend`` receives (its
        items along dim ``dim_extend``), and the result in that layout too.

        What ``rb[index]`` calls. For an ``ndim=2`` tensor storage (backing ``[time, envs]``) written by a
        buffer with ``dim_extend=1``, ``index`` is ``[envs, time]``: ``rb[0, 3:4]`` is env 0 at step 3. The
        same as ``self[index]`` for 1-D storages and ``dim_extend=0``.
        """
        return self[index]

    def set_in_layout(self, index, value, dim_extend: int = 0) -> None:
        """``self[index] = value`` with ``index`` and ``value`` in the buffer's layout (see
        :meth:`get_in_layout`); ``value`` broadcasts to the cells ``index`` selects. What ``rb[index] = value``
        calls; like item assignment, it moves neither the length nor the newest row."""
        self[index] = value

    def __setitem__(self, index, value) -> None:
        self.set(index, value, set_cursor=False)

    def __iter__(self) -> Iterator:
        for i in range(len(self)):
            yield self.get(i)

    def __contains__(self, item) -> bool:
        return self.contains(item)

    @property
    def shape(self) -> torch.Size:
        """The shape of the item grid: ``[max_size]`` for 1-D storages."""
        if self.ndim > 1:
            raise RuntimeError(
                f"{type(self).__name__} with ndim={self.ndim} has no shape before it is initialized."
            )
        return torch.Size([self.max_size])

    def _max_size_along_dim0(self, *, single_data=None, batched_data=None) -> int:
        """The number of rows the ring buffer cycles over (``max_size`` for 1-D storages)."""
        return self.max_size

    def len_tensor(self) -> torch.Tensor:
        """``len(self)`` as a 0-d int64 tensor on the storage's device (CPU for storages without one).

        What samplers read on paths that must not read a number back to the host: a compilable tensor storage
        keeps its length as this tensor (updated in place by writes, traced by ``torch.compile``); other storages
        build it from ``len()``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(3), torch.zeros(3, 2))
            >>> storage.len_tensor()
            tensor(3)
        """
        device = getattr(self, "device", None)
        return torch.tensor(len(self), dtype=torch.long, device=device if device is not None else "cpu")

    @property
    def has_rows(self) -> bool:
        """Whether the storage holds an item (``len(self) > 0``), read without a host sync."""
        return len(self) > 0

    @property
    def _is_full(self) -> bool:
        return len(self) >= self.max_size

    def rows_written(self) -> int:
        """How many rows along the first dimension hold data (``len(self)`` for 1-D storages)."""
        return len(self)

    @property
    def last_written_row(self) -> int:
        """The row written last, which holds the newest data (``rows_written() - 1`` here; ``-1`` when empty).

        A ring-buffer storage that wraps reports the row it wrote last, so that readers can tell the newest
        row from the oldest one, which follows it.
        """
        return self.rows_written() - 1

    @property
    def write_revision(self) -> int | None:
        """A number that changes with every write, load and ``empty()``: caches of values derived from the
        content key on it. ``None`` for a storage that keeps none (key on ``len()`` instead)."""
        return None

    def flatten(self) -> Storage:
        """Returns a 1-D storage over the same items (``self`` for 1-D storages)."""
        return self

    def as_dataset(self, *, share_memory: bool = True, transport: str = "ring") -> StorageDataset:
        """A map-style :class:`torch.utils.data.Dataset` view of this storage.

        See :class:`~torchrl.data.StorageDataset` for ``share_memory`` and ``transport`` (how worker processes
        send batches back: ``"ring"``, ``"consolidated"`` or ``"torch"``).
        """
        return StorageDataset(self, share_memory=share_memory, transport=transport)

    # -- checkpoints ------------------------------------------------------------------------------------------
    @property
    def checkpointer(self) -> StorageCheckpointerBase:
        """What :meth:`dumps` and :meth:`loads` delegate to (TorchRL's seam); every checkpointer writes the
        pickle-free format of :mod:`torchrl.data.replay_buffers.checkpointers`. Setting ``None`` restores the
        default of the storage class (e.g. :class:`~torchrl.data.TensorStorageCheckpointer`)."""
        if self._checkpointer is None:
            self._checkpointer = self._default_checkpointer()
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, checkpointer: StorageCheckpointerBase | None) -> None:
        default = self._default_checkpointer
        if checkpointer is not None and not isinstance(checkpointer, StorageCheckpointerBase):
            raise TypeError(
                f"`checkpointer` must be a StorageCheckpointerBase (e.g. {default.__name__}()) or None, got "
                f"{checkpointer!r} ({type(checkpointer).__name__})."
            )
        family = next((c for c in type(checkpointer).__mro__ if c.__dict__.get("saves")), None)
        if family is not None and not issubclass(default, family):
            raise TypeError(
                f"`checkpointer` {checkpointer!r} saves {family.saves}, not a {type(self).__name__}. Use "
                f"{default.__name__}() or None (the default of this storage)."
            )
        self._checkpointer = checkpointer

    def dumps(self, path, **kwargs) -> None:
        """Saves this storage to the checkpoint directory ``path`` through :attr:`checkpointer`, with the
        result of the save hooks in place of the stored items (see :meth:`register_save_hook`).

        Keyword arguments (``fsync``, ``progress``) go to the checkpointer's ``dumps``.
        """
        with self.saving(path):
            self.checkpointer.dumps(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a checkpoint written by :meth:`dumps` into this storage (validated first) through
        :attr:`checkpointer`."""
        self.checkpointer.loads(self, path)

    # TorchRL's aliases, with its signatures
    def dump(self, *args, **kwargs) -> None:
        """Alias of :meth:`dumps`."""
        self.dumps(*args, **kwargs)

    def save(self, *args, **kwargs) -> None:
        """Alias of :meth:`dumps`."""
        self.dumps(*args, **kwargs)

    def load(self, *args, **kwargs) -> None:
        """Alias of :meth:`loads`."""
        self.loads(*args, **kwargs)

    # -- save hooks (TorchRL's, on this checkpoint format) -----------------------------------------------------
    _save_hooks: tuple = ()  # the registered hooks, in order (a list once one is registered); never pickled

    def register_save_hook(self, hook) -> None:
        """Registers ``hook(data, path=path)``, run on the stored items by every save of this storage
        (:meth:`dumps`, and ``rb.dumps`` of a buffer over it): its return value is what is saved, the storage
        itself is unchanged (TorchRL's save hooks).

        Before the call, a hook that has the attributes ``shift`` and ``is_full`` gets ``shift`` set to the row
        after the last one written and ``is_full`` to whether the storage is full; hooks run in the order they
        were registered, each on the previous one's result. The result must keep the stored layout (the
        checkpoint format stays tensor files plus JSON): a hook that changes it makes the save raise a
        ``ValueError`` before anything is written. Hooks are not pickled (as in TorchRL).

        Args:
            hook (callable): ``hook(data, path=path) -> data``.

        Examples:
            >>> import os, tempfile, torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(3), torch.arange(3))
            >>> storage.register_save_hook(lambda data, path=None: data + 10)
            >>> with tempfile.TemporaryDirectory() as d:
            ...     storage.dumps(os.path.join(d, "s"))
            ...     fresh = LazyTensorStorage(10)
            ...     fresh.set(0, torch.tensor(0))  # tensor data fill a storage that holds data (TorchRL's rule)
            ...     fresh.loads(os.path.join(d, "s"))
            >>> fresh.get(torch.arange(3)).tolist(), storage.get(torch.arange(3)).tolist()
            ([10, 11, 12], [0, 1, 2])
        """
        if not callable(hook):
            raise TypeError(
                f"A save hook must be a callable hook(data, path=path), got {hook!r} ({type(hook).__name__})."
            )
        if self.is_ensemble or not self.writable:
            raise TypeError(
                f"Save hooks rewrite the stored items for the time of a save, and a {type(self).__name__} "
                f"{'keeps its items in member storages' if self.is_ensemble else 'is read-only'}. Register the "
                f"hook on a storage that holds the items (e.g. a member storage), or transform the data before "
                f"writing it."
            )
        hooks = self.__dict__.get("_save_hooks")
        if hooks is None:
            hooks = self._save_hooks = []
        hooks.append(hook)

    def register_load_hook(self, hook) -> None:
        """Not supported: loading runs no code (see the "On-disk format" entry of the differences page). Raises
        ``NotImplementedError``, as :attr:`checkpointer`'s ``register_load_hook`` does; transform the data after
        loading it instead."""
        self.checkpointer.register_load_hook(hook)

    @contextlib.contextmanager
    def saving(self, path):
        """Within this block, the storage holds what its save hooks return for its stored items (see
        :meth:`register_save_hook`); the items are put back when it ends, also on an error. Without hooks it
        changes nothing.

        What a save calls around its writing of this storage's part; with hooks, it holds :attr:`write_lock`
        meanwhile (no write of another process sees the hooks' result). A hook result that cannot be written in
        place of the items raises ``ValueError`` on entry, with the storage unchanged.
        """
        if not self._save_hooks:
            yield
            return
        with self.write_lock:
            with self._hooks_applied(path):
                yield

    @contextlib.contextmanager
    def _hooks_applied(self, path):
        rows = self.rows_written()
        if not rows:
            yield
            return
        hooks = self._save_hooks
        index = torch.arange(rows)
        stored = self[:rows]
        data = stored
        for hook in hooks:
            if hasattr(hook, "shift"):
                last = self.last_written_row
                hook.shift = last + 1 if isinstance(last, int) and last >= 0 else len(self)
            if hasattr(hook, "is_full"):
                hook.is_full = len(self) >= self.max_size
            data = hook(data, path=path)
        if data is stored:
            yield
            return
        kept = stored.clone() if hasattr(stored, "clone") else list(stored)
        try:
            self.set(index, data, set_cursor=False)  # validated before anything is written
        except Exception as err:
            raise ValueError(
                f"The save hooks returned data that cannot be saved in place of the stored items ({err}). A save "
                f"hook must return the items with their stored layout. Nothing was saved."
            ) from err
        try:
            yield
        finally:
            self.set(index, kept, set_cursor=False)

    def __getstate__(self):
        state = super().__getstate__()
        state["_attached_entities"] = []  # buffers re-attach themselves when they are unpickled
        state.pop("_save_hooks", None)  # hooks are not pickled (TorchRL's rule)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)})"


class CheckedWrite:
    """A batch validated by :meth:`Storage.check_write`: ``data`` as given, ``encoded`` as the storage keeps it,
    and ``layout``, the storage's layout it was checked against (a write re-checks when that changed)."""

    __slots__ = ("data", "encoded", "layout")

    def __init__(self, data, encoded, layout):
        self.data = data
        self.encoded = encoded
        self.layout = layout


_MAX_POSITIONS = torch.iinfo(torch.int64).max  # positions are int64 indices


def _check_max_size(max_size) -> int:
    if isinstance(max_size, torch.SymInt) or (isinstance(max_size, torch.Tensor) and max_size.numel() == 1):
        max_size = int(max_size)
    max_size = check_positive_int("max_size", max_size)
    if max_size > _MAX_POSITIONS:
        raise ValueError(
            f"`max_size`={max_size} is larger than any storage can index: positions are int64, so `max_size` "
            f"must be at most 2**63 - 1 ({_MAX_POSITIONS}). Pass the number of items the storage should hold."
        )
    return max_size
