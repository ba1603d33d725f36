"""Compact layouts of TED data (TorchRL Episode Data) for saving: ``TED2Flat``/``Flat2TED``,
``TED2Nested``/``Nested2TED`` and ``H5Split``/``H5Combine``.

Data model. A TED TensorDict holds one time step per row (dim 0 = time, oldest first): the root holds what
was observed before the step (``observation``, ``action``, ...) and ``"next"`` what came after it
(``("next", "observation")``, ``("next", "reward")``, ``("next", "done")``, ...). Within a trajectory the
``"next"`` observation of step ``t`` is the root observation of step ``t + 1``: stored as is, every
observation is kept twice. A trajectory ends at a step whose ``("next", done_key)`` is set, and at the last
row (the newest step, whose trajectory may still be running).

The *flat* layout keeps each observation once. With ``T`` steps forming ``K`` trajectories:

- an entry present both at the root and under ``"next"`` (an observation) becomes one root entry of length
  ``T + K``: for each trajectory its root values, then the ``"next"`` value of its last step;
- the done and reward entries of ``"next"`` (``done_keys``, ``reward_keys``) move to the root (length ``T``);
  the root done entries (False in TED data) are dropped and rebuilt as False;
- other root entries (``action``, ...) stay (length ``T``); other ``"next"`` entries stay under ``"next"``;
- when the rows come from a full ring buffer (``is_full``), ``shift`` (the row of the oldest step) and
  ``is_full`` are stored under ``shift_key`` and ``is_full_key``, so that the rows go back where they were.

The *nested* layout splits the flat entries per trajectory into nested tensors (batch size ``[K]``), and the
*H5* layout stores each nested entry as one dense tensor plus its per-trajectory lengths (HDF5 holds no
nested tensors). Each class is a function object ``TensorDict -> TensorDict``, usable alone or as a storage
save hook (``hook(data, path=path)``) / load hook (``hook(data, out=destination)``).
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

__all__ = [
    "DEFAULT_DONE_KEYS",
    "DEFAULT_REWARD_KEYS",
    "TED2Flat",
    "Flat2TED",
    "TED2Nested",
    "Nested2TED",
    "H5Split",
    "H5Combine",
]

DEFAULT_DONE_KEYS = ("done", "truncated", "terminated")
"""The names of the end-of-step flags of TED data, read under ``"next"``."""

DEFAULT_REWARD_KEYS = ("reward",)
"""The names of the reward entries of TED data, read under ``"next"``."""

_LENGTHS = "_lengths"


def _as_key(key) -> tuple[str, ...]:
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    raise TypeError(f"A key must be a str or a non-empty tuple of str, got {key!r}.")


def _as_key_names(name: str, keys) -> tuple[tuple[str, ...], ...]:
    """A sequence of keys (a str is one name; a tuple of str is several one-level names)."""
    if isinstance(keys, str):
        keys = (keys,)
    if not isinstance(keys, Sequence):
        raise TypeError(f"`{name}` must be a sequence of keys, got {keys!r}.")
    try:
        return tuple(_as_key(k) for k in keys)
    except TypeError:
        raise TypeError(f"`{name}` must be a sequence of str or tuples of str, got {keys!r}.") from None


def _matches(key: tuple[str, ...], names: tuple[tuple[str, ...], ...]) -> bool:
    """Whether ``key`` is one of ``names``: a one-level name matches the last element of a nested key."""
    return any(key == name or (len(name) == 1 and key[-1] == name[0]) for name in names)


def _is_leaf(cls: type) -> bool:
    """Leaves of a TensorDict: tensors and non-tensor entries (``shift``/``is_full`` of the nested layout)."""
    return not issubclass(cls, TensorDictBase) or issubclass(cls, (NonTensorData, NonTensorStack))


def _leaves(td: TensorDictBase) -> list[tuple[str, ...]]:
    return [_as_key(k) for k in td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf)]


def _step_flags(value: torch.Tensor, n: int, name) -> torch.Tensor:
    value = torch.as_tensor(value)
    if value.ndim == 0 or value.shape[0] != n:
        raise ValueError(
            f"The entry {name!r} must hold one flag per step ({n} steps), got shape {list(value.shape)}."
        )
    return value.reshape(n, -1).any(-1) if value.ndim > 1 else value.bool()


class _TEDHook:
    """Shared configuration: which entries are done flags and rewards, where shift/is_full are stored."""

    def __init__(
        self,
        done_key="done",
        shift_key="shift",
        is_full_key="is_full",
        done_keys=DEFAULT_DONE_KEYS,
        reward_keys=DEFAULT_REWARD_KEYS,
    ):
        self.done_key = _as_key(done_key)
        self.shift_key = _as_key(shift_key)
        self.is_full_key = _as_key(is_full_key)
        self._done_names = _as_key_names("done_keys", DEFAULT_DONE_KEYS if done_keys is None else done_keys)
        # as TorchRL: a set of the done names (a str for a one-level name, a tuple for a nested key)
        self.done_keys = {name[0] if len(name) == 1 else name for name in self._done_names}
        self.reward_keys = _as_key_names(
            "reward_keys", DEFAULT_REWARD_KEYS if reward_keys is None else reward_keys
        )

    def _check_td(self, data, what: str) -> None:
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"{type(self).__name__} takes {what} TensorDict, got {type(data).__name__}.")

    def _ends(self, flags: torch.Tensor) -> torch.Tensor:
        """Trajectory ends: the done steps and the last step."""
        ends = flags.clone()
        if ends.numel():
            ends[-1] = True
        return ends

    def __repr__(self) -> str:
        return f"{type(self).__name__}(done_key={self.done_key!r}, done_keys={sorted(self.done_keys, key=repr)!r}, reward_keys={self.reward_keys!r})"


class TED2Flat(_TEDHook):
    """Turns TED data into the flat layout, where each observation is stored once (see the module docstring).

    Use it alone, or as a storage save hook that makes checkpoints about half the size of TED data.

    Args:
        done_key (NestedKey): the entry whose flags end trajectories: ``("next", name)``, or ``name`` alone (read
            under ``"next"`` too: TED data keeps the flags of a step there). Defaults to ``("next", "done")``.
        shift_key (NestedKey): where the row of the oldest step is stored for a full ring buffer. Defaults to
            ``"shift"``.
        is_full_key (NestedKey): where ``is_full`` is stored for a full ring buffer. Defaults to ``"is_full"``.
        done_keys (sequence of NestedKey): the done entries (a one-level name matches nested keys ending with
            it). Defaults to :data:`DEFAULT_DONE_KEYS`.
        reward_keys (sequence of NestedKey): the reward entries. Defaults to ``("reward",)``.

    Attributes:
        done_keys (set): the done names, as TorchRL keeps them: a ``str`` per one-level name, a tuple per nested
            key (``{"done", "truncated", "terminated"}`` by default).
        done_key (tuple): ``done_key`` as a tuple, as given (``("next", "done")`` by default).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Flat2TED, TED2Flat
        >>> obs = torch.tensor([0.0, 1.0, 10.0, 11.0, 12.0])  # two trajectories: steps [0, 1] and [2, 3, 4]
        >>> next_obs = torch.tensor([1.0, 2.0, 11.0, 12.0, 13.0])
        >>> done = torch.tensor([False, True, False, False, False])
        >>> ted = TensorDict({"obs": obs, "action": torch.zeros(5), "done": torch.zeros(5, dtype=torch.bool),
        ...     "next": {"obs": next_obs, "reward": torch.ones(5), "done": done}}, batch_size=[5])
        >>> flat = TED2Flat()(ted)
        >>> flat["obs"]  # each trajectory's root observations, then its last next observation
        tensor([ 0.,  1.,  2., 10., 11., 12., 13.])
        >>> sorted(flat.keys())
        ['action', 'done', 'obs', 'reward']
        >>> sorted(TED2Flat().done_keys)
        ['done', 'terminated', 'truncated']
        >>> bool((Flat2TED()(flat) == ted).all())
        True
    """

    def __init__(
        self,
        done_key=("next", "done"),
        shift_key="shift",
        is_full_key="is_full",
        done_keys=DEFAULT_DONE_KEYS,
        reward_keys=DEFAULT_REWARD_KEYS,
    ):
        super().__init__(done_key, shift_key, is_full_key, done_keys, reward_keys)
        key = self.done_key
        # the entry under "next" (and, in the flat layout, at the root) that holds the flags
        self._step_done_key = key[1:] if key[0] == "next" and len(key) > 1 else key
        # set by a storage checkpointer before each save: the row of the oldest step and whether the ring is full
        self._shift: int | None = None
        self._is_full: bool = False

    @property
    def shift(self) -> int | None:
        """With ``is_full=False``, the number of filled rows (``None``: every row); with ``is_full=True``, the row
        of the oldest step. Set by storage checkpointers before a save."""
        return self._shift

    @shift.setter
    def shift(self, value: int | None) -> None:
        if value is None:
            self._shift = None
            return
        try:
            row = operator.index(value) if not isinstance(value, (bool, np.bool_)) else None
        except TypeError:
            row = None
        if row is None or row < 0:
            raise ValueError(f"`shift` must be None or a non-negative int (a row of the storage), got {value!r}.")
        self._shift = row

    @property
    def is_full(self) -> bool:
        """Whether the rows form a full ring buffer (then :attr:`shift` is the row of the oldest step)."""
        return self._is_full

    @is_full.setter
    def is_full(self, value: bool) -> None:
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
            value = bool(value)
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"`is_full` must be a bool, got {value!r}.")
        self._is_full = bool(value)

    def __call__(self, data: TensorDictBase, path=None) -> TensorDictBase:
        """Returns the flat layout of ``data`` (``path`` is accepted for the save-hook signature, unused)."""
        self._check_td(data, "a 1-D (time)")
        if data.batch_dims != 1:
            raise ValueError(
                f"{type(self).__name__} takes one stream of steps (batch size [T]), got batch size "
                f"{list(data.batch_size)}. For [time, envs] data, convert each env column `data[:, i]`."
            )
        data = self._in_time_order(data)
        n = data.shape[0]
        nxt = data.get("next", None)
        if not isinstance(nxt, TensorDictBase) or nxt.get(self._step_done_key, None) is None:
            raise KeyError(
                f"{type(self).__name__} needs the entry {('next', *self._step_done_key)!r} (one done flag per "
                f"step) to find trajectories: pass `done_key` naming the stored done entry."
            )
        ends = self._ends(_step_flags(nxt.get(self._step_done_key), n, ("next", *self._step_done_key)))
        first = torch.cumsum(ends, 0) - ends.long()  # trajectory of each step
        end_pos = ends.nonzero().squeeze(-1)
        n_traj = end_pos.numel()
        root_keys = [k for k in _leaves(data) if k[0] != "next"]
        next_keys = [k[1:] for k in _leaves(data) if k[0] == "next"]
        next_set = set(next_keys)
        out = TensorDict(batch_size=[], device=data.device)
        for key in root_keys:
            value = data.get(key)
            if _matches(key, self._done_names):
                if value.any():
                    raise ValueError(
                        f"The root entry {key!r} holds True values: in TED data the root done flags are False "
                        f"(the flags of a step are under 'next'), and the flat layout rebuilds them as False. "
                        f"Move these flags under 'next', or leave {key[-1]!r} out of `done_keys`."
                    )
                continue
            if key in next_set:  # an observation: root values per trajectory, then the last next value
                nxt_value = data.get(("next", *key))
                flat = value.new_empty((n + n_traj, *value.shape[1:]))
                flat[torch.arange(n, device=first.device) + first] = value
                flat[end_pos + torch.arange(1, n_traj + 1, device=end_pos.device)] = nxt_value[end_pos]
                out.set(key, flat)
            elif _matches(key, self.reward_keys):
                raise ValueError(
                    f"The root entry {key!r} is a reward but has no {('next', *key)!r} counterpart: TED data "
                    f"keeps rewards under 'next'. Leave it out of `reward_keys` or move it under 'next'."
                )
            else:
                out.set(key, value)
        observations = {k for k in root_keys if not _matches(k, self._done_names)}
        for key in next_keys:
            if key in observations:
                continue
            value = data.get(("next", *key))
            target = key if _matches(key, self._done_names + self.reward_keys) else ("next", *key)
            out.set(target, value)
        if self.is_full:
            out.set(self.shift_key, torch.tensor(int(self.shift or 0)))
            out.set(self.is_full_key, torch.tensor(True))
        return out

    def _in_time_order(self, data: TensorDictBase) -> TensorDictBase:
        shift = self.shift
        if not self.is_full:
            return data if shift is None else data[: int(shift)]
        n = data.shape[0]
        if shift is None or not 0 <= int(shift) < max(n, 1):
            raise ValueError(
                f"{type(self).__name__}.shift must be a row in [0, {n}) when is_full=True, got {shift!r}."
            )
        order = (torch.arange(n, device=data.device) + int(shift)) % n
        return data[order]


class Flat2TED(_TEDHook):
    """Rebuilds TED data from the flat layout written by :class:`TED2Flat` (its inverse).

    Takes the arguments of :class:`TED2Flat`. Called with ``out`` (a load hook), it also writes the TED data
    into the first rows of ``out``, which must hold the same entries.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Flat2TED
        >>> flat = TensorDict({"obs": torch.tensor([0.0, 1.0, 2.0, 3.0]), "reward": torch.ones(2),
        ...     "done": torch.tensor([True, False])}, batch_size=[])
        >>> ted = Flat2TED()(flat)
        >>> ted["obs"], ted["next", "obs"], ted["next", "done"]
        (tensor([0., 2.]), tensor([1., 3.]), tensor([ True, False]))
    """

    def __call__(self, data: TensorDictBase, out: TensorDictBase | None = None) -> TensorDictBase:
        self._check_td(data, "a flat")
        done = data.get(self.done_key, None)
        if done is None:
            raise KeyError(
                f"{type(self).__name__} needs the root entry {self.done_key!r} (the done flags moved from "
                f"'next' by TED2Flat): pass the `done_key` used when saving."
            )
        n = torch.as_tensor(done).shape[0] if torch.as_tensor(done).ndim else 0
        ends = self._ends(_step_flags(done, n, self.done_key))
        n_traj = int(ends.sum())
        traj = torch.cumsum(ends, 0) - ends.long()
        root_pos = torch.arange(n, device=traj.device) + traj
        ted = TensorDict(batch_size=[n], device=data.device)
        shift, is_full = 0, False
        for key in _leaves(data):
            value = data.get(key)
            if key == self.shift_key:
                shift = int(value)
            elif key == self.is_full_key:
                is_full = bool(value)
            elif key[0] == "next":
                ted.set(key, value)
            elif value.ndim and value.shape[0] == n + n_traj:
                ted.set(key, value[root_pos])
                ted.set(("next", *key), value[root_pos + 1])
            elif value.ndim == 0 or value.shape[0] != n:
                raise ValueError(
                    f"The entry {key!r} has {value.shape[0] if value.ndim else 0} rows; flat data of {n} steps "
                    f"in {n_traj} trajectories has {n} rows per step entry and {n + n_traj} per observation."
                )
            elif _matches(key, self._done_names):
                ted.set(("next", *key), value)
                ted.set(key, torch.zeros_like(value))
            elif _matches(key, self.reward_keys):
                ted.set(("next", *key), value)
            else:
                ted.set(key, value)
        if is_full and n:
            ted = ted[(torch.arange(n, device=ted.device) - shift) % n]
        if out is not None:
            if out.batch_size[0] < n:
                raise ValueError(f"`out` holds {out.batch_size[0]} rows, fewer than the {n} steps to load.")
            out[:n].update_(ted)
            return out
        return ted


def _nested(parts: list[torch.Tensor]) -> torch.Tensor:
    with warnings.catch_warnings():  # torch flags the strided nested layout as a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(parts)


class TED2Nested(TED2Flat):
    """Turns TED data into nested tensors, one component per trajectory (batch size ``[K]``).

    The flat layout of :class:`TED2Flat`, split per trajectory: an observation of a trajectory of ``L`` steps
    has ``L + 1`` rows, other entries ``L``. ``shift``/``is_full`` of a full ring buffer are non-tensor
    entries. Takes the arguments of :class:`TED2Flat` (positional or by keyword, as TorchRL's ``*args, **kwargs``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Nested2TED, TED2Nested
        >>> done = torch.tensor([True, False, False])
        >>> ted = TensorDict({"obs": torch.arange(3.0), "done": torch.zeros(3, dtype=torch.bool),
        ...     "next": {"obs": torch.arange(1.0, 4.0), "done": done}}, batch_size=[3])
        >>> nested = TED2Nested()(ted)
        >>> nested.batch_size, [o.tolist() for o in nested["obs"].unbind()]
        (torch.Size([2]), [[0.0, 1.0], [1.0, 2.0, 3.0]])
        >>> bool((Nested2TED()(nested) == ted).all())
        True
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def __call__(self, data: TensorDictBase, path=None) -> TensorDictBase:
        flat = super().__call__(data)
        done = flat.get(self._step_done_key)
        n = done.shape[0]
        ends = self._ends(_step_flags(done, n, self._step_done_key))
        lengths = torch.diff(
            ends.nonzero().squeeze(-1), prepend=torch.tensor([-1], device=ends.device)
        ).tolist()
        out = TensorDict(batch_size=[len(lengths)], device=flat.device)
        for key in _leaves(flat):
            value = flat.get(key)
            if key in (self.shift_key, self.is_full_key):
                out.set_non_tensor(key, value.item())
                continue
            sizes = lengths if value.shape[0] == n else [length + 1 for length in lengths]
            out.set(key, _nested(list(value.split(sizes))) if sizes else value[:0])
        return out


class Nested2TED(Flat2TED):
    """Rebuilds TED data from the nested layout of :class:`TED2Nested` (its inverse).

    Takes the arguments of :class:`TED2Flat`; ``out`` as in :class:`Flat2TED`.
    """

    def __call__(self, data: TensorDictBase, out: TensorDictBase | None = None) -> TensorDictBase:
        self._check_td(data, "a nested")
        flat = TensorDict(batch_size=[], device=data.device)
        for key in _leaves(data):
            if key in (self.shift_key, self.is_full_key):
                flat.set(key, torch.tensor(data.get_non_tensor(key)))
                continue
            value = data.get(key)
            flat.set(key, torch.cat(value.unbind(0)) if value.is_nested else value)
        return super().__call__(flat, out=out)


class H5Split:
    """Stores each nested entry as one dense tensor plus its per-component lengths (under ``"_lengths"``).

    HDF5 files hold no nested tensors: this turns the output of :class:`TED2Nested` into plain tensors that
    :class:`tensordict.PersistentTensorDict` can write; :class:`H5Combine` reverses it. Non-tensor entries
    become 0-d tensors.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import H5Combine, H5Split
        >>> nested = TensorDict({"obs": torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)])}, batch_size=[2])
        >>> split = H5Split()(nested)
        >>> split["obs"], split["_lengths", "obs"]
        (tensor([0., 0., 1., 1., 1.]), tensor([2, 3]))
        >>> [t.tolist() for t in H5Combine()(split)["obs"].unbind()]
        [[0.0, 0.0], [1.0, 1.0, 1.0]]
    """

    def __call__(self, data: TensorDictBase, path=None) -> TensorDictBase:
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"H5Split takes a TensorDict, got {type(data).__name__}.")
        out = TensorDict(batch_size=[], device=data.device)
        for key in _leaves(data):
            if key[0] == _LENGTHS:
                raise ValueError(f"H5Split stores lengths under {_LENGTHS!r}: the data may not hold {key!r}.")
            value = data.get(key)
            if not isinstance(value, torch.Tensor):
                out.set(key, torch.tensor(data.get_non_tensor(key)))
            elif value.is_nested:
                parts = value.unbind(0)
                out.set(key, torch.cat(parts))
                out.set((_LENGTHS, *key), torch.tensor([p.shape[0] for p in parts], dtype=torch.long))
            else:
                out.set(key, value)
        return out


