"""Hindsight experience replay (HERReplayBuffer, HindsightStrategy). TorchRL's module path.

Data model. The storage is a 1-D ring of ``n`` filled rows of transitions. An episode ends at a row whose
``end_key`` (``("next", "done")``) or ``("next", "terminated")`` flag is set; the newest row also ends one (when
the storage is full, so does the row written last: no goal is drawn across the write seam, where the newest
step meets the oldest). Positions are *unrolled* (``u = (row - offset) % n``, ``offset`` the oldest row) so that
every episode is one run ``[start, end]`` of unrolled positions, including the one written across the physical
end of the ring. Sampling relabels the head of each batch: the goal of a sampled step ``t`` is replaced by the
stored ``achieved_goal_key`` value of a step of the same episode chosen by the :class:`HindsightStrategy`, and
the reward is recomputed by ``reward_fn``. With ``fragmented=True`` (steps of several trajectories interleaved), an
episode is instead a run of consecutive steps of one trajectory id, ordered by step number (NOTE [interleaved runs
index] in ``trajectories/interleaved.py``), and goals are drawn among the run's positions.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, unravel_key

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.replay_buffers.tensordict import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler
from torchrl.data.replay_buffers.storages import ListStorage, TensorStorage
from torchrl.data.replay_buffers.trajectories.columns import column_or_none
from torchrl.data.replay_buffers.trajectories.ends import find_trajectories
from torchrl.data.replay_buffers.trajectories.interleaved import check_fragmented_step_key
from torchrl.data.replay_buffers.trajectories.layout import newest_row, oldest_row
from torchrl.data.replay_buffers.trajectories.run_positions import RunPositions

HER_RATIO_RANGE = TorchRLPhrase(
    ValueError,
    r"her_ratio must be in \[0, 1\]",
    "her_ratio must be in [0, 1] (the fraction of each batch relabelled), got {got}. Pass e.g. her_ratio=0.8, "
    "or 0 to sample without relabelling.",
)
HER_1D_STORAGE = TorchRLPhrase(
    NotImplementedError,
    "only supports 1D storages",
    "HERReplayBuffer only supports 1D storages (episodes along one time dim); got a storage with ndim={ndim}. "
    "Store transitions in a 1-D storage (e.g. LazyTensorStorage(n), written with rb.extend(td.reshape(-1)) "
    "after splitting episodes per env), or use storage.flatten().",
)
HER_MISSING_KEYS = TorchRLPhrase(
    KeyError,
    "The following keys are not present in storage",
    "The following keys are not present in storage: {missing}. HERReplayBuffer reads the goal and the "
    "achieved goal of every stored step: store both entries, or pass the keys that hold them "
    "(goal_key=..., achieved_goal_key=...).",
)

__all__ = ["HERReplayBuffer", "HindsightStrategy"]

_CHECKPOINT_SCHEMA = 1
#: ``enum.StrEnum`` where Python has it (3.11+), as in TorchRL; its ``(str, Enum)`` equivalent before.
_STR_ENUM_BASES = (enum.StrEnum,) if hasattr(enum, "StrEnum") else (str, enum.Enum)


class HindsightStrategy(*_STR_ENUM_BASES):
    """Where a relabelled transition's new goal comes from (a ``StrEnum``: members compare equal to their value).

    - ``FUTURE`` (``"future"``): a step of the same episode at or after the sampled one, uniformly in
      ``[t, episode end]`` (``t`` itself included, as in TorchRL; SB3 draws strictly later steps).
    - ``FINAL`` (``"final"``): the last step of the episode.
    - ``EPISODE`` (``"episode"``): any step of the episode, uniformly.
    - ``RANDOM`` (``"random"``): any stored step, uniformly (it may belong to another episode).

    Examples:
        >>> from torchrl.data import HindsightStrategy
        >>> HindsightStrategy("future") is HindsightStrategy.FUTURE, HindsightStrategy.FINAL == "final"
        (True, True)
        >>> str(HindsightStrategy.EPISODE)
        'episode'
    """

    FUTURE = "future"
    FINAL = "final"
    EPISODE = "episode"
    RANDOM = "random"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def _strategy(strategy) -> HindsightStrategy:
    try:
        return HindsightStrategy(strategy)
    except ValueError:
        choices = [s.value for s in HindsightStrategy]
        raise ValueError(
            f"{strategy!r} is not a valid HindsightStrategy: `strategy` must be one of {choices} (or a "
            f"HindsightStrategy member)."
        ) from None


def _her_ratio(value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise HER_RATIO_RANGE.error(got=repr(value))
    return float(value)


def _key(name: str, key) -> str | tuple[str, ...]:
    try:
        return unravel_key(key)
    except Exception:
        raise TypeError(f"`{name}` must be a str or a tuple of str (a nested key), got {key!r}.") from None


def _sibling(key, name: str):
    """``key`` with its last element replaced by ``name`` (``("next", "done")`` -> ``("next", name)``)."""
    return name if isinstance(key, str) else (*key[:-1], name)


def _as_json_key(key):
    return key if isinstance(key, str) else list(key)


class HERReplayBuffer(TensorDictReplayBuffer):
    """A :class:`TensorDictReplayBuffer` that relabels goals with hindsight when it samples.

    Goal-conditioned tasks with sparse rewards rarely reach the goal they were given, so most stored rewards
    say nothing. Hindsight experience replay (Andrychowicz et al., 2017) pretends, for a fraction ``her_ratio``
    of each batch, that the goal was one the agent did reach later in the same episode, and recomputes the
    reward for it. Nothing is rewritten in the storage: each sampled batch is relabelled, so one stored episode
    gives many goals.

    For the first ``her_ratio`` fraction of each batch (the head: ``int(B * her_ratio)`` positions, as in TorchRL,
    or, with ``relabel_rounding="stochastic"``, that count plus one with the probability of the fractional part
    of ``B * her_ratio``, so that the expected fraction is ``her_ratio`` whatever ``B``), the ``goal_key`` entry (and
    ``("next", *goal_key)`` when the batch has it) is set to the stored ``achieved_goal_key`` value of a step
    chosen by ``strategy`` (see :class:`HindsightStrategy`), never across an episode boundary nor across the
    ring's write seam, and ``reward_key`` is set to ``reward_fn(relabelled_part)``. The batch goes through the
    buffer's transforms first; goals are read from the storage as written.

    ``"future"`` draws from ``[t, episode end]``: the sampled step itself may give the goal. The goal of step
    ``j`` is its ``achieved_goal_key`` entry, read at the root by default (the state before step ``j``'s
    action); pass ``achieved_goal_key=("next", "achieved_goal")`` to use the goal reached after it.

    Args:
        reward_fn (callable): ``reward_fn(td) -> Tensor`` gets the relabelled part of the batch (goals already
            replaced) and returns its rewards, shaped ``[n]`` or ``[n, 1]``. It is code: :meth:`dumps` does not
            save it, build the buffer with it before :meth:`loads`.

    Keyword Args:
        her_ratio (float): the fraction of each batch relabelled, in ``[0, 1]``. Defaults to ``0.8``.
        strategy (str or HindsightStrategy): where new goals come from. Defaults to ``"future"``.
        goal_key (NestedKey): the goal the policy is conditioned on. Defaults to ``"desired_goal"``.
        achieved_goal_key (NestedKey): the stored goal each step reached. Defaults to ``"achieved_goal"``.
        reward_key (NestedKey): the reward entry rewritten. Defaults to ``("next", "reward")``.
        end_key (NestedKey): the episode-end flag; its ``"terminated"`` sibling (``("next", "terminated")``)
            ends episodes too when stored. Defaults to ``("next", "done")``.
        sampler (Sampler, optional): draws the sampled steps. Defaults to :class:`~torchrl.data.RandomSampler`.
        relabel_rounding (str): how many of ``B`` sampled steps are relabelled: ``"floor"``, ``int(B * her_ratio)``
            as in TorchRL (a batch of 1 at ``her_ratio=0.8`` is never relabelled), or ``"stochastic"``, that count
            plus one with the probability of the fractional part (the expected fraction is ``her_ratio`` for any
            ``B``; drawn from the buffer's generator). Defaults to ``"floor"``.
        fragmented (bool): the steps of several trajectories are interleaved in the storage (vectorised envs or
            collectors writing step by step): a sampled step's episode is its run of consecutive steps of one
            trajectory (``traj_key``, ordered by ``step_key``; a missing step ends a run as an episode end does), and
            goals are drawn in step order within it, wherever its steps are stored. ``end_key`` plays no role then.
            The keywords of ``SliceSampler(fragmented=True)``, which TorchRL's ``HERReplayBuffer`` does not take:
            issue 41 adds them. Defaults to ``False``.
        step_key (NestedKey): with ``fragmented=True``, the stored per-step step number. Defaults to
            ``"step_count"``.
        traj_key (NestedKey, optional): with ``fragmented=True``, the stored per-step trajectory id. Defaults to
            ``None``: the storage's ``("collector", "traj_ids")``, else ``"episode"``.
        **kwargs: the other arguments of :class:`TensorDictReplayBuffer` (``storage``, ``batch_size``,
            ``transform``, ``generator``, ...). The storage must be 1-D: ``sample()`` raises
            ``NotImplementedError`` for another (as in TorchRL, the check is made when sampling).

    .. note::
        With DataLoader workers (``rb.as_dataset().loader(num_workers=N)``), each worker relabels its own
        batches with the buffer's generator reseeded per worker, so a DataLoader with a fixed ``generator`` gives
        the same batches run after run. Under spawn/forkserver ``reward_fn`` is pickled: use a module-level
        function, not a lambda.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import HERReplayBuffer, LazyTensorStorage
        >>> def reward_fn(td):  # 1 when the goal is reached after the step
        ...     return (td["next", "achieved_goal"] == td["desired_goal"]).all(-1, keepdim=True).float()
        >>> rb = HERReplayBuffer(reward_fn, her_ratio=1.0, storage=LazyTensorStorage(20), batch_size=6,
        ...                      generator=torch.Generator().manual_seed(0))
        >>> pos = torch.arange(10.0).unsqueeze(-1)  # two episodes of 5 steps of a point moving right
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> done[[4, 9]] = True
        >>> _ = rb.extend(TensorDict({"achieved_goal": pos, "desired_goal": torch.full((10, 1), 100.0),
        ...     "next": {"achieved_goal": pos + 1, "reward": torch.zeros(10, 1), "done": done}}, batch_size=[10]))
        >>> batch = rb.sample()
        >>> goal, step = batch["desired_goal"].squeeze(-1), batch["index"]
        >>> bool((goal < 100).all()), bool((goal >= step).all()), bool((goal // 5 == step // 5).all())
        (True, True, True)
        >>> bool((batch["next", "reward"].squeeze(-1) == (goal == step + 1).float()).all())
        True
    """

    def __init__(
        self,
        reward_fn: Callable[[TensorDictBase], torch.Tensor],
        *,
        her_ratio: float = 0.8,
        strategy: str | HindsightStrategy = "future",
        goal_key="desired_goal",
        achieved_goal_key="achieved_goal",
        reward_key=("next", "reward"),
        end_key=("next", "done"),
        sampler: Sampler | None = None,
        relabel_rounding: str = "floor",
        fragmented: bool = False,
        step_key="step_count",
        traj_key=None,
        **kwargs,
    ) -> None:
        if relabel_rounding not in ("floor", "stochastic"):
            raise ValueError(
                f"`relabel_rounding` must be 'floor' (TorchRL's int(batch * her_ratio)) or 'stochastic' (an "
                f"expected fraction of exactly her_ratio), got {relabel_rounding!r}."
            )
        if not callable(reward_fn):
            raise TypeError(
                f"`reward_fn` must be a callable td -> rewards (e.g. a function comparing td['desired_goal'] "
                f"with the achieved goal), got {type(reward_fn).__name__}."
            )
        her_ratio = _her_ratio(her_ratio)
        strategy = _strategy(strategy)
        fragmented = check_fragmented_step_key(fragmented, step_key)
        step_key = None if step_key is None else _key("step_key", step_key)
        traj_key = None if traj_key is None else _key("traj_key", traj_key)
        keys = {name: _key(name, value) for name, value in (
            ("goal_key", goal_key), ("achieved_goal_key", achieved_goal_key), ("reward_key", reward_key),
            ("end_key", end_key))}  # fmt: skip
        self.reward_fn = reward_fn
        self.her_ratio = her_ratio
        self.strategy = strategy
        self.relabel_rounding = relabel_rounding
        self.goal_key = keys["goal_key"]
        self.achieved_goal_key = keys["achieved_goal_key"]
        self.reward_key = keys["reward_key"]
        self.end_key = keys["end_key"]
        self.fragmented = fragmented
        self.step_key, self.traj_key = step_key, traj_key
        self._runs = RunPositions(traj_key, step_key) if fragmented else None
        self._episode_ends_cache: torch.Tensor | None = None
        self._unrolled_ends: torch.Tensor | None = None
        self._last_cache_key: tuple | None = None
        self._cache_revision: Any = None
        self._keys_checked = False
        # a storage with ndim != 1 is refused when sampling (NotImplementedError), as TorchRL does: it may still
        # be filled and read as a plain TensorDictReplayBuffer
        super().__init__(sampler=RandomSampler() if sampler is None else sampler, **kwargs)

    @property
    def terminated_key(self):
        """The ``"terminated"`` sibling of :attr:`end_key`, which ends episodes too (``("next", "terminated")``)."""
        return _sibling(self.end_key, "terminated")

    def __repr__(self) -> str:
        storage = self._storage if self._initialized else None
        return (
            f"{type(self).__name__}(strategy={self.strategy.value!r}, her_ratio={self.her_ratio}, "
            f"goal_key={self.goal_key!r}, achieved_goal_key={self.achieved_goal_key!r}, "
            f"reward_key={self.reward_key!r}, storage={storage!r})"
        )

    # -- sampling -----------------------------------------------------------------------------------------------
    def _sample(self, batch_size: int, transform: bool = True):
        data, info = super()._sample(batch_size, transform=transform)
        self._relabel(data, info["index"])
        return data, info

    def _relabel(self, data, index) -> None:
        storage = self._storage
        if storage.ndim != 1:
            raise HER_1D_STORAGE.error(ndim=storage.ndim)
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"HERReplayBuffer relabels TensorDict batches; the sampled batch is a {type(data).__name__}. "
                f"Store TensorDicts, or check that the buffer's transforms return one."
            )
        if not self._keys_checked:
            self._check_goal_keys(storage)
        if isinstance(index, tuple):
            index = index[0]
        index = torch.as_tensor(index).reshape(-1)
        n_her = self._n_relabelled(index.numel())
        if n_her == 0:
            return
        with self._replay_lock:
            rows = index[:n_her].to("cpu", torch.long)
            if self.fragmented:
                source = self._run_goal_sources(storage, rows)
            else:
                ends, offset, n = self._episode_layout(storage)
                if not ends.numel():
                    return
                source = self._goal_sources(rows, ends, offset, n)
            goals = self._stored_goals(storage, source)
        self._write_goals(data, n_her, goals)

    def _n_relabelled(self, batch: int) -> int:
        """``int(batch * her_ratio)``; "stochastic": plus one with the probability of the fractional part."""
        exact = batch * self.her_ratio
        if self.relabel_rounding == "floor":
            return min(int(exact), batch)
        n = math.floor(exact + 1e-9)
        frac = exact - n
        if frac > 1e-9 and float(torch.rand((), generator=self._generator_cpu())) < frac:
            n += 1
        return min(n, batch)

    def _generator_cpu(self) -> torch.Generator | None:
        rng = self._rng
        return rng if rng is None or rng.device.type == "cpu" else None

    def _uniform(self, shape) -> torch.Tensor:
        rng = self._rng
        device = "cpu" if rng is None else rng.device
        return torch.rand(shape, generator=rng, device=device, dtype=torch.float64).cpu()

    def _goal_sources(self, rows: torch.Tensor, ends: torch.Tensor, offset: int, n: int) -> torch.Tensor:
        """The storage rows whose achieved goal relabels the sampled ``rows`` (see the module docstring)."""
        if self.strategy is HindsightStrategy.RANDOM:
            return torch.floor(self._uniform(rows.shape) * n).long().clamp_(max=n - 1)
        unrolled = (rows - offset) % n
        # the first end at or after the step (numpy's searchsorted: torch's is ~1000x slower on CPU for this size)
        episode = torch.from_numpy(np.searchsorted(ends.numpy(), unrolled.numpy(), side="left"))
        end = ends[episode]
        if self.strategy is HindsightStrategy.FINAL:
            source = end
        else:
            if self.strategy is HindsightStrategy.FUTURE:
                low = unrolled
            else:  # EPISODE
                low = torch.where(episode > 0, ends[(episode - 1).clamp_(min=0)] + 1, torch.zeros_like(end))
            span = end - low + 1
            source = low + torch.minimum(torch.floor(self._uniform(rows.shape) * span).long(), span - 1)
        return (source + offset) % n

    def _run_goal_sources(self, storage, rows: torch.Tensor) -> torch.Tensor:
        """``fragmented=True``: :meth:`_goal_sources` within each sampled step's run of consecutive steps, found in
        the interleaved index (:class:`~torchrl.data.replay_buffers.trajectories.run_positions.RunPositions`)."""
        lookup = self._runs
        lookup.refresh(storage)
        if self.strategy is HindsightStrategy.RANDOM:
            n = len(storage)
            return torch.floor(self._uniform(rows.shape) * n).long().clamp_(max=n - 1)
        position, first, last = lookup.locate(rows)
        if self.strategy is HindsightStrategy.FINAL:
            source = last
        else:
            low = position if self.strategy is HindsightStrategy.FUTURE else first
            span = last - low + 1
            source = low + torch.minimum(torch.floor(self._uniform(rows.shape) * span).long(), span - 1)
        return lookup.cells(source)

    def _stored_goals(self, storage, rows: torch.Tensor) -> torch.Tensor:
        key = self.achieved_goal_key
        if isinstance(storage, TensorStorage):
            column = storage.get_entry(key)
            if column is not None:
                return column[rows.to(column.device)]
        items = storage.get(rows)
        if isinstance(items, list):
            return torch.stack([torch.as_tensor(item.get(key)) for item in items])
        return items.get(key)

    def _write_goals(self, data: TensorDictBase, n_her: int, goals: torch.Tensor) -> None:
        head = slice(0, n_her)
        for key in (self.goal_key, ("next", *((self.goal_key,) if isinstance(self.goal_key, str) else self.goal_key))):
            current = data.get(key, None)
            if current is None:
                if key == self.goal_key:
                    raise KeyError(
                        f"The sampled batch has no `goal_key` entry {key!r} to relabel (the buffer's transforms "
                        f"may have removed it). Keep it in the sampled data."
                    )
                continue
            data.set_at_(key, goals.to(current.device, current.dtype).reshape(current[head].shape), head)
        reward = data.get(self.reward_key, None)
        if reward is None:
            raise KeyError(
                f"The sampled batch has no `reward_key` entry {self.reward_key!r} for the recomputed rewards. "
                f"Store it (e.g. zeros) or pass the key that holds rewards as reward_key=."
            )
        new = self.reward_fn(data[head])
        new = torch.as_tensor(new)
        if new.numel() != reward[head].numel():
            raise ValueError(
                f"`reward_fn` returned shape {list(new.shape)} for {n_her} relabelled transitions whose "
                f"{self.reward_key!r} entry has shape {list(reward[head].shape)}: return one reward per "
                f"transition, shaped [{n_her}] or [{n_her}, 1]."
            )
        data.set_at_(self.reward_key, new.to(reward.device, reward.dtype).reshape(reward[head].shape), head)

    def _check_goal_keys(self, storage) -> None:
        item = storage.get(0)
        missing = [
            f"{name}={key!r}"
            for name, key in (("goal_key", self.goal_key), ("achieved_goal_key", self.achieved_goal_key))
            if not isinstance(item, TensorDictBase) or item.get(key, None) is None
        ]
        if missing:
            raise HER_MISSING_KEYS.error(missing=", ".join(missing))
        self._keys_checked = True

    # -- episode boundaries (vectorized, cached per storage state) ----------------------------------------------
    # The cache key is TorchRL's `(len(storage), last written row, storage._is_full)`: a function of the storage
    # state alone, so a buffer that loaded a state_dict has the key of the buffer that saved it. The storage's
    # write revision is compared too (`_cache_revision`), so a rewrite that leaves the key as it was (a full
    # ring written over exactly once, `rb[i] = ...`) still rebuilds the cache.
    def _layout_key(self, storage) -> tuple:
        n = len(storage)
        full = bool(storage._is_full)
        cursor = self._writer.cursor if full and isinstance(storage, ListStorage) else None  # lists do not track it
        return (n, newest_row(storage, n, cursor=cursor), full)

    def _episode_layout(self, storage) -> tuple[torch.Tensor, int, int]:
        """``(ends, offset, n)``: the sorted unrolled positions that end an episode, and the ring layout."""
        key, revision = self._layout_key(storage), storage.write_revision
        n, last, full = key
        offset = oldest_row(storage, n, last)
        if key != self._last_cache_key or revision != self._cache_revision or self._episode_ends_cache is None:
            self._episode_ends_cache = self._find_episode_ends(storage, n, last, full)
            self._unrolled_ends = None
            self._last_cache_key, self._cache_revision = key, revision
        if self._unrolled_ends is None:
            self._unrolled_ends = torch.sort((self._episode_ends_cache - offset) % max(n, 1)).values
        return self._unrolled_ends, offset, n

    def _find_episode_ends(self, storage, n: int, last: int, full: bool) -> torch.Tensor:
        """The storage rows (ascending) that end an episode: a done/terminated flag, or the newest row."""
        flags = None
        for key in (self.end_key, self.terminated_key):
            column = column_or_none(storage, key, n)
            if column is not None:
                column = column.reshape(n, -1).to("cpu").bool().any(-1)
                flags = column if flags is None else flags | column
        if flags is None:
            raise KeyError(
                f"HERReplayBuffer finds episodes with `end_key` {self.end_key!r} or its sibling "
                f"{self.terminated_key!r}; the storage holds neither. Store episode-end flags, or pass the key "
                f"that holds them as end_key=."
            )
        if not n:
            return flags.nonzero().squeeze(-1)
        offset = oldest_row(storage, n, last)
        found = find_trajectories(  # the newest row ends an episode too (n - 1 while the ring is not full)
            flags.view(n, 1), is_done=True, n_rows=n, n_cols=1, offset=offset, last_row=last if full else n - 1, ndim=1
        )
        return torch.sort((found.starts + found.lengths - 1 + offset) % n).values

    def empty(self, empty_write_count: bool = True) -> None:
        super().empty(empty_write_count=empty_write_count)
        if self._runs is not None:
            self._runs = RunPositions(self.traj_key, self.step_key)
        self._episode_ends_cache = self._unrolled_ends = self._last_cache_key = self._cache_revision = None

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """:meth:`ReplayBuffer.state_dict` plus ``"_her"``: the keys, ``her_ratio``, ``strategy`` (its value),
        the cached episode ends (``episode_ends_cache``) and the storage state they were computed for
        (``last_cache_key``). A cache that the storage's content outgrew is rebuilt first, so that the state
        carries the episode ends of the storage it carries."""
        self._refresh_stale_cache()
        state = super().state_dict()
        state["_her"] = {
            "goal_key": self.goal_key,
            "achieved_goal_key": self.achieved_goal_key,
            "reward_key": self.reward_key,
            "her_ratio": self.her_ratio,
            "strategy": self.strategy.value,
            "episode_ends_cache": self._episode_ends_cache,
            "last_cache_key": self._last_cache_key,
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`; from ``"_her"`` only the episode-end cache and its key are restored
        (the keys, ratio and strategy are the constructor's). The given dict is not modified."""
        state = dict(state_dict)
        her = state.pop("_her", None)
        if her is not None and not isinstance(her, dict):
            raise TypeError(f"state_dict['_her'] must be a dict (from HERReplayBuffer.state_dict()), got {her!r}.")
        cache = None if her is None else her.get("episode_ends_cache")
        if cache is not None and not (isinstance(cache, torch.Tensor) and cache.ndim == 1):
            raise TypeError(f"state_dict['_her']['episode_ends_cache'] must be a 1-D tensor or None, got {cache!r}.")
        super().load_state_dict(state)
        if her is not None:
            key = her.get("last_cache_key")
            self._episode_ends_cache = None if cache is None else cache.long()
            self._last_cache_key = None if key is None else tuple(key)
            self._unrolled_ends = None
            # the restored cache holds for the loaded storage when its key is the storage's; else it is rebuilt at
            # the next sample (a revision nothing equals)
            current = self._initialized and self._last_cache_key == self._layout_key(self._storage)
            self._cache_revision = self._storage.write_revision if current else object()

    def _refresh_stale_cache(self) -> None:
        """Rebuilds a cache whose storage was written since it was built (see :meth:`state_dict`)."""
        storage = self._storage if self._initialized else None
        if self._episode_ends_cache is None or storage is None or storage.ndim != 1:
            return
        with self._replay_lock:
            if storage.write_revision == self._cache_revision and self._last_cache_key == self._layout_key(storage):
                return
            try:
                self._episode_layout(storage)
            except KeyError:  # the flags are gone: no cache to carry
                self._episode_ends_cache = self._unrolled_ends = self._last_cache_key = self._cache_revision = None

    def _config_doc(self) -> dict[str, Any]:
        return {
            "schema": _CHECKPOINT_SCHEMA,
            "her_ratio": self.her_ratio,
            "strategy": self.strategy.value,
            "goal_key": _as_json_key(self.goal_key),
            "achieved_goal_key": _as_json_key(self.achieved_goal_key),
            "reward_key": _as_json_key(self.reward_key),
            "end_key": _as_json_key(self.end_key),
        }

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        tensors, doc = super().checkpoint_part(ctx)
        doc["her"] = self._config_doc()  # reward_fn is code: never saved
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        super().check_checkpoint_part(doc, tensors, ctx)
        her = doc.get("her")
        where = f"The HERReplayBuffer description in the checkpoint {ctx.path!r}"
        if not isinstance(her, dict) or her.get("schema") != _CHECKPOINT_SCHEMA:
            raise CheckpointError(
                f"{where}: `her` is {her!r:.200}, expected a dict of schema {_CHECKPOINT_SCHEMA}. Save the buffer "
                f"again with `dumps`. Nothing was loaded."
            )
        try:
            _her_ratio(her.get("her_ratio"))
            _strategy(her.get("strategy"))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{where}: {err} Nothing was loaded.") from None
        mine = self._config_doc()
        for name in ("goal_key", "achieved_goal_key", "reward_key", "end_key"):
            if her.get(name) != mine[name]:
                raise ValueError(
                    f"The checkpoint does not fit this buffer: `{name}` is {her.get(name)!r} in the checkpoint "
                    f"and {mine[name]!r} here. Build the HERReplayBuffer with {name}={her.get(name)!r} (and a "
                    f"reward_fn for those keys). Nothing was loaded."
                )

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        super().load_checkpoint_part(doc, tensors, ctx)
        her = doc["her"]
        self.her_ratio = _her_ratio(her["her_ratio"])
        self.strategy = _strategy(her["strategy"])
        self._episode_ends_cache = self._unrolled_ends = self._last_cache_key = self._cache_revision = None
        self._keys_checked = False
