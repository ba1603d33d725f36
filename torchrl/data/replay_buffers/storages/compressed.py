"""A list storage that keeps each item compressed: :class:`CompressedListStorage`.

Each tensor of an item (each leaf of a TensorDict, tensorclass or pytree) is compressed on write into a uint8
tensor, with its shape and dtype beside it; non-tensor entries (strings) are kept as they are. A read
decompresses the items it returns.

Data model: slot ``i`` of the item list ``_storage`` holds, for a tensor item, the compressed uint8 tensor
itself (what ``compression_fn`` returned), its metadata ``{"type", "shape", "dtype", "device"}`` being slot
``i`` of the parallel list ``_metadata``; for any other item (TensorDict, tensorclass, pytree), a
:class:`~torchrl.data.replay_buffers.storages._ragged.Record` of its compressed leaves (``_metadata[i]`` is
``None``). Observations that compress well (frames, masks, sparse features) then
take a fraction of their size in memory, at the cost of a compression per write and a decompression per read.

Checkpoints (``dumps``) save the compressed bytes as they are, under ``compressed_data/`` (TorchRL's directory
name): per leaf, one uint8 buffer of every item's bytes plus per-item offsets and shapes
(:mod:`torchrl.data.replay_buffers.storages._ragged`), and the name of the codec, which ``loads`` checks. No
pickle. Checkpoints of the earlier layout (the same files under ``storage/``) load too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, is_tensorclass

import torchrl.data.replay_buffers.storages._compression as _compression
import torchrl.data.replay_buffers.storages._ragged as _ragged
from torchrl._validation import check_int
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.checkpointers import CompressedListStorageCheckpointer
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._codec import TENSOR_KEY, DataCodec
from torchrl.data.replay_buffers.storages._index import as_index_tensor, check_bounds, is_int
from torchrl.data.replay_buffers.storages._index import check_int as check_position
from torchrl.data.replay_buffers.storages.list_storage import ListStorage, _split_batch

__all__ = ["CompressedListStorage"]

_KINDS = ("tensor", "tensordict", "tensorclass", "pytree")
_DATA_DIR = "compressed_data"  # TorchRL's directory name for the compressed bytes of a checkpoint


class CompressedListStorage(ListStorage):
    """A :class:`~torchrl.data.ListStorage` that keeps every tensor of every item compressed.

    Items may be tensors, TensorDicts (strings and other non-tensor entries are kept uncompressed),
    tensorclasses or pytrees of tensors, of any shapes. ``get`` of an int returns the item decompressed;
    ``get`` of a slice or an index returns a list of items, which a replay buffer stacks with its default
    collate function (densely when the items have one shape, lazily otherwise). :meth:`bytes` tells the
    memory the compressed tensors take.

    Args:
        max_size (int): the capacity.

    Keyword Args:
        compression_fn (callable, optional): ``compression_fn(tensor)`` returns the compressed bytes of a
            tensor, as a uint8 tensor (kept as it is) or a bytes-like object (kept as a 1-D uint8 tensor).
            Defaults to Zstandard at ``compression_level`` when the ``zstandard`` package is installed
            (``pip install torchrl[zstd]``), else :mod:`zlib`.
        decompression_fn (callable, optional): ``decompression_fn(compressed, metadata)`` rebuilds the tensor:
            ``compressed`` is the uint8 tensor that ``compression_fn`` returned (after a checkpoint round trip,
            the same bytes as a 1-D tensor) and ``metadata`` is ``{"type": type, "shape": torch.Size, "dtype":
            torch.dtype, "device": torch.device}`` of the tensor written. What it returns is returned as it is
            (a tensor), or, when it returns bytes, reinterpreted with that shape and dtype. Required with
            ``compression_fn``, and only with it.
        compression_level (int): the level of the default codec (zstd: up to 22; zlib: -1 to 9). Defaults to
            ``3``.
        device (torch.device or str): where read items are placed. Defaults to ``"cpu"``.
        compilable (bool): accepted for TorchRL compatibility (see :class:`~torchrl.data.Storage`). Defaults
            to ``False``.

    Raises:
        ValueError: if only one of ``compression_fn``/``decompression_fn`` is given, or the default codec
            refuses ``compression_level``.

    A write at a position past ``len(self)`` or ``max_size`` raises an ``IndexError`` that is also a
    ``RuntimeError`` (TorchRL's type); a read of a position never written raises ``IndexError``.

    .. note:: As with :class:`~torchrl.data.ListStorage`, the items live in one process's memory: DataLoader
        workers see a snapshot taken when they start under the ``fork`` start method (each worker
        decompresses the items it reads), and sending the storage to a ``spawn``/``forkserver`` worker is
        refused.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import CompressedListStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=CompressedListStorage(100), batch_size=4)
        >>> frames = TensorDict(pixels=torch.zeros(8, 3, 64, 64, dtype=torch.uint8), batch_size=[8])
        >>> rb.extend(frames).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> rb.sample()["pixels"].shape
        torch.Size([4, 3, 64, 64])
        >>> rb.storage.bytes() < frames.bytes()
        True

        Custom functions, here zlib at its best compression:

        >>> import zlib
        >>> storage = CompressedListStorage(
        ...     10,
        ...     compression_fn=lambda t: zlib.compress(t.numpy().tobytes(), 9),
        ...     decompression_fn=lambda data, meta: zlib.decompress(data.numpy().tobytes()),
        ... )
        >>> storage.set(0, torch.arange(6.0).reshape(2, 3))
        >>> storage.get(0)
        tensor([[0., 1., 2.],
                [3., 4., 5.]])
    """

    _default_checkpointer = CompressedListStorageCheckpointer

    def __init__(
        self,
        max_size: int,
        *,
        compression_fn: Callable | None = None,
        decompression_fn: Callable | None = None,
        compression_level: int = 3,
        device: torch.device | str = "cpu",
        compilable: bool = False,
    ):
        super().__init__(max_size, compilable=compilable)
        self._metadata: list[dict | None] = []  # per slot: the metadata of a tensor item, None for a Record
        self.compression_level = check_int("compression_level", compression_level)
        if (compression_fn is None) != (decompression_fn is None):
            given, missing = ("compression_fn", "decompression_fn")[:: 1 if decompression_fn is None else -1]
            raise ValueError(
                f"`{given}` was given without `{missing}`: pass both (a custom codec must be decoded by its own "
                f"inverse), or neither for the default codec ({_compression.default_codec_name()})."
            )
        for name, fn in (("compression_fn", compression_fn), ("decompression_fn", decompression_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"`{name}` must be callable or None, got {fn!r} ({type(fn).__name__}).")
        if compression_fn is None:
            compression_fn, decompression_fn, self.codec = _compression.make_default_codec(
                self.compression_level
            )
        else:
            self.codec = "custom"
        self.compression_fn, self.decompression_fn = compression_fn, decompression_fn
        self.device = torch.device("cpu" if device is None else device)

    def _to_device(self, item):  # items are compressed on write; `device` is where reads go
        return item

    def _set_one(self, pos: int, item, size: int) -> None:
        slot, metadata = item  # what _compress made
        super()._set_one(pos, slot, size)
        if pos == len(self._metadata):
            self._metadata.append(metadata)
        else:
            self._metadata[pos] = metadata

    def _empty(self) -> None:
        super()._empty()
        self._metadata = []

    # -- writes ----------------------------------------------------------------------------------------------
    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Compresses and writes one item at an int ``cursor`` (at most ``len(self)``), or a batch at a list of
        positions. Everything is compressed before anything is written."""
        if is_int(cursor):
            super().set(cursor, self._compress(data), set_cursor=set_cursor)
            return
        if isinstance(cursor, slice):
            cursor = range(*cursor.indices(len(self._storage)))
        positions = as_index_tensor(cursor).tolist()
        items = _split_batch(data, len(positions))
        super().set(positions, [self._compress(item) for item in items], set_cursor=set_cursor)

    def _compress(self, item) -> tuple:
        """``(slot, metadata)`` of an item: the compressed uint8 tensor and its metadata for a tensor, a
        :class:`~torchrl.data.replay_buffers.storages._ragged.Record` and ``None`` otherwise."""
        if isinstance(item, _ragged.Record):
            raise TypeError("Write the items themselves to a CompressedListStorage, not its stored records.")
        if isinstance(item, torch.Tensor):
            return _compression.compress_tensor(self.compression_fn, item), _tensor_metadata(item)
        codec = DataCodec.for_data(item)
        td = _ragged.item_td(codec, item)
        leaves = []
        for key, value in _ragged.td_leaves(td):
            if _ragged.is_json_leaf(value):
                leaves.append(
                    _ragged.Leaf(key, None, None, value.data if isinstance(value, NonTensorData) else value)
                )
            else:
                payload = _compression.compress_tensor(self.compression_fn, value)
                leaves.append(_ragged.Leaf(key, value.dtype, tuple(value.shape), payload))
        return _ragged.Record(codec, tuple(td.batch_size), leaves), None

    # -- slots and records -------------------------------------------------------------------------------------
    def _record(self, pos: int) -> _ragged.Record:
        """Slot ``pos`` as a Record (what state dicts and checkpoints hold)."""
        slot, metadata = self._storage[pos], self._metadata[pos]
        if metadata is None:
            return slot
        leaf = _ragged.Leaf((TENSOR_KEY,), metadata["dtype"], tuple(metadata["shape"]), slot)
        return _ragged.Record(DataCodec("tensor"), (), [leaf])

    def _load_records(self, records: list[_ragged.Record]) -> None:
        slots = [_slot_of(record) for record in records]
        self._storage = [slot for slot, _ in slots]
        self._metadata = [metadata for _, metadata in slots]

    # -- reads -----------------------------------------------------------------------------------------------
    def _decompress(self, pos: int):
        slot, metadata = self._storage[pos], self._metadata[pos]
        if metadata is not None:
            out = _compression.decompress_tensor(self.decompression_fn, slot, dict(metadata))
            return out.to(self.device) if isinstance(out, torch.Tensor) and out.device != self.device else out

        def tensor_of(leaf: _ragged.Leaf) -> torch.Tensor:
            meta = {
                "type": torch.Tensor,
                "shape": torch.Size(leaf.shape),
                "dtype": leaf.dtype,
                "device": self.device,
            }
            out = _compression.decompress_tensor(self.decompression_fn, leaf.payload, meta)
            return out.to(self.device) if isinstance(out, torch.Tensor) and out.device != self.device else out

        return _ragged.build_item(slot, tensor_of)

    def get(self, index):
        """One item (decompressed) for an int; a list of items for a slice or an index.

        A position never written raises ``IndexError``.
        """
        n = len(self._storage)
        if isinstance(index, tuple):
            if len(index) != 1:
                raise IndexError(
                    f"A CompressedListStorage is indexed along one dimension; got a tuple of {len(index)}."
                )
            index = index[0]
        if is_int(index):
            return self._decompress(check_position(index, n))
        if isinstance(index, slice):
            return [self._decompress(pos) for pos in range(n)[index]]
        return [self._decompress(pos) for pos in check_bounds(as_index_tensor(index), n).tolist()]

    def to_bytestream(self, data_to_bytestream) -> bytes:
        """The raw bytes of a tensor or numpy array, in its memory order (C-contiguous, on the CPU): what a
        ``compression_fn`` that works on bytes (``zlib.compress``, ``zstd``) takes.

        Only arrays: other objects would need pickle, which no checkpoint of this package contains.

        Examples:
            >>> import torch
            >>> from torchrl.data import CompressedListStorage
            >>> storage = CompressedListStorage(10)
            >>> storage.to_bytestream(torch.tensor([1, 2], dtype=torch.uint8))
            b'\\x01\\x02'
        """
        if isinstance(data_to_bytestream, np.ndarray):
            return np.ascontiguousarray(data_to_bytestream).tobytes()
        if isinstance(data_to_bytestream, torch.Tensor):
            tensor = data_to_bytestream.detach().to("cpu").contiguous()
            return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        raise TypeError(
            f"CompressedListStorage.to_bytestream takes a torch.Tensor or a numpy array, got "
            f"{type(data_to_bytestream).__name__}: convert it to a tensor first (other objects would need "
            f"pickle)."
        )

    def bytes(self) -> int:
        """The number of bytes the compressed tensors of all items take (non-tensor entries not counted)."""
        return sum(
            leaf.payload.numel()
            for pos in range(len(self._storage))
            for leaf in self._record(pos).leaves
            if leaf.dtype is not None
        )

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"codec": name, "_storage": [item, ...]}``; an item is ``{"codec", "batch_size", "leaves"}`` and a
        leaf ``{"key", "dtype", "shape", "data"}`` (``data``: the compressed uint8 tensor) or ``{"key",
        "value"}`` for a non-tensor entry."""
        items = []
        for record in map(self._record, range(len(self._storage))):
            leaves = [
                {"key": list(leaf.key), "value": leaf.payload}
                if leaf.dtype is None
                else {
                    "key": list(leaf.key),
                    "dtype": leaf.dtype,
                    "shape": list(leaf.shape),
                    "data": leaf.payload,
                }
                for leaf in record.leaves
            ]
            items.append(
                {"codec": _codec_state(record.codec), "batch_size": list(record.batch_size), "leaves": leaves}
            )
        return {"codec": self.codec, "_storage": items}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("_storage"), list):
            raise TypeError(
                "`state_dict` must be the dict returned by CompressedListStorage.state_dict(), with a list "
                f"`_storage`; got {type(state_dict).__name__}."
            )
        self._check_codec(state_dict.get("codec"), "state_dict")
        records = [_record_from_state(i, item) for i, item in enumerate(state_dict["_storage"])]
        if len(records) > self.max_size:
            raise ValueError(f"`state_dict` holds {len(records)} items, over max_size={self.max_size}.")
        self._load_records(records)

    def _check_codec(self, saved, where: str) -> None:
        if saved != self.codec:
            raise mismatch(
                f"the codec of the {where}",
                saved,
                self.codec,
                "Build the storage with the codec the items were compressed with (the default is zstd when the "
                "zstandard package is installed, zlib otherwise; custom functions are 'custom').",
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, len={len(self)}, codec={self.codec!r})"

    # -- checkpoint part (the protocol of torchrl.data.replay_buffers._checkpoint.parts) --------------------------
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        records = [_json_record(i, self._record(i)) for i in range(len(self._storage))]
        tensors, groups = _ragged.ragged_groups(records, ctx, "bytes")
        tensors, groups = _under(tensors, groups, ctx.name("storage/"), ctx.name(_DATA_DIR + "/"))
        doc = {
            "class": qualname(self),
            "max_size": self.max_size,
            "count": len(records),
            "codec": self.codec,
            "layout": "ragged",
            "groups": groups,
        }
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        check_class(self, doc, "storage")
        if doc.get("max_size") != self.max_size:
            raise mismatch(
                "the storage max_size", doc.get("max_size"), self.max_size, "Use the same max_size."
            )
        self._check_codec(doc.get("codec"), "checkpoint")
        where = f"The CompressedListStorage description in the checkpoint {ctx.path!r}"
        count = check_int_field(
            doc.get("count"), "count", where, 0, self.max_size, fix="It counts the items."
        )
        if doc.get("layout") != "ragged":
            raise CheckpointError(
                f"{where}: `layout` is {doc.get('layout')!r}, expected 'ragged'. Nothing was loaded."
            )
        _ragged.check_ragged_groups(doc.get("groups"), tensors, count, where, "bytes", _KINDS)
        ctx.facts["storage_rows"] = self.max_size

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self._load_records(_ragged.ragged_records(doc["groups"], tensors, doc["count"]))


def _tensor_metadata(tensor: torch.Tensor) -> dict:
    """What ``decompression_fn`` receives besides the compressed bytes of ``tensor``."""
    return {"type": type(tensor), "shape": tensor.shape, "dtype": tensor.dtype, "device": tensor.device}


def _slot_of(record: _ragged.Record) -> tuple:
    """``(slot, metadata)`` of a loaded record: a tensor item's slot is its compressed tensor."""
    if record.codec.kind != "tensor" or len(record.leaves) != 1 or record.leaves[0].dtype is None:
        return record, None
    leaf = record.leaves[0]
    metadata = {
        "type": torch.Tensor,
        "shape": torch.Size(leaf.shape),
        "dtype": leaf.dtype,
        "device": torch.device("cpu"),
    }
    return leaf.payload, metadata


