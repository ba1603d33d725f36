"""The prefetched batches of a buffer as state: what ``state_dict()`` and pickling keep of the prefetch queue.

As in TorchRL, the batches a prefetching buffer has sampled ahead but not returned yet are part of its state,
so a restored buffer returns the same next batches as the original one. The state is
``{"version": 1, "capacity": prefetch, "queue": ((data, info), ...)}``, taken after the tasks in flight have
finished (their draws moved the sampler and the generator, whose state is taken after them), each batch
cloned (detached). It is restored as completed futures; a DataLoader worker's copy drops it
(``prepare_worker_copy``).
"""

from __future__ import annotations

from concurrent.futures import Future

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase

from torchrl.data.replay_buffers.errors import CheckpointError

PREFETCH_STATE_VERSION = 1


class _Drawn:
    """The draw of a restored batch: whether it ended the sampler's epoch (see ``_prefetch_order``)."""

    def __init__(self, ran_out):
        self.ran_out = ran_out


def _clone(value):
    if isinstance(value, TensorDictBase):
        return value.detach().clone()
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, value)


def capture(queue, capacity: int) -> dict | None:
    """The state of ``queue`` (a deque of futures; waits for them), or ``None`` when it is empty."""
    if not queue:
        return None
    batches, ran_out = [], []
    for future in queue:
        data, info = future.result()
        batches.append((_clone(data), _clone(info)))
        turn = getattr(future, "draw_turn", None)
        ran_out.append(None if turn is None else turn.ran_out)
    return {
        "version": PREFETCH_STATE_VERSION,
        "capacity": capacity,
        "queue": tuple(batches),
        "ran_out": ran_out,
    }


def restore(state, capacity: int) -> list:
    """Completed futures for the batches of ``state``; ``ValueError`` if it does not fit this buffer."""
    if state is None:
        return []
    if not isinstance(state, dict) or state.get("version") != PREFETCH_STATE_VERSION:
        raise ValueError(
            f"Unsupported prefetch state (version {state.get('version') if isinstance(state, dict) else None!r}); "
            f"expected a dict with version {PREFETCH_STATE_VERSION}, as state_dict() returns."
        )
    queue = state.get("queue", ())
    if queue and state.get("capacity") != capacity:
        raise ValueError(
            f"The state holds {len(queue)} prefetched batches of a buffer built with prefetch="
            f"{state.get('capacity')}; this buffer has prefetch={capacity}. Build it with the same `prefetch`."
        )
    ran_out = state.get("ran_out") or [None] * len(queue)
    futures = []
    for (data, info), ended in zip(queue, ran_out):
        future = Future()
        future.set_result((data, info))
        future.draw_turn = _Drawn(ended)
        futures.append(future)
    return futures


# -- the checkpoint part (dumps/loads): tensors plus a JSON description, no pickle --------------------------------
_JSON_SCALARS = (type(None), bool, int, float, str)


def _flatten(value, prefix: str, tensors: dict, ctx) -> dict:
    if isinstance(value, TensorDictBase):
        keys = list(value.keys(include_nested=True, leaves_only=True))
        names = []
        for i, key in enumerate(keys):
            name = ctx.name(f"{prefix}/{i}")
            tensors[name] = value.get(key).contiguous()
            names.append(name)
        paths = [[key] if isinstance(key, str) else list(key) for key in keys]
        return {"kind": "tensordict", "batch_size": list(value.batch_size), "keys": paths, "tensors": names}
    leaves, spec = pytree.tree_flatten(value)
    out = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            name = ctx.name(f"{prefix}/{i}")
            tensors[name] = leaf.contiguous()
            out.append({"tensor": name})
        elif isinstance(leaf, _JSON_SCALARS):
            out.append({"value": leaf})
        else:
            raise TypeError(f"Cannot save a prefetched batch holding a {type(leaf).__name__}.")
    return {"kind": "pytree", "spec": pytree.treespec_dumps(spec), "leaves": out}


def _unflatten(desc: dict, tensors):
    if desc["kind"] == "tensordict":
        td = TensorDict(batch_size=desc["batch_size"])
        for path, name in zip(desc["keys"], desc["tensors"]):
            td.set(tuple(path), tensors[name].clone())
        return td
    leaves = [
        tensors[leaf["tensor"]].clone() if "tensor" in leaf else leaf["value"] for leaf in desc["leaves"]
    ]
    return pytree.tree_unflatten(leaves, pytree.treespec_loads(desc["spec"]))


def to_part(state: dict | None, ctx) -> tuple[dict, dict | None]:
    """``(tensors, JSON description)`` of a prefetch state, for the buffer's checkpoint part."""
    if state is None:
        return {}, None
    tensors = {}
    batches = [
        {
            "data": _flatten(data, f"prefetch/{i}/data", tensors, ctx),
            "info": _flatten(info, f"prefetch/{i}/info", tensors, ctx),
        }
        for i, (data, info) in enumerate(state["queue"])
    ]
    return tensors, {
        "version": state["version"],
        "capacity": state["capacity"],
        "batches": batches,
        "ran_out": state["ran_out"],
    }


def from_part(doc: dict | None, tensors) -> dict | None:
    """The prefetch state described by ``doc``; ``ValueError`` naming the fault if it is malformed."""
    if doc is None:
        return None
    try:
        queue = tuple(
            (_unflatten(b["data"], tensors), _unflatten(b["info"], tensors)) for b in doc["batches"]
        )
        return {
            "version": doc["version"],
            "capacity": doc["capacity"],
            "queue": queue,
            "ran_out": doc["ran_out"],
        }
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"malformed `prefetch` entry ({type(err).__name__}: {err})") from None


def wait(queue) -> None:
    """Waits for the prefetch tasks of ``queue`` (call it before taking a lock those tasks take)."""
    for future in list(queue):
        future.exception()


def check_part(doc: dict | None, tensors, capacity: int, where: str) -> None:
    """``CheckpointError`` (nothing loaded) if the saved prefetched batches cannot be restored in this buffer."""
    try:
        restore(from_part(doc, tensors), capacity)
    except ValueError as err:
        raise CheckpointError(f"The checkpoint {where!r}: {err} Nothing was loaded.") from None
