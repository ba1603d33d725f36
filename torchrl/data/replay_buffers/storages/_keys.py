"""Which entries a write into a TensorDict-backed tensor storage touches.

As in TorchRL, a write of TensorDicts updates only the entries it carries: a subset of the stored keys leaves
the other entries of the written rows as they were, and a new key becomes a new entry of the backing
(zero-filled in the rows not written), so ``TensorStorage(TensorDict(batch_size=[N]))`` over an empty
preallocated TensorDict takes the keys of its first write. A backing shared with other processes (shared
memory, memory-mapped files) cannot grow an entry that the other processes would see, so there, as in
TorchRL, keys the storage does not hold are dropped from the write. Tensors, tensorclasses and pytrees keep a
fixed structure: every write must carry all of it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, is_tensorclass

import torchrl.data.replay_buffers.storages._nontensor as _nt


def can_grow(backing: TensorDictBase, shared: bool) -> bool:
    """Whether ``backing`` may get new entries: not once shared between processes or memory-mapped."""
    return not (shared or backing.is_locked or backing.is_shared() or backing.is_memmap())


def partial_write(
    backing: TensorDictBase, stored: list, td: TensorDictBase, batch: torch.Size, shared: bool, ndim: int
):
    """Validates the keys of a write ``td`` of batch ``batch``: returns ``(td, stored keys it updates)``.

    ``td`` loses the new keys when the backing cannot grow; a new entry whose leading dims are not ``batch``
    (then the backing's dims past the first ``ndim``) raises ``ValueError`` (nothing is written).
    """
    given = list(td.keys(include_nested=True, leaves_only=True))
    known = set(stored)
    updated = [key for key in stored if key in set(given)]
    added = [key for key in given if key not in known] if can_grow(backing, shared) else []
    lead = torch.Size([*batch, *backing.batch_size[ndim:]])
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


def add_entries(backing: TensorDictBase, stored: list, td: TensorDictBase, lead: int, ndim: int):
    """Adds to ``backing`` zero-filled entries for the keys of ``td`` it lacks (shaped like ``td``'s past its
    first ``lead`` dims, the rows written); returns the keys of ``td`` and whether any entry was added."""
    keys = list(td.keys(include_nested=True, leaves_only=True))
    known = set(stored)
    added = [key for key in keys if key not in known]
    for key in added:
        src = td.get(key)
        shape = (*backing.batch_size[:ndim], *src.shape[lead:])
        backing.set(key, torch.zeros(shape, dtype=src.dtype, device=backing.device))
    return keys, bool(added)


def check_reserved(data) -> None:
    """Raises ``ValueError`` if ``data`` (a TensorDict, tensorclass or dict pytree) has a top-level entry named
    like the reserved key under which tensor storages keep their string entries (see :mod:`._nontensor`)."""
    reserved = _nt.STRINGS_KEY
    if isinstance(data, TensorDictBase):
        keys = data.keys()
    elif is_tensorclass(data):
        keys = data._tensordict.keys()
    elif isinstance(data, dict):
        keys = data.keys()
    else:
        return
    if reserved in keys:
        raise ValueError(
            f"The data written has an entry named {reserved!r}, a key tensor storages reserve for their string "
            f"entries. Rename that entry (e.g. data.rename_key_({reserved!r}, 'utf8')). Nothing was written."
        )
