"""Checkpoint handlers of the built-in components: storages, samplers, writers, transforms and buffers.

A handler turns a component into ``(tensors, doc)`` (``doc`` a JSON document) and back; see
:func:`~torchrl.data.replay_buffers.checkpointers.register_checkpoint_handler`. Three kinds:

- tensor storages (:class:`TensorStorage` and subclasses): the leaves of the backing TensorDict are saved
  as ``storage/<key path>.memmap`` (tensordict's memmap layout), only the rows written so far, streamed;
  loads copy file-to-file into a memory-mapped storage and read straight into a RAM storage;
- :class:`ListStorage`: items that are tensors, TensorDicts, tensorclasses or pytrees of tensors, stacked
  when they all have one structure, else one entry per item;
- everything else with ``state_dict()``/``load_state_dict()`` (samplers, writers, transforms, ensembles):
  the state is saved as JSON whose tensors become files, and restored with ``load_state_dict``; a failed
  load restores the previous state.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import MemoryMappedTensor, TensorDict, TensorDictBase

from torchrl.data.replay_buffers import _checkpoint_io as _io
from torchrl.data.replay_buffers._checkpoint_io import CheckpointError
from torchrl.data.replay_buffers._checkpoint_validate import check_int_field


class Context:
    """Where a component's tensors go: a name ``prefix`` inside the checkpoint directory ``path``."""

    def __init__(self, path: str, prefix: str = ""):
        self.path, self.prefix = path, prefix

    def sub(self, name: str) -> Context:
        return Context(self.path, f"{self.prefix}{name}/")


def qualname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def mismatch(what: str, saved, here, fix: str) -> ValueError:
    return ValueError(
        f"The checkpoint does not fit this object: {what} is {saved!r} in the checkpoint and {here!r} here. "
        f"{fix} Nothing was loaded."
    )


def check_class(obj, doc: dict, role: str) -> None:
    if doc.get("class") != qualname(obj):
        raise mismatch(f"the {role} class", doc.get("class"), qualname(obj), f"Build the {role} as it was saved.")


# -- generic state dicts ----------------------------------------------------------------------------------------
def encode_state(value, tensors: dict, prefix: str, where: str):
    """A JSON tree for ``value`` (a state dict); its tensors go to ``tensors`` under ``prefix``."""
    if isinstance(value, TensorDictBase):
        leaves = [
            [list(key) if isinstance(key, tuple) else [key], encode_state(v, tensors, prefix, f"{where}[{key!r}]")]
            for key, v in value.items(include_nested=True, leaves_only=True)
        ]
        return {"tensordict": {"batch_size": list(value.batch_size), "leaves": leaves}}
    if isinstance(value, torch.Tensor):
        name = f"{prefix}t{len(tensors)}"
        tensors[name] = value.detach()
        return {"tensor": name}
    if isinstance(value, np.ndarray):
        name = f"{prefix}t{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
        return {"ndarray": name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _io.dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"Cannot save the key {k!r} at {where}: state dict keys must be str or numbers.")
            items.append([k, encode_state(v, tensors, prefix, f"{where}[{k!r}]")])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [encode_state(v, tensors, prefix, f"{where}[{i}]") for i, v in enumerate(value)]}
    raise TypeError(
        f"Cannot save {where}: it is a {type(value).__name__}, and checkpoints hold tensors, TensorDicts, "
        f"numbers, strings, None, and lists/tuples/dicts of those (nothing is pickled)."
    )


