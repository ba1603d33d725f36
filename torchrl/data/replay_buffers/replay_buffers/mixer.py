"""Batches drawn from several replay buffers in exact proportions: :class:`MixedReplayBuffer`.

Data model: a mixer holds ``N`` member buffers (anything with ``sample(n)`` and ``len()``: replay buffers,
offline datasets, another mixer) and one weight per member. A batch of ``B`` rows is ``counts[i]`` rows
sampled from member ``i`` by that member's own sampler, concatenated in member order (member 0's rows first):
``counts`` sum to ``B`` and are the largest-remainder (Hamilton) apportionment of ``B`` by the weights, so
every batch has the same composition, never a random one (``counts(B)`` tells it). A member that holds no data
gives its share to the others (``skip_empty=True``). The mixer owns no data and writes nothing: data goes into
the members (``mixer.buffers[i].extend(data)``).

The weights live in a tensor that :meth:`MixedReplayBuffer.share_memory_` moves to shared memory (building
``as_dataset()`` does), so :meth:`MixedReplayBuffer.set_proportions` in the main process reaches the copies
that DataLoader workers sample from.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, check_int, check_positive_int, is_real
from torchrl.data.replay_buffers._checkpoint.parts import (
    PartContext,
    check_part,
    dump_part,
    load_part,
    qualname,
)
from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
from torchrl.data.replay_buffers.replay_buffers._prefetch import WithoutQueue, leaving_queue_out
from torchrl.data.replay_buffers.replay_buffers._readiness import (
    MAX_POLL_S,
    RATE_CANCELLED,
    RATE_SHUT_DOWN,
    check_wait_args,
)
from torchrl.data.replay_buffers.replay_buffers.dataset import ReplayBufferDataset

O2O_SAMPLE_BATCH_SIZE = TorchRLPhrase(
    ValueError,
    r"batch_size must be provided either in __init__ or sample\(\)",
    "batch_size must be provided either in __init__ or sample(): this {cls} was built without a batch_size "
    "and sample() got none. Call sample(batch_size) or build it with batch_size=N.",
)

__all__ = ["MixedReplayBuffer", "largest_remainder_counts"]

#: The entry a member's batch carries its sampled positions in (a TensorDictReplayBuffer's ``"index"``).
INDEX_KEY = "index"
STATE_VERSION = 1
_SEED_STRIDE = 0x9E3779B97F4A7C15  # member i of a worker copy is reseeded with seed + i * stride (mod 2**63)


def largest_remainder_counts(weights: Sequence[float], total: int) -> list[int]:
    """Splits ``total`` into integer counts proportional to ``weights`` (largest-remainder apportionment).

    Each count is the floor of its exact quota ``total * w / sum(weights)`` (computed with fractions, so no
    float error moves a row), and the rows left go one each to the largest remainders, ties to the lower
    index. Zero weights always get 0. Counts sum to ``total``.

    Args:
        weights (sequence of float): non-negative, finite, not all zero.
        total (int): the number of rows to split (>= 0).

    Returns:
        list[int]: one count per weight.

    Examples:
        >>> from torchrl.data import largest_remainder_counts
        >>> largest_remainder_counts([0.5, 0.3, 0.2], 7)
        [4, 2, 1]
        >>> largest_remainder_counts([1, 1, 1], 10)
        [4, 3, 3]
    """
    if hasattr(weights, "__len__") and len(weights) == 0:
        raise ValueError("`weights` must hold at least one weight, got an empty sequence.")
    exact = [Fraction(float(w)) for w in _check_weights("weights", weights, len(weights))]
    total = check_int("total", total, minimum=0)
    whole = sum(exact)
    quotas = [w * total / whole for w in exact]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    order = sorted((i for i, w in enumerate(exact) if w > 0), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return counts


def _check_weights(name: str, weights, n: int) -> list[float]:
    """``weights`` as floats: ``n`` finite non-negative numbers, not all zero; else a ValueError/TypeError."""
    if isinstance(weights, torch.Tensor):
        weights = weights.tolist()
    if isinstance(weights, (str, bytes, Mapping)) or not isinstance(weights, Sequence):
        raise TypeError(
            f"`{name}` must be a sequence of {n} non-negative numbers (one per member), got "
            f"{type(weights).__name__}: {weights!r:.100}."
        )
    if len(weights) != n:
        raise ValueError(f"`{name}` must hold one number per member ({n}), got {len(weights)}: {list(weights)!r}.")
    values = []
    for i, w in enumerate(weights):
        if not is_real(w):
            raise TypeError(f"`{name}[{i}]` must be a number, got {w!r} ({type(w).__name__}).")
        w = float(w)
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"`{name}[{i}]` must be a finite number >= 0, got {w!r}. Pass e.g. [0.5, 0.5].")
        values.append(w)
    if sum(values) <= 0:
        raise ValueError(
            f"`{name}` must have at least one positive entry (they are normalized), got {values!r}."
        )
    return values


def _check_buffers(buffers) -> list:
    if isinstance(buffers, (str, bytes, Mapping)) or not isinstance(buffers, Sequence):
        raise TypeError(
            f"`buffers` must be a list of replay buffers (or datasets with sample() and len()), got "
            f"{type(buffers).__name__}."
        )
    if not buffers:
        raise ValueError("`buffers` must hold at least one buffer, got an empty list.")
    seen: dict[int, int] = {}
    for i, buffer in enumerate(buffers):
        if not callable(getattr(buffer, "sample", None)) or not hasattr(type(buffer), "__len__"):
            raise TypeError(
                f"`buffers[{i}]` must be a replay buffer (an object with sample(batch_size) and len()), got "
                f"{type(buffer).__name__}. Wrap a storage in ReplayBuffer(storage=...) first."
            )
        if id(buffer) in seen:
            raise ValueError(
                f"`buffers[{i}]` is the same object as `buffers[{seen[id(buffer)]}]`: a mixer member appears once. "
                f"Give it the sum of both weights instead."
            )
        seen[id(buffer)] = i
    return list(buffers)


def _takes_return_info(buffer) -> bool:
    """Whether ``buffer.sample`` accepts ``return_info`` (replay buffers do; a user's dataset may not)."""
    try:
        parameters = inspect.signature(buffer.sample).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "return_info" or p.kind is p.VAR_KEYWORD for p in parameters)


