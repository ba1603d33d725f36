"""The staleness-aware sampler: fresher data (written by a more recent policy) is drawn more often.

Each stored item carries the version of the policy that produced it (entry ``version_key``, written by the
collector or by the user). The sampler holds the learner's ``consumer_version``; an item's staleness is
``consumer_version - policy_version``. Items staler than ``max_staleness`` are never drawn; the others are drawn
with probability proportional to ``staleness_weight_fn(staleness)`` (default ``1 / (staleness + 1)``).

The weights only change when the storage is written or when ``consumer_version``/``max_staleness`` change: the
sampler keeps their cumulative sum keyed on those (and on the storage's ``write_revision``), so a draw between
two writes costs a binary search per item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl._validation import check_int, is_int
from torchrl.data.replay_buffers._shared.counters import SharedCounters
from torchrl.data.replay_buffers.samplers.base import Sampler, check_batch_size, check_not_empty, unravel

__all__ = ["StalenessAwareSampler"]

_REJECTION_ROUNDS = 8


def _check_version_key(key):
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    raise TypeError(
        f"`version_key` must be the name of an entry (a str, or a tuple of str for a nested entry), got {key!r}."
    )


def _check_max_staleness(value) -> int:
    value = check_int(
        "max_staleness", value, hint="Pass -1 (no limit) or the largest staleness to draw, e.g. 4."
    )
    if value < -1:
        raise ValueError(f"`max_staleness` must be -1 (no limit) or an int >= 0, got {value}.")
    return value


def _as_version(value, name: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if not is_int(value):
        raise TypeError(
            f"`{name}` must be an int (a policy version), got {value!r} ({type(value).__name__})."
        )
    return int(value)


def _missing_key_error(key, why: str) -> KeyError:
    return KeyError(
        f"StalenessAwareSampler reads each item's policy version from the entry {key!r}, and {why}. Write the "
        f"version of the policy that produced the data with it (e.g. data[{key!r}] = torch.full(data.shape, "
        f"version) before rb.extend(data)), or pass version_key=<the entry holding it>."
    )


class StalenessAwareSampler(Sampler):
    """Draws items by the freshness of the policy that produced them.

    ``staleness = consumer_version - data[version_key]``; items with ``staleness > max_staleness`` are never
    drawn (when ``max_staleness >= 0``), the others with probability proportional to
    ``staleness_weight_fn(staleness)``, by default ``1 / (staleness + 1)``. A batch holds distinct items when
    there are enough drawable ones (as ``torch.multinomial(weights, batch_size)``), and is drawn with
    replacement otherwise. ``info["staleness"]`` holds the staleness of the drawn items (TensorDict buffers
    write it into the batch).

    The learner advances ``consumer_version`` (set it, or call :meth:`increment_consumer_version` after each
    policy update). An item newer than the consumer (negative staleness) raises a ``ValueError`` with the
    default weights: set ``consumer_version`` first.

    Stateful: ``consumer_version`` and ``max_staleness`` are part of ``state_dict()``, checkpoints and pickles,
    and a private DataLoader worker's copy would not see the learner advance them (``requires_shared_state =
    True``). They can live in shared memory (``can_share_state = True``):
    :meth:`~torchrl.data.ReplayBuffer.as_dataset` shares them (:meth:`share_memory_`), so every worker sees the
    values the main process sets. Draws use the buffer's generator (TorchRL's use torch's global one).

    Args:
        max_staleness (int): the largest staleness drawn; ``-1`` draws any. Defaults to ``-1``.
        staleness_weight_fn (callable, optional): maps a tensor of staleness values to non-negative finite
            weights of the same shape. A function defined at module level keeps the sampler picklable.
            Defaults to ``None`` (``1 / (staleness + 1)``).
        version_key (NestedKey): the entry holding each item's policy version (an int). Defaults to
            ``"policy_version"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, StalenessAwareSampler
        >>> sampler = StalenessAwareSampler(max_staleness=1)
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=2)
        >>> data = TensorDict(obs=torch.arange(3), policy_version=torch.tensor([0, 1, 2]), batch_size=[3])
        >>> _ = rb.extend(data)
        >>> sampler.consumer_version = 2
        >>> batch, info = rb.sample(return_info=True)
        >>> sorted(batch["obs"].tolist()), sorted(info["staleness"].tolist())  # version 0 is too stale
        ([1, 2], [0, 1])
    """

    requires_shared_state = True
    _derived_state = ("_cache",)  # the cumulative weights, forgotten at every write (see Sampler)

    def __init__(
        self,
        max_staleness: int = -1,
        staleness_weight_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        version_key="policy_version",
    ):
        self._state = SharedCounters(("consumer_version", "max_staleness"))
        self.max_staleness = max_staleness
        if staleness_weight_fn is not None and not callable(staleness_weight_fn):
            raise TypeError(
                f"`staleness_weight_fn` must map a tensor of staleness values to weights (a callable) or be None, "
                f"got {staleness_weight_fn!r}."
            )
        self.staleness_weight_fn = staleness_weight_fn
        self.version_key = _check_version_key(version_key)
        self._cache = None

    # -- sharing with DataLoader workers ---------------------------------------------------------------------------
    can_share_state = True

    @property
    def is_shared(self) -> bool:
        """Whether ``consumer_version`` and ``max_staleness`` live in shared memory (see :meth:`share_memory_`)."""
        return self._state.is_shared

    def share_memory_(self) -> StalenessAwareSampler:
        """Moves ``consumer_version`` and ``max_staleness`` to shared memory, in place: the processes that receive
        the sampler afterwards (DataLoader workers, under fork, spawn or forkserver) see the values the main
        process sets, e.g. after each policy update or a scheduler step. ``rb.as_dataset()`` calls it;
        ``pickle``/``copy.deepcopy`` give a private copy.

        Examples:
            >>> sampler = StalenessAwareSampler()
            >>> sampler.share_memory_().is_shared
            True
        """
        self._state.share_memory_()
        return self

    @property
    def _consumer_version(self) -> int:
        return self._state["consumer_version"]

    @_consumer_version.setter
    def _consumer_version(self, value: int) -> None:
        self._state["consumer_version"] = value

    @property
    def _max_staleness(self) -> int:
        return self._state["max_staleness"]

    @_max_staleness.setter
    def _max_staleness(self, value: int) -> None:
        self._state["max_staleness"] = value

    # -- state the learner drives ---------------------------------------------------------------------------------
    @property
    def consumer_version(self) -> int:
        """The learner's policy version, against which staleness is measured."""
        return self._consumer_version

    @consumer_version.setter
    def consumer_version(self, value: int) -> None:
        self._consumer_version = _as_version(value, "consumer_version")

    def increment_consumer_version(self) -> int:
        """Adds one to :attr:`consumer_version` (call it after each policy update); returns the new version."""
        self._consumer_version += 1
        return self._consumer_version

    @property
    def max_staleness(self) -> int:
        """The largest staleness drawn (``-1``: any)."""
        return self._max_staleness

    @max_staleness.setter
    def max_staleness(self, value: int) -> None:
        self._max_staleness = _check_max_staleness(value)

    # -- weights --------------------------------------------------------------------------------------------------
    def _versions(self, storage, n: int) -> torch.Tensor:
        """The policy version of each of the ``n`` stored items (flat order), as a 1-D tensor."""
        key = self.version_key
        get_entry = getattr(storage, "get_entry", None)
        entry = get_entry(key) if get_entry is not None else None
        if entry is None:
            data = storage.get(torch.arange(n)) if storage.ndim == 1 else storage[:]
            if isinstance(data, list):
                if not all(isinstance(item, TensorDictBase) and key in item.keys(True) for item in data):
                    raise _missing_key_error(key, "some stored items do not have it")
                return torch.stack([torch.as_tensor(item.get(key)).reshape(-1)[0] for item in data])
            if not isinstance(data, TensorDictBase) or key not in data.keys(True):
                what = (
                    type(data).__name__ if not isinstance(data, TensorDictBase) else "a TensorDict without it"
                )
                raise _missing_key_error(key, f"the storage holds {what}")
            entry = data.get(key)
        else:
            entry = entry[: storage.rows_written()]
        return entry.reshape(n, -1)[:, 0]

    def _weights(self, storage, n: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """``(cumulative weights (float64), staleness, number of drawable items, last drawable position)``,
        cached between writes."""
        revision = getattr(storage, "write_revision", None)
        consumer, max_staleness = (
            self._consumer_version,
            self._max_staleness,
        )  # read once: shared values may move
        key = (id(storage), revision, n, consumer, max_staleness, self.staleness_weight_fn)
        cache = self._cache
        if revision is not None and cache is not None and cache[0] == key:
            return cache[1]
        versions = self._versions(storage, n)
        if versions.is_floating_point():
            staleness = consumer - versions.to(torch.float64)
        else:
            staleness = consumer - versions.to(torch.int64)
        fn = self.staleness_weight_fn
        if fn is None:
            if n and bool((staleness < 0).any()):
                raise ValueError(
                    f"Some stored items have a {self.version_key!r} newer than `consumer_version`="
                    f"{consumer} (up to {int(versions.max())}), so their staleness is negative. Set "
                    f"sampler.consumer_version to the learner's current policy version (or call "
                    f"increment_consumer_version() after each update)."
                )
            weights = 1.0 / (staleness.to(torch.float64) + 1.0)
        else:
            weights = torch.as_tensor(fn(staleness)).to(torch.float64)
            if (
                weights.shape != staleness.shape
                or not bool(torch.isfinite(weights).all())
                or bool((weights < 0).any())
            ):
                raise ValueError(
                    f"`staleness_weight_fn` must return finite weights >= 0 shaped like its input "
                    f"({list(staleness.shape)}); it returned {list(weights.shape)} values in "
                    f"[{weights.min().item() if weights.numel() else 0}, "
                    f"{weights.max().item() if weights.numel() else 0}]."
                )
        if max_staleness >= 0:
            weights = torch.where(staleness <= max_staleness, weights, torch.zeros((), dtype=torch.float64))
        drawable = int((weights > 0).sum())
        cdf = torch.cumsum(weights, 0)
        last = int(torch.searchsorted(cdf, cdf[-1])) if n else 0  # the last item with a positive weight
        result = (cdf, staleness, drawable, last)
        if revision is not None:
            self._cache = (key, result)
        return result

    # -- sampling -------------------------------------------------------------------------------------------------
    def can_sample(self, storage, batch_size: int) -> bool:
        """``True`` once some stored item has a non-zero weight at the current ``consumer_version`` (an item
        within ``max_staleness``): a reader can wait for fresher data."""
        n = len(storage)
        return n > 0 and self._weights(storage, n)[2] > 0

    def sample(self, storage, batch_size: int):
        batch_size = check_batch_size(batch_size)
        n = check_not_empty(storage)
        cdf, staleness, drawable, last = self._weights(storage, n)
        if drawable == 0:
            gate = f" with `max_staleness`={self._max_staleness}" if self._max_staleness >= 0 else ""
            raise RuntimeError(
                f"No stored item can be drawn{gate}: at `consumer_version`={self._consumer_version}, every item's "
                f"weight is 0 (staleness from {staleness.min().item()} to {staleness.max().item()}). Write fresher "
                f"data, raise `max_staleness` (-1 for no limit), or check `staleness_weight_fn`."
            )
        if batch_size > drawable:
            flat = self._draw(cdf, last, batch_size)
        else:
            flat = self._draw_distinct(cdf, last, batch_size)
        return unravel(flat, storage), {"staleness": staleness[flat]}

    def _draw(self, cdf: torch.Tensor, last: int, k: int) -> torch.Tensor:
        """``k`` positions drawn with replacement, with probability proportional to the weights."""
        u = torch.rand(k, dtype=torch.float64, generator=self._rng) * cdf[-1]
        # numpy's binary search: torch.searchsorted spreads 256 searches over threads and stalls on a busy CPU
        index = np.searchsorted(cdf.numpy(), u.numpy(), side="right")
        return torch.from_numpy(np.minimum(index, last))

    def _draw_distinct(self, cdf: torch.Tensor, last: int, k: int) -> torch.Tensor:
        """``k`` distinct positions, distributed as successive weighted draws without replacement.

        The first ``k`` distinct values of an i.i.d. weighted sequence, in the order they first appear, are
        distributed as successive sampling without replacement (``torch.multinomial(weights, k)``). When heavy
        weights keep repeating the same items, the rest is drawn by ``torch.multinomial`` among the items not
        chosen yet. The set operations run in numpy (cheaper calls on a batch of indices).
        """
        draws = self._draw(cdf, last, k + k // 4 + 8).numpy()
        for _ in range(_REJECTION_ROUNDS):
            values, first = np.unique(draws, return_index=True)
            if values.size >= k:
                return torch.from_numpy(draws[np.sort(first)[:k]])
            draws = np.concatenate([draws, self._draw(cdf, last, k - values.size + 8).numpy()])
        chosen = draws[np.sort(np.unique(draws, return_index=True)[1])]
        weights = torch.diff(cdf, prepend=cdf.new_zeros(1)).clamp_(min=0)
        weights[torch.from_numpy(chosen)] = 0
        rest = torch.multinomial(weights, k - chosen.size, replacement=False, generator=self._rng)
        return torch.from_numpy(np.concatenate([chosen, rest.numpy()]))

    # -- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"consumer_version": self._consumer_version, "max_staleness": self._max_staleness}

    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``consumer_version`` (an int, required) and ``max_staleness`` (``-1`` or an int ``>= 0``)."""
        if "consumer_version" not in state:
            raise ValueError(
                f"StalenessAwareSampler state_dict has no 'consumer_version' entry (it has {sorted(map(str, state))}): "
                f"pass what StalenessAwareSampler.state_dict() returned. Nothing was changed."
            )
        version = _as_version(state["consumer_version"], "consumer_version")
        max_staleness = _check_max_staleness(state.get("max_staleness", self._max_staleness))
        return {"consumer_version": version, "max_staleness": max_staleness}

    def _apply_state(self, state: dict[str, Any]) -> None:
        self._max_staleness = state["max_staleness"]
        self._consumer_version = state["consumer_version"]
        self._forget_derived()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_staleness={self._max_staleness}, version_key={self.version_key!r}, "
            f"consumer_version={self._consumer_version})"
        )
