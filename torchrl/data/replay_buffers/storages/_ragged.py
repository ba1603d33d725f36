"""Items of different shapes saved as flat columns: the checkpoint part of the list storages whose items are
ragged (:class:`~torchrl.data.LazyStackStorage`) or compressed (:class:`~torchrl.data.CompressedListStorage`).

An item is described by a :class:`Record`: its data codec (tensor, TensorDict, tensorclass or pytree), its
batch size and its leaves. A tensor leaf carries a 1-D *payload*: the leaf's values flattened (``"values"``
payloads, whose length is the number of elements of the leaf's shape) or its compressed bytes (``"bytes"``
payloads, uint8 of any length). A non-tensor leaf carries its value, which must be JSON (a str, a number, a
bool or None): the value of a ``NonTensorData``, or ``{"stack": nested list}`` for a ``NonTensorStack`` (one
value per element of the item's batch, e.g. the text of each step of a trajectory).

Items are grouped by *schema*: the codec, the batch ndim, and each leaf's key, dtype and ndim. Per group the
checkpoint holds (tensor names under ``<prefix>storage/<group>/``):

- ``positions`` (int64 ``[n]``): the storage positions of the group's items, in the order below;
- ``batch_sizes`` (int64 ``[n, batch_ndim]``);
- per tensor leaf ``<leaf>/values`` (1-D: every item's payload, concatenated), ``<leaf>/offsets`` (int64
  ``[n + 1]``: item ``i`` is ``values[offsets[i]:offsets[i + 1]]``) and ``<leaf>/shapes`` (int64 ``[n, ndim]``).

Non-tensor leaves are JSON lists in the document. The document of a group: ``codec``, ``batch_ndim``,
``count`` and ``leaves`` (``key``, ``kind`` = ``"tensor"`` or ``"json"``, ``dtype``, ``ndim`` and the tensor
names, or ``values``). Storages usually hold one group, so the document does not grow with the item count
(JSON leaves aside). Everything is checked by :func:`check_ragged_groups` before anything is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_leaf_nontensor,
    is_non_tensor,
)

import torchrl.data.replay_buffers._checkpoint.io as _io
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._codec import TENSOR_KEY, DataCodec

PAYLOADS = ("values", "bytes")
_JSON_SCALARS = (str, int, float, bool, type(None))


class Leaf(NamedTuple):
    """One leaf of an item: ``key`` (tuple of str); for a tensor leaf its ``dtype``, ``shape`` and 1-D
    ``payload`` tensor; for a non-tensor leaf ``dtype`` and ``shape`` are ``None`` and ``payload`` is the value."""

    key: tuple
    dtype: torch.dtype | None
    shape: tuple | None
    payload: Any


class Record(NamedTuple):
    """An item as its codec, its batch size and its leaves."""

    codec: DataCodec
    batch_size: tuple
    leaves: list


def _key(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def td_leaves(td: TensorDictBase) -> list[tuple[tuple, Any]]:
    """The leaves of ``td`` (nested keys as tuples), non-tensor entries included as ``NonTensorData``."""
    return [(_key(k), v) for k, v in td.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor)]


def non_tensor_value(value, key, where: str):
    """The JSON value of a non-tensor leaf, or a ``TypeError`` saying why it cannot be saved.

    A ``NonTensorData`` gives its value; a ``NonTensorStack`` (one value per element of its batch) gives
    ``{"stack": nested list}``; a NaN gives ``{"nan": True}`` (JSON has no NaN).
    """
    if isinstance(value, NonTensorStack):
        return {"stack": _json_nested(value.tolist(), key, where)}
    data = value.data if isinstance(value, NonTensorData) else value
    if not isinstance(data, _JSON_SCALARS):
        _refuse_value(type(data).__name__, key, where)
    return _json_nested(data, key, where)


def _json_nested(data, key, where: str):
    if isinstance(data, list):
        return [_json_nested(d, key, where) for d in data]
    if not isinstance(data, _JSON_SCALARS):
        _refuse_value(type(data).__name__, key, where)
    return {"nan": True} if isinstance(data, float) and data != data else data


def _refuse_value(shown: str, key, where: str):
    shown_key = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    raise TypeError(
        f"Cannot save the entry {shown_key!r} of {where}: it holds a {shown}, and checkpoints hold tensors and "
        f"non-tensor values that are str, int, float, bool or None (one per item, or one per element of a "
        f"NonTensorStack). Anything else would need pickle, which this format never uses (loading a pickle runs "
        f"code). Nothing was written."
    )


def _signature(record: Record) -> str:
    leaves = [
        [list(leaf.key), "json"] if leaf.dtype is None
        else [list(leaf.key), "tensor", _io.dtype_name(leaf.dtype), len(leaf.shape), _io.dtype_name(leaf.payload.dtype)]
        for leaf in record.leaves
    ]
    return json.dumps([record.codec.to_json(), len(record.batch_size), leaves])


# -- dumps ---------------------------------------------------------------------------------------------------
def ragged_groups(records: list[Record], ctx, payload: str) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The tensors and the group documents of ``records`` (item ``i`` is at position ``i``)."""
    groups: dict[str, list[int]] = {}
    for position, record in enumerate(records):
        groups.setdefault(_signature(record), []).append(position)
    if payload not in PAYLOADS:
        raise ValueError(f"`payload` must be one of {PAYLOADS}, got {payload!r}.")
    tensors: dict[str, torch.Tensor] = {}
    docs = []
    for g, positions in enumerate(groups.values()):
        members = [records[p] for p in positions]
        first = members[0]
        base = ctx.name(f"storage/{g}")
        tensors[f"{base}/positions"] = torch.tensor(positions, dtype=torch.long)
        tensors[f"{base}/batch_sizes"] = torch.tensor(
            [list(r.batch_size) for r in members], dtype=torch.long
        ).reshape(len(members), len(first.batch_size))
        leaves = []
        for j, leaf in enumerate(first.leaves):
            column = [r.leaves[j] for r in members]
            if leaf.dtype is None:
                leaves.append({"key": list(leaf.key), "kind": "json", "values": [c.payload for c in column]})
                continue
            name = f"{base}/{j}"
            lengths = torch.tensor([c.payload.numel() for c in column], dtype=torch.long)
            tensors[f"{name}/values"] = torch.cat([c.payload.reshape(-1) for c in column])
            tensors[f"{name}/offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
            tensors[f"{name}/shapes"] = torch.tensor([list(c.shape) for c in column], dtype=torch.long).reshape(
                len(column), len(leaf.shape)
            )
            leaves.append(
                {"key": list(leaf.key), "kind": "tensor", "dtype": _io.dtype_name(leaf.dtype),
                 "ndim": len(leaf.shape), "tensor": name}
            )
        docs.append(
            {"codec": first.codec.to_json(), "batch_ndim": len(first.batch_size), "count": len(positions),
             "tensor": base, "leaves": leaves}
        )
    return tensors, docs


# -- check ---------------------------------------------------------------------------------------------------
def _fail(where: str, what: str) -> CheckpointError:
    return CheckpointError(f"{where}: {what} Save the storage again with `dumps`. Nothing was loaded.")


def _tensor(tensors: Mapping, name, where: str, dtype: torch.dtype | None, shape: list[int | None]) -> torch.Tensor:
    value = tensors.get(name) if isinstance(name, str) else None
    if value is None:
        raise _fail(where, f"the tensor {name!r} is missing from the checkpoint.")
    if dtype is not None and value.dtype != dtype:
        raise _fail(where, f"the tensor {name!r} has dtype {value.dtype}, expected {dtype}.")
    if value.ndim != len(shape) or any(s is not None and s != v for s, v in zip(shape, value.shape)):
        raise _fail(where, f"the tensor {name!r} has shape {list(value.shape)}, expected {shape} (None: any).")
    return value


def check_ragged_groups(
    groups, tensors: Mapping, count: int, where: str, payload: str, kinds: tuple[str, ...]
) -> None:
    """Raises :class:`CheckpointError` unless ``groups`` describe exactly ``count`` well-formed items.

    ``kinds`` are the data codecs the storage accepts; with ``"values"`` payloads each item's values must
    number the elements of its shape and have the leaf's dtype; with ``"bytes"`` payloads they are uint8.
    """
    if not isinstance(groups, list):
        raise _fail(where, f"`groups` is {type(groups).__name__}, expected a list.")
    seen = []
    for g, group in enumerate(groups):
        here = f"{where} (group {g})"
        if not isinstance(group, dict):
            raise _fail(here, "the group is not a JSON object.")
        codec = DataCodec.from_json(group.get("codec") or {})
        if codec.kind not in kinds:
            raise _fail(here, f"the items are of kind {codec.kind!r}; this storage holds {kinds}.")
        n, batch_ndim = group.get("count"), group.get("batch_ndim")
        if not (_nonneg_int(n) and _nonneg_int(batch_ndim)):
            raise _fail(here, f"`count` {n!r} and `batch_ndim` {batch_ndim!r} must be non-negative ints.")
        base = group.get("tensor")
        positions = _tensor(tensors, f"{base}/positions", here, torch.long, [n])
        if n and (int(positions.min()) < 0 or int(positions.max()) >= count):
            raise _fail(here, f"a position is outside [0, {count}).")
        seen.append(positions.as_subclass(torch.Tensor))
        batch_sizes = _tensor(tensors, f"{base}/batch_sizes", here, torch.long, [n, batch_ndim])
        if n and batch_ndim and int(batch_sizes.min()) < 0:
            raise _fail(here, "a batch size is negative.")
        if not isinstance(group.get("leaves"), list):
            raise _fail(here, "`leaves` is not a list.")
        for leaf in group["leaves"]:
            entry = leaf.get("key") if isinstance(leaf, dict) else leaf
            _check_leaf(leaf, tensors, n, batch_sizes, f"{here}, entry {entry!r}", payload)
    # `seen` holds as many positions as the files do: a crafted `count` allocates nothing
    held = torch.cat(seen) if seen else torch.zeros(0, dtype=torch.long)
    if held.numel() != count or not torch.equal(held.sort().values, torch.arange(count)):
        raise _fail(where, f"the groups do not hold each of the {count} positions exactly once.")


def check_json_leaf(leaf: dict, n: int, where: str, batch_sizes: list | None = None) -> None:
    """Raises :class:`CheckpointError` unless the ``"json"`` leaf ``leaf`` holds ``n`` values saved by
    :func:`non_tensor_value`; a ``{"stack": ...}`` value must be nested like its item's batch size
    (``batch_sizes[i]``; any when ``batch_sizes`` is ``None``)."""
    values = leaf.get("values")
    if not isinstance(values, list) or len(values) != n:
        raise _fail(where, f"`values` must be a list of {n} JSON values.")
    for i, value in enumerate(values):
        stack = value.get("stack") if isinstance(value, dict) and len(value) == 1 else None
        if stack is not None:
            shape = None if batch_sizes is None else list(batch_sizes[i])
            if shape == [] or not _scalars_nested(stack, shape):  # a stack has a batch dim
                raise _fail(where, f"the stack of item {i} is not a nested list of scalars shaped {shape}.")
        elif not _is_json_scalar(value):
            raise _fail(where, "`values` holds a value that is not a str, int, float, bool or None.")


def _is_json_scalar(value) -> bool:
    return isinstance(value, _JSON_SCALARS) or value == {"nan": True}


def _scalars_nested(value, shape: list | None) -> bool:
    """Whether ``value`` is JSON scalars nested in lists ``shape`` deep and wide (any nesting when ``None``)."""
    if shape is None:
        return isinstance(value, list) and all(
            _scalars_nested(v, None) if isinstance(v, list) else _is_json_scalar(v) for v in value
        )
    if not shape:
        return _is_json_scalar(value)
    return isinstance(value, list) and len(value) == shape[0] and all(_scalars_nested(v, shape[1:]) for v in value)


def _nonneg_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_leaf(leaf, tensors: Mapping, n: int, batch_sizes: torch.Tensor, where: str, payload: str) -> None:
    if not isinstance(leaf, dict) or not isinstance(leaf.get("key"), list) or not leaf["key"] or not all(
        isinstance(k, str) for k in leaf["key"]
    ):
        raise _fail(where, "the leaf has no `key` (a non-empty list of str).")
    if leaf.get("kind") == "json":
        check_json_leaf(leaf, n, where, batch_sizes.tolist())
        return
    if leaf.get("kind") != "tensor":
        raise _fail(where, f"`kind` is {leaf.get('kind')!r}, expected 'tensor' or 'json'.")
    dtype = _io.DTYPES.get(leaf.get("dtype"))
    ndim = leaf.get("ndim")
    if dtype is None or not _nonneg_int(ndim) or ndim < batch_sizes.shape[1]:
        raise _fail(where, f"`dtype` {leaf.get('dtype')!r} or `ndim` {ndim!r} is invalid.")
    name = leaf.get("tensor")
    values = _tensor(tensors, f"{name}/values", where, dtype if payload == "values" else torch.uint8, [None])
    offsets = _tensor(tensors, f"{name}/offsets", where, torch.long, [n + 1]).as_subclass(torch.Tensor)
    shapes = _tensor(tensors, f"{name}/shapes", where, torch.long, [n, ndim]).as_subclass(torch.Tensor)
    lengths = offsets.diff()
    if int(offsets[0]) != 0 or int(offsets[-1]) != values.numel() or (n and int(lengths.min()) < 0):
        raise _fail(where, f"`offsets` must rise from 0 to {values.numel()}, the number of stored values.")
    if n and ndim and int(shapes.min()) < 0:
        raise _fail(where, "a shape holds a negative size.")
    if not bool((shapes[:, : batch_sizes.shape[1]] == batch_sizes).all()):
        raise _fail(where, "a leaf's shape does not start with its item's batch size.")
    if payload == "values" and not bool((shapes.prod(-1) == lengths).all()):
        raise _fail(where, "the number of values of an item differs from the number of elements of its shape.")


# -- loads ---------------------------------------------------------------------------------------------------
def ragged_records(groups: list[dict], tensors: Mapping, count: int) -> list[Record]:
    """The records of checked ``groups``, in position order; payloads are read into RAM."""
    out: list[Record | None] = [None] * count
    for group in groups:
        codec = DataCodec.from_json(group["codec"])
        base = group["tensor"]
        positions = tensors[f"{base}/positions"].as_subclass(torch.Tensor).tolist()
        batch_sizes = tensors[f"{base}/batch_sizes"].as_subclass(torch.Tensor).tolist()
        columns = []
        for leaf in group["leaves"]:
            if leaf["kind"] == "json":
                columns.append((tuple(leaf["key"]), None, None, [from_json_value(v) for v in leaf["values"]]))
                continue
            name = leaf["tensor"]
            values = tensors[f"{name}/values"].as_subclass(torch.Tensor)
            offsets = tensors[f"{name}/offsets"].as_subclass(torch.Tensor).tolist()
            shapes = tensors[f"{name}/shapes"].as_subclass(torch.Tensor).tolist()
            pieces = [values[offsets[i] : offsets[i + 1]].clone() for i in range(len(positions))]
            columns.append((tuple(leaf["key"]), _io.DTYPES[leaf["dtype"]], shapes, pieces))
        for i, position in enumerate(positions):
            leaves = [
                Leaf(key, None, None, payloads[i]) if dtype is None else Leaf(key, dtype, tuple(shapes[i]), payloads[i])
                for key, dtype, shapes, payloads in columns
            ]
            out[position] = Record(codec, tuple(batch_sizes[i]), leaves)
    return out  # type: ignore[return-value]


def from_json_value(value):
    """The non-tensor value saved as ``value`` by :func:`non_tensor_value`: a plain value, or a
    ``NonTensorStack`` for a saved stack."""
    if isinstance(value, dict) and "stack" in value:
        return NonTensorStack.from_list(_from_json_nested(value["stack"]))
    return _from_json_nested(value)


def _from_json_nested(value):
    if isinstance(value, list):
        return [_from_json_nested(v) for v in value]
    return float("nan") if value == {"nan": True} else value


def item_td(codec: DataCodec, item) -> TensorDictBase:
    """The TensorDict of an item (itself, or the one behind a tensorclass; a view for tensors and pytrees).

    TensorDicts are taken as they are, non-tensor entries included: these storages keep items whole.
    """
    if codec.kind == "tensordict":
        return item
    if codec.kind == "tensorclass":
        return item._tensordict
    if codec.kind == "tensor":
        return TensorDict({TENSOR_KEY: item}, batch_size=[])
    return TensorDict(dict(zip(codec.keys, pytree.tree_leaves(item))), batch_size=[])


def build_item(record: Record, tensor_of) -> Any:
    """The item of ``record``: ``tensor_of(leaf)`` gives each tensor leaf's tensor."""
    td = TensorDict(batch_size=record.batch_size)
    for leaf in record.leaves:
        if leaf.dtype is not None:
            td.set(leaf.key, tensor_of(leaf))
        else:
            set_json_leaf(td, leaf.key, leaf.payload)
    codec = record.codec
    if codec.kind == "tensordict":
        return td
    if codec.kind == "tensorclass":
        return codec.tensorclass._from_tensordict(td)
    if codec.kind == "tensor":
        return td.get(TENSOR_KEY)
    return pytree.tree_unflatten([td.get(k) for k in codec.keys], codec.treespec)


def set_json_leaf(td: TensorDictBase, key: tuple, value) -> None:
    """Sets the non-tensor entry ``key`` of ``td`` to ``value`` (a plain value, or already non-tensor data)."""
    if is_non_tensor(value):
        td.set(key, value)
    else:
        td.set_non_tensor(key, value)


def is_json_leaf(value) -> bool:
    """Whether a leaf of :func:`td_leaves` is a non-tensor entry."""
    return is_non_tensor(value)
