"""How a storage turns the user's data into one backing TensorDict and back.

Tensor storages keep every kind of data in a single :class:`~tensordict.TensorDict` (one leaf per tensor),
so that writes, gathers, sharing and memory-mapping have one code path. A :class:`DataCodec` remembers the
kind of the first datum and converts in both directions:

==============  ===========================================  ==========================================
kind            backing TensorDict                           returned by ``get``
==============  ===========================================  ==========================================
``tensor``      ``{"_tensor": t}``                           the tensor
``tensordict``  the TensorDict's own (nested) keys           a TensorDict
``tensorclass`` the tensorclass's TensorDict                 an instance of the same tensorclass
``pytree``      one leaf per pytree path (``"obs"``, ``"0"``) the same pytree (dicts, tuples, lists)
==============  ===========================================  ==========================================

String entries of TensorDicts and tensorclasses (``NonTensorData``/``NonTensorStack``) become UTF-8 byte leaves
and come back as non-tensor entries: see :mod:`._nontensor` and its NOTE.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase, is_tensorclass

from torchrl.data.replay_buffers.errors import CheckpointError
from torchrl.data.replay_buffers.storages._nontensor import from_stored, to_stored
from torchrl.data.replay_buffers.utils import has_nontensor

TENSOR_KEY = "_tensor"
KINDS = ("tensor", "tensordict", "tensorclass", "pytree")


def _path_to_key(path) -> tuple[str, ...]:
    parts = []
    for entry in path:
        if isinstance(entry, pytree.MappingKey):
            parts.append(str(entry.key))
        elif isinstance(entry, pytree.SequenceKey):
            parts.append(str(entry.idx))
        else:  # GetAttrKey and others
            parts.append(str(getattr(entry, "name", entry)))
    return tuple(parts)


def data_kind(data) -> str:
    """The kind of ``data``: ``"tensor"``, ``"tensordict"``, ``"tensorclass"`` or ``"pytree"``."""
    if isinstance(data, torch.Tensor):
        return "tensor"
    if isinstance(data, TensorDictBase):
        return "tensordict"
    if is_tensorclass(data):
        return "tensorclass"
    if isinstance(data, (dict, list, tuple)):
        return "pytree"
    raise TypeError(
        f"Storages hold tensors, TensorDicts, tensorclasses or pytrees (dicts/tuples/lists) of tensors; "
        f"got {type(data).__name__}. Convert the data with torch.as_tensor or wrap it in a TensorDict."
    )


class DataCodec:
    """Converts one kind of data to a TensorDict and back (see the module docstring).

    Args:
        kind (str): one of ``"tensor"``, ``"tensordict"``, ``"tensorclass"``, ``"pytree"``.
        tensorclass (type, optional): the tensorclass to rebuild, for ``kind="tensorclass"``.
        treespec (pytree.TreeSpec, optional): the structure to rebuild, for ``kind="pytree"``.
        keys (list of tuples of str, optional): the pytree leaf keys, in ``treespec`` order.

    Attributes:
        strings (dict): the string entries of the backing (key tuple -> width in bytes), set by the storage
            from its backing; empty when it holds none (then ``encode``/``decode`` cost nothing more).
        fixed_width (int, optional): the storage's ``max_string_bytes``, the width of new string entries.
    """

    def __init__(self, kind: str, *, tensorclass=None, treespec=None, keys=None):
        if kind not in KINDS:
            raise ValueError(f"`kind` must be one of {KINDS}, got {kind!r}.")
        self.kind = kind
        self.tensorclass = tensorclass
        self.treespec = treespec
        self.keys = keys
        self.strings: dict[tuple, int] = {}
        self.fixed_width: int | None = None

    @classmethod
    def for_data(cls, data) -> DataCodec:
        kind = data_kind(data)
        if kind == "tensorclass":
            return cls(kind, tensorclass=type(data))
        if kind == "pytree":
            leaves, spec = pytree.tree_flatten_with_path(data)
            for path, leaf in leaves:
                if not isinstance(leaf, torch.Tensor):
                    raise TypeError(
                        f"Every leaf of a pytree written to a storage must be a tensor; the leaf at "
                        f"{_path_to_key(path)} is a {type(leaf).__name__}. Convert it with torch.as_tensor."
                    )
            return cls(kind, treespec=pytree.tree_structure(data), keys=[_path_to_key(p) for p, _ in leaves])
        return cls(kind)

    def encode(self, data, batch_dims: int) -> TensorDictBase:
        """A TensorDict view (no copy) of ``data`` whose batch size is its first ``batch_dims`` dims."""
        kind = self.kind
        if kind == "tensor":
            if not isinstance(data, torch.Tensor):
                raise TypeError(f"This storage holds tensors; got {type(data).__name__}.")
            return TensorDict({TENSOR_KEY: data}, batch_size=data.shape[:batch_dims])
        if kind == "tensordict":
            if not isinstance(data, TensorDictBase):
                raise TypeError(f"This storage holds TensorDicts; got {type(data).__name__}.")
            if self.strings or has_nontensor(data):
                return to_stored(data, self.strings, self.fixed_width)
            return data
        if kind == "tensorclass":
            if not is_tensorclass(data):
                raise TypeError(
                    f"This storage holds {self.tensorclass.__name__} instances; got {type(data).__name__}."
                )
            td = data._tensordict
            if self.strings or has_nontensor(td):
                return to_stored(td, self.strings, self.fixed_width)
            return td
        leaves, spec = pytree.tree_flatten(data)
        if spec != self.treespec:
            raise ValueError(
                f"The structure of the data written ({spec}) differs from the structure the storage holds "
                f"({self.treespec}). Write data with the same keys and nesting."
            )
        batch = leaves[0].shape[:batch_dims] if leaves else torch.Size([])
        return TensorDict(dict(zip(self.keys, leaves)), batch_size=batch)

    def decode(self, td: TensorDictBase):
        """Rebuilds the user's kind of data from a TensorDict laid out by :meth:`encode`."""
        kind = self.kind
        if kind == "tensor":
            return td.get(TENSOR_KEY)
        if kind == "tensordict":
            return from_stored(td, list(self.strings)) if self.strings else td
        if kind == "tensorclass":
            return self.tensorclass._from_tensordict(from_stored(td, list(self.strings)) if self.strings else td)
        return pytree.tree_unflatten([td.get(k) for k in self.keys], self.treespec)

    # -- JSON description (checkpoints) -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "tensorclass":
            out["tensorclass"] = f"{self.tensorclass.__module__}:{self.tensorclass.__qualname__}"
        if self.kind == "pytree":
            out["treespec"] = pytree.treespec_dumps(self.treespec)
            out["keys"] = [list(k) for k in self.keys]
        return out

    @classmethod
    def from_json(cls, desc: dict[str, Any]) -> DataCodec:
        kind = desc.get("kind")
        if kind not in KINDS:
            raise ValueError(f"Unknown data kind {kind!r} in the metadata; expected one of {KINDS}.")
        if kind == "tensorclass":
            return cls(kind, tensorclass=_resolve_loaded_class(desc["tensorclass"]))
        if kind == "pytree":
            treespec, keys = _load_treespec(desc.get("treespec")), _load_keys(desc.get("keys"))
            if len(keys) != treespec.num_leaves:
                raise CheckpointError(
                    f"The data codec in the checkpoint metadata names {len(keys)} pytree leaf `keys` for a "
                    f"`treespec` of {treespec.num_leaves} leaves. Save the storage again with dumps. Nothing was "
                    f"loaded."
                )
            return cls(kind, treespec=treespec, keys=keys)
        return cls(kind)

    def __getstate__(self):
        state = self.to_json() if self.kind != "tensorclass" else {"kind": self.kind, "cls": self.tensorclass}
        return {**state, "strings": [[list(k), w] for k, w in self.strings.items()], "fixed_width": self.fixed_width}

    def __setstate__(self, state):
        if state["kind"] == "tensorclass":
            self.__init__("tensorclass", tensorclass=state["cls"])
        else:
            other = DataCodec.from_json(state)
            self.__init__(other.kind, treespec=other.treespec, keys=other.keys)
        self.strings = {tuple(k): w for k, w in state.get("strings", [])}
        self.fixed_width = state.get("fixed_width")

    def __eq__(self, other) -> bool:
        return isinstance(other, DataCodec) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"DataCodec({self.to_json()})"


