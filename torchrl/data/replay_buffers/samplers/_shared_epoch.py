"""One epoch without replacement consumed by several processes: :class:`SharedEpoch`.

Data model: an epoch is a permutation of ``length`` positions and a cursor ``pos`` into it, both shared by
the main process and every DataLoader worker. The permutation is not stored: each epoch is drawn from a
64-bit ``seed`` (``torch.randperm(length)`` of a generator seeded with it; ``-1`` means storage order), which
the process that starts the epoch draws from its own generator and publishes with the epoch number. Every
process derives the same permutation from ``(seed, length)`` and caches it until the epoch changes, so the
shared state is a handful of counters, written only under the lock, and a worker killed at any point leaves
nothing half-written that a reader could take for an epoch. A permutation that was not drawn this way (the
epoch in progress when the sampler was shared, or one loaded from a checkpoint) is kept in a shared array
of the size it had then ("explicit" epochs).

Taking a batch moves the cursor under the lock; across all processes every position of an epoch is handed
out exactly once. The process whose take ends the epoch (all taken, or fewer than a batch left with
``drop_last``) starts the next one at once.

NOTE [pinned epochs]: a DataLoader epoch must end at the sampler's epoch boundary in every worker, even a
worker that starts late (a spawned worker takes seconds to start). A reader pins the epoch it iterates
(:meth:`Pin`): at its first take it joins the epoch claimed by the readers of the same DataLoader iteration
(same ``key``, at most ``readers`` of them), or claims the epoch in progress for a new iteration; once that
epoch has ended, its takes raise :class:`~torchrl.data.EpochEnded` instead of
drawing from the next one. A pinned epoch also keeps its length when the storage grows: items written
during the epoch join at the next one.

NOTE [planned epochs]: the cursor above hands batches out in the order processes ask for them, so with several
DataLoader workers which batch a worker gets depends on its speed and on prefetching: two runs differ and a
resumed run cannot replay the interrupted one. A reader that knows its place in the DataLoader iteration draws
by number instead (:meth:`SharedEpoch.take_planned`): worker ``w`` of ``N`` makes the batches numbered
``w, w + N, w + 2N, ...`` of the iteration (its ``draws``-th is ``w + draws * N``), and the iteration's
*plan* maps a number to a slice of an epoch:

- the first reader of an iteration (a new ``key``: torch's base seed of the iteration, shared by its workers
  and restored by torchdata's ``StatefulDataLoader`` on resume) claims the epoch in progress from its cursor
  (``start0``), or a new epoch when there is none, it is used up, or the storage length changed; the plan
  records it with the batch size and the iteration's total (``None``: that one epoch);
- batch ``g`` of epoch ``j`` of the plan takes positions ``[start + p * B, start + (p + 1) * B)`` of that
  epoch's permutation, ``p = g - first_g(j)`` (``start`` is ``start0`` for ``j = 0``, else 0; ``drop_last``
  drops a short last batch). Epoch ``j >= 1`` gets the seed ``mix(key, j)`` and the storage length of the
  moment the first reader reaches it, kept in a small ring of records; so the draws depend on the numbers
  only, never on which worker is faster or how far ahead it prefetched;
- the cursor does not move while the plan runs. The plan is *settled* (the cursor moved to where its last
  batch ends, whether or not every batch was drawn: an iteration cut short still counts its planned batches)
  when the next iteration claims, or when a process draws through the cursor; the key of a settled plan is
  retired, and a late reader of it gets :class:`~torchrl.data.EpochEnded`.

The plan is part of the sampler's state (``state_dict``), so a checkpoint taken mid-iteration lets the resumed
iteration (same key) rejoin it and each restored worker continue at its own next number.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from torchrl.data.replay_buffers._shared.arrays import SharedArray, StateGuard
from torchrl.data.replay_buffers.errors import EpochEnded

__all__ = ["Pin", "SharedEpoch", "check_plan", "derived_permutation"]

# Slots of the int64 counter array: the epoch number, its seed, length and cursor, the size of its explicit
# permutation (-1: derived from the seed), and the claim of the readers of one iteration (NOTE [pinned epochs]).
_EPOCH, _SEED, _LENGTH, _POS, _EXPLICIT, _CLAIM_KEY, _CLAIM_COUNT, _CLAIM_EPOCH = range(8)
_STORAGE_ORDER = -1  # the seed of an epoch in storage order (shuffle=False)
_KEY_MASK = (1 << 62) - 1

# The plan of the iteration reading by number (NOTE [planned epochs]): a header, the keys of settled plans, and
# a ring of records ``[j, length, first_g]`` of its epochs j >= 1.
(
    _P_KEY,
    _P_STATUS,
    _P_TOTAL,
    _P_BATCH,
    _P_SEED0,
    _P_LEN0,
    _P_START0,
    _P_EXPLICIT0,
    _P_TOP,
    _P_RETIRED_NEXT,
    _P_DROP_LAST,
    _P_SHUFFLE,
) = range(12)
_RETIRED, _RETIRED_SLOTS = 12, 8
_RECORDS, _RECORD_SLOTS = _RETIRED + _RETIRED_SLOTS, 64
_PLAN_SIZE = _RECORDS + 3 * _RECORD_SLOTS
_NO_PLAN, _ACTIVE, _SETTLED = 0, 1, 2
_CACHED_PERMUTATIONS = 4


def _epoch_seed(key: int, j: int) -> int:
    """The seed of epoch ``j`` of the plan with key ``key``: the same in every process, below ``2**62``."""
    digest = hashlib.blake2b(f"torchrl-epoch:{int(key)}:{int(j)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _KEY_MASK


def _batches(length: int, start: int, batch: int, drop_last: bool) -> int:
    """The number of batches of ``batch`` positions in ``[start, length)`` (a short last one unless dropped)."""
    available = max(length - start, 0)
    return available // batch if drop_last else -(-available // batch)


class Pin:
    """A reader's pin on an epoch (see NOTE [pinned epochs]): ``epoch`` is resolved at the first take."""

    __slots__ = ("key", "readers", "epoch")

    def __init__(self, key: int | None, readers: int) -> None:
        self.key = None if key is None else int(key) & _KEY_MASK
        self.readers = max(int(readers), 1)
        self.epoch: int | None = None


