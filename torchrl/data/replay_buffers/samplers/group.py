"""Sampling whole groups of sequences: :class:`GroupSampler` (GRPO-style training on a packed storage).

Where :class:`~torchrl.data.PromptGroupSampler` draws a fixed number of items per group from any storage, this
sampler draws whole groups (every live sequence of the group, in write order) from a
:class:`~torchrl.data.PackedSequenceStorage`, whose writer (:class:`~torchrl.data.GroupWriter`) keeps groups
whole. A batch holds a variable number of sequences: the sizes of the groups drawn.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from torchrl._validation import check_positive_int
from torchrl.data.replay_buffers.loading.sequence_items import segment_ids
from torchrl.data.replay_buffers.samplers.base import Sampler, check_batch_size, check_not_empty
from torchrl.data.replay_buffers.storages.packed_sequence import PackedSequenceStorage

__all__ = ["GroupSampler"]

_STRATEGIES = ("random", "recency", "reward", "variance")


class GroupSampler(Sampler):
    """Draws ``num_groups`` whole groups of sequences from a :class:`~torchrl.data.PackedSequenceStorage`.

    The index returned holds the slots of every live sequence of each group drawn, group after group, each
    group in write order; ``info["group"]`` gives each sequence the position of its group in the batch
    (``0 .. num_groups - 1``), so a group-relative advantage is a segment reduction away. The groups are chosen
    by ``strategy``:

    - ``"random"``: uniformly, without replacement within a batch;
    - ``"recency"``: the newest groups;
    - ``"reward"``: the groups with the highest mean ``reward_key``;
    - ``"variance"``: the groups whose rewards have the largest variance (ties: the newer group).

    When the storage holds fewer than ``num_groups`` groups, every group is drawn and the batch is completed by
    drawing groups again (with replacement); a ``UserWarning`` says so once. Sequences written without a group
    count as groups of one. The draws depend on the storage content only (``requires_shared_state=False``):
    DataLoader workers each hold a copy.

    Args:
        num_groups (int, optional): the groups per batch, whatever batch size the buffer passes (a buffer built
            without ``batch_size`` then samples with ``rb.sample()``). Defaults to ``None``: the ``batch_size``
            given to ``sample`` (``rb.sample(batch_size)``, or the buffer's) counts groups.

    Keyword Args:
        strategy (str): ``"random"``, ``"recency"``, ``"reward"`` or ``"variance"``. Defaults to ``"random"``.
        reward_key (NestedKey): the fixed reward entry the ``"reward"`` and ``"variance"`` strategies read
            (several values per sequence are averaged). Defaults to ``"reward"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import GroupSampler, GroupWriter, PackedSequenceStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=PackedSequenceStorage(1000, max_sequences=100), writer=GroupWriter(),
        ...                   sampler=GroupSampler(2, strategy="recency"), batch_size=2)
        >>> _ = rb.extend([TensorDict(tokens=torch.arange(n), prompt_id=torch.tensor(n // 10))
        ...                for n in (3, 5, 12, 15, 17, 21)])  # prompts 0, 1 and 2
        >>> batch, info = rb.sample(return_info=True)
        >>> [len(t) for t in batch.get("tokens", as_list=True)], info["group"].tolist()
        ([12, 15, 17, 21], [0, 0, 0, 1])
    """

    requires_shared_state = False
    draws_in_bounds = True  # slots of sequences that were live at the draw: read with storage.read_rows
    _derived_state = ("_cache",)

    def __init__(self, num_groups: int | None = None, *, strategy: str = "random", reward_key="reward"):
        self.num_groups = check_positive_int("num_groups", num_groups, allow_none=True)
        if strategy not in _STRATEGIES:
            raise ValueError(f"`strategy` must be one of {_STRATEGIES}; got {strategy!r}.")
        self.strategy = strategy
        self.reward_key = reward_key
        self._cache = None
        self._warned = False

    @property
    def default_batch_size(self) -> int | None:
        """``num_groups``: a buffer built without ``batch_size`` draws that many groups on ``rb.sample()``."""
        return self.num_groups

    # -- write notifications ---------------------------------------------------------------------------------
    def extend(self, index) -> None:
        self._cache = None

    def add(self, index) -> None:
        self._cache = None

    def mark_update(self, index, *, storage=None) -> None:
        self._cache = None

    def _empty(self) -> None:
        self._cache = None

    # -- draws -----------------------------------------------------------------------------------------------
    def _groups(self, storage: PackedSequenceStorage):
        revision = storage.write_revision
        cache = self._cache
        if cache is None or cache[0] != revision:
            cache = self._cache = (revision, *storage.live_groups())
        return cache[1:]

    def sample(self, storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        if not isinstance(storage, PackedSequenceStorage):
            raise TypeError(
                f"GroupSampler draws whole groups from a PackedSequenceStorage; got a {type(storage).__name__}. "
                f"Use PromptGroupSampler for other storages."
            )
        k = self.num_groups if self.num_groups is not None else check_batch_size(batch_size)
        check_not_empty(storage)
        slots, starts, sizes = self._groups(storage)
        chosen = self._choose(storage, slots, starts, sizes, k)
        counts = sizes[chosen]
        which = segment_ids(counts)  # the position of each sequence's group in the batch
        within = torch.arange(which.numel()) - (counts.cumsum(0) - counts)[which]
        index = slots[starts[chosen][which] + within]
        return index, {"group": which}

    def _choose(self, storage, slots, starts, sizes, k: int) -> torch.Tensor:
        n = sizes.numel()
        if n < k and not self._warned:
            warnings.warn(
                f"GroupSampler: the storage holds {n} live group(s), fewer than the {k} per batch; groups are "
                f"drawn again to complete the batch (with replacement).",
                UserWarning,
                stacklevel=3,
            )
            self._warned = True
        if self.strategy == "random":
            if n >= k:
                return torch.randperm(n, generator=self._rng)[:k]
            extra = torch.randint(0, n, (k - n,), generator=self._rng)
            return torch.cat([torch.randperm(n, generator=self._rng), extra])
        if self.strategy == "recency":
            scores = torch.arange(n, dtype=torch.float64)
        else:
            rewards = storage.fixed_entry(self.reward_key, slots)
            rewards = rewards.reshape(slots.numel(), -1).double().mean(-1)
            group_of = segment_ids(sizes)
            mean = torch.zeros(n, dtype=torch.float64).index_add_(0, group_of, rewards) / sizes
            if self.strategy == "reward":
                scores = mean
            else:
                sq = torch.zeros(n, dtype=torch.float64).index_add_(0, group_of, (rewards - mean[group_of]) ** 2)
                scores = sq / sizes
        # highest score first; ties go to the newer group (a stable sort of the groups newest first)
        order = torch.argsort(scores.flip(0), descending=True, stable=True)
        order = n - 1 - order
        if n >= k:
            chosen = order[:k]
        else:
            chosen = torch.cat([order, order[torch.randint(0, n, (k - n,), generator=self._rng)]])
        return chosen.sort().values if self.strategy == "recency" else chosen

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def _apply_state(self, state: dict[str, Any]) -> None:
        self._cache = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_groups={self.num_groups}, strategy={self.strategy!r})"
