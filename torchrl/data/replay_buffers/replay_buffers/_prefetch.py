"""A buffer's prefetch queue: the order of the draws made ahead, and the queue as state.

``ReplayBuffer(prefetch=k)`` samples ``k`` batches ahead in a thread pool. Two things follow, both here:

NOTE [prefetch epochs]: prefetch tasks run in a thread pool, so without care they draw from the sampler in
any order, and the sampler's live ``ran_out`` flag says nothing about the batch the consumer is given: a
task may already have started the next epoch (and reset the flag) when the epoch's last batch is returned.
Each prefetch task therefore holds a :class:`DrawTurn`: it draws its indices only after the task submitted
before it has drawn, and records whether its own draw ended the sampler's epoch. ``ReplayBuffer.__iter__``
stops on the batch whose draw ended the epoch. Batches drawn after it stay queued for the next epoch.

The queue as state: as in TorchRL, the batches a prefetching buffer has sampled ahead but not returned yet are
part of its state, so a restored buffer returns the same next batches as the original one. The state is
``{"version": 1, "capacity": prefetch, "queue": ((data, info), ...), "ran_out": [...]}``, taken after the tasks
in flight have finished (their draws moved the sampler and the generator, whose state is taken after them),
each batch cloned (detached; a tensor that required grad comes back a leaf that still requires it). It is restored as completed futures; a DataLoader worker's copy drops it
(``prepare_worker_copy``). In a checkpoint (``dumps``) it is tensors plus a JSON description, no pickle.
"""

from __future__ import annotations

import copyreg
import threading
from concurrent.futures import Future

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase

from torchrl.data.replay_buffers.errors import TORCHRL_PHRASES, CheckpointError, torchrl_error


# -- the order of the draws (NOTE [prefetch epochs]) --------------------------------------------------------
class DrawTurn:
    """The place of one prefetch task in the order of sampler draws."""

    def __init__(self, previous: DrawTurn | None):
        self._previous = previous
        self._drawn = threading.Event()
        self.ran_out: bool | None = None  # whether this task's draw ended the sampler's epoch

    def wait_previous(self) -> None:
        """Blocks until the task submitted before this one has drawn (or finished, or was cancelled)."""
        previous, self._previous = self._previous, None
        if previous is not None:
            previous._drawn.wait()

    def release(self, *_) -> None:
        """Lets the next task draw; called after the draw, and again (no-op) when the task ends."""
        self._previous = None
        self._drawn.set()


_local = threading.local()


def current_turn() -> DrawTurn | None:
    """The turn of the prefetch task running in this thread, if any."""
    return getattr(_local, "turn", None)


def run_in_turn(turn: DrawTurn, sample, batch_size: int):
    """Runs ``sample(batch_size)`` as a prefetch task holding ``turn``."""
    _local.turn = turn
    try:
        return sample(batch_size)
    finally:
        _local.turn = None
        turn.release()


def submit_in_order(executor, sample, batch_size: int, previous: DrawTurn | None):
    """Submits a prefetch task; returns ``(future, turn)``. ``future.draw_turn`` is the turn."""
    turn = DrawTurn(previous)
    future = executor.submit(run_in_turn, turn, sample, batch_size)
    future.draw_turn = turn
    future.add_done_callback(turn.release)  # also on cancel: later turns never wait for a cancelled one
    return future, turn


# -- the queue as state ------------------------------------------------------------------------------------------
PREFETCH_STATE_VERSION = 1


class _Drawn:
    """The draw of a restored batch: whether it ended the sampler's epoch (see :class:`DrawTurn`)."""

    def __init__(self, ran_out):
        self.ran_out = ran_out


def _clone_tensor(x: torch.Tensor) -> torch.Tensor:
    out = x.detach().clone()
    return out.requires_grad_() if x.requires_grad else out  # a leaf that still requires grad


def _clone(value):
    """A copy of a queued batch, detached from its graph; tensors that required grad are leaves that still do."""
    if isinstance(value, TensorDictBase):
        out = value.detach().clone()
        for key in value.keys(include_nested=True, leaves_only=True):
            leaf = value.get(key)
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                out.set(key, out.get(key).requires_grad_())
        return out
    return pytree.tree_map(lambda x: _clone_tensor(x) if isinstance(x, torch.Tensor) else x, value)


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
    """Completed futures for the batches of ``state``; ``ValueError`` if it is malformed, and TorchRL's
    ``RuntimeError`` (:data:`~torchrl.data.replay_buffers.errors.TORCHRL_PHRASES` ``"prefetch_capacity"``) if it
    was saved by a buffer of another prefetch capacity."""
    if state is None:
        return []
    if not isinstance(state, dict) or state.get("version") != PREFETCH_STATE_VERSION:
        raise ValueError(
            f"Unsupported prefetch state (version {state.get('version') if isinstance(state, dict) else None!r}); "
            f"expected a dict with version {PREFETCH_STATE_VERSION}, as state_dict() returns."
        )
    queue = state.get("queue", ())
    if queue and state.get("capacity") != capacity:
        raise torchrl_error("prefetch_capacity", saved=state.get("capacity"), ours=capacity)
    ran_out = state.get("ran_out") or [None] * len(queue)
    futures = []
    for (data, info), ended in zip(queue, ran_out):
        future = Future()
        future.set_result((data, info))
        future.draw_turn = _Drawn(ended)
        futures.append(future)
    return futures


