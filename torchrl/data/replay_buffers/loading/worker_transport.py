"""How DataLoader workers send batches to the main process: the ``transport`` of a dataset.

NOTE [worker transport]: a dataset (``StorageDataset``, ``ReplayBufferDataset``) owns its transport and applies
it, through :func:`prepare_batch`, to each batch it hands to the DataLoader; ``tensordict_collate`` is a pure
function and knows nothing of it. Three transports exist:

- ``"torch"``: torch's own. Each tensor of a batch moves to a new shared-memory segment and its file descriptor
  travels to the main process.
- ``"consolidated"``: the dataset copies a dense TensorDict batch into ONE new shared-memory segment
  (``TensorDict.consolidate(share_memory=True)``), which tensordict's pickler sends as one storage.
- ``"ring"``: each worker keeps a ring of a few batch-sized slots in one anonymous shared-memory file
  (``memfd_create``: no name in ``/dev/shm`` or anywhere); a batch is copied into a free slot when the worker's
  queue pickles it, and travels as a small message; unpickling the message in the main process copies the slot
  out into ordinary tensors and frees the slot. Nothing is allocated per batch once the ring exists.

``benchmarks/dataloader_workers.py`` measures the three side by side; the default is the fastest.

The ring is installed only where the dataset runs in a multiprocessing worker (``get_worker_info()`` is set and
its ``worker_method``, where torch has it, is ``"multiprocessing"``): thread workers pickle nothing and get the
batch itself. The dataset marks each batch it returns; the worker registers, through the public
``multiprocessing.reduction.ForkingPickler.register``, a reducer for :class:`~tensordict.TensorDict` that sends
a marked batch through the ring and passes anything else to the reducer that was registered before (tensordict's
own). So a collate function that returns the dataset's batch (``tensordict_collate``, a lambda or
``functools.partial`` around it) keeps the ring, and one that builds a new object falls back to torch's
transport. Correctness never depends on timing: a slot is reused only after the main process copied it out (a
state word per slot in the same file); a batch the ring cannot carry (another structure, non-CPU, lazily stacked
or non-tensor data, every slot in flight) travels torch's way, and so does every batch where ``memfd_create`` or
``/proc`` is missing. A random token in the ring's header, carried by each message, rejects a descriptor path
whose pid or fd number was reused. The kernel frees a ring once the worker's descriptor and every mapping of it
are gone, whatever happens to either process (normal exit, SIGTERM, SIGKILL).
"""

from __future__ import annotations

import collections
import io
import math
import os
import threading
import warnings
import weakref
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import get_worker_info

from torchrl.data.replay_buffers.errors import RingGoneError

__all__ = ["TRANSPORTS", "DEFAULT_TRANSPORT", "check_transport", "in_process_worker", "prepare_batch"]

TRANSPORTS = ("ring", "consolidated", "torch")
DEFAULT_TRANSPORT = "ring"
RING_SLOTS = 6
_HEADER_BYTES = 64  # the ring's token (int64), padded
_STATE_BYTES = 64  # one int64 state word per slot, padded
_ALIGN = 64
_PENDING = 16  # marked batches (weak references) a worker remembers until its queue pickles them


def check_transport(transport) -> str:
    """``transport`` if it names a transport, else a ``ValueError`` that lists them."""
    if not isinstance(transport, str) or transport not in TRANSPORTS:
        raise ValueError(
            f"`transport` must be one of {', '.join(map(repr, TRANSPORTS))}, got {transport!r}. "
            f"Use transport='torch' for torch's own per-tensor shared memory."
        )
    return transport


def in_process_worker() -> bool:
    """Whether this code runs in a DataLoader worker *process* (not the main process, not a thread worker)."""
    info = get_worker_info()
    return info is not None and getattr(info, "worker_method", "multiprocessing") == "multiprocessing"


def prepare_batch(batch, transport: str):
    """What a dataset hands to the DataLoader for ``batch`` under ``transport`` (see the module docstring).

    Outside a worker process, and for ``"torch"``, ``batch`` itself; for ``"consolidated"``, a dense CPU
    TensorDict consolidated into one shared segment; for ``"ring"``, ``batch`` itself, marked for the ring.
    """
    if transport == "torch" or not in_process_worker() or _leaves(batch) is None:
        return batch
    if transport == "consolidated":
        return batch.consolidate(share_memory=True)
    _SENDER.mark(batch)
    return batch


