"""Batches of variable-length sequences as the packed-sequence components read them, and a validated write of them.

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

__all__ = [
    "SequenceBatch",
    "as_items",
    "check_token_keys",
    "encode_sequences",
    "key_tuple",
    "leaf_keys",
    "segment_ids",
    "shown_key",
]


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


def key_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def check_token_keys(token_keys) -> tuple:
    """The per-token keys as tuples: a str is one key, any other iterable lists keys (a nested key is a tuple)."""
    if isinstance(token_keys, str):
        token_keys = (token_keys,)
    if not isinstance(token_keys, (tuple, list)):
        raise TypeError(
            f"`token_keys` is a tuple of the keys of the per-token entries; got {type(token_keys).__name__}. "
            f"Pass e.g. token_keys=('tokens', 'log_probs')."
        )
    keys = []
    for key in list(token_keys):
        if not (isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key))):
            raise TypeError(
                f"`token_keys` holds the keys of the per-token entries (str or tuples of str); got {key!r} in "
                f"{token_keys!r}. Pass e.g. token_keys=('tokens', 'log_probs')."
            )
        keys.append(key_tuple(key))
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(
            f"`token_keys` must name at least one per-token entry, each once; got {token_keys!r}. Pass e.g. "
            f"token_keys=('tokens',)."
        )
    return tuple(keys)


def shown_key(key: tuple):
    return key[0] if len(key) == 1 else key


class SequenceBatch:
    """A validated write: ``lengths`` [n] (and their Python ``total``), ``tokens`` {key: [T, *feature]},
    ``fixed`` {key tuple: [n, *shape]}."""

    __slots__ = ("lengths", "total", "tokens", "fixed")

    def __init__(self, lengths: list, tokens: dict, fixed: dict):
        self.lengths, self.total = torch.tensor(lengths, dtype=torch.long), sum(lengths)
        self.tokens, self.fixed = tokens, fixed


def encode_sequences(items: list, token_keys: tuple, max_tokens: int, device, what: str) -> SequenceBatch:
    """The validated write of ``items`` (NOTE [sequence items]): each token entry concatenated over the items,
    each fixed entry stacked, on ``device``. Raises, naming ``what`` and the sequence, before anything is
    written: a missing token entry, entries that differ between items, token entries of different lengths, a
    length outside ``[1, max_tokens]``, non-tensor or ragged fixed entries."""
    first = leaf_keys(items[0])
    token_keys = token_keys
    # each item as {leaf key: value}: one items() read per item when every entry is a top-level tensor
    flat = all(len(k) == 1 for k in token_keys) and all(isinstance(k, str) for k in first)
    flat = flat and all(isinstance(v, torch.Tensor) for v in items[0].values())
    if flat:
        rows = [dict(item.items()) for item in items]
        names = {key: key[0] for key in (*token_keys, *map(key_tuple, first))}  # tuple key -> the row's str key
    else:
        rows = [{key_tuple(k): item.get(k) for k in leaf_keys(item)} for item in items]
        names = {key: key for key in (*token_keys, *map(key_tuple, first))}
    expected = {names[key_tuple(k)] for k in first}
    fixed_keys = [k for k in map(key_tuple, first) if k not in token_keys]
    shown_tokens = [shown_key(k) for k in token_keys]
    lengths = []
    for i, row in enumerate(rows):
        keys = row.keys()
        if i == 0 or keys != expected:
            missing = [shown_key(k) for k in token_keys if names[k] not in keys]
            if missing:
                raise KeyError(
                    f"{what}: sequence {i} of the write has no token entry {missing[0]!r} (token_keys="
                    f"{shown_tokens}); each sequence holds every token entry. Nothing was written."
                )
        if keys != expected:
            raise ValueError(
                f"{what}: sequence {i} of the write has the entries {sorted(map(str, keys))}, sequence 0 "
                f"{sorted(map(str, expected))}; every sequence holds the same entries. Nothing was written."
            )
        length = None
        for key in token_keys:
            value = row[names[key]]
            if not isinstance(value, torch.Tensor) or value.ndim == 0:
                raise ValueError(
                    f"{what}: the token entry {shown_key(key)!r} of sequence {i} must be a tensor [L, ...] with "
                    f"one value per token; got {type(value).__name__} of shape "
                    f"{list(getattr(value, 'shape', []))}. Nothing was written."
                )
            if length is None:
                length = value.shape[0]
            elif value.shape[0] != length:
                raise ValueError(
                    f"{what}: the token entries of sequence {i} have different lengths ({length} and "
                    f"{value.shape[0]} for {shown_key(key)!r}); each per-token entry has one value per token. "
                    f"Nothing was written."
                )
        if not 1 <= length <= max_tokens:
            raise ValueError(
                f"{what}: sequence {i} has {length} tokens; a sequence holds 1 to max_tokens="
                f"{max_tokens} tokens. Build the storage with a larger max_tokens. Nothing was written."
            )
        lengths.append(length)
    tokens = {}
    for key in token_keys:
        name = names[key]
        try:
            tokens[key] = torch.cat([row[name] for row in rows]).to(device)
        except RuntimeError as err:
            raise ValueError(
                f"{what}: the token entry {shown_key(key)!r} has different feature shapes or dtypes across the "
                f"sequences of the write ({err}). Nothing was written."
            ) from None
    fixed = {}
    for key in fixed_keys:
        name = names[key]
        values = [row[name] for row in rows]
        if not all(isinstance(v, torch.Tensor) for v in values):
            raise TypeError(
                f"{what}: the fixed entry {shown_key(key)!r} holds a non-tensor value; a "
                f"PackedSequenceStorage stores tensors (encode strings as ids). Nothing was written."
            )
        try:
            fixed[key] = torch.stack(values).to(device)
        except RuntimeError:
            raise ValueError(
                f"{what}: the fixed entry {shown_key(key)!r} has different shapes across the sequences "
                f"of the write ({sorted({tuple(v.shape) for v in values})}); an entry that is not in "
                f"token_keys={shown_tokens} holds one value of one shape per sequence. Add "
                f"it to token_keys if it has one value per token. Nothing was written."
            ) from None
    return SequenceBatch(lengths, tokens, fixed)
