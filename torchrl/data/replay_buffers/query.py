"""Trajectory queries over a replay buffer (Trajectory, traj, TrajectoryPredicate, ...). TorchRL's module path.

Data model. A query splits transitions into trajectories (runs of consecutive steps of one episode) and keeps
those a predicate accepts. The storage is read once, in time order (oldest step first: after a ring buffer
wrapped, the oldest trajectory may be cut at its head, and one written across the physical end of the ring is
returned whole); an ``ndim=2`` storage (``[time, envs]``) is read one env column after the other, so every
trajectory is one contiguous run ``[start, start + length)`` of that *flat* data. Trajectories end where the
trajectory id changes or where an end-of-episode flag is set, and at the newest step of each column (the split
lives in :mod:`torchrl.data.replay_buffers.trajectories.split`).

Predicates built from :data:`traj` (``traj.length > 5``, ``(traj.reward > 0).any()``, combined with ``&``,
``|``, ``~``) are evaluated for every trajectory at once with segment reductions over the flat data (no Python
loop over steps or trajectories) and declare the entries they read, so a query fetches only those (with their
``("next", key)`` twins) and runs only the transforms that write them. A plain callable (or a
:class:`TrajectoryPredicate` of one) is *opaque*: it is called once per trajectory, on data that went through the
whole transform chain.
"""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Callable, Iterator

import torch
from tensordict import TensorClass, TensorDict, TensorDictBase, lazy_stack, unravel_key

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers.storages import ListStorage, TensorStorage
from torchrl.data.replay_buffers.trajectories.ends import time_ordered_runs
from torchrl.data.replay_buffers.trajectories.layout import flat_storage_index
from torchrl.data.replay_buffers.trajectories.split import (
    fragmented_keys,
    fragmented_split,
    signal_keys,
    split_signal,
    split_streams,
)
from torchrl.envs.transforms.transforms import Compose

__all__ = [
    "Trajectory",
    "traj",
    "TrajectoryPredicate",
    "iter_trajectories",
    "filter_trajectories",
    "query_replay_buffer",
]

QUERY_NOT_TENSORDICT = TorchRLPhrase(
    TypeError,
    "expects a TensorDictBase",
    "{func} expects a TensorDictBase of transitions (one batch dim = time), got {got}. Wrap the data in a "
    "TensorDict, or query the buffer with rb.query(...).",
)
QUERY_BATCH_DIMS = TorchRLPhrase(
    ValueError,
    "single batch dimension",
    "{what} needs data with a single batch dimension (time), got batch_size={batch_size}. Index one "
    "environment (data[:, i]) or flatten it (data.reshape(-1)) first.",
)
QUERY_UNREDUCED = TorchRLPhrase(
    TypeError,
    r"Call \.any\(\) or \.all\(\)",
    "{expr} compares each step, not a trajectory: it has one value per step. Call .any() or .all() to "
    "reduce it to one bool per trajectory, e.g. ({expr}).any().",
)
QUERY_LIST_STORAGE_TYPE = TorchRLPhrase(
    TypeError,
    "requires a tensordict-backed storage",
    "ReplayBuffer.query() requires a tensordict-backed storage or a ListStorage of TensorDicts; the stored "
    "items are {got}. Store TensorDicts (e.g. TensorDictReplayBuffer with LazyTensorStorage).",
)
QUERY_LIST_STORAGE_BATCHED = TorchRLPhrase(
    TypeError,
    r"expects single-transition \(scalar\) items",
    "ReplayBuffer.query() on a ListStorage expects single-transition (scalar) items, got an item with "
    "batch_size={batch_size}. Write transitions with rb.extend(td) (one item per step), not whole rollouts "
    "with rb.add(td).",
)


# -- one trajectory ------------------------------------------------------------------------------------------
def _lookup(data: TensorDictBase, key):
    """``data[key]``, else ``data["next", key]`` for a str key; ``None`` when neither is stored."""
    value = data.get(key, None)
    if value is None and isinstance(key, str):
        value = data.get(("next", key), None)
    return value