def decode_state(node, tensors: dict):
    """Rebuilds what :func:`encode_state` encoded; tensors are read into RAM."""
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"Malformed state node {node!r} in the checkpoint metadata.")
    ((kind, value),) = node.items()
    if kind == "value":
        return value
    if kind in ("tensor", "ndarray"):
        if value not in tensors:
            raise ValueError(f"The metadata refers to a tensor {value!r} that the checkpoint does not hold.")
        out = tensors[value].as_subclass(torch.Tensor).clone()
        return out.numpy() if kind == "ndarray" else out
    if kind == "tensordict":
        td = TensorDict(batch_size=value["batch_size"])
        for key, leaf in value["leaves"]:
            td.set(tuple(key), decode_state(leaf, tensors))
        return td
    if kind == "size":
        return torch.Size(value)
    if kind == "dtype":
        return _io.DTYPES[value]
    if kind == "device":
        return torch.device(value)
    if kind == "dict":
        return {k: decode_state(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [decode_state(v, tensors) for v in value]
        return items if kind == "list" else tuple(items)
    raise ValueError(f"Unknown state node kind {kind!r} in the checkpoint metadata.")


_CAPACITY_KEYS = ("max_capacity", "capacity", "_capacity", "max_size")


def dump_stateful(obj, ctx: Context) -> tuple[dict, dict]:
    if not callable(getattr(obj, "state_dict", None)):
        raise TypeError(f"Cannot save a {type(obj).__name__}: it has no state_dict() and no checkpoint handler.")
    tensors: dict = {}
    return tensors, {"class": qualname(obj), "state": encode_state(obj.state_dict(), tensors, ctx.prefix, "state")}


_COUNTER_KEYS = ("_cursor", "_write_count")  # writer counters: ints >= 0 (the cursor bounded in check_buffer)


def _saved_scalars(doc: dict) -> dict:
    """The scalar entries (``{"value": ...}`` nodes) of a saved state dict, by key."""
    saved = doc.get("state", {}).get("dict") or []
    return {key: node["value"] for key, node in saved if isinstance(node, dict) and "value" in node}


def check_stateful(obj, doc: dict, tensors: dict, ctx: Context) -> None:
    check_class(obj, doc, "component")
    saved = doc.get("state", {}).get("dict")
    if saved is None or not callable(getattr(obj, "state_dict", None)):
        return
    scalars = _saved_scalars(doc)
    for key in _COUNTER_KEYS:
        if key in scalars:
            where = f"The {type(obj).__name__} state in the checkpoint {ctx.path!r}"
            check_int_field(scalars[key], key, where, 0, fix="Counters are JSON integers, e.g. 0.")
    here = obj.state_dict()
    for key, node in saved:
        value = node.get("value") if isinstance(node, dict) else None
        if key in _CAPACITY_KEYS and isinstance(value, int) and isinstance(here.get(key), int) and value != here[key]:
            raise mismatch(f"the {key} of the {type(obj).__name__}", value, here[key], "Use the same capacity.")


def load_stateful(obj, doc: dict, tensors: dict, ctx: Context) -> None:
    state = decode_state(doc["state"], tensors)
    previous = copy.deepcopy(obj.state_dict())
    try:
        obj.load_state_dict(state)
    except Exception:
        obj.load_state_dict(previous)
        raise


# -- tensor storages --------------------------------------------------------------------------------------------
def _leaf_names(keys: list[tuple]) -> list[str]:
    names = ["/".join(key) for key in keys]
    if all(_io.name_problem(n) is None for n in names) and len(set(names)) == len(names):
        return names
    return [f"leaf_{i}" for i in range(len(keys))]


def _key_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _is_memmap_storage_at(storage, directory: str) -> bool:
    memmap_dir = getattr(storage, "_memmap_dir", None)
    return memmap_dir is not None and os.path.realpath(memmap_dir) == os.path.realpath(directory)


def dump_tensor_storage(storage, ctx: Context) -> tuple[dict, dict]:
    doc: dict[str, Any] = {
        "class": qualname(storage),
        "max_size": storage.max_size,
        "ndim": storage.ndim,
        "initialized": storage._storage is not None,
    }
    if storage._storage is None:
        return {}, doc
    backing = storage._storage
    rows = storage._counters["rows"]
    # a memmap storage whose files are this checkpoint's storage directory is saved whole: its files are
    # hard-linked into the new checkpoint instead of copied (see write_checkpoint)
    in_place = _is_memmap_storage_at(storage, os.path.join(ctx.path, ctx.prefix + "storage"))
    saved_rows = backing.batch_size[0] if in_place else rows
    keys = [_key_tuple(k) for k in backing.keys(include_nested=True, leaves_only=True)]
    tensors, leaves = {}, []
    for key, name in zip(keys, _leaf_names(keys)):
        leaf = backing.get(key)
        tensors[f"{ctx.prefix}storage/{name}"] = leaf[:saved_rows]
        entry = {"key": list(key), "tensor": f"{ctx.prefix}storage/{name}", "shape": list(leaf.shape)}
        leaves.append({**entry, "dtype": _io.dtype_name(leaf.dtype)})
    doc.update(
        codec=storage._codec.to_json(),
        batch_size=list(backing.batch_size),
        rows=rows,
        last_row=storage._counters["last_row"],
        saved_rows=saved_rows,
        leaves=leaves,
    )
    return tensors, doc


def check_tensor_storage(storage, doc: dict, tensors: dict, ctx: Context) -> None:
    check_class(storage, doc, "storage")
    for attr in ("max_size", "ndim"):
        if doc.get(attr) != getattr(storage, attr):
            fix = f"Build it with the same {attr}."
            raise mismatch(f"the storage {attr}", doc.get(attr), getattr(storage, attr), fix)
    if not doc.get("initialized"):
        return
    from torchrl.data.replay_buffers.storages._codec import DataCodec

    _check_storage_counters(storage, doc, ctx)
    DataCodec.from_json(doc["codec"])  # raises if e.g. the tensorclass is not importable
    for leaf in doc["leaves"]:
        stored = tensors.get(leaf["tensor"])
        if stored is None or list(stored.shape) != [doc["saved_rows"], *leaf["shape"][1:]]:
            raise ValueError(f"The checkpoint's storage entry {leaf['tensor']!r} does not match its description.")
    if storage._storage is None:
        return
    here = {_key_tuple(k): v for k, v in storage._storage.items(include_nested=True, leaves_only=True)}
    saved = {tuple(leaf["key"]): leaf for leaf in doc["leaves"]}
    fix = "Load into a storage that holds the same data, or into a freshly built one."
    if set(here) != set(saved):
        raise mismatch("the set of data keys", sorted(saved), sorted(here), fix)
    for key, leaf in saved.items():
        mine = (list(here[key].shape), _io.dtype_name(here[key].dtype))
        if (leaf["shape"], leaf["dtype"]) != mine:
            raise mismatch(f"the (shape, dtype) of {key}", (leaf["shape"], leaf["dtype"]), mine, fix)


def _check_storage_counters(storage, doc: dict, ctx: Context) -> None:
    """The grid size and row counters of a tensor storage's description fit its capacity."""
    where = f"The {type(storage).__name__} description in the checkpoint {ctx.path!r}"
    grid = doc["batch_size"]
    ndim = storage.ndim
    if not isinstance(grid, list) or len(grid) < ndim:
        raise CheckpointError(
            f"{where}: `batch_size` is {grid!r}, expected a list of at least ndim={ndim} positive ints (the "
            f"storage's grid). Save the storage again with `dumps`. Nothing was loaded."
        )
    for i, size in enumerate(grid):
        check_int_field(size, f"batch_size[{i}]", where, 1)
    cells = math.prod(grid[1:ndim])
    rows = -(-storage.max_size // cells)  # the rows a storage of this max_size allocates for such items
    check_int_field(grid[0], "batch_size[0]", where, rows, rows, fix=f"max_size={storage.max_size} gives {rows} rows.")
    written = check_int_field(doc["rows"], "rows", where, 0, rows, fix="`rows` counts the rows written.")
    check_int_field(doc["last_row"], "last_row", where, -1, written - 1, fix="`last_row` is a written row, or -1.")
    check_int_field(doc["saved_rows"], "saved_rows", where, written, rows, fix="Every written row is saved.")
    for leaf in doc["leaves"]:
        if not isinstance(leaf.get("shape"), list) or leaf["shape"][: len(grid)] != grid:
            raise CheckpointError(
                f"{where}: the entry {leaf.get('key')!r} has shape {leaf.get('shape')!r}, which does not start "
                f"with the storage's `batch_size` {grid}. Save the storage again with `dumps`. Nothing was loaded."
            )


def load_tensor_storage(storage, doc: dict, tensors: dict, ctx: Context) -> None:
    from torchrl.data.replay_buffers.storages._codec import DataCodec

    if not doc.get("initialized"):
        storage._empty()
        return
    codec = DataCodec.from_json(doc["codec"])
    saved_rows = doc["saved_rows"]
    if storage._storage is None:
        backing = _adopt_checkpoint_files(storage, doc, tensors)
        if backing is None:
            template = TensorDict(batch_size=doc["batch_size"][1:])
            for leaf in doc["leaves"]:
                template.set(tuple(leaf["key"]), torch.zeros(leaf["shape"][1:], dtype=_io.DTYPES[leaf["dtype"]]))
            backing = storage._allocate(template, doc["batch_size"][0])
        storage._adopt(backing, codec)
    for leaf in doc["leaves"]:
        source = tensors[leaf["tensor"]]
        if source.numel():
            _io.read_into(source.filename, storage._storage.get(tuple(leaf["key"]))[:saved_rows])
    storage._codec = codec
    storage._counters["rows"] = doc["rows"]
    storage._counters["last_row"] = doc["last_row"]
    storage._counters["revision"] += 1


def _adopt_checkpoint_files(storage, doc: dict, tensors: dict):
    """Maps the checkpoint's own files when ``storage`` is a memmap storage whose scratch dir holds them."""
    scratch = getattr(storage, "scratch_dir", None)
    if scratch is None or doc["saved_rows"] != doc["batch_size"][0] or not doc["leaves"]:
        return None
    files = [getattr(tensors[leaf["tensor"]], "_filename", None) for leaf in doc["leaves"]]
    root = os.path.realpath(scratch)
    if any(f is None or not os.path.realpath(f).startswith(root + os.sep) for f in files):
        return None
    backing = TensorDict(batch_size=doc["batch_size"])
    for leaf, file in zip(doc["leaves"], files):
        dtype = _io.DTYPES[leaf["dtype"]]
        backing.set(tuple(leaf["key"]), MemoryMappedTensor.from_filename(file, dtype, leaf["shape"], mode="r+"))
    storage._memmap_dir = scratch
    return backing


# -- list storages ----------------------------------------------------------------------------------------------
def _encode_items(items: list) -> tuple[list, list]:
    from torchrl.data.replay_buffers.storages._codec import DataCodec

    codecs, tds = [], []
    for i, item in enumerate(items):
        try:
            codec = DataCodec.for_data(item)
            tds.append(codec.encode(item, batch_dims=0))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"Cannot save item {i} of the ListStorage: {err} Checkpoints hold tensors, TensorDicts, "
                f"tensorclasses and pytrees of tensors only (nothing is pickled)."
            ) from None
        codecs.append(codec)
    return codecs, tds


def _describe_td(td: TensorDictBase) -> list:
    return [
        (_key_tuple(k), list(v.shape), v.dtype)
        for k, v in td.items(include_nested=True, leaves_only=True)
    ]


def dump_list_storage(storage, ctx: Context) -> tuple[dict, dict]:
    items = list(storage._storage)
    doc: dict[str, Any] = {"class": qualname(storage), "max_size": storage.max_size, "count": len(items)}
    if not items:
        return {}, {**doc, "layout": "empty"}
    codecs, tds = _encode_items(items)
    first = codecs[0].to_json(), _describe_td(tds[0]), list(tds[0].batch_size)
    homogeneous = all((c.to_json(), _describe_td(t), list(t.batch_size)) == first for c, t in zip(codecs, tds))
    if homogeneous:
        groups = [(codecs[0], torch.stack(tds), "stacked")]
    else:
        groups = [(c, t, f"items/{i}") for i, (c, t) in enumerate(zip(codecs, tds))]
    tensors, entries = {}, []
    for codec, td, sub in groups:
        keys = [_key_tuple(k) for k in td.keys(include_nested=True, leaves_only=True)]
        leaves = []
        for key, name in zip(keys, _leaf_names(keys)):
            tensors[f"{ctx.prefix}storage/{sub}/{name}"] = td.get(key)
            leaves.append({"key": list(key), "tensor": f"{ctx.prefix}storage/{sub}/{name}"})
        entries.append({"codec": codec.to_json(), "batch_size": list(td.batch_size), "leaves": leaves})
    return tensors, {**doc, "layout": "stacked" if homogeneous else "items", "entries": entries}


def check_list_storage(storage, doc: dict, tensors: dict, ctx: Context) -> None:
    from torchrl.data.replay_buffers.storages._codec import DataCodec

    check_class(storage, doc, "storage")
    if doc.get("max_size") != storage.max_size:
        raise mismatch("the storage max_size", doc.get("max_size"), storage.max_size, "Use the same max_size.")
    where = f"The ListStorage description in the checkpoint {ctx.path!r}"
    count = check_int_field(doc["count"], "count", where, 0, storage.max_size, fix="`count` is the number of items.")
    entries = doc.get("entries", [])
    held = sum(entry["batch_size"][0] for entry in entries) if doc.get("layout") == "stacked" else len(entries)
    if held != count:
        raise CheckpointError(
            f"{where}: `count` is {count} but the entries hold {held} items. Save the storage again with `dumps`. "
            f"Nothing was loaded."
        )
    for entry in doc.get("entries", []):
        DataCodec.from_json(entry["codec"])
        if any(leaf["tensor"] not in tensors for leaf in entry["leaves"]):
            raise ValueError("The checkpoint's ListStorage entries refer to tensors it does not hold.")


def load_list_storage(storage, doc: dict, tensors: dict, ctx: Context) -> None:
    from torchrl.data.replay_buffers.storages._codec import DataCodec

    items = []
    for entry in doc.get("entries", []):
        td = TensorDict(batch_size=entry["batch_size"])
        for leaf in entry["leaves"]:
            td.set(tuple(leaf["key"]), tensors[leaf["tensor"]].as_subclass(torch.Tensor).clone())
        codec = DataCodec.from_json(entry["codec"])
        if doc["layout"] == "stacked":
            items.extend(codec.decode(td[i]) for i in range(td.batch_size[0]))
        else:
            items.append(codec.decode(td))
    storage.load_state_dict({"_storage": items})


# -- buffers ----------------------------------------------------------------------------------------------------
_PARTS = ("storage", "sampler", "writer", "transforms")


def _parts(rb) -> dict:
    return {"storage": rb._storage, "sampler": rb._sampler, "writer": rb._writer, "transforms": rb._transform}


def _part_ctx(ctx: Context, role: str) -> Context:
    return ctx if role == "storage" else ctx.sub(role)


def dump_buffer(rb, ctx: Context) -> tuple[dict, dict]:
    tensors, parts = {}, {}
    for role, component in _parts(rb).items():
        sub_tensors, parts[role] = dump_any(component, _part_ctx(ctx, role))
        tensors.update(sub_tensors)
    rng = None
    if rb._rng is not None:
        tensors[f"{ctx.prefix}rng/state"] = rb._rng.get_state()
        rng = {"device": str(rb._rng.device), "state": f"{ctx.prefix}rng/state"}
    return tensors, {"class": qualname(rb), "batch_size": rb._batch_size, "rng": rng, "parts": parts}


def check_buffer(rb, doc: dict, tensors: dict, ctx: Context) -> None:
    check_class(rb, doc, "replay buffer")
    if set(doc["parts"]) != set(_PARTS):
        raise ValueError(f"The checkpoint's buffer parts are {sorted(doc['parts'])}, expected {list(_PARTS)}.")
    for role, component in _parts(rb).items():
        check_any(component, doc["parts"][role], tensors, _part_ctx(ctx, role))
    where = f"The {type(rb).__name__} description in the checkpoint {ctx.path!r}"
    if doc["batch_size"] is not None:
        check_int_field(doc["batch_size"], "batch_size", where, 1, fix="It is a positive JSON integer, or null.")
    storage_doc = doc["parts"]["storage"]["doc"]
    storage_doc = storage_doc if isinstance(storage_doc, dict) else {}
    grid = storage_doc.get("batch_size")
    capacity = grid[0] if isinstance(grid, list) and grid else storage_doc.get("max_size")
    writer_doc = doc["parts"]["writer"]["doc"]
    cursor = _saved_scalars(writer_doc).get("_cursor") if isinstance(writer_doc, dict) else None
    if cursor is not None and isinstance(capacity, int):  # storages of other handlers may not say
        fix = f"The writer's cursor is a row of the storage, which has {capacity} rows."
        check_int_field(cursor, "_cursor", f"{where} (writer state)", 0, capacity, fix=fix)


def load_buffer(rb, doc: dict, tensors: dict, ctx: Context) -> None:
    parts = _parts(rb)
    small = ("sampler", "writer", "transforms")
    before = {role: copy.deepcopy(parts[role].state_dict()) for role in small}
    try:
        for role in (*small, "storage"):
            load_any(parts[role], doc["parts"][role], tensors, _part_ctx(ctx, role))
    except BaseException:
        for role in small:
            parts[role].load_state_dict(before[role])
        raise
    rb._batch_size = doc["batch_size"]
    if doc["rng"] is not None:
        generator = torch.Generator(device=doc["rng"]["device"])
        generator.set_state(tensors[doc["rng"]["state"]].as_subclass(torch.Tensor).clone())
        rb.set_rng(generator)


# -- registry ---------------------------------------------------------------------------------------------------
_HANDLERS: dict[type, tuple] = {}
_DEFAULTS_REGISTERED = False


def register(cls: type, dump, load, check=None) -> None:
    _HANDLERS[cls] = (dump, check, load)


def handler_for(obj) -> tuple:
    _register_defaults()
    for cls in type(obj).__mro__:
        if cls in _HANDLERS:
            return _HANDLERS[cls]
    return dump_stateful, check_stateful, load_stateful


def dump_any(obj, ctx: Context) -> tuple[dict, dict]:
    dump, _, _ = handler_for(obj)
    tensors, doc = dump(obj, ctx)
    return tensors, {"class": qualname(obj), "doc": doc}


def _role(obj) -> str:
    from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
    from torchrl.data.replay_buffers.samplers.base import Sampler
    from torchrl.data.replay_buffers.storages.base import Storage
    from torchrl.data.replay_buffers.writers.base import Writer

    roles = ((Storage, "storage"), (Sampler, "sampler"), (Writer, "writer"), (ReplayBuffer, "replay buffer"))
    return next((role for cls, role in roles if isinstance(obj, cls)), "component")


def check_any(obj, wrapped: dict, tensors: dict, ctx: Context) -> None:
    check_class(obj, wrapped, _role(obj))
    _, check, _ = handler_for(obj)
    if check is not None:
        check(obj, wrapped["doc"], tensors, ctx)


def load_any(obj, wrapped: dict, tensors: dict, ctx: Context) -> None:
    _, _, load = handler_for(obj)
    load(obj, wrapped["doc"], tensors, ctx)


def _register_defaults() -> None:
    global _DEFAULTS_REGISTERED
    if _DEFAULTS_REGISTERED:
        return
    _DEFAULTS_REGISTERED = True
    from torchrl.data.replay_buffers.replay_buffers.base import ReplayBuffer
    from torchrl.data.replay_buffers.replay_buffers.ensemble import ReplayBufferEnsemble
    from torchrl.data.replay_buffers.storages.list import ListStorage
    from torchrl.data.replay_buffers.storages.tensor import TensorStorage

    _HANDLERS.setdefault(TensorStorage, (dump_tensor_storage, check_tensor_storage, load_tensor_storage))
    _HANDLERS.setdefault(ListStorage, (dump_list_storage, check_list_storage, load_list_storage))
    _HANDLERS.setdefault(ReplayBuffer, (dump_buffer, check_buffer, load_buffer))
    _HANDLERS.setdefault(ReplayBufferEnsemble, (dump_stateful, check_stateful, load_stateful))
