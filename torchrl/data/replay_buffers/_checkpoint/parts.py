"""How a component saves itself into a checkpoint and loads itself back: the checkpoint-part protocol.

A checkpoint (:mod:`torchrl.data.replay_buffers.checkpointers`) holds tensors and a JSON document. Each
component (storage, sampler, writer, transform, buffer) contributes its *part*, next to its own fields, through
three methods (:class:`Checkpointable`):

- ``checkpoint_part(ctx) -> (tensors, doc)``: the tensors to save, named with ``ctx.name(...)`` (under the
  part's prefix), and a JSON document. Called by ``dumps``.
- ``check_checkpoint_part(doc, tensors, ctx)``: raises ``ValueError`` (or :class:`CheckpointError`) saying what
  differs when the part does not fit this object; changes nothing. ``loads`` checks every part of a checkpoint
  before it loads any.
- ``load_checkpoint_part(doc, tensors, ctx)``: restores the part (already checked); ``tensors`` are memory-mapped
  and read-only.

A class attribute ``checkpoint_role`` ("storage", "sampler", ...) names the component in error messages. The
default (storages, samplers and writers inherit it; transforms and any other object get it) saves
``state_dict()``, its tensors as files and the rest as JSON, and restores it with ``load_state_dict()`` (the
previous state comes back if that raises). A composite (a replay buffer) saves each child with
:func:`dump_part` under ``ctx.sub(role)`` and keeps the children's documents in its own. For classes you do not
own, :func:`~torchrl.data.replay_buffers.checkpointers.register_checkpoint_handler` attaches the three functions
from outside; a registered handler wins over the methods.

Examples:
    A sampler that counts how often each item was drawn, and saves the counts with its part:

    >>> import os, tempfile, torch
    >>> from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer
    >>> class CountingSampler(RandomSampler):
    ...     def __init__(self, capacity):
    ...         super().__init__()
    ...         self.counts = torch.zeros(capacity, dtype=torch.long)
    ...     def sample(self, storage, batch_size):
    ...         index, info = super().sample(storage, batch_size)
    ...         self.counts.index_add_(0, index, torch.ones_like(index))
    ...         return index, info
    ...     def checkpoint_part(self, ctx):
    ...         tensors, doc = super().checkpoint_part(ctx)
    ...         tensors[ctx.name("counts")] = self.counts
    ...         return tensors, {**doc, "capacity": self.counts.numel()}
    ...     def check_checkpoint_part(self, doc, tensors, ctx):
    ...         super().check_checkpoint_part(doc, tensors, ctx)
    ...         if doc.get("capacity") != self.counts.numel():
    ...             raise ValueError(f"`capacity` is {doc.get('capacity')} in the checkpoint, "
    ...                              f"{self.counts.numel()} here: build the sampler with the saved capacity.")
    ...     def load_checkpoint_part(self, doc, tensors, ctx):
    ...         super().load_checkpoint_part(doc, tensors, ctx)
    ...         self.counts.copy_(tensors[ctx.name("counts")])
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=CountingSampler(8), batch_size=4)
    >>> _ = rb.extend(torch.arange(8))
    >>> _ = rb.sample()
    >>> with tempfile.TemporaryDirectory() as d:
    ...     rb.dumps(os.path.join(d, "rb"))
    ...     fresh = ReplayBuffer(storage=LazyTensorStorage(8), sampler=CountingSampler(8), batch_size=4)
    ...     fresh.loads(os.path.join(d, "rb"))
    >>> int(fresh.sampler.counts.sum())
    4
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

import torchrl.data.replay_buffers._checkpoint.io as _io
from torchrl.data.replay_buffers._checkpoint.validate import check_int_field

__all__ = [
    "Checkpointable",
    "PartContext",
    "check_part",
    "dump_part",
    "load_part",
    "register",
]


class PartContext:
    """Where a part lives in a checkpoint: the directory ``path`` and the name ``prefix`` of its tensors.

    ``facts`` is shared by every part of one checkpoint: what a part's check established for the parts checked
    after it. A storage's check records ``facts["storage_rows"]``, the rows of the saved storage, by which a
    writer bounds its saved cursor, and raises ``facts["storage_items"]`` to its ``max_size``: the largest number
    of items any storage of the checkpoint can hold, by which a sampler bounds the epoch it saved.
    """

    def __init__(self, path: str, prefix: str = "", facts: dict[str, Any] | None = None):
        self.path, self.prefix = path, prefix
        self.facts = {} if facts is None else facts

    def sub(self, name: str) -> PartContext:
        """The context of a child part whose tensors go under ``<prefix><name>/``."""
        return PartContext(self.path, f"{self.prefix}{name}/", self.facts)

    def name(self, tensor: str) -> str:
        """The checkpoint name of this part's tensor ``tensor``."""
        return self.prefix + tensor

    def hold(self, lock) -> None:
        """Holds ``lock`` (a context manager) until the checkpoint being dumped is written: a part whose tensors
        are views of data other processes write (a shared storage's rows) takes its write lock here, so that the
        rows copied are those the part describes, none torn (NOTE [consistent dumps] in ``format.py``). A no-op
        outside a dump (a part built for another purpose)."""
        stack = self.facts.get("held")
        if stack is not None:
            stack.enter_context(lock)