def _under(tensors: dict, groups: list[dict], old: str, new: str) -> tuple[dict, list[dict]]:
    """The ragged tensors and group documents with the tensor names starting with ``old`` moved under ``new``
    (loading reads the names from the documents, so checkpoints of either layout load)."""

    def moved(name: str) -> str:
        return new + name[len(old) :] if name.startswith(old) else name

    for group in groups:
        group["tensor"] = moved(group["tensor"])
        for leaf in group["leaves"]:
            if "tensor" in leaf:
                leaf["tensor"] = moved(leaf["tensor"])
    return {moved(name): t for name, t in tensors.items()}, groups


def _json_record(position: int, record: _ragged.Record) -> _ragged.Record:
    """``record`` with its non-tensor values as JSON (``TypeError`` for values that are not)."""
    if all(leaf.dtype is not None for leaf in record.leaves):
        return record
    leaves = [
        leaf
        if leaf.dtype is not None
        else leaf._replace(payload=_ragged.non_tensor_value(leaf.payload, leaf.key, f"item {position}"))
        for leaf in record.leaves
    ]
    return record._replace(leaves=leaves)


def _codec_state(codec: DataCodec):
    return (
        {"kind": "tensorclass", "cls": codec.tensorclass} if codec.kind == "tensorclass" else codec.to_json()
    )


