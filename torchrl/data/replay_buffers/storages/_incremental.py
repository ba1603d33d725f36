"""Incremental checkpoints of tensor storages: which rows changed since a checkpoint, and the patch layout.

See NOTE [incremental dumps] in :mod:`torchrl.data.replay_buffers._checkpoint.format` for the file protocol. A
storage whose writes stamp :class:`~torchrl.data.replay_buffers._shared.row_versions.RowVersions` (every CPU
tensor storage but a ``compilable`` one: memory-mapped, shared or private RAM; NOTE [row versions of tensor
storages] in ``tensor_storage.py``) knows, for a write revision ``v`` taken before a dump, the rows
written since: those stamped at or after ``v | 1`` (a write in flight at ``v`` included). Its checkpoint's
metadata then holds ``checkpoint_ids = {"<prefix>storage": {"token": <this storage>, "version": v}}`` beside the
component, and the next dump onto that checkpoint, when the
storage remembers writing it (same process, same row versions, its files untouched since), saves:

- every file of the previous part, hard-linked: the *base* rows ``[0, base_rows)`` of each entry and the
  patches before;
- one new *patch* per range of rows written since (ranges closer than the gaps between them are merged), the
  rows ``[start, stop)`` of every entry in a file of their own.

Layout of a patched part (what :func:`~._checkpoint.copy_saved_rows` applies, in order): ``base_rows``,
``patches`` (a list of ``[start, stop]``) and, per leaf, ``base`` (the tensor of the base rows) and
``patches`` (one tensor name per patch) instead of ``tensor``, so that code reading only ``tensor`` refuses the
checkpoint instead of missing the patches. A full dump (the layout of earlier versions) is written instead when
the previous checkpoint is not this storage's, when the entries, the grid or the codec changed, when fewer rows
are saved than before, or once patches would hold more than :data:`MAX_PATCHED_FRACTION` of the rows or number
more than :data:`MAX_PATCHES`: loads then read no more than 1.25x the bytes of a full checkpoint.

What a storage remembers is process-local, keyed by its row versions object (never pickled): a copy of the
storage in another process, or a storage rebuilt by pickling with fresh row versions, dumps in full first. A
storage loaded from a checkpoint remembers that one, so that the next dump there (resuming a run) is incremental.

NOTE [edits through views]: row versions see the writes of the storage (``set``, a writer's ``extend``), not an
in-place edit of a tensor that aliases its rows: a view handed out by ``storage.get(slice)``, ``rb[a:b]``,
``get(int)``, ``get_entry`` or ``flatten`` (``rb[0:10]["obs"].add_(1)``), before or after a dump, held or not.
The storage marks the rows of every view it hands out as *exposed* (for good: a view may live on), per entry
for ``get_entry`` (the column reads of slice samplers and queries expose that column only). A dump computes a
digest (CRC32) of each block of :data:`BLOCK_ROWS` rows of an entry holding an exposed row and remembers them;
the next incremental dump re-saves every block whose digest changed or is unknown. Rows never handed out as
views cost nothing; an exposed block costs one read of its bytes per dump. Views taken in another
process sharing the storage are not seen: dump such a storage with ``TensorStorageCheckpointer(incremental=False)``.
"""

from __future__ import annotations

import os
import secrets
import weakref
import zlib
from typing import Any, NamedTuple

import numpy as np
import torch

from torchrl.data.replay_buffers._checkpoint.io import MEMMAP_SUFFIX, file_identity

#: at most this many patches in a checkpoint; one more gives a full dump
MAX_PATCHES = 64
#: at most this many patches added by one dump (closer ranges of written rows are merged)
MAX_NEW_PATCHES = 8
#: a full dump once the patches would hold more rows than this fraction of the saved rows
MAX_PATCHED_FRACTION = 0.25
_MAX_RECORDS = 8
#: the rows of one digest of exposed rows (NOTE [edits through views])
BLOCK_ROWS = 64


class _Record(NamedTuple):
    """A checkpoint this storage wrote or loaded: the ``checkpoint_id`` of its part on disk, the write revision
    of the storage its rows equal, the identity of each of the part's files (see ``file_identity``) and the
    names of those known to be on disk (written or linked by a dump with ``fsync=True``)."""

    checkpoint_id: dict
    version: int
    files: dict
    durable: frozenset
    digests: dict = {}  # (leaf, block) -> CRC32 of the exposed blocks as saved (NOTE [edits through views])