class Trajectory(TensorClass["nocast"]):
    """One trajectory: ``data`` holds its ``T`` transitions (a TensorDict with one batch dim, time).

    What :func:`filter_trajectories`, :func:`iter_trajectories` and ``rb.query`` return, and what an opaque
    predicate receives. Entries read as attributes: ``t.observation`` (root first), ``t.reward`` (the
    ``("next", "reward")`` entry when there is no root one); ``t["next", "obs"]`` reads a nested key, and any
    other index (``t[0]``, ``t[2:5]``) indexes time and returns a :class:`Trajectory`.

    Trajectories stack like any tensorclass: ``torch.stack`` of views of one length gives a ``Trajectory`` of
    batch size ``[N, T]`` (``length`` is ``T``, entries are stacked), ``tensordict.lazy_stack`` of views of any
    lengths gives batch size ``[N, -1]`` whose ``stacked[i]`` is the ``i``-th trajectory again (read a ragged
    entry with ``stacked.data.get(key, as_list=True)``). ``Trajectory(t)`` of a trajectory wraps the same data.

    Args:
        data (TensorDictBase or Trajectory): the transitions, with exactly one batch dim (``ValueError``
            otherwise).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Trajectory
        >>> t = Trajectory(TensorDict({"obs": torch.arange(4), ("next", "reward"): torch.ones(4, 1)}, [4]))
        >>> t.length, len(t), float(t.total_reward), t.obs.tolist()
        (4, 4, 4.0, [0, 1, 2, 3])
        >>> t[1:3]
        Trajectory(length=2, keys=['obs', 'next'])
    """

    data: TensorDictBase

    @property
    def length(self) -> int:
        """The number of transitions ``T``."""
        return int(self.data.batch_size[-1]) if self.data.batch_dims else 1

    @property
    def total_reward(self) -> torch.Tensor:
        """The sum of the ``reward`` entry (root, else ``("next", "reward")``) over the trajectory."""
        reward = self.get("reward")
        if reward is None:
            raise KeyError(
                "Trajectory.total_reward reads 'reward' (root, else ('next', 'reward')); the trajectory holds "
                f"neither. Its keys are {_key_list(self.data)}."
            )
        return reward.sum()

    def get(self, key, default=None):
        """The entry ``key`` (root first, then ``("next", key)`` for a str key), or ``default``."""
        value = _lookup(self.data, key)
        return default if value is None else value

    def keys(self, *args, **kwargs):
        """The keys of :attr:`data` (same arguments as ``TensorDict.keys``)."""
        return self.data.keys(*args, **kwargs)

    def __getitem__(self, index):
        if isinstance(index, str) or (isinstance(index, tuple) and index and all(isinstance(i, str) for i in index)):
            return self.data[index]
        return super().__getitem__(index)

    def __repr__(self) -> str:
        return f"Trajectory(length={self.length}, keys={list(self.data.keys())})"  # insertion order


def _key_list(data: TensorDictBase) -> list:
    return sorted(data.keys(), key=str)


_tensorclass_init = Trajectory.__init__
_tensorclass_getattr = Trajectory.__getattr__


@functools.wraps(_tensorclass_init)
def _trajectory_init(self, *args, **kwargs):
    _tensorclass_init(self, *args, **kwargs)
    data = self.data
    if isinstance(data, Trajectory):  # Trajectory(t): the same transitions, not a trajectory of a trajectory
        data = self.data = data.data
    if not isinstance(data, TensorDictBase):
        raise QUERY_NOT_TENSORDICT.error(func="Trajectory", got=type(data).__name__)
    if data.batch_dims != 1:
        raise QUERY_BATCH_DIMS.error(what="Trajectory", batch_size=list(data.batch_size))
    if not self.batch_size:
        self.batch_size = data.batch_size


def _trajectory_getattr(self, name: str):
    try:
        return _tensorclass_getattr(self, name)
    except AttributeError:
        if name.startswith("_"):
            raise
    value = _lookup(self.data, name)
    if value is None:
        raise AttributeError(
            f"Trajectory has no entry {name!r} (looked up {name!r} and ('next', {name!r})); its keys are "
            f"{_key_list(self.data)}."
        )
    return value


Trajectory.__init__ = _trajectory_init  # the tensorclass decorator sets both: ours wrap its versions
Trajectory.__getattr__ = _trajectory_getattr


# -- evaluation context: many trajectories laid end to end ----------------------------------------------------
class _Segments:
    """Trajectories as runs of a flat TensorDict: ``starts``/``lengths`` ``[N]``, ``segment`` ``[P]``."""

    def __init__(self, data: TensorDictBase, starts: torch.Tensor, lengths: torch.Tensor):
        self.data, self.starts, self.lengths = data, starts, lengths
        self.count = int(starts.numel())
        self.segment = torch.repeat_interleave(torch.arange(self.count), lengths)

    @classmethod
    def of(cls, trajectory: Trajectory) -> _Segments:
        n = trajectory.length
        return cls(trajectory.data, torch.zeros(1, dtype=torch.long), torch.tensor([n]))

    def field(self, key) -> torch.Tensor:
        value = _lookup(self.data, key)
        if value is None:
            shown = key if isinstance(key, str) else tuple(key)
            raise KeyError(
                f"Key {shown!r} not found in trajectory (looked up root and ('next', ...)); the data holds "
                f"{_key_list(self.data)}."
            )
        return torch.as_tensor(value)

    def per_step(self, value: torch.Tensor) -> torch.Tensor:
        """``[P, *feature]`` -> ``[P, F]`` (one row per step)."""
        return value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)

    def segment_sum(self, value: torch.Tensor) -> torch.Tensor:
        steps = self.per_step(value)
        if steps.dtype == torch.bool:
            steps = steps.long()
        out = torch.zeros(self.count, dtype=steps.dtype, device=steps.device)
        return out.index_add_(0, self.segment.to(steps.device), steps.sum(-1))

    def segment_extreme(self, value: torch.Tensor, reduce: str) -> torch.Tensor:
        steps = self.per_step(value)
        steps = steps.amax(-1) if reduce == "amax" else steps.amin(-1)
        if steps.dtype == torch.bool:
            steps = steps.long()
        out = torch.empty(self.count, dtype=steps.dtype, device=steps.device)
        return out.scatter_reduce_(0, self.segment.to(steps.device), steps, reduce=reduce, include_self=False)

    def broadcast(self, value):
        """A per-trajectory ``[N]`` value repeated over the steps ``[P]`` (numbers pass through)."""
        return value[self.segment.to(value.device)] if isinstance(value, torch.Tensor) else value


