"""Uniform sampling without replacement: :class:`SamplerWithoutReplacement`, what
``RandomSampler(replacement=False)`` builds (:mod:`.random` registers the pair).

An epoch is a permutation of the stored items; each batch takes the next items of it. Shared with DataLoader
workers, the epoch lives in shared memory (:mod:`._shared_epoch`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

import torchrl.data.replay_buffers._checkpoint.parts as _parts
from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, is_int
from torchrl.data.replay_buffers.errors import CheckpointError, EpochEnded
from torchrl.data.replay_buffers.samplers._shared_epoch import (
    Pin,
    SharedEpoch,
    check_plan,
    derived_permutation,
)
from torchrl.data.replay_buffers.samplers.base import (
    Sampler,
    check_batch_size,
    check_has_rows,
    check_not_empty,
    state_bool,
    state_index_tensor,
    state_int,
    uniform_draws,
    unravel,
)

WITHOUT_REPLACEMENT_BATCH = TorchRLPhrase(
    ValueError,
    "The batch size .* is greater than the storage capacity",
    "The batch size {batch_size} is greater than the storage capacity {size} and drop_last=True, so no batch "
    "can be drawn. Sample at most {size} items, extend the buffer, or build the sampler with drop_last=False.",
)

_SEED_BOUND = 1 << 62  # seeds of shared epochs are below it; -1 is storage order
#: The largest epoch a state may describe: a shared sampler holds the whole permutation (8 bytes an item), so a
#: crafted ``len_storage`` must not make it allocate without bound.
_MAX_EPOCH = 1 << 32


class SamplerWithoutReplacement(Sampler):
    """Visits every stored item exactly once per epoch, in a random (or fixed) order.

    Stateful: it holds the epoch permutation and the position in it, so a private per-worker copy would make
    every DataLoader worker replay the same epoch (``requires_shared_state = True``). It can share that state
    (``can_share_state = True``): after :meth:`share_memory_` (which ``rb.as_dataset()`` calls), the main
    process and every worker draw from one shared epoch, so that across all of them every stored item is drawn
    exactly once per epoch (see
    :mod:`~torchrl.data.replay_buffers.samplers._shared_epoch`). A new permutation is drawn when the epoch
    ends and when the storage length changed since the last draw, except during an epoch pinned by
    :meth:`pin_epoch` (a DataLoader iteration), which runs to its end over the items it started with.

    DataLoader workers draw by number (:meth:`planned_draw`, which
    :class:`~torchrl.data.ReplayBufferDataset` uses): batch ``g`` of an iteration is a fixed slice of a fixed
    epoch, so the batches do not depend on which worker draws faster, two seeded runs are identical and a
    resumed run continues the interrupted one exactly (see NOTE [planned epochs] in
    :mod:`~torchrl.data.replay_buffers.samplers._shared_epoch`).

    Args:
        drop_last (bool): if ``True``, the last batch of an epoch is dropped when it would be short; if
            ``False`` it is returned short. Defaults to ``False``.
        shuffle (bool): ``False`` visits items in storage order. Defaults to ``True``.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, SamplerWithoutReplacement
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(5), torch.arange(5))
        >>> sampler = SamplerWithoutReplacement()
        >>> seen = torch.cat([sampler.sample(storage, 2)[0] for _ in range(3)])
        >>> sorted(seen.tolist()), sampler.ran_out
        ([0, 1, 2, 3, 4], True)
    """

    requires_shared_state = True
    can_share_state = True
    draws_in_bounds = True
    _epoch_id = 0  # private epochs drawn so far (the shared state counts its own)
    _epoch_state: SharedEpoch | None = None  # the shared epoch, once shared
    _pin: Pin | None = None  # this process's pin (never pickled)
    _planned: tuple[int, int, int | None] | None = (
        None  # the next draw's (key, number, total) (never pickled)
    )
    _pending_plan: dict | None = None  # a plan loaded into a private sampler, handed to the shared epoch
    # the epoch of draws from a compilable storage, in one tensor on its device: [permutation | pos | length]
    # (see _next_in_tensor_epoch); the Python epoch above is derived from it when read (_epoch)
    _tensor_epoch: torch.Tensor | None = None

    def __init__(self, drop_last: bool = False, shuffle: bool = True):
        self.drop_last = check_bool(
            "drop_last", drop_last, hint="Pass True to drop a short last batch, or False."
        )
        self.shuffle = check_bool(
            "shuffle", shuffle, hint="Pass False to visit items in storage order, or True."
        )
        self._perm: torch.Tensor | None = None
        self._pos = 0
        self._len_storage = 0
        self._ran_out = False

    # -- sharing with DataLoader workers -------------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        """Whether the epoch (permutation and cursor) lives in shared memory (see :meth:`share_memory_`)."""
        return self._epoch_state is not None and self._epoch_state.is_shared

    def share_memory_(self) -> SamplerWithoutReplacement:
        """Moves the epoch to shared memory, in place: the main process and the processes that receive the
        sampler afterwards (DataLoader workers under fork, spawn or forkserver) draw from one epoch (through one
        cursor, or by number with :meth:`planned_draw`), under a cross-process lock held only while the epoch
        state is read or moved. The epoch in progress carries over. A no-op when shared already;
        ``pickle``/``copy.deepcopy`` give a private copy.

        Examples:
            >>> sampler = SamplerWithoutReplacement()
            >>> sampler.share_memory_().is_shared
            True
        """
        if self._epoch_state is None:
            perm, pos, length, _ = self._epoch()
            self._tensor_epoch = None
            if perm is not None and perm.numel() != length:  # a loaded epoch holds only the positions left
                perm, pos = _complete_epoch(perm[pos:], length, None), length - (perm.numel() - pos)
            self._epoch_state = SharedEpoch(perm, pos, length)
            self._perm, self._pos, self._len_storage = None, 0, 0
            self._epoch_state.load_plan(self._pending_plan)
            self._pending_plan = None
        self._epoch_state.share_memory_()
        return self

    def pin_epoch(self, key: int | None = None, readers: int = 1) -> None:
        """Pins this process's draws to the epoch in progress (see :meth:`Sampler.pin_epoch`): once it ended
        (in any process sharing the sampler), :meth:`sample` raises
        :class:`~torchrl.data.EpochEnded`. Items written meanwhile join the next
        epoch.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> from torchrl.data import EpochEnded
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(4), torch.arange(4))
            >>> sampler = SamplerWithoutReplacement(shuffle=False)
            >>> sampler.pin_epoch()
            >>> sampler.sample(storage, 3)[0].tolist(), sampler.sample(storage, 3)[0].tolist()
            ([0, 1, 2], [3])
            >>> try:
            ...     sampler.sample(storage, 3)
            ... except EpochEnded:
            ...     print("epoch over")
            epoch over
            >>> sampler.unpin_epoch()
        """
        self._pin = Pin(key, readers)

    def unpin_epoch(self) -> None:
        self._pin = None

    @contextlib.contextmanager
    def planned_draw(self, key: int, number: int, total: int | None = None) -> Iterator[None]:
        """Makes the next :meth:`sample` in this process (within the ``with`` block) draw batch ``number`` of
        the DataLoader iteration ``key`` instead of the next batch at the shared cursor.

        The readers of one iteration (the DataLoader workers, which agree on ``key``: torch's base seed of the
        iteration) number their draws ``0, 1, 2, ...`` between them (worker ``w`` of ``N`` draws
        ``w, w + N, ...``). The first of them fixes the iteration's plan: its epoch (the one in progress, from
        its cursor, or a new one) and, for ``total`` batches over several epochs, the epochs after it, each
        seeded from ``key``. Batch ``number`` then is always the same slice of the same epoch: across the
        readers every item comes exactly once per epoch, whatever their speed, and a run resumed with the
        same key and numbers draws the same batches. With ``total=None`` the iteration is one epoch, and a
        number past its end raises :class:`~torchrl.data.EpochEnded`, for every reader at the same number.
        The sampler must be shared (:meth:`share_memory_`). See NOTE [planned epochs] in
        :mod:`~torchrl.data.replay_buffers.samplers._shared_epoch`.

        Args:
            key (int): the iteration (the same for all its readers; a new key starts a new iteration, after
                the batches planned by the previous one).
            number (int): the draw's number in the iteration, from 0.
            total (int, optional): the number of batches of the iteration; ``None``: one epoch. Defaults to
                ``None``.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(6), torch.arange(6))
            >>> sampler = SamplerWithoutReplacement(shuffle=False).share_memory_()
            >>> draws = {}
            >>> for number in (2, 0, 1):  # any order, any process: the same batches
            ...     with sampler.planned_draw(key=7, number=number):
            ...         draws[number] = sampler.sample(storage, 2)[0].tolist()
            >>> draws
            {2: [4, 5], 0: [0, 1], 1: [2, 3]}
        """
        if self._epoch_state is None or not self._epoch_state.is_shared:
            raise RuntimeError(
                "planned_draw() needs the sampler's epoch in shared memory: call sampler.share_memory_() first "
                "(rb.as_dataset() does)."
            )
        for name, value in (("key", key), ("number", number)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative int, got {value!r}.")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
            raise ValueError(f"`total` must be a non-negative int or None (one epoch), got {total!r}.")
        self._planned = (key, number, total)
        try:
            yield
        finally:
            self._planned = None

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_pin", None)
        state.pop("_planned", None)
        return state

    def _new_epoch(self, n: int) -> None:
        if self.shuffle:
            device = self._rng.device if self._rng is not None else None
            self._perm = torch.randperm(n, generator=self._rng, device=device)
        else:
            self._perm = torch.arange(n)
        self._pos = 0
        self._len_storage = n
        self._epoch_id += 1

    def can_sample(self, storage, batch_size: int) -> bool:
        """``True`` once ``storage`` holds an item, or, with ``drop_last=True``, at least ``batch_size`` items
        (a shorter storage can only give the short batch that ``drop_last`` drops)."""
        n = len(storage)
        return n >= batch_size if self.drop_last else n > 0

    def sample(self, storage, batch_size: int):
        batch_size = check_batch_size(batch_size)
        if storage.compilable and self._pin is None and self._epoch_state is None and self._planned is None:
            return unravel(self._next_in_tensor_epoch(storage, batch_size), storage), {}
        n = check_not_empty(storage)
        if self.drop_last and n < batch_size:
            raise WITHOUT_REPLACEMENT_BATCH.error(batch_size=batch_size, size=n)
        return unravel(self._next_in_epoch(n, batch_size), storage), {}

    def _next_in_tensor_epoch(self, storage, count: int) -> torch.Tensor:
        """:meth:`_next_in_epoch` for a compilable storage, with tensor ops only (no number read back to the
        host: one ``torch.compile`` graph). The epoch lives in :attr:`_tensor_epoch`: a permutation of the
        storage's cells in which the ``length`` cells holding data come first, the cursor and ``length``. A new
        epoch starts when the length changed or fewer than ``count`` cells are left (``drop_last=True`` is
        required: a short batch has a shape known only on the device). Each call draws the keys of a candidate
        epoch (``rand`` + ``argsort`` over the capacity), used only when the epoch ends, so that eager and
        compiled calls consume the generator alike. A storage holding fewer than ``count`` items fails an
        async assert (``RuntimeError`` on the CPU; a device-side assert on CUDA)."""
        if not self.drop_last:
            raise ValueError(
                "SamplerWithoutReplacement draws batches of one shape from a storage built with compilable=True, "
                "so the short last batch of an epoch cannot be returned: build it with drop_last=True (or the "
                "storage with compilable=False)."
            )
        n = check_has_rows(storage)
        cells = storage.max_size
        state = self._tensor_epoch
        if state is None or state.numel() != cells + 2 or state.device != n.device:
            state = self._tensor_epoch = self._epoch_as_tensor(cells, n.device)
        perm, pos, length = state[:cells], state[cells], state[cells + 1]
        torch._assert_async(
            n >= count, "SamplerWithoutReplacement(drop_last=True): the storage holds fewer items than batch_size"
        )
        new = (n != length) | (pos + count > n)
        positions = torch.arange(cells, device=n.device)
        if self.shuffle:
            keys = uniform_draws(cells, self._rng, n.device)
        else:
            keys = positions.to(torch.float64)
        fresh = torch.where(positions < n, keys, cells + 2.0).argsort()  # the cells holding data first
        perm = torch.where(new, fresh, perm)
        start = torch.where(new, 0, pos)
        chosen = perm[start + torch.arange(count, device=n.device)]
        state.copy_(torch.cat([perm, (start + count).reshape(1), n.reshape(1)]))
        return chosen

    def _epoch_as_tensor(self, cells: int, device) -> torch.Tensor:
        """The Python epoch in progress (loaded or drawn eagerly) as :attr:`_tensor_epoch`; one that forces a
        new epoch when there is none."""
        state = torch.full((cells + 2,), -1, dtype=torch.long)
        state[:cells] = torch.arange(cells)
        perm, pos, length = self._perm, self._pos, self._len_storage
        if perm is not None and length <= cells:
            rest = perm[pos:]
            state[:length] = _complete_epoch(rest, length, None)
            state[cells], state[cells + 1] = length - rest.numel(), length
        self._perm, self._pos, self._len_storage = None, 0, 0
        return state.to(device)

    def _next_in_epoch(self, n: int, count: int) -> torch.Tensor:
        """The next ``count`` (or fewer, at the end) of an epoch over ``n`` things; sets :attr:`ran_out`.

        A new permutation is drawn when ``n`` changed since the last one (except that a pinned epoch runs to
        its end when the storage grew) and once the epoch is over (all visited, or with ``drop_last`` fewer
        than ``count`` left). Raises ``EpochEnded`` when the pinned epoch is over.
        """
        pin = self._pin
        planned, self._planned = self._planned, None  # one draw per planned_draw()
        if planned is not None:
            self._ran_out = False
            key, number, total = planned
            chosen, self._ran_out = self._epoch_state.take_planned(
                n, count, key=key, number=number, total=total, drop_last=self.drop_last, shuffle=self.shuffle
            )
            return chosen
        if self._epoch_state is not None:
            self._ran_out = False
            chosen, self._ran_out = self._epoch_state.take(
                n, count, drop_last=self.drop_last, shuffle=self.shuffle, rng=self._rng, pin=pin
            )
            return chosen
        if pin is not None and pin.epoch is None:
            if self._perm is None or self._len_storage != n:
                self._new_epoch(n)
            pin.epoch = self._epoch_id
        if pin is not None and pin.epoch != self._epoch_id:
            raise EpochEnded(f"Epoch {pin.epoch} of this sampler without replacement has ended.")
        grown_while_pinned = pin is not None and n > self._len_storage
        if self._perm is None or (self._len_storage != n and not grown_while_pinned):
            self._new_epoch(n)
            if pin is not None:  # the storage shrank under the pinned epoch
                raise EpochEnded(
                    f"Epoch {pin.epoch} of this sampler without replacement no longer fits the storage."
                )
        self._ran_out = False
        chosen = self._perm[self._pos : self._pos + count]
        self._pos += chosen.numel()
        remaining = self._perm.numel() - self._pos  # a loaded epoch holds only the positions left
        if remaining == 0 or (self.drop_last and remaining < count):
            self._ran_out = True
            self._new_epoch(n)
        return chosen

    def _epoch(self) -> tuple[torch.Tensor | None, int, int, int | None]:
        """``(permutation, pos, length, seed)`` of the epoch in progress (a consistent copy when shared;
        ``seed``: the seed a shared epoch derives its permutation from, ``None`` when there is none)."""
        if self._epoch_state is not None:
            return self._epoch_state.snapshot()
        state = self._tensor_epoch
        if state is not None:  # drawn from a compilable storage
            cells = state.numel() - 2
            pos, length = int(state[cells]), int(state[cells + 1])
            if length < 0:
                return None, 0, 0, None
            return state[:length].cpu(), pos, length, None
        return self._perm, self._pos, self._len_storage, None

    @property
    def _sample_list(self) -> torch.Tensor | None:
        """TorchRL's name of the positions left in the current epoch (``None`` before the first draw).

        Setting it makes those positions the rest of the epoch, drawn in that order.
        """
        perm, pos, _, _ = self._epoch()
        return None if perm is None else perm[pos:]

    @_sample_list.setter
    def _sample_list(self, value) -> None:
        rest = torch.as_tensor(value, dtype=torch.long).reshape(-1).clone()
        _, _, length, _ = self._epoch()
        self._set_epoch(rest, max(length, rest.numel()))

    def _set_epoch(self, rest: torch.Tensor | None, length: int, seed: int | None = None) -> None:
        """Makes ``rest`` the positions left, in order, in an epoch over ``length`` items (``None``: no epoch).

        A private sampler keeps only ``rest`` (memory in proportion to what is left); a shared one the whole
        permutation (the one ``seed`` derives when it ends with ``rest``), which its readers index."""
        if self._epoch_state is not None:
            if rest is None:
                self._epoch_state.load(None, 0, 0)
            else:
                perm = _complete_epoch(rest, length, seed)
                self._epoch_state.load(perm, length - rest.numel(), length, seed)
        else:
            self._perm, self._pos, self._len_storage = rest, 0, 0 if rest is None else length
            self._tensor_epoch = None  # rebuilt from this one at the next draw from a compilable storage

    def _empty(self) -> None:
        if self._epoch_state is not None:
            self._epoch_state.reset()
        self._pending_plan = None
        self._perm = None
        self._pos = 0
        self._len_storage = 0
        self._ran_out = False
        self._tensor_epoch = None

    def state_dict(self) -> dict[str, Any]:
        """The epoch in progress and the options, in TorchRL's layout plus ours.

        - ``_sample_list``: the positions not drawn yet in the current epoch, in the order they will be drawn (a
          new tensor; ``None`` before the first draw); ``len_storage``: how many items the epoch covers, the
          storage's length when it was drawn (at most ``2**32``; loaded into a sampler whose next draw sees a
          storage of another length, the epoch is replaced by a new one, TorchRL's rule);
          ``drop_last``, ``_ran_out`` (TorchRL's keys);
        - ``shuffle``; ``_seed``: for a shared sampler, the seed in ``[0, 2**62)`` its permutation derives from,
          or ``-1`` for an epoch in storage order (``shuffle=False``); ``None`` otherwise. A shared sampler loads
          it without storing the permutation; ``_plan``: the plan of
          the DataLoader iteration drawing by number (:meth:`planned_draw`), if any, which a resumed iteration
          rejoins.

        A shared sampler is copied under its lock: a consistent state even while DataLoader workers draw.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(10)
            >>> storage.set(torch.arange(5), torch.arange(5))
            >>> sampler = SamplerWithoutReplacement(shuffle=False)
            >>> _ = sampler.sample(storage, 2)
            >>> state = sampler.state_dict()
            >>> state["_sample_list"], state["len_storage"]
            (tensor([2, 3, 4]), 5)
            >>> fresh = SamplerWithoutReplacement(shuffle=False)
            >>> fresh.load_state_dict(state)
            >>> fresh.sample(storage, 3)[0]
            tensor([2, 3, 4])
        """
        perm, pos, length, seed = self._epoch()
        plan = self._epoch_state.plan_state() if self._epoch_state is not None else self._pending_plan
        return {
            "len_storage": length,
            "_sample_list": None if perm is None else perm[pos:].clone(),
            "drop_last": self.drop_last,
            "_ran_out": self._ran_out,
            "shuffle": self.shuffle,
            "_seed": seed,
            "_plan": plan,
        }

    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Checks an epoch saved by :meth:`state_dict` (or the ``_perm``/``_pos``/``_len_storage`` layout of earlier
        versions): the positions are distinct and within the items the epoch covers, the cursor within the epoch.
        Returns ``{"rest", "length", "seed", "plan", "ran_out", "drop_last", "shuffle"}`` (``rest``: the
        positions left in the epoch, in order)."""
        who = type(self).__name__
        seed = state.get("_seed")
        if seed is not None:
            seed = state_int(state, "_seed", who, -1, _SEED_BOUND - 1)
        if "_perm" in state and "_sample_list" not in state:  # the layout of earlier versions
            length = state_int(state, "_len_storage", who, 0)
            perm = state_index_tensor(state, "_perm", who, length, unique=True)
            if perm is not None and perm.numel() != length:
                raise ValueError(
                    f"{who} state_dict['_perm'] has {perm.numel()} positions for an epoch of {length} items "
                    f"(`_len_storage`): a permutation lists each item once. Nothing was changed."
                )
            pos = state_int(state, "_pos", who, 0, length)
            rest = None if perm is None else perm[pos:]
        else:
            length = state_int(state, "len_storage", who, 0, _MAX_EPOCH)
            rest = state_index_tensor(state, "_sample_list", who, length, unique=True)
        ran_out = state_bool(state, "_ran_out", who)
        drop_last = state_bool(state, "drop_last", who, default=self.drop_last)
        shuffle = state_bool(state, "shuffle", who, default=self.shuffle)
        plan = check_plan(state.get("_plan"), who)
        return {
            "rest": rest,
            "length": length if rest is not None else 0,
            "seed": seed,
            "plan": plan,
            "ran_out": ran_out,
            "drop_last": drop_last,
            "shuffle": shuffle,
        }

    def check_checkpoint_part(self, doc: dict, tensors, ctx) -> None:
        """Checks the saved state like every sampler's, and that its epoch covers no more items
        (``len_storage``) than a storage of the checkpoint can hold (``ctx.facts["storage_items"]``, recorded by
        the storages' checks): a shared sampler materializes the whole epoch when it loads it."""
        super().check_checkpoint_part(doc, tensors, ctx)
        capacity = ctx.facts.get("storage_items")
        length = _parts.state_scalars(doc).get("len_storage")
        if capacity is not None and is_int(length) and length > capacity:
            raise CheckpointError(
                f"The {type(self).__name__} state in the checkpoint {ctx.path!r} has `len_storage` = {length}, an "
                f"epoch over more items than its storage can hold (max_size={capacity}). Save the buffer again "
                f"with dumps. Nothing was loaded."
            )

    def _apply_state(self, state: dict[str, Any]) -> None:
        self._set_epoch(state["rest"], state["length"], state["seed"])
        if self._epoch_state is not None:
            self._epoch_state.load_plan(state["plan"])
        else:
            self._pending_plan = state["plan"]
        self._ran_out = state["ran_out"]
        self.drop_last = state["drop_last"]
        self.shuffle = state["shuffle"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"


def _complete_epoch(rest: torch.Tensor, length: int, seed: int | None) -> torch.Tensor:
    """The permutation of an epoch over ``length`` items whose not-yet-drawn part is ``rest`` (distinct positions
    in range): the one ``seed`` derives when it ends with ``rest``, else the drawn items in storage order, then
    ``rest``."""
    if seed is not None:
        derived = derived_permutation(seed, length)
        if torch.equal(derived[length - rest.numel() :], rest):
            return derived
    drawn = torch.ones(length, dtype=torch.bool)
    drawn[rest] = False
    return torch.cat([drawn.nonzero().reshape(-1), rest])

