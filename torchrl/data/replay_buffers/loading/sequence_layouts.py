"""Batches of variable-length sequences laid out for a model: padded (:func:`pad_sequences`) or packed
(:func:`pack_sequences`, the variable-length attention layout).

Both take a batch of sequences (NOTE [sequence items] in :mod:`torchrl.data.replay_buffers.loading.sequence_items`):
what a :class:`~torchrl.data.PackedSequenceStorage` returns, a lazy stack or a list of TensorDicts of batch size
``[]``. Use them as a buffer's ``collate_fn``, e.g.
``ReplayBuffer(..., collate_fn=functools.partial(pad_sequences, keys=("tokens", "log_probs"), side="left"))``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from torchrl.data.replay_buffers.loading.sequence_items import as_items, leaf_keys, segment_ids

__all__ = ["pad_sequences", "pack_sequences"]


def _key(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _split_keys(items: list, keys, what: str) -> tuple[list, list]:
    """``(per-token keys, fixed keys)`` of ``items``; ``keys=None``: the entries whose first dim differs."""
    all_keys = [_key(k) for k in leaf_keys(items[0])]
    if keys is None:
        ragged = []
        for key in all_keys:
            sizes = {tuple(item.get(key).shape[:1]) for item in items}
            if len(sizes) > 1 and all(len(s) == 1 for s in sizes):
                ragged.append(key)
        if not ragged:
            raise ValueError(
                f"{what}: keys=None picks the entries whose length differs between sequences, and none does in "
                f"this batch (one sequence, or sequences of equal lengths). Pass keys=('tokens', ...) to name the "
                f"per-token entries."
            )
        token_keys = ragged
    else:
        token_keys = [_key(k) for k in ([keys] if isinstance(keys, str) else keys)]
        missing = [k for k in token_keys if k not in all_keys]
        if not token_keys or missing:
            raise KeyError(
                f"{what}: `keys` names the per-token entries of the sequences; {missing or token_keys} not among "
                f"the entries {all_keys}."
            )
    fixed = [k for k in all_keys if k not in token_keys]
    return token_keys, fixed


def _lengths(items: list, token_keys: list, what: str) -> torch.Tensor:
    lengths = torch.tensor([item.get(token_keys[0]).shape[0] for item in items], dtype=torch.long)
    for key in token_keys[1:]:
        other = torch.tensor([item.get(key).shape[0] for item in items], dtype=torch.long)
        if not torch.equal(other, lengths):
            raise ValueError(
                f"{what}: the per-token entries {token_keys[0]} and {key} have different lengths in some sequence; "
                f"each per-token entry has one value per token."
            )
    return lengths


def _fixed(items: list, fixed_keys: list, n: int) -> TensorDict:
    out = TensorDict(batch_size=[n])
    for key in fixed_keys:
        out.set(key, torch.stack([item.get(key) for item in items]))
    return out


def pad_sequences(
    td, keys=None, *, side: str = "right", pad_value=0, mask_key="attention_mask"
) -> TensorDictBase:
    """Pads a batch of ``n`` sequences into a dense TensorDict ``[n, Lmax]`` with an attention mask.

    Args:
        td: the sequences (a lazy stack, e.g. a sample of a :class:`~torchrl.data.PackedSequenceStorage`, or a
            list of TensorDicts of batch size ``[]``).
        keys (NestedKey or sequence of them, optional): the per-token entries to pad. Defaults to ``None``: the
            entries whose first dim differs between the sequences (name them when lengths may be equal).

    Keyword Args:
        side (str): ``"right"`` (tokens first, padding after: training) or ``"left"`` (padding first: batched
            generation). Defaults to ``"right"``.
        pad_value: the value of padded cells. Defaults to ``0``.
        mask_key (NestedKey): where the bool mask ``[n, Lmax]`` (True on tokens) goes. Defaults to
            ``"attention_mask"``.

    Returns:
        a TensorDict of batch size ``[n]``: each padded entry ``[n, Lmax, *feature]``, the mask ``[n, Lmax]``
        and the per-sequence entries (reward, ids) ``[n, ...]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import pad_sequences
        >>> seqs = [TensorDict(tokens=torch.tensor([1, 2, 3]), reward=torch.tensor(1.0)),
        ...         TensorDict(tokens=torch.tensor([4]), reward=torch.tensor(0.0))]
        >>> out = pad_sequences(seqs, side="left")
        >>> out["tokens"].tolist(), out["attention_mask"].tolist(), out["reward"].tolist()
        ([[1, 2, 3], [0, 0, 4]], [[True, True, True], [False, False, True]], [1.0, 0.0])
    """
    what = "pad_sequences"
    if side not in ("left", "right"):
        raise ValueError(f"{what}: `side` is 'left' or 'right'; got {side!r}.")
    items = as_items(td, what)
    n = len(items)
    if not n:
        raise ValueError(f"{what}: the batch holds no sequence.")
    token_keys, fixed_keys = _split_keys(items, keys, what)
    lengths = _lengths(items, token_keys, what)
    width = int(lengths.max())
    col = torch.arange(width)
    start = (width - lengths) if side == "left" else torch.zeros_like(lengths)
    mask = (col >= start.unsqueeze(-1)) & (col < (start + lengths).unsqueeze(-1))
    out = _fixed(items, fixed_keys, n)
    rows = segment_ids(lengths)
    cols = torch.arange(int(lengths.sum())) - (lengths.cumsum(0) - lengths)[rows]
    cols = cols + start[rows]
    for key in token_keys:
        flat = torch.cat([item.get(key) for item in items])
        padded = flat.new_full((n, width, *flat.shape[1:]), pad_value)
        padded[rows, cols] = flat
        out.set(key, padded)
    out.set(mask_key, mask)
    return out


def pack_sequences(td, keys=None) -> TensorDictBase:
    """Packs a batch of ``n`` sequences into one row of concatenated tokens: the layout of variable-length
    attention kernels (``flash_attn_varlen_func``, ``position_ids``-based packing in Hugging Face models).

    Args:
        td: the sequences (see :func:`pad_sequences`).
        keys (NestedKey or sequence of them, optional): the per-token entries to pack. Defaults to ``None``
            (the entries whose first dim differs between the sequences).

    Returns:
        a TensorDict of batch size ``[]``: each packed entry ``[1, T, *feature]`` (``T`` the total token count),
        ``"position_ids"`` (int64 ``[1, T]``, ``0 .. L_i - 1`` within each sequence), ``"cu_seqlens"`` (int32
        ``[n + 1]``, where each sequence starts, then ``T``), ``"max_seqlen"`` (0-d int64) and the per-sequence
        entries ``[n, ...]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import pack_sequences
        >>> seqs = [TensorDict(tokens=torch.tensor([1, 2, 3])), TensorDict(tokens=torch.tensor([4]))]
        >>> out = pack_sequences(seqs)
        >>> out["tokens"].tolist(), out["position_ids"].tolist(), out["cu_seqlens"].tolist()
        ([[1, 2, 3, 4]], [[0, 1, 2, 0]], [0, 3, 4])
    """
    what = "pack_sequences"
    items = as_items(td, what)
    n = len(items)
    if not n:
        raise ValueError(f"{what}: the batch holds no sequence.")
    token_keys, fixed_keys = _split_keys(items, keys, what)
    lengths = _lengths(items, token_keys, what)
    total = int(lengths.sum())
    out = TensorDict()
    for key in token_keys:
        out.set(key, torch.cat([item.get(key) for item in items]).unsqueeze(0))
    offsets = lengths.cumsum(0) - lengths
    out.set("position_ids", (torch.arange(total) - offsets[segment_ids(lengths)]).unsqueeze(0))
    out.set("cu_seqlens", torch.cat([offsets, lengths.sum().reshape(1)]).to(torch.int32))
    out.set("max_seqlen", lengths.max())
    fixed = _fixed(items, fixed_keys, n)
    for key in fixed_keys:
        out.set(key, fixed.get(key))
    return out