def _scalar(value: torch.Tensor, key, where: str) -> torch.Tensor:
    if value.ndim > 1 and value[0].numel() != 1:
        raise ValueError(
            f"traj[{key!r}].{where}() gives one value per trajectory only for an entry with one element per "
            f"step; {key!r} has {value[0].numel()} (shape {list(value.shape[1:])} per step). Compare steps "
            f"instead, e.g. (traj[{key!r}] > x).any(), or use .sum()/.max()."
        )
    return value.reshape(value.shape[0])


# -- expressions ---------------------------------------------------------------------------------------------
def _operand(other, segments: _Segments):
    """The value of an operand of a comparison or arithmetic: an expression, a tensor or a number."""
    if isinstance(other, _Scalar):
        return other.evaluate(segments)
    if isinstance(other, (numbers.Number, torch.Tensor)):
        return other
    raise TypeError(
        f"A traj expression compares with numbers, tensors or other traj scalars (traj.length, "
        f"traj.reward.sum(), ...), got {type(other).__name__}."
    )


def _operand_keys(other) -> frozenset:
    return other.required_keys() if isinstance(other, _Scalar) else frozenset()


_COMPARISONS = {"gt": (operator.gt, ">"), "ge": (operator.ge, ">="), "lt": (operator.lt, "<"),
                "le": (operator.le, "<="), "eq": (operator.eq, "=="), "ne": (operator.ne, "!=")}  # fmt: skip
_ARITHMETIC = {"add": (operator.add, "+"), "sub": (operator.sub, "-"), "mul": (operator.mul, "*"),
               "truediv": (operator.truediv, "/")}  # fmt: skip


class _Scalar:
    """One value per trajectory (``traj.length``, ``traj.reward.sum()``); comparing it gives a predicate."""

    __hash__ = None  # comparisons build predicates, so expressions are not hashable

    def __init__(self, evaluate: Callable[[_Segments], torch.Tensor], keys: frozenset, text: str):
        self._evaluate, self._keys, self._text = evaluate, keys, text

    def evaluate(self, segments: _Segments) -> torch.Tensor:
        return self._evaluate(segments)

    def required_keys(self) -> frozenset:
        return self._keys

    def __repr__(self) -> str:
        return self._text

    def _compare(self, other, name: str) -> TrajectoryPredicate:
        op, symbol = _COMPARISONS[name]

        def batched(segments: _Segments) -> torch.Tensor:
            return torch.as_tensor(op(self.evaluate(segments), _operand(other, segments))).bool()

        return _predicate(batched, f"{self._text} {symbol} {other!r}", self._keys | _operand_keys(other))

    def _arith(self, other, name: str, reflected: bool = False) -> _Scalar:
        op, symbol = _ARITHMETIC[name]
        if not isinstance(other, (_Scalar, numbers.Number, torch.Tensor)):
            _operand(other, None)  # raises the TypeError now, not at evaluation

        def evaluate(segments: _Segments) -> torch.Tensor:
            a, b = self.evaluate(segments), _operand(other, segments)
            return op(b, a) if reflected else op(a, b)

        text = f"({other!r} {symbol} {self._text})" if reflected else f"({self._text} {symbol} {other!r})"
        return _Scalar(evaluate, self._keys | _operand_keys(other), text)

    def __gt__(self, other):
        return self._compare(other, "gt")

    def __ge__(self, other):
        return self._compare(other, "ge")

    def __lt__(self, other):
        return self._compare(other, "lt")

    def __le__(self, other):
        return self._compare(other, "le")

    def __eq__(self, other):
        return self._compare(other, "eq")

    def __ne__(self, other):
        return self._compare(other, "ne")

    def __add__(self, other):
        return self._arith(other, "add")

    def __radd__(self, other):
        return self._arith(other, "add", reflected=True)

    def __sub__(self, other):
        return self._arith(other, "sub")

    def __rsub__(self, other):
        return self._arith(other, "sub", reflected=True)

    def __mul__(self, other):
        return self._arith(other, "mul")

    def __rmul__(self, other):
        return self._arith(other, "mul", reflected=True)

    def __truediv__(self, other):
        return self._arith(other, "truediv")

    def __rtruediv__(self, other):
        return self._arith(other, "truediv", reflected=True)

    def __bool__(self):
        raise TypeError(f"{self._text} has one value per trajectory: compare it (e.g. {self._text} > 0).")