class H5Combine:
    """Rebuilds the nested entries that :class:`H5Split` stored densely (its inverse).

    Entries listed under ``"_lengths"`` become nested tensors; the result has batch size ``[K]`` (the number of
    components) and the 0-d entries become non-tensor entries, as :class:`TED2Nested` writes them.
    """

    def __call__(self, data: TensorDictBase, out=None) -> TensorDictBase:
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"H5Combine takes a TensorDict, got {type(data).__name__}.")
        lengths = data.get(_LENGTHS, None)
        length_keys = [] if lengths is None else _leaves(lengths)
        counts = {len(lengths.get(k)) for k in length_keys}
        if len(counts) > 1:
            raise ValueError(
                f"The entries under {_LENGTHS!r} disagree on the number of components: {sorted(counts)}."
            )
        result = TensorDict(batch_size=[counts.pop()] if counts else [], device=data.device)
        for key in _leaves(data):
            if key[0] == _LENGTHS:
                continue
            value = data.get(key)
            if key in length_keys:
                sizes = lengths.get(key).tolist()
                if sum(sizes) != value.shape[0]:
                    raise ValueError(
                        f"The entry {key!r} has {value.shape[0]} rows but its lengths add up to {sum(sizes)}."
                    )
                result.set(key, _nested(list(value.split(sizes))))
            elif value.ndim == 0:
                result.set_non_tensor(key, value.item())
            else:
                result.set(key, value)
        return result
