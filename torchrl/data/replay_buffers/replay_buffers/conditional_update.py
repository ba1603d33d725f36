"""Conditional updates of stored records: :func:`conditional_update`, which
:meth:`ReplayBuffer.update_if_present <torchrl.data.ReplayBuffer.update_if_present>` delegates to, and what it did
with each record, :class:`ConditionalUpdateResult`.

Data model: a *record* is what one entry of ``index`` addresses: a storage row (an int or a tensor of rows, any
shape, flattened) or, on an ``ndim > 1`` storage, one cell (an ``[N, ndim]`` coordinate tensor, as ``extend`` and
``sample`` return them, or a tuple of per-dim tensors). A record is *live* iff the generation of its row (see
NOTE [slot generations] in :mod:`torchrl.data.replay_buffers.storages.base`) is ``>= 0``, equals the generation
the caller captured, and the row still holds data; a stale record is left alone. With ``version_key``, a live
record is written only if the incoming version is ``>=`` the stored one (``>`` with ``require_newer=True``);
when several entries address the same record, only the one with the highest incoming version (the last of them
on ties; the last one without ``version_key``) can apply, the others count as version-rejected.

Everything is validated before anything is written, under the buffer's lock and the storage's write lock, so a
refused call leaves the storage unchanged and a concurrent ``extend`` never interleaves with the write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from tensordict import is_tensor_collection

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, is_int
from torchrl.data.replay_buffers.storages.tensor import TensorStorage

CONDITIONAL_VERSION_IN_PATCH = TorchRLPhrase(
    ValueError,
    "may not appear in patch",
    "version_key={key!r} may not appear in patch: update_if_present writes the version itself. Remove it "
    "from patch and pass the new version with version=...",
)
CONDITIONAL_UNSUPPORTED = TorchRLPhrase(
    RuntimeError,
    "(?i)conditional",
    "update_if_present (a conditional update) needs {needs}; {got}. {fix}",
)
CONDITIONAL_DOTTED_KEY = TorchRLPhrase(
    ValueError,
    "Dotted-string",
    "Dotted-string keys are not nested keys: version_key={key!r}. Pass the nested key as a tuple, e.g. "
    "{suggested!r}.",
)

__all__ = ["ConditionalUpdateResult", "conditional_update"]


@dataclass
class ConditionalUpdateResult:
    """What :meth:`~torchrl.data.ReplayBuffer.update_if_present` did with each requested record.

    Attributes:
        updated (torch.Tensor): bool ``[N]``, in the order of ``index``: ``True`` where the patch was written.
        version_rejected (torch.Tensor or None): bool ``[N]``, ``True`` where the record was live but the
            incoming version lost (to the stored version, or to another entry of the same call addressing the
            same record); ``None`` without ``version_key``.

    The counts are properties derived from them (as in TorchRL): :attr:`updated_count`,
    :attr:`version_rejected_count` and :attr:`stale_count`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2),
        ...                             writer=TensorDictRoundRobinWriter(track_generations=True))
        >>> _ = rb.extend(TensorDict(obs=torch.arange(2), batch_size=[2]))
        >>> _ = rb.add(TensorDict(obs=torch.tensor(7)))  # overwrites row 0: its generation changes
        >>> result = rb.update_if_present(index=torch.arange(2), generation=torch.zeros(2, dtype=torch.long),
        ...                               patch={"obs": torch.full((2,), -1)})
        >>> result.updated.tolist(), result.stale_count, result.version_rejected, rb[:]["obs"].tolist()
        ([False, True], 1, None, [7, -1])
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor | None = None

    @property
    def updated_count(self) -> int:
        """The number of ``True`` in :attr:`updated`."""
        return int(self.updated.sum())

    @property
    def version_rejected_count(self) -> int:
        """The number of ``True`` in :attr:`version_rejected` (``0`` without ``version_key``)."""
        rejected = self.version_rejected
        return 0 if rejected is None else int(rejected.sum())

    @property
    def stale_count(self) -> int:
        """The records left alone because they were overwritten, emptied or never written since their
        generation was captured: neither updated nor version-rejected."""
        return self.updated.numel() - self.updated_count - self.version_rejected_count


