"""The state of a tensor storage: ``state_dict``/``load_state_dict`` and its checkpoint part.

A mixin of :class:`~torchrl.data.TensorStorage` (it uses the storage's ``_storage`` backing, ``_codec``,
``_counters``, ``_versions`` and ``write_lock``). The checkpoint part follows the protocol of
:mod:`torchrl.data.replay_buffers._checkpoint.parts`; its layout is described in :mod:`._checkpoint`. A storage
whose ``checkpointer`` saves another layout (``FlatStorageCheckpointer``, ``NestedStorageCheckpointer``,
``H5StorageCheckpointer``: a ``storage_layout`` attribute and ``dump/check/load_storage_part`` methods) hands
its part to it, so that ``storage.dumps`` and ``rb.dumps`` both write that layout; a checkpoint records the
layout it was written in and loads only through a checkpointer of that layout.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict, TensorDictBase

import torchrl.data.replay_buffers.storages._checkpoint as _ckpt
from torchrl.data.replay_buffers._checkpoint.parts import PartContext, mismatch
from torchrl.data.replay_buffers.storages._codec import DataCodec


class StorageState:
    """``state_dict``, ``load_state_dict`` and the checkpoint part of :class:`~torchrl.data.TensorStorage`."""

    def _layout_checkpointer(self):
        """The storage's checkpointer when it saves a layout of its own (``None`` for the default one)."""
        checkpointer = self._checkpointer
        return checkpointer if getattr(checkpointer, "storage_layout", None) is not None else None

    def state_dict(self) -> dict[str, Any]:
        self.initialized  # noqa: B018 (maps the files of a shared_init storage written by another process)
        return {
            "_storage": None if self._storage is None else self._storage.clone(),
            "_codec": None if self._codec is None else self._codec.to_json(),
            "_len": self._counters["rows"],
            "_last_row": self._counters["last_row"],
            "max_size": self.max_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        backing = state_dict.get("_storage")
        if backing is None:
            self._empty()
            return
        if not isinstance(backing, TensorDictBase):
            backing = TensorDict.from_dict(backing)
        codec = DataCodec.from_json(state_dict["_codec"])
        if not self.initialized:
            rows = backing.batch_size[0]
            self._adopt(self._allocate(backing[0], rows), codec)
        _ckpt.check_same_layout(self._storage, backing)
        with self.write_lock:
            versions = self._versions
            everything = slice(None)
            if versions is not None:
                versions.begin(everything)
            self._storage.update_(backing)
            if versions is not None:
                versions.end()
            self._use_codec(codec)
            self._counters["rows"] = int(state_dict["_len"])
            self._counters["last_row"] = int(state_dict.get("_last_row", int(state_dict["_len"]) - 1))
            self._counters["revision"] += 1
        self._publish_shared_init()

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        self.initialized  # noqa: B018 (maps the files of a shared_init storage written by another process)
        layout = self._layout_checkpointer()
        if layout is not None:
            return layout.dump_storage_part(self, ctx)
        rows, last_row = self._counters["rows"], self._counters["last_row"]
        return _ckpt.tensor_storage_part(self, self._storage, self._codec, rows, last_row, ctx)

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self.initialized  # noqa: B018
        saved = doc.get("layout")
        if saved is not None:
            layout = self._layout_checkpointer()
            here = None if layout is None else layout.storage_layout
            if here != saved:
                fix = (
                    f"Set `storage.checkpointer` to a checkpointer of the {saved!r} layout (e.g. "
                    f"{doc.get('checkpointer', 'FlatStorageCheckpointer')}(...)) before loading."
                )
                raise mismatch("the storage layout", saved, here or "standard", fix)
            return layout.check_storage_part(self, doc, tensors, ctx)
        _ckpt.check_tensor_storage_part(self, self._storage, doc, tensors, ctx)

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        if doc.get("layout") is not None:
            return self._layout_checkpointer().load_storage_part(self, doc, tensors, ctx)
        if not doc.get("initialized"):
            return self._empty()
        codec = DataCodec.from_json(doc["codec"])
        if self._storage is None:
            self._adopt(self._backing_for_checkpoint(doc, tensors), codec)
        _ckpt.copy_saved_rows(doc, tensors, self._storage)
        self._use_codec(codec)
        self._counters["rows"], self._counters["last_row"] = doc["rows"], doc["last_row"]
        self._counters["revision"] += 1
        self._publish_shared_init()

    def _backing_for_checkpoint(self, doc: dict, tensors) -> TensorDictBase:
        """The backing a checkpoint is loaded into, for a storage that holds no data yet."""
        return self._allocate(_ckpt.item_template(doc), doc["batch_size"][0])