def _leaves(batch) -> list[tuple[object, torch.Tensor]] | None:
    """``[(key, tensor)]`` of a dense CPU TensorDict, or ``None`` when no transport here can carry it."""
    if type(batch) is not TensorDict:
        return None
    if any(isinstance(v, (NonTensorData, NonTensorStack)) for v in batch.values(include_nested=True)):
        return None
    items = list(batch.items(include_nested=True, leaves_only=True))
    for _, value in items:
        if type(value) is not torch.Tensor or value.device.type != "cpu" or value.is_sparse:
            return None
    return items


class BatchRing:
    """A worker's ring of batch slots in one shared-memory file (see the module docstring)."""

    def __init__(self, layout: list[tuple[object, torch.dtype, tuple[int, ...], int]], slot_bytes: int,
                 batch_size: tuple[int, ...], slots: int = RING_SLOTS):
        self.layout = layout
        self.batch_size = batch_size
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.total = _HEADER_BYTES + _STATE_BYTES * slots + slot_bytes * slots
        if not hasattr(os, "memfd_create"):
            raise OSError("memfd_create is not available on this platform")
        fd = os.memfd_create("torchrl-batch-ring", os.MFD_CLOEXEC)  # no name: nothing to remove, ever
        weakref.finalize(self, os.close, fd)  # open while the ring lives: the receiver maps it through /proc
        os.ftruncate(fd, self.total)
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        self.token = int.from_bytes(os.urandom(8), "little") >> 1
        self.buffer = _open(self.path, self.total)  # through /proc like the receiver: fails here if it can't
        self.buffer[:_HEADER_BYTES].view(torch.int64)[0] = self.token
        self.state = _states(self.buffer, slots)
        self.cursor = 0

    @classmethod
    def for_batch(cls, batch) -> BatchRing | None:
        """A ring shaped for ``batch`` (a dense CPU TensorDict), or ``None`` for anything else."""
        items = _leaves(batch)
        if items is None:
            return None
        layout, offset = [], 0
        for key, tensor in items:
            layout.append((key, tensor.dtype, tuple(tensor.shape), offset))
            offset += -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN
        return cls(layout, max(offset, _ALIGN), tuple(batch.batch_size))

    def fits(self, items) -> bool:
        return len(items) == len(self.layout) and all(
            key == lkey and tensor.dtype == dtype and tuple(tensor.shape) == shape
            for (key, tensor), (lkey, dtype, shape, _) in zip(items, self.layout)
        )

    def put(self, batch) -> tuple | None:
        """The message for ``batch`` (the arguments of :func:`_receive`), or ``None`` if the ring cannot take it."""
        items = _leaves(batch)
        if items is None or not self.fits(items) or tuple(batch.batch_size) != self.batch_size:
            return None
        state = self.state
        for step in range(self.slots):
            slot = (self.cursor + step) % self.slots
            if int(state[slot]) == 0:
                break
        else:
            return None  # every slot still in flight: send this one the ordinary way
        base = _HEADER_BYTES + _STATE_BYTES * self.slots + slot * self.slot_bytes
        for (_, tensor), (_, dtype, shape, offset) in zip(items, self.layout):
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes:
                self.buffer[base + offset : base + offset + nbytes].view(dtype).view(shape).copy_(tensor)
        state[slot] = 1
        self.cursor = (slot + 1) % self.slots
        return (self.path, self.token, self.total, self.slots, slot, self.slot_bytes, self.layout, self.batch_size)


def _states(buffer: torch.Tensor, slots: int) -> torch.Tensor:
    """The state word of each slot (0: free, 1: in flight), a view into the ring."""
    words = buffer[_HEADER_BYTES : _HEADER_BYTES + _STATE_BYTES * slots].view(torch.int64)
    return words[:: _STATE_BYTES // 8]


def _open(path: str, total: int) -> torch.Tensor:
    # numpy's "r+" never creates the file: a missing ring must not read back as zeros
    return torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="r+", shape=(total,)))


