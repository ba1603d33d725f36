"""The checkpoint part of a replay buffer: its children's parts, its batch size and its generator state.

:class:`~torchrl.data.ReplayBuffer` implements the part protocol of
:mod:`torchrl.data.replay_buffers._checkpoint.parts` by handing its children (``{"storage": ..., "sampler": ...,
"writer": ..., "transforms": ...}``), batch size and generator to these functions. The part::

    {"class": ..., "batch_size": int | null, "rng": null | {"device": str, "state": "<prefix>rng/state"},
     "parts": {"storage": <wrapped part>, "sampler": ..., "writer": ..., "transforms": ...}}

The storage's tensors sit under the buffer's own prefix (``storage/...``), the other children's under
``sampler/``, ``writer/`` and ``transforms/``. Every part is checked, storage first, before any is loaded; the
small parts (sampler, writer, transforms) are loaded before the storage and put back if a later load raises.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

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

ROLES = ("storage", "sampler", "writer", "transforms")
_SMALL = ("sampler", "writer", "transforms")


def _child_ctx(ctx: PartContext, role: str) -> PartContext:
    return ctx if role == "storage" else ctx.sub(role)


def buffer_part(
    rb, children: Mapping[str, Any], batch_size: int | None, generator: torch.Generator | None, ctx: PartContext
) -> tuple[dict, dict]:
    tensors, parts = {}, {}
    for role in ROLES:
        child_tensors, parts[role] = dump_part(children[role], _child_ctx(ctx, role))
        tensors.update(child_tensors)
    rng = generator_to_state(generator)
    if rng is not None:
        tensors[ctx.name("rng/state")] = rng["state"]
        rng = {"device": rng["device"], "state": ctx.name("rng/state")}
    return tensors, {"class": qualname(rb), "batch_size": batch_size, "rng": rng, "parts": parts}


def check_buffer_part(rb, children: Mapping[str, Any], doc: dict, tensors: Mapping, ctx: PartContext) -> None:
    check_class(rb, doc, "replay buffer")
    if set(doc["parts"]) != set(ROLES):
        raise ValueError(f"The checkpoint's buffer parts are {sorted(doc['parts'])}, expected {list(ROLES)}.")
    for role in ROLES:
        check_part(children[role], doc["parts"][role], tensors, _child_ctx(ctx, role))
    where = f"The {type(rb).__name__} description in the checkpoint {ctx.path!r}"
    if doc["batch_size"] is not None:
        check_int_field(doc["batch_size"], "batch_size", where, 1, fix="It is a positive JSON integer, or null.")
    saved_generator(doc, tensors, where)


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


def load_buffer_part(
    children: Mapping[str, Any], doc: dict, tensors: Mapping, ctx: PartContext
) -> tuple[int | None, torch.Generator | None]:
    """Loads the children's parts; returns the saved batch size and a new generator in the saved state."""
    before = {role: copy.deepcopy(children[role].state_dict()) for role in _SMALL}
    try:
        for role in (*_SMALL, "storage"):
            load_part(children[role], doc["parts"][role], tensors, _child_ctx(ctx, role))
    except BaseException:
        for role in _SMALL:
            children[role].load_state_dict(before[role])
        raise
    return doc["batch_size"], saved_generator(doc, tensors, ctx.path)