class _Field:
    """One entry, one value per step (``traj.reward``): reduce it to a scalar, or compare it step by step."""

    __hash__ = None

    def __init__(self, key):
        self.key = unravel_key(key)

    def __repr__(self) -> str:
        return f"traj.{self.key}" if isinstance(self.key, str) else f"traj[{self.key!r}]"

    def required_keys(self) -> frozenset:
        return frozenset({self.key})

    def _reduce(self, name: str, fn: Callable[[_Segments, torch.Tensor], torch.Tensor]) -> _Scalar:
        key = self.key
        return _Scalar(lambda s: fn(s, s.field(key)), self.required_keys(), f"{self!r}.{name}()")

    def sum(self) -> _Scalar:
        """The sum over the trajectory's steps (and the entry's elements); a count for flags."""
        return self._reduce("sum", lambda s, v: s.segment_sum(v))

    def mean(self) -> _Scalar:
        """The mean over the trajectory's steps (and elements), as a float."""

        def mean(s: _Segments, v: torch.Tensor) -> torch.Tensor:
            per_step = s.per_step(v).shape[-1]
            return s.segment_sum(v).double() / (s.lengths.to(v.device) * per_step).double()

        return self._reduce("mean", mean)

    def max(self) -> _Scalar:
        """The largest value over the trajectory."""
        return self._reduce("max", lambda s, v: s.segment_extreme(v, "amax"))

    def min(self) -> _Scalar:
        """The smallest value over the trajectory."""
        return self._reduce("min", lambda s, v: s.segment_extreme(v, "amin"))

    def first(self) -> _Scalar:
        """The value at the first step (the entry must hold one element per step)."""
        key = self.key
        return self._reduce("first", lambda s, v: _scalar(v[s.starts.to(v.device)], key, "first"))

    def last(self) -> _Scalar:
        """The value at the last step (the entry must hold one element per step)."""
        key = self.key
        return self._reduce("last", lambda s, v: _scalar(v[(s.starts + s.lengths - 1).to(v.device)], key, "last"))

    def _compare(self, other, name: str) -> _Steps:
        op, symbol = _COMPARISONS[name]
        key = self.key

        def steps(segments: _Segments) -> torch.Tensor:
            value = segments.field(key)
            other_value = _operand(other, segments)
            if isinstance(other, _Scalar):  # one value per trajectory, repeated over its steps
                other_value = segments.broadcast(other_value)
                other_value = other_value.reshape(other_value.shape + (1,) * (value.ndim - 1))
            return torch.as_tensor(op(value, other_value)).bool()

        return _Steps(steps, self.required_keys() | _operand_keys(other), f"{self!r} {symbol} {other!r}")

    def __gt__(self, other):
        return self._compare(other, "gt")

    def __ge__(self, other):
        return self._compare(other, "ge")

    def __lt__(self, other):
        return self._compare(other, "lt")

    def __le__(self, other):
        return self._compare(other, "le")

    def __eq__(self, other):
        return self._compare(other, "eq")

    def __ne__(self, other):
        return self._compare(other, "ne")

    def any(self) -> TrajectoryPredicate:
        """Whether any step's value is true (for flag entries: ``traj.done.any()``)."""
        return _Steps(lambda s: s.field(self.key).bool(), self.required_keys(), repr(self)).any()

    def all(self) -> TrajectoryPredicate:
        """Whether every step's value is true."""
        return _Steps(lambda s: s.field(self.key).bool(), self.required_keys(), repr(self)).all()

    def __bool__(self):
        raise QUERY_UNREDUCED.error(expr=repr(self))


class _Steps:
    """A comparison made step by step (``traj.reward > 0``): reduce it with ``.any()`` or ``.all()``."""

    __hash__ = None

    def __init__(self, steps: Callable[[_Segments], torch.Tensor], keys: frozenset, text: str):
        self._steps, self._keys, self._text = steps, keys, text

    def __repr__(self) -> str:
        return self._text

    def required_keys(self) -> frozenset:
        return self._keys

    def _reduce(self, name: str, all_steps: bool) -> TrajectoryPredicate:
        def batched(segments: _Segments) -> torch.Tensor:
            flags = segments.per_step(self._steps(segments))
            if all_steps:
                hits = segments.segment_sum(~flags.all(-1)) == 0
            else:
                hits = segments.segment_sum(flags.any(-1)) > 0
            return hits

        return _predicate(batched, f"({self._text}).{name}()", self._keys)

    def any(self) -> TrajectoryPredicate:
        """True for a trajectory in which the comparison holds at some step."""
        return self._reduce("any", all_steps=False)

    def all(self) -> TrajectoryPredicate:
        """True for a trajectory in which the comparison holds at every step."""
        return self._reduce("all", all_steps=True)

    def _combine(self, other, op, symbol: str) -> _Steps:
        if not isinstance(other, (_Steps, _Field)):
            raise QUERY_UNREDUCED.error(expr=self._text)
        other = other if isinstance(other, _Steps) else _Steps(lambda s: s.field(other.key).bool(),
                                                               other.required_keys(), repr(other))  # fmt: skip
        return _Steps(lambda s: op(self._steps(s), other._steps(s)), self._keys | other._keys,
                      f"({self._text} {symbol} {other._text})")  # fmt: skip

    def __and__(self, other):
        return self._combine(other, operator.and_, "&")

    def __or__(self, other):
        return self._combine(other, operator.or_, "|")

    def __invert__(self):
        return _Steps(lambda s: ~self._steps(s), self._keys, f"~{self._text}")

    def __bool__(self):
        raise QUERY_UNREDUCED.error(expr=self._text)

    def __call__(self, *args, **kwargs):
        raise QUERY_UNREDUCED.error(expr=self._text)


class _Traj:
    """The type of :data:`traj`."""

    __hash__ = None

    @property
    def length(self) -> _Scalar:
        """The number of steps of the trajectory."""
        return _Scalar(lambda s: s.lengths.clone(), frozenset(), "traj.length")

    @property
    def total_reward(self) -> _Scalar:
        """The sum of ``reward`` (root, else ``("next", "reward")``) over the trajectory."""
        return _Scalar(lambda s: s.segment_sum(s.field("reward")), frozenset({"reward"}), "traj.total_reward")

    def __getattr__(self, name: str) -> _Field:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Field(name)

    def __getitem__(self, key) -> _Field:
        return _Field(key)

    def __repr__(self) -> str:
        return "traj"


