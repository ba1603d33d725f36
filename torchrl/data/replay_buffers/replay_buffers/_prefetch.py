"""A buffer's prefetch stage: :class:`Prefetcher`, which samples batches ahead in a thread pool, in order, and
keeps the batches it sampled ahead as state.

``ReplayBuffer(prefetch=k)`` samples ``k`` batches ahead. Two things follow, both here:

NOTE [prefetch epochs]: prefetch tasks run in a thread pool, so without care they draw from the sampler in
any order, and the sampler's live ``ran_out`` flag says nothing about the batch the consumer is given: a
task may already have started the next epoch (and reset the flag) when the epoch's last batch is returned.
Each prefetch task therefore holds a :class:`DrawTurn`: it draws its indices only after the task submitted
before it has drawn, and records whether its own draw ended the sampler's epoch (the buffer's draw reads the
turn of its thread in :data:`DRAW_TURNS`). ``ReplayBuffer.__iter__`` stops on the batch whose draw ended the
epoch (:attr:`Prefetcher.epoch_ended`). Batches drawn after it stay queued for the next epoch.

The queue as state: as in TorchRL, the batches a prefetching buffer has sampled ahead but not returned yet are
part of its state, so a restored buffer returns the same next batches as the original one. The state is
``{"version": 1, "capacity": prefetch, "queue": ((data, info), ...), "ran_out": [...]}``, taken after the tasks
in flight have finished (their draws moved the sampler and the generator, whose state is taken after them),
each batch cloned (detached; a tensor that required grad comes back a leaf that still requires it). It is restored as completed futures; a DataLoader worker's copy drops it
(``prepare_worker_copy``). In a checkpoint (``dumps``) it is tensors plus a JSON description, no pickle.
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDict, TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers.errors import CheckpointError, ValueRuntimeError
from torchrl.data.replay_buffers.replay_buffers._readiness import check_wait_args

PREFETCH_CAPACITY = TorchRLPhrase(
    ValueRuntimeError,
    "prefetch queue with capacity {saved}",
    "The state holds a prefetch queue with capacity {saved}; this buffer prefetches {ours}. Build the buffer "
    "with prefetch={saved} to load it. Nothing was loaded.",
)


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


#: ``DRAW_TURNS.turn``: the :class:`DrawTurn` of the draw running in this thread (a prefetch task, or the draw the
#: prefetcher makes at once), absent otherwise. A buffer's draw reads it with ``getattr(DRAW_TURNS, "turn", None)``,
#: waits for the turn before it (``wait_previous``), records ``ran_out`` and releases it.
DRAW_TURNS = threading.local()
_local = threading.local()  # leave_queue_out: see WithoutQueue


def _run_in_turn(turn: DrawTurn, sample, batch_size: int):
    """Runs ``sample(batch_size)`` holding ``turn``."""
    DRAW_TURNS.turn = turn
    try:
        return sample(batch_size)
    finally:
        DRAW_TURNS.turn = None
        turn.release()


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


def _capture(queue, capacity: int) -> dict | None:
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


def _restore(state, capacity: int) -> list:
    """Completed futures for the batches of ``state``; ``ValueError`` if it is malformed, and TorchRL's
    ``RuntimeError`` (:data:`PREFETCH_CAPACITY`) if it was saved by a buffer of another prefetch capacity."""
    if state is None:
        return []
    if not isinstance(state, dict) or state.get("version") != PREFETCH_STATE_VERSION:
        raise ValueError(
            f"Unsupported prefetch state (version {state.get('version') if isinstance(state, dict) else None!r}); "
            f"expected a dict with version {PREFETCH_STATE_VERSION}, as state_dict() returns."
        )
    queue = state.get("queue", ())
    if queue and state.get("capacity") != capacity:
        raise PREFETCH_CAPACITY.error(saved=state.get("capacity"), ours=capacity)
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


def _to_part(state: dict | None, ctx) -> tuple[dict, dict | None]:
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


def _from_part(doc: dict | None, tensors) -> dict | None:
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


class Prefetcher:
    """The prefetch stage of a buffer: up to ``capacity`` batches of ``batch_size`` sampled ahead in a thread pool,
    in order (NOTE [prefetch epochs]), and returned first.

    :meth:`draw` takes the arguments of :meth:`FlowControl.draw
    <torchrl.data.replay_buffers.replay_buffers._readiness.FlowControl.draw>` and stands in front of it: a draw of
    another batch size, or of a prefetcher of capacity 0, goes to ``flow.draw`` directly; otherwise the next
    queued batch is returned (drawn through ``flow`` by its task, when it was queued: counted, and reserved from
    a rate limiter, which queues a task only when it permits the batch at once), or one is drawn now when the
    queue is empty, and the queue is topped up. The state (:meth:`state_dict`, the checkpoint part, pickling)
    is the queue of batches sampled ahead (module docstring); the lock, the thread pool and the futures are
    rebuilt in every copy.

    Args:
        capacity (int): how many batches to sample ahead (0: none).
        batch_size (int, optional): the batch size sampled ahead (the buffer's ``batch_size``).
        flow (FlowControl): the flow control every draw goes through.

    Attributes:
        lock: held while the queue changes; hold it (:meth:`paused`) around anything a prefetch task must not see.
        queue: the futures of the batches sampled ahead, oldest first.
        executor: the thread pool (``None`` for capacity 0).
        epoch_ended: whether the draw of the batch :meth:`draw` returned last ended the sampler's epoch
            (``None``: not known, read the sampler's ``ran_out``).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
        >>> _ = rb.extend(torch.arange(10))
        >>> rb.sample().shape, rb.stats()["prefetch_queue_size"]
        (torch.Size([2]), 2)
    """

    def __init__(self, capacity: int, batch_size: int | None, flow) -> None:
        self.capacity = int(capacity or 0)
        self.batch_size = batch_size
        self.flow = flow
        self._make_runtime()

    def _make_runtime(self) -> None:
        self.lock = threading.RLock()
        self.queue: collections.deque = collections.deque()
        self.executor = ThreadPoolExecutor(max_workers=self.capacity) if self.capacity else None
        self.last_turn: DrawTurn | None = None
        self.epoch_ended: bool | None = None

    def draw(self, batch_size: int, wait, timeout, cancel, draw_fn):
        """The next batch of ``batch_size``: the queue's head, or ``flow.draw(...)`` now; then tops the queue up."""
        flow = self.flow
        if batch_size != self.batch_size or not self.capacity:
            return flow.draw(batch_size, wait, timeout, cancel, draw_fn)
        if wait is not False or timeout is not None or cancel is not None:
            check_wait_args(wait, timeout, cancel)  # before a queued batch is handed out
        with self.lock:
            queue = self.queue
            if queue:
                future = queue.popleft()
                result = future.result()
                turn = getattr(future, "draw_turn", None)
                self.epoch_ended = None if turn is None else turn.ran_out
            else:
                turn = DrawTurn(None)  # the draw records whether it ended the epoch
                DRAW_TURNS.turn = turn
                try:
                    result = flow.draw(batch_size, wait, timeout, cancel, draw_fn)
                finally:
                    DRAW_TURNS.turn = None
                    turn.release()
                self.epoch_ended = turn.ran_out
            limiter = flow.limiter
            previous = self.last_turn
            while len(queue) < self.capacity:
                if limiter is None:
                    task = functools.partial(flow.draw, wait=False, timeout=None, cancel=None, draw_fn=draw_fn)
                elif flow.try_reserve_sample(batch_size):  # the reservation is the task's
                    task = functools.partial(flow.reserved_draw, draw_fn)
                else:
                    break
                turn = DrawTurn(previous)
                future = self.executor.submit(_run_in_turn, turn, task, batch_size)
                future.draw_turn = turn
                future.add_done_callback(turn.release)  # also on cancel: later turns never wait for a cancelled one
                if limiter is not None:  # a task cancelled before it ran gives its reservation back
                    future.add_done_callback(flow.release_if_cancelled(batch_size))
                queue.append(future)
                previous = turn
            self.last_turn = previous
        return result

    def wait(self) -> None:
        """Waits for the tasks in flight (call it holding :attr:`lock`, before a lock those tasks take)."""
        for future in list(self.queue):
            future.exception()

    @contextlib.contextmanager
    def paused(self, *, clear: bool = False):
        """Holds the lock once the tasks in flight finished (no new one starts); ``clear=True`` drops the queue
        (sampled from a component being replaced)."""
        with self.lock:
            self.wait()
            if clear:
                self.queue.clear()
            yield

    def clear(self) -> None:
        """Drops the batches sampled ahead."""
        with self.lock:
            self.queue.clear()

    def stop(self, timeout: float | None) -> None:
        """Drops the queue and stops sampling ahead: waits up to ``timeout`` seconds for the tasks in flight and
        shuts the thread pool down (the tasks not started are cancelled)."""
        with self.lock:
            pending, executor = list(self.queue), self.executor
            self.queue.clear()
            self.executor, self.capacity = None, 0
        if pending:
            wait_futures(pending, timeout=timeout)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def disable(self) -> None:
        """Capacity 0, with a fresh lock and an empty queue (a DataLoader worker's copy of the buffer)."""
        self.capacity = 0
        self._make_runtime()

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict | None:
        """The queue as state (module docstring), after the tasks in flight; ``None`` when it is empty."""
        with self.lock:
            return _capture(self.queue, self.capacity)

    def checked(self, state) -> list:
        """The queue :meth:`state_dict` describes, as completed futures, checked against this capacity
        (``ValueError``; TorchRL's ``RuntimeError`` for another capacity), loading nothing."""
        return _restore(state, self.capacity)

    def replace(self, futures: list) -> None:
        """Replaces the queue by ``futures`` (of :meth:`checked`)."""
        with self.lock:
            self.queue.clear()
            self.queue.extend(futures)

    def load_state_dict(self, state) -> None:
        """Restores :meth:`state_dict` (checked first: a refused state leaves the queue unchanged)."""
        self.replace(self.checked(state))

    def checkpoint_part(self, ctx) -> tuple[dict, dict | None]:
        """``(tensors, JSON description)`` of the queue, for the buffer's checkpoint part (``None``: empty)."""
        return _to_part(self.state_dict(), ctx)

    def check_checkpoint_part(self, doc: dict | None, tensors, where: str) -> None:
        """``CheckpointError`` (nothing loaded) if the saved batches cannot be restored here."""
        try:
            self.checked(_from_part(doc, tensors))
        except PREFETCH_CAPACITY.type:
            raise  # TorchRL's RuntimeError: the checkpoint is sound, the buffer's capacity differs
        except ValueError as err:
            raise CheckpointError(f"The checkpoint {where!r}: {err} Nothing was loaded.") from None

    def load_checkpoint_part(self, doc: dict | None, tensors) -> None:
        """Replaces the queue by the batches of a checked part."""
        self.replace(self.checked(_from_part(doc, tensors)))

    def to_pickle(self) -> Prefetcher:
        """What the buffer pickles in its place, now: itself, or, for a process being started (DataLoader
        workers) or a dataset's copy (:class:`WithoutQueue`), a prefetcher of the same capacity without the
        batches sampled ahead."""
        if self.capacity and (is_spawning() or leaving_queue_out()):
            return Prefetcher(self.capacity, self.batch_size, self.flow)
        return self

    def __getstate__(self) -> dict:
        return {"capacity": self.capacity, "batch_size": self.batch_size, "flow": self.flow,
                "queue": self.state_dict()}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        self.capacity, self.batch_size, self.flow = state["capacity"], state["batch_size"], state["flow"]
        self._make_runtime()
        self.queue.extend(_restore(state["queue"], self.capacity))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, batch_size={self.batch_size}, queued={len(self.queue)})"