class _Lineage:
    def __init__(self):
        self.token = secrets.token_hex(8)
        self.records: dict[tuple[str, str], _Record] = {}

    def remember(self, key: tuple[str, str], record: _Record) -> None:
        self.records.pop(key, None)
        self.records[key] = record
        while len(self.records) > _MAX_RECORDS:
            self.records.pop(next(iter(self.records)))


_LINEAGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _lineage(versions) -> _Lineage:
    lineage = _LINEAGES.get(versions)
    if lineage is None:
        lineage = _LINEAGES[versions] = _Lineage()
    return lineage


def checkpoint_id(versions) -> dict:
    """The ``checkpoint_id`` of a dump starting now: this storage's token and its write revision. A storage
    without row versions gets a token of its own per dump (version 0), which loads can still remember."""
    if versions is None:
        return {"token": secrets.token_hex(8), "version": 0}
    return {"token": _lineage(versions).token, "version": versions.snapshot()}


class Plan(NamedTuple):
    """An incremental dump: the previous part, its files to link (name -> ``ReusedFile``), and the row ranges
    to write as new patches."""

    previous: dict
    reused: dict
    ranges: list


def _find_part(node, base_names: list[str]):
    """The tensor storage part in the JSON tree ``node`` whose leaves' base tensors are ``base_names``."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            leaves = item.get("leaves")
            if isinstance(leaves, list) and len(leaves) == len(base_names) and all(isinstance(v, dict) for v in leaves):
                if [leaf.get("base", leaf.get("tensor")) for leaf in leaves] == base_names:
                    return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def part_tensors(doc: dict) -> list[str]:
    """The tensor names of a tensor storage part: every leaf's base (or whole) tensor, then its patches."""
    names = []
    for leaf in doc.get("leaves") or ():
        if not isinstance(leaf, dict):
            return []
        names.append(leaf.get("base", leaf.get("tensor")))
        names.extend(leaf.get("patches") or ())
    return names


def _signature(doc: dict) -> tuple:
    leaves = [(leaf.get("key"), leaf.get("shape"), leaf.get("dtype")) for leaf in doc.get("leaves") or ()]
    return doc.get("class"), doc.get("batch_size"), doc.get("codec"), leaves