@runtime_checkable
class Checkpointable(Protocol):
    """What a component implements to save itself into a checkpoint (see the module docstring).

    A class attribute ``checkpoint_role`` (a str, optional) names the component in error messages.
    """

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...

    def check_checkpoint_part(self, doc: dict, tensors: Mapping[str, torch.Tensor], ctx: PartContext) -> None: ...

    def load_checkpoint_part(self, doc: dict, tensors: Mapping[str, torch.Tensor], ctx: PartContext) -> None: ...


# -- messages ---------------------------------------------------------------------------------------------------
def qualname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def mismatch(what: str, saved, here, fix: str) -> ValueError:
    """The error of a part that does not fit the object it is loaded into."""
    return ValueError(
        f"The checkpoint does not fit this object: {what} is {saved!r} in the checkpoint and {here!r} here. "
        f"{fix} Nothing was loaded."
    )


def check_class(obj, doc: dict, role: str) -> None:
    if doc.get("class") != qualname(obj):
        raise mismatch(f"the {role} class", doc.get("class"), qualname(obj), f"Build the {role} as it was saved.")


# -- state dicts as JSON plus tensors ---------------------------------------------------------------------------
def encode_state(value, tensors: dict, prefix: str, where: str):
    """A JSON tree for ``value`` (a state dict); its tensors go to ``tensors`` under ``prefix``."""
    if isinstance(value, TensorDictBase):
        leaves = [
            [list(key) if isinstance(key, tuple) else [key], encode_state(v, tensors, prefix, f"{where}[{key!r}]")]
            for key, v in value.items(include_nested=True, leaves_only=True)
        ]
        return {"tensordict": {"batch_size": list(value.batch_size), "leaves": leaves}}
    if isinstance(value, torch.Tensor):
        name = f"{prefix}t{len(tensors)}"
        tensors[name] = value.detach()
        return {"tensor": name}
    if isinstance(value, np.ndarray):
        name = f"{prefix}t{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
        return {"ndarray": name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _io.dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"Cannot save the key {k!r} at {where}: state dict keys must be str or numbers.")
            items.append([k, encode_state(v, tensors, prefix, f"{where}[{k!r}]")])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [encode_state(v, tensors, prefix, f"{where}[{i}]") for i, v in enumerate(value)]}
    raise TypeError(
        f"Cannot save {where}: it is a {type(value).__name__}, and checkpoints hold tensors, TensorDicts, "
        f"numbers, strings, None, and lists/tuples/dicts of those. Saving it would need pickle, which this "
        f"format never uses (loading a pickle runs code). Keep such state out of state_dict()."
    )