class _RingSender:
    """A worker process's side: the batches its dataset marked, its ring, the reducer that uses them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pending: collections.deque = collections.deque(maxlen=_PENDING)
        self.ring: BatchRing | None = None
        self.fallback = None
        self.installed = False
        self.failed = False

    def mark(self, batch) -> None:
        with self.lock:
            if self.failed:
                return
            if not self.installed:
                # the reducer registered before ours (tensordict's), read through the public dispatch table
                self.fallback = ForkingPickler(io.BytesIO()).dispatch_table.get(TensorDict)
                ForkingPickler.register(TensorDict, self.reduce)
                self.installed = True
            self.pending.append(weakref.ref(batch))  # weak: a batch the collate replaced is freed at once

    def take(self, batch) -> bool:
        with self.lock:
            for i, marked in enumerate(self.pending):
                if marked() is batch:
                    del self.pending[i]
                    return True
        return False

    def reduce(self, batch):
        """The worker queue's reducer for TensorDicts: a ring message for a marked batch, else the fallback."""
        message = self.send(batch) if self.pending and self.take(batch) else None
        if message is not None:
            return _receive, message
        if self.fallback is not None:
            return self.fallback(batch)
        return batch.__reduce_ex__(2)

    def send(self, batch) -> tuple | None:
        # runs in the queue's feeder thread, where an exception would drop the batch: never raise
        try:
            if self.ring is None:
                self.ring = BatchRing.for_batch(batch)
            return None if self.ring is None else self.ring.put(batch)
        except Exception as err:  # noqa: BLE001 - no shared memory here: torch's transport from now on
            self.failed = True
            warnings.warn(f"DataLoader batches fall back to torch's transport: the ring failed ({err}).",
                          RuntimeWarning, stacklevel=2)
            return None


_SENDER = _RingSender()

# the main process's side: the rings it received from, by path: (token, mapping); counters for tests
_mapped: dict[str, tuple[int, torch.Tensor]] = {}
_mapped_lock = threading.Lock()
_counts = {"maps": 0, "received": 0}


def transport_stats() -> dict[str, int]:
    """``rings`` mapped now, ``maps`` made and batches ``received`` through rings by this process."""
    with _mapped_lock:
        return {"rings": len(_mapped), **_counts}


def _map(path: str, token: int, total: int) -> torch.Tensor:
    with _mapped_lock:
        entry = _mapped.get(path)
        if entry is not None and entry[0] == token:
            return entry[1]
        sender = path.split("/")[2] if path.startswith("/proc/") else None  # /proc/<worker pid>/fd/<n>
        gone = RingGoneError(
            f"A DataLoader batch arrived after the shared-memory ring it was written to ({path}) was "
            f"removed: the worker that sent it has exited (DataLoader worker{f' pid {sender}' if sender else ''}: "
            f"killed, or ended by its own error, printed above). transport='torch' sends batches without a ring."
        )
        try:
            buffer = _open(path, total)
        except (FileNotFoundError, ValueError, PermissionError):  # no such fd, or another file there now
            raise gone from None
        if int(buffer[:_HEADER_BYTES].view(torch.int64)[0]) != token:  # the pid or fd number was reused
            raise gone
        for stale in [p for p in _mapped if p != path and not os.path.exists(p)]:  # rings of exited workers
            del _mapped[stale]
        _mapped[path] = (token, buffer)
        _counts["maps"] += 1
        return buffer


class _LostBatch:
    """What a ring message unpickles to outside the main thread when its ring is gone.

    torch unpickles batches in its pin-memory thread when ``pin_memory=True``; an exception there would end the
    thread ("Pin memory thread exited unexpectedly"). This object instead raises the error when torch pins it
    (torch then re-raises it in the main thread) or when anything else touches it.
    """

    __slots__ = ("error",)

    def __init__(self, error: RuntimeError):
        self.error = error

    def pin_memory(self, *args, **kwargs):
        raise self.error

    def __getattr__(self, name):
        raise self.error

    def __getitem__(self, key):
        raise self.error

    def __iter__(self):
        raise self.error

    def __len__(self):
        raise self.error


def _receive(path, token, total, slots, slot, slot_bytes, layout, batch_size):
    """Runs in the receiving process: copies a slot out into ordinary tensors and frees the slot."""
    try:
        buffer = _map(path, token, total)
    except RingGoneError as err:
        if threading.current_thread() is threading.main_thread():
            raise
        return _LostBatch(err)
    base = _HEADER_BYTES + _STATE_BYTES * slots + slot * slot_bytes
    out = {}
    for key, dtype, shape, offset in layout:
        target = torch.empty(shape, dtype=dtype)
        nbytes = math.prod(shape) * target.element_size()
        if nbytes:
            # numpy's copy is single-threaded: a parallel torch copy in the main process would wait for a core
            # that the workers keep busy (the ~8 ms stall of multi-threaded ops on a loaded machine)
            np.copyto(target.view(-1).view(torch.uint8).numpy(), buffer[base + offset : base + offset + nbytes].numpy())
        out[key] = target
    _states(buffer, slots)[slot] = 0
    with _mapped_lock:
        _counts["received"] += 1
    return TensorDict(out, batch_size=batch_size)