def _takes_wait(buffer) -> bool:
    """Whether ``buffer.sample`` accepts ``wait``, ``timeout`` and ``cancel_event`` and ``buffer.can_sample``
    exists (replay buffers; a user's dataset may not)."""
    try:
        parameters = inspect.signature(buffer.sample).parameters
    except (TypeError, ValueError):
        return False
    takes = all(name in parameters for name in ("wait", "timeout", "cancel_event")) or any(
        p.kind is p.VAR_KEYWORD for p in parameters.values()
    )
    return takes and callable(getattr(buffer, "can_sample", None))


def _check_source_key(source_key):
    if source_key is None or isinstance(source_key, str):
        return source_key
    if isinstance(source_key, tuple) and source_key and all(isinstance(k, str) for k in source_key):
        return source_key
    raise TypeError(f"`source_key` must be None, a str or a tuple of str (a nested key), got {source_key!r}.")


def _without_index(batch):
    if isinstance(batch, TensorDictBase) and INDEX_KEY in batch.keys():
        return batch.exclude(INDEX_KEY)
    return batch


def _leaf_keys(batch) -> set:
    return set(batch.keys(include_nested=True, leaves_only=True))


def _concatenate(parts: list[tuple[int, Any]]):
    """The member batches ``parts`` (``(member, batch)``) concatenated along dim 0, in order."""
    batches = [batch for _, batch in parts]
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    if isinstance(first, TensorDictBase):
        keys = _leaf_keys(first)
        for member, batch in parts[1:]:
            if not isinstance(batch, TensorDictBase) or _leaf_keys(batch) != keys:
                theirs = _leaf_keys(batch) if isinstance(batch, TensorDictBase) else type(batch).__name__
                raise KeyError(
                    f"MixedReplayBuffer cannot concatenate the batches of member {parts[0][0]} (keys "
                    f"{sorted(map(str, keys))}) and member {member} ({theirs if isinstance(theirs, str) else sorted(map(str, theirs))}): "
                    f"members must sample the same entries (the 'index' entry is dropped already). Give a member "
                    f"a transform that adds or excludes the differing entries."
                )
        return torch.cat(batches, 0)
    if isinstance(first, torch.Tensor) or hasattr(type(first), "__tensorclass__"):
        return torch.cat(batches, 0)
    if isinstance(first, (tuple, list)):
        joined = [_concatenate([(m, b[j]) for m, b in parts]) for j in range(len(first))]
        return type(first)(joined) if isinstance(first, list) else tuple(joined)
    if isinstance(first, Mapping):
        return {k: _concatenate([(m, b[k]) for m, b in parts]) for k in first}
    raise TypeError(
        f"MixedReplayBuffer concatenates tensors, tensor collections, and tuples/lists/dicts of them; member "
        f"{parts[0][0]} sampled a {type(first).__name__}. Store tensors or TensorDicts in the members."
    )


