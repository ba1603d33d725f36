"""The member list of an ensemble: the checks shared by :class:`~torchrl.data.StorageEnsemble`,
:class:`~torchrl.data.SamplerEnsemble`, :class:`~torchrl.data.WriterEnsemble` and
:class:`~torchrl.data.ReplayBufferEnsemble`.

An ensemble holds its members in order; member ``i`` is "buffer ``i``" everywhere (sampled indices, per-member
arguments, saved states). This module imports nothing of the package but the shared argument checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchrl._validation import is_int


def check_members(kind: str, members: Sequence, cls: type) -> list:
    """The members of an ensemble ``kind`` as a new list: at least one, each an instance of ``cls``."""
    if not members:
        raise ValueError(f"A {kind} needs at least one member {cls.__name__}; got none.")
    for i, member in enumerate(members):
        if not issubclass(type(member), cls):  # a proxy that passes isinstance (a Ray client) is not one
            raise TypeError(
                f"Member {i} of a {kind} must be a {cls.__name__}, got {type(member).__name__}. Pass "
                f"{cls.__name__} instances as positional arguments."
            )
    return list(members)


def check_per_member(name: str, values, n: int) -> list:
    """An argument that holds one entry per member (``values``, named ``name``), as a new list."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"`{name}` must be a list with one entry per member, got {type(values).__name__}.")
    if len(values) != n:
        raise ValueError(f"`{name}` must have one entry per member ({n}), got {len(values)}.")
    return list(values)


def member_id(i: int, n: int) -> int:
    """Member ``i`` of ``n`` as a position in ``[0, n)`` (negative ``i`` counts from the end)."""
    if not -n <= i < n:
        raise IndexError(f"Member {i} is out of range for an ensemble of {n} members.")
    return i % n


def member_at(kind: str, members: Sequence, item, *, hint: str = "") -> Any:
    """``members[item]`` for an int ``item`` (what ``ensemble[i]`` returns); ``hint`` ends the TypeError."""
    if not is_int(item):
        tail = f" {hint}" if hint else ""
        raise TypeError(f"Index a {kind} with an int (a member), got {type(item).__name__}.{tail}")
    return members[member_id(int(item), len(members))]