def decode_state(node, tensors: Mapping[str, torch.Tensor]):
    """Rebuilds what :func:`encode_state` encoded; tensors are read into RAM."""
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"Malformed state node {node!r} in the checkpoint metadata.")
    ((kind, value),) = node.items()
    if kind == "value":
        return value
    if kind in ("tensor", "ndarray"):
        if value not in tensors:
            raise ValueError(f"The metadata refers to a tensor {value!r} that the checkpoint does not hold.")
        out = tensors[value].as_subclass(torch.Tensor).clone()
        return out.numpy() if kind == "ndarray" else out
    if kind == "tensordict":
        td = TensorDict(batch_size=value["batch_size"])
        for key, leaf in value["leaves"]:
            td.set(tuple(key), decode_state(leaf, tensors))
        return td
    if kind == "size":
        return torch.Size(value)
    if kind == "dtype":
        if not isinstance(value, str) or value not in _io.DTYPES:
            raise ValueError(
                f"The checkpoint metadata names the dtype {value!r:.80}, which is not one of {sorted(_io.DTYPES)}. "
                f"Save the state again with dumps."
            )
        return _io.DTYPES[value]
    if kind == "device":
        return torch.device(value)
    if kind == "dict":
        return {k: decode_state(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [decode_state(v, tensors) for v in value]
        return items if kind == "list" else tuple(items)
    raise ValueError(f"Unknown state node kind {kind!r} in the checkpoint metadata.")


def state_scalars(doc: dict) -> dict:
    """The scalar entries (``{"value": ...}`` nodes) of a state dict saved by :func:`dump_state_part`."""
    saved = doc.get("state", {}).get("dict") or []
    return {key: node["value"] for key, node in saved if isinstance(node, dict) and "value" in node}


# -- the default part: state_dict() ------------------------------------------------------------------------------
_CAPACITY_KEYS = ("max_capacity", "capacity", "_capacity", "max_size")


def dump_state_part(obj, ctx: PartContext) -> tuple[dict, dict]:
    """The default part: ``{"class", "state"}``, the state dict encoded by :func:`encode_state`."""
    if not callable(getattr(obj, "state_dict", None)):
        raise TypeError(
            f"Cannot save a {type(obj).__name__}: it has no state_dict(), no checkpoint_part() and no registered "
            f"checkpoint handler. Give it a state_dict()/load_state_dict() pair, or register a handler with "
            f"torchrl.data.replay_buffers.checkpointers.register_checkpoint_handler."
        )
    tensors: dict = {}
    return tensors, {"class": qualname(obj), "state": encode_state(obj.state_dict(), tensors, ctx.prefix, "state")}


def check_state_part(obj, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
    """Checks the class and that capacities (``max_capacity``, ``max_size``, ...) equal the object's."""
    check_class(obj, doc, "component")
    saved = doc.get("state", {}).get("dict")
    if saved is None or not callable(getattr(obj, "state_dict", None)):
        return
    here = obj.state_dict()
    for key, node in saved:
        value = node.get("value") if isinstance(node, dict) else None
        if key in _CAPACITY_KEYS and isinstance(value, int) and isinstance(here.get(key), int) and value != here[key]:
            raise mismatch(f"the {key} of the {type(obj).__name__}", value, here[key], "Use the same capacity.")


def check_state_counters(obj, doc: dict, ctx: PartContext, keys: tuple[str, ...]) -> dict:
    """Checks that the saved scalars ``keys`` of a state part are ints >= 0; returns the saved scalars."""
    scalars = state_scalars(doc)
    where = f"The {type(obj).__name__} state in the checkpoint {ctx.path!r}"
    for key in keys:
        if key in scalars:
            check_int_field(scalars[key], key, where, 0, fix="Counters are JSON integers, e.g. 0.")
    return scalars


def load_state_part(obj, doc: dict, tensors: Mapping, ctx: PartContext) -> None:
    """Restores a state part with ``load_state_dict``; the previous state comes back if that raises."""
    state = decode_state(doc["state"], tensors)
    previous = copy.deepcopy(obj.state_dict())
    try:
        obj.load_state_dict(state)
    except Exception:
        obj.load_state_dict(previous)
        raise


# -- dispatch ---------------------------------------------------------------------------------------------------
_HANDLERS: dict[type, tuple[Callable, Callable | None, Callable]] = {}


def register(cls: type, dump: Callable, load: Callable, check: Callable | None = None) -> None:
    """Attaches ``dump(obj, ctx)``, ``check(obj, doc, tensors, ctx)`` and ``load(obj, doc, tensors, ctx)`` to
    ``cls`` and its subclasses (see ``register_checkpoint_handler``, which validates the arguments)."""
    _HANDLERS[cls] = (dump, check, load)


def _handler(obj) -> tuple[Callable, Callable | None, Callable] | None:
    return next((_HANDLERS[cls] for cls in type(obj).__mro__ if cls in _HANDLERS), None)


def role(obj) -> str:
    """What ``obj`` is called in messages: its ``checkpoint_role``, else "component"."""
    value = getattr(type(obj), "checkpoint_role", None)
    return value if isinstance(value, str) else "component"


def dump_part(obj, ctx: PartContext) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``obj``'s tensors and its part, wrapped as ``{"class": <module.qualname>, "doc": <part>}``."""
    handler = _handler(obj)
    if handler is not None:
        tensors, doc = handler[0](obj, ctx)
    elif isinstance(obj, Checkpointable):
        tensors, doc = obj.checkpoint_part(ctx)
    else:
        tensors, doc = dump_state_part(obj, ctx)
    return tensors, {"class": qualname(obj), "doc": doc}


def check_part(obj, wrapped: dict, tensors: Mapping[str, torch.Tensor], ctx: PartContext) -> None:
    """Raises if the wrapped part does not fit ``obj`` (its class first); changes nothing."""
    check_class(obj, wrapped, role(obj))
    handler = _handler(obj)
    if handler is not None:
        if handler[1] is not None:
            handler[1](obj, wrapped["doc"], tensors, ctx)
    elif isinstance(obj, Checkpointable):
        obj.check_checkpoint_part(wrapped["doc"], tensors, ctx)
    else:
        check_state_part(obj, wrapped["doc"], tensors, ctx)


def load_part(obj, wrapped: dict, tensors: Mapping[str, torch.Tensor], ctx: PartContext) -> None:
    """Loads a wrapped part checked by :func:`check_part` into ``obj``."""
    handler = _handler(obj)
    if handler is not None:
        handler[2](obj, wrapped["doc"], tensors, ctx)
    elif isinstance(obj, Checkpointable):
        obj.load_checkpoint_part(wrapped["doc"], tensors, ctx)
    else:
        load_state_part(obj, wrapped["doc"], tensors, ctx)
