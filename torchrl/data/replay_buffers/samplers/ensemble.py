"""A sampler that draws sub-batches from several buffers: :class:`SamplerEnsemble`.

A batch of ``batch_size`` is made of ``num_buffer_sampled`` sub-batches of ``batch_size //
num_buffer_sampled`` items. Each sub-batch comes from one member buffer, chosen independently (with
replacement: a buffer may give several sub-batches), uniformly or with probabilities ``p``; with
``sample_from_all=True`` every buffer gives exactly one sub-batch, in member order. The sub-batch itself is
drawn by that buffer's own sampler, so each member keeps its sampling rule (uniform, prioritized, slices...).

The index returned is the :class:`~tensordict.TensorDict` described in
:mod:`torchrl.data.replay_buffers.storages.ensemble` (``"buffer_ids"`` and flat ``"index"`` rows, one per
sub-batch), which :meth:`StorageEnsemble.get` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict

from torchrl._validation import (
    check_bool,
    check_member_states,
    check_members,
    check_positive_int,
    is_int,
    member_at,
)
from torchrl.data.replay_buffers.loading.collate import stack_samples
from torchrl.data.replay_buffers.samplers.base import Sampler, check_batch_size
from torchrl.data.replay_buffers.storages.ensemble import (
    StorageEnsemble,
    _flat_member_index,
    selected_members,
)

_SAMPLEABLE = "sampleable"


def _sampleable_weights(samplers, storage: StorageEnsemble, per_buffer: int) -> torch.Tensor:
    """``p="sampleable"``: per member, ``w_i = s_i`` if its sampler can draw a sub-batch of ``per_buffer`` now
    (``can_sample``), else ``0``; ``s_i`` is ``sampler.num_sampleable(storage)`` when the sampler has it, else the
    length of its storage (float64, not normalized)."""
    counts = []
    for i, sampler in enumerate(samplers):
        member = storage[i]
        count = getattr(sampler, "num_sampleable", None)
        supply = int(count(member)) if callable(count) else len(member)
        counts.append(supply if supply and sampler.can_sample(member, per_buffer) else 0)
    if not any(counts):
        raise RuntimeError(
            f'SamplerEnsemble(p="sampleable") found nothing to draw: no member can draw a sub-batch of '
            f"{per_buffer} items now (weights {counts}). Write data into a member buffer first."
        )
    return torch.tensor(counts, dtype=torch.float64)


def _check_p(p, n: int) -> torch.Tensor:
    """``p`` -> a float64 probability vector summing to 1."""
    try:
        t = None if isinstance(p, (str, bytes)) else torch.as_tensor(p, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        t = None
    if t is None or t.ndim != 1:
        raise TypeError(
            f'`p` must be a 1-D sequence of {n} probabilities (one per member) or "sampleable", got {p!r}.'
        )
    if t.numel() != n:
        raise ValueError(f"`p` must have one probability per member ({n}), got {t.numel()}: {p!r}.")
    if not torch.isfinite(t).all() or (t < 0).any() or t.sum() <= 0:
        raise ValueError(
            f"`p` must hold finite, non-negative weights with a positive sum, got {p!r}. It is normalized, "
            f"so e.g. p=[1, 3] means 25% / 75%."
        )
    return t / t.sum()


def _check_num_buffer_sampled(num_buffer_sampled, n: int, sample_from_all: bool) -> int:
    if num_buffer_sampled is None:
        return n
    check_positive_int("num_buffer_sampled", num_buffer_sampled, allow_none=True, type_error=False)
    if sample_from_all and num_buffer_sampled != n:
        raise ValueError(
            f"`num_buffer_sampled`={num_buffer_sampled} contradicts sample_from_all=True, which draws one "
            f"sub-batch from each of the {n} members. Omit num_buffer_sampled or pass sample_from_all=False."
        )
    return num_buffer_sampled


class SamplerEnsemble(Sampler):
    """Draws each batch as sub-batches from member buffers, each with the member's own sampler.

    See the module docstring for how buffers are chosen. Buffer choices go through ``self._rng`` (the
    ensemble buffer's generator) or torch's global generator. Setting a generator on the ensemble (not
    ``None``) sets it on every member sampler too, so one seeded generator makes the whole draw reproducible.

    Args:
        *samplers (Sampler): the member samplers; member ``i`` samples buffer ``i``.

    Keyword Args:
        p (sequence of float or "sampleable", optional): the probability of choosing each buffer for a
            sub-batch; normalized. ``"sampleable"`` weighs buffer ``i``, at every batch, by ``w_i = s_i`` when
            its sampler can draw a sub-batch now (``can_sample(storage, batch_size // num_buffer_sampled)``) and
            ``w_i = 0`` otherwise, with ``s_i`` the items its sampler can draw (``num_sampleable(storage)`` when
            the sampler has it, as :class:`~torchrl.data.ConsumingSampler` does, else the length of its storage);
            the probability is ``w_i / sum(w)``: every drawable item is equally likely to be in a sub-batch, and
            empty, exhausted or not-ready buffers are skipped. Defaults to ``None`` (uniform).
        sample_from_all (bool): draw one sub-batch from every buffer instead of choosing. Cannot be combined
            with ``p``. Defaults to ``False``.
        num_buffer_sampled (int, optional): the number of sub-batches per batch; ``batch_size`` must be a
            multiple of it. Defaults to the number of samplers.

    ``requires_shared_state`` is True when any member's is (the ensemble is as stateful as its most stateful
    member), and ``can_share_state`` when every stateful member can share its state: :meth:`share_memory_`
    then shares them all. ``state_dict()`` holds the members' states, keyed by ``str(i)``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, RandomSampler, SamplerEnsemble, StorageEnsemble
        >>> s0, s1 = LazyTensorStorage(10), LazyTensorStorage(10)
        >>> s0.set(torch.arange(5), torch.arange(5))
        >>> s1.set(torch.arange(5), torch.arange(5))
        >>> sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True)
        >>> index, info = sampler.sample(StorageEnsemble(s0, s1), 6)
        >>> index["buffer_ids"], index["index"].shape
        (tensor([0, 1]), torch.Size([2, 3]))
        >>> weighted = SamplerEnsemble(RandomSampler(), RandomSampler(), p="sampleable")  # by items held
        >>> weighted.sample(StorageEnsemble(s0, LazyTensorStorage(10)), 4)[1]["buffer_ids"]  # s1 is empty here
        tensor([0, 0])
    """

    def __init__(
        self,
        *samplers: Sampler,
        p: Sequence[float] | torch.Tensor | None = None,
        sample_from_all: bool = False,
        num_buffer_sampled: int | None = None,
    ) -> None:
        self._samplers = check_members("SamplerEnsemble", samplers, Sampler)
        n = len(self._samplers)
        sample_from_all = check_bool("sample_from_all", sample_from_all)
        if p is not None and sample_from_all:
            raise ValueError(
                "`p` and sample_from_all=True are exclusive: sample_from_all draws from every buffer, p "
                "chooses among them. Pass one of them."
            )
        self._p_sampleable = isinstance(p, str) and p == _SAMPLEABLE
        self._p = None if p is None or self._p_sampleable else _check_p(p, n)
        self._sample_from_all = sample_from_all
        self._num_buffer_sampled = _check_num_buffer_sampled(num_buffer_sampled, n, sample_from_all)
        self._generator: torch.Generator | None = None
        self._ran_out = False

    # -- configuration ---------------------------------------------------------------------------------------
    @property
    def samplers(self) -> list[Sampler]:
        """The member samplers (a new list)."""
        return list(self._samplers)

    @property
    def p(self) -> torch.Tensor | str | None:
        """The normalized buffer probabilities (``None`` for uniform or sample_from_all, ``"sampleable"``
        for weights by drawable items)."""
        if getattr(self, "_p_sampleable", False):
            return _SAMPLEABLE
        return None if self._p is None else self._p.clone()

    @property
    def sample_from_all(self) -> bool:
        return self._sample_from_all

    @property
    def num_buffer_sampled(self) -> int:
        return self._num_buffer_sampled

    @property
    def requires_shared_state(self) -> bool:
        return any(s.requires_shared_state for s in self._samplers)

    @property
    def can_share_state(self) -> bool:
        """True when every member that requires shared state can share it (see :meth:`share_memory_`)."""
        return all(s.can_share_state for s in self._samplers if s.requires_shared_state)

    @property
    def is_shared(self) -> bool:
        """True when the state of every stateful member lives in shared memory (and one member has state)."""
        stateful = [s for s in self._samplers if s.requires_shared_state]
        return bool(stateful) and all(s.is_shared for s in stateful)

    def share_memory_(self) -> SamplerEnsemble:
        """Shares the state of every stateful member (see e.g. :meth:`PrioritizedSampler.share_memory_
        <torchrl.data.PrioritizedSampler.share_memory_>`); the choice of members draws from the generator of
        each process and holds no state.

        Raises:
            RuntimeError: a stateful member cannot share its state (nothing is shared then).
        """
        stateful = [s for s in self._samplers if s.requires_shared_state]
        for sampler in stateful:
            if not sampler.can_share_state:
                sampler.share_memory_()  # raises, naming the member and the samplers that can share
        for sampler in stateful:
            sampler.share_memory_()
        return self

    def pin_epoch(self, key: int | None = None, readers: int = 1) -> None:
        """Pins every member to its epoch in progress (see :meth:`Sampler.pin_epoch`)."""
        for sampler in self._samplers:
            sampler.pin_epoch(key, readers)

    def unpin_epoch(self) -> None:
        for sampler in self._samplers:
            sampler.unpin_epoch()

    @property
    def _rng(self) -> torch.Generator | None:
        return getattr(self, "_generator", None)

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self._generator = generator
        if generator is not None:
            for sampler in self._samplers:
                sampler._rng = generator

    def __len__(self) -> int:
        return len(self._samplers)

    def __getitem__(self, item) -> Sampler | SamplerEnsemble:
        """The ``item``-th sampler (int), or a sub-ensemble (slice or list of ints) with the same choice rule: a
        tensor ``p`` restricted to the selected members (renormalized), ``"sampleable"`` kept as is."""
        if is_int(item):
            return member_at("SamplerEnsemble", self._samplers, item)
        ids = selected_members("SamplerEnsemble", item, len(self._samplers))
        p = self.p
        if isinstance(p, torch.Tensor):
            p = p[ids]
        return type(self)(
            *(self._samplers[i] for i in ids), p=p, sample_from_all=self._sample_from_all,
            num_buffer_sampled=None if self._sample_from_all else self._num_buffer_sampled,
        )  # fmt: skip

    # -- sampling --------------------------------------------------------------------------------------------
    def _choose(self, storage: StorageEnsemble, per_buffer: int) -> torch.Tensor:
        n, k = len(self._samplers), self._num_buffer_sampled
        if self._sample_from_all:
            return torch.arange(n)
        rng = self._rng
        device = rng.device if rng is not None else None
        p = self._p
        if getattr(self, "_p_sampleable", False):
            p = _sampleable_weights(self._samplers, storage, per_buffer)
        if p is not None:
            return torch.multinomial(p.to(device), k, replacement=True, generator=rng).cpu()
        return torch.randint(0, n, (k,), generator=rng, device=device).cpu()

    def can_sample(self, storage: StorageEnsemble, batch_size: int) -> bool:
        """Whether a batch of ``batch_size`` can be drawn now: ``batch_size`` divides by
        ``num_buffer_sampled``, and with ``sample_from_all`` every member can serve its sub-batch; with ``p``
        ``None`` or ``"sampleable"`` any member can; with explicit ``p`` any member of positive probability can."""
        k = self._num_buffer_sampled
        if batch_size % k or len(storage) != len(self._samplers):
            return False
        per = batch_size // k
        ready = [s.can_sample(storage[i], per) for i, s in enumerate(self._samplers)]
        if self._sample_from_all:
            return all(ready)
        if self._p is None:
            return any(ready)
        return any(r and float(p) > 0 for r, p in zip(ready, self._p.tolist()))

    def sample(self, storage: StorageEnsemble, batch_size: int) -> tuple[Any, dict]:
        """Draws ``num_buffer_sampled`` sub-batches of ``batch_size // num_buffer_sampled`` items.

        Returns:
            ``(index, info)``: ``index`` is a TensorDict of batch size ``[num_buffer_sampled]`` with
            ``"buffer_ids"`` and ``"index"`` (see :class:`StorageEnsemble`); ``info`` is
            ``{"buffer_ids": <[num_buffer_sampled] tensor>, "member_info": <list of each sub-batch's info>}``.
        """
        batch_size = check_batch_size(batch_size)
        if not isinstance(storage, StorageEnsemble):
            raise TypeError(
                f"SamplerEnsemble samples a StorageEnsemble, got {type(storage).__name__}. Use it through "
                f"ReplayBufferEnsemble, or build StorageEnsemble(*member_storages)."
            )
        if len(storage) != len(self._samplers):
            raise ValueError(
                f"The StorageEnsemble has {len(storage)} members and this SamplerEnsemble "
                f"{len(self._samplers)}: they must match one to one."
            )
        if batch_size % self._num_buffer_sampled:
            raise ValueError(
                f"`batch_size`={batch_size} is not divisible by `num_buffer_sampled`="
                f"{self._num_buffer_sampled}: each batch is made of equal sub-batches. Pass a multiple of "
                f"{self._num_buffer_sampled}."
            )
        per_buffer = batch_size // self._num_buffer_sampled
        buffer_ids = self._choose(storage, per_buffer)
        rows, infos = [], []
        for buffer_id in buffer_ids.tolist():
            member = storage[buffer_id]
            index, info = self._samplers[buffer_id].sample(member, per_buffer)
            flat = _flat_member_index(index, member)
            rows.append(TensorDict(buffer_ids=torch.tensor(buffer_id), index=flat))
            infos.append(info)
        self._ran_out = any(self._samplers[i].ran_out for i in set(buffer_ids.tolist()))
        return stack_samples(rows), {"buffer_ids": buffer_ids, "member_info": infos}

    @Sampler.ran_out.setter
    def ran_out(self, value: bool) -> None:  # set on every member too; true after a member's epoch ended
        self._ran_out = bool(value)
        for sampler in self._samplers:
            sampler.ran_out = value

    def update_priority(self, index, priority, *, storage=None) -> None:
        raise RuntimeError(
            "Update priorities through the member buffers: for each sub-batch i of a sample, call "
            "rb_ensemble[buffer_ids[i]].update_priority(member_index, priority)."
        )

    def _empty(self) -> None:
        raise RuntimeError(
            "A SamplerEnsemble cannot be emptied: empty the member buffers (rb_ensemble[i].empty())."
        )

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in enumerate(self._samplers)}

    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """One entry per member (``str(i)``), each checked by the member's :meth:`validate_state_dict`: every
        member state is checked before any member loads."""
        check_member_states("SamplerEnsemble", state, len(self._samplers))
        checked = {}
        for i, sampler in enumerate(self._samplers):
            saved = state[str(i)]
            checked[str(i)] = (saved, sampler.validate_state_dict(saved))
        return checked

    def _apply_state(self, state: dict[str, Any]) -> None:
        for i, sampler in enumerate(self._samplers):
            saved, checked = state[str(i)]
            if type(sampler).load_state_dict is not Sampler.load_state_dict:  # loads on its own (no hooks)
                sampler.load_state_dict(saved)
            else:
                sampler._apply_state(checked)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_generator", None)
        return state

    def __repr__(self) -> str:
        p = self.p.tolist() if isinstance(self.p, torch.Tensor) else self.p
        how = "sample_from_all=True" if self._sample_from_all else f"p={p!r}"
        return (
            f"{type(self).__name__}({', '.join(map(repr, self._samplers))}, {how}, "
            f"num_buffer_sampled={self._num_buffer_sampled})"
        )