def conditional_update(
    storage, writer, lock, *, index, generation, patch, version_key=None, version=None, require_newer=False
) -> ConditionalUpdateResult:
    """Writes ``patch`` into the live records of ``index`` (see the module docstring); the body of
    :meth:`ReplayBuffer.update_if_present <torchrl.data.ReplayBuffer.update_if_present>`.

    Args:
        storage: the buffer's storage (a :class:`~torchrl.data.TensorStorage`).
        writer: the buffer's writer (built with ``track_generations=True``).
        lock: the buffer's lock, held with ``storage.write_lock`` from validation to the write.

    Keyword Args:
        index, generation, patch, version_key, version, require_newer: see ``update_if_present``.

    Raises:
        RuntimeError: the storage or the writer cannot tell live records from stale ones.
        ValueError: a patch value or ``version`` of the wrong dtype or shape, ``version_key`` without
            ``version`` (or the reverse), a non-scalar, dotted or patched ``version_key``.
        KeyError: a patch key or ``version_key`` the stored records do not hold.
    """
    check_conditional_support(storage, writer)
    require_newer = check_bool("require_newer", require_newer)
    if (version_key is None) != (version is None):
        given, missing = ("version_key", "version") if version is None else ("version", "version_key")
        raise ValueError(
            f"update_if_present() got `{given}` without `{missing}`: pass both (version_key=<the stored entry "
            f"holding each record's version>, version=<the patch's version>) or neither."
        )
    version_key = None if version_key is None else _version_key(version_key)
    items = _patch_items(patch)
    if version_key is not None and any(key == version_key for key, _ in items):
        raise CONDITIONAL_VERSION_IN_PATCH.error(key=_shown(version_key))
    with lock, storage.write_lock:
        records = _Records(storage, index)
        n = records.n
        generation = _generation(generation, n)
        live = records.live(writer, generation)
        template = records.template()
        if template is None:  # nothing stored: every record is stale
            updated = torch.zeros(n, dtype=torch.bool)
            return _result(updated, None if version_key is None else torch.zeros(n, dtype=torch.bool))
        values = [(key, _patch_value(template, key, value, records)) for key, value in items]
        incoming = None if version_key is None else _version(template, version_key, version, records)
        written = _choose(records, live, incoming, version_key, require_newer)
        if bool(written.any()):
            target = records.select(written)
            current = storage.get(target)
            for key, value in values:
                current.set(key, value[written])
            if version_key is not None:
                stored = current.get(version_key)
                current.set(version_key, incoming[written].to(stored.dtype).reshape(stored.shape))
            storage.set(target, current, set_cursor=False)
    if version_key is None:  # every live entry is updated; of several on one record, the last one is written
        return _result(live, None)
    updated = written
    rejected = live & ~updated
    return _result(updated, rejected)


def _result(updated: torch.Tensor, rejected: torch.Tensor | None) -> ConditionalUpdateResult:
    return ConditionalUpdateResult(updated=updated, version_rejected=rejected)


# -- arguments ---------------------------------------------------------------------------------------------------
def check_conditional_support(storage, writer, *, owner: str = "this buffer's", build: str = "the buffer",
                              where: str = "") -> None:
    """Raises ``CONDITIONAL_UNSUPPORTED`` unless ``storage`` is a tensor storage and ``writer`` tracks slot
    generations (what :func:`conditional_update` needs); ``owner``/``build``/``where`` word the message for a
    buffer (the defaults) or for a member of an ensemble."""
    if not isinstance(storage, TensorStorage):
        raise CONDITIONAL_UNSUPPORTED.error(
            needs=f"a tensor storage (LazyTensorStorage, LazyMemmapStorage or TensorStorage) of TensorDicts{where}",
            got=f"{owner} storage is a {type(storage).__name__}",
            fix=f"Build {build} with storage=LazyTensorStorage(...) or LazyMemmapStorage(...).",
        )
    if not getattr(writer, "tracks_generations", False):
        raise CONDITIONAL_UNSUPPORTED.error(
            needs=f"a writer that tracks slot generations{where}",
            got=f"{owner} writer is {type(writer).__name__}, built without track_generations=True",
            fix=f"Build {build} with writer=TensorDictRoundRobinWriter(track_generations=True) (or "
            "RoundRobinWriter(track_generations=True)).",
        )


def _nested_key(key, what: str) -> tuple:
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    raise TypeError(f"{what} must be a str or a tuple of str (a nested key), got {key!r}.")


def _shown(key: tuple):
    return key[0] if len(key) == 1 else key


def _version_key(version_key) -> tuple:
    if isinstance(version_key, str) and "." in version_key:
        raise CONDITIONAL_DOTTED_KEY.error(key=version_key, suggested=tuple(version_key.split(".")))
    return _nested_key(version_key, "`version_key`")


