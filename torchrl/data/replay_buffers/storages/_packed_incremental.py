"""Incremental checkpoints of a :class:`~torchrl.data.PackedSequenceStorage`: the rows appended since its last dump.

NOTE [packed incremental dumps]: the arena and the fixed entries of a packed storage are rings written only by
appends (NOTE [packed ring] in ``packed_sequence.py``): between two dumps, the writes covered the absolute token
positions ``[cursor_then, cursor_now)`` and the sequence numbers ``[count_then, count_now)``, whichever process
made them (the counters are shared). A dump onto the checkpoint this storage wrote last at the same path (same
process; its files untouched since; no ``empty()`` or load in between: the storage's reset count) therefore
hard-links every tensor file of that checkpoint's part (NOTE [incremental dumps] in ``_checkpoint/format.py``)
and writes, as new *patches*, only those arena rows and fixed-entry rows (at most two ranges each: a range that
passes the ring's end is split). The slot table and the counters, a few bytes per sequence, are written whole.

Layout of a patched part: the part's document holds ``"base": {"tokens": R, "fixed": S}`` (the rows of the
``tokens/<i>`` and ``fixed/<i>`` tensors, those of the first, full dump of the chain) and ``"patches"``, a list
of ``{"part": "tokens" | "fixed", "rows": [start, stop], "tensors": [name per entry]}`` applied in order after the
base (a later patch may overwrite an earlier one's rows after a wrap). A full dump is written instead when the
writes since wrapped a ring whole, when the layout changed, or once the patches would hold more than
``MAX_PATCHED_FRACTION`` of the saved rows or number more than ``MAX_PATCHES``: loads read at most 1.25x the
bytes of a full checkpoint. What a storage remembers of its dumps lives in the process that dumped (never
pickled); a loaded storage dumps in full first.
"""

from __future__ import annotations

import os
import secrets

from torchrl.data.replay_buffers._checkpoint.io import file_identity
from torchrl.data.replay_buffers.storages._incremental import (
    MAX_PATCHED_FRACTION,
    MAX_PATCHES,
    file_of,
    set_checkpoint_id,
)

__all__ = ["ring_ranges", "part_tensor_names", "plan", "remember_after_write", "covered", "new_ident"]


def ring_ranges(first: int, stop: int, size: int) -> list[list[int]]:
    """The rows of a ring of ``size`` rows that the absolute positions ``[first, stop)`` fall on, as at most two
    ``[start, stop]`` ranges (all of them when the span covers the ring)."""
    if stop <= first:
        return []
    if stop - first >= size:
        return [[0, size]]
    a, b = first % size, stop % size
    if a < b:
        return [[a, b]]
    return [[a, size]] if b == 0 else [[a, size], [0, b]]


def part_tensor_names(doc: dict, base_names: list[str]) -> list[str]:
    """Every tensor of a packed part: the base tensors ``base_names``, then the patches' tensors."""
    names = list(base_names)
    for patch in doc.get("patches") or ():
        names.extend(patch["tensors"])
    return names


def covered(base_rows: int, patches: list, rows: int) -> bool:
    """Whether the rows ``[0, rows)`` are all in ``[0, base_rows)`` or in one of ``patches`` (``[start, stop]``)."""
    reach = base_rows
    for start, stop in sorted(patches):
        if start > reach:
            return False
        reach = max(reach, stop)
    return reach >= rows


def new_ident() -> dict:
    """The ``checkpoint_id`` of one dump of a packed storage (what its record names)."""
    return {"token": secrets.token_hex(8), "version": 0}


def plan(record: dict | None, ctx, state: dict, base_names: list[str]) -> dict | None:
    """What a dump of a packed storage in ``state`` (``{"cursor", "count", "resets", "layout", "token_rows",
    "slot_rows", "max_tokens", "max_sequences"}``) may reuse from the checkpoint it replaces, or ``None`` for a
    full dump: ``{"reused": {name: ReusedFile}, "patches": old patches, "base": old base rows, "ranges":
    {"tokens": [...], "fixed": [...]}}``. ``record`` is what the storage remembers of its last dump at ``ctx``."""
    previous = ctx.facts.get("previous")
    if record is None or previous is None:
        return None
    ids = previous.metadata.get("checkpoint_ids")
    if not isinstance(ids, dict) or ids.get(ctx.name("storage")) != record["ident"]:
        return None
    if record["resets"] != state["resets"] or record["layout"] != state["layout"]:
        return None
    spans = {"tokens": (record["cursor"], state["cursor"], state["max_tokens"]),
             "fixed": (record["count"], state["count"], state["max_sequences"])}  # fmt: skip
    ranges = {}
    for part, (then, now, size) in spans.items():
        if now < then or now - then >= size:
            return None
        ranges[part] = ring_ranges(then, now, size)
    old = record["doc"]
    patches = list(old.get("patches") or [])
    base = dict(old.get("base") or {"tokens": record["token_rows"], "fixed": record["slot_rows"]})
    for part, rows in (("tokens", state["token_rows"]), ("fixed", state["slot_rows"])):
        patched = sum(b - a for p in patches if p["part"] == part for a, b in [p["rows"]])
        patched += sum(b - a for a, b in ranges[part])
        if patched > MAX_PATCHED_FRACTION * rows:
            return None
    if len(patches) + len(ranges["tokens"]) + len(ranges["fixed"]) > MAX_PATCHES:
        return None
    reused = {}
    for name in part_tensor_names(old, base_names):
        file = previous.reuse(name) if name in previous.entries else None
        if file is None or file_identity(file.source) != record["files"].get(name):
            return None  # not the file this storage wrote (replaced or edited since)
        reused[name] = file._replace(durable=name in record["durable"])
    return {"reused": reused, "patches": patches, "base": base, "ranges": ranges}


def remember_after_write(records: dict, ctx, record: dict, names: list[str], reused: dict) -> None:
    """Once the checkpoint is in place, stores ``record`` (with the identity of its files ``names``) in
    ``records`` under ``(ctx.path, ctx.prefix)``; forgets the record there now (the checkpoint is being
    replaced). Also names the dump in the checkpoint's ``checkpoint_ids``."""
    key = (ctx.path, ctx.prefix)
    records.pop(key, None)
    set_checkpoint_id(ctx, record["ident"])
    if ctx.facts.get("fsync"):
        durable = frozenset(names)
    else:
        durable = frozenset(name for name, file in reused.items() if file.durable)

    def remember() -> None:
        files = {name: file_identity(file_of(ctx.path, name)) for name in names}
        if None not in files.values() and os.path.isdir(ctx.path):
            records[key] = {**record, "files": files, "durable": durable}

    ctx.facts.setdefault("after_write", []).append(remember)