def _draw_seed(rng: torch.Generator | None) -> int:
    device = rng.device if rng is not None else None
    return int(torch.randint(0, 1 << 62, (1,), generator=rng, device=device).item())


def _permutation(seed: int, length: int) -> torch.Tensor:
    if seed == _STORAGE_ORDER:
        return torch.arange(length)
    return torch.randperm(length, generator=torch.Generator().manual_seed(seed))


def derived_permutation(seed: int, length: int) -> torch.Tensor:
    """The permutation of ``length`` positions an epoch of seed ``seed`` visits (``-1``: storage order)."""
    return _permutation(int(seed), int(length))


def check_plan(plan, who: str) -> dict | None:
    """A plan saved by :meth:`SharedEpoch.plan_state` (``None``: none), checked and copied; raises ``TypeError`` or
    ``ValueError`` naming the entry, so that a crafted plan is refused before anything is loaded."""
    if plan is None:
        return None

    def refuse(entry: str, value, expected: str, kind=ValueError):
        shown = value if isinstance(value, (int, bool, type(None))) else type(value).__name__
        raise kind(
            f"{who} state_dict['_plan'][{entry!r}] is {shown!r}, expected {expected}. Load a state saved by "
            f"{who}.state_dict(). Nothing was changed."
        )

    def integer(entry: str, low: int, high: int | None = None, *, optional: bool = False):
        value = plan.get(entry)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            refuse(entry, value, "an int" + (" or None" if optional else ""), TypeError)
        if value < low or (high is not None and value > high):
            refuse(entry, int(value), f"an int in [{low}, {high if high is not None else 'inf'}]")
        return int(value)

    def flag(entry: str) -> bool:
        value = plan.get(entry)
        if not isinstance(value, (bool, np.bool_)):
            refuse(entry, value, "a bool", TypeError)
        return bool(value)

    if not isinstance(plan, dict):
        raise TypeError(f"{who} state_dict['_plan'] must be a dict or None, got {type(plan).__name__}.")
    length0 = integer("length0", 0)
    checked = {
        "key": integer("key", 0),
        "settled": flag("settled"),
        "total": integer("total", 0, optional=True),
        "batch": integer("batch", 1),
        "drop_last": flag("drop_last"),
        "shuffle": flag("shuffle"),
        "seed0": integer("seed0", _STORAGE_ORDER, _KEY_MASK),
        "length0": length0,
        "start0": integer("start0", 0, length0),
        "explicit0": flag("explicit0"),
    }
    records = plan.get("records")
    if isinstance(records, np.ndarray):
        records = torch.from_numpy(records)
    if not isinstance(records, torch.Tensor) or records.is_floating_point() or records.dtype is torch.bool:
        refuse("records", records, "an int64 tensor of [epoch, length, first batch] rows", TypeError)
    records = (
        records.detach().to("cpu", torch.int64, copy=True).reshape(-1, 3)
        if records.numel() % 3 == 0
        else None
    )
    if records is None or (records.numel() and int(records.min()) < 0) or records.shape[0] > _RECORD_SLOTS:
        refuse(
            "records", "a malformed tensor", f"at most {_RECORD_SLOTS} rows [epoch, length, first batch] >= 0"
        )
    retired = plan.get("retired", [])
    if not isinstance(retired, (list, tuple)) or not all(
        isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0 for k in retired
    ):
        refuse("retired", retired, "a list of ints >= 0", TypeError)
    return {**checked, "records": records, "retired": [int(k) for k in retired]}