class _MemberStorages:
    """What :class:`~torchrl.data.ReplayBufferDataset` reads as a mixer's ``storage``: ``len()`` (the rows of
    all members) and ``share_memory_()`` (shares every member's storage and the mixer's weights)."""

    __slots__ = ("_mixer",)

    def __init__(self, mixer: MixedReplayBuffer):
        self._mixer = mixer

    def __len__(self) -> int:
        return len(self._mixer)

    def share_memory_(self) -> _MemberStorages:
        self._mixer.share_memory_()
        return self

    def __repr__(self) -> str:
        return f"MemberStorages(of {self._mixer.num_members} members, rows={len(self)})"


class MixedReplayBuffer:
    """Samples each batch from several buffers, with exactly the same number of rows from each every time.

    Why: offline-to-online fine-tuning, demonstrations mixed into RL data, or several tasks trained together
    need batches of a fixed composition ("25% expert, 75% online"), not one that holds only on average. A
    batch of ``B`` rows holds ``counts(B)[i]`` rows of member ``i`` (the largest-remainder split of ``B`` by
    the proportions, see :func:`largest_remainder_counts`), drawn by the member's own sampler and transforms,
    member 0's rows first. The proportions can change between batches (:meth:`set_proportions`, e.g. an
    annealing schedule); they are part of :meth:`state_dict` and of the checkpoints (:meth:`dumps`), with each
    member's state. :meth:`as_dataset` reads the mixer through DataLoader workers, and a
    ``StatefulDataLoader`` resumes it exactly (:func:`~torchrl.data.save_training_state`).

    The ``"index"`` entry a :class:`~torchrl.data.TensorDictReplayBuffer` member adds to its batches is
    dropped (it is a position in that member's storage, and members without it could not be concatenated);
    ``source_key`` tags each row with its member instead, and ``sample(return_info=True)`` gives each member's
    sampled positions.

    Args:
        buffers (list): the members: replay buffers or datasets (objects with ``sample(n)`` and ``len()``),
            each at most once. Their batches must have the same entries (tensors: the same trailing shape).
        proportions (sequence of float, optional): one non-negative weight per member, normalized. Defaults to
            ``None`` (equal weights).

    Keyword Args:
        batch_size (int, optional): the batch size of :meth:`sample` without an argument (and of
            :meth:`as_dataset`). Defaults to ``None``.
        source_key (NestedKey, optional): an entry set on every row of a TensorDict batch: the member it comes
            from (``int64``). Defaults to ``None`` (no tag).
        skip_empty (bool): a member that holds no data gives its share to the others (split by their
            proportions); with ``False``, sampling from an empty member raises. Defaults to ``True``.
        transform (callable, optional): applied to each mixed batch (after the members' own transforms).
            Defaults to ``None``.

    .. note:: Counts are exact when each member returns the rows asked for, which every sampler with
        replacement does. A sampler without replacement (``drop_last=False``) returns fewer rows at the end of its
        epoch.

    .. note:: With DataLoader workers, a :meth:`set_proportions` call reaches the workers at once, but they
        draw up to ``prefetch_factor`` batches ahead: the next few batches may still have the previous counts.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, MixedReplayBuffer, ReplayBuffer
        >>> experts = ReplayBuffer(storage=LazyTensorStorage(10))
        >>> online = ReplayBuffer(storage=LazyTensorStorage(10))
        >>> _ = experts.extend(TensorDict(obs=torch.zeros(10), batch_size=[10]))
        >>> _ = online.extend(TensorDict(obs=torch.ones(10), batch_size=[10]))
        >>> mixer = MixedReplayBuffer([experts, online], [0.25, 0.75], batch_size=8, source_key="source")
        >>> batch = mixer.sample()
        >>> mixer.counts(), batch["source"].tolist()
        ([2, 6], [0, 0, 1, 1, 1, 1, 1, 1])
        >>> mixer.set_proportions([1, 1])
        >>> mixer.sample()["obs"].sum().item()
        4.0
    """

    checkpoint_role = "mixed replay buffer"

    def __init__(
        self,
        buffers: Sequence,
        proportions: Sequence[float] | torch.Tensor | None = None,
        *,
        batch_size: int | None = None,
        source_key=None,
        skip_empty: bool = True,
        transform: Callable | None = None,
    ):
        members = _check_buffers(buffers)
        weights = [1.0] * len(members) if proportions is None else _check_weights("proportions", proportions, len(members))
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        source_key = _check_source_key(source_key)
        skip_empty = check_bool("skip_empty", skip_empty, hint="Pass True to skip empty members, False to raise.")
        if transform is not None and not callable(transform):
            raise TypeError(f"`transform` must be callable (a Transform or a function) or None, got {transform!r}.")
        self._buffers = members
        self._with_info = [_takes_return_info(buffer) for buffer in members]
        self._with_wait = [_takes_wait(buffer) for buffer in members]
        self._weights = torch.tensor(weights, dtype=torch.float64)  # as given; normalized where read
        self._batch_size = batch_size
        self._source_key = source_key
        self._skip_empty = skip_empty
        self._transform = transform

    # -- what it is ----------------------------------------------------------------------------------------------
    @property
    def buffers(self) -> list:
        """The members (a new list); write into them: ``mixer.buffers[i].extend(data)``."""
        return list(self._buffers)

    @property
    def num_members(self) -> int:
        """The number of members."""
        return len(self._buffers)

    @property
    def proportions(self) -> tuple[float, ...]:
        """The current proportions, normalized to sum to 1."""
        weights = self._weights.tolist()
        total = sum(weights)
        return tuple(w / total for w in weights)

    @property
    def batch_size(self) -> int | None:
        """The batch size of :meth:`sample` without an argument."""
        return self._batch_size

    @property
    def source_key(self):
        """The entry that tags each row with its member, or ``None``."""
        return self._source_key

    @property
    def transform(self) -> Callable | None:
        """The transform applied to each mixed batch, or ``None``."""
        return self._transform

    def __len__(self) -> int:
        """The number of rows held by all members together."""
        return sum(len(buffer) for buffer in self._buffers)

    def __repr__(self) -> str:
        members = ", ".join(type(b).__name__ for b in self._buffers)
        shown = ", ".join(f"{p:.3f}" for p in self.proportions)
        return (
            f"MixedReplayBuffer(buffers=[{members}], proportions=[{shown}], batch_size={self._batch_size}, "
            f"sizes={[len(b) for b in self._buffers]})"
        )

    # -- proportions ---------------------------------------------------------------------------------------------
    def set_proportions(self, proportions: Sequence[float] | torch.Tensor) -> None:
        """Sets the member weights (normalized) used by the next batches; validated before anything changes.

        Args:
            proportions (sequence of float): one non-negative weight per member, not all zero.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, MixedReplayBuffer, ReplayBuffer
            >>> a, b = ReplayBuffer(storage=LazyTensorStorage(4)), ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = a.extend(torch.zeros(4)), b.extend(torch.ones(4))
            >>> mixer = MixedReplayBuffer([a, b])
            >>> mixer.set_proportions([3, 1])
            >>> mixer.proportions, mixer.counts(4)
            ((0.75, 0.25), [3, 1])
        """
        weights = _check_weights("proportions", proportions, len(self._buffers))
        self._weights.copy_(torch.tensor(weights, dtype=torch.float64))

    def counts(self, batch_size: int | None = None) -> list[int]:
        """The rows each member gives to the next batch of ``batch_size`` (default: the mixer's).

        The largest-remainder split of the batch by the proportions, over the members that hold data when
        ``skip_empty`` (the default).

        Raises:
            RuntimeError: every member with a positive proportion is empty (nothing to sample).
        """
        batch_size = self._resolve_batch_size(batch_size)
        weights = self._weights.tolist()
        if self._skip_empty:
            kept = [w if len(b) > 0 else 0.0 for w, b in zip(weights, self._buffers)]
            if sum(kept) <= 0:
                raise RuntimeError(
                    f"MixedReplayBuffer cannot sample: every member with a positive proportion is empty (sizes "
                    f"{[len(b) for b in self._buffers]}, proportions {[round(p, 6) for p in self.proportions]}). Extend a "
                    f"member first, or give a non-empty member a positive proportion (set_proportions)."
                )
            weights = kept
        return largest_remainder_counts(weights, batch_size)

    def _resolve_batch_size(self, batch_size) -> int:
        if batch_size is None:
            if self._batch_size is None:
                raise O2O_SAMPLE_BATCH_SIZE.error(cls=type(self).__name__)
            return self._batch_size
        return check_positive_int("batch_size", batch_size)

    # -- sampling ------------------------------------------------------------------------------------------------
    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        *,
        wait: bool = False,
        timeout: float | None = None,
        cancel_event=None,
    ):
        """A batch of ``batch_size`` rows (default: the mixer's), ``counts(batch_size)[i]`` of them from member ``i``.

        Args:
            batch_size (int, optional): the rows of the batch. Defaults to the mixer's ``batch_size``.
            return_info (bool): also return ``info``: ``{"counts": [...], "source": int64 tensor (the member of
                each row), "index": [each member's sampled positions, or None]}``. Defaults to ``False``.

        Keyword Args:
            wait (bool): wait until the batch can be served instead of failing: until a member holds data (with
                ``skip_empty``), then until every member asked for rows can serve them (its ``can_sample``:
                data, and its rate limiter's permission), then each such member draws with ``wait=True`` (see
                :meth:`ReplayBuffer.sample <torchrl.data.ReplayBuffer.sample>`; an advisory gate, as there).
                Members without the waiting keywords (datasets) are drawn from as they are. Writes are seen
                within a few milliseconds. Defaults to ``False``.
            timeout (float, optional): the longest wait in seconds for the whole batch, before a
                ``TimeoutError``. Defaults to ``None`` (as long as it takes).
            cancel_event (optional): an object with ``is_set()``; once set, the wait ends with a
                ``RuntimeError``. Defaults to ``None``.

        Raises:
            ValueError: no batch size here nor in the constructor.
            RuntimeError: nothing to sample (see :meth:`counts`), or an empty member asked for rows
                (``skip_empty=False``), without ``wait``.

        Examples:
            >>> import threading, torch
            >>> from torchrl.data import LazyTensorStorage, MixedReplayBuffer, ReplayBuffer
            >>> a, b = ReplayBuffer(storage=LazyTensorStorage(8)), ReplayBuffer(storage=LazyTensorStorage(8))
            >>> mixer = MixedReplayBuffer([a, b], [1, 1], batch_size=4, skip_empty=False)
            >>> _ = a.extend(torch.zeros(8))
            >>> writer = threading.Timer(0.01, b.extend, args=(torch.ones(8),))
            >>> writer.start()
            >>> mixer.sample(wait=True, timeout=10.0).tolist()
            [0.0, 0.0, 1.0, 1.0]
            >>> writer.join()
        """
        timeout = check_wait_args(wait, timeout, cancel_event)
        if not wait:
            return self.sample_counts(self.counts(batch_size), return_info=return_info)
        deadline = None if timeout is None else time.monotonic() + timeout
        counts = self._wait_for_counts(self._resolve_batch_size(batch_size), timeout, deadline, cancel_event)
        return self._sample_counts(self._check_counts(counts), return_info, (deadline, cancel_event))

    def _ready_counts(self, batch_size: int) -> list[int] | None:
        """The counts of the next batch if every member asked for rows can serve them now, else ``None``."""
        try:
            counts = self.counts(batch_size)
        except RuntimeError:  # every member with a positive proportion is empty
            return None
        for buffer, count, with_wait in zip(self._buffers, counts, self._waiting_members()):
            if count and (len(buffer) == 0 or (with_wait and not buffer.can_sample(count))):
                return None
        return counts

    def _waiting_members(self) -> list[bool]:
        with_wait = getattr(self, "_with_wait", None)  # a mixer pickled before wait existed
        if with_wait is None:
            with_wait = self._with_wait = [_takes_wait(buffer) for buffer in self._buffers]
        return with_wait

    def _wait_for_counts(self, batch_size: int, timeout, deadline, cancel_event) -> list[int]:
        """Polls :meth:`_ready_counts` (0.5 ms doubling to ``MAX_POLL_S``) until it gives counts; raises once
        ``cancel_event`` is set, a member is shut down or the ``deadline`` passed."""
        delay = 0.0005
        while True:
            if cancel_event is not None and cancel_event.is_set():
                raise RATE_CANCELLED.error()
            if any(getattr(buffer, "is_alive", True) is False for buffer in self._buffers):
                raise RATE_SHUT_DOWN.error()
            counts = self._ready_counts(batch_size)
            if counts is not None:
                return counts
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(
                    f"MixedReplayBuffer could not serve a batch of {batch_size} within {timeout} seconds: member "
                    f"sizes {[len(b) for b in self._buffers]}, proportions "
                    f"{[round(p, 6) for p in self.proportions]}, skip_empty={self._skip_empty} (a member asked "
                    f"for rows had none, or its sampler or rate limiter refused them). Write data into the members, "
                    f"pass a larger timeout, or timeout=None to wait as long as it takes."
                )
            time.sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 2, MAX_POLL_S)

    def sample_counts(self, counts: Sequence[int], return_info: bool = False):
        """A batch of exactly ``counts[i]`` rows from member ``i``, members in order; see :meth:`sample`.

        For a custom split rule (e.g. :class:`~torchrl.data.OfflineToOnlineReplayBuffer` rounds TorchRL's way).

        Args:
            counts (sequence of int): one non-negative count per member, not all zero.
            return_info (bool): see :meth:`sample`. Defaults to ``False``.
        """
        return self._sample_counts(self._check_counts(counts), return_info, None)

    def _sample_counts(self, counts: list[int], return_info: bool, waiting):
        """:meth:`sample_counts` of checked ``counts``; ``waiting``: ``(deadline, cancel_event)`` of a waiting
        :meth:`sample` (members draw with ``wait=True`` and the time left), or ``None``."""
        parts, positions = [], []
        for member, (buffer, count) in enumerate(zip(self._buffers, counts)):
            if count == 0:
                positions.append(None)
                continue
            batch, info = self._draw(member, buffer, count, waiting)
            positions.append(None if info is None else info.get(INDEX_KEY))
            batch = _without_index(batch)
            if self._source_key is not None:
                batch = self._tag(batch, member)
            parts.append((member, batch))
        batch = _concatenate(parts)
        if self._transform is not None:
            batch = self._transform(batch)
        if not return_info:
            return batch
        source = torch.cat([torch.full((c,), m, dtype=torch.long) for m, c in enumerate(counts) if c])
        return batch, {"counts": list(counts), "source": source, "index": positions}

    def _check_counts(self, counts) -> list[int]:
        if isinstance(counts, (str, bytes, Mapping)) or not isinstance(counts, Sequence):
            raise TypeError(f"`counts` must be a sequence of {len(self._buffers)} ints, got {type(counts).__name__}.")
        if len(counts) != len(self._buffers):
            raise ValueError(f"`counts` must hold one int per member ({len(self._buffers)}), got {list(counts)!r}.")
        checked = [check_int(f"counts[{i}]", c, minimum=0) for i, c in enumerate(counts)]
        if sum(checked) == 0:
            raise ValueError(f"`counts` must ask for at least one row, got {checked!r}.")
        for i, (c, buffer) in enumerate(zip(checked, self._buffers)):
            if c and len(buffer) == 0:
                raise RuntimeError(
                    f"MixedReplayBuffer member {i} ({type(buffer).__name__}) is empty and was asked for {c} rows. "
                    f"Extend it first, set its proportion to 0, or build the mixer with skip_empty=True."
                )
        return checked

    def _draw(self, member: int, buffer, count: int, waiting=None):
        kwargs = {}
        if waiting is not None and self._waiting_members()[member]:
            deadline, cancel_event = waiting
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            kwargs = {"wait": True, "timeout": timeout, "cancel_event": cancel_event}
        if not self._with_info[member]:  # a dataset whose sample() takes the batch size only
            return buffer.sample(count, **kwargs), None
        drawn = buffer.sample(count, return_info=True, **kwargs)
        if isinstance(drawn, tuple) and len(drawn) == 2 and isinstance(drawn[1], Mapping):
            return drawn
        return drawn, None

    def _tag(self, batch, member: int):
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                f"`source_key`={self._source_key!r} tags TensorDict batches; member {member} sampled a "
                f"{type(batch).__name__}. Store TensorDicts in the members, or build the mixer with source_key=None "
                f"(sample(return_info=True) gives info['source'])."
            )
        batch.set(self._source_key, torch.full(batch.batch_size, member, dtype=torch.long, device=batch.device))
        return batch

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The proportions (the weights as given), the batch size and each member's ``state_dict()``."""
        return {
            "version": STATE_VERSION,
            "proportions": self._weights.tolist(),
            "batch_size": self._batch_size,
            "members": [buffer.state_dict() for buffer in self._buffers],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: checked (version, member count, proportions) before anything changes.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, MixedReplayBuffer, ReplayBuffer
            >>> def make():
            ...     return MixedReplayBuffer([ReplayBuffer(storage=LazyTensorStorage(4)) for _ in range(2)])
            >>> mixer = make()
            >>> _ = mixer.buffers[0].extend(torch.arange(3))
            >>> mixer.set_proportions([1, 3])
            >>> fresh = make()
            >>> fresh.load_state_dict(mixer.state_dict())
            >>> fresh.proportions, len(fresh.buffers[0])
            ((0.25, 0.75), 3)
        """
        weights = self._check_state(state_dict, "state_dict")
        members = state_dict["members"]
        for buffer, state in zip(self._buffers, members):
            buffer.load_state_dict(state)
        self._apply_scalars(weights, state_dict["batch_size"])

    def _check_state(self, state, where: str) -> list[float]:
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            got = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(
                f"`{where}` is not a MixedReplayBuffer state of version {STATE_VERSION} (got version {got!r}). "
                f"Pass what MixedReplayBuffer.state_dict() returned."
            )
        members = state.get("members")
        if not isinstance(members, (list, tuple)) or len(members) != len(self._buffers):
            saved = len(members) if isinstance(members, (list, tuple)) else members
            raise ValueError(
                f"`{where}` holds the state of {saved!r} members; this mixer has {len(self._buffers)}. Build the "
                f"mixer with the saved members. Nothing was loaded."
            )
        check_positive_int(f"{where}['batch_size']", state.get("batch_size"), allow_none=True)
        return _check_weights(f"{where}['proportions']", state.get("proportions"), len(self._buffers))

    def _apply_scalars(self, weights: list[float], batch_size: int | None) -> None:
        self._weights.copy_(torch.tensor(weights, dtype=torch.float64))
        self._batch_size = batch_size

    # -- checkpoints (the part protocol of _checkpoint/parts.py) -----------------------------------------------------
    # The part: {"version": 1, "proportions": [...], "batch_size": int | null, "members": [<wrapped part>, ...]};
    # member i's tensors sit under ``member<i>/``. Every member part is checked before any is loaded.
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        tensors, parts = {}, []
        for i, buffer in enumerate(self._buffers):
            member_tensors, part = dump_part(buffer, ctx.sub(f"member{i}"))
            tensors.update(member_tensors)
            parts.append(part)
        doc = {
            "version": STATE_VERSION,
            "class": qualname(self),
            "proportions": self._weights.tolist(),
            "batch_size": self._batch_size,
            "members": parts,
        }
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self._check_state(doc, f"the mixer part of the checkpoint {ctx.path!r}")
        for i, (buffer, part) in enumerate(zip(self._buffers, doc["members"])):
            check_part(buffer, part, tensors, ctx.sub(f"member{i}"))

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        for i, (buffer, part) in enumerate(zip(self._buffers, doc["members"])):
            load_part(buffer, part, tensors, ctx.sub(f"member{i}"))
        self._apply_scalars([float(w) for w in doc["proportions"]], doc["batch_size"])

    def dumps(self, path, **kwargs) -> None:
        """Saves every member and the proportions to the checkpoint directory ``path`` (tensor files and JSON,
        no pickle, switched in atomically), under the members' write locks. ``kwargs`` (``fsync``,
        ``progress``) go to :func:`~torchrl.data.replay_buffers.checkpointers.dump_component`.

        Examples:
            >>> import os, tempfile, torch
            >>> from torchrl.data import LazyTensorStorage, MixedReplayBuffer, ReplayBuffer
            >>> def make():
            ...     return MixedReplayBuffer([ReplayBuffer(storage=LazyTensorStorage(4)) for _ in range(2)])
            >>> mixer = make()
            >>> _ = mixer.buffers[1].extend(torch.arange(4))
            >>> mixer.set_proportions([0.1, 0.9])
            >>> with tempfile.TemporaryDirectory() as d:
            ...     mixer.dumps(os.path.join(d, "mix"))
            ...     fresh = make()
            ...     fresh.loads(os.path.join(d, "mix"))
            >>> fresh.proportions, fresh.buffers[1][:].tolist()
            ((0.1, 0.9), [0, 1, 2, 3])
        """
        with self.write_lock:
            dump_component(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a checkpoint of :meth:`dumps` (every part checked first; a refused one changes nothing)."""
        with self.write_lock:
            load_component(self, path)

    dump = dumps
    load = loads

    @property
    def write_lock(self):
        """A context manager holding every member's write lock (in member order)."""
        return self._locks()

    @contextlib.contextmanager
    def _locks(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for buffer in self._buffers:
                lock = getattr(buffer, "write_lock", None)
                if lock is not None:
                    stack.enter_context(lock)
            yield

    # -- DataLoader workers (the methods ReplayBufferDataset calls) ---------------------------------------------
    @property
    def storage(self) -> _MemberStorages:
        """What a :class:`~torchrl.data.ReplayBufferDataset` asks a buffer for: ``len()`` (all members' rows) and
        ``share_memory_()``. The data stays in the members' storages."""
        return _MemberStorages(self)

    def share_memory_(self) -> MixedReplayBuffer:
        """Moves the proportions and every member's storage to shared memory (what building :meth:`as_dataset`
        does), so that DataLoader workers see new rows and new proportions."""
        self._weights.share_memory_()
        for buffer in self._buffers:
            storage = getattr(buffer, "storage", None)
            if callable(getattr(storage, "share_memory_", None)):
                storage.share_memory_()
        return self

    def as_dataset(
        self,
        *,
        num_batches: int | None = None,
        transport: str = "ring",
        share_sampler: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> ReplayBufferDataset:
        """A :class:`~torchrl.data.ReplayBufferDataset` of mixed batches (needs ``batch_size``), for DataLoader
        workers; the arguments are those of :meth:`ReplayBuffer.as_dataset <torchrl.data.ReplayBuffer.as_dataset>`
        (with ``wait=True``, each draw is ``mixer.sample(wait=True, timeout=timeout)``: see :meth:`sample`).
        ``StatefulDataLoader`` resumes it exactly: save the mixer with the loader
        (``save_training_state(path, rb=mixer, loader=loader)``).

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, MixedReplayBuffer, ReplayBuffer
            >>> a, b = ReplayBuffer(storage=LazyTensorStorage(8)), ReplayBuffer(storage=LazyTensorStorage(8))
            >>> _ = a.extend(torch.zeros(8)), b.extend(torch.ones(8))
            >>> mixer = MixedReplayBuffer([a, b], [3, 1], batch_size=4)
            >>> [batch.tolist() for batch in mixer.as_dataset(num_batches=2).loader()]
            [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]]
        """
        return ReplayBufferDataset(
            self, num_batches=num_batches, transport=transport, share_sampler=share_sampler, rank=rank,
            world_size=world_size, wait=wait, timeout=timeout,
        )

    def stateful_component(self) -> tuple[str, Any] | None:
        """The first member component whose state a worker copy would duplicate (see
        :meth:`ReplayBuffer.stateful_component <torchrl.data.ReplayBuffer.stateful_component>`), else ``None``."""
        for i, buffer in enumerate(self._buffers):
            find = getattr(buffer, "stateful_component", None)
            found = find() if callable(find) else None
            if found is not None:
                return f"member {i}'s {found[0]}", found[1]
        return None

    def prepare_worker_copy(self, seed: int) -> None:
        """Readies each member of a DataLoader worker's copy (member ``i`` reseeded from ``seed`` and ``i``)."""
        for i, buffer in enumerate(self._buffers):
            prepare = getattr(buffer, "prepare_worker_copy", None)
            if callable(prepare):
                prepare((int(seed) + i * _SEED_STRIDE) % (2**63))

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Routes every member's random draws through ``generator`` (members draw in order, so one generator
        fixes the whole batch)."""
        for buffer in self._buffers:
            set_rng = getattr(buffer, "set_rng", None)
            if callable(set_rng):
                set_rng(generator)

    def __getstate__(self):
        state = self.__dict__.copy()
        if leaving_queue_out():  # a dataset's copy for workers: the members' prefetched batches stay here
            state["_buffers"] = [WithoutQueue(buffer) for buffer in self._buffers]
        return state