def _ranges(mask: np.ndarray, limit: int) -> list[list[int]]:
    """The runs of ``True`` in ``mask`` as ``[start, stop]``, the closest merged until at most ``limit`` remain."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    starts, stops = edges[0::2], edges[1::2]
    if starts.size > limit:
        gaps = starts[1:] - stops[:-1]
        keep = np.sort(np.argsort(gaps, kind="stable")[starts.size - limit :])  # the widest gaps stay gaps
        starts = np.concatenate(([starts[0]], starts[keep + 1]))
        stops = np.concatenate((stops[keep], [stops[-1]]))
    return [[int(a), int(b)] for a, b in zip(starts, stops)]


def block_digests(backing, keys, rows: int, exposed: dict | None) -> dict[tuple, int]:
    """``{(leaf position, block): CRC32}`` of every block of :data:`BLOCK_ROWS` rows among the first ``rows`` of
    each leaf ``keys`` of ``backing`` (CPU tensors) holding a row ``exposed`` in it: ``exposed`` maps a leaf key,
    or ``None`` for every leaf, to a mask of the rows handed out as views (NOTE [edits through views])."""
    if not exposed:
        return {}
    starts = np.arange(0, rows, BLOCK_ROWS)
    digests = {}
    for position, key in enumerate(keys):
        hit = None
        for mask in (exposed.get(None), exposed.get(key)):
            if mask is not None:
                hit = mask[:rows] if hit is None else hit | mask[:rows]
        if hit is None or not rows or not hit.any():
            continue
        leaf = backing.get(key)
        for block in np.flatnonzero(np.add.reduceat(hit, starts)).tolist():
            start, stop = block * BLOCK_ROWS, min(rows, (block + 1) * BLOCK_ROWS)
            data = leaf[start:stop].contiguous().view(-1).view(torch.uint8).numpy()
            digests[(position, block)] = zlib.crc32(data)
    return digests


def plan(versions, doc: dict, ctx, digests: dict | None = None) -> Plan | None:
    """What an incremental dump of the part ``doc`` (a full tensor storage part being built) may reuse, or
    ``None`` for a full dump. ``digests``: :func:`block_digests` of the rows now; a block whose digest differs
    from the one remembered is written again (NOTE [edits through views])."""
    previous = ctx.facts.get("previous")
    lineage = _LINEAGES.get(versions)
    if previous is None or lineage is None:
        return None
    record = lineage.records.get((ctx.path, ctx.prefix))
    ids = previous.metadata.get("checkpoint_ids")
    if record is None or not isinstance(ids, dict) or ids.get(ctx.name("storage")) != record.checkpoint_id:
        return None
    old = _find_part(previous.metadata.get("component"), [leaf["tensor"] for leaf in doc["leaves"]])
    if old is None or _signature(old) != _signature(doc):
        return None
    saved_rows, old_rows = doc["saved_rows"], old.get("saved_rows")
    if not isinstance(old_rows, int) or not 0 < old_rows <= saved_rows:
        return None
    reused = {}
    for name in part_tensors(old):
        file = previous.reuse(name) if name in previous.entries else None
        if file is None or file_identity(file.source) != record.files.get(name):
            return None  # not the file this storage wrote (replaced, edited, or of a live storage)
        reused[name] = file._replace(durable=name in record.durable)
    dirty = versions.torn(record.version, np.arange(saved_rows))
    mask = np.zeros(saved_rows, dtype=bool) if dirty is None else np.asarray(dirty, dtype=bool)
    mask[old_rows:] = True  # rows the previous checkpoint did not hold
    for (position, block), crc in (digests or {}).items():  # edited through a view, or not known as saved
        if record.digests.get((position, block)) != crc:
            mask[block * BLOCK_ROWS : (block + 1) * BLOCK_ROWS] = True
    ranges = _ranges(mask, MAX_NEW_PATCHES) if mask.any() else []
    patches = (old.get("patches") or []) + ranges
    patched_rows = sum(stop - start for start, stop in patches)
    if len(patches) > MAX_PATCHES or patched_rows > MAX_PATCHED_FRACTION * saved_rows:
        return None
    return Plan(old, reused, ranges)


def patch_name(prefix: str, version: int, index: int, leaf: int) -> str:
    """The tensor of patch ``index`` of the dump at ``version`` for the ``leaf``-th leaf: every patch file in one
    directory (a durable dump fsyncs every directory of the checkpoint)."""
    return f"{prefix}_patches/{version}-{index}-{leaf}"


def file_of(path: str, name: str) -> str:
    return os.path.join(path, *(name + MEMMAP_SUFFIX).split("/"))


def set_checkpoint_id(ctx, ident: dict) -> None:
    """Records ``ident`` as the ``checkpoint_id`` of the storage part at ``ctx`` (the checkpoint's metadata holds
    them under ``"checkpoint_ids"``, by ``<prefix>storage``: not in the part, which stays the same document
    whoever writes the same content)."""
    ctx.facts.setdefault("checkpoint_ids", {})[ctx.name("storage")] = ident


def remember_after_write(versions, ctx, doc: dict, ident: dict, reused: dict, digests: dict | None = None) -> None:
    """Once the checkpoint holding ``doc`` is in place, remembers it (for the next dump at ``ctx.path``);
    ``reused`` are the files linked from the previous checkpoint (name -> ``ReusedFile``), ``digests`` those of
    its exposed blocks (NOTE [edits through views])."""
    lineage, key = _lineage(versions), (ctx.path, ctx.prefix)
    lineage.records.pop(key, None)  # the checkpoint there is being replaced
    names = part_tensors(doc)
    if ctx.facts.get("fsync"):
        durable = frozenset(names)
    else:
        durable = frozenset(name for name, file in reused.items() if file.durable)

    def remember() -> None:
        files = {name: file_identity(file_of(ctx.path, name)) for name in names}
        if None not in files.values():
            lineage.remember(key, _Record(ident, ident["version"], files, durable, dict(digests or {})))

    ctx.facts.setdefault("after_write", []).append(remember)


def remember_loaded(versions, doc: dict | None, tensors, ctx, version: int) -> None:
    """After ``doc`` was loaded, remembers its checkpoint as equal to the storage's rows at ``version``
    (``None``: nothing to remember); forgets every other checkpoint."""
    lineage = _lineage(versions)
    lineage.records.clear()
    ids = ctx.facts.get("checkpoint_ids")
    wanted = ids.get(ctx.name("storage")) if doc is not None and isinstance(ids, dict) else None
    if not isinstance(wanted, dict):
        return
    files: dict[str, Any] = {}
    for name in part_tensors(doc):
        source = getattr(tensors.get(name), "filename", None)
        files[name] = None if source is None else file_identity(source)
    if None not in files.values():
        lineage.remember((ctx.path, ctx.prefix), _Record(wanted, version, files, frozenset()))