traj = _Traj()
"""Builds trajectory predicates: ``traj.length``, ``traj.total_reward``, ``traj.<entry>`` / ``traj[nested_key]``.

An entry reduces to one value per trajectory (``.sum() .mean() .max() .min() .first() .last()``), which compares
into a :class:`TrajectoryPredicate`; an entry compared directly (``traj.reward > 0``) is a step-by-step
comparison that ``.any()`` or ``.all()`` reduces. Predicates combine with ``&``, ``|`` and ``~``.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import filter_trajectories, traj
    >>> done = torch.tensor([0, 1, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)
    >>> data = TensorDict({"traj_ids": torch.tensor([0, 0, 1, 1, 1]),
    ...     ("next", "reward"): torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0]).unsqueeze(-1)}, batch_size=[5])
    >>> [t.length for t in filter_trajectories(data, (traj.reward > 0).any())]
    [2]
    >>> [t.length for t in filter_trajectories(data, (traj.length >= 3) & (traj.total_reward == 0))]
    [3]
"""


# -- predicates ----------------------------------------------------------------------------------------------
class TrajectoryPredicate:
    """A test on one trajectory: ``predicate(trajectory) -> bool``; combine with ``&``, ``|`` and ``~``.

    Built by comparing :data:`traj` expressions (those are evaluated for all trajectories at once and declare the
    entries they read), or from any function of a :class:`Trajectory`.

    Args:
        fn (callable): ``fn(trajectory) -> bool``.
        description (str): what the predicate tests, shown in its repr. Defaults to ``"predicate"``.
        keys (iterable of NestedKey, optional): the entries ``fn`` reads. With it a query fetches only those
            entries (and their ``("next", key)`` twins) to evaluate ``fn``; without it (``None``) the predicate is
            opaque and sees every entry. Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Trajectory, TrajectoryPredicate, traj
        >>> long = TrajectoryPredicate(lambda t: t.length > 2, "longer than 2")
        >>> t = Trajectory(TensorDict({("next", "reward"): torch.ones(3, 1)}, batch_size=[3]))
        >>> long(t), (long & (traj.total_reward > 5))(t), (~long | (traj.total_reward > 2))(t)
        (True, False, True)
        >>> long, (long & (traj.length > 1)).required_keys()
        (TrajectoryPredicate(longer than 2), None)
    """

    def __init__(self, fn: Callable[[Trajectory], bool], description: str = "predicate", keys=None):
        if not callable(fn):
            raise TypeError(f"`fn` must be a callable trajectory -> bool, got {type(fn).__name__}.")
        if isinstance(fn, _Steps):
            raise QUERY_UNREDUCED.error(expr=repr(fn))
        if not isinstance(description, str):
            raise TypeError(f"`description` must be a str, got {type(description).__name__}.")
        self.fn = fn
        self.description = description
        self._keys = None if keys is None else frozenset(unravel_key(k) for k in keys)
        self._batched: Callable[[_Segments], torch.Tensor] | None = None

    def required_keys(self) -> frozenset | None:
        """The entries the predicate reads; ``None`` when it is opaque (it may read any entry)."""
        return self._keys

    def __call__(self, trajectory: Trajectory) -> bool:
        if isinstance(trajectory, TensorDictBase):
            trajectory = Trajectory(trajectory)
        if self._batched is not None:
            return bool(self._batched(_Segments.of(trajectory))[0])
        return bool(self.fn(trajectory))

    def evaluate_many(self, segments: _Segments, todo: torch.Tensor) -> torch.Tensor:
        """The predicate on every trajectory of ``segments`` (a bool ``[N]``), computed where ``todo`` is true.

        Batched predicates compute every trajectory in one pass; opaque ones are called on the ``todo`` ones.
        """
        if self._batched is not None:
            return self._batched(segments).reshape(segments.count).to("cpu")
        out = torch.zeros(segments.count, dtype=torch.bool)
        for i in todo.nonzero().squeeze(-1).tolist():
            start, length = int(segments.starts[i]), int(segments.lengths[i])
            out[i] = bool(self.fn(Trajectory(segments.data[start : start + length])))
        return out

    def __and__(self, other) -> TrajectoryPredicate:
        other = as_predicate(other)
        pred = TrajectoryPredicate(lambda t: self(t) and other(t), f"({self.description}) & ({other.description})",
                                   keys=_union_keys(self, other))  # fmt: skip
        pred._combined = ("and", self, other)
        if self._batched is not None and other._batched is not None:
            pred._batched = lambda s: self._batched(s).reshape(-1).cpu() & other._batched(s).reshape(-1).cpu()
        return pred

    def __or__(self, other) -> TrajectoryPredicate:
        other = as_predicate(other)
        pred = TrajectoryPredicate(lambda t: self(t) or other(t), f"({self.description}) | ({other.description})",
                                   keys=_union_keys(self, other))  # fmt: skip
        pred._combined = ("or", self, other)
        if self._batched is not None and other._batched is not None:
            pred._batched = lambda s: self._batched(s).reshape(-1).cpu() | other._batched(s).reshape(-1).cpu()
        return pred

    def __rand__(self, other) -> TrajectoryPredicate:
        return as_predicate(other) & self

    def __ror__(self, other) -> TrajectoryPredicate:
        return as_predicate(other) | self

    def __invert__(self) -> TrajectoryPredicate:
        pred = TrajectoryPredicate(lambda t: not self(t), f"~({self.description})", keys=self._keys)
        pred._combined = ("not", self, None)
        if self._batched is not None:
            pred._batched = lambda s: ~self._batched(s).reshape(-1).cpu()
        return pred

    _combined: tuple | None = None

    def select(self, segments: _Segments, todo: torch.Tensor | None = None) -> torch.Tensor:
        """The trajectories of ``segments`` that pass, as a bool ``[N]``, short-circuiting opaque operands.

        ``todo`` (bool ``[N]``) marks the trajectories whose result matters; an opaque operand is only called on
        those (``a & b`` calls ``b`` where ``a`` passed).
        """
        todo = torch.ones(segments.count, dtype=torch.bool) if todo is None else todo
        if self._batched is not None or self._combined is None:
            return self.evaluate_many(segments, todo) & todo
        kind, left, right = self._combined
        first = left.select(segments, todo)
        if kind == "not":
            return ~first & todo
        if kind == "and":
            return first & right.select(segments, first)
        return first | right.select(segments, todo & ~first)

    def __bool__(self):
        raise TypeError(
            f"{self!r} tests a trajectory: call it on one (predicate(trajectory)), or pass it to "
            f"filter_trajectories / rb.query. Combine predicates with &, | and ~ (not and/or/not)."
        )

    def __repr__(self) -> str:
        return f"TrajectoryPredicate({self.description})"