class SharedEpoch:
    """The epoch state of a sampler without replacement, in shared memory (see the module docstring).

    Args:
        perm (Tensor, optional): the permutation of the epoch in progress, if any.
        pos (int): the cursor in it.
        length (int): the number of positions the epoch covers.

    Examples:
        >>> epoch = SharedEpoch(None, 0, 0)
        >>> taken = [epoch.take(5, 2, drop_last=False, shuffle=False, rng=None, pin=None) for _ in range(3)]
        >>> [(t.tolist(), ran_out) for t, ran_out in taken]
        [([0, 1], False), ([2, 3], False), ([4], True)]
    """

    def __init__(self, perm: torch.Tensor | None, pos: int, length: int) -> None:
        self._counters = SharedArray(np.zeros(8, dtype=np.int64))
        self._c = self._counters.array  # the numpy view the methods index (re-fetched when the memory moves)
        size = 0 if perm is None else perm.numel()
        self._explicit = SharedArray(np.zeros(size, dtype=np.int64))
        self._guard = StateGuard()
        self._cache: tuple[tuple[int, int, int], torch.Tensor] | None = None
        self._plan = SharedArray(np.zeros(_PLAN_SIZE, dtype=np.int64))
        self._p = self._plan.array
        self._p[_RETIRED : _RETIRED + _RETIRED_SLOTS] = -1
        self._permutations: dict[tuple[int, int], torch.Tensor] = {}  # planned epochs derived in this process
        c = self._c
        c[_CLAIM_KEY], c[_EXPLICIT], c[_LENGTH] = -1, -1, -1
        if perm is not None:
            self._explicit.array[:] = perm.detach().cpu().numpy()
            c[_EPOCH], c[_LENGTH], c[_POS], c[_EXPLICIT] = 1, length, pos, size

    # -- sharing ---------------------------------------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        return self._guard.is_shared

    def share_memory_(self) -> SharedEpoch:
        """Moves the counters and the explicit permutation to shared memory (a no-op when shared already)."""
        if not self._guard.is_shared:
            self._counters.share_memory_()
            self._c = self._counters.array
            self._plan.share_memory_()
            self._p = self._plan.array
            self._explicit.share_memory_()
            self._guard.share_memory_()
        return self

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = None  # each process derives the permutation itself
        state["_permutations"] = {}
        state.pop("_c")
        state.pop("_p")
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._c = self._counters.array
        self._p = self._plan.array

    # -- epochs ----------------------------------------------------------------------------------------------
    def take(self, n: int, count: int, *, drop_last: bool, shuffle: bool, rng, pin: Pin | None):
        """The next ``count`` positions (fewer at the end) of the epoch over ``n`` items, and whether this take
        ended the epoch. Raises ``EpochEnded`` when ``pin``'s epoch is over (nothing is taken then)."""
        c = self._c
        while True:
            ended = False
            with self._guard.write(self._restart):
                if self._p[_P_STATUS] == _ACTIVE:  # a draw through the cursor starts after the plan's batches
                    self._settle(n)
                if pin is not None and pin.epoch is None:
                    pin.epoch = self._claim(pin, n, shuffle, rng)
                if pin is not None and c[_EPOCH] != pin.epoch:
                    ended = True
                elif self._needs_restart(n, pin):
                    self._new_epoch(n, shuffle, rng)
                    ended = pin is not None  # the pinned epoch no longer fits the storage (it shrank)
                if not ended:
                    perm = self._current_permutation()
                    if perm is not None:
                        pos, length = int(c[_POS]), int(c[_LENGTH])
                        chosen = perm[pos : pos + count]
                        if c[_EXPLICIT] >= 0:  # a view of shared memory that a load may overwrite
                            chosen = chosen.clone()
                        pos += chosen.numel()
                        c[_POS] = pos
                        remaining = length - pos
                        ran_out = remaining == 0 or (drop_last and remaining < count)
                        if ran_out:
                            self._new_epoch(n, shuffle, rng)
                        return chosen, ran_out
                    key = (int(c[_EPOCH]), int(c[_SEED]), int(c[_LENGTH]))
            if ended:  # raised outside the write: nothing to repair
                raise EpochEnded(
                    f"Epoch {pin.epoch} of this sampler without replacement has ended (every position was handed "
                    f"out, in this process or another one sharing the sampler)."
                )
            # the permutation of a new epoch, derived outside the lock; the epoch is checked again under it
            self._cache = (key, _permutation(key[1], key[2]))

    def snapshot(self) -> tuple[torch.Tensor | None, int, int, int | None]:
        """``(permutation, pos, length, seed)`` of the epoch in progress (``(None, 0, 0, None)`` before the
        first; ``seed`` is ``None`` for an explicit permutation), taken under the lock: a consistent copy while
        other processes draw."""
        c = self._c
        with self._guard.read(self._restart):
            if c[_LENGTH] < 0:
                return None, 0, 0, None
            perm = self._current_permutation()
            seed = None if c[_EXPLICIT] >= 0 else int(c[_SEED])
            if perm is None:
                perm = _permutation(int(c[_SEED]), int(c[_LENGTH]))
            return perm.clone(), int(c[_POS]), int(c[_LENGTH]), seed

    def load(self, perm: torch.Tensor | None, pos: int, length: int, seed: int | None = None) -> None:
        """Makes ``perm`` (``None``: none, the next take starts an epoch) the epoch in progress, at ``pos``.

        ``seed``, when ``perm`` is the permutation it derives (a state saved from a shared sampler), is kept
        instead of the permutation itself; otherwise the permutation must fit the explicit array.
        """
        c = self._c
        if perm is not None and seed is not None and perm.numel() == length:
            if torch.equal(_permutation(int(seed), int(length)), perm.cpu()):
                with self._guard.write(self._restart):
                    self._drop_plan()
                    c[_SEED], c[_LENGTH], c[_POS], c[_EXPLICIT] = int(seed), int(length), int(pos), -1
                    c[_EPOCH] += 1
                return
        with self._guard.write(self._restart):
            self._drop_plan()
            if perm is None:
                self._restart()
                return
            if perm.numel() > len(self._explicit):
                self._grow_explicit(perm.numel())
            self._explicit.array[: perm.numel()] = perm.detach().cpu().numpy()
            c[_LENGTH], c[_POS], c[_EXPLICIT] = int(length), int(pos), perm.numel()
            c[_EPOCH] += 1

    def reset(self) -> None:
        """Forgets the epoch in progress and the plan of an iteration (its readers' next takes raise
        ``EpochEnded``): the next take starts a new epoch."""
        with self._guard.write(self._restart):
            self._drop_plan()
            self._restart()

    # -- planned epochs (NOTE [planned epochs]) -----------------------------------------------------------------
    def take_planned(
        self, n: int, count: int, *, key: int, number: int, total: int | None, drop_last: bool, shuffle: bool
    ) -> tuple[torch.Tensor, bool]:
        """Batch ``number`` (from 0) of the iteration ``key`` over ``n`` items, ``count`` positions a batch, and
        whether it is the last batch of its epoch. ``total`` is the number of batches of the iteration
        (``None``: one epoch). Raises ``EpochEnded`` past the end of a one-epoch iteration, when the iteration
        was superseded by a later one (its key retired), or when the storage shrank under the batch's epoch."""
        key = int(key) & _KEY_MASK
        chosen, located = None, None
        with self._guard.write(self._restart):
            p = self._p
            joined = p[_P_STATUS] != _NO_PLAN and p[_P_KEY] == key
            if not joined and not self._retired(key):
                if p[_P_STATUS] == _ACTIVE:
                    self._settle(n)
                self._claim_plan(key, n, count, total, drop_last, shuffle)
                joined = True
            if joined:
                located = self._locate(int(number), n)
            if located is not None:
                seed, explicit, length, lo, hi, last = located
                if length > n:  # the storage shrank under this epoch
                    located = None
                elif explicit >= 0:  # a view of shared memory that a load may overwrite
                    chosen = torch.from_numpy(self._explicit_view(explicit)[lo:hi]).clone()
        if located is None:
            raise EpochEnded(
                f"Batch {number} of this DataLoader iteration is past the end of its epoch (or the iteration was "
                f"superseded by a later one, or the storage shrank under its epoch)."
            )
        if chosen is None:
            chosen = self._planned_permutation(seed, length)[lo:hi]
        return chosen, last

    def plan_state(self) -> dict | None:
        """The plan of the iteration reading by number (``None`` if there is none), a consistent copy."""
        p = self._p
        with self._guard.read(self._restart):
            if p[_P_STATUS] == _NO_PLAN:
                return None
            top = int(p[_P_TOP])
            slots = [
                _RECORDS + 3 * (j % _RECORD_SLOTS) for j in range(max(1, top - _RECORD_SLOTS + 1), top + 1)
            ]
            records = torch.tensor([p[i : i + 3].tolist() for i in slots], dtype=torch.int64).reshape(-1, 3)
            return {
                "key": int(p[_P_KEY]),
                "settled": bool(p[_P_STATUS] == _SETTLED),
                "total": None if p[_P_TOTAL] < 0 else int(p[_P_TOTAL]),
                "batch": int(p[_P_BATCH]),
                "drop_last": bool(p[_P_DROP_LAST]),
                "shuffle": bool(p[_P_SHUFFLE]),
                "seed0": int(p[_P_SEED0]),
                "length0": int(p[_P_LEN0]),
                "start0": int(p[_P_START0]),
                "explicit0": bool(p[_P_EXPLICIT0] >= 0),
                "records": records,
                "retired": [int(k) for k in p[_RETIRED : _RETIRED + _RETIRED_SLOTS] if k >= 0],
            }

    def load_plan(self, plan: dict | None) -> None:
        """Restores a plan saved by :meth:`plan_state` (after :meth:`load` restored the epoch it starts from)."""
        if plan is None:
            return
        p, c = self._p, self._c
        records = torch.as_tensor(plan["records"], dtype=torch.int64).reshape(-1, 3)
        with self._guard.write(self._restart):
            explicit = int(c[_EXPLICIT]) if plan["explicit0"] else -1
            if plan["explicit0"] and explicit != int(plan["length0"]):
                return  # the explicit permutation it started from is gone: no plan (a new iteration claims)
            p[_P_KEY], p[_P_STATUS] = int(plan["key"]) & _KEY_MASK, _SETTLED if plan["settled"] else _ACTIVE
            p[_P_TOTAL] = -1 if plan["total"] is None else int(plan["total"])
            p[_P_BATCH], p[_P_DROP_LAST], p[_P_SHUFFLE] = (
                int(plan["batch"]),
                int(plan["drop_last"]),
                int(plan["shuffle"]),
            )
            p[_P_SEED0], p[_P_LEN0], p[_P_START0] = (
                int(plan["seed0"]),
                int(plan["length0"]),
                int(plan["start0"]),
            )
            p[_P_EXPLICIT0] = explicit
            p[_P_TOP] = int(records[-1, 0]) if records.numel() else 0
            for j, length, first in records.tolist():
                p[_RECORDS + 3 * (j % _RECORD_SLOTS) : _RECORDS + 3 * (j % _RECORD_SLOTS) + 3] = (
                    j,
                    length,
                    first,
                )
            retired = list(plan.get("retired", []))[-_RETIRED_SLOTS:]
            p[_RETIRED : _RETIRED + _RETIRED_SLOTS] = -1
            p[_RETIRED : _RETIRED + len(retired)] = retired
            p[_P_RETIRED_NEXT] = len(retired)

    # -- internals (lock held) -------------------------------------------------------------------------------
    def _restart(self) -> None:
        """No epoch in progress (also the repair after a writer died mid-write: a new epoch starts)."""
        c = self._c
        c[_LENGTH], c[_POS], c[_EXPLICIT] = -1, 0, -1
        c[_EPOCH] += 1

    def _needs_restart(self, n: int, pin: Pin | None) -> bool:
        length = int(self._c[_LENGTH])
        if length == n:
            return False
        if length < 0 or n < length:  # no epoch, or the storage shrank under it
            return True
        # the storage grew: a pinned epoch runs to its end, otherwise a new one starts (as in one process)
        return pin is None or pin.epoch != self._c[_EPOCH]

    def _new_epoch(self, n: int, shuffle: bool, rng) -> None:
        c = self._c
        c[_SEED] = _draw_seed(rng) if shuffle else _STORAGE_ORDER
        c[_LENGTH], c[_POS], c[_EXPLICIT] = n, 0, -1
        c[_EPOCH] += 1

    def _claim(self, pin: Pin, n: int, shuffle: bool, rng) -> int:
        """The epoch ``pin`` iterates: the one claimed by the readers with its key that came first, or (for
        the first of them) the epoch in progress, started now if there is none or it no longer fits ``n``."""
        c = self._c
        if pin.key is not None and c[_CLAIM_KEY] == pin.key and c[_CLAIM_COUNT] < pin.readers:
            c[_CLAIM_COUNT] += 1
            return int(c[_CLAIM_EPOCH])
        if self._needs_restart(n, None):
            self._new_epoch(n, shuffle, rng)
        if pin.key is not None:
            c[_CLAIM_KEY], c[_CLAIM_COUNT], c[_CLAIM_EPOCH] = pin.key, 1, c[_EPOCH]
        return int(c[_EPOCH])

    def _current_permutation(self) -> torch.Tensor | None:
        """The permutation of the epoch in progress if this process has it (explicit or cached), else None."""
        c = self._c
        explicit = int(c[_EXPLICIT])
        if explicit >= 0:
            return torch.from_numpy(self._explicit_view(explicit))
        cache = self._cache
        if cache is not None and cache[0] == (int(c[_EPOCH]), int(c[_SEED]), int(c[_LENGTH])):
            return cache[1]
        return None

    def _explicit_view(self, size: int) -> np.ndarray:
        array = self._explicit.array
        if size > len(array):
            raise RuntimeError(
                "This process holds an outdated handle of the sampler's shared permutation: the sampler state was "
                "loaded with a larger permutation after this DataLoader worker started. Load the state before "
                "iterating the DataLoader (torchrl.data.load_training_state does), or start a new iterator."
            )
        return array[:size]

    def _grow_explicit(self, size: int) -> None:
        """A larger array for a loaded permutation (processes started later receive it with the sampler)."""
        grown = SharedArray(np.zeros(size, dtype=np.int64))
        self._explicit = grown.share_memory_() if self._guard.is_shared else grown

    def _planned_permutation(self, seed: int, length: int) -> torch.Tensor:
        cache = self._permutations
        perm = cache.get((seed, length))
        if perm is None:
            perm = _permutation(seed, length)
            if len(cache) >= _CACHED_PERMUTATIONS:
                cache.pop(next(iter(cache)))
            cache[(seed, length)] = perm
        return perm

    def _retired(self, key: int) -> bool:
        return bool((self._p[_RETIRED : _RETIRED + _RETIRED_SLOTS] == key).any())

    def _retire(self, key: int) -> None:
        p = self._p
        p[_RETIRED + int(p[_P_RETIRED_NEXT]) % _RETIRED_SLOTS] = key
        p[_P_RETIRED_NEXT] += 1

    def _drop_plan(self) -> None:
        """No plan any more; the readers of the one there was get ``EpochEnded``."""
        p = self._p
        if p[_P_STATUS] != _NO_PLAN:
            self._retire(int(p[_P_KEY]))
            p[_P_STATUS] = _NO_PLAN

    def _claim_plan(
        self, key: int, n: int, batch: int, total: int | None, drop_last: bool, shuffle: bool
    ) -> None:
        """Makes ``key`` the plan: from the epoch in progress at its cursor, or a new epoch when there is none,
        nothing is left of it for a batch, or the storage length changed."""
        c, p = self._c, self._p
        self._drop_plan()
        if int(c[_LENGTH]) != n or _batches(int(c[_LENGTH]), int(c[_POS]), batch, drop_last) == 0:
            c[_SEED] = _epoch_seed(key, 0) if shuffle else _STORAGE_ORDER
            c[_LENGTH], c[_POS], c[_EXPLICIT] = n, 0, -1
            c[_EPOCH] += 1
        p[_P_KEY], p[_P_STATUS], p[_P_TOTAL], p[_P_BATCH] = (
            key,
            _ACTIVE,
            -1 if total is None else total,
            batch,
        )
        p[_P_DROP_LAST], p[_P_SHUFFLE], p[_P_TOP] = int(drop_last), int(shuffle), 0
        p[_P_SEED0], p[_P_LEN0], p[_P_START0], p[_P_EXPLICIT0] = c[_SEED], c[_LENGTH], c[_POS], c[_EXPLICIT]

    def _record(self, j: int) -> tuple[int, int, int]:
        i = _RECORDS + 3 * (j % _RECORD_SLOTS)
        return int(self._p[i]), int(self._p[i + 1]), int(self._p[i + 2])

    def _seed_of(self, j: int) -> int:
        return _epoch_seed(int(self._p[_P_KEY]), j) if self._p[_P_SHUFFLE] else _STORAGE_ORDER

    def _locate(self, g: int, n: int):
        """``(seed, explicit size, length, lo, hi, last)`` of batch ``g`` of the plan (``None`` past a one-epoch
        plan); creates the records of the epochs up to it (their length: ``n``)."""
        p = self._p
        batch, drop_last = int(p[_P_BATCH]), bool(p[_P_DROP_LAST])
        length0, start0 = int(p[_P_LEN0]), int(p[_P_START0])
        nb0 = _batches(length0, start0, batch, drop_last)
        if g < nb0:
            lo = start0 + g * batch
            return int(p[_P_SEED0]), int(p[_P_EXPLICIT0]), length0, lo, min(lo + batch, length0), g == nb0 - 1
        if p[_P_TOTAL] < 0:
            return None
        while True:
            top = int(p[_P_TOP])
            if top == 0:
                first, count = nb0, 0
            else:
                _, length, first = self._record(top)
                count = _batches(length, 0, batch, drop_last)
            if g < first + count:
                break
            if _batches(n, 0, batch, drop_last) == 0:
                raise RuntimeError(f"No batch of {batch} fits the {n} stored items with drop_last=True.")
            i = _RECORDS + 3 * ((top + 1) % _RECORD_SLOTS)
            p[i], p[i + 1], p[i + 2] = top + 1, n, first + count
            p[_P_TOP] = top + 1
        for j in range(top, max(top - _RECORD_SLOTS, 0), -1):
            _, length, first = self._record(j)
            if g >= first:
                lo = (g - first) * batch
                count = _batches(length, 0, batch, drop_last)
                return self._seed_of(j), -1, length, lo, min(lo + batch, length), g - first == count - 1
        raise RuntimeError(
            f"Batch {g} of this DataLoader iteration belongs to an epoch that is more than {_RECORD_SLOTS} epochs "
            f"behind the most advanced reader: its record is gone. Use a larger batch size or fewer workers."
        )

    def _settle(self, n: int) -> None:
        """Moves the cursor to where the plan's last batch ends; the plan stays for its readers."""
        c, p = self._c, self._p
        p[_P_STATUS] = _SETTLED
        total = int(p[_P_TOTAL])
        if total < 0:  # one epoch: used up
            self._restart()
            return
        if total == 0:
            return
        batch, drop_last = int(p[_P_BATCH]), bool(p[_P_DROP_LAST])
        g = total - 1
        nb0 = _batches(int(p[_P_LEN0]), int(p[_P_START0]), batch, drop_last)
        if g < nb0:
            j, length, end = 0, int(p[_P_LEN0]), int(p[_P_START0]) + (g + 1) * batch
        else:
            top = int(p[_P_TOP])
            j = None
            if top:
                _, length, first = self._record(top)
                if g < first + _batches(length, 0, batch, drop_last):
                    j = next(
                        (k for k in range(top, max(top - _RECORD_SLOTS, 0), -1) if g >= self._record(k)[2]),
                        None,
                    )
                    if j is None:
                        self._restart()
                        return
                    _, length, first = self._record(j)
                next_first = first + _batches(length, 0, batch, drop_last)
            else:
                next_first = nb0
            if j is None:  # epochs not reached yet: the current length
                per_epoch = _batches(n, 0, batch, drop_last)
                if per_epoch == 0:
                    self._restart()
                    return
                j = top + 1 + (g - next_first) // per_epoch
                first, length = next_first + (j - top - 1) * per_epoch, n
            end = (g - first + 1) * batch
        remaining = length - end
        if remaining <= 0 or (drop_last and remaining < batch):
            self._restart()
        elif j == 0:
            c[_POS] = end
        else:
            c[_SEED], c[_LENGTH], c[_POS], c[_EXPLICIT] = self._seed_of(j), length, end, -1
            c[_EPOCH] += 1

    def __repr__(self) -> str:
        c = self._c
        return (
            f"{type(self).__name__}(epoch={int(c[_EPOCH])}, pos={int(c[_POS])}, length={int(c[_LENGTH])}, "
            f"shared={self.is_shared})"
        )
