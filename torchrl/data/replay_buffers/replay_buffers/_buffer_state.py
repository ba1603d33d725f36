"""A replay buffer's in-memory state: its ``state_dict()`` and what pickling keeps of it.

``state_dict()``: ``{"_prefetch_state", "_storage", "_sampler", "_writer", "_transforms", "_batch_size", "_rng",
"_readiness"}``, the children's own state dicts plus the buffer's fields (TorchRL's keys; ``"_prefetch_state"``
holds the batches sampled ahead, see ``_prefetch.py``). Pickling keeps the buffer's ``__dict__`` less its runtime
state (locks, thread pool, prefetch queue: rebuilt empty by the copy), with the generator state as ``bytes``
(never a tensor: NOTE in design.md, "Sharing with worker processes") and the prefetched batches, except in a
process being started or a dataset's copy. The buffer's methods hold its locks and call these functions with
what they read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

import torchrl.data.replay_buffers.replay_buffers._prefetch as _prefetch
import torchrl.data.replay_buffers.replay_buffers._readiness as _readiness
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers._shared.counters import is_spawning


def buffer_state_dict(prefetched, children: Mapping, *, batch_size, rng: torch.Generator | None, flow) -> dict:
    """The state dict of a buffer whose ``children`` are ``{"storage", "sampler", "writer", "transforms"}``
    (``prefetched``: its captured prefetch queue; ``flow``: its readiness counters)."""
    return {
        "_prefetch_state": prefetched,
        "_storage": children["storage"].state_dict(),
        "_sampler": children["sampler"].state_dict(),
        "_writer": children["writer"].state_dict(),
        "_transforms": children["transforms"].state_dict(),
        "_batch_size": batch_size,
        "_rng": generator_to_state(rng),
        "_readiness": flow.state_dict(),
    }


def check_state_dict(state_dict: Mapping, sampler, prefetch: int) -> tuple[list, dict | None]:
    """``(prefetched batches, readiness counters)`` of ``state_dict``, checked before anything is loaded: the
    saved queue against the ``prefetch`` capacity, the counters, and the sampler's state when ``sampler`` can
    validate one (a third-party sampler may not)."""
    prefetched = _prefetch.restore(state_dict.get("_prefetch_state"), prefetch)
    readiness = state_dict.get("_readiness")
    if readiness is not None:
        _readiness.check_counter_state(readiness, "state_dict['_readiness']")
    validate = getattr(sampler, "validate_state_dict", None)
    if validate is not None:  # a crafted sampler state is refused before the storage changes
        validate(state_dict["_sampler"])
    return prefetched, readiness


def load_children_state(state_dict: Mapping, children: Mapping) -> None:
    """Loads the children's state dicts, storage first (under the buffer's locks)."""
    children["storage"].load_state_dict(state_dict["_storage"])
    children["sampler"].load_state_dict(state_dict["_sampler"])
    children["writer"].load_state_dict(state_dict["_writer"])
    children["transforms"].load_state_dict(state_dict["_transforms"])


def keeps_prefetched() -> bool:
    """Whether a pickle made now keeps the prefetched batches: not for a process being started (DataLoader
    workers) nor for a dataset's copy."""
    return not is_spawning() and not _prefetch.leaving_queue_out()


def pickled_state(fields: Mapping, runtime: Iterable[str], *, rng: torch.Generator | None, prefetched) -> dict:
    """What a buffer pickles: its ``fields`` (``__dict__``) less the ``runtime`` ones, the generator state as
    ``bytes`` and, when given, the prefetched batches."""
    state = dict(fields)
    for name in runtime:
        state.pop(name, None)
    state["_rng"] = generator_to_state(rng, as_bytes=True)
    if prefetched is not None:
        state["_prefetch_state"] = prefetched
    return state


def unpickled_extras(state: dict) -> tuple[torch.Generator | None, Any]:
    """``(generator, prefetched state)`` popped from a pickled ``state`` (see :func:`pickled_state`)."""
    return generator_from_state(state.pop("_rng", None)), state.pop("_prefetch_state", None)
