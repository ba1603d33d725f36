"""Batches of groups of completions that share a prompt: :class:`PromptGroupSampler` (GRPO-style training).

Data model: each stored item is one completion, and its ``group_key`` entry (the prompt, as a token tensor, an
int id or a string) says which group it belongs to. A batch is ``num_groups`` groups of ``samples_per_group``
items, laid out group after group, so that a group-relative advantage is a reshape away:
``batch.reshape(num_groups, samples_per_group)``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import NestedKey, TensorDictBase, is_tensorclass

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers.samplers._group_choice import (
    max_variance_columns,
    padded_members,
    ranked_columns,
    take_ranks,
)
from torchrl.data.replay_buffers.samplers.base import Sampler, check_batch_size, check_not_empty
from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.tensor import TensorStorage
from torchrl.data.replay_buffers.trajectories.columns import values_at
from torchrl.data.replay_buffers.trajectories.keys import normalize_key

PROMPT_GROUP_LIST_STORAGE = TorchRLPhrase(
    TypeError,
    "Plain ListStorage is not supported",
    "Plain ListStorage is not supported by {cls}: it groups items by a stored entry, which needs a storage "
    "that returns its items as one TensorDict: a TensorStorage (LazyTensorStorage or LazyMemmapStorage) or a "
    "LazyStackStorage.",
)
PROMPT_GROUP_REWARD = TorchRLPhrase(
    TypeError,
    "requires reward_key",
    "strategy={strategy!r} requires reward_key={key!r} to name a tensor entry, got {got}. Store rewards as "
    "tensors, or use strategy='random'.",
)

_STRATEGIES = ("random", "recency", "reward", "variance")
_WHO = "PromptGroupSampler"
#: A batch's groups are chosen in one ``[groups, largest group]`` matrix while it holds at most
#: ``_MAX_PADDING`` cells per item (+ ``_PADDING_SLACK``), else group by group.
_MAX_PADDING = 4
_PADDING_SLACK = 65536


@dataclass
class _Groups:
    """The groups of a storage: item positions sorted by group (``order``), ``counts`` per group and the
    position in ``order`` where each group starts (``starts``)."""

    key: tuple
    order: torch.Tensor
    counts: torch.Tensor
    starts: torch.Tensor


def _group_ids(values, n: int) -> torch.Tensor:
    """One int64 group id per item for the group entry ``values`` (a tensor, or a sequence of values)."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(n, -1)
        if values.shape[1] == 1:
            return torch.unique(values.squeeze(-1), return_inverse=True)[1].cpu()
        return torch.unique(values, dim=0, return_inverse=True)[1].cpu()
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    seen: dict = {}
    ids = []
    for value in values:
        if isinstance(value, list):
            value = _as_tuple(value)
        ids.append(seen.setdefault(value, len(seen)))
    return torch.tensor(ids, dtype=torch.long)


def _as_tuple(value):
    return tuple(_as_tuple(v) if isinstance(v, list) else v for v in value)


