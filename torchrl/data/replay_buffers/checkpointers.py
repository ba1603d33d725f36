"""The on-disk checkpoint format of replay buffers and their components (schema version 1), and TorchRL's
storage checkpointers.

``rb.dumps(path)`` and the ``dumps`` of storages, samplers and writers write a *checkpoint*: a directory
that holds raw tensor files and a JSON description. Nothing is pickled and nothing is read with
``torch.load``, so loading a checkpoint from an untrusted source runs no code: the worst a crafted
checkpoint can do is fail validation (:class:`CheckpointError`) or hold wrong numbers.

Layout of ``path/``::

    metadata.json           the description (below)
    <name>.memmap           one file per tensor: its bytes in C order, no header (tensordict's memmap
                            layout); a "/" in <name> is a sub-directory, e.g. storage/obs.memmap
    COMPLETE                the completion marker, written last

``metadata.json`` is a JSON object::

    {"format": "torchrl-checkpoint", "schema_version": 1,
     "checksum": {"algorithm": "crc32", "window_bytes": 1048576},
     "tensors": {"<name>": {"file": "<name>.memmap", "dtype": "float32", "shape": [4, 3],
                            "nbytes": 48, "crc32": [<head>, <tail>]}, ...},
     "metadata": {...}}

where ``"metadata"`` is the caller's JSON document (for components: their type, configuration and
counters), dtypes are names from an allowlist (``bool``, ``uint8`` ... ``float64``, ``bfloat16``,
``complex64``/``complex128``, ``float8_*``), and ``crc32`` holds the CRC-32 of the first and of the last
``window_bytes`` bytes of the file (the whole file when it is smaller than a window), or ``null`` for a
file hard-linked from a live memory-mapped storage (below), whose content changes after the dump. The checksum is a
cheap check against truncation and torn or misplaced files, not a full-content hash: a byte changed in the
middle of a file larger than 2 MiB goes unnoticed. ``COMPLETE`` is a JSON object
``{"schema_version": 1, "metadata_nbytes": <int>, "metadata_crc32": <int>}`` that also pins the exact
bytes of ``metadata.json``.

Validation (:func:`read_checkpoint`, before anything is returned): the marker exists and matches
``metadata.json``; the schema version is one this code reads; every tensor entry has a safe relative path
(no absolute path, no ``..``, no symlink anywhere, a regular file), an allowlisted dtype, a shape whose
size matches ``nbytes`` and the file's size, and matching checksums. Any failure raises
:class:`CheckpointError` (a :class:`ValueError`) naming the file and what is wrong.

Crash safety. :func:`write_checkpoint` writes everything into a sibling ``<path>.tmp-<hex>``, fsyncs the
files and directories, writes ``COMPLETE`` last, then switches under an ``flock`` of the parent directory:

1. no ``path`` yet: ``rename(tmp, path)``, atomic;
2. otherwise, on Linux, ``renameat2(tmp, path, RENAME_EXCHANGE)`` swaps both directories atomically and
   the old checkpoint, now at the tmp name, is removed;
3. where the exchange is unsupported: ``rename(path, <path>.old-<hex>)`` then ``rename(tmp, path)``, and
   the aside is removed.

Then the parent directory is fsynced. A process killed (SIGKILL) at any moment therefore leaves either
the old or the new complete checkpoint, never a mix: before the switch ``path`` is untouched; after it,
``path`` is complete. The only intermediate state, ``path`` missing between the two renames of case 3,
is handled by this recovery rule: :func:`read_checkpoint` reads the complete ``<path>.old-*`` instead
(readers never modify the disk), and the next :func:`write_checkpoint` renames it back to ``path``. The
next writer also removes what a crash left behind: ``<path>.old-*`` directories once ``path`` exists, and
``<path>.tmp-*`` directories whose writer is dead (each writer holds an ``flock`` on its tmp directory, so
a live writer's directory is never touched). ``fsync=False`` keeps this guarantee against a process
crash but not against a power loss.

Components. ``dumps``/``loads`` (:func:`dump_component`/:func:`load_component`) store one component per
checkpoint, its description under ``metadata["component"] = {"class": "<module>.<qualname>", "doc": ...}``.
The class name is only compared with the target's, never imported. Each component writes its own ``doc`` and
tensors through the part protocol of :mod:`torchrl.data.replay_buffers._checkpoint.parts` (the format engine,
:mod:`torchrl.data.replay_buffers._checkpoint.format`, knows no component). A replay buffer's ``doc`` holds its
``batch_size``, generator state (``rng/state``) and one part per component; a tensor storage's holds its
capacity, ``ndim``, data codec, row counters and the key, shape and dtype of every leaf, whose written rows are
stored at ``storage/<key path>.memmap``; samplers, writers and transforms store their ``state_dict()`` as JSON
whose tensors are files under ``sampler/``, ``writer/``, ``transforms/``. A :class:`~torchrl.data.LazyMemmapStorage` whose ``scratch_dir`` is ``<path>/storage`` is
saved by hard links (its files stay shared with the live storage, so their checksums are ``null``) and loaded
by mapping them in place. :func:`register_checkpoint_handler` attaches a part to a class you do not own.

Incremental dumps. A tensor storage whose writes stamp row versions (every CPU tensor storage: memory-mapped, in
shared memory or in private RAM; not a ``compilable`` one) records, beside the component,
``metadata["checkpoint_ids"] = {"<prefix>storage": {"token": <the storage>, "version": <its write revision>}}``. Dumped again onto a checkpoint
that it wrote (or loaded) in this process, whose files are untouched since, it hard-links that checkpoint's files
and writes the rows written since as *patches*: its part then holds ``base_rows`` and ``patches`` (``[start,
stop]`` row ranges, applied in order over the base rows) and each leaf names its ``base`` tensor and one tensor
per patch (``<prefix>storage_patches/<version>-<i>-<leaf position>``) instead of ``tensor``. Files of a complete
checkpoint are never modified, so the crash safety above holds unchanged; a dump whose patches would cover more
than a quarter of the rows, or any other storage's dump, is a full one. Rows the storage handed out as views
(``storage[a:b]``, ``rb[a:b]``, ``get_entry``), which may be edited in place without a write, are compared by
digest and written again when changed (NOTE [edits through views] in ``storages/_incremental.py``).
``TensorStorageCheckpointer(incremental=False)`` turns incremental dumps off for a storage (see
:func:`dump_component`).

Storage checkpointers (TorchRL's names). ``storage.dumps``/``storage.loads`` go through ``storage.checkpointer``,
whose default depends on the storage class: :class:`TensorStorageCheckpointer`, :class:`ListStorageCheckpointer`,
:class:`CompressedListStorageCheckpointer`, :class:`StorageEnsembleCheckpointer` (all derived from
:class:`StorageCheckpointerBase`) write this same format. :class:`FlatStorageCheckpointer`,
:class:`NestedStorageCheckpointer` and :class:`H5StorageCheckpointer` save the rows of a storage of TED data
(one time step per row, ``"next"`` holding what followed the step, so every observation twice) in the compact
layouts of :mod:`torchrl.data.replay_buffers.ted`: *flat* (:class:`~torchrl.data.TED2Flat`, each observation
once) or *nested* (:class:`~torchrl.data.TED2Nested`, the flat entries split per trajectory, kept as one dense
tensor per entry plus per-trajectory lengths, as :class:`~torchrl.data.H5Split` lays them out). Installed as
``storage.checkpointer``, one of them makes the storage's checkpoint part use its layout, in ``storage.dumps``
as in ``rb.dumps``; the checkpoint records the layout and loads only through a checkpointer of that layout.
Loading rebuilds the TED rows and writes them back where they were (a full ring buffer keeps its oldest row).
:class:`H5StorageCheckpointer` makes ``storage.dumps(path)`` write one HDF5 file instead (``h5py``, extra
``h5``): numeric datasets and a JSON attribute, nothing pickled. The TED checkpointers refuse, before anything is
written, storages with ``ndim > 1`` (flatten them first), data other than TensorDicts, and string entries (use
:class:`TensorStorageCheckpointer`).

Examples:
    >>> import os, tempfile, torch
    >>> from torchrl.data.replay_buffers.checkpointers import read_checkpoint, write_checkpoint
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "ckpt")
    ...     write_checkpoint(path, {"obs": torch.arange(6.0).reshape(2, 3)}, {"step": 10})
    ...     tensors, metadata = read_checkpoint(path)
    ...     print(tensors["obs"].sum().item(), metadata)
    15.0 {'step': 10}
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

import torchrl.data.replay_buffers._checkpoint.io as _io
from torchrl.data.replay_buffers._checkpoint.args import check_path
from torchrl.data.replay_buffers._checkpoint.format import (  # the format's public functions, re-exported here
    dump_component as dump_component,
)
from torchrl.data.replay_buffers._checkpoint.format import (
    load_component as load_component,
)
from torchrl.data.replay_buffers._checkpoint.format import (
    read_checkpoint as read_checkpoint,
)
from torchrl.data.replay_buffers._checkpoint.format import (
    register_checkpoint_handler as register_checkpoint_handler,
)
from torchrl.data.replay_buffers._checkpoint.format import (
    write_checkpoint as write_checkpoint,
)
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._checkpoint.validate import (
    SCHEMA_VERSION as SCHEMA_VERSION,
)
from torchrl.data.replay_buffers._checkpoint.validate import (
    SUPPORTED_SCHEMA_VERSIONS as SUPPORTED_SCHEMA_VERSIONS,
)
from torchrl.data.replay_buffers._checkpoint.validate import (
    check_int_field,
)
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.ted import Flat2TED, H5Combine, H5Split, Nested2TED, TED2Flat, TED2Nested
from torchrl.data.replay_buffers.utils import has_nontensor

# What ``from ... import *`` and ``torchrl.data`` export: TorchRL's eight checkpointers and the error a refused
# checkpoint raises. The format functions and constants re-exported above are imported by name.
__all__ = [
    "CheckpointError",
    "StorageCheckpointerBase",
    "TensorStorageCheckpointer",
    "ListStorageCheckpointer",
    "CompressedListStorageCheckpointer",
    "StorageEnsembleCheckpointer",
    "FlatStorageCheckpointer",
    "NestedStorageCheckpointer",
    "H5StorageCheckpointer",
]


# -- storage checkpointers: TorchRL's names, on this format ----------------------------------------------------------
class StorageCheckpointerBase:
    """What ``storage.dumps(path)`` and ``storage.loads(path)`` delegate to (``storage.checkpointer``).

    TorchRL lets each storage hand its ``dumps``/``loads`` to a checkpointer object; these classes keep its names
    and that seam, on the pickle-free format of this module: :meth:`dumps` writes the checkpoint of
    :func:`dump_component` (the storage's own part: see :mod:`torchrl.data.replay_buffers._checkpoint.parts`) and
    :meth:`loads` reads it back with every check of :func:`load_component`. So checkpoints written through a
    checkpointer and through ``storage.dumps`` are the same, and ``rb.dumps`` (which saves the storage's part with
    the rest of the buffer) is unaffected by the choice. Subclass and override :meth:`dumps`/:meth:`loads` to
    save a storage another way.

    .. note:: TorchRL's save and load hooks (``register_save_hook``/``register_load_hook``) rewrite the saved
        data with arbitrary code; they are not supported here (the methods raise ``NotImplementedError``).

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import LazyTensorStorage, TensorStorageCheckpointer
        >>> storage = LazyTensorStorage(10)
        >>> storage.checkpointer = TensorStorageCheckpointer()
        >>> storage.set(torch.arange(3), torch.ones(3, 2))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage.dumps(os.path.join(d, "s"))
        ...     fresh = LazyTensorStorage(10)
        ...     fresh.set(0, torch.zeros(2))  # tensor data fill a storage that holds data (TorchRL's rule)
        ...     fresh.checkpointer.loads(fresh, os.path.join(d, "s"))
        >>> len(fresh), type(fresh.checkpointer).__name__
        (3, 'TensorStorageCheckpointer')
    """

    #: The storages a checkpointer of this class saves, for error messages (``None``: any storage).
    saves: str | None = None

    def dumps(self, storage, path, *, fsync: bool = True, progress: bool | None = None) -> None:
        """Saves ``storage`` to the checkpoint directory ``path`` (see :func:`dump_component`)."""
        dump_component(storage, path, fsync=fsync, progress=progress)

    def loads(self, storage, path) -> None:
        """Loads the checkpoint at ``path`` into ``storage``, validated first (see :func:`load_component`)."""
        load_component(storage, path)

    def register_save_hook(self, hook) -> None:
        """Not supported: see the class note."""
        self._refuse_hooks("register_save_hook", hook)

    def register_load_hook(self, hook) -> None:
        """Not supported: see the class note."""
        self._refuse_hooks("register_load_hook", hook)

    def _refuse_hooks(self, method: str, hook) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.{method}({hook!r}) is not supported: a hook would rewrite the saved data "
            f"with arbitrary code, while this checkpoint format saves the storage's content as stored and loads "
            f"it back without running code. Transform the data before writing it (a buffer transform's `inv`), "
            f"or after loading it."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class TensorStorageCheckpointer(StorageCheckpointerBase):
    """The checkpointer of :class:`~torchrl.data.TensorStorage` and its subclasses (the default there).

    The written rows of every leaf become raw tensor files, streamed (a memory-mapped storage is copied file to
    file); a :class:`~torchrl.data.LazyMemmapStorage` whose ``scratch_dir`` is the checkpoint's ``storage``
    directory is hard-linked instead, and mapped in place again by :meth:`loads`. See
    :class:`StorageCheckpointerBase`.

    Incremental dumps: a storage that tracks its row writes (every CPU tensor storage but a ``compilable`` one:
    memory-mapped, shared or private RAM) dumped onto a checkpoint that it wrote itself, or loaded from, rewrites
    only the rows written since, as patch files, and hard-links the rest (``storage.dumps`` and ``rb.dumps`` alike; see
    :func:`dump_component`). Any other dump writes every row.

    Keyword Args:
        incremental (bool): allow incremental dumps of the storage. ``False`` writes every row at every dump:
            for storages whose rows are edited in place through views taken in *another* process (views taken
            in the dumping process are checked by digest). Defaults to ``True``.

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import LazyMemmapStorage, TensorStorageCheckpointer
        >>> storage = LazyMemmapStorage(100)
        >>> storage.set(torch.arange(50), torch.zeros(50, 3))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage.dumps(os.path.join(d, "s"))
        ...     storage.set(torch.arange(50, 52), torch.ones(2, 3))
        ...     storage.dumps(os.path.join(d, "s"))  # writes rows 50 and 51 only
        ...     print(sorted(os.listdir(os.path.join(d, "s"))))
        ...     storage.checkpointer = TensorStorageCheckpointer(incremental=False)
        ...     storage.dumps(os.path.join(d, "s"))  # every row
        ...     print(sorted(os.listdir(os.path.join(d, "s"))))
        ['COMPLETE', 'metadata.json', 'storage', 'storage_patches']
        ['COMPLETE', 'metadata.json', 'storage']
    """

    saves = "TensorStorage, LazyTensorStorage and LazyMemmapStorage"
    #: whether dumps onto a checkpoint this storage wrote may rewrite only the rows written since
    incremental: bool = True

    def __init__(self, *, incremental: bool = True):
        if not isinstance(incremental, bool):
            raise TypeError(
                f"`incremental` must be a bool (True: dumps onto this storage's own checkpoint rewrite only the rows "
                f"written since; False: every dump writes every row); got {incremental!r}."
            )
        self.incremental = incremental

    def loads(self, storage, path) -> None:
        """Loads the checkpoint at ``path`` into ``storage``; as in TorchRL, tensor and pytree data fill only a
        storage that holds data already (``RuntimeError``; see :meth:`~torchrl.data.TensorStorage.check_fillable`)."""
        storage.check_fillable(path)
        super().loads(storage, path)


class ListStorageCheckpointer(StorageCheckpointerBase):
    """The checkpointer of :class:`~torchrl.data.ListStorage` (the default there).

    Items that are tensors, TensorDicts, tensorclasses or pytrees of tensors are saved (stacked when they all have
    one structure). Any other item (a string, an arbitrary object) would need pickle, so :meth:`dumps` refuses
    it with a ``TypeError`` that names the item, before anything is written. See :class:`StorageCheckpointerBase`.
    """

    saves = "ListStorage"


class CompressedListStorageCheckpointer(StorageCheckpointerBase):
    """The checkpointer of :class:`~torchrl.data.CompressedListStorage` (the default there).

    Saves the compressed bytes as stored (no recompression), one uint8 buffer per entry with per-item offsets
    and shapes, and the codec name (``"zstd"``, ``"zlib"`` or ``"custom"``); :meth:`loads` refuses a checkpoint
    written with another default codec. Non-tensor entries must be str, numbers, bools or None. See
    :class:`StorageCheckpointerBase`.

    Examples:
        >>> import os, tempfile, torch
        >>> from torchrl.data import CompressedListStorage, CompressedListStorageCheckpointer
        >>> storage = CompressedListStorage(10)
        >>> type(storage.checkpointer).__name__
        'CompressedListStorageCheckpointer'
        >>> storage.set(0, torch.zeros(64, 64))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage.checkpointer.dumps(storage, os.path.join(d, "s"))
        ...     fresh = CompressedListStorage(10)
        ...     fresh.loads(os.path.join(d, "s"))
        >>> fresh.get(0).shape
        torch.Size([64, 64])
    """

    saves = "CompressedListStorage"

    def dumps(self, storage, path, *, fsync: bool = True, progress: bool | None = None) -> None:
        """Saves ``storage`` (``compressed_data/`` and ``metadata.json``), then TorchRL's ``data_indices.json``
        (item position -> its row in the saved data; informative, ``loads`` reads ``metadata.json``)."""
        super().dumps(storage, path, fsync=fsync, progress=progress)
        indices = json.dumps({str(i): i for i in range(len(storage))}).encode()
        with open(os.path.join(os.fspath(path), "data_indices.json"), "wb") as f:
            f.write(indices)


class StorageEnsembleCheckpointer(StorageCheckpointerBase):
    """The checkpointer of :class:`~torchrl.data.StorageEnsemble` (the default there).

    Saves each member storage and the ``state_dict()`` of its transform; a transform whose state holds objects
    other than tensors, numbers, strings and containers of those would need pickle, and is refused with a
    ``TypeError`` that names the entry. See :class:`StorageCheckpointerBase`.
    """

    saves = "StorageEnsemble"


# -- TED storage checkpointers: the rows of a storage of TED data in a compact layout ----------------------------
def _key_list(key) -> list[str]:
    return list(key) if isinstance(key, tuple) else [key]


class FlatStorageCheckpointer(TensorStorageCheckpointer):
    """Saves the TED rows of a storage in the flat layout of :class:`~torchrl.data.TED2Flat` (about half the size).

    Args:
        done_keys (sequence of NestedKey, optional): the done entries under ``"next"``. Defaults to
            :data:`~torchrl.data.replay_buffers.utils.DEFAULT_DONE_KEYS`.
        reward_keys (sequence of NestedKey, optional): the reward entries under ``"next"``. Defaults to
            ``("reward",)``.

    The storage must be a 1-D storage of TensorDicts holding ``("next", "done")``. TorchRL's save and load hooks
    (``TED2Flat``/``Flat2TED``) are built in; ``register_save_hook``/``register_load_hook`` stay refused (see
    :class:`StorageCheckpointerBase`).

    Examples:
        >>> import os, tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import FlatStorageCheckpointer, LazyTensorStorage
        >>> obs = torch.arange(6.0)
        >>> ted = TensorDict({"obs": obs, "done": torch.zeros(6, dtype=torch.bool),
        ...     "next": {"obs": obs + 1, "done": obs % 3 == 2, "reward": torch.ones(6)}}, batch_size=[6])
        >>> storage = LazyTensorStorage(10)
        >>> storage.checkpointer = FlatStorageCheckpointer()
        >>> storage.set(torch.arange(6), ted)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage.dumps(os.path.join(d, "s"))
        ...     fresh = LazyTensorStorage(10)
        ...     fresh.checkpointer = FlatStorageCheckpointer()
        ...     fresh.loads(os.path.join(d, "s"))
        >>> len(fresh), bool((fresh.get(torch.arange(6)) == ted).all())
        (6, True)
    """

    storage_layout = "flat"

    def __init__(self, done_keys=None, reward_keys=None):
        self.done_keys = done_keys
        self.reward_keys = reward_keys
        self._to_layout = TED2Flat(done_keys=done_keys, reward_keys=reward_keys)  # validates the keys
        self._from_layout = Flat2TED(done_keys=done_keys, reward_keys=reward_keys)

    # -- the layout -------------------------------------------------------------------------------------------
    def _pack(self, ted: TensorDictBase, shift: int, is_full: bool) -> TensorDictBase:
        hook = self._to_layout
        hook.shift, hook.is_full = shift, is_full
        return hook(ted)

    def _unpack(self, packed: TensorDictBase) -> TensorDictBase:
        return self._from_layout(packed)

    def _rows(self, storage) -> TensorDictBase:
        """The filled rows of ``storage`` as one TED TensorDict, checked for this layout."""
        name = type(self).__name__
        if storage.ndim != 1:
            raise ValueError(
                f"{name} saves 1-D storages of TED steps; this storage has ndim={storage.ndim}. Save "
                f"`storage.flatten()`, or use TensorStorageCheckpointer() (the default), which saves any storage."
            )
        rows = storage.get(slice(None))
        if not isinstance(rows, TensorDictBase):
            raise TypeError(
                f"{name} saves storages of TensorDicts (TED data); this storage holds {type(rows).__name__}. Use "
                f"TensorStorageCheckpointer() (the default)."
            )
        if has_nontensor(rows):
            raise TypeError(
                f"{name} saves tensor entries only; this storage holds string entries. Use "
                f"TensorStorageCheckpointer() (the default), which saves them."
            )
        return rows

    # -- the storage's checkpoint part (called by TensorStorage.checkpoint_part & co.) ------------------------
    def _doc(self, storage) -> dict:
        return {
            "class": qualname(storage),
            "max_size": storage.max_size,
            "ndim": storage.ndim,
            "initialized": bool(storage.initialized),
            "layout": self.storage_layout,
            "checkpointer": type(self).__name__,
            "done_keys": None
            if self.done_keys is None
            else sorted(_key_list(k) for k in self._to_layout.done_keys),
            "reward_keys": None
            if self.reward_keys is None
            else [_key_list(k) for k in self._to_layout.reward_keys],
        }

    def dump_storage_part(self, storage, ctx: PartContext) -> tuple[dict, dict]:
        """The checkpoint part of ``storage`` in this layout: ``(tensors, doc)``."""
        doc = self._doc(storage)
        if not doc["initialized"]:
            return {}, doc
        ted = self._rows(storage)
        rows, last_row = storage.rows_written(), storage.last_written_row
        is_full = bool(storage._is_full) and rows > 0
        packed = self._pack(ted, (last_row + 1) % max(rows, 1) if is_full else rows, is_full)
        keys = [
            k if isinstance(k, tuple) else (k,) for k in packed.keys(include_nested=True, leaves_only=True)
        ]
        tensors, leaves = {}, []
        for key, name in zip(keys, _io.leaf_names(keys)):
            value = packed.get(key)
            tensors[ctx.name(f"storage/{name}")] = value
            leaves.append(
                {
                    "key": list(key),
                    "tensor": ctx.name(f"storage/{name}"),
                    "shape": list(value.shape),
                    "dtype": _io.dtype_name(value.dtype),
                }
            )
        doc.update(rows=rows, last_row=last_row, is_full=is_full, leaves=leaves)
        return tensors, doc

    def check_storage_part(self, storage, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
        """Raises if the part ``doc`` does not fit ``storage``; changes nothing."""
        check_class(storage, doc, "storage")
        for attr in ("max_size", "ndim"):
            if doc.get(attr) != getattr(storage, attr):
                raise mismatch(
                    f"the storage {attr}", doc.get(attr), getattr(storage, attr), f"Use the same {attr}."
                )
        ctx.facts["storage_rows"] = storage.max_size
        if not doc.get("initialized"):
            return
        where = f"The {type(self).__name__} description in the checkpoint {ctx.path!r}"
        rows = check_int_field(doc["rows"], "rows", where, 0, storage.max_size, fix="`rows` counts the rows.")
        check_int_field(
            doc["last_row"], "last_row", where, -1, rows - 1, fix="`last_row` is a written row, or -1."
        )
        packed = TensorDict()
        for leaf in doc["leaves"]:
            stored = tensors.get(leaf["tensor"])
            if stored is None or list(stored.shape) != leaf["shape"]:
                raise CheckpointError(
                    f"{where}: the entry {leaf['tensor']!r} does not match its description."
                )
            packed.set(tuple(leaf["key"]), stored.as_subclass(torch.Tensor))
        try:
            ted = self._unpack(packed)
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            raise CheckpointError(
                f"{where}: its {self.storage_layout} layout does not rebuild TED rows: {err}"
            ) from None
        if ted.batch_size[:1] != torch.Size([rows]):
            raise CheckpointError(f"{where}: the layout rebuilds {list(ted.batch_size)} rows, not [{rows}].")
        if storage.initialized and rows:
            storage.check_write(ted, rows)  # keys, shapes and dtypes of the stored entries
        ctx.facts[f"{ctx.prefix}storage:ted"] = ted

    def load_storage_part(self, storage, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
        """Writes the rows of a checked part back into ``storage``, where they were."""
        storage._empty()
        if not doc.get("initialized") or not doc["rows"]:
            return
        ted = ctx.facts.pop(f"{ctx.prefix}storage:ted", None)
        if ted is None:
            self.check_storage_part(storage, doc, tensors, ctx)
            ted = ctx.facts.pop(f"{ctx.prefix}storage:ted")
        rows = doc["rows"]
        order = torch.arange(rows)
        if doc["is_full"]:  # written in time order, so that the newest row is the last one written
            order = (order + doc["last_row"] + 1) % rows
        storage.set(order, ted[order])

    # -- storage.dumps / storage.loads -----------------------------------------------------------------------
    def dumps(self, storage, path, *, fsync: bool = True, progress: bool | None = None) -> None:
        """Saves ``storage`` in this layout to the checkpoint directory ``path`` (pickle-free, atomic)."""
        path = check_path(path)
        tensors, doc = self.dump_storage_part(storage, PartContext(path))
        write_checkpoint(
            path,
            tensors,
            {"component": {"class": qualname(storage), "doc": doc}},
            fsync=fsync,
            progress=progress,
        )

    def loads(self, storage, path) -> None:
        """Loads a checkpoint written in this layout into ``storage``, validated first."""
        tensors, metadata = read_checkpoint(path)
        wrapped = metadata.get("component")
        if not isinstance(wrapped, dict) or not isinstance(wrapped.get("doc"), dict):
            raise CheckpointError(f"The checkpoint at {os.fspath(path)!r} holds no storage description.")
        self._load_doc(storage, wrapped["doc"], tensors, check_path(path))

    def _load_doc(self, storage, doc: dict, tensors: Mapping, path: str) -> None:
        if doc.get("layout") != self.storage_layout:
            raise mismatch(
                "the storage layout",
                doc.get("layout"),
                self.storage_layout,
                "Load it with the checkpointer it was saved with.",
            )
        ctx = PartContext(path)
        try:
            self.check_storage_part(storage, doc, tensors, ctx)
        except (KeyError, IndexError, AttributeError) as err:
            raise CheckpointError(
                f"The storage description at {path!r} is malformed: {type(err).__name__}: {err}."
            ) from None
        self.load_storage_part(storage, doc, tensors, ctx)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(done_keys={self.done_keys!r}, reward_keys={self.reward_keys!r})"


class NestedStorageCheckpointer(FlatStorageCheckpointer):
    """Saves the TED rows of a storage split per trajectory (:class:`~torchrl.data.TED2Nested`).

    Each entry of the flat layout is stored as one dense tensor plus the length of each trajectory (the
    :class:`~torchrl.data.H5Split` form of nested tensors), so a trajectory can be read without the others.
    Takes the arguments of :class:`FlatStorageCheckpointer`.

    Examples:
        >>> import os, tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, NestedStorageCheckpointer
        >>> obs = torch.arange(4.0)
        >>> ted = TensorDict({"obs": obs, "next": {"obs": obs + 1, "done": obs == 1}}, batch_size=[4])
        >>> storage = LazyTensorStorage(4)
        >>> storage.checkpointer = NestedStorageCheckpointer()
        >>> storage.set(torch.arange(4), ted)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage.dumps(os.path.join(d, "s"))
        ...     storage.loads(os.path.join(d, "s"))
        >>> storage.get(torch.arange(4))["next", "obs"].tolist()
        [1.0, 2.0, 3.0, 4.0]
    """

    storage_layout = "nested"

    def __init__(self, done_keys=None, reward_keys=None):
        super().__init__(done_keys=done_keys, reward_keys=reward_keys)
        self._to_layout = TED2Nested(done_keys=done_keys, reward_keys=reward_keys)
        self._from_layout = Nested2TED(done_keys=done_keys, reward_keys=reward_keys)

    def _pack(self, ted: TensorDictBase, shift: int, is_full: bool) -> TensorDictBase:
        return H5Split()(super()._pack(ted, shift, is_full))

    def _unpack(self, packed: TensorDictBase) -> TensorDictBase:
        return super()._unpack(H5Combine()(packed))


class H5StorageCheckpointer(NestedStorageCheckpointer):
    """Saves the TED rows of a storage into one HDF5 file, in the nested layout (needs ``h5py``: extra ``h5``).

    ``storage.dumps(path)`` writes ``path/checkpoint_file`` (``path`` itself when it ends with ``.h5``),
    atomically: one dataset per entry of the :class:`NestedStorageCheckpointer` layout and the description as
    the JSON attribute ``"torchrl_storage"`` (plus ``"_len"``, the number of rows, as TorchRL writes it);
    nothing is pickled. ``rb.dumps`` keeps its own checkpoint directory and saves the storage there in the
    nested layout.

    Keyword Args:
        checkpoint_file (str): the file name under ``path``. Defaults to ``"checkpoint.h5"``.
        done_keys (sequence of NestedKey, optional): see :class:`FlatStorageCheckpointer`.
        reward_keys (sequence of NestedKey, optional): see :class:`FlatStorageCheckpointer`.
        h5_kwargs (dict, optional): keyword arguments of ``h5py.Group.create_dataset`` for every dataset
            (e.g. ``{"compression": "gzip"}``). Defaults to ``None``.
        **kwargs: accepted for TorchRL compatibility and ignored.

    Examples:
        >>> import os, tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import H5StorageCheckpointer, LazyTensorStorage
        >>> obs = torch.arange(4.0)
        >>> ted = TensorDict({"obs": obs, "next": {"obs": obs + 1, "done": obs == 1}}, batch_size=[4])
        >>> storage = LazyTensorStorage(4)
        >>> storage.checkpointer = H5StorageCheckpointer()
        >>> storage.set(torch.arange(4), ted)
        >>> with tempfile.TemporaryDirectory() as d:
        ...     storage.dumps(d)
        ...     print(os.listdir(d))
        ...     fresh = LazyTensorStorage(4)
        ...     fresh.checkpointer = H5StorageCheckpointer()
        ...     fresh.loads(d)
        ['checkpoint.h5']
        >>> fresh.get(torch.arange(4))["obs"].tolist()
        [0.0, 1.0, 2.0, 3.0]
    """

    def __init__(
        self,
        *,
        checkpoint_file: str = "checkpoint.h5",
        done_keys=None,
        reward_keys=None,
        h5_kwargs=None,
        **kwargs,
    ):
        super().__init__(done_keys=done_keys, reward_keys=reward_keys)
        if not isinstance(checkpoint_file, str) or not checkpoint_file or os.sep in checkpoint_file:
            raise ValueError(
                f"`checkpoint_file` must be a file name such as 'checkpoint.h5'; got {checkpoint_file!r}."
            )
        if h5_kwargs is not None and not isinstance(h5_kwargs, Mapping):
            raise TypeError(
                f"`h5_kwargs` must be a dict of h5py create_dataset arguments or None; got {h5_kwargs!r}."
            )
        self.checkpoint_file = checkpoint_file
        self.h5_kwargs = dict(h5_kwargs or {})
        self.kwargs = kwargs

    def _file(self, path, create: bool) -> str:
        path = check_path(path)
        if path.endswith(".h5"):
            if create:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            return path
        if create:
            os.makedirs(path, exist_ok=True)
        return os.path.join(path, self.checkpoint_file)

    def dumps(self, storage, path, *, fsync: bool = True, progress: bool | None = None) -> None:
        """Writes ``storage`` to the HDF5 file of ``path`` (a new file renamed over the old one)."""
        h5py = _import_h5py()
        file = self._file(path, create=True)
        tensors, doc = self.dump_storage_part(storage, PartContext(os.path.dirname(file)))
        arrays = {}
        for name, tensor in tensors.items():
            try:
                arrays[name] = tensor.detach().cpu().numpy()
            except TypeError:
                raise TypeError(
                    f"Entry {name!r} has dtype {tensor.dtype}, which HDF5 files cannot hold. Store it in another dtype, "
                    f"or use FlatStorageCheckpointer/NestedStorageCheckpointer, which save it."
                ) from None
        tmp = f"{file}.tmp-{secrets.token_hex(6)}"
        try:
            with h5py.File(tmp, "w") as f:
                for name, array in arrays.items():
                    f.create_dataset(name, data=array, **self.h5_kwargs)
                f.attrs["torchrl_storage"] = json.dumps(doc)
                f.attrs["_len"] = len(storage)
                f.flush()
                if fsync:
                    os.fsync(f.id.get_vfd_handle())
            os.replace(tmp, file)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def loads(self, storage, path) -> None:
        """Loads the HDF5 file of ``path`` into ``storage``, validated first."""
        h5py = _import_h5py()
        file = self._file(path, create=False)
        if not os.path.isfile(file):
            raise FileNotFoundError(
                f"No HDF5 checkpoint at {file!r}: save one with storage.dumps(path) first."
            )
        with h5py.File(file, "r") as f:
            raw = f.attrs.get("torchrl_storage")
            if raw is None:
                raise CheckpointError(
                    f"{file!r} holds no 'torchrl_storage' description: it was not written by "
                    f"H5StorageCheckpointer."
                )
            doc = json.loads(raw)
            tensors = {}
            for leaf in doc.get("leaves", []):
                if leaf["tensor"] not in f:
                    raise CheckpointError(f"{file!r} lacks the dataset {leaf['tensor']!r} that it describes.")
                tensor = torch.from_numpy(np.asarray(f[leaf["tensor"]][()]))
                if _io.dtype_name(tensor.dtype) != leaf["dtype"]:
                    raise CheckpointError(
                        f"The dataset {leaf['tensor']!r} of {file!r} is {tensor.dtype}, not "
                        f"{leaf['dtype']} as described."
                    )
                tensors[leaf["tensor"]] = tensor
        self._load_doc(storage, doc, tensors, os.path.dirname(file))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(checkpoint_file={self.checkpoint_file!r}, done_keys={self.done_keys!r})"
        )


def _import_h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is in the test extras
        raise ImportError(
            "H5StorageCheckpointer needs h5py: pip install 'torchrl[h5]' (or pip install h5py), or use "
            "NestedStorageCheckpointer, which saves the same layout without it."
        ) from None
    return h5py
