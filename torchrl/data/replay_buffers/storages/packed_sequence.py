"""Variable-length sequences packed end to end: :class:`PackedSequenceStorage` (language-model rollouts).

Data model (NOTE [sequence items] in :mod:`torchrl.data.replay_buffers.loading.sequence_items`): an item is one
sequence. The token entries of every sequence live in one flat *arena* per key, ``[max_tokens, *feature]``, back
to back, with no padding; a
*slot table* ``[max_sequences, 5]`` (int64) holds per sequence its absolute start, its length, whether it is
alive, its write number and its group; fixed entries (reward, prompt id, policy version, ...) live in a tensor
``[max_sequences, *shape]`` per key, as in a tensor storage.

NOTE [packed ring]: positions in the arena are *absolute* token counts (``start % max_tokens`` is where a
sequence lies). Writes append at the token cursor; a sequence that would cross the arena's end starts at the next
multiple of ``max_tokens`` instead (the tail is skipped), so every sequence is one contiguous run. Invariant: every
live sequence starts at or after ``cursor - max_tokens``. A write that ends at ``end`` therefore frees the live
sequences that start before ``end - max_tokens`` (whole sequences, oldest first), and the slots it reuses (slots
are a ring of ``max_sequences`` in write order). With groups, a freed sequence frees its whole group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, MemoryMappedTensor, TensorDict, TensorDictBase

import torchrl.data.replay_buffers._checkpoint.io as _io
import torchrl.data.replay_buffers.storages._packed_incremental as _inc
from torchrl._validation import check_bool, check_positive_int, is_int
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._shared.cleanup import make_scratch_dir
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers._shared.lock import NULL_LOCK, ProcessLock
from torchrl.data.replay_buffers.errors import CheckpointError, DrawOverwrittenError, TornReadError
from torchrl.data.replay_buffers.loading.sequence_items import (
    SequenceBatch,
    as_items,
    check_token_keys,
    encode_sequences,
    key_tuple,
    segment_ids,
    shown_key,
)
from torchrl.data.replay_buffers.storages._index import as_index_tensor
from torchrl.data.replay_buffers.storages.base import Storage

__all__ = ["PackedSequenceStorage"]

# columns of the slot table
START, LENGTH, ALIVE, SEQNO, GROUP = range(5)
# cells of the counters
TOKEN_CURSOR, SEQ_COUNT, GROUP_COUNT, REVISION = range(4)
_LAYOUT_FILE = "layout.json"
_READ_ATTEMPTS = 8  # reads of named slots before a torn read raises (NOTE [packed reads])


def _place(cursor: int, lengths: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """The absolute starts of ``lengths`` appended from ``cursor`` (NOTE [packed ring]): one vectorized pass per
    arena end crossed."""
    n = lengths.numel()
    starts = torch.empty(n, dtype=torch.long)
    i, pos = 0, cursor
    while i < n:
        rest = lengths[i:]
        rel = pos + rest.cumsum(0) - rest
        cross = torch.div(rel, max_tokens, rounding_mode="floor") != torch.div(
            rel + rest - 1, max_tokens, rounding_mode="floor"
        )
        if not bool(cross.any()):
            starts[i:] = rel
            break
        j = int(cross.long().argmax())
        starts[i : i + j] = rel[:j]
        pos = (int(rel[j]) // max_tokens + 1) * max_tokens
        starts[i + j] = pos
        pos += int(rest[j])
        i += j + 1
    return starts


def _keep_groups_unbroken(starts: torch.Tensor, lengths: torch.Tensor, sizes: torch.Tensor, max_tokens: int):
    """``starts`` moved so that no group spans more than ``max_tokens`` (a skipped arena tail could make a group
    of at most ``max_tokens`` tokens overwrite its own first sequences): such a group starts at the next arena
    start instead, and the groups after it follow. One pass per moved group (rare)."""
    ends = starts + lengths
    first = sizes.cumsum(0) - sizes
    last = first + sizes - 1
    span = ends[last] - starts[first]
    while bool((span > max_tokens).any()):
        g = int((span > max_tokens).long().argmax())
        i = int(first[g])
        pos = (int(starts[i]) // max_tokens + 1) * max_tokens
        starts = torch.cat([starts[:i], _place(pos, lengths[i:], max_tokens)])
        ends = starts + lengths
        span = ends[last] - starts[first]
        span[:g + 1] = torch.clamp(span[:g + 1], max=max_tokens)
    return starts


class PackedSequenceStorage(Storage):
    """A storage of variable-length sequences whose tokens are packed end to end, with no padding.

    Each item is one sequence (a TensorDict of batch size ``[]``): its entries named in ``token_keys`` hold one
    value per token (``[L, *feature]``: token ids, log-probs, masks), the others are fixed per sequence (reward,
    prompt id, policy version). Token entries live in one arena ``[max_tokens, *feature]`` per key, so the storage
    holds ``sum(L)`` tokens in ``sum(L)`` cells: no per-sequence padding and no per-sequence tensor object; fixed
    entries live in ``[max_sequences, ...]`` tensors. Writes append (FIFO); a write that needs room frees the
    oldest sequences whole, never part of one (see NOTE [packed ring] in this module), and with
    :class:`~torchrl.data.GroupWriter`, whole groups.

    Args:
        max_tokens (int): the capacity of the arena in tokens.

    Keyword Args:
        max_sequences (int, optional): the number of sequence slots (the capacity in sequences, the rows of the
            fixed entries). Defaults to ``max(1, max_tokens // 16)``.
        token_keys (tuple of NestedKey): the per-token entries. Defaults to ``("tokens",)``.
        scratch_dir (str or path-like, optional): keep the arena, the slot table and the fixed entries in
            memory-mapped files under a new directory inside ``scratch_dir`` (shared by every process that
            receives the storage). Defaults to ``None`` (RAM).
        shared_init (bool): share the storage with other processes from construction on (files under
            ``scratch_dir``, or a temporary directory): copies sent to other processes before the first write see
            the data of the first write, whichever process makes it. Defaults to ``False``.
        device (torch.device or str): where the data live; sharing needs ``"cpu"``. Defaults to ``"cpu"``.

    ``len(storage)`` is the number of live sequences; ``get`` takes slots (as a writer returns them): an int gives
    one TensorDict, an index gives a :class:`~tensordict.LazyStackedTensorDict` ``[n]`` whose token entries are
    copies of length ``L_i``. Reading a freed slot raises ``IndexError``; a read torn by another process's write
    is retried (NOTE [packed reads]). ``dumps`` / ``loads`` checkpoint it without pickle; a dump onto its own
    last checkpoint writes only the rows appended since (NOTE [packed incremental dumps] in
    ``storages/_packed_incremental.py``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import PackedSequenceStorage
        >>> storage = PackedSequenceStorage(max_tokens=10, max_sequences=4)
        >>> def seqs(*lengths):
        ...     return [TensorDict(tokens=torch.arange(n), reward=torch.tensor(float(n))) for n in lengths]
        >>> storage.extend_sequences(seqs(4, 4))
        tensor([0, 1])
        >>> [t.tolist() for t in storage.get([0, 1]).get("tokens", as_list=True)]
        [[0, 1, 2, 3], [0, 1, 2, 3]]
        >>> storage.extend_sequences(seqs(2)), storage.extend_sequences(seqs(3))  # the second one wraps
        (tensor([2]), tensor([3]))
        >>> storage.live_slots().tolist(), len(storage)  # slot 0 was overwritten in part: freed whole
        ([1, 2, 3], 3)
    """

    is_shared: bool = False

    def __init__(
        self,
        max_tokens: int,
        *,
        max_sequences: int | None = None,
        token_keys=("tokens",),
        scratch_dir=None,
        shared_init: bool = False,
        device="cpu",
    ):
        max_tokens = check_positive_int("max_tokens", max_tokens)
        if max_sequences is None:
            max_sequences = max(1, max_tokens // 16)
        max_sequences = check_positive_int("max_sequences", max_sequences)
        super().__init__(max_sequences)
        self.max_tokens = max_tokens
        self.token_keys = check_token_keys(token_keys)
        self.shared_init = check_bool("shared_init", shared_init)
        self.device = torch.device(device)
        if (scratch_dir is not None or self.shared_init) and self.device.type != "cpu":
            raise ValueError(
                f"A PackedSequenceStorage in files or shared from construction lives on the CPU; got "
                f"device={device!r} with scratch_dir={scratch_dir!r}, shared_init={shared_init}. Pass device='cpu'."
            )
        self._dir = None
        if scratch_dir is not None or self.shared_init:
            if scratch_dir is not None:
                os.makedirs(os.fspath(scratch_dir), exist_ok=True)
            self._dir = make_scratch_dir(scratch_dir)
        self._slots = self._new_tensor("slots", (max_sequences, 5))
        self._slots[:, SEQNO] = -1
        self._slots[:, GROUP] = -1
        self._meta = self._new_tensor("meta", (4,))
        self._resets = self._new_tensor("resets", (1,))  # empty() and loads: NOTE [packed incremental dumps]
        self._dump_records: dict = {}  # what this process remembers of its dumps (never pickled)
        self._arena: TensorDictBase | None = None
        self._fixed: TensorDictBase | None = None
        self._layout: dict | None = None  # _stored_layout()
        self._lock: ProcessLock | None = None
        self.write_lock = NULL_LOCK
        if self.shared_init:
            self.share_memory_()

    # -- memory ----------------------------------------------------------------------------------------------
    def _new_tensor(self, name: str, shape, dtype=torch.long) -> torch.Tensor:
        if self._dir is None:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        path = os.path.join(self._dir, f"{name}.memmap")
        tensor = MemoryMappedTensor.empty(torch.Size(shape), dtype=dtype, filename=path)
        tensor.zero_()
        return tensor

    def _allocate(self, layout: dict) -> None:
        """Allocates the arena and the fixed entries for ``layout`` ({"tokens": [(key, dtype, feature)], "fixed":
        [(key, dtype, shape)]}), in this process's memory kind; publishes it for other processes (shared_init)."""
        arena = TensorDict(batch_size=[self.max_tokens], device=self.device)
        for i, (key, dtype, feature) in enumerate(layout["tokens"]):
            arena.set(key, self._new_tensor(f"tokens_{i}", (self.max_tokens, *feature), dtype))
        fixed = TensorDict(batch_size=[self.max_size], device=self.device)
        for i, (key, dtype, shape) in enumerate(layout["fixed"]):
            fixed.set(key, self._new_tensor(f"fixed_{i}", (self.max_size, *shape), dtype))
        if self.is_shared and self._dir is None:
            arena.share_memory_()
            fixed.share_memory_()
        self._arena, self._fixed = arena, fixed
        self._layout = self._layout_of_backing()
        if self.shared_init:
            doc = {
                "tokens": [[list(k), _io.dtype_name(d), list(f)] for k, d, f in layout["tokens"]],
                "fixed": [[list(k), _io.dtype_name(d), list(s)] for k, d, s in layout["fixed"]],
            }
            tmp = os.path.join(self._dir, _LAYOUT_FILE + ".tmp")
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, os.path.join(self._dir, _LAYOUT_FILE))

    def _sync_shared_init(self) -> None:
        """Maps the arena that another process allocated at the first write of a ``shared_init`` storage."""
        if self._arena is not None or not self.shared_init:
            return
        path = os.path.join(self._dir, _LAYOUT_FILE)
        if not os.path.exists(path):
            return
        with open(path) as f:
            doc = json.load(f)
        arena = TensorDict(batch_size=[self.max_tokens])
        for i, (key, dtype, feature) in enumerate(doc["tokens"]):
            arena.set(tuple(key), MemoryMappedTensor.from_filename(
                os.path.join(self._dir, f"tokens_{i}.memmap"), dtype=_io.DTYPES[dtype],
                shape=torch.Size([self.max_tokens, *feature])))
        fixed = TensorDict(batch_size=[self.max_size])
        for i, (key, dtype, shape) in enumerate(doc["fixed"]):
            fixed.set(tuple(key), MemoryMappedTensor.from_filename(
                os.path.join(self._dir, f"fixed_{i}.memmap"), dtype=_io.DTYPES[dtype],
                shape=torch.Size([self.max_size, *shape])))
        self._arena, self._fixed = arena, fixed
        self._layout = self._layout_of_backing()

    def share_memory_(self) -> PackedSequenceStorage:
        """Shares the storage with other processes (in place): the arena, the slot table, the fixed entries and
        the counters move to shared memory (files stay files), and writes take :attr:`write_lock` (a lock across
        processes). A storage that holds no data yet must be built with ``shared_init=True`` to be written by
        another process first."""
        if self.device.type != "cpu":
            raise RuntimeError(
                f"A PackedSequenceStorage on {self.device} cannot be shared with other processes; build it with "
                f"device='cpu'."
            )
        if self._dir is None:
            self._slots.share_memory_()
            self._meta.share_memory_()
            self._resets.share_memory_()
            for td in (self._arena, self._fixed):
                if td is not None:
                    td.share_memory_()
        if self._lock is None:
            self._lock = self.write_lock = ProcessLock()
        self.is_shared = True
        for entity in self._attached_entities:
            share = getattr(entity, "share_memory_", None)
            if share is not None:
                share()
        return self

    def __getstate__(self):
        if is_spawning() and not self.is_shared:  # a spawned process writes and reads the same memory
            self.share_memory_()
        state = super().__getstate__()
        state["_dump_records"] = {}  # a copy dumps in full first (NOTE [packed incremental dumps])
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        # a copy by value (pickle, torch.save) of RAM tensors is private from now on; files stay shared
        self.is_shared = self.is_shared and (self._dir is not None or self._slots.is_shared())
        if not self.is_shared:
            self._lock = None
            self.write_lock = NULL_LOCK

    def nbytes(self) -> int:
        """The bytes the storage holds: the arenas, the fixed entries, the slot table and the counters."""
        total = self._slots.numel() * 8 + self._meta.numel() * 8
        for td in (self._arena, self._fixed):
            if td is not None:
                total += sum(v.numel() * v.element_size() for v in td.values(True, True))
        return total

    def token_bytes(self) -> int:
        """The bytes of the arenas (``max_tokens`` cells per token key)."""
        if self._arena is None:
            return 0
        return sum(v.numel() * v.element_size() for v in self._arena.values(True, True))

    # -- validation ------------------------------------------------------------------------------------------
    def _encode(self, items: list, what: str) -> SequenceBatch:
        """The validated batch of ``items`` (raises before anything is written)."""
        batch = encode_sequences(items, self.token_keys, self.max_tokens, self.device, what)
        self._check_layout(batch, what)
        return batch

    @staticmethod
    def _layout_of(batch: SequenceBatch) -> dict:
        return {
            "tokens": [(k, v.dtype, tuple(v.shape[1:])) for k, v in batch.tokens.items()],
            "fixed": [(k, v.dtype, tuple(v.shape[1:])) for k, v in batch.fixed.items()],
        }

    def _stored_layout(self) -> dict | None:
        """The layout of the arena and the fixed entries (``None`` before the first write): read once, when they
        are allocated or mapped (dtypes and shapes never change)."""
        return self._layout

    def _layout_of_backing(self) -> dict:
        return {
            "tokens": [(k, self._arena.get(k).dtype, tuple(self._arena.get(k).shape[1:])) for k in self.token_keys],
            "fixed": [(key_tuple(k), v.dtype, tuple(v.shape[1:])) for k, v in self._fixed.items(True, True)],
        }

    def _check_layout(self, batch: SequenceBatch, what: str) -> None:
        self._sync_shared_init()
        stored = self._stored_layout()
        if stored is None:
            return
        new = self._layout_of(batch)
        if {k for k, _, _ in new["fixed"]} != {k for k, _, _ in stored["fixed"]}:
            raise ValueError(
                f"{what}: the sequences have the fixed entries {sorted(str(shown_key(k)) for k, _, _ in new['fixed'])}, "
                f"the storage holds {sorted(str(shown_key(k)) for k, _, _ in stored['fixed'])}. Write the same "
                f"entries (or empty() a fresh storage). Nothing was written."
            )
        shapes = {k: (d, s) for k, d, s in stored["tokens"] + stored["fixed"]}
        for key, dtype, shape in new["tokens"] + new["fixed"]:
            held_dtype, held_shape = shapes[key]
            if shape != held_shape:
                raise ValueError(
                    f"{what}: the entry {shown_key(key)!r} has shape {list(shape)} per "
                    f"{'token' if key in self.token_keys else 'sequence'}, the storage holds {list(held_shape)}. "
                    f"Nothing was written."
                )
            if dtype.is_floating_point and not (held_dtype.is_floating_point or held_dtype.is_complex):
                raise TypeError(
                    f"{what}: the entry {shown_key(key)!r} is {dtype}, the storage holds {held_dtype}: floating "
                    f"values would be truncated. Cast them (e.g. .long()) first. Nothing was written."
                )

    # -- writes ----------------------------------------------------------------------------------------------
    def extend_sequences(self, data, *, group_sizes=None, free=None) -> torch.Tensor:
        """Appends the sequences of ``data`` and returns their slots (int64 ``[n]``, in the order of ``data``).

        ``data`` is a batch of sequences (NOTE [sequence items]). With ``group_sizes`` (ints >= 1 summing to the
        number of sequences), consecutive sequences form groups: a group is laid out so that it never overwrites
        itself, and when room is needed the storage frees whole groups only. A write larger than the storage
        keeps its last sequences (last groups) that fit; the slots of the others are not returned. Validated
        whole before anything is written.

        Keyword Args:
            group_sizes (sequence of int, optional): the sizes of the consecutive groups of ``data``.
            free (callable, optional): ``free(storage) -> slots`` is called under the write lock, after the
                batch was validated and before it is written; the slots it returns are freed first (what a
                :class:`~torchrl.data.GroupWriter` frees by policy age or group count).
        """
        what = f"{type(self).__name__}.extend_sequences"
        items = as_items(data, what)
        if not items:
            return torch.zeros((0,), dtype=torch.long)
        batch = self._encode(items, what)
        sizes = None
        if group_sizes is not None:
            sizes = torch.as_tensor(group_sizes, dtype=torch.long).reshape(-1)
            if bool((sizes < 1).any()) or int(sizes.sum()) != len(items):
                raise ValueError(
                    f"{what}: `group_sizes` must be ints >= 1 that sum to the {len(items)} sequences of the "
                    f"write; got {sizes.tolist()}. Nothing was written."
                )
        if sizes is not None:
            spans = torch.zeros(sizes.numel(), dtype=torch.long).index_add_(
                0, segment_ids(sizes), batch.lengths
            )
            big = spans > self.max_tokens
            if bool(big.any()):
                g = int(big.long().argmax())
                raise ValueError(
                    f"{what}: group {g} of the write holds {int(spans[g])} tokens, more than max_tokens="
                    f"{self.max_tokens}: a group is kept whole, so it must fit in the storage. Build the storage "
                    f"with a larger max_tokens. Nothing was written."
                )
            if int(sizes.max()) > self.max_size:
                raise ValueError(
                    f"{what}: a group of the write holds {int(sizes.max())} sequences, more than max_sequences="
                    f"{self.max_size}: a group is kept whole, so it must fit in the storage. Build the storage "
                    f"with a larger max_sequences. Nothing was written."
                )
        with self.write_lock:
            if free is not None:
                slots = torch.as_tensor(free(self), dtype=torch.long).reshape(-1)
                if slots.numel():
                    self._slots[slots, ALIVE] = 0
            return self._append(batch, sizes)

    def _append(self, batch: SequenceBatch, sizes: torch.Tensor | None) -> torch.Tensor:
        """Writes a validated batch (under the write lock): NOTE [packed ring]."""
        self._sync_shared_init()
        if self._arena is None:
            self._allocate(self._layout_of(batch))
        m, s = self.max_tokens, self.max_size
        lengths = batch.lengths
        n = lengths.numel()
        meta, table = self._meta, self._slots
        cursor, count = int(meta[TOKEN_CURSOR]), int(meta[SEQ_COUNT])
        if cursor % m + batch.total <= m and count % s + n <= s:
            return self._append_in_place(batch, sizes, cursor, count)
        starts = _place(cursor, lengths, m)
        if sizes is not None:
            starts = _keep_groups_unbroken(starts, lengths, sizes, m)
        end = int(starts[-1] + lengths[-1])
        position = torch.arange(n)
        kept = (starts >= end - m) & (position >= n - s)  # what later sequences of this write do not overwrite
        if sizes is not None:
            local = segment_ids(sizes)
            whole = torch.zeros(sizes.numel(), dtype=torch.long).index_add_(0, local, kept.long()) == sizes
            kept = whole[local]
            groups = int(meta[GROUP_COUNT]) + local
        else:
            groups = torch.full((n,), -1, dtype=torch.long)
        slots = (count + position) % s
        tail = slots[-s:] if n > s else slots
        self._free_overwritten(count, n, end)
        # NOTE [packed reads]: new rows are published dead, the cursor moves, then the data, then the rows live
        rows = torch.stack([starts, lengths, torch.zeros_like(lengths), count + position, groups], 1)
        table[tail] = rows[-s:] if n > s else rows
        meta[TOKEN_CURSOR] = end
        index = slots[kept]
        if index.numel():
            self._write_tokens(batch, starts, kept)
            everything = bool(kept.all())
            for key, value in batch.fixed.items():
                self._fixed.get(key)[index] = value if everything else value[kept]
            table[index, ALIVE] = 1
        meta[SEQ_COUNT] = count + n
        if sizes is not None:
            meta[GROUP_COUNT] += sizes.numel()
        meta[REVISION] += 1
        return index

    def _append_in_place(self, batch: SequenceBatch, sizes: torch.Tensor | None, cursor: int, count: int) -> torch.Tensor:
        """:meth:`_append` of the usual write: its tokens fit before the arena's end and its slots before the slot
        table's end, so no tail is skipped, no group can overwrite itself and every sequence is kept; the rows
        are slices (same steps, same order: NOTE [packed reads])."""
        lengths, n, end = batch.lengths, batch.lengths.numel(), cursor + batch.total
        meta, table = self._meta, self._slots
        first = count % self.max_size
        if sizes is None:
            groups = torch.full((n,), -1, dtype=torch.long)
        elif n <= 1024:  # a few Python ints cost less than the tensor ops of segment_ids
            groups = torch.tensor([g for g, k in enumerate(sizes.tolist()) for _ in range(k)], dtype=torch.long)
            groups += int(meta[GROUP_COUNT])
        else:
            groups = segment_ids(sizes) + int(meta[GROUP_COUNT])
        self._free_overwritten(count, n, end)
        seqno = torch.arange(count, count + n)
        table[first : first + n] = torch.stack(
            [lengths.cumsum(0) - lengths + cursor, lengths, torch.zeros_like(lengths), seqno, groups], 1
        )
        meta[TOKEN_CURSOR] = end
        at = cursor % self.max_tokens
        for key, values in batch.tokens.items():
            self._arena.get(key)[at : at + batch.total].copy_(values)
        for key, value in batch.fixed.items():
            self._fixed.get(key)[first : first + n] = value
        table[first : first + n, ALIVE] = 1
        meta[SEQ_COUNT] = count + n
        if sizes is not None:
            meta[GROUP_COUNT] += sizes.numel()
        meta[REVISION] += 1
        return seqno % self.max_size

    def _free_overwritten(self, count: int, n: int, end: int) -> None:
        """Frees the sequences that a write of ``n`` sequences ending at the token ``end`` overwrites (their
        tokens or their slots), and the rest of their groups. Starts grow with write numbers and a group's
        sequences have consecutive write numbers, so these are the oldest write numbers ``[lo, k)``: found by a
        binary search and freed by one or two slices of the slot table (no pass over every slot)."""
        m, s, table = self.max_tokens, self.max_size, self._slots
        lo = max(0, count - s)  # the oldest write number still in a slot (slot = write number % s)
        a, b, limit = lo, count, end - m
        if a < b and int(table[a % s, START]) >= limit:  # the oldest is intact (the arena is not full yet)
            b = a
        while a < b:  # the first write number whose tokens the write leaves intact
            mid = (a + b) // 2
            if int(table[mid % s, START]) < limit:
                a = mid + 1
            else:
                b = mid
        k = min(count, max(a, count + n - s))  # and the slots it reuses
        if k <= lo:
            return
        group, j, hit = int(table[(k - 1) % s, GROUP]), k - 1, False
        while group >= 0 and j >= lo and int(table[j % s, GROUP]) == group:  # a live sequence of the last group
            hit = hit or int(table[j % s, ALIVE]) == 1  # is freed: the rest of its group goes too
            j -= 1
        while hit and k < count and int(table[k % s, GROUP]) == group:
            k += 1
        first = lo % s
        if first + (k - lo) <= s:
            table[first : first + k - lo, ALIVE] = 0
        else:
            table[first:, ALIVE] = 0
            table[: first + k - lo - s, ALIVE] = 0

    def _write_tokens(self, batch: SequenceBatch, starts: torch.Tensor, kept: torch.Tensor) -> None:
        m = self.max_tokens
        lengths = batch.lengths
        total = int(lengths.sum())
        first = int(starts[0]) % m
        contiguous = bool(kept.all()) and int(starts[-1] + lengths[-1] - starts[0]) == total and first + total <= m
        if contiguous:  # one slice per key (the usual write)
            for key, values in batch.tokens.items():
                self._arena.get(key)[first : first + total].copy_(values)
            return
        # a write that wraps: one slice copy per sequence kept
        at = (starts % m).tolist()
        sizes = lengths.tolist()
        offsets = (lengths.cumsum(0) - lengths).tolist()
        keep = kept.tolist()
        for key, values in batch.tokens.items():
            arena = self._arena.get(key)
            for a, n, o, k in zip(at, sizes, offsets, keep):
                if k:
                    arena[a : a + n].copy_(values[o : o + n])

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Writes ``data`` (a batch of sequences, or one for an int ``cursor``) at the slots ``cursor``, which
        must be the next slots of the ring (what a :class:`~torchrl.data.RoundRobinWriter` of this storage
        writes): the storage appends. Use :meth:`extend_sequences` or a :class:`~torchrl.data.GroupWriter`."""
        single = is_int(cursor)
        if single:
            data = [data]
        index = torch.tensor([int(cursor)]) if single else as_index_tensor(cursor).reshape(-1)
        first = int(self._meta[SEQ_COUNT]) % self.max_size
        if not torch.equal(index, (first + torch.arange(index.numel())) % self.max_size):
            raise ValueError(
                f"A PackedSequenceStorage appends sequences at its own cursor (slot {first} next); got a write at "
                f"slots {index.tolist()[:8]}. Write through a GroupWriter, extend_sequences(), or a RoundRobinWriter "
                f"that wrote every sequence of this storage. Nothing was written."
            )
        self.extend_sequences(data)

    def free(self, slots) -> None:
        """Frees the sequences at ``slots`` (no longer read or sampled; their room is reused as the ring comes
        back to it). Freed or never-written slots are ignored."""
        index = as_index_tensor(slots).reshape(-1)
        self._check_slots(index, "free")
        with self.write_lock:
            self._slots[index, ALIVE] = 0
            self._meta[REVISION] += 1

    def _empty(self) -> None:
        with self.write_lock:
            self._slots[:, ALIVE] = 0
            self._slots[:, SEQNO] = -1
            self._slots[:, GROUP] = -1
            self._meta[TOKEN_CURSOR] = 0
            self._meta[SEQ_COUNT] = 0
            self._meta[GROUP_COUNT] = 0
            self._meta[REVISION] += 1
            self._resets += 1

    # -- reads -----------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._slots[:, ALIVE].sum())

    def _check_slots(self, index: torch.Tensor, what: str) -> None:
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.max_size):
            raise IndexError(
                f"PackedSequenceStorage.{what}: slots are in [0, {self.max_size}) (max_sequences); got "
                f"{index.tolist()[:8]}."
            )

    def live_slots(self) -> torch.Tensor:
        """The slots of the live sequences, oldest first (int64)."""
        table = self._slots
        alive = (table[:, ALIVE] == 1).nonzero().squeeze(-1)
        return alive[table[alive, SEQNO].argsort()]

    def live_groups(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(slots, group_starts, group_sizes)``: the live sequences oldest first (``slots``), and where each
        live group starts in ``slots`` and how many sequences it has, oldest group first. A sequence written
        without a group is a group of its own."""
        table = self._slots
        slots = self.live_slots()
        groups = table[slots, GROUP]
        ungrouped = groups < 0
        if bool(ungrouped.any()):
            groups = torch.where(ungrouped, -2 - table[slots, SEQNO], groups)
        if not slots.numel():
            empty = torch.zeros((0,), dtype=torch.long)
            return slots, empty, empty
        _, sizes = torch.unique_consecutive(groups, return_counts=True)
        return slots, sizes.cumsum(0) - sizes, sizes

    def lengths(self, index) -> torch.Tensor:
        """The token counts of the sequences at the slots ``index`` (int64, the shape of ``index``)."""
        index = torch.as_tensor(index, dtype=torch.long)
        return self._slots[index, LENGTH]

    def group_ids(self, index) -> torch.Tensor:
        """The group number of the sequences at the slots ``index`` (``-1`` for a sequence written without a
        group); groups are numbered in write order."""
        index = torch.as_tensor(index, dtype=torch.long)
        return self._slots[index, GROUP]

    def fixed_entry(self, key, index=None) -> torch.Tensor:
        """The fixed entry ``key`` of the sequences at the slots ``index`` (a copy), or the live entry of every slot
        when ``index`` is ``None`` (edit it in place and the next dump at a path must be full: NOTE [packed
        incremental dumps] in ``_packed_incremental.py``)."""
        self._sync_shared_init()
        if self._fixed is None:
            raise KeyError(f"The storage holds no data yet: no fixed entry {key!r}.")
        value = self._fixed.get(key)
        return value if index is None else value[torch.as_tensor(index, dtype=torch.long)]

    @property
    def write_revision(self) -> int:
        """A number that changes with every write, free, load and ``empty()``."""
        return int(self._meta[REVISION])

    def get(self, index):
        """The sequence at an int slot (a TensorDict of batch size ``[]``), or the sequences at a tensor, list or
        slice of slots as a :class:`~tensordict.LazyStackedTensorDict` ``[n]``. Token entries are copies. A slot
        that holds no live sequence raises ``IndexError``."""
        self._sync_shared_init()
        single = is_int(index)
        if single:
            slots = torch.tensor([int(index)])
        elif isinstance(index, slice):
            slots = torch.arange(self.max_size)[index]
        else:
            slots = as_index_tensor(index).reshape(-1)
        if (slots < 0).any():
            slots = torch.where(slots < 0, slots + self.max_size, slots)
        self._check_slots(slots, "get")
        items = self._read(slots, live_only=True)
        if single:
            return items[0]
        return LazyStackedTensorDict(*items, stack_dim=0)

    def read_rows(self, index):
        """The sequences at the slots a :class:`~torchrl.data.GroupSampler` drew (see NOTE [packed reads]): a
        sequence freed since the draw but not yet overwritten is still read."""
        self._sync_shared_init()
        slots = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        return LazyStackedTensorDict(*self._read(slots, live_only=False), stack_dim=0)

    # NOTE [packed reads]: readers take no lock. A read gathers the slot rows, then the tokens, then reads the
    # slot rows and the token cursor again: a sequence whose slot was rewritten (its write number changed) or
    # whose tokens the cursor has passed since (start < cursor - max_tokens) may be torn. Writers free a sequence
    # (slot table) before they overwrite its tokens, and the cursor moves before the tokens are written, so a read
    # that passes the check returned whole sequences (x86-64 store order). A torn read is retried:
    # - ``get`` (slots named by the caller) reads the slot table again and returns what the slots hold then (a
    #   slot freed meanwhile raises IndexError), at most _READ_ATTEMPTS times, then raises TornReadError;
    # - ``read_rows`` (slots a sampler drew) raises DrawOverwrittenError (a TornReadError) at once: the drawn
    #   group is gone, so the buffer's sample draws again (at most 8 draws, ReplayBuffer._draw_again).
    def _read(self, slots: torch.Tensor, live_only: bool) -> list:
        for _ in range(_READ_ATTEMPTS):
            items, torn = self._read_once(slots, live_only)
            if not bool(torn.any()):
                return items
            if not live_only:
                raise DrawOverwrittenError(self._torn_message(slots, torn, "sample again"))
        raise TornReadError(self._torn_message(slots, torn, f"read again ({_READ_ATTEMPTS} reads were torn)"))

    def _torn_message(self, slots: torch.Tensor, torn: torch.Tensor, what: str) -> str:
        return (
            f"PackedSequenceStorage: the sequences at slot(s) {slots[torn].tolist()[:8]} were overwritten by "
            f"another process's write while being read (NOTE [packed reads]); {what}, or give the storage more "
            f"room (max_tokens, max_sequences) than one write interval consumes."
        )

    def _read_once(self, slots: torch.Tensor, live_only: bool) -> tuple[list, torch.Tensor]:
        """One read of ``slots``: ``(items, torn)`` with ``torn`` the mask of the sequences overwritten meanwhile."""
        rows = self._slots[slots]
        dead = rows[:, ALIVE] != 1 if live_only else rows[:, SEQNO] < 0
        if bool(dead.any()):
            raise IndexError(
                f"PackedSequenceStorage.get: slot(s) {slots[dead].tolist()[:8]} hold no live sequence (never "
                f"written, or freed). Read live_slots(), or sample with a GroupSampler, which draws live sequences "
                f"only (sequences written without a group are groups of one); a RandomSampler draws slots 0..len-1."
            )
        if not slots.numel():
            return [], torch.zeros((0,), dtype=torch.bool)
        lengths = rows[:, LENGTH].tolist()
        starts = (rows[:, START] % self.max_tokens).tolist()
        error = None
        try:
            items = list(self._fixed[slots].unbind(0))
            for key in self.token_keys:  # each sequence is one run of the arena: slices, one copy
                arena = self._arena.get(key)
                parts = torch.cat([arena[a : a + n] for a, n in zip(starts, lengths)]).split(lengths)
                for item, part in zip(items, parts):
                    item.set(key, part)
        except RuntimeError as err:  # rows caught mid-write (lengths that do not fit): torn if they changed since
            items, error = None, err
        torn = (self._slots[slots, SEQNO] != rows[:, SEQNO]) | (
            rows[:, START] < int(self._meta[TOKEN_CURSOR]) - self.max_tokens
        )
        if error is not None and not bool(torn.any()):
            raise error
        return items, torn

    def as_dataset(self, *args, **kwargs):
        """Not supported: the items of a packed storage are slots with holes. Use ``rb.as_dataset()`` of a buffer
        over this storage (its sampler draws live groups)."""
        raise TypeError(
            "PackedSequenceStorage.as_dataset() is not supported: its slots have holes (freed sequences), so a "
            "map-style index 0..len-1 does not name its items. Use rb.as_dataset() of a ReplayBuffer over the "
            "storage with a GroupSampler (each DataLoader worker samples live groups)."
        )

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The slot table, the counters and (once written) the arenas and fixed entries, as tensors. The write
        revision (a change counter of this process, for readers' caches) is not state: it is saved as 0."""
        meta = self._meta.clone()
        meta[REVISION] = 0
        state = {"slots": self._slots.clone(), "meta": meta}
        if self._arena is not None:
            state["arena"] = self._arena.to_dict()
            state["fixed"] = self._fixed.to_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned, from a storage of the same ``max_tokens`` and
        ``max_sequences`` (and the same entries, when this one was written already). Everything is checked
        before anything changes."""
        missing = [k for k in ("slots", "meta") if k not in state_dict]
        if missing:
            raise KeyError(f"PackedSequenceStorage.load_state_dict: the state has no {missing[0]!r} entry; pass what "
                           f"PackedSequenceStorage.state_dict() returned.")  # fmt: skip
        slots, meta = state_dict["slots"], state_dict["meta"]
        if tuple(slots.shape) != tuple(self._slots.shape) or tuple(meta.shape) != tuple(self._meta.shape):
            raise ValueError(
                f"PackedSequenceStorage.load_state_dict: the state is of a storage with {slots.shape[0]} sequence "
                f"slots; this one has max_sequences={self.max_size}. Build the storage with the same max_sequences."
            )
        parts = {}
        for name, rows in (("arena", self.max_tokens), ("fixed", self.max_size)):
            if state_dict.get(name) is not None:
                parts[name] = TensorDict(state_dict[name], batch_size=[])
                for key, value in parts[name].items(True, True):
                    if value.shape[0] != rows:
                        raise ValueError(
                            f"PackedSequenceStorage.load_state_dict: the {name} entry {shown_key(key_tuple(key))!r} has "
                            f"{value.shape[0]} rows; this storage has {rows} (max_tokens={self.max_tokens}, "
                            f"max_sequences={self.max_size}). Build the storage with the saved sizes."
                        )
        with self.write_lock:
            self._sync_shared_init()
            if parts and self._arena is None:
                self._allocate({
                    "tokens": [(key_tuple(k), v.dtype, tuple(v.shape[1:])) for k, v in parts["arena"].items(True, True)],
                    "fixed": [(key_tuple(k), v.dtype, tuple(v.shape[1:])) for k, v in parts["fixed"].items(True, True)],
                })  # fmt: skip
            if parts:
                targets = {"arena": self._arena, "fixed": self._fixed}
                pairs = [(targets[name].get(key), value) for name, td in parts.items()
                         for key, value in td.items(True, True)]  # fmt: skip
                for target, value in pairs:  # all shapes checked before any copy
                    if target.shape != value.shape or target.dtype != value.dtype:
                        raise ValueError(
                            "PackedSequenceStorage.load_state_dict: the state's entries differ from this storage's "
                            f"({list(value.shape)} {value.dtype} for {list(target.shape)} {target.dtype}); load it "
                            "into a new storage."
                        )
                for target, value in pairs:
                    target.copy_(value)
            self._slots.copy_(slots)
            revision = int(self._meta[REVISION])
            self._meta.copy_(meta)
            self._meta[REVISION] = revision + 1
            self._resets += 1
            self._dump_records.clear()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_tokens={self.max_tokens}, max_sequences={self.max_size}, len={len(self)}, "
            f"token_keys={[shown_key(k) for k in self.token_keys]}, device={self.device})"
        )

    # -- checkpoint part (the protocol of torchrl.data.replay_buffers._checkpoint.parts) --------------------------
    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        ctx.hold(self.write_lock)  # no write until the tensors are copied (NOTE [consistent dumps] in format.py)
        self._sync_shared_init()
        tensors = {ctx.name("slots"): self._slots, ctx.name("meta"): self._meta}
        layout = self._stored_layout()
        doc = {
            "class": qualname(self), "max_tokens": self.max_tokens, "max_sequences": self.max_size,
            "token_keys": [list(k) for k in self.token_keys], "layout": None,
        }
        if layout is None:
            return tensors, doc
        doc["layout"] = {
            "tokens": [[list(k), _io.dtype_name(d), list(f)] for k, d, f in layout["tokens"]],
            "fixed": [[list(k), _io.dtype_name(d), list(s)] for k, d, s in layout["fixed"]],
        }
        token_rows, slot_rows = self._saved_rows(self._meta)
        entries = {"tokens": [self._arena.get(k) for k, _, _ in layout["tokens"]],
                   "fixed": [self._fixed.get(k) for k, _, _ in layout["fixed"]]}  # fmt: skip
        base_names = self._base_names(ctx, layout)
        state = {
            "cursor": int(self._meta[TOKEN_CURSOR]), "count": int(self._meta[SEQ_COUNT]),
            "resets": int(self._resets[0]), "layout": doc["layout"], "token_rows": token_rows,
            "slot_rows": slot_rows, "max_tokens": self.max_tokens, "max_sequences": self.max_size,
        }  # fmt: skip
        plan = _inc.plan(self._dump_records.get((ctx.path, ctx.prefix)), ctx, state, base_names)
        reused = {}
        if plan is None:  # a full dump: the rows written at least once
            for part, rows in (("tokens", token_rows), ("fixed", slot_rows)):
                for i, value in enumerate(entries[part]):
                    tensors[ctx.name(f"{part}/{i}")] = value[:rows]
        else:  # NOTE [packed incremental dumps]: the previous files, and the rows appended since
            reused = plan["reused"]
            tensors.update(reused)
            patches = plan["patches"]
            for part in ("tokens", "fixed"):
                for start, stop in plan["ranges"][part]:
                    k = len(patches)
                    names = [ctx.name(f"patches/{k}/{part}/{i}") for i in range(len(entries[part]))]
                    for name, value in zip(names, entries[part]):
                        tensors[name] = value[start:stop]
                    patches.append({"part": part, "rows": [start, stop], "tensors": names})
            doc["base"], doc["patches"] = plan["base"], patches
        record = {**state, "ident": _inc.new_ident(), "doc": doc}
        _inc.remember_after_write(self._dump_records, ctx, record, _inc.part_tensor_names(doc, base_names), reused)
        return tensors, doc

    def _base_names(self, ctx: PartContext, layout: dict) -> list[str]:
        return [ctx.name(f"{part}/{i}") for part in ("tokens", "fixed") for i in range(len(layout[part]))]

    def check_checkpoint_part(self, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
        check_class(self, doc, "storage")
        where = f"The PackedSequenceStorage description in the checkpoint {ctx.path!r}"
        for field, here in (("max_tokens", self.max_tokens), ("max_sequences", self.max_size)):
            if doc.get(field) != here:
                fix = f"Build the storage with the saved {field}."
                raise mismatch(f"the storage {field}", doc.get(field), here, fix)
        if doc.get("token_keys") != [list(k) for k in self.token_keys]:
            raise mismatch("the storage token_keys", doc.get("token_keys"), [list(k) for k in self.token_keys],
                           "Build the storage with the saved token_keys.")
        slots, meta = tensors.get(ctx.name("slots")), tensors.get(ctx.name("meta"))
        if not isinstance(slots, torch.Tensor) or slots.dtype != torch.long or list(slots.shape) != [self.max_size, 5]:
            raise CheckpointError(
                f"{where}: the slot table is missing or not int64 [{self.max_size}, 5]. Nothing was loaded."
            )
        if not isinstance(meta, torch.Tensor) or meta.dtype != torch.long or list(meta.shape) != [4]:
            raise CheckpointError(f"{where}: the counters are missing or not int64 [4]. Nothing was loaded.")
        alive, lengths, starts = slots[:, ALIVE], slots[:, LENGTH], slots[:, START]
        live = alive == 1
        bad_rows = ((alive != 0) & ~live) | (live & ((lengths < 1) | (lengths > self.max_tokens)))
        if bool(bad_rows.any()):
            raise CheckpointError(
                f"{where}: the slot table holds invalid rows (alive flags or lengths). Nothing was loaded."
            )
        cursor = meta[TOKEN_CURSOR]
        outside = live & ((starts < cursor - self.max_tokens) | (starts + lengths > cursor))
        outside |= live & (torch.arange(self.max_size) >= min(int(meta[SEQ_COUNT]), self.max_size))
        if bool((meta[:3] < 0).any()) or bool(outside.any()):
            raise CheckpointError(f"{where}: the counters do not fit the slot table. Nothing was loaded.")
        layout = doc.get("layout")
        if layout is None:
            if bool(live.any()):
                raise CheckpointError(f"{where}: live sequences but no data layout. Nothing was loaded.")
            return
        try:
            saved = self._layout_from_doc(layout)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{where}: the data layout is malformed ({err}). Nothing was loaded.") from None
        stored = self._stored_layout()
        if stored is not None and stored != saved:
            raise mismatch("the data layout", layout, "a different one", "Load into a fresh storage.")
        token_rows, slot_rows = self._saved_rows(meta)
        base, patches = self._checked_patches(doc, saved, where)
        for part, rows, entries in (("tokens", token_rows, saved["tokens"]), ("fixed", slot_rows, saved["fixed"])):
            base_rows = rows if base is None else base[part]
            if not 0 <= base_rows <= rows or not _inc.covered(
                base_rows, [p["rows"] for p in patches if p["part"] == part], rows
            ):
                raise CheckpointError(f"{where}: its {part} patches do not cover the saved rows. Nothing was loaded.")
            named = [(ctx.name(f"{part}/{i}"), base_rows) for i in range(len(entries))]
            named += [(name, p["rows"][1] - p["rows"][0]) for p in patches if p["part"] == part
                      for name in p["tensors"]]  # fmt: skip
            for j, (name, n) in enumerate(named):
                key, dtype, shape = entries[j % len(entries)]
                value = tensors.get(name)
                if not isinstance(value, torch.Tensor) or value.dtype != dtype or tuple(value.shape) != (n, *shape):
                    raise CheckpointError(
                        f"{where}: the {part} entry {shown_key(key)!r} ({name}) is missing or not {dtype} "
                        f"{[n, *shape]}. Nothing was loaded."
                    )
        ctx.facts["storage_rows"] = self.max_size

    def _checked_patches(self, doc: dict, saved: dict, where: str) -> tuple[dict | None, list]:
        """``(base rows, patches)`` of an incremental part (NOTE [packed incremental dumps]); ``(None, [])`` for a
        full one. Raises CheckpointError for a malformed description."""
        if "patches" not in doc:
            return None, []
        base, patches = doc.get("base"), doc.get("patches")
        sizes = {"tokens": self.max_tokens, "fixed": self.max_size}
        ok = isinstance(base, dict) and all(is_int(base.get(part)) for part in sizes) and isinstance(patches, list)
        for p in patches if ok else ():
            ok = isinstance(p, dict) and p.get("part") in sizes and isinstance(p.get("rows"), list)
            ok = ok and len(p["rows"]) == 2 and all(is_int(r) for r in p["rows"])
            ok = ok and 0 <= p["rows"][0] < p["rows"][1] <= sizes[p["part"]] and isinstance(p.get("tensors"), list)
            ok = ok and len(p["tensors"]) == len(saved[p["part"]]) and all(isinstance(t, str) for t in p["tensors"])
            if not ok:
                break
        if not ok:
            raise CheckpointError(f"{where}: the description of its patches is malformed. Nothing was loaded.")
        return base, patches

    def _saved_rows(self, meta: torch.Tensor) -> tuple[int, int]:
        """The arena rows and slots a checkpoint holds: those written at least once (all, after a wrap)."""
        return min(int(meta[TOKEN_CURSOR]), self.max_tokens), min(int(meta[SEQ_COUNT]), self.max_size)

    def _layout_from_doc(self, layout: dict) -> dict:
        tokens = [(tuple(k), _io.DTYPES[d], tuple(int(x) for x in f)) for k, d, f in layout["tokens"]]
        fixed = [(tuple(k), _io.DTYPES[d], tuple(int(x) for x in s)) for k, d, s in layout["fixed"]]
        if [k for k, _, _ in tokens] != list(self.token_keys):
            raise ValueError("the token entries differ from token_keys")
        return {"tokens": tokens, "fixed": fixed}

    def load_checkpoint_part(self, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
        with self.write_lock:
            self._sync_shared_init()
            layout = doc.get("layout")
            if layout is not None:
                saved = self._layout_from_doc(layout)
                if self._arena is None:
                    self._allocate(saved)
                targets = {"tokens": [self._arena.get(k) for k, _, _ in saved["tokens"]],
                           "fixed": [self._fixed.get(k) for k, _, _ in saved["fixed"]]}  # fmt: skip
                for part, entries in targets.items():
                    for i, target in enumerate(entries):
                        value = tensors[ctx.name(f"{part}/{i}")]
                        target[: value.shape[0]].copy_(value)
                for patch in doc.get("patches") or ():  # in order: NOTE [packed incremental dumps]
                    start, stop = patch["rows"]
                    for target, name in zip(targets[patch["part"]], patch["tensors"]):
                        target[start:stop].copy_(tensors[name])
            self._slots.copy_(tensors[ctx.name("slots")])
            revision = int(self._meta[REVISION])
            self._meta.copy_(tensors[ctx.name("meta")])
            self._meta[REVISION] = revision + 1
            self._resets += 1
            self._dump_records.clear()