def _record_from_state(i: int, item) -> _ragged.Record:
    where = f"`state_dict['_storage'][{i}]`"
    try:
        if not isinstance(item, dict):
            raise TypeError(f"it is a {type(item).__name__}, not a dict")
        desc = item["codec"]
        codec = (
            DataCodec("tensorclass", tensorclass=desc["cls"])
            if desc.get("kind") == "tensorclass"
            else DataCodec.from_json(desc)
        )
        if codec.kind == "tensorclass" and not is_tensorclass(codec.tensorclass):
            raise TypeError(f"{desc['cls']!r} is not a tensorclass")
        leaves = []
        for leaf in item["leaves"]:
            key = tuple(leaf["key"])
            if "value" in leaf:
                leaves.append(_ragged.Leaf(key, None, None, leaf["value"]))
                continue
            data, dtype = leaf["data"], leaf["dtype"]
            if not (
                isinstance(data, torch.Tensor)
                and data.dtype == torch.uint8
                and isinstance(dtype, torch.dtype)
            ):
                raise TypeError("`data` must be a uint8 tensor and `dtype` a torch.dtype")
            shape = tuple(int(s) for s in leaf["shape"])
            leaves.append(_ragged.Leaf(key, dtype, shape, data.detach().clone().reshape(-1)))
        return _ragged.Record(codec, tuple(int(s) for s in item["batch_size"]), leaves)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise TypeError(
            f"{where} is not an item of CompressedListStorage.state_dict() ({type(err).__name__}: {err}). Pass "
            f"the dict that state_dict() returned. Nothing was loaded."
        ) from None
