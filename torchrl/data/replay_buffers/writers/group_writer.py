"""Writing groups of completions whole: :class:`GroupWriter`, and the keep-if rule :func:`reward_variance_above`.

A group is the completions of one prompt (items with equal ``group_key``). GRPO-style training computes each
completion's advantage within its group, so a group is kept, evicted and sampled whole: this writer hands whole
groups to a :class:`~torchrl.data.PackedSequenceStorage` (which frees whole groups when it needs room), frees
the oldest groups first when ``max_groups`` is reached, frees groups of stale policies first
(``max_policy_lag``) and drops, at write time, the groups a ``keep_if`` rule rejects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase, lazy_stack

from torchrl._validation import check_positive_int
from torchrl.data.replay_buffers.loading.sequence_items import as_items, segment_ids
from torchrl.data.replay_buffers.storages.packed_sequence import PackedSequenceStorage
from torchrl.data.replay_buffers.writers.writer import Writer

__all__ = ["GroupWriter", "reward_variance_above"]


def reward_variance_above(threshold: float = 0.0, reward_key="reward") -> Callable[[TensorDictBase], bool]:
    """A ``keep_if`` rule for :class:`GroupWriter`: keeps a group whose rewards have a variance above
    ``threshold`` (a group whose completions all got the same reward gives a zero group-relative advantage, so
    it teaches nothing). The rule is a :func:`functools.partial` of a module-level function, so it pickles: a
    buffer whose writer holds it can be sent to a spawned process.

    Args:
        threshold (float): the variance a group must exceed. Defaults to ``0.0``.
        reward_key (NestedKey): the reward entry (one or more values per sequence; averaged per sequence).
            Defaults to ``"reward"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict, lazy_stack
        >>> from torchrl.data import reward_variance_above
        >>> rule = reward_variance_above(0.0)
        >>> rule(lazy_stack([TensorDict(reward=torch.tensor(r)) for r in (1.0, 1.0)]))
        False
        >>> rule(lazy_stack([TensorDict(reward=torch.tensor(r)) for r in (0.0, 1.0)]))
        True
    """
    return functools.partial(_reward_variance_keep, threshold=float(threshold), reward_key=reward_key)


def _reward_variance_keep(group: TensorDictBase, *, threshold: float, reward_key) -> bool:
    """What :func:`reward_variance_above` returns, bound to its ``threshold`` and ``reward_key``."""
    rewards = group.get(reward_key)
    rewards = rewards.reshape(rewards.shape[0], -1).double().mean(-1)
    return bool(rewards.numel() > 1 and float(rewards.var(unbiased=False)) > threshold)


def _rule_name(rule) -> str:
    """A readable name of a ``keep_if`` rule (errors, repr): a partial shows its function and bound arguments."""
    if isinstance(rule, functools.partial):
        bound = [repr(a) for a in rule.args] + [f"{k}={v!r}" for k, v in rule.keywords.items()]
        name = getattr(rule.func, "__qualname__", repr(rule.func))
        if rule.func is _reward_variance_keep:
            name = "reward_variance_above"
        return f"{name}({', '.join(bound)})"
    return getattr(rule, "__qualname__", repr(rule))


class GroupWriter(Writer):
    """Writes whole groups of sequences into a :class:`~torchrl.data.PackedSequenceStorage`, and never evicts
    part of one.

    :meth:`extend` takes one or more whole groups: a batch of sequences (a list of TensorDicts of batch size
    ``[]``, a lazy stack of them, or a dense TensorDict ``[n]``) in which the sequences with equal ``group_key``
    form one group. Groups are written in the order of their first sequence in the batch, each group's
    sequences in batch order, one group after the other. Capacity is the storage's (``max_tokens`` and
    ``max_sequences``) and, if given, ``max_groups``; eviction is FIFO by group.

    Keyword Args:
        group_key (NestedKey): the entry that names a sequence's group (one value per sequence: an int id, or a
            tensor such as the prompt's tokens, whose equal values form a group). Defaults to ``"prompt_id"``.
        max_groups (int, optional): at most this many live groups; the oldest are freed first. Defaults to
            ``None`` (the storage's capacity alone).
        max_policy_lag (int, optional): at each write, the live groups whose policy version is more than
            ``max_policy_lag`` versions behind the newest (stored or written) are freed, and such groups in the
            batch are not written. Defaults to ``None`` (no policy-age eviction).
        policy_version_key (NestedKey): the entry holding the version of the policy that generated a sequence
            (read with ``max_policy_lag``; a group's version is the largest of its sequences'). Defaults to
            ``"policy_version"``.
        keep_if (callable, optional): ``keep_if(group) -> bool``, called at write time with each group's
            sequences as a lazy stack; a group for which it returns False is not written (e.g.
            :func:`reward_variance_above`). Defaults to ``None`` (every group is kept).

    Raises:
        TypeError: on :meth:`add` (a group is a batch: use :meth:`extend`), or with a storage that is not a
            :class:`~torchrl.data.PackedSequenceStorage`.
        KeyError: when a sequence has no ``group_key`` (or no ``policy_version_key`` with ``max_policy_lag``).
        ValueError: for a group larger than the storage (tokens or sequences). Nothing is written then.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import GroupWriter, PackedSequenceStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=PackedSequenceStorage(1000, max_sequences=100),
        ...                   writer=GroupWriter(max_groups=2))
        >>> def group(prompt_id, lengths):
        ...     return [TensorDict(tokens=torch.ones(n, dtype=torch.long), prompt_id=torch.tensor(prompt_id))
        ...             for n in lengths]
        >>> rb.extend(group(7, [3, 5]) + group(8, [2, 2, 4]))
        tensor([0, 1, 2, 3, 4])
        >>> _ = rb.extend(group(9, [6]))  # max_groups=2: the oldest group (prompt 7) is freed whole
        >>> rb.storage.live_slots().tolist()
        [2, 3, 4, 5]
    """

    def __init__(
        self,
        *,
        group_key="prompt_id",
        max_groups: int | None = None,
        max_policy_lag: int | None = None,
        policy_version_key="policy_version",
        keep_if: Callable[[TensorDictBase], Any] | None = None,
    ) -> None:
        super().__init__()
        self.group_key = group_key
        self.max_groups = check_positive_int("max_groups", max_groups, allow_none=True)
        if max_policy_lag is not None:
            if isinstance(max_policy_lag, bool) or not isinstance(max_policy_lag, int) or max_policy_lag < 0:
                raise ValueError(
                    f"`max_policy_lag` is the number of policy versions a group may lag behind the newest (an int "
                    f">= 0) or None; got {max_policy_lag!r}."
                )
        self.max_policy_lag = max_policy_lag
        self.policy_version_key = policy_version_key
        if keep_if is not None and not callable(keep_if):
            raise TypeError(
                f"`keep_if` is a callable keep_if(group) -> bool (e.g. reward_variance_above(0.0)) or None; got a "
                f"{type(keep_if).__name__}."
            )
        self.keep_if = keep_if

    def register_storage(self, storage) -> None:
        if not isinstance(storage, PackedSequenceStorage):
            raise TypeError(
                f"GroupWriter writes into a PackedSequenceStorage (it frees whole groups of packed sequences); "
                f"got a {type(storage).__name__}. Build the buffer with storage=PackedSequenceStorage(...)."
            )
        super().register_storage(storage)

    def add(self, data):
        raise TypeError(
            "GroupWriter.add() is not supported: a group is written whole, as a batch. Use extend([seq_1, ..., "
            "seq_G]) (rb.extend(...)) with every sequence of the group."
        )

    # -- writes ----------------------------------------------------------------------------------------------
    def _group_value(self, item, i: int):
        try:
            value = item.get(self.group_key)
        except KeyError:
            value = None
        if not isinstance(value, torch.Tensor):
            raise KeyError(
                f"GroupWriter.extend: sequence {i} of the write has no tensor entry group_key={self.group_key!r} "
                f"(got {type(value).__name__}); every sequence names its group (e.g. prompt_id=torch.tensor(3)). "
                f"Nothing was written."
            )
        return value.item() if value.numel() == 1 else tuple(value.reshape(-1).tolist())

    def _version(self, item, i: int) -> int:
        try:
            value = item.get(self.policy_version_key)
        except KeyError:
            value = None
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise KeyError(
                f"GroupWriter.extend: sequence {i} of the write has no scalar tensor entry policy_version_key="
                f"{self.policy_version_key!r}, which max_policy_lag={self.max_policy_lag} reads. Store the policy "
                f"version of each sequence. Nothing was written."
            )
        return int(value.item())

    def extend(self, data) -> torch.Tensor:
        """Writes the whole groups of ``data`` (see the class docstring); returns the slots written, group after
        group (the groups ``keep_if`` rejects, or stale on arrival, are not written)."""
        storage = self._require_storage()
        items = as_items(data, "GroupWriter.extend")
        groups: dict[Any, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(self._group_value(item, i), []).append(i)
        members = list(groups.values())
        versions = None
        if self.max_policy_lag is not None:
            versions = [max(self._version(items[i], i) for i in idx) for idx in members]
        if self.keep_if is not None:
            kept = []
            for g, idx in enumerate(members):
                verdict = self.keep_if(lazy_stack([items[i] for i in idx]))
                if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
                    verdict = bool(verdict)
                if not isinstance(verdict, bool):
                    raise TypeError(
                        f"GroupWriter.extend: keep_if({_rule_name(self.keep_if)}) "
                        f"returned {verdict!r} for group {g}; it must return a bool (or a one-element tensor). "
                        f"Nothing was written."
                    )
                if verdict:
                    kept.append(g)
            members = [members[g] for g in kept]
            versions = None if versions is None else [versions[g] for g in kept]
        if self.max_groups is not None and len(members) > self.max_groups:  # a ring: the last groups survive
            members = members[-self.max_groups :]
            versions = None if versions is None else versions[-self.max_groups :]
        batch_newest = None
        if versions:  # groups already stale on arrival are not written
            newest = max(versions)
            live = storage.live_slots()
            if live.numel():
                newest = max(newest, int(storage.fixed_entry(self.policy_version_key, live).max()))
            fresh = [g for g, v in enumerate(versions) if v >= newest - self.max_policy_lag]
            members = [members[g] for g in fresh]
            batch_newest = newest
        if not members:
            return torch.zeros((0,), dtype=torch.long)
        order = [i for idx in members for i in idx]
        sizes = [len(idx) for idx in members]
        written = storage.extend_sequences(
            [items[i] for i in order], group_sizes=sizes,
            free=lambda s: self._to_free(s, len(members), batch_newest),
        )
        self._counters_add(int(written.numel()))
        storage.mark_update(written)
        return written

    def _to_free(self, storage: PackedSequenceStorage, new_groups: int, batch_newest: int | None) -> torch.Tensor:
        """The live slots to free before ``new_groups`` groups are written (under the storage's write lock)."""
        if self.max_policy_lag is None and self.max_groups is None:
            return torch.zeros((0,), dtype=torch.long)
        slots, starts, sizes = storage.live_groups()
        if not slots.numel():
            return slots
        group_of = segment_ids(sizes)
        drop = torch.zeros(sizes.numel(), dtype=torch.bool)
        if self.max_policy_lag is not None:
            versions = storage.fixed_entry(self.policy_version_key, slots).reshape(slots.numel(), -1)[:, 0].long()
            group_version = torch.full((sizes.numel(),), -(2**62), dtype=torch.long).scatter_reduce(
                0, group_of, versions, reduce="amax"
            )
            newest = int(group_version.max())
            if batch_newest is not None:
                newest = max(newest, batch_newest)
            drop |= group_version < newest - self.max_policy_lag
        if self.max_groups is not None:
            excess = int((~drop).sum()) + new_groups - self.max_groups
            if excess > 0:  # the oldest surviving groups
                survivors = (~drop).nonzero().squeeze(-1)
                drop[survivors[:excess]] = True
        return slots[drop[group_of]]

    def _counters_add(self, n: int) -> None:
        if self._counters is None:
            self._init_counters()
        self._counters["write_count"] = self._counters["write_count"] + n

    # -- state -----------------------------------------------------------------------------------------------
    def _empty(self, empty_write_count: bool = True) -> None:
        if empty_write_count and self._counters is not None:
            self._counters["write_count"] = 0

    def state_dict(self) -> dict[str, Any]:
        return {"_write_count": self.write_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        count = state_dict.get("_write_count", 0) if isinstance(state_dict, dict) else 0
        if count:
            self._counters_add(int(count) - self.write_count)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(group_key={self.group_key!r}, max_groups={self.max_groups}, "
            f"max_policy_lag={self.max_policy_lag}, keep_if={_rule_name(self.keep_if)})"
        )
