"""Argument checks shared by every torchrl package.

Each check returns the normalized value or raises an error that names the argument in backticks, shows the
value received and, through ``hint``, says what to pass instead. Wrong types raise ``TypeError`` and values
out of range ``ValueError``; a check called with ``type_error=False`` raises ``ValueError`` for both, for
the arguments whose errors have always been ``ValueError``.

This module imports nothing from torchrl, so that every layer can use it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "check_bool", "check_int", "check_positive_int", "is_int", "is_real",
    "check_members", "check_per_member", "check_member_states", "member_id", "member_at",
]


def is_int(value) -> bool:
    """Whether ``value`` is an int or a numpy integer; ``True`` and ``False`` are not ints here."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value) -> bool:
    """Whether ``value`` is a real number (int, float, numpy scalar...); ``True`` and ``False`` are not."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _int_kind(minimum: int | None) -> str:
    if minimum is None:
        return "an int"
    if minimum == 0:
        return "a non-negative int"
    if minimum == 1:
        return "a positive int"
    return f"an int >= {minimum}"


def check_int(
    name: str,
    value,
    *,
    minimum: int | None = None,
    allow_none: bool = False,
    type_error: bool = True,
    hint: str = "",
) -> int | None:
    """``value`` as an ``int`` (numpy integers accepted), checked against ``minimum``.

    Args:
        name (str): the argument, as the error names it.
        value: what the caller passed.

    Keyword Args:
        minimum (int, optional): the smallest value accepted. Defaults to ``None`` (no bound).
        allow_none (bool): return ``None`` for ``None`` instead of raising. Defaults to ``False``.
        type_error (bool): raise ``TypeError`` for a value that is not an int (``ValueError`` when
            ``False``). Defaults to ``True``.
        hint (str): appended to the error: what to pass instead. Defaults to ``""``.

    Examples:
        >>> check_int("batch_size", 8, minimum=1)
        8
        >>> check_int("batch_size", 0, minimum=1, hint="Pass it to sample().")
        Traceback (most recent call last):
        ...
        ValueError: `batch_size` must be a positive int, got 0. Pass it to sample().
    """
    if type(value) is int and (minimum is None or value >= minimum):  # the common case, first
        return value
    if value is None and allow_none:
        return None
    what = _int_kind(minimum) + (" or None" if allow_none else "")
    tail = f" {hint}" if hint else ""
    if not is_int(value):
        error = TypeError if type_error else ValueError
        raise error(f"`{name}` must be {what}, got {value!r} ({type(value).__name__}).{tail}")
    if minimum is not None and value < minimum:
        raise ValueError(f"`{name}` must be {what}, got {value!r}.{tail}")
    return int(value)


def check_positive_int(
    name: str, value, *, allow_none: bool = False, type_error: bool = True, hint: str = ""
) -> int | None:
    """:func:`check_int` with ``minimum=1``."""
    if type(value) is int and value > 0:  # the common case, without a second call (sampling runs it per batch)
        return value
    return check_int(name, value, minimum=1, allow_none=allow_none, type_error=type_error, hint=hint)


def check_bool(name: str, value, *, hint: str = "") -> bool:
    """``value`` if it is a bool (``0``/``1`` are not); raises ``TypeError`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        tail = f" {hint}" if hint else ""
        raise TypeError(f"`{name}` must be a bool, got {value!r} ({type(value).__name__}).{tail}")
    return bool(value)


# -- the member list of an ensemble (StorageEnsemble, SamplerEnsemble, WriterEnsemble, ReplayBufferEnsemble):
# member ``i`` is "buffer ``i``" everywhere (sampled indices, per-member arguments, saved states).
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


def check_member_states(kind: str, states, n: int) -> None:
    """Raises unless ``states`` (the saved state of an ensemble ``kind`` of ``n`` members) is a dict holding one
    entry per member, keyed ``str(i)`` as ``state_dict()`` writes it."""
    keys = {str(i) for i in range(n)}
    if not isinstance(states, Mapping) or set(states) != keys:
        found = sorted(states) if isinstance(states, Mapping) else states
        raise ValueError(
            f"The {kind} state_dict has member entries {found}; this ensemble has members {sorted(keys)}. Load a "
            f"state saved from an ensemble of the same members."
        )


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
