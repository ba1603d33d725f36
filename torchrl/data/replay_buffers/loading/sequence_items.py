"""Batches of variable-length sequences as the packed-sequence components read them.

NOTE [sequence items]: an *item* is one sequence, a TensorDict with ``batch_size=[]``; its *token entries* (the
keys a :class:`~torchrl.data.PackedSequenceStorage` lays out per token) have shape ``[L, *feature]`` with ``L``
the item's length (the same for every token entry of the item); every other leaf is a *fixed* entry, one tensor of
the same shape in every item. A batch is a list or tuple of items, a lazy stack of items (stack dim 0), or a dense
TensorDict ``[n]`` whose token entries are ``[n, L, *feature]`` (all of length ``L``). The storage, the
:class:`~torchrl.data.GroupWriter` and the layouts of :mod:`torchrl.data.replay_buffers.loading.sequence_layouts` read
batches through :func:`as_items`.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase, is_leaf_nontensor, is_tensorclass

__all__ = ["as_items", "leaf_keys", "segment_ids"]


def segment_ids(lengths: torch.Tensor) -> torch.Tensor:
    """``torch.repeat_interleave(lengths)`` (segment ``i`` repeated ``lengths[i]`` times), computed as one
    ``index_add_`` and one ``cumsum``: ``repeat_interleave`` runs a parallel loop whose start costs milliseconds
    on a loaded CPU, on every read and write of these components."""
    total = int(lengths.sum())
    marks = torch.zeros(total + 1, dtype=torch.long)
    marks.index_add_(0, lengths.cumsum(0), torch.ones_like(lengths, dtype=torch.long))
    return marks[:total].cumsum(0)


def leaf_keys(td: TensorDictBase) -> list:
    """The leaf keys of ``td`` (nested keys as tuples), in insertion order; non-tensor entries are leaves."""
    return list(td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))


def as_items(data: Any, what: str) -> list[TensorDictBase]:
    """The items of the batch ``data`` (see NOTE [sequence items]) as a list of TensorDicts of batch size ``[]``.

    ``what`` names the caller in errors (e.g. ``"PackedSequenceStorage.extend_sequences"``). Raises ``TypeError``
    for anything else than the batches above, ``ValueError`` for items with batch dims.
    """
    if is_tensorclass(data):
        data = data.to_tensordict()
    if isinstance(data, LazyStackedTensorDict):
        if data.stack_dim != 0 or data.batch_dims != 1:
            raise ValueError(
                f"{what} takes a lazy stack of sequences along dim 0 with batch size [n]; got one with "
                f"stack_dim={data.stack_dim} and batch_size={list(data.batch_size)}. Build it with "
                f"lazy_stack(list_of_items) (items of batch size [])."
            )
        items = list(data.tensordicts)
    elif isinstance(data, TensorDictBase):
        if data.batch_dims == 0:
            raise ValueError(
                f"{what} takes a batch of sequences; got one TensorDict of batch size []. Pass [item] (a list) "
                f"or lazy_stack([item])."
            )
        if data.batch_dims != 1:
            raise ValueError(
                f"{what} takes a dense batch of batch size [n] (token entries [n, L, ...]); got batch_size="
                f"{list(data.batch_size)}. Reshape it to [n] or pass a list of items."
            )
        items = list(data.unbind(0))
    elif isinstance(data, (list, tuple)):
        items = list(data)
    else:
        raise TypeError(
            f"{what} takes a batch of sequences (a list of TensorDicts, a lazy stack of them, or a dense "
            f"TensorDict [n]); got a {type(data).__name__}."
        )
    for i, item in enumerate(items):
        if not isinstance(item, TensorDictBase) and is_tensorclass(item):
            item = items[i] = item.to_tensordict()
        if not isinstance(item, TensorDictBase):
            raise TypeError(
                f"{what}: item {i} of the batch is a {type(item).__name__}; each sequence is a TensorDict of "
                f"batch size [] (e.g. TensorDict(tokens=torch.tensor([...]), reward=torch.tensor(1.0)))."
            )
        if item.batch_dims != 0:
            raise ValueError(
                f"{what}: item {i} of the batch has batch_size {list(item.batch_size)}; each sequence is a "
                f"TensorDict of batch size [] whose token entries are [L, ...]. Nothing was written."
            )
    return items
