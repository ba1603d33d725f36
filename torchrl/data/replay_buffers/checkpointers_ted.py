"""Storage checkpointers that save TED data compactly: ``FlatStorageCheckpointer``, ``NestedStorageCheckpointer``
and ``H5StorageCheckpointer`` (TorchRL's names and constructor arguments).

TED data (one time step per row, ``"next"`` holding what followed the step) stores every observation twice.
These checkpointers save the rows of a 1-D TensorDict storage in the compact layouts of
:mod:`torchrl.data.replay_buffers.ted` instead: *flat* (:class:`~torchrl.data.TED2Flat`: each observation
once) or *nested* (:class:`~torchrl.data.TED2Nested`: the flat entries split per trajectory, kept on disk as
one dense tensor per entry plus per-trajectory lengths, as :class:`~torchrl.data.H5Split` lays them out).
Loading rebuilds the TED rows and writes them back where they were (a full ring buffer keeps its oldest row).

Install one as ``storage.checkpointer`` (or pass it as ``ReplayBuffer(checkpointer=...)``): the storage's
checkpoint part then uses its layout, in ``storage.dumps`` as in ``rb.dumps``, written in the pickle-free
format of :mod:`torchrl.data.replay_buffers.checkpointers` (raw tensor files + JSON, which records the layout;
loading needs a checkpointer of the same layout). :class:`H5StorageCheckpointer` makes ``storage.dumps(path)``
write one HDF5 file instead (``h5py``, extra ``h5``): numeric datasets and a JSON attribute, nothing pickled.

Not supported (a clear error before anything is written): storages with ``ndim > 1`` (flatten them first),
data other than TensorDicts, and string entries (use :class:`~torchrl.data.TensorStorageCheckpointer`).
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
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, check_class, mismatch, qualname
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field
from torchrl.data.replay_buffers.checkpointers import (
    TensorStorageCheckpointer,
    read_checkpoint,
    write_checkpoint,
)
from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._checkpoint import leaf_names
from torchrl.data.replay_buffers.storages._nontensor import has_nontensor
from torchrl.data.replay_buffers.ted import Flat2TED, H5Combine, H5Split, Nested2TED, TED2Flat, TED2Nested

__all__ = ["FlatStorageCheckpointer", "NestedStorageCheckpointer", "H5StorageCheckpointer"]


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
    :class:`~torchrl.data.replay_buffers.checkpointers.StorageCheckpointerBase`).

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
            else [_key_list(k) for k in self._to_layout.done_keys],
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
        for key, name in zip(keys, leaf_names(keys)):
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
        done_keys, reward_keys: see :class:`FlatStorageCheckpointer`.
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
