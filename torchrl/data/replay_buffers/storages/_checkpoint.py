"""The checkpoint parts of tensor and list storages, as functions of the values the storage hands over.

:class:`~torchrl.data.TensorStorage` and :class:`~torchrl.data.ListStorage` implement the part protocol of
:mod:`torchrl.data.replay_buffers._checkpoint.parts` in their own files and call these helpers with their fields
(backing TensorDict, row counters, items); nothing here reads a storage's attributes.

Tensor storage part (``doc``): ``class``, ``max_size``, ``ndim``, ``initialized`` and, once initialized,
``codec``, ``batch_size`` (the backing's grid), ``rows``, ``last_row``, ``saved_rows`` (the rows saved: the
written ones, or every row when the files are linked whole) and ``leaves`` (``key``, ``tensor`` name, full
``shape``, ``dtype``). The rows of each leaf are the tensor ``<prefix>storage/<key path>``. An incremental part
has ``base_rows``, ``patches`` and per leaf ``base``/``patches`` instead of ``tensor`` (see :mod:`._incremental`,
which also describes the ``checkpoint_ids`` that the checkpoint's metadata holds beside the component).

List storage part: ``class``, ``max_size``, ``count`` and ``layout``: ``"empty"``, ``"stacked"`` (one entry
whose leaves stack every item) or ``"items"`` (one entry per item); each entry holds a data ``codec``, a
``batch_size`` and its ``leaves``: tensor leaves (``key``, ``tensor`` name) and, for the non-tensor entries of
TensorDict and tensorclass items (strings, numbers, ``None``), ``"json"`` leaves (``key``, ``kind="json"``,
``values``: one JSON value per item of the entry, as in :mod:`._ragged`). A leaf without ``kind`` is a tensor.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, MemoryMappedTensor, TensorDict, TensorDictBase

import torchrl.data.replay_buffers._checkpoint.io as _io
import torchrl.data.replay_buffers.storages._incremental as _inc
import torchrl.data.replay_buffers.storages._ragged as _ragged
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._codec import DataCodec


def _key_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _leaf_keys(td: TensorDictBase) -> list[tuple]:
    return [_key_tuple(k) for k in td.keys(include_nested=True, leaves_only=True)]


def _files_under(backing: TensorDictBase, directory: str) -> bool:
    files = [getattr(v, "filename", None) for v in backing.values(include_nested=True, leaves_only=True)]
    root = os.path.realpath(directory) + os.sep
    return bool(files) and all(f is not None and os.path.realpath(f).startswith(root) for f in files)


# -- tensor storages --------------------------------------------------------------------------------------------
def tensor_storage_part(
    storage,
    backing: TensorDictBase | None,
    codec: DataCodec | None,
    rows: int,
    last_row: int,
    ctx: PartContext,
    versions=None,
    exposed=None,
) -> tuple[dict, dict]:
    """The part of a tensor storage whose data is ``backing`` (``None`` before the first write).

    When every file of a memory-mapped backing lies in the checkpoint's own ``storage`` directory, every row is
    saved, so that ``write_checkpoint`` hard-links the files instead of copying them. Otherwise the part carries
    a ``checkpoint_id``, and with ``versions`` (the storage's row versions, shared or private) a dump onto a
    checkpoint this storage wrote is incremental (see :mod:`._incremental`); ``exposed`` marks the rows handed
    out as views, checked by digest (NOTE [edits through views] there).
    """
    doc: dict[str, Any] = {
        "class": qualname(storage),
        "max_size": storage.max_size,
        "ndim": storage.ndim,
        "initialized": backing is not None,
    }
    if backing is None:
        return {}, doc
    if isinstance(backing, LazyStackedTensorDict):
        raise TypeError(
            f"Cannot save this {type(storage).__name__}: its items are lazy stacks whose members differ in shape, "
            f"which the checkpoint format does not describe. Save such items in a LazyStackStorage (its checkpoint "
            f"keeps ragged items), or use state_dict(). Nothing was written."
        )
    whole = _files_under(backing, os.path.join(ctx.path, ctx.prefix + "storage"))
    saved_rows = backing.batch_size[0] if whole else rows
    keys = _leaf_keys(backing)
    names = _io.leaf_names(keys)
    leaves = [
        {
            "key": list(key),
            "tensor": ctx.name(f"storage/{name}"),
            "shape": list(backing.get(key).shape),
            "dtype": _io.dtype_name(backing.get(key).dtype),
        }
        for key, name in zip(keys, names)
    ]
    doc.update(
        codec=codec.to_json(),
        batch_size=list(backing.batch_size),
        rows=rows,
        last_row=last_row,
        saved_rows=saved_rows,
        leaves=leaves,
    )
    if not whole:
        ident = _inc.checkpoint_id(versions)
        _inc.set_checkpoint_id(ctx, ident)
        digests = None if versions is None else _inc.block_digests(backing, keys, saved_rows, exposed)
        plan = None if versions is None else _inc.plan(versions, doc, ctx, digests)
        patched = None if plan is None else _patched_part(doc, plan, backing, keys, ctx, ident["version"])
        if versions is not None:
            reused = {} if patched is None else plan.reused
            _inc.remember_after_write(versions, ctx, doc if patched is None else patched[1], ident, reused, digests)
        if patched is not None:
            return patched
    tensors = {leaf["tensor"]: backing.get(key)[:saved_rows] for leaf, key in zip(leaves, keys)}
    return tensors, doc


def _patched_part(doc: dict, plan, backing, keys, ctx: PartContext, version: int) -> tuple[dict, dict] | None:
    """The incremental form of the full part ``doc`` (see :mod:`._incremental`); ``None`` if names collide."""
    old = plan.previous
    tensors = dict(plan.reused)
    leaves = []
    for position, (leaf, old_leaf, key) in enumerate(zip(doc["leaves"], old["leaves"], keys)):
        new_names = [_inc.patch_name(ctx.name("storage"), version, i, position) for i in range(len(plan.ranges))]
        for (start, stop), patch in zip(plan.ranges, new_names):
            if patch in tensors:
                return None
            tensors[patch] = backing.get(key)[start:stop]
        leaves.append(
            {
                "key": leaf["key"],
                "base": old_leaf.get("base", old_leaf.get("tensor")),
                "patches": list(old_leaf.get("patches") or ()) + new_names,
                "shape": leaf["shape"],
                "dtype": leaf["dtype"],
            }
        )
    patched = dict(doc, leaves=leaves, base_rows=old.get("base_rows", old["saved_rows"]))
    patched["patches"] = list(old.get("patches") or ()) + plan.ranges
    return tensors, patched


def check_tensor_storage_part(
    storage, backing: TensorDictBase | None, doc: dict, tensors: Mapping, ctx: PartContext
) -> None:
    """Raises if ``doc`` does not fit ``storage`` (``backing``: its data, ``None`` before the first write).

    Records ``ctx.facts["storage_rows"]``, the rows of the saved storage (its ``max_size`` before it held data), and
    raises ``ctx.facts["storage_items"]`` to its ``max_size`` (see :class:`PartContext`).
    """
    check_class(storage, doc, "storage")
    for attr in ("max_size", "ndim"):
        if doc.get(attr) != getattr(storage, attr):
            fix = f"Build it with the same {attr}."
            raise mismatch(f"the storage {attr}", doc.get(attr), getattr(storage, attr), fix)
    ctx.facts["storage_items"] = max(ctx.facts.get("storage_items", 0), storage.max_size)
    if not doc.get("initialized"):
        ctx.facts["storage_rows"] = storage.max_size
        return
    ctx.facts["storage_rows"] = _check_counters(storage, doc, ctx)
    if not isinstance(doc.get("codec"), dict):
        raise CheckpointError(
            f"The checkpoint's storage description has no data codec (`codec` is {doc.get('codec')!r})."
        )
    if "patches" in doc:
        _check_patches(storage, doc, tensors, ctx)
    else:
        where = f"The {type(storage).__name__} description in the checkpoint {ctx.path!r}"
        for leaf in doc["leaves"]:
            _check_leaf_tensor(leaf, leaf["tensor"], tensors.get(leaf["tensor"]), doc["saved_rows"], where)
    if backing is None:
        return
    here = {_key_tuple(k): v for k, v in backing.items(include_nested=True, leaves_only=True)}
    saved = {tuple(leaf["key"]): leaf for leaf in doc["leaves"]}
    fix = "Load into a storage that holds the same data, or into a freshly built one."
    if set(here) != set(saved):
        raise mismatch("the set of data keys", sorted(saved), sorted(here), fix)
    for key, leaf in saved.items():
        mine = (list(here[key].shape), _io.dtype_name(here[key].dtype))
        if (leaf["shape"], leaf["dtype"]) != mine:
            raise mismatch(f"the (shape, dtype) of {key}", (leaf["shape"], leaf["dtype"]), mine, fix)


def _check_counters(storage, doc: dict, ctx: PartContext) -> int:
    """Checks that the grid size and row counters of ``doc`` fit the storage's capacity; returns the rows."""
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
    check_int_field(
        grid[0], "batch_size[0]", where, rows, rows, fix=f"max_size={storage.max_size} gives {rows} rows."
    )
    written = check_int_field(doc["rows"], "rows", where, 0, rows, fix="`rows` counts the rows written.")
    check_int_field(
        doc["last_row"], "last_row", where, -1, written - 1, fix="`last_row` is a written row, or -1."
    )
    check_int_field(doc["saved_rows"], "saved_rows", where, written, rows, fix="Every written row is saved.")
    for leaf in doc["leaves"]:
        if not isinstance(leaf.get("shape"), list) or leaf["shape"][: len(grid)] != grid:
            raise CheckpointError(
                f"{where}: the entry {leaf.get('key')!r} has shape {leaf.get('shape')!r}, which does not start "
                f"with the storage's `batch_size` {grid}. Save the storage again with `dumps`. Nothing was loaded."
            )
        if not isinstance(leaf.get("dtype"), str) or leaf["dtype"] not in _io.DTYPES:
            raise CheckpointError(
                f"{where}: the entry {leaf.get('key')!r} has dtype {leaf.get('dtype')!r}, which is not one of "
                f"{sorted(_io.DTYPES)}. Save the storage again with `dumps`. Nothing was loaded."
            )
    return rows


def _check_leaf_tensor(leaf: dict, name, stored, rows: int, where: str) -> None:
    """Raises unless ``stored`` (the checkpoint's tensor ``name``) holds ``rows`` rows of the leaf's item shape, in
    the leaf's dtype: a description retyped apart from its tensor would reinterpret the bytes."""
    if stored is None or list(stored.shape) != [rows, *leaf["shape"][1:]]:
        raise ValueError(f"The checkpoint's storage entry {name!r} does not match its description.")
    if _io.dtype_name(stored.dtype) != leaf["dtype"]:
        raise CheckpointError(
            f"{where}: the entry {leaf.get('key')!r} is described as {leaf['dtype']} but its tensor {name!r} is "
            f"{_io.dtype_name(stored.dtype)} in the checkpoint's tensor table: one of them was edited, and reading "
            f"the bytes as the other dtype would change every value. Save the storage again with `dumps`. "
            f"Nothing was loaded."
        )


def _check_patches(storage, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
    """Checks the base rows and patches of an incremental part (see :mod:`._incremental`)."""
    where = f"The {type(storage).__name__} description in the checkpoint {ctx.path!r}"
    saved = doc["saved_rows"]
    base_rows = check_int_field(doc.get("base_rows"), "base_rows", where, 0, saved, fix="Base rows are saved rows.")
    patches = doc["patches"]
    if not isinstance(patches, list) or len(patches) > _inc.MAX_PATCHES:
        raise CheckpointError(
            f"{where}: `patches` is not a list of at most {_inc.MAX_PATCHES} [start, stop] row ranges. Save the "
            f"storage again with `dumps`. Nothing was loaded."
        )
    covered = np.zeros(saved, dtype=bool)
    covered[:base_rows] = True
    for i, patch in enumerate(patches):
        if not isinstance(patch, list) or len(patch) != 2:
            raise CheckpointError(f"{where}: `patches[{i}]` is {patch!r}, expected [start, stop]. Nothing was loaded.")
        start = check_int_field(patch[0], f"patches[{i}][0]", where, 0, max(saved - 1, 0))
        check_int_field(patch[1], f"patches[{i}][1]", where, start + 1, saved)
        covered[patch[0] : patch[1]] = True
    if not covered.all():
        raise CheckpointError(
            f"{where}: rows {np.flatnonzero(~covered)[:8].tolist()} are neither base rows nor in a patch. Save "
            f"the storage again with `dumps`. Nothing was loaded."
        )
    for leaf in doc["leaves"]:
        names = leaf.get("patches")
        if not isinstance(names, list) or len(names) != len(patches):
            raise CheckpointError(f"{where}: the entry {leaf.get('key')!r} does not name one tensor per patch.")
        expected = [(leaf.get("base"), base_rows)] + [(n, b - a) for n, (a, b) in zip(names, patches)]
        for name, n in expected:
            _check_leaf_tensor(leaf, name, tensors.get(name) if isinstance(name, str) else None, n, where)


def check_same_layout(dst: TensorDictBase, src: TensorDictBase) -> None:
    """Raises if the state ``src`` (a ``state_dict()`` backing) has other keys, shapes or dtypes than ``dst``."""
    if isinstance(dst, LazyStackedTensorDict) or isinstance(src, LazyStackedTensorDict):
        same = (
            isinstance(dst, LazyStackedTensorDict)
            and isinstance(src, LazyStackedTensorDict)
            and dst.stack_dim == src.stack_dim
            and len(dst.tensordicts) == len(src.tensordicts)
        )
        if not same:
            raise ValueError(
                "The state to load and the storage do not both hold lazy stacks of the same members (items whose "
                "members differ in shape): load a state saved by a storage of the same data."
            )
        for mine, theirs in zip(dst.tensordicts, src.tensordicts):
            check_same_layout(mine, theirs)
        return
    dst_keys = set(dst.keys(True, True))
    src_keys = set(src.keys(True, True))
    if dst_keys != src_keys:
        raise ValueError(
            f"The state to load holds keys {sorted(map(str, src_keys))}, the storage holds "
            f"{sorted(map(str, dst_keys))}."
        )
    for key in dst_keys:
        a, b = dst.get(key), src.get(key)
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(
                f"Entry {key!r}: the state to load has shape {list(b.shape)} and dtype {b.dtype}, the "
                f"storage has {list(a.shape)} and {a.dtype}."
            )


def item_template(doc: dict) -> TensorDict:
    """One zero item shaped like the saved storage's items (what ``_allocate`` sizes a backing from)."""
    template = TensorDict(batch_size=doc["batch_size"][1:])
    for leaf in doc["leaves"]:
        template.set(tuple(leaf["key"]), torch.zeros(leaf["shape"][1:], dtype=_io.DTYPES[leaf["dtype"]]))
    return template


def unfilled_backing(doc: dict) -> TensorDict:
    """A private CPU backing for the saved storage ``doc`` whose saved rows hold no value yet, for
    :func:`copy_saved_rows` to fill: the rows past them are zero (as an allocation's), the others are not
    zeroed first, and each leaf's memory is laid out for fast reads (:func:`~._checkpoint.io.empty_tensor`:
    transparent huge pages, no aliasing of the page cache's offsets). Zeroing then reading would fault and
    write every page twice: a load of a RAM storage took twice the time of ``numpy.load`` of its bytes."""
    saved = doc["saved_rows"]
    backing = TensorDict(batch_size=doc["batch_size"], device="cpu")
    for leaf in doc["leaves"]:
        tensor = _io.empty_tensor(_io.DTYPES[leaf["dtype"]], leaf["shape"])
        if saved < tensor.shape[0]:
            tensor[saved:].zero_()
        backing.set(tuple(leaf["key"]), tensor)
    return backing


def map_checkpoint_files(doc: dict, tensors: Mapping, directory: str) -> TensorDict | None:
    """A backing that maps the checkpoint's files in place (read-write), when they all lie in ``directory``, hold
    every row and carry no patch; else ``None``. For a memory-mapped storage whose scratch directory is the
    checkpoint's ``storage`` directory: the load changes no file of the checkpoint (the storage's later writes
    do, as it maps them). A checkpoint that cannot be mapped so is refused by :func:`check_not_own_files`.
    """
    if doc["saved_rows"] != doc["batch_size"][0] or "patches" in doc or not doc["leaves"]:
        return None
    files = _part_files(doc, tensors)
    root = os.path.realpath(directory)
    if any(f is None or not os.path.realpath(f).startswith(root + os.sep) for f in files):
        return None
    backing = TensorDict(batch_size=doc["batch_size"])
    for leaf, file in zip(doc["leaves"], files):
        dtype = _io.DTYPES[leaf["dtype"]]
        backing.set(
            tuple(leaf["key"]), MemoryMappedTensor.from_filename(file, dtype, leaf["shape"], mode="r+")
        )
    return backing


def _part_files(doc: dict, tensors: Mapping) -> list:
    """The file of each tensor of a storage part (base rows and patches; ``None`` for one not memory-mapped)."""
    names = [leaf.get("base", leaf.get("tensor")) for leaf in doc["leaves"]]
    names += [patch for leaf in doc["leaves"] for patch in leaf.get("patches") or ()]
    return [getattr(tensors.get(name), "filename", None) for name in names]


def check_not_own_files(doc: dict, tensors: Mapping, directory: str, cls: str) -> None:
    """Refuses (``ValueError``, nothing changed) to load a checkpoint that cannot be mapped in place into a
    memory-mapped storage whose files would go to ``directory`` when a file of the checkpoint lies there: its
    allocation or the patches would write into the checkpoint's own files."""
    root = os.path.realpath(directory)
    own = [f for f in _part_files(doc, tensors) if f is not None and os.path.realpath(f).startswith(root + os.sep)]
    if own:
        why = (
            f"it holds {doc['saved_rows']} of the storage's {doc['batch_size'][0]} rows"
            if doc["saved_rows"] != doc["batch_size"][0]
            else "it is an incremental checkpoint (base rows plus patches)"
        )
        raise ValueError(
            f"Cannot load this checkpoint into a {cls} whose scratch_dir {directory!r} holds the checkpoint's own "
            f"files (e.g. {own[0]!r}): {why}, so the load would write into those files and change the "
            f"checkpoint. Build the storage with another scratch_dir (or none) to load a copy; only a checkpoint of "
            f"a full storage, dumped in full, is mapped in place. Nothing was loaded."
        )


# Loads copy with a few threads when there is much to copy: a kernel copy of the page cache (copy_file_range,
# preadv) runs on one core, and releases the GIL, so several copies of disjoint row ranges run at the speed of
# several cores, where a single-stream file copy runs at one core's. Measured in benchmarks/checkpoint_incremental.py.
LOAD_THREADS = min(4, os.cpu_count() or 1)
PARALLEL_MIN_BYTES = 64 << 20
_PARALLEL_CHUNK_BYTES = 32 << 20


def copy_saved_rows(doc: dict, tensors: Mapping, backing: TensorDictBase) -> None:
    """Copies the saved rows of every leaf into ``backing`` (file to file for a memory-mapped backing): the base
    rows, in row ranges copied by up to :data:`LOAD_THREADS` threads for large loads, then the patches in order
    (later patches win)."""
    base_rows = doc.get("base_rows", doc["saved_rows"])
    jobs, patches = [], []
    for leaf in doc["leaves"]:
        target = backing.get(tuple(leaf["key"]))
        source = tensors[leaf.get("base", leaf.get("tensor"))]
        if source.numel():
            jobs.append((source.filename, target[:base_rows]))
        for (start, stop), name in zip(doc.get("patches", ()), leaf.get("patches", ())):
            if tensors[name].numel():
                patches.append((tensors[name].filename, target[start:stop]))
    total = sum(t.numel() * t.element_size() for _, t in jobs)
    if total < PARALLEL_MIN_BYTES or LOAD_THREADS < 2 or any(not t.is_contiguous() for _, t in jobs):
        for file, target in jobs + patches:
            _io.read_into(file, target)
        return
    chunks = []
    for file, target in jobs:
        row_bytes = max(1, target[0].numel() * target.element_size())
        step = max(1, _PARALLEL_CHUNK_BYTES // row_bytes)
        chunks.extend((file, target[a : a + step], a * row_bytes) for a in range(0, target.shape[0], step))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(LOAD_THREADS, len(chunks))) as pool:
        for done in [pool.submit(_io.read_into, file, target, lambda n: None, offset) for file, target, offset in chunks]:
            done.result()  # the first error, once every copy has stopped
    for file, target in patches:
        _io.read_into(file, target)


def remember_loaded(versions, backing: TensorDictBase, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
    """After ``doc`` was loaded into ``backing`` (rows stamped by ``versions``): the next dump at ``ctx.path`` may
    be incremental, unless the backing maps the checkpoint's own files (they change with every write)."""
    live = _files_under(backing, os.path.join(ctx.path, ctx.prefix + "storage"))
    _inc.remember_loaded(versions, None if live else doc, tensors, ctx, versions.snapshot())


# -- list storages ----------------------------------------------------------------------------------------------
class _Encoded(NamedTuple):
    """An item to save: its codec, a TensorDict of its tensor leaves and its non-tensor leaves (key -> JSON)."""

    codec: DataCodec
    td: TensorDictBase
    json: dict

    def signature(self) -> tuple:
        described = [(_key_tuple(k), list(v.shape), v.dtype) for k, v in self.td.items(True, True)]
        return self.codec.to_json(), described, list(self.td.batch_size), list(self.json)


def _encode_item(i: int, item) -> _Encoded:
    try:
        codec = DataCodec.for_data(item)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"Cannot save item {i} of the ListStorage ({type(item).__name__}): {err} Checkpoints hold "
            f"tensors, TensorDicts, tensorclasses and pytrees of tensors only; anything else would need "
            f"pickle, which this format never uses (loading a pickle runs code). Nothing was written."
        ) from None
    td = _ragged.item_td(codec, item)
    leaves = _ragged.td_leaves(td)
    if not any(_ragged.is_json_leaf(value) for _, value in leaves):
        return _Encoded(codec, td, {})
    tensors, json = TensorDict(batch_size=td.batch_size, device=td.device), {}
    for key, value in leaves:
        if _ragged.is_json_leaf(value):  # a str, number or None (or a stack of them): saved as JSON
            json[key] = _ragged.non_tensor_value(value, key, f"item {i} of the ListStorage")
        else:
            tensors.set(key, value)
    return _Encoded(codec, tensors, json)


def list_storage_part(storage, items: list, ctx: PartContext) -> tuple[dict, dict]:
    """The part of a :class:`~torchrl.data.ListStorage` holding ``items``.

    Tensor leaves are saved as tensors (one per leaf, stacked over the items when they all share one structure);
    non-tensor entries (strings, numbers, None) are ``"json"`` leaves holding one value per item of the entry.
    """
    doc: dict[str, Any] = {"class": qualname(storage), "max_size": storage.max_size, "count": len(items)}
    if not items:
        return {}, {**doc, "layout": "empty"}
    encoded = [_encode_item(i, item) for i, item in enumerate(items)]
    first = encoded[0].signature()
    homogeneous = all(e.signature() == first for e in encoded)
    if homogeneous:
        stacked = torch.stack([e.td for e in encoded])
        json = {key: [e.json[key] for e in encoded] for key in encoded[0].json}
        groups = [(encoded[0].codec, stacked, json, "stacked")]
    else:
        groups = [
            (e.codec, e.td, {k: [v] for k, v in e.json.items()}, f"items/{i}") for i, e in enumerate(encoded)
        ]
    tensors, entries = {}, []
    for codec, td, json, sub in groups:
        keys = _leaf_keys(td)
        leaves: list[dict] = []
        for key, name in zip(keys, _io.leaf_names(keys)):
            tensors[ctx.name(f"storage/{sub}/{name}")] = td.get(key)
            leaves.append({"key": list(key), "tensor": ctx.name(f"storage/{sub}/{name}")})
        leaves.extend({"key": list(key), "kind": "json", "values": values} for key, values in json.items())
        entries.append({"codec": codec.to_json(), "batch_size": list(td.batch_size), "leaves": leaves})
    return tensors, {**doc, "layout": "stacked" if homogeneous else "items", "entries": entries}


def check_list_storage_part(storage, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
    """Raises if ``doc`` does not fit ``storage``; records ``ctx.facts["storage_rows"]`` (its ``max_size``)."""
    check_class(storage, doc, "storage")
    if doc.get("max_size") != storage.max_size:
        raise mismatch(
            "the storage max_size", doc.get("max_size"), storage.max_size, "Use the same max_size."
        )
    where = f"The ListStorage description in the checkpoint {ctx.path!r}"
    count = check_int_field(
        doc["count"], "count", where, 0, storage.max_size, fix="`count` is the number of items."
    )
    entries = doc.get("entries", [])
    stacked = doc.get("layout") == "stacked"
    held = sum(entry["batch_size"][0] for entry in entries) if stacked else len(entries)
    if held != count:
        raise CheckpointError(
            f"{where}: `count` is {count} but the entries hold {held} items. Save the storage again with `dumps`. "
            f"Nothing was loaded."
        )
    for entry in entries:
        DataCodec.from_json(entry["codec"])
        n = entry["batch_size"][0] if stacked else 1
        item_batch = entry["batch_size"][1:] if stacked else entry["batch_size"]
        for leaf in entry["leaves"]:
            if leaf.get("kind") == "json":
                _ragged.check_json_leaf(leaf, n, f"{where}, entry {leaf.get('key')!r}", [item_batch] * n)
            elif leaf.get("tensor") not in tensors:
                raise ValueError("The checkpoint's ListStorage entries refer to tensors it does not hold.")
    ctx.facts["storage_rows"] = storage.max_size
    ctx.facts["storage_items"] = max(ctx.facts.get("storage_items", 0), storage.max_size)


def list_storage_items(doc: dict, tensors: Mapping) -> list:
    """The items of a checked list storage part, read into RAM."""
    items = []
    for entry in doc.get("entries", []):
        td = TensorDict(batch_size=entry["batch_size"])
        json = []
        for leaf in entry["leaves"]:
            if leaf.get("kind") == "json":
                json.append((tuple(leaf["key"]), [_ragged.from_json_value(v) for v in leaf["values"]]))
            else:
                td.set(tuple(leaf["key"]), tensors[leaf["tensor"]].as_subclass(torch.Tensor).clone())
        codec = DataCodec.from_json(entry["codec"])
        tds = [td[i] for i in range(td.batch_size[0])] if doc["layout"] == "stacked" else [td]
        for i, item in enumerate(tds):
            for key, values in json:
                _ragged.set_json_leaf(item, key, values[i])
            items.append(codec.decode(item))
    return items
