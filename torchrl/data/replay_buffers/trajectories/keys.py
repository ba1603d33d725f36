"""The trajectory-key probe: which stored entries say where episodes are, in the order they are looked for.

One list of trajectory-id entries (:data:`TRAJECTORY_KEYS`) and one of end-of-episode flag names
(:data:`END_FLAG_NAMES`, found under ``"next"``). Each reader probes them in this order; where a reader follows
TorchRL's narrower probe, it filters the list with :func:`trajectory_keys` (documented at the call site), never
writes its own.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The trajectory-id entries looked for, in order, when no trajectory key is given.
TRAJECTORY_KEYS = (("collector", "traj_ids"), "traj_ids", "episode")
#: The end-of-episode flags, looked for under ``"next"`` (``("next", "done")`` first).
END_FLAG_NAMES = ("done", "terminated", "truncated")
#: The default end key: the done flag of the step's transition.
DONE_KEY = ("next", END_FLAG_NAMES[0])


def trajectory_keys(*, exclude: tuple = (), first: tuple = ()) -> tuple:
    """:data:`TRAJECTORY_KEYS` without the entries ``exclude``, the entries ``first`` moved to the front.

    Examples:
        >>> trajectory_keys(exclude=("traj_ids",))
        (('collector', 'traj_ids'), 'episode')
    """
    kept = [key for key in TRAJECTORY_KEYS if key not in exclude]
    return tuple([key for key in first if key in kept] + [key for key in kept if key not in first])


def end_keys(names: Sequence[str] = END_FLAG_NAMES) -> tuple:
    """The ``("next", name)`` end keys of ``names`` (a subset of :data:`END_FLAG_NAMES`), in that order."""
    return tuple(("next", name) for name in names)


def as_tuple(key) -> tuple[str, ...]:
    """A nested key as a tuple of str (``"episode"`` -> ``("episode",)``)."""
    return (key,) if isinstance(key, str) else tuple(key)


def sibling_key(key, name: str) -> str | tuple[str, ...]:
    """``key`` (normalized) with its last element replaced by ``name``: ``("next", "truncated")`` gives
    ``("next", name)``, ``"truncated"`` gives ``name``."""
    return name if isinstance(key, str) else (*key[:-1], name)


def normalize_key(key) -> str | tuple[str, ...]:
    """A nested key as a str (one level) or a tuple of str; raises TypeError otherwise."""
    if isinstance(key, str):
        return key
    if isinstance(key, Sequence) and key and all(isinstance(k, str) for k in key):
        return key[0] if len(key) == 1 else tuple(key)
    raise TypeError(f"A key must be a str or a non-empty tuple of str, got {key!r}.")