def _union_keys(a: TrajectoryPredicate, b: TrajectoryPredicate) -> frozenset | None:
    if a.required_keys() is None or b.required_keys() is None:
        return None
    return a.required_keys() | b.required_keys()


def _predicate(batched: Callable[[_Segments], torch.Tensor], description: str, keys: frozenset):
    pred = TrajectoryPredicate(lambda t: bool(batched(_Segments.of(t))[0]), description, keys=keys)
    pred._batched = batched
    return pred


def as_predicate(predicate) -> TrajectoryPredicate:
    """``predicate`` as a :class:`TrajectoryPredicate`: predicates pass through, callables are wrapped (opaque).

    A step-by-step comparison (``traj.reward > 0``) raises ``TypeError``: reduce it with ``.any()``/``.all()``.
    """
    if isinstance(predicate, TrajectoryPredicate):
        return predicate
    if isinstance(predicate, (_Steps, _Field)):
        raise QUERY_UNREDUCED.error(expr=repr(predicate))
    if isinstance(predicate, _Scalar):
        raise TypeError(f"{predicate!r} is one value per trajectory, not a test: compare it (e.g. {predicate!r} > 0).")
    if callable(predicate):
        name = getattr(predicate, "__name__", type(predicate).__name__)
        return TrajectoryPredicate(predicate, description=name)
    raise TypeError(
        f"`predicate` must be a TrajectoryPredicate (e.g. traj.length > 10), a callable trajectory -> bool, or "
        f"None, got {type(predicate).__name__}."
    )


# -- iterating and filtering (the split itself: trajectories/split.py) ---------------------------------------
def iter_trajectories(
    data: TensorDictBase, trajectory_key=None, *, fragmented: bool = False, step_key="step_count"
) -> Iterator[Trajectory]:
    """Yields the trajectories of ``data`` (transitions along its one batch dim) as :class:`Trajectory` views.

    A trajectory ends where the trajectory id changes, else at an end-of-episode flag; the last step ends one
    too (a missing final ``done`` still closes it). The signal is, first found: ``trajectory_key``;
    ``("collector", "traj_ids")``, ``"traj_ids"`` or ``"episode"``; the OR of the ``("next", ...)`` flags
    ``done``/``terminated``/``truncated``, else of the root ones (a ``UserWarning`` says so). Each trajectory
    wraps the view ``data[start:stop+1]`` (writing into it writes into ``data``).

    With ``fragmented=True`` the steps of several trajectories may be interleaved in ``data`` (several
    environments or collectors writing one stream): each trajectory id's steps are gathered in the order of
    ``step_key``, and a missing step ends a trajectory as an end flag does (done flags play no role). The
    trajectories are then views of one reordered copy of ``data``, listed by their earliest written step.

    Args:
        data (TensorDictBase): the transitions, with one batch dim.
        trajectory_key (NestedKey, optional): the entry holding trajectory ids (``KeyError`` if absent).
            Defaults to ``None``.

    Keyword Args:
        fragmented (bool): whether trajectories may be interleaved (needs a trajectory id entry and
            ``step_key``). Defaults to ``False``.
        step_key (NestedKey): with ``fragmented=True``, the entry holding each step's number in its trajectory.
            Defaults to ``"step_count"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import iter_trajectories
        >>> data = TensorDict(episode=torch.tensor([3, 3, 3, 4, 4, 7]), batch_size=[6])
        >>> [t.episode.tolist() for t in iter_trajectories(data)]
        [[3, 3, 3], [4, 4], [7]]
        >>> interleaved = TensorDict(episode=torch.tensor([0, 1, 0, 1, 0]), step_count=torch.tensor([0, 0, 1, 1, 2]),
        ...                          batch_size=[5])
        >>> [(t.length, t.step_count.tolist()) for t in iter_trajectories(interleaved, fragmented=True)]
        [(3, [0, 1, 2]), (2, [0, 1])]
    """
    _check_fragmented(fragmented)
    if not isinstance(data, TensorDictBase):
        raise QUERY_NOT_TENSORDICT.error(func="iter_trajectories", got=type(data).__name__)
    if data.batch_dims != 1:
        raise QUERY_BATCH_DIMS.error(what="iter_trajectories", batch_size=list(data.batch_size))
    if data.batch_size[0] == 0:
        return
    data, starts, lengths = _runs(data, trajectory_key, fragmented, step_key)
    for start, length in zip(starts.tolist(), lengths.tolist()):
        yield Trajectory(data[start : start + length])