class PromptGroupSampler(Sampler):
    """Samples balanced groups of completions that share a prompt, for group-relative policy optimisation.

    A batch of ``batch_size`` items holds ``num_groups`` distinct groups (items with equal ``group_key``
    values) of ``samples_per_group`` items each, group after group. Groups are drawn uniformly without
    replacement; the items of a group are chosen by ``strategy``:

    - ``"random"``: a uniform subset;
    - ``"recency"``: the most recently written items (the sampler keeps a write clock, fed by the buffer's
      write notifications, so this strategy is stateful);
    - ``"reward"``: the items with the highest mean ``reward_key`` (ties: the oldest storage position first);
    - ``"variance"``: the subset whose rewards have the largest variance (the most informative spread for a
      group-relative advantage); ties go to the subset with the larger total reward.

    When the storage holds fewer than ``num_groups`` groups, or a group fewer than ``samples_per_group``
    items, the batch is completed by drawing groups (items of the group) again, with replacement, and a
    ``UserWarning`` is issued once.

    Keyword Args:
        num_groups (int, optional): groups per batch; ``samples_per_group`` is then ``batch_size //
            num_groups``. Exactly one of ``num_groups`` and ``samples_per_group`` is given, and
            ``batch_size`` must be a multiple of it.
        samples_per_group (int, optional): items per group; ``num_groups`` is then ``batch_size //
            samples_per_group``.
        group_key (NestedKey): the entry that identifies the prompt of an item: an int id, a string, or a
            tensor (e.g. prompt tokens; rows of equal values form a group). Defaults to ``"query"``.
        strategy (str): ``"random"``, ``"recency"``, ``"reward"`` or ``"variance"`` (see above). Defaults to
            ``"random"``.
        reward_key (NestedKey): the reward entry the ``"reward"`` and ``"variance"`` strategies read (several
            values per item are averaged). Defaults to ``("next", "reward")``.
        cache_groups (bool): keep the grouping of the storage between calls until the next write. Defaults
            to ``True``.

    ``requires_shared_state`` is ``True`` for ``strategy="recency"`` only: its write clock (one stamp per
    storage row) is state that a DataLoader worker's private copy would not see advance. That clock can live in
    shared memory (``can_share_state``, once data was written): ``rb.as_dataset()`` moves it there, and the
    workers then see the writes the main process makes. The other strategies draw from the storage content
    alone and work with DataLoader workers as they are. It needs a 1-D storage that returns its items as one
    TensorDict (a TensorStorage, or a :class:`~torchrl.data.LazyStackStorage`): a plain
    :class:`~torchrl.data.ListStorage` raises a TypeError at :meth:`sample`, as do ``"reward"``/``"variance"``
    with rewards that are not tensors (e.g. a ``NonTensorStack``). The order of the items inside a group is not
    specified. A pickled sampler leaves its cached grouping behind (``_group_index`` is ``None`` in the copy,
    which groups the storage again).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, PromptGroupSampler, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64),
        ...     sampler=PromptGroupSampler(samples_per_group=4), batch_size=8)
        >>> query = torch.arange(32) // 8  # 4 prompts, 8 completions each
        >>> _ = rb.extend(TensorDict(query=query, batch_size=[32]))
        >>> batch = rb.sample()
        >>> batch["query"].view(2, 4).unique(dim=1).shape  # 2 groups of one prompt each
        torch.Size([2, 1])
    """

    _derived_state = ("_group_index",)  # the grouping of the storage, forgotten at every write (see Sampler)

    def __init__(
        self,
        *,
        num_groups: int | None = None,
        samples_per_group: int | None = None,
        group_key: NestedKey = "query",
        strategy: Literal["random", "recency", "reward", "variance"] = "random",
        reward_key: NestedKey = ("next", "reward"),
        cache_groups: bool = True,
    ):
        if (num_groups is None) == (samples_per_group is None):
            raise TypeError(
                f"Pass exactly one of `num_groups` and `samples_per_group`, got num_groups={num_groups!r} and "
                f"samples_per_group={samples_per_group!r}. The other one is derived from the batch size."
            )
        self.num_groups = check_positive_int("num_groups", num_groups, allow_none=True)
        self.samples_per_group = check_positive_int("samples_per_group", samples_per_group, allow_none=True)
        if strategy not in _STRATEGIES:
            raise ValueError(f"`strategy` must be one of {_STRATEGIES}, got {strategy!r}.")
        self.strategy = strategy
        self.group_key = normalize_key(group_key)
        self.reward_key = normalize_key(reward_key)
        self.cache_groups = check_bool("cache_groups", cache_groups)
        self._group_index: _Groups | None = None  # the cached grouping (TorchRL's name)
        self._warned_small_group = False
        self._position_recency = torch.zeros(0, dtype=torch.long)
        self._clock = torch.zeros(1, dtype=torch.long)

    @property
    def requires_shared_state(self) -> bool:
        """``True`` for ``strategy="recency"`` (a write clock), ``False`` for the other strategies."""
        return self.strategy == "recency"

    # -- sharing with DataLoader workers -----------------------------------------------------------------------
    @property
    def can_share_state(self) -> bool:
        """Whether :meth:`share_memory_` can share the write clock: ``strategy="recency"``, once the sampler
        was told of a write (it then knows the storage capacity)."""
        return self.strategy == "recency" and self._position_recency.numel() > 0

    @property
    def is_shared(self) -> bool:
        """Whether the write clock lives in shared memory."""
        return self.strategy == "recency" and self._clock.is_shared()

    def share_memory_(self) -> PromptGroupSampler:
        """Moves the write clock of ``strategy="recency"`` (one stamp per storage row) to shared memory, so that
        DataLoader workers see the writes the main process makes after they started (``rb.as_dataset()``
        calls it). A no-op for the other strategies, which keep no state.

        A worker may sample while a write is being stamped and see part of it as new. ``pickle`` and
        ``copy.deepcopy`` give a private copy.

        Raises:
            RuntimeError: nothing was written yet, so the size of the clock (the storage capacity) is unknown.
        """
        if self.strategy != "recency":
            return self
        if not self._position_recency.numel():
            raise RuntimeError(
                "PromptGroupSampler(strategy='recency') shares one write stamp per storage row, and learns the "
                "storage capacity from the first write: write data into the buffer before building its dataset."
            )
        self._position_recency.share_memory_()
        self._clock.share_memory_()
        return self

    @property
    def _recency_clock(self) -> int:
        return int(self._clock[0])

    # -- writes ------------------------------------------------------------------------------------------------
    def mark_update(self, index, *, storage=None) -> None:
        """Forgets the cached groups; with ``strategy="recency"``, stamps the rows ``index`` as the newest."""
        super().mark_update(index, storage=storage)
        if self.strategy != "recency" or (storage is not None and storage.ndim != 1):
            return
        rows = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        rows = rows[rows >= 0]
        if not rows.numel():
            return
        top = int(rows.max()) + 1
        held = self._position_recency.numel()
        if top > held:
            if self.is_shared:
                raise RuntimeError(
                    f"PromptGroupSampler(strategy='recency') shares {held} write stamps (the storage capacity it "
                    f"knew), and row {top - 1} was written: build the dataset over a buffer whose storage does not "
                    f"grow, or use num_workers=0."
                )
            capacity = getattr(storage, "max_size", 0) if storage is not None else 0
            grown = torch.zeros(
                max(top, 2 * held, capacity if isinstance(capacity, int) else 0), dtype=torch.long
            )
            grown[:held] = self._position_recency
            self._position_recency = grown
        n = rows.numel()
        start = self._recency_clock
        self._position_recency[rows] = torch.arange(start + 1, start + n + 1)
        self._clock[0] = start + n

    # -- groups ------------------------------------------------------------------------------------------------
    def _layout(self, batch_size: int) -> tuple[int, int]:
        """``(num_groups, samples_per_group)`` of a batch."""
        given, name = (
            (self.num_groups, "num_groups")
            if self.num_groups is not None
            else (self.samples_per_group, "samples_per_group")
        )
        if batch_size % given:
            raise ValueError(
                f"`batch_size`={batch_size} is not divisible by `{name}`={given}: a batch is made of whole "
                f"groups. Pass a multiple of {given}."
            )
        other = batch_size // given
        return (given, other) if self.num_groups is not None else (other, given)

    def _check_storage(self, storage) -> int:
        if storage.ndim != 1:
            raise NotImplementedError(
                f"PromptGroupSampler samples 1-D storages (one completion per item); got ndim={storage.ndim}. "
                f"Flatten the storage (storage.flatten(), or extend with data.reshape(-1))."
            )
        n = check_not_empty(storage)
        return n

    def _group_values(self, storage, n: int):
        if isinstance(storage, TensorStorage):
            column = storage.get_entry(self.group_key)
            if column is None:
                raise KeyError(self._missing(self.group_key, "group_key"))
            return column[:n]
        data = storage.get(slice(0, n))
        if not (isinstance(data, TensorDictBase) or is_tensorclass(data)):
            if isinstance(storage, ListStorage):
                raise PROMPT_GROUP_LIST_STORAGE.error(cls=_WHO)
            raise TypeError(
                f"PromptGroupSampler reads the `group_key` entry of every item at once, which needs a storage that "
                f"returns its items as one TensorDict (a TensorStorage such as LazyTensorStorage, or a "
                f"LazyStackStorage); this {type(storage).__name__} returns {type(data).__name__}."
            )
        values = data.get(self.group_key, None)
        if values is None:
            raise KeyError(self._missing(self.group_key, "group_key"))
        return values

    def _missing(self, key, name: str) -> str:
        return (
            f"The storage holds no entry {key!r} (`{name}`): pass `{name}` naming the stored entry "
            f"(strategy={self.strategy!r})."
        )

    def _grouping(self, storage, n: int) -> _Groups:
        revision = storage.write_revision
        key = (id(storage), revision, n)
        cached = self._group_index
        if cached is not None and cached.key == key:
            return cached
        ids = _group_ids(self._group_values(storage, n), n)
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids)
        starts = counts.cumsum(0) - counts
        groups = _Groups(key=key, order=order, counts=counts, starts=starts)
        self._group_index = groups if self.cache_groups else None
        return groups

    # -- sampling ----------------------------------------------------------------------------------------------
    def _rand(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        gen = self._rng
        return torch.rand(
            *shape, generator=gen, dtype=dtype, device=None if gen is None else gen.device
        ).cpu()

    def _warn_small(self, what: str) -> None:
        if not self._warned_small_group:
            self._warned_small_group = True
            warnings.warn(
                f"PromptGroupSampler: {what}; the batch is completed by drawing again with replacement. Store "
                f"more groups or completions, or lower the batch size (this warning is issued once).",
                UserWarning,
                stacklevel=3,
            )

    def _choose_groups(self, count: int, num_groups: int) -> torch.Tensor:
        """``num_groups`` distinct groups, uniformly (completed with replacement when ``count`` is smaller)."""
        if count < num_groups:
            self._warn_small(f"the storage holds {count} groups and a batch takes {num_groups}")
            extra = (self._rand(num_groups - count, dtype=torch.float64) * count).long().clamp_(max=count - 1)
            return torch.cat([self._permutation(count), extra])
        if num_groups * num_groups <= count:  # draws collide with probability <= 1/2: redraw until distinct
            for _ in range(16):
                draw = (self._rand(num_groups, dtype=torch.float64) * count).long().clamp_(max=count - 1)
                if num_groups == 1 or torch.unique(draw).numel() == num_groups:
                    return draw  # uniform among the ordered tuples of distinct groups
        if num_groups * 8 > count:
            return self._permutation(count)[:num_groups]
        # few groups out of many: Floyd's algorithm draws a uniform subset in num_groups steps, not count
        chosen: dict[int, None] = {}
        draws = self._rand(num_groups, dtype=torch.float64).tolist()
        for j, u in zip(range(count - num_groups, count), draws):
            t = min(int(u * (j + 1)), j)
            chosen[j if t in chosen else t] = None
        return torch.tensor(list(chosen), dtype=torch.long)[self._permutation(num_groups)]

    def _permutation(self, n: int) -> torch.Tensor:
        gen = self._rng
        return torch.randperm(n, generator=gen, device=None if gen is None else gen.device).cpu()

    def _stamps(self, members: torch.Tensor) -> torch.Tensor:
        """The write clock of each item (``0`` for rows the sampler was never told of: the oldest)."""
        stamps = self._position_recency
        top = int(members.max()) + 1
        if top > stamps.numel():
            stamps = torch.cat([stamps, stamps.new_zeros(top - stamps.numel())])
        return stamps[members]

    def _rewards(self, storage, members: torch.Tensor) -> torch.Tensor:
        try:
            values = values_at(storage, self.reward_key, members, who=_WHO)
        except KeyError:
            values = self._non_tensor_entry(storage, members[:1])  # stored, but not as a tensor column?
            if values is None:
                raise KeyError(self._missing(self.reward_key, "reward_key")) from None
        if not isinstance(values, torch.Tensor):  # e.g. a NonTensorStack of Python numbers or strings
            got = f"non-tensor values ({type(values).__name__})"
            raise PROMPT_GROUP_REWARD.error(strategy=self.strategy, key=self.reward_key, got=got)
        return values.reshape(members.numel(), -1).double().mean(-1).cpu()

    def _non_tensor_entry(self, storage, rows: torch.Tensor):
        """The ``reward_key`` values of the items at ``rows`` when they are stored but not as a tensor column
        (e.g. strings in a tensor storage), else ``None``."""
        if not isinstance(storage, TensorStorage):
            return None
        values = storage.get(rows).get(self.reward_key, None)
        return None if values is None or isinstance(values, torch.Tensor) else values

    def can_sample(self, storage, batch_size: int) -> bool:
        """``True`` once ``storage`` holds an item and ``batch_size`` is made of whole groups (a multiple of
        ``num_groups`` or ``samples_per_group``)."""
        given = self.num_groups if self.num_groups is not None else self.samples_per_group
        return len(storage) > 0 and batch_size % given == 0

    def sample(self, storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        batch_size = check_batch_size(batch_size)
        num_groups, k = self._layout(batch_size)
        n = self._check_storage(storage)
        groups = self._grouping(storage, n)
        chosen = self._choose_groups(groups.counts.numel(), num_groups)
        sizes = groups.counts[chosen]
        starts = groups.starts[chosen]
        listed = sizes.tolist()
        smallest, width, total = min(listed), max(listed), sum(listed)
        if smallest < k:
            self._warn_small(f"a group holds {smallest} items and a batch takes {k} per group")
        if smallest == width == k:  # whole groups (the usual GRPO layout): nothing to choose
            if self.strategy in ("reward", "variance"):  # the rewards are checked as when a choice reads them
                self._rewards(storage, groups.order[:1])
            index = groups.order[(starts.unsqueeze(-1) + torch.arange(k)).reshape(-1)]
            return self._on_device(index, storage), {}
        if len(listed) * width <= _MAX_PADDING * total + _PADDING_SLACK:
            members = padded_members(groups.order, starts, sizes, width, ragged=smallest < width)
            columns = self._choose_in_rows(
                storage, members, sizes, k, ragged=smallest < width, short=smallest < k
            )
            index = members.gather(1, columns)
        else:  # a few very large groups: one row at a time, so as not to pad every row to the largest
            rows = []
            for start, size in zip(starts.tolist(), listed):
                members = groups.order[start : start + size].unsqueeze(0)
                columns = self._choose_in_rows(
                    storage, members, sizes.new_tensor([size]), k, ragged=False, short=size < k
                )
                rows.append(members.gather(1, columns))
            index = torch.cat(rows)
        return self._on_device(index.reshape(-1), storage), {}

    def _choose_in_rows(
        self, storage, members: torch.Tensor, sizes: torch.Tensor, k: int, *, ragged: bool, short: bool
    ) -> torch.Tensor:
        """``[G, k]`` columns of ``members`` (``[G, M]``, see :mod:`._group_choice`) chosen by the strategy.

        ``ragged``: rows are padded (groups of different sizes); ``short``: a group holds fewer than ``k`` items.
        """
        g, width = members.shape
        real = torch.arange(width) < sizes.unsqueeze(-1) if ragged else None
        uniform = self._rand(g, k, dtype=torch.float64) if short else None
        if self.strategy == "variance":
            rewards = self._rewards(storage, members.reshape(-1)).view(g, width)
            if real is None:
                real = torch.ones(g, width, dtype=torch.bool)
            columns = max_variance_columns(rewards, real, sizes, k)
            whole = sizes <= k  # every item (completed at random): nothing to choose
            if bool(whole.any()):
                columns = torch.where(whole.unsqueeze(-1), take_ranks(sizes, k, uniform), columns)
            return columns
        if self.strategy == "random":  # a uniform order of each row (padding last)
            scores = self._rand(g, width)
            if real is not None:
                scores.masked_fill_(~real, 2.0)
            ranked = torch.argsort(scores, dim=1)
        elif self.strategy == "recency":
            ranked = ranked_columns(self._stamps(members), real, -1)
        else:
            rewards = self._rewards(storage, members.reshape(-1)).view(g, width)
            ranked = ranked_columns(rewards, real, float("-inf"))
        return ranked.gather(1, take_ranks(sizes, k, uniform)) if short else ranked[:, :k]

    @staticmethod
    def _on_device(index: torch.Tensor, storage) -> torch.Tensor:
        device = getattr(storage, "device", None)
        if isinstance(device, torch.device) and device.type != "cpu":
            return index.to(device)
        return index

    # -- state -------------------------------------------------------------------------------------------------
    def _empty(self) -> None:
        super()._empty()
        if self.is_shared:  # the workers hold these tensors: reset them in place
            self._position_recency.zero_()
            self._clock.zero_()
        else:
            self._position_recency = torch.zeros(0, dtype=torch.long)
            self._clock = torch.zeros(1, dtype=torch.long)

    def state_dict(self) -> dict[str, Any]:
        """The write clock of ``strategy="recency"`` (``{}`` for the other strategies, which keep no state, and
        whose :meth:`load_state_dict` takes ``{}``)."""
        if self.strategy != "recency":
            return {}
        return {"position_recency": self._position_recency.clone(), "recency_clock": self._recency_clock}

    # load_state_dict: NOTE [sampler state validation] in samplers/base.py (check everything, then install)
    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        if self.strategy != "recency":
            if state:
                raise ValueError(
                    f"PromptGroupSampler(strategy={self.strategy!r}) keeps no state, and got a state with "
                    f"{sorted(state)}: load it into a sampler built with strategy='recency'."
                )
            return {}
        if set(state) != {"position_recency", "recency_clock"}:
            raise ValueError(
                f"A PromptGroupSampler(strategy='recency') state holds 'position_recency' and 'recency_clock', "
                f"got {sorted(state)}."
            )
        stamps = state["position_recency"]
        if not isinstance(stamps, torch.Tensor) or stamps.is_floating_point() or stamps.dtype is torch.bool:
            raise TypeError(
                f"A PromptGroupSampler(strategy='recency') state's `position_recency` is a 1-D integer tensor of "
                f"write stamps, got {type(stamps).__name__ if not isinstance(stamps, torch.Tensor) else stamps.dtype}."
            )
        stamps = stamps.detach().to("cpu", torch.long, copy=True).reshape(-1)
        clock = state["recency_clock"]
        if (
            isinstance(clock, bool)
            or not isinstance(clock, int)
            or clock < 0
            or bool((stamps > clock).any())
            or bool((stamps < 0).any())
        ):
            raise ValueError(
                f"Inconsistent recency state: `recency_clock`={clock!r} must be an int >= 0 and >= every stamp "
                f"in `position_recency`."
            )
        if self.is_shared and stamps.numel() > self._position_recency.numel():
            raise ValueError(
                f"The recency state holds {stamps.numel()} stamps and this sampler shares "
                f"{self._position_recency.numel()} (its storage capacity): load a state saved with the same "
                f"capacity."
            )
        return {"position_recency": stamps, "recency_clock": clock}

    def _apply_state(self, state: dict[str, Any]) -> None:
        if self.strategy != "recency":
            return
        stamps = state["position_recency"]
        if self.is_shared:  # the workers hold these tensors: write into them
            self._position_recency.zero_()
            self._position_recency[: stamps.numel()] = stamps
        else:
            self._position_recency = stamps
        self._clock[0] = state["recency_clock"]
        self._forget_derived()

    def dumps(self, path, **kwargs) -> None:
        """Saves the write clock of ``strategy="recency"`` to the checkpoint directory ``path`` (see
        :meth:`Component.dumps <torchrl.data.replay_buffers.component.Component.dumps>`). A no-op for the other
        strategies, which keep no state (nothing is written, as in TorchRL).

        Examples:
            >>> import os, tempfile
            >>> from torchrl.data import PromptGroupSampler
            >>> with tempfile.TemporaryDirectory() as d:
            ...     PromptGroupSampler(num_groups=2).dumps(os.path.join(d, "sampler"))
            ...     os.listdir(d)
            []
        """
        if self.strategy == "recency":
            super().dumps(path, **kwargs)

    def loads(self, path) -> None:
        """Loads a checkpoint written by :meth:`dumps` (``strategy="recency"``); a no-op for the other
        strategies, which keep no state (``path`` is not read)."""
        if self.strategy == "recency":
            super().loads(path)

    def __repr__(self) -> str:
        size = (
            f"num_groups={self.num_groups}"
            if self.num_groups is not None
            else f"samples_per_group={self.samples_per_group}"
        )
        return (
            f"{type(self).__name__}({size}, group_key={self.group_key!r}, strategy={self.strategy!r}, "
            f"reward_key={self.reward_key!r}, cache_groups={self.cache_groups})"
        )