# -- pickling without the queue (datasets sent to workers) ----------------------------------------------------
def leaving_queue_out() -> bool:
    """Whether a buffer pickled in this thread now leaves its prefetched batches out (see :class:`WithoutQueue`)."""
    return getattr(_local, "leave_queue_out", False)


class WithoutQueue:
    """Pickles as ``buffer`` without its prefetched batches, and unpickles as that buffer (not as a wrapper).

    A :class:`~torchrl.data.ReplayBufferDataset` pickles its buffer through it: the copy a DataLoader worker
    gets never uses the batches its parent sampled ahead (``prepare_worker_copy`` turns prefetching off), so
    they are not sent. The buffer pickled on its own keeps them (TorchRL's behaviour).
    """

    __slots__ = ("buffer",)

    def __init__(self, buffer):
        self.buffer = buffer

    def __reduce_ex__(self, protocol):
        previous = leaving_queue_out()
        _local.leave_queue_out = True
        try:  # object.__reduce_ex__ takes the buffer's state (__getstate__) now, in this thread
            reduced = self.buffer.__reduce_ex__(protocol)
        finally:
            _local.leave_queue_out = previous
        if not isinstance(reduced, tuple):  # pickled by name (a global): as itself
            return (_same, (self.buffer,))
        if reduced and reduced[0] is copyreg.__newobj__:
            # pickle refuses __newobj__ for an object of another class (this wrapper): same call, another name
            return (_new_object, *reduced[1:])
        return reduced


def _same(obj):
    return obj


def _new_object(cls, *args):
    """``cls.__new__(cls, *args)``: what ``copyreg.__newobj__`` does, for :class:`WithoutQueue`."""
    return cls.__new__(cls, *args)


# -- the checkpoint part (dumps/loads): tensors plus a JSON description, no pickle --------------------------------
_JSON_SCALARS = (type(None), bool, int, float, str)


def _flatten(value, prefix: str, tensors: dict, ctx) -> dict:
    if isinstance(value, TensorDictBase):
        keys = list(value.keys(include_nested=True, leaves_only=True))
        names = []
        for i, key in enumerate(keys):
            name = ctx.name(f"{prefix}/{i}")
            tensors[name] = value.get(key).detach().contiguous()
            names.append(name)
        paths = [[key] if isinstance(key, str) else list(key) for key in keys]
        grad = [name for name, key in zip(names, keys) if value.get(key).requires_grad]
        return {"kind": "tensordict", "batch_size": list(value.batch_size), "keys": paths, "tensors": names,
                "requires_grad": grad}
    leaves, spec = pytree.tree_flatten(value)
    out = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            name = ctx.name(f"{prefix}/{i}")
            tensors[name] = leaf.detach().contiguous()
            out.append({"tensor": name, "requires_grad": True} if leaf.requires_grad else {"tensor": name})
        elif isinstance(leaf, _JSON_SCALARS):
            out.append({"value": leaf})
        else:
            raise TypeError(f"Cannot save a prefetched batch holding a {type(leaf).__name__}.")
    return {"kind": "pytree", "spec": pytree.treespec_dumps(spec), "leaves": out}


def _loaded(tensor: torch.Tensor, requires_grad) -> torch.Tensor:
    out = tensor.clone()
    return out.requires_grad_() if requires_grad is True else out


def _unflatten(desc: dict, tensors):
    if desc["kind"] == "tensordict":
        td = TensorDict(batch_size=desc["batch_size"])
        grad = set(desc.get("requires_grad", ()))
        for path, name in zip(desc["keys"], desc["tensors"]):
            td.set(tuple(path), _loaded(tensors[name], name in grad))
        return td
    leaves = [
        _loaded(tensors[leaf["tensor"]], leaf.get("requires_grad")) if "tensor" in leaf else leaf["value"]
        for leaf in desc["leaves"]
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
    except TORCHRL_PHRASES["prefetch_capacity"].type:
        raise  # TorchRL's RuntimeError: the checkpoint is sound, the buffer's capacity differs
    except ValueError as err:
        raise CheckpointError(f"The checkpoint {where!r}: {err} Nothing was loaded.") from None
