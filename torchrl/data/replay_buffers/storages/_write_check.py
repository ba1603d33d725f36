"""The write check of tensor storages: one pass over a write, before any stored value changes.

NOTE [one pass checks a write]. :meth:`TensorStorage.set <torchrl.data.TensorStorage.set>` hands the cursor and
the data to the storage's :class:`WriteCheck`, which, in this order:

1. makes the data one batch (items): as in TorchRL, a Python ``list`` is a batch of items (TensorDicts,
   tensorclasses, tensors or pytrees of one structure), stacked first; a ``tuple`` stays a pytree. A lazily
   stacked TensorDict is written as the dense batch it stands for; when its items differ in shape no tensor
   storage can hold it, and the error names the storages that can;
2. refuses a top-level entry named like the reserved key of string entries (see :mod:`._nontensor`);
3. turns the cursor into an int, a 1-D int64 index or (``ndim > 1``) a per-dim tuple, checked against the rows
   the write may reach, and counts the rows it appends after the newest one (see :mod:`._index`);
4. encodes the data with the storage's :class:`~._codec.DataCodec` (strings become UTF-8 leaves; a private
   storage widens a string entry too narrow for the data, a shared one refuses the write);
5. checks keys, shapes and dtype casts against the backing.

It returns ``(index, encoded data, keys to copy, rows appended)``; the storage copies the leaves and moves its
counters. Anything refused raises first, and nothing was written.

Keys. A write of TensorDicts updates only the entries it carries: a subset of the stored keys leaves the other
entries of the written rows as they were, and a new key becomes a new entry of the backing (zero-filled in the
rows not written), so ``TensorStorage(TensorDict(batch_size=[N]))`` takes the keys of its first write. A backing
shared with other processes (shared memory, memory-mapped files) cannot grow an entry that the other processes
would see, so there, as in TorchRL, keys the storage does not hold are dropped from the write. Tensors,
tensorclasses and pytrees keep a fixed structure: every write must carry all of it.

Casts. An entry keeps the dtype of its first write; later writes are cast to it, and ``torch`` casts silently
(``7.9`` becomes ``7`` in an int64 entry, ``NaN`` and ``2**70`` become ``INT64_MIN``, ``300`` becomes ``44`` in a
uint8 entry, ``1e300`` becomes ``inf`` in a float32 one). :func:`check_cast` refuses such writes. Accepted:
integral floats into integer entries (``3.0`` -> ``3``), ints into float entries that hold them exactly (every
int up to ``2**24`` in magnitude for float32, ``2**53`` for float64, ``2**11`` for float16, ``2**8`` for bfloat16,
and larger ones the dtype happens to represent, such as ``2**40``; ``2**62 + 1`` would become ``2**62`` in a float32
entry and is refused), floats into float entries (rounding to the stored precision) as long as every value stays in
range, and for bool entries only the values ``0`` and ``1``. The check costs nothing when the dtypes match and is otherwise a few vectorized reductions.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.utils._pytree as pytree
from tensordict import LazyStackedTensorDict, TensorDictBase
from tensordict.utils import is_tensorclass

import torchrl.data.replay_buffers.storages._nontensor as _nt
from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.errors import ValueRuntimeError
from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds, check_int, is_int
from torchrl.data.replay_buffers.storages.base import CheckedWrite

STORAGE_UNSTACKABLE_LIST = TorchRLPhrase(
    ValueRuntimeError,
    "Stacking the elements of the list resulted in an error",
    "Stacking the elements of the list resulted in an error: a list passed to extend() is a list of items, "
    "which must share their structure and shapes ({detail}). Pass items of one structure, or a TensorDict "
    "with a batch dimension.",
)

_SHOWN = 3  # offending values quoted in a cast error


class WriteCheck:
    """Checks writes into the backing of a tensor storage in one pass (see NOTE [one pass checks a write]).

    The storage builds one per backing and codec; it holds the layout writes are checked against.

    Args:
        backing (TensorDictBase): the storage's backing (batch size ``[rows, *grid dims, *item dims]``).
        codec (DataCodec): the storage's codec, its ``strings`` set from ``backing``.
        ndim (int): how many leading dims of ``backing`` index items.
        counters (SharedCounters): the storage's counters: once they are shared, the backing cannot grow.

    Attributes:
        keys (list): the leaf keys of the backing; a new list whenever the layout changes (a new entry, a wider
            string entry), so that a :class:`~.base.CheckedWrite` made against an older layout is checked again.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers._shared.counters import SharedCounters
        >>> from torchrl.data.replay_buffers.storages._codec import DataCodec
        >>> backing = TensorDict(x=torch.zeros(4, dtype=torch.int64), batch_size=[4])
        >>> check = WriteCheck(backing, DataCodec("tensordict"), 1, SharedCounters(("rows",)))
        >>> data = TensorDict(x=torch.tensor([3.0, 4.0]), batch_size=[2])
        >>> index, td, keys, appended = check(torch.tensor([1, 2]), data, 4, 0, last_row=0)
        >>> index.tolist(), keys, appended
        ([1, 2], ['x'], 2)
        >>> check(0, TensorDict(x=torch.tensor(7.9)), 4, 0)
        Traceback (most recent call last):
        ...
        ValueError: Entry 'x' of the data written holds values that are not integers in [...
    """

    __slots__ = ("backing", "codec", "counters", "ndim", "extra_shape", "keys", "key_set", "members")

    def __init__(self, backing: TensorDictBase, codec, ndim: int, counters):
        self.backing = backing
        self.codec = codec
        self.counters = counters
        self.ndim = ndim
        self.extra_shape = backing.batch_size[1:ndim]
        self.members = isinstance(backing, LazyStackedTensorDict)  # items that are lazy stacks of members
        self.keys = list(backing.keys(include_nested=True, leaves_only=True))
        self.key_set = set(self.keys)

    def __call__(
        self, cursor, data, rows: int, readable: int, last_row: int | None = None, *, batched=False, ring=None
    ):
        """Checks a write of ``data`` at ``cursor`` among the first ``rows`` rows; returns
        ``(index, td, keys, appended)``.

        Args:
            cursor: where to write: an int, a slice, an index (tensor, list, range, ndarray, boolean mask) or, for
                ``ndim > 1``, a per-dim tuple; ``None`` for a batch of ``rows`` items whose rows are chosen later
                (see :meth:`prepare`).
            data: what the user writes, or a :class:`~.base.CheckedWrite`, used as it is if the layout has not
                changed since it was made.
            rows (int): the rows the write may reach.
            readable (int): the rows holding data (a boolean mask has that length or the backing's).
            last_row (int, optional): the newest row, to count the rows appended after it; ``None``: not counted.

        Keyword Args:
            batched (bool): ``data`` is already one batch, checked for the reserved key. Defaults to ``False``.
            ring (tuple, optional): ``(start, n)`` when ``cursor`` holds the ``n`` consecutive ring rows from
                ``start`` that a writer chose: in bounds by construction (not checked, so no number is read
                from the index) and counted as appended from the ints. Defaults to ``None``.

        Returns:
            ``index``: an int (one item), a 1-D int64 tensor (a batch) or a tuple (cells of an ``ndim > 1``
            grid); ``td``: the data as the backing keeps it; ``keys``: the leaves to copy from ``td`` (new entries
            already added to the backing), or ``None`` when ``td`` is assigned at ``index`` whole (cells, lazy
            stacks; with ``cursor=None``, a write of other keys than the stored ones); ``appended``: how many rows
            after ``last_row`` the write appends (see :func:`appended_run`).
        """
        checked = None
        if isinstance(data, CheckedWrite):
            checked = data if data.layout is self.keys else None  # checked again if the layout changed since
            data = data.data
        elif not batched:
            data = as_batch(data)
            check_reserved(data)
        backing = self.backing
        appended = 0
        # the cursor (indices)
        if cursor is None:
            index, batch = None, (rows,)
        elif ring is not None:  # a writer's ring rows (an index tensor): in bounds by construction
            index = cursor if cursor.device == backing.device else cursor.to(backing.device, non_blocking=True)
            batch = (index.numel(),)
        elif (
            type(cursor) is torch.Tensor
            and cursor.ndim == 1
            and cursor.dtype is torch.long
            and cursor.device == backing.device
        ):  # rows chosen by a writer, the common case: what as_index_tensor and check_bounds do, inline
            index = cursor
            if cursor.numel():
                lo, hi = cursor.aminmax()
                if int(lo) < 0 or int(hi) >= rows:
                    index = check_bounds(cursor, rows, "cursor")  # raises, or maps negative rows
            batch = (index.numel(),)
        elif is_int(cursor):
            index = check_int(cursor, rows, "cursor")
            batch = ()
        elif isinstance(cursor, tuple) and not self.members:
            return cells_index(cursor, rows, backing, self.ndim), self.codec.encode(data, batch_dims=0), None, 0
        else:
            if isinstance(cursor, slice):
                cursor = range(*cursor.indices(rows))
            masks = (readable, backing.batch_size[0])
            index = check_bounds(as_index_tensor(cursor, device=backing.device, mask_sizes=masks), rows, "cursor")
            batch = (index.numel(),)
        if last_row is not None:
            capacity = backing.batch_size[0]
            if ring is None:
                appended = appended_run(index, last_row, capacity)
            else:
                start, n = ring
                appended = n if 0 < n < capacity and start == (last_row + 1) % capacity else 0
        if self.members:  # checked member by member against the backing's members
            td = self.codec.encode(data, batch_dims=len(batch))
            check_member_write(backing, td, batch)
            return index, td, None, appended
        if checked is not None and batch and checked.encoded.batch_size[:1] == index.shape:
            return index, checked.encoded, self.keys, appended
        # the data (items, strings), encoded
        if isinstance(data, LazyStackedTensorDict) and is_ragged_stack(data):
            raise ValueError(
                "Cannot write a lazy stack whose members differ in shape into this storage: its first write "
                "stored items of one shape (dense entries). Write items of that shape, or give such lazy stacks "
                "a storage of their own (its first write sets that layout), or a LazyStackStorage."
            )
        codec = self.codec
        batch_dims = len(batch) + self.ndim - 1
        try:
            td = codec.encode(data, batch_dims=batch_dims)
        except _nt.StringTooLong as err:
            td = self._encode_wider(data, batch_dims, err)
        except TypeError as err:
            raise TypeError(f"Cannot write this data into the storage: {err}") from None
        # keys, shapes and casts
        given = set(td.keys(include_nested=True, leaves_only=True))
        expected = torch.Size([*batch, *self.extra_shape])
        keys = self.keys
        if given != self.key_set:
            if codec.kind != "tensordict":
                missing = sorted(map(str, set(keys) - given))
                extra = sorted(map(str, given - set(keys)))
                raise ValueError(
                    f"The data written does not have the structure of the stored data: missing keys {missing}, "
                    f"unexpected keys {extra}. Write data with the keys of the first write, or empty() the buffer "
                    f"and use a new storage for data of another structure."
                )
            td, keys = self._partial_write(td, expected)  # only the entries written (see the module docstring)
        for key in keys:
            src = td.get(key)
            dst = backing.get(key)
            want = expected + dst.shape[self.ndim :]
            if src.shape != want:
                raise ValueError(
                    f"Entry {key!r} of the data written has shape {list(src.shape)}; the storage expects "
                    f"{list(want)} ({'one item' if not batch else f'{batch[0]} items'} of shape "
                    f"{list(dst.shape[1:])}). Nothing was written."
                )
            if src.dtype != dst.dtype:  # refuse casts that would change values (7.9 or NaN into int64)
                what = "The data written" if codec.kind == "tensor" else f"Entry {key!r} of the data written"
                check_cast(src, dst.dtype, what)
        if keys is not self.keys:  # other keys than the stored ones
            if index is None:  # checked again under the lock, with the backing it grows
                return None, td, None, 0
            keys = self._grow(td, len(batch) + self.ndim - 1)  # the new entries are added now
        return index, td, keys, appended

    def prepare(self, data, n: int) -> CheckedWrite | None:
        """Checks a batch of ``n`` items for a later write, rows not chosen yet (``None`` for a write of other
        keys than the stored ones, which can only be checked with the backing it grows; see
        :meth:`Storage.check_write`)."""
        data = as_batch(data)
        check_reserved(data)
        _, td, keys, _ = self(None, data, n, n, batched=True)
        return None if keys is None else CheckedWrite(data, td, self.keys)

    def can_grow(self) -> bool:
        """Whether the backing may get new entries: not once shared between processes or memory-mapped."""
        backing = self.backing
        return not (
            self.counters.is_shared or backing.is_locked or backing.is_shared() or backing.is_memmap()
        )

    def _partial_write(self, td: TensorDictBase, lead: torch.Size) -> tuple[TensorDictBase, list]:
        """``(td, stored keys it updates)`` for a TensorDict write of other keys than the stored ones: ``td``
        loses the new keys when the backing cannot grow; a new entry whose leading dims are not ``lead`` (then
        the backing's past the first ``ndim``) raises ``ValueError``."""
        given = list(td.keys(include_nested=True, leaves_only=True))
        given_set = set(given)
        updated = [key for key in self.keys if key in given_set]
        added = [key for key in given if key not in self.key_set] if self.can_grow() else []
        lead = torch.Size([*lead, *self.backing.batch_size[self.ndim :]])
        for key in added:
            shape = td.get(key).shape
            if shape[: len(lead)] != lead:
                raise ValueError(
                    f"New entry {key!r} of the data written has shape {list(shape)}; its leading dims must be "
                    f"{list(lead)}. Nothing was written."
                )
        if len(updated) + len(added) != len(given):
            td = td.select(*updated, *added)
        return td, updated

    def _grow(self, td: TensorDictBase, lead: int) -> list:
        """Adds zero-filled entries for the keys of a checked write ``td`` the backing lacks (shaped like
        ``td``'s past its first ``lead`` dims, the rows written); returns the keys of ``td`` to copy."""
        backing = self.backing
        keys = list(td.keys(include_nested=True, leaves_only=True))
        added = [key for key in keys if key not in self.key_set]
        for key in added:
            src = td.get(key)
            shape = (*backing.batch_size[: self.ndim], *src.shape[lead:])
            backing.set(key, torch.zeros(shape, dtype=src.dtype, device=backing.device))
        if added:  # a new list: a write checked against the old layout is checked again
            self.keys = list(backing.keys(include_nested=True, leaves_only=True))
            self.key_set = set(self.keys)
            self.codec.strings = _nt.string_widths(backing)
        return keys

    def _encode_wider(self, data, batch_dims: int, err: _nt.StringTooLong) -> TensorDictBase:
        """Encodes ``data`` after widening the string entries too narrow for it, on a private storage."""
        codec = self.codec
        while True:
            fixed = codec.fixed_width is not None
            if fixed or err.key not in codec.strings or not self.can_grow():
                raise _nt.StringTooLong(err.key, err.needed, err.width, fixed) from None
            _nt.widen(self.backing, err.key, err.needed)
            codec.strings = _nt.string_widths(self.backing)
            self.keys = list(self.keys)  # a new list: a write checked against the old width is checked again
            try:
                return codec.encode(data, batch_dims=batch_dims)
            except _nt.StringTooLong as again:
                err = again


def appended_run(rows, last_row: int, capacity: int) -> int:
    """``n`` when ``rows`` (an int or a 1-D CPU index) are the ``n`` rows after ``last_row``, in order
    (``0 < n < capacity``, wrapping around a ring of ``capacity`` rows), else ``0``.

    A storage calls it before its counters move, to count appends (see NOTE [catching up on appends] in
    ``trajectories/sync.py``).

    Examples:
        >>> import torch
        >>> appended_run(torch.tensor([8, 9, 0]), last_row=7, capacity=10), appended_run(torch.tensor([0, 2]), 9, 10)
        (3, 0)
    """
    start = (last_row + 1) % capacity
    if isinstance(rows, int):
        return 1 if rows == start and capacity > 1 else 0
    n = rows.numel()
    if not 0 < n < capacity or rows.ndim != 1 or rows.device.type != "cpu":
        return 0
    values = rows.numpy()
    if values[0] != start or values[-1] != (start + n - 1) % capacity:
        return 0
    expected = np.arange(start, start + n, dtype=values.dtype)
    if start + n > capacity:
        expected %= capacity
    return n if values.tobytes() == expected.tobytes() else 0  # ~10x faster than np.array_equal


def ring_rows(start: int, n: int, capacity: int) -> tuple[int, int]:
    """``(highest row, last row)`` of a ring write of ``n >= 1`` consecutive rows from ``start``.

    Examples:
        >>> ring_rows(8, 3, capacity=10), ring_rows(2, 3, capacity=10)
        ((9, 0), (4, 4))
    """
    end = start + n
    return (capacity - 1 if end > capacity else end - 1), (end - 1) % capacity


# -- items --------------------------------------------------------------------------------------------------------
def as_batch(data):
    """``data`` as one batch: a list of items stacked, a lazy stack of items of different shapes refused
    (``ValueError``). A lazy stack along an inner dim (each item a lazy stack of the same members) is kept."""
    if isinstance(data, list):
        return _stack_items(data)
    if isinstance(data, LazyStackedTensorDict) and data.stack_dim == 0:
        _check_not_ragged(data)
    return data


def _stack_items(items: list):
    if not items:
        raise ValueError("Cannot write an empty list of items into a tensor storage: pass at least one item.")
    first = items[0]
    if isinstance(first, (torch.Tensor, TensorDictBase)) or is_tensorclass(first):
        for item in items:
            if isinstance(item, LazyStackedTensorDict) and item.stack_dim == 0:
                _check_not_ragged(item)
        try:
            return torch.stack(items)
        except (RuntimeError, TypeError, ValueError) as err:
            raise STORAGE_UNSTACKABLE_LIST.error(detail=f"{type(err).__name__}: {err}") from None
    leaves, spec = pytree.tree_flatten(first)
    columns = [[leaf] for leaf in leaves]
    for i, item in enumerate(items[1:], start=1):
        item_leaves, item_spec = pytree.tree_flatten(item)
        if item_spec != spec:
            detail = f"item 0 and item {i} have different structures: {spec} and {item_spec}"
            raise STORAGE_UNSTACKABLE_LIST.error(detail=detail)
        for column, leaf in zip(columns, item_leaves):
            column.append(leaf)
    try:
        return pytree.tree_unflatten([torch.stack(column) for column in columns], spec)
    except (RuntimeError, TypeError) as err:
        raise STORAGE_UNSTACKABLE_LIST.error(detail=f"{type(err).__name__}: {err}") from None


def _check_not_ragged(td: LazyStackedTensorDict) -> None:
    for key in td.keys(include_nested=True, leaves_only=True):
        try:
            td.get(key)
        except RuntimeError:
            raise ValueError(
                f"Cannot write this batch into a tensor storage: entry {key!r} of the lazily stacked TensorDict "
                f"is ragged along its items, and a tensor storage holds items of one shape (a lazy stack along "
                f"an inner dim, whose members each hold one shape, is accepted). Use ListStorage for items of "
                f"different shapes, or pad them to one shape."
            ) from None


def is_ragged_stack(td) -> bool:
    """Whether ``td`` is a lazy stack one of whose entries differs in shape between members."""
    if not isinstance(td, LazyStackedTensorDict):
        return False
    for key in td.keys(include_nested=True, leaves_only=True):
        try:
            td.get(key)
        except RuntimeError:
            return True
    return False


def check_reserved(data) -> None:
    """Raises ``ValueError`` if ``data`` (a TensorDict, tensorclass or dict pytree) has a top-level entry named
    like the reserved key under which tensor storages keep their string entries (see :mod:`._nontensor`)."""
    if isinstance(data, TensorDictBase):
        keys = data.keys()
    elif is_tensorclass(data):
        keys = data._tensordict.keys()
    elif isinstance(data, dict):
        keys = data.keys()
    else:
        return
    reserved = _nt.STRINGS_KEY
    if reserved in keys:
        raise ValueError(
            f"The data written has an entry named {reserved!r}, a key tensor storages reserve for their string "
            f"entries. Rename that entry (e.g. data.rename_key_({reserved!r}, 'utf8')). Nothing was written."
        )


# -- cursors of other shapes than one row or a batch of rows ------------------------------------------------------
def cells_index(cursor: tuple, rows: int, backing: TensorDictBase, ndim: int) -> tuple:
    """``cursor`` (one entry per dim of an ``ndim > 1`` grid) with its rows entry checked against ``rows``."""
    if not cursor or len(cursor) > backing.batch_dims or any(c is None or c is Ellipsis for c in cursor):
        raise IndexError(
            f"Cannot write cells at {cursor!r}: pass one entry per dim of the storage's grid (an int, a slice "
            f"or an index tensor each), at most {ndim}."
        )
    first = cursor[0]
    if is_int(first):
        first = check_int(first, rows, "cursor")
    elif isinstance(first, slice) and (first.step is None or first.step > 0):
        first = slice(*first.indices(rows))
    else:
        first = check_bounds(as_index_tensor(first, device=backing.device), rows, "cursor")
    return (first, *cursor[1:])


def check_member_write(backing: LazyStackedTensorDict, td, batch: tuple) -> None:
    """Raises unless ``td``, a write of ``batch`` rows (``()``: one row) into the lazily stacked ``backing``,
    holds for each member of ``backing`` the same keys, shapes (past the rows) and castable values."""
    if not isinstance(td, TensorDictBase):
        raise TypeError(
            f"This storage holds lazily stacked TensorDicts (items whose members differ in shape); got "
            f"{type(td).__name__}. Write TensorDicts laid out like the first write."
        )
    expected = torch.Size([*batch, *backing.batch_size[1:]])
    if td.batch_size != expected:
        raise ValueError(
            f"The data written has batch size {list(td.batch_size)}; the storage expects {list(expected)} "
            f"({'one item' if not batch else f'{batch[0]} items'} of batch size {list(backing.batch_size[1:])}). "
            f"Nothing was written."
        )
    dim = backing.stack_dim - 1 + len(batch)
    if isinstance(td, LazyStackedTensorDict) and td.stack_dim == dim:
        members = td.tensordicts
    else:
        try:
            members = td.unbind(dim)
        except RuntimeError as err:
            raise ValueError(
                f"The data written cannot be split into the {len(backing.tensordicts)} members the storage "
                f"stacks along dim {dim} ({err}). Write a lazy stack laid out like the first write. Nothing was "
                f"written."
            ) from None
    for j, (stored, given) in enumerate(zip(backing.tensordicts, members)):
        stored_keys = set(stored.keys(include_nested=True, leaves_only=True))
        given_keys = set(given.keys(include_nested=True, leaves_only=True))
        if stored_keys != given_keys:
            raise ValueError(
                f"Member {j} of the data written has keys {sorted(map(str, given_keys))}; the storage holds "
                f"{sorted(map(str, stored_keys))} there. Write data with the keys of the first write. Nothing was "
                f"written."
            )
        for key in stored_keys:
            dst, src = stored.get(key), given.get(key)
            want = torch.Size([*batch, *dst.shape[1:]])
            if src.shape != want:
                raise ValueError(
                    f"Entry {key!r} of member {j} of the data written has shape {list(src.shape)}; the storage "
                    f"expects {list(want)}. Nothing was written."
                )
            if src.dtype != dst.dtype:
                check_cast(src, dst.dtype, f"Entry {key!r} of member {j} of the data written")


# -- casts --------------------------------------------------------------------------------------------------------
def check_cast(src: torch.Tensor, dst_dtype: torch.dtype, what: str) -> None:
    """Raises ``ValueError`` if casting ``src`` to ``dst_dtype`` would change a value beyond rounding.

    Refused: NaN, infinite or non-integral floats into an integer entry; values outside the range of the
    stored dtype (``300`` or ``-1`` into uint8, ``2**70`` into int64, ``1e300`` into float32); integers that a
    float entry cannot represent exactly (``2**24 + 1`` or ``2**62 + 1`` into float32: the cast would give another
    integer; every int of magnitude up to ``2**24`` is exact in float32, up to ``2**53`` in float64); values other
    than ``0``/``1`` into a bool entry; complex values with a non-zero imaginary part into a real entry. Floats
    written into a float entry of lower precision are rounded, as torch rounds them.

    Args:
        src (torch.Tensor): the values written.
        dst_dtype (torch.dtype): the dtype of the stored entry.
        what (str): the subject of the error, naming the entry (e.g. ``"Entry 'action' of the data"``).

    Examples:
        >>> import torch
        >>> check_cast(torch.tensor([3.0, -2.0]), torch.int64, "Entry 'action'")  # integral: accepted
        >>> check_cast(torch.tensor([7.9]), torch.int64, "Entry 'action'")
        Traceback (most recent call last):
        ...
        ValueError: Entry 'action' holds values that are not integers in [-9223372036854775808, ...
    """
    src_dtype = src.dtype
    if src_dtype == dst_dtype or _fits(src_dtype, dst_dtype) or not src.numel():
        return
    values = src.detach()
    if values.is_complex() and not dst_dtype.is_complex:
        lossy = values.imag != 0
        if lossy.any():
            raise _refuse(what, src_dtype, dst_dtype, values[lossy], "complex values (non-zero imaginary part)")
        values = values.real
    if dst_dtype == torch.bool:
        bad = (values != 0) & (values != 1)
        if bad.any():
            raise _refuse(what, src_dtype, dst_dtype, values[bad], "values other than 0 and 1")
        return
    if (dst_dtype.is_floating_point or dst_dtype.is_complex) and not values.is_floating_point():
        _check_exact_ints(values, src_dtype, dst_dtype, what)  # ints: the cast must give the same integer
        return
    if dst_dtype.is_floating_point or dst_dtype.is_complex:  # finite values must stay finite
        overflow = ~torch.isfinite(values.to(dst_dtype)) & torch.isfinite(values)
        if overflow.any():
            raise _refuse(what, src_dtype, dst_dtype, values[overflow], "values out of range")
        return
    lo, hi = _range_of(dst_dtype)
    problem = f"values out of range [{lo}, {hi}]"
    if values.is_floating_point():
        # NaN fails every comparison but `!=`; lo (0 or -2**k) and hi + 1 (2**k) are exact as floats
        bad = (values != values.trunc()) | ~(values >= float(lo)) | ~(values < float(hi + 1))
        problem = f"values that are not integers in [{lo}, {hi}] (fractional, NaN, infinite or out of range)"
    else:
        values, wrapped = _as_checkable_int(values)
        if wrapped is not None and wrapped.any():  # uint64 values >= 2**63 fit no other integer dtype
            raise _refuse(what, src_dtype, dst_dtype, src.detach()[wrapped], problem)
        if values.amin().item() >= lo and values.amax().item() <= hi:  # exact comparisons in Python
            return
        bad = _outside_int(values, lo, hi)
    if bad.any():
        raise _refuse(what, src_dtype, dst_dtype, values[bad], problem)


def _exact_int_limit(dtype: torch.dtype) -> int:
    """The largest ``n`` such that every integer in ``[-n, n]`` is exact in the float (or complex) ``dtype``:
    ``2**digits`` (``2**24`` for float32, ``2**53`` for float64)."""
    return 2 ** (1 - int(math.log2(torch.finfo(dtype).eps)))


def _check_exact_ints(values: torch.Tensor, src: torch.dtype, dst: torch.dtype, what: str) -> None:
    """Raises ``ValueError`` unless every integer of ``values`` (a real integer tensor) is exact in ``dst``."""
    checkable, wrapped = _as_checkable_int(values)
    limit = _exact_int_limit(dst)
    lo, hi = torch.stack(checkable.aminmax()).tolist()  # one reduction, one read back
    if wrapped is None and -limit <= lo and hi <= limit:  # the common case
        return
    cast = values.to(dst)
    cast = cast.real if cast.is_complex() else cast
    wide = checkable.to(torch.int64)
    # a float is compared as an int64 only inside int64's range (2**63 itself is out of it): exact comparison
    inside = torch.isfinite(cast) & (cast >= -(2.0**63)) & (cast < 2.0**63)
    bad = ~inside | (torch.where(inside, cast, 0).to(torch.int64) != wide)
    if wrapped is not None:  # uint64 values >= 2**63 (negative here): compared in Python, exactly
        for i in wrapped.nonzero().reshape(-1).tolist():
            exact = int(values[i].item()) == int(cast[i].item()) if torch.isfinite(cast[i]) else False
            bad[i] = not exact
    if bad.any():
        limit_text = f"2**{limit.bit_length() - 1}"
        raise _refuse(
            what, src, dst, values[bad], f"integers it cannot represent exactly (beyond +-{limit_text})",
            fix=f"Store them in an int64 or float64 entry (the first write into a new storage sets the dtype), or "
            f"convert them yourself with .to({dst}) to accept the rounding.",
        )


def _range_of(dtype: torch.dtype) -> tuple[float, float] | None:
    """``(lowest, highest)`` finite value of ``dtype`` (``None`` for bool and complex)."""
    if dtype == torch.bool or dtype.is_complex:
        return None
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min, info.max


def _fits(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every value of ``src`` is representable in ``dst`` up to rounding (no value check needed)."""
    if src == torch.bool:
        return True
    if not (src.is_floating_point or src.is_complex) and (dst.is_floating_point or dst.is_complex):
        lo_src, hi_src = _range_of(src)  # ints: every one must be exact in dst (see _check_exact_ints)
        return max(-lo_src, hi_src) <= _exact_int_limit(dst)
    if dst.is_complex:
        return not src.is_complex or torch.finfo(src).max <= torch.finfo(dst).max
    if src.is_complex or dst == torch.bool:
        return False
    if src.is_floating_point and not dst.is_floating_point:
        return False  # fractions, NaN and inf never fit an integer dtype
    lo_src, hi_src = _range_of(src)
    lo_dst, hi_dst = _range_of(dst)
    return lo_dst <= lo_src and hi_src <= hi_dst


def _refuse(
    what: str, src: torch.dtype, dst: torch.dtype, values: torch.Tensor, problem: str, fix: str | None = None
) -> ValueError:
    shown = values.reshape(-1)[:_SHOWN].tolist()
    if fix is None:
        fix = (
            f"Write values that {dst} can hold (round or clip them first, e.g. x.round().clamp(lo, hi)), or store "
            f"them in a wider dtype (the first write into a new storage sets it)."
        )
    return ValueError(
        f"{what} holds {problem} for the stored dtype {dst} (data dtype {src}), e.g. {shown} "
        f"({values.numel()} value(s)): the cast would change them silently. {fix} Nothing was written."
    )


def _as_checkable_int(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``values`` as a dtype with min/max kernels (the wide unsigned dtypes lack them), and for uint64 the
    mask of the values that int64 cannot hold (``None`` otherwise)."""
    if values.dtype in (torch.uint16, torch.uint32):
        return values.to(torch.int64), None
    if values.dtype == torch.uint64:
        signed = values.view(torch.int64)
        return signed, signed < 0
    return values, None


def _outside_int(values: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The mask of integer ``values`` outside ``[lo, hi]``, with bounds clipped to the range of ``values``."""
    own_lo, own_hi = _range_of(values.dtype)
    mask = torch.zeros_like(values, dtype=torch.bool)
    if lo > own_lo:
        mask |= values < lo
    if hi < own_hi:
        mask |= values > hi
    return mask