def _resolve_loaded_class(qualified: str):
    """Finds a tensorclass by ``module:qualname`` among modules already imported (imports nothing)."""
    module_name, _, qualname = qualified.partition(":")
    obj = sys.modules.get(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part) if obj is not None else None
        except AttributeError:
            obj = None
        except ImportError as err:  # a name a module keeps for what it does not provide (torchrl.data:Bounded)
            raise CheckpointError(
                f"The checkpoint says its items are instances of the tensorclass {qualified!r}, but that name is "
                f"not a tensorclass here ({err}). The checkpoint was edited or written by other code: re-save it."
            ) from None
    if obj is not None and not (isinstance(obj, type) and is_tensorclass(obj)):
        raise CheckpointError(
            f"The checkpoint says its items are instances of the tensorclass {qualified!r}, but that name is a "
            f"{type(obj).__name__} here, not a tensorclass. The checkpoint was edited or written by other code: "
            f"re-save it."
        )
    if obj is None:
        raise ValueError(
            f"The checkpoint holds instances of the tensorclass {qualified!r}, which is not defined in this "
            f"process. Import the module that defines it before loading."
        )
    return obj


def _load_treespec(text) -> pytree.TreeSpec:
    """The pytree structure saved by :meth:`DataCodec.to_json` (torch's ``treespec_dumps``); ``ValueError`` naming
    the field for anything else (torch raises ``NotImplementedError``, ``KeyError``, ... on a malformed one)."""
    problem = None
    if not isinstance(text, str):
        problem = f"is a {type(text).__name__}, expected the str torch.utils._pytree.treespec_dumps writes"
    else:
        try:
            return pytree.treespec_loads(text)
        except RecursionError:
            problem = "nests deeper than Python can read"
        except Exception as err:  # noqa: BLE001 - torch raises many kinds (NotImplementedError, KeyError, ...)
            problem = f"is not one torch can read ({type(err).__name__}: {str(err)[:120]})"
    raise CheckpointError(
        f"The data codec in the checkpoint metadata has a `treespec` ({text!r:.80}) that {problem}. Save the "
        f"storage again with dumps. Nothing was loaded."
    )


def _load_keys(keys) -> list[tuple]:
    """The pytree leaf keys saved by :meth:`DataCodec.to_json`: a list of lists of str."""
    if not isinstance(keys, list) or not all(
        isinstance(k, list) and all(isinstance(part, str) for part in k) for k in keys
    ):
        raise CheckpointError(
            f"The data codec in the checkpoint metadata has `keys` {keys!r:.80}, expected a list of lists of str "
            f"(one per pytree leaf). Save the storage again with dumps. Nothing was loaded."
        )
    return [tuple(k) for k in keys]
