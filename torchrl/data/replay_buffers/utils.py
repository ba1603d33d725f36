"""Helpers of TorchRL's ``torchrl.data.replay_buffers.utils`` that user code imports from there.

- :func:`tree_iter`: the leaves of a pytree (TensorDicts included), as an iterator;
- :func:`pin_memory_output`: a method decorator that pins what the method returns when ``self._pin_memory``;
- :data:`INT_CLASSES` / :data:`INT_CLASSES_TYPING`: the integer types accepted as one index;
- :func:`find_start_stop_traj`: trajectory start/stop positions from done flags or trajectory ids;
- :func:`unravel_index`: flat indices to per-dim coordinates (:func:`torch.unravel_index`);
- :func:`has_nontensor`: whether a TensorDict holds a non-tensor entry (what tensor storages encode as strings
  and what the TED storage checkpointers refuse);
- the TED layouts (:class:`TED2Flat`, :class:`Flat2TED`, ...) and :data:`DEFAULT_DONE_KEYS`, defined in
  :mod:`torchrl.data.replay_buffers.ted`.

TorchRL's private helpers of this module (names starting with ``_``) are not reproduced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, Union

import numpy as np
import torch
import torch.utils._pytree as _pytree
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.errors import ValueRuntimeError
from torchrl.data.replay_buffers.loading.pinning import pin_host_memory
from torchrl.data.replay_buffers.ted import (
    DEFAULT_DONE_KEYS,
    Flat2TED,
    H5Combine,
    H5Split,
    Nested2TED,
    TED2Flat,
    TED2Nested,
)

TRAJ_EXACTLY_ONE = TorchRLPhrase(
    TypeError,
    "Exactly one",
    "Exactly one of `trajectory` and `end` must be given, got {got}.",
)
TRAJ_CURSOR_EMPTY = TorchRLPhrase(
    ValueRuntimeError,
    "cursor must not be",
    "The cursor must not be empty (got {cursor!r}): pass the storage's write cursor as an int or a non-empty "
    "tensor of positions.",
)
TRAJ_EMPTY = TorchRLPhrase(
    ValueRuntimeError,
    "empty",
    "The {name} input is empty (T=0): there is no trajectory to find. Pass at least one step.",
)

# What ``torchrl.data`` exports from here; INT_CLASSES, INT_CLASSES_TYPING, DEFAULT_REWARD_KEYS, tree_iter,
# pin_memory_output and unravel_index are TorchRL's names of this module, imported by name.
__all__ = [
    "DEFAULT_DONE_KEYS",
    "find_start_stop_traj",
    "TED2Flat",
    "Flat2TED",
    "TED2Nested",
    "Nested2TED",
    "H5Split",
    "H5Combine",
]

INT_CLASSES_TYPING = Union[int, np.integer]
"""The type of one integer index (``int`` or a numpy integer)."""

INT_CLASSES = (int, np.integer)
"""The integer classes accepted as one index, for ``isinstance`` checks."""


def tree_iter(pytree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """Iterates over the leaves of ``pytree`` (nested lists, tuples, dicts, TensorDicts...), depth first.

    Args:
        pytree: any structure :mod:`torch.utils._pytree` knows; anything else is one leaf.
        is_leaf (callable, optional): returns ``True`` for a node to yield as one leaf instead of entering it.
            Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.utils import tree_iter
        >>> list(tree_iter({"a": torch.zeros(1), "b": [1, (2, 3)]}))
        [tensor([0.]), 1, 2, 3]
    """
    return iter(_pytree.tree_leaves(pytree, is_leaf=is_leaf))


def unravel_index(indices: torch.Tensor, shape: int | tuple[int, ...] | torch.Size) -> tuple[torch.Tensor, ...]:
    """The coordinates in a tensor of ``shape`` of flat (row-major) ``indices``: :func:`torch.unravel_index`.

    Args:
        indices (Tensor): integer flat indices, any shape.
        shape (int or sequence of ints): the shape the indices point into.

    Returns:
        one tensor per dim of ``shape``, each of ``indices``' shape.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.utils import unravel_index
        >>> unravel_index(torch.tensor([0, 5, 7]), (2, 4))
        (tensor([0, 1, 1]), tensor([0, 1, 3]))
    """
    return torch.unravel_index(indices, shape)


def has_nontensor(td: TensorDictBase) -> bool:
    """Whether ``td`` holds a non-tensor entry (``NonTensorData``/``NonTensorStack``), at any depth.

    One pass over the values, without stacking: a lazy stack is looked at through its members.

    Examples:
        >>> import torch
        >>> from tensordict import NonTensorStack, TensorDict
        >>> from torchrl.data.replay_buffers.utils import has_nontensor
        >>> has_nontensor(TensorDict(obs=torch.zeros(2), batch_size=[2]))
        False
        >>> has_nontensor(TensorDict(nested={"text": NonTensorStack("a", "b")}, batch_size=[2]))
        True
    """
    members = getattr(td, "tensordicts", None)  # a lazy stack: look at its members, never stack them
    if members is not None:
        return any(has_nontensor(member) for member in members)
    for value in td.values():
        if isinstance(value, torch.Tensor):
            continue
        if isinstance(value, (NonTensorData, NonTensorStack)):
            return True
        if isinstance(value, TensorDictBase) and has_nontensor(value):
            return True
    return False


def _pin(value):
    return pin_host_memory(value)  # host leaves only, and only with an accelerator runtime


def pin_memory_output(fun: Callable) -> Callable:
    """Decorates a method so that its output is pinned when the object's ``_pin_memory`` is true.

    A tuple output is pinned element-wise; elements without ``pin_memory`` (and every output when CUDA is not
    available) are returned unchanged.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.utils import pin_memory_output
        >>> class Source:
        ...     _pin_memory = True
        ...     @pin_memory_output
        ...     def read(self):
        ...         return torch.zeros(2), "meta"
        >>> Source().read()[1]
        'meta'
    """

    @functools.wraps(fun)
    def pinned(self, *args, **kwargs):
        output = fun(self, *args, **kwargs)
        if not getattr(self, "_pin_memory", False):
            return output
        if isinstance(output, tuple):
            return tuple(_pin(value) for value in output)
        return _pin(output)

    return pinned


def _cursor_row(cursor) -> int:
    if (isinstance(cursor, range) and not len(cursor)) or (isinstance(cursor, torch.Tensor) and not cursor.numel()):
        raise TRAJ_CURSOR_EMPTY.error(cursor=cursor)
    if isinstance(cursor, range):
        return cursor[-1]
    if isinstance(cursor, torch.Tensor) and not cursor.is_floating_point() and cursor.ndim <= 1 and cursor.numel():
        return int(cursor.reshape(-1)[-1])
    if isinstance(cursor, INT_CLASSES) and not isinstance(cursor, bool):
        return int(cursor)
    raise TypeError(f"`cursor` must be an int, a range or a 1-D integer tensor, got {cursor!r}.")


def find_start_stop_traj(
    *,
    trajectory: torch.Tensor | None = None,
    end: torch.Tensor | None = None,
    at_capacity: bool,
    cursor=None,
    device: torch.device | str | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Finds the trajectories of a storage from per-step trajectory ids or done flags.

    Dim 0 is time; any trailing dims are independent streams (e.g. envs of a ``[time, envs]`` storage). A
    trajectory ends where ``end`` is set, or where the id changes between consecutive steps. When the storage
    is not full (``at_capacity=False``), the last step ends a trajectory. When it is full, time wraps around:
    a trajectory may run from the last rows into the first ones; ``cursor`` (the last written position) then
    also ends one, as does the last step of a stream with no end at all.

    Keyword Args:
        trajectory (Tensor, optional): trajectory ids, ``[T, *streams]``.
        end (Tensor, optional): done flags, ``[T, *streams]``. Exactly one of ``trajectory``/``end``.
        at_capacity (bool): whether the storage is full (its rows form a ring).
        cursor (int, range or Tensor, optional): the last written position (the last element of a range or
            tensor); used when ``at_capacity``.
        device (torch.device, optional): where the returned tensors live. Defaults to ``None``: the device of
            ``trajectory``/``end``.

    Returns:
        ``(start, stop, lengths)``: ``start`` and ``stop`` are ``[N, ndim]`` long tensors holding the positions
        of the first and last step of each trajectory (time first), ordered by stream then time; ``lengths``
        (``[N]``) counts the steps of each, wrapping around when ``stop < start``.

    Examples:
        >>> import torch
        >>> from torchrl.data import find_start_stop_traj
        >>> end = torch.tensor([False, True, False, False, True, False])
        >>> start, stop, lengths = find_start_stop_traj(end=end, at_capacity=False)
        >>> start.squeeze(-1), stop.squeeze(-1), lengths
        (tensor([0, 2, 5]), tensor([1, 4, 5]), tensor([2, 3, 1]))
        >>> _, _, lengths = find_start_stop_traj(end=end, at_capacity=True)  # step 5 continues at step 0
        >>> lengths
        tensor([3, 3])
    """
    if (trajectory is None) == (end is None):
        got = "both" if trajectory is not None else "neither"
        raise TRAJ_EXACTLY_ONE.error(got=got)
    if not isinstance(at_capacity, (bool, np.bool_)):
        raise TypeError(f"`at_capacity` must be a bool, got {at_capacity!r}.")
    name = "trajectory" if trajectory is not None else "end"
    values = torch.as_tensor(trajectory if trajectory is not None else end)
    if values.ndim == 0:
        raise ValueError(f"`{name}` must have a time dim (dim 0), got a 0-d tensor.")
    if values.shape[0] == 0:
        raise TRAJ_EMPTY.error(name=f"`{name}`")
    if cursor is not None:
        _cursor_row(cursor)  # checked before anything is computed, whatever `at_capacity`
    if device is not None:
        device = _as_device(device)
    if trajectory is not None:
        flags = values != values.roll(-1, 0)  # the last step is compared with the first (a ring)
    else:
        if values.is_floating_point() or values.is_complex():
            raise TypeError(f"`end` must hold booleans or integers, got dtype {values.dtype}.")
        flags = values.bool().clone()
    if not at_capacity:
        flags[-1] = True
    else:
        if cursor is not None:
            row = _cursor_row(cursor)
            if not -flags.shape[0] <= row < flags.shape[0]:
                raise IndexError(f"`cursor` {row} is out of range for {flags.shape[0]} steps.")
            flags[row] = True
        flags[-1] |= ~flags.any(0)  # a stream needs an end to delimit its trajectories
    start, stop, lengths = _ends_to_start_stop(flags)
    if device is not None:
        start, stop, lengths = start.to(device), stop.to(device), lengths.to(device)
    return start, stop, lengths


def _as_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"`device` must be a torch.device, a device string such as 'cpu' or 'cuda:0', or a device index; got "
            f"{device!r}."
        ) from err


def _ends_to_start_stop(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = flags.shape[0]
    stop = flags.transpose(0, -1).nonzero()  # grouped by stream, time increasing within each
    if flags.ndim > 1:
        stop[:, [0, -1]] = stop[:, [-1, 0]]
    t = stop[:, 0]
    if not t.numel():
        return stop.clone(), stop, t.clone()
    streams = stop[:, 1:]
    first = torch.ones_like(t, dtype=torch.bool)
    first[1:] = (streams[1:] != streams[:-1]).any(-1)
    last = torch.ones_like(first)
    last[:-1] = first[1:]
    group = torch.cumsum(first, 0) - 1
    wrap_start = (t[last][group] + 1) % n  # the first trajectory of a stream starts after its last end
    start_t = torch.where(first, wrap_start, t.roll(1, 0) + 1)
    start = stop.clone()
    start[:, 0] = start_t
    lengths = t - start_t + 1
    lengths = torch.where(lengths <= 0, lengths + n, lengths)
    return start, stop, lengths