def _patch_items(patch) -> list[tuple[tuple, object]]:
    """``patch`` as ``[(nested key as a tuple, value)]``, leaves only."""
    if is_tensor_collection(patch):
        return [
            (_nested_key(k, "A patch key"), v) for k, v in patch.items(include_nested=True, leaves_only=True)
        ]
    if not isinstance(patch, Mapping):
        raise TypeError(
            f"`patch` must be a dict {{key: tensor}} (str or tuple keys) or a TensorDict, got "
            f"{type(patch).__name__}."
        )
    items = []
    for key, value in patch.items():
        key = _nested_key(key, "A patch key")
        if isinstance(value, Mapping) or is_tensor_collection(value):
            items.extend((key + sub, v) for sub, v in _patch_items(value))
        else:
            items.append((key, value))
    return items


def _generation(generation, n: int) -> torch.Tensor:
    generation = torch.as_tensor(generation)
    if generation.dtype.is_floating_point or generation.dtype.is_complex or generation.dtype == torch.bool:
        raise ValueError(
            f"`generation` must hold ints (what info['index_generation'] or writer.generations_of() returned), "
            f"got dtype {generation.dtype}."
        )
    generation = generation.to(device="cpu", dtype=torch.long).reshape(-1)
    if generation.numel() == 1:
        return generation.expand(n)
    if generation.numel() != n:
        raise ValueError(
            f"`generation` holds {generation.numel()} values for {n} records in `index`: pass one generation per "
            f"record (what info['index_generation'] held for these records), or one for all."
        )
    return generation


# -- the records an index addresses ------------------------------------------------------------------------------
class _Records:
    """What ``index`` addresses in ``storage``: ``n`` records, the row of each, and (``cells``) whether a record
    is one cell of an ``ndim > 1`` storage rather than a whole row."""

    def __init__(self, storage, index):
        self.storage = storage
        ndim = storage.ndim
        if isinstance(index, tuple) and ndim > 1 and len(index) == ndim:
            index = torch.stack([torch.as_tensor(i, dtype=torch.long).reshape(-1) for i in index], -1)
        elif isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        elif not (is_int(index) or isinstance(index, (torch.Tensor, list, range))):
            raise TypeError(
                f"`index` must be an int, a tensor of rows, [N, {ndim}] cell coordinates or a tuple of per-dim "
                f"tensors (what extend() or sample() returned), got {type(index).__name__}."
            )
        index = torch.as_tensor(index)
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise ValueError(f"`index` must hold ints, got dtype {index.dtype}.")
        index = index.to(device="cpu", dtype=torch.long)
        self.cells = ndim > 1 and index.ndim == 2 and index.shape[-1] == ndim
        self.index = index if self.cells else index.reshape(-1)
        self.n = self.index.shape[0]
        self.rows = self.index[:, 0] if self.cells else self.index

    def live(self, writer, generation: torch.Tensor) -> torch.Tensor:
        storage = self.storage
        current = writer.generations_of(self.rows).reshape(-1)
        live = (current >= 0) & (current == generation) & (self.rows < storage.rows_written())
        if self.cells and self.n:
            extra = torch.tensor(storage.shape[1:], dtype=torch.long)
            live &= ((self.index[:, 1:] >= 0) & (self.index[:, 1:] < extra)).all(-1)
        return live

    def template(self):
        """One stored row (batch ``[1, *extra dims]``), for the stored keys, dtypes and shapes; ``None`` when
        the storage holds nothing."""
        storage = self.storage
        if storage.rows_written() == 0:
            return None
        template = storage.get(torch.zeros(1, dtype=torch.long))
        if not is_tensor_collection(template):
            raise CONDITIONAL_UNSUPPORTED.error(
                needs="a storage of TensorDicts or tensorclasses (it patches entries by key)",
                got=f"this storage holds {type(template).__name__} items",
                fix="Store TensorDicts (TensorDictReplayBuffer), or write the new values with rb[index] = value.",
            )
        return template

    def feature_shape(self, leaf: torch.Tensor) -> torch.Size:
        """The shape of one record of a stored entry (``leaf`` from :meth:`template`)."""
        return leaf.shape[self.storage.ndim :] if self.cells else leaf.shape[1:]

    def keys(self) -> torch.Tensor:
        """One id per distinct record (its row, or its cell's flat position)."""
        if not self.cells:
            return self.rows
        strides = [math.prod(self.storage.shape[d + 1 :]) for d in range(self.storage.ndim)]
        return (self.index * torch.tensor(strides, dtype=torch.long)).sum(-1)

    def select(self, mask: torch.Tensor):
        """The storage index of the records of ``mask``."""
        chosen = self.index[mask]
        return tuple(chosen.unbind(-1)) if self.cells else chosen