def _check_fragmented(fragmented) -> None:
    if not isinstance(fragmented, bool):
        raise TypeError(f"`fragmented` must be a bool, got {fragmented!r} ({type(fragmented).__name__}).")


def _runs(data: TensorDictBase, trajectory_key, fragmented: bool, step_key) -> tuple:
    """``(data, starts, lengths)``: the trajectories as runs of ``data``, reordered first when fragmented."""
    if not fragmented:
        kind, values = split_signal(data, trajectory_key)
        return (data, *time_ordered_runs(values, is_done=kind == "end"))
    order, starts, lengths = fragmented_split(data, trajectory_key, step_key)
    return data[order], starts, lengths


def filter_trajectories(
    data: TensorDictBase, predicate=None, *, trajectory_key=None, fragmented: bool = False, step_key="step_count"
) -> list[Trajectory]:
    """The trajectories of ``data`` (split as :func:`iter_trajectories` does) that ``predicate`` accepts.

    Args:
        data (TensorDictBase): the transitions, with one batch dim.
        predicate (TrajectoryPredicate or callable, optional): the test; :data:`traj` predicates are evaluated
            for all trajectories at once. ``None`` keeps every trajectory. Defaults to ``None``.

    Keyword Args:
        trajectory_key (NestedKey, optional): the entry holding trajectory ids. Defaults to ``None``.
        fragmented (bool): whether trajectories may be interleaved, gathered by ``step_key`` (see
            :func:`iter_trajectories`). Defaults to ``False``.
        step_key (NestedKey): the step numbers, with ``fragmented=True``. Defaults to ``"step_count"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import filter_trajectories, traj
        >>> data = TensorDict(episode=torch.tensor([0, 0, 1, 1, 1]), obs=torch.arange(5.0), batch_size=[5])
        >>> [t.obs.tolist() for t in filter_trajectories(data, traj.obs.max() > 3)]
        [[2.0, 3.0, 4.0]]
    """
    pred = None if predicate is None else as_predicate(predicate)
    _check_fragmented(fragmented)
    if not isinstance(data, TensorDictBase):
        raise QUERY_NOT_TENSORDICT.error(func="filter_trajectories", got=type(data).__name__)
    if data.batch_dims != 1:
        raise QUERY_BATCH_DIMS.error(what="filter_trajectories", batch_size=list(data.batch_size))
    if data.batch_size[0] == 0:
        return []
    return _keep(*_runs(data, trajectory_key, fragmented, step_key), pred)


