"""A replay buffer's checkpoint part (the protocol of ``_checkpoint/parts.py``): its document, its checks, and
the load of its children.

The part: ``{"class": ..., "batch_size": int | null, "rng": null | {"device": str, "state": "<prefix>rng/state"},
"parts": {"storage": <wrapped part>, "sampler": ..., "writer": ..., "transforms": ...}, "readiness": {...},
"prefetch": ...}`` (``"prefetch"`` only when batches were sampled ahead; see ``_prefetch.py``). The storage's
tensors sit under the buffer's own prefix (``storage/...``), the other children's under ``sampler/``,
``writer/`` and ``transforms/``. Every part is checked, storage first, before any is loaded; the small parts
(sampler, writer, transforms) are loaded before the storage and put back if a later load raises.

Each function takes the buffer's children (``{role: component}``) and fields as arguments; the buffer's
``checkpoint_part``, ``check_checkpoint_part`` and ``load_checkpoint_part`` hold its locks and call them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch

import torchrl.data.replay_buffers.replay_buffers._prefetch as _prefetch
import torchrl.data.replay_buffers.replay_buffers._readiness as _readiness
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers._checkpoint.parts import (
    PartContext,
    check_class,
    check_part,
    dump_part,
    load_part,
    qualname,
)
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.errors import CheckpointError

# the children of a buffer's checkpoint part, in the order they are saved
CHECKPOINT_ROLES = ("storage", "sampler", "writer", "transforms")
# the small children, loaded before the storage and put back if a later load raises
SMALL_CHILDREN = ("sampler", "writer", "transforms")


def child_ctx(ctx: PartContext, role: str) -> PartContext:
    """The part context of a buffer's child: the storage's tensors sit under the buffer's own prefix."""
    return ctx if role == "storage" else ctx.sub(role)


def dump_buffer_part(
    buffer, children: Mapping, ctx: PartContext, *, batch_size, rng: torch.Generator | None, flow, prefetched
) -> tuple[dict, dict]:
    """``(tensors, doc)`` of ``buffer``'s part: its ``children`` dumped in order, then its own fields
    (``flow``: its readiness counters; ``prefetched``: its captured prefetch queue, see ``_prefetch.capture``)."""
    prefetch_tensors, prefetch = _prefetch.to_part(prefetched, ctx)
    tensors, parts = {}, {}
    for role in CHECKPOINT_ROLES:
        child_tensors, parts[role] = dump_part(children[role], child_ctx(ctx, role))
        tensors.update(child_tensors)
    rng = generator_to_state(rng)
    if rng is not None:
        tensors[ctx.name("rng/state")] = rng["state"]
        rng = {"device": rng["device"], "state": ctx.name("rng/state")}
    doc = {"class": qualname(buffer), "batch_size": batch_size, "rng": rng, "parts": parts,
           "readiness": flow.state_dict()}  # fmt: skip
    if prefetch is not None:
        tensors.update(prefetch_tensors)
        doc["prefetch"] = prefetch
    return tensors, doc


def check_buffer_part(buffer, children: Mapping, doc: dict, tensors, ctx: PartContext, *, prefetch: int) -> None:
    """Checks a part of ``buffer`` (of ``prefetch`` capacity) and its children's, loading nothing."""
    check_class(buffer, doc, "replay buffer")
    if set(doc["parts"]) != set(CHECKPOINT_ROLES):
        raise ValueError(
            f"The checkpoint's buffer parts are {sorted(doc['parts'])}, expected {list(CHECKPOINT_ROLES)}."
        )
    for role in CHECKPOINT_ROLES:
        check_part(children[role], doc["parts"][role], tensors, child_ctx(ctx, role))
    where = f"The {type(buffer).__name__} description in the checkpoint {ctx.path!r}"
    if doc["batch_size"] is not None:
        check_int_field(doc["batch_size"], "batch_size", where, 1, fix="It is a positive JSON integer, or null.")
    saved_generator(doc, tensors, where)
    _prefetch.check_part(doc.get("prefetch"), tensors, prefetch, ctx.path)
    try:
        _readiness.check_counter_state(doc.get("readiness", {}), f"{where}: `readiness`")
    except ValueError as err:
        raise CheckpointError(f"{err} Nothing was loaded.") from None


def load_children(children: Mapping, doc: dict, tensors, ctx: PartContext) -> None:
    """Loads the children's parts, the small ones first; puts the small ones back if a later load raises."""
    before = {role: copy.deepcopy(children[role].state_dict()) for role in SMALL_CHILDREN}
    try:
        for role in (*SMALL_CHILDREN, "storage"):
            load_part(children[role], doc["parts"][role], tensors, child_ctx(ctx, role))
    except BaseException:
        for role in SMALL_CHILDREN:
            children[role].load_state_dict(before[role])
        raise


def saved_generator(doc: dict, tensors: Mapping, where: str) -> torch.Generator | None:
    """The generator saved in a buffer part (``None`` if none was); ``CheckpointError`` if it is malformed."""
    rng = doc["rng"]
    if rng is None:
        return None
    if not isinstance(rng, dict) or rng.get("state") not in tensors:
        raise CheckpointError(
            f"{where}: `rng` is {rng!r:.200}, expected null or {{'device': ..., 'state': <name of a tensor of "
            f"the checkpoint>}}. Save the buffer again with `dumps`. Nothing was loaded."
        )
    try:
        return generator_from_state({"device": rng.get("device"), "state": tensors[rng["state"]]})
    except ValueError as err:
        raise CheckpointError(f"{where}: `rng`: {err} Save the buffer again with `dumps`. Nothing was loaded.") from None