def _stored_leaf(template, key: tuple, what: str):
    leaf = template.get(key, None)
    if leaf is None:
        stored = sorted(map(str, template.keys(include_nested=True, leaves_only=True)))
        raise KeyError(
            f"{what} {_shown(key)!r} is not an entry of the stored records (their entries: {stored})."
        )
    if not isinstance(leaf, torch.Tensor) or is_tensor_collection(leaf):
        raise ValueError(
            f"{what} {_shown(key)!r} is a {type(leaf).__name__} entry; update_if_present writes tensor entries only."
        )
    return leaf


def _patch_value(template, key: tuple, value, records: _Records) -> torch.Tensor:
    """``value`` checked against the stored entry ``key`` and reshaped to ``(n_records, *feature_shape)``."""
    leaf = _stored_leaf(template, key, "Patch key")
    feature = records.feature_shape(leaf)
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"Patch value of {_shown(key)!r} is not a tensor: {err}") from None
        if not torch.can_cast(value.dtype, leaf.dtype):
            raise ValueError(
                f"Patch value of {_shown(key)!r} holds {value.dtype} values; the stored entry is {leaf.dtype}."
            )
        value = value.to(leaf.dtype)
    if value.dtype != leaf.dtype:
        raise ValueError(
            f"Patch value of {_shown(key)!r} has dtype {value.dtype}; the stored entry has dtype {leaf.dtype}. "
            f"Cast it first, e.g. value.to({leaf.dtype})."
        )
    shape = (records.n, *feature)
    if value.numel() != math.prod(shape):
        raise ValueError(
            f"Patch value of {_shown(key)!r} has shape {list(value.shape)} ({value.numel()} values); {records.n} "
            f"records of the stored entry, of shape {list(feature)} each, need {list(shape)} (or any shape with "
            f"{math.prod(shape)} values, e.g. the shape of the data written)."
        )
    return value.reshape(shape).to(leaf.device)


def _version(template, version_key: tuple, version, records: _Records) -> torch.Tensor:
    """The incoming version of each record (``[N]``), in a dtype that compares with the stored one."""
    leaf = _stored_leaf(template, version_key, "version_key")
    feature = records.feature_shape(leaf)
    if math.prod(feature) != 1:
        raise ValueError(
            f"version_key={_shown(version_key)!r} names an entry of shape {list(feature)} per record; a version is "
            f"one number per record. Name a scalar entry (shape [] or [1] per record)."
        )
    version = torch.as_tensor(version).cpu()
    n = records.n
    if version.ndim == 0:
        version = version.expand(n)
    elif tuple(version.shape) in ((n,), (n, 1)):
        version = version.reshape(n)
    else:
        raise ValueError(
            f"`version` has shape {list(version.shape)}; pass a scalar, or one version per record: [{n}] or "
            f"[{n}, 1]."
        )
    if not torch.can_cast(version.dtype, leaf.dtype):
        raise ValueError(
            f"`version` holds {version.dtype} values; the stored entry {_shown(version_key)!r} is {leaf.dtype}, "
            f"which cannot hold them."
        )
    return version.to(leaf.dtype)


def _choose(records: _Records, live, incoming, version_key, require_newer: bool) -> torch.Tensor:
    """Which records are written: per distinct record, the live entry of highest incoming version (the last on
    ties, the last one without versions), if it passes the stored version."""
    candidates = live.nonzero().squeeze(-1)
    updated = torch.zeros_like(live)
    if candidates.numel() == 0:
        return updated
    keys = records.keys()[candidates]
    order = torch.arange(candidates.numel())
    if incoming is not None:  # sort by version (stable: position order kept among ties), then by record
        order = order[torch.sort(incoming[candidates], stable=True).indices]
    order = order[torch.sort(keys[order], stable=True).indices]
    ordered = keys[order]
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    winners = candidates[order[last]].sort().values  # in index order, as select() reads them
    if incoming is not None:
        stored = records.storage.get(records.select(_mask(winners, records.n))).get(version_key).reshape(-1)
        new = incoming[winners]
        accepted = new > stored if require_newer else new >= stored
        winners = winners[accepted]
    updated[winners] = True
    return updated


def _mask(positions: torch.Tensor, n: int) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[positions] = True
    return mask