def _keep(data: TensorDictBase, starts, lengths, pred) -> list[Trajectory]:
    if pred is not None:
        keep = pred.select(_Segments(data, starts, lengths))
        starts, lengths = starts[keep], lengths[keep]
    return [Trajectory(data[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]


# -- ReplayBuffer.query --------------------------------------------------------------------------------------
def _time_order(rb, storage) -> tuple:
    """``(index, n_cols)``: the storage index of the flat steps (oldest first, env columns end to end)."""
    if storage.ndim > 2:
        raise ValueError(
            f"ReplayBuffer.query() reads storages with ndim=1 or ndim=2 ([time, envs]); got ndim={storage.ndim}. "
            f"Query storage.flatten() data with filter_trajectories instead."
        )
    n_rows = storage.rows_written()
    n_cols = int(storage.shape[1]) if storage.ndim == 2 else 1
    full_list = isinstance(storage, ListStorage) and storage._is_full  # it does not track where it wrapped
    cursor = rb.writer.cursor if full_list else None
    return flat_storage_index(storage, n_rows, cursor=cursor), n_cols


def _read(storage, index, keys: set | None) -> TensorDictBase:
    """The steps at ``index`` (a copy): only ``keys`` (those present) when given, else every entry."""
    if isinstance(storage, ListStorage):
        items = storage.get(index)
        for item in items[:1]:
            if not isinstance(item, TensorDictBase):
                raise QUERY_LIST_STORAGE_TYPE.error(got=type(item).__name__)
            if item.batch_dims:
                raise QUERY_LIST_STORAGE_BATCHED.error(batch_size=list(item.batch_size))
        data = lazy_stack(list(items)) if items else TensorDict(batch_size=[0])
        return (data.select(*keys, strict=False) if keys is not None else data).clone()
    if keys is not None and isinstance(storage, TensorStorage):
        columns = {}
        for key in keys:
            column = storage.get_entry(key)
            if isinstance(column, torch.Tensor):
                columns[key] = column
        if columns:
            n = storage.rows_written()
            out = {}
            for key, column in columns.items():
                column, device = column[:n], column.device
                if storage.ndim == 1:
                    out[key] = column[index.to(device)]
                else:
                    out[key] = column[index[0].to(device), index[1].to(device)]
            size = index.numel() if storage.ndim == 1 else index[0].numel()
            return TensorDict(out, batch_size=[size])
    data = storage.get(index)
    if not isinstance(data, TensorDictBase):
        raise QUERY_LIST_STORAGE_TYPE.error(got=type(data).__name__)
    return data if keys is None else data.select(*keys, strict=False)


def _transforms(compose) -> list:
    """The buffer's transforms in order, nested :class:`Compose` flattened."""
    out = []
    for i in range(len(compose) if compose is not None else 0):
        t = compose[i]
        out.extend(_transforms(t) if isinstance(t, Compose) else [t])
    return out


def _needed(transforms: list, keys: frozenset) -> tuple[list, set | None]:
    """The transforms to run for the predicate's ``keys`` and the entries to read (``None``: all of them)."""
    needed = set()
    for key in keys:
        needed.add(key)
        if isinstance(key, str):
            needed.add(("next", key))
    chosen = []
    for i in range(len(transforms) - 1, -1, -1):
        t = transforms[i]
        out_keys = [unravel_key(k) for k in getattr(t, "out_keys", None) or []]
        if not out_keys:  # writes anything: run it and everything before it, on every entry
            return transforms[: i + 1] + chosen[::-1], None
        if needed.intersection(out_keys):
            chosen.append(t)
            needed.update(unravel_key(k) for k in getattr(t, "in_keys", None) or [])
    return chosen[::-1], needed


def _apply(transforms: list, data: TensorDictBase) -> TensorDictBase:
    for t in transforms:
        data = t(data)
    return data


def query_replay_buffer(
    rb, predicate=None, *, trajectory_key=None, fragmented: bool = False, step_key="step_count"
) -> list[Trajectory]:
    """What ``rb.query(predicate, *, trajectory_key=None)`` returns: the stored trajectories ``predicate`` accepts.

    The storage is read once, in time order (see the module docstring), and split as
    :func:`iter_trajectories` splits data (on the stored values); trajectories of an ``ndim=2`` storage come
    one env column after the other. With ``fragmented=True`` (several environments or collectors writing
    interleaved steps), each trajectory's steps are gathered in ``step_key`` order wherever they are stored
    (across the ring's wrap and env columns too), a missing step ending a trajectory; trajectories are listed
    by their oldest stored step, and the transforms see each trajectory's steps side by side, in step order.
    The predicate sees the values the buffer's transforms produce: for a
    :data:`traj` predicate only the entries it reads are fetched and only the transforms that write them run;
    an opaque predicate sees every entry after the whole chain. The accepted trajectories are returned with
    every entry, through the whole transform chain, oldest first.

    Args:
        rb (ReplayBuffer): the buffer (one built with delayed init is built).
        predicate (TrajectoryPredicate or callable, optional): the test; ``None`` returns every trajectory.
            Defaults to ``None``.

    Keyword Args:
        trajectory_key (NestedKey, optional): the entry holding trajectory ids. Defaults to ``None``.
        fragmented (bool): whether trajectories may be interleaved in the storage. Defaults to ``False``.
        step_key (NestedKey): the step numbers, with ``fragmented=True``. Defaults to ``"step_count"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, traj
        >>> from torchrl.data.replay_buffers.query import query_replay_buffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> ids = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
        >>> _ = rb.extend(TensorDict(traj_ids=ids, obs=torch.arange(8), batch_size=[8]))
        >>> _ = rb.extend(TensorDict(traj_ids=torch.full((4,), 2), obs=torch.arange(8, 12), batch_size=[4]))
        >>> [t.length for t in query_replay_buffer(rb)]  # capacity 10: the oldest trajectory lost 2 steps
        [3, 3, 4]
        >>> [t.obs.tolist() for t in query_replay_buffer(rb, traj.length > 3)]
        [[8, 9, 10, 11]]
    """
    pred = None if predicate is None else as_predicate(predicate)
    _check_fragmented(fragmented)
    storage = rb.storage
    if not len(storage):
        return []
    transforms = _transforms(rb.transform)
    keys = None if pred is None else pred.required_keys()
    chosen, read = (transforms, None) if keys is None else _needed(transforms, keys)
    with rb.write_lock:  # one consistent snapshot of the rows and of where the ring wrapped
        index, n_cols = _time_order(rb, storage)
        if fragmented:
            splitting = fragmented_keys(storage, trajectory_key, step_key)
        else:
            splitting = signal_keys(storage, trajectory_key)
        restricted = read is not None and splitting is not None
        raw = _read(storage, index, read | splitting if restricted else None)
    signal = raw.select(*splitting, strict=False) if splitting is not None else raw
    if fragmented:  # each trajectory's steps side by side, in step order, wherever they were stored
        order, starts, lengths = fragmented_split(signal, trajectory_key, step_key)
        raw, index = raw[order], _pick(index, order)
    else:
        starts, lengths = split_streams(signal, n_cols, trajectory_key)  # on the stored values
    complete = read is None and len(chosen) == len(transforms)  # every entry, through the whole chain
    view = _apply(chosen, raw if complete else raw.clone(False))
    if pred is not None:
        keep = pred.select(_Segments(view, starts, lengths))
        starts, lengths = starts[keep], lengths[keep]
    if not starts.numel():
        return []
    if complete:
        return [Trajectory(view[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]
    # the accepted trajectories, read again with every entry and through the whole chain
    flat = torch.cat([torch.arange(s, s + n) for s, n in zip(starts.tolist(), lengths.tolist())])
    with rb.write_lock:
        picked = _read(storage, _pick(index, flat), None)
    picked = _apply(transforms, picked)
    offsets = torch.cumsum(lengths, 0) - lengths
    return [Trajectory(picked[s : s + n]) for s, n in zip(offsets.tolist(), lengths.tolist())]


def _pick(index, flat: torch.Tensor):
    return index[flat] if isinstance(index, torch.Tensor) else (index[0][flat], index[1][flat])
