"""The data model of a :class:`~torchrl.data.ShardedRayReplayBuffer`: which shard a row goes to, how a draw is
split over shards, and the global index that names a row.

NOTE [sharded draws]: each of the ``N`` shards is a whole buffer (storage, sampler, writer) in its own actor. A
draw of ``B`` items first reads each shard's weight: its number of rows (uniform samplers) or its priority mass
``M_s = sum_i q_i`` with ``q_i = (p_i + eps) ** alpha`` (prioritized samplers). The counts per shard are one
multinomial draw of ``B`` over ``weight_s / sum_s weight_s``; shard ``s`` then draws its count with its own
sampler (``q_i / M_s`` within a prioritized shard). A row ``i`` of shard ``s`` is so drawn with probability
``(M_s / M) * (q_i / M_s) = q_i / M``: the distribution of one buffer holding every row. Importance weights are
``(q_i / q_min) ** -beta`` with the GLOBAL minimum ``q_min = min_s q_min_s``, the weights of one buffer; a shard
returns its own ``(q_i / q_min_s) ** -beta``, which :func:`global_weights` rescales by
``(q_min_s / q_min) ** -beta``. The batch is shuffled once assembled, so its order does not tell the shards apart.

Global index: row ``slot`` of shard ``s`` is ``slot * N + s`` (:func:`to_global`, :func:`from_global`): any
non-negative int64 names one row, whatever the shards' capacities.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch

from torchrl._validation import check_int, is_int

__all__ = [
    "check_num_shards",
    "check_shard",
    "from_global",
    "global_weights",
    "group_rows",
    "shard_of_rows",
    "split_counts",
    "to_global",
]


def check_num_shards(num_shards) -> int:
    """``num_shards`` as a positive int; ``TypeError``/``ValueError`` naming it otherwise."""
    return check_int("num_shards", num_shards, minimum=1, hint="Pass the number of shard actors, e.g. num_shards=4.")


def check_shard(shard, num_shards: int) -> int:
    """``shard`` (a write's explicit destination) as an int in ``[0, num_shards)``."""
    if not is_int(shard):
        raise TypeError(f"`shard` must be an int in [0, {num_shards}) or None, got {shard!r}.")
    if not 0 <= shard < num_shards:
        raise ValueError(
            f"`shard`={shard} is out of range: this buffer has {num_shards} shards, numbered 0 to {num_shards - 1}."
        )
    return int(shard)


def _route_values(data, route_key) -> np.ndarray | list:
    keys = list(data.keys(include_nested=True, leaves_only=True))
    if route_key not in data.keys(include_nested=True):
        shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
        raise KeyError(
            f"route_key={route_key!r} is not an entry of the data written (entries: {shown}): write data that "
            f"holds it, pass shard= to the write, or build the buffer with route_key=None (round robin)."
        )
    value = data.get(route_key)
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(
                f"The route_key entry {route_key!r} must hold integers or strings (one per row), got a "
                f"{value.dtype} tensor: route by an id such as the collector's index."
            )
        return value.reshape(value.shape[0], -1)[:, 0].cpu().numpy().astype(np.int64, copy=False)
    values = value.tolist() if hasattr(value, "tolist") else list(value)
    if not all(isinstance(v, str) for v in values):
        raise TypeError(
            f"The route_key entry {route_key!r} must hold integers or strings (one per row), got "
            f"{type(value).__name__} values such as {values[:1]!r}."
        )
    return values


def shard_of_rows(data, route_key, num_shards: int) -> np.ndarray:
    """The shard of each row of ``data`` (a TensorDict whose first dim is the rows): its ``route_key`` entry,
    an integer modulo ``num_shards`` or a string hashed (CRC-32, the same in every process) modulo it."""
    values = _route_values(data, route_key)
    if isinstance(values, np.ndarray):
        return np.mod(values, num_shards)
    return np.fromiter((zlib.crc32(v.encode()) % num_shards for v in values), dtype=np.int64, count=len(values))


def group_rows(shards: np.ndarray, num_shards: int) -> list[tuple[int, torch.Tensor]]:
    """``[(shard, rows), ...]``: the positions (int64 tensor) of the rows going to each shard that gets any."""
    order = np.argsort(shards, kind="stable")
    counts = np.bincount(shards, minlength=num_shards)
    groups, start = [], 0
    for shard, count in enumerate(counts.tolist()):
        if count:
            groups.append((shard, torch.from_numpy(order[start : start + count])))
        start += count
    return groups


def split_counts(weights: Sequence[float], batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """How many of ``batch_size`` draws each shard serves: one multinomial draw over ``weights`` (sizes or priority
    masses; see NOTE [sharded draws]). ``weights`` must have a positive sum."""
    weights = np.asarray(weights, dtype=np.float64)
    return rng.multinomial(batch_size, weights / weights.sum())


def to_global(slot: torch.Tensor, shard: int, num_shards: int) -> torch.Tensor:
    """The global index of rows ``slot`` of ``shard``: ``slot * num_shards + shard``."""
    return slot.to(torch.int64) * num_shards + shard


def from_global(index, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, slot)`` arrays of global indices (an int, a sequence or an integer tensor / array), checked
    before anything is sent: ``TypeError`` for non-integers, ``ValueError`` for negative values."""
    if isinstance(index, torch.Tensor):
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise TypeError(f"`index` must hold integers (global indices of this buffer), got a {index.dtype} tensor.")
        flat = index.reshape(-1).cpu().numpy().astype(np.int64, copy=False)
    elif is_int(index):
        flat = np.array([int(index)], dtype=np.int64)
    else:
        flat = np.asarray(index)
        if flat.dtype.kind not in "iu":
            raise TypeError(f"`index` must hold integers (global indices of this buffer), got {index!r}.")
        flat = flat.reshape(-1).astype(np.int64, copy=False)
    if flat.size and flat.min() < 0:
        raise ValueError(
            f"`index` must hold global indices >= 0 (as this buffer's sample returns them), got "
            f"{flat[flat < 0][:3].tolist()}."
        )
    return flat % num_shards, flat // num_shards


def global_weights(local: torch.Tensor, shard_min: float, global_min: float, beta: float) -> torch.Tensor:
    """A shard's importance weights ``(q / q_min_s) ** -beta`` as one buffer's ``(q / q_min) ** -beta``."""
    if shard_min == global_min or beta == 0:
        return local
    factor = (shard_min / global_min) ** (-beta)
    return (local.to(torch.float64) * factor).to(local.dtype)
