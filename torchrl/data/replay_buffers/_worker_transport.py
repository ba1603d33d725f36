"""Sending DataLoader batches from worker processes without a shared-memory allocation per batch.

torch sends every tensor of a worker's batch by moving its storage to a NEW shared-memory segment and
passing a file descriptor to the main process: on a 2-core machine that costs ~0.5 ms per tensor (allocation,
page faults, a socket round trip for the descriptor), as much as a quarter of the work of producing a batch
of images. Here each worker instead keeps a ring of a few batch-sized slots in one anonymous shared-memory
file (``memfd_create``: it has no name, in ``/dev/shm`` or anywhere), copies each batch into a free slot and
sends a small :class:`_RingBatch` message; when the main process unpickles the message it maps the ring through
the worker's descriptor (``/proc/<worker pid>/fd/<fd>``), copies the slot out into ordinary tensors and marks
the slot free again.

Correctness does not depend on timing: a slot is reused only after the main process copied it out (a state
word per slot in the same file), and a batch that does not fit the ring (another structure, non-CPU or
lazily stacked data, or every slot still in flight) is returned as is and travels the ordinary way. A random
token written in the ring's header and carried by each message rejects a descriptor path whose pid or fd
number was reused. Nothing is left behind whatever happens to either process (normal exit, SIGTERM, SIGKILL
before or after the first batch was read): the kernel frees the ring's memory once the worker's descriptor and
every mapping of it are gone. Where ``memfd_create`` or ``/proc`` is missing, batches travel the ordinary way.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import weakref

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

RING_SLOTS = 6
_HEADER_BYTES = 64  # the ring's token (int64), padded
_STATE_BYTES = 64  # one int64 state word per slot, padded
_ALIGN = 64
_FETCH_MODULE = "torch.utils.data._utils.fetch"
_MAX_MAPPED = 16


def called_by_dataloader_fetcher(depth: int = 2) -> bool:
    """Whether the caller's caller is torch's DataLoader fetcher (its ``fetch`` calls ``collate_fn``)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:  # pragma: no cover
        return False
    return frame.f_code.co_name == "fetch" and frame.f_globals.get("__name__") == _FETCH_MODULE


def _leaves(batch) -> list[tuple[object, torch.Tensor]] | None:
    """``[(key, tensor)]`` of a dense CPU batch, or ``None`` when the ring cannot carry it."""
    if isinstance(batch, torch.Tensor):
        items = [(None, batch)]
    elif type(batch) is TensorDict:
        if any(isinstance(v, (NonTensorData, NonTensorStack)) for v in batch.values(include_nested=True)):
            return None
        items = list(batch.items(include_nested=True, leaves_only=True))
    else:
        return None
    for _, tensor in items:
        if type(tensor) is not torch.Tensor or tensor.device.type != "cpu" or tensor.is_sparse:
            return None
    return items


class BatchRing:
    """A worker's ring of batch slots in one shared-memory file (see the module docstring)."""

    def __init__(self, layout: list[tuple[object, torch.dtype, tuple[int, ...], int]], slot_bytes: int,
                 batch_size: tuple[int, ...] | None, slots: int = RING_SLOTS):
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
        items = _leaves(batch)
        if items is None:
            return None
        layout, offset = [], 0
        for key, tensor in items:
            layout.append((key, tensor.dtype, tuple(tensor.shape), offset))
            offset += -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN
        batch_size = None if isinstance(batch, torch.Tensor) else tuple(batch.batch_size)
        return cls(layout, max(offset, _ALIGN), batch_size)

    def fits(self, items) -> bool:
        return len(items) == len(self.layout) and all(
            key == lkey and tensor.dtype == dtype and tuple(tensor.shape) == shape
            for (key, tensor), (lkey, dtype, shape, _) in zip(items, self.layout)
        )

    def put(self, batch):
        """A :class:`_RingBatch` message for ``batch``, or ``None`` if it cannot use the ring now."""
        items = _leaves(batch)
        if items is None or not self.fits(items):
            return None
        if isinstance(batch, TensorDictBase) and tuple(batch.batch_size) != self.batch_size:
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
                dst = self.buffer[base + offset : base + offset + nbytes].view(dtype).view(shape)
                dst.copy_(tensor)
        state[slot] = 1
        self.cursor = (slot + 1) % self.slots
        return _RingBatch(self.path, self.token, self.total, self.slots, slot, self.slot_bytes, self.layout,
                          self.batch_size)


def _states(buffer: torch.Tensor, slots: int) -> torch.Tensor:
    """The state word of each slot (0: free, 1: in flight), a view into the ring."""
    words = buffer[_HEADER_BYTES : _HEADER_BYTES + _STATE_BYTES * slots].view(torch.int64)
    return words[:: _STATE_BYTES // 8]


def _open(path: str, total: int) -> torch.Tensor:
    # numpy's "r+" never creates the file: a missing ring must not read back as zeros
    return torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="r+", shape=(total,)))


# the rings this process received from, by path: (token, mapping)
_mapped: collections.OrderedDict[str, tuple[int, torch.Tensor]] = collections.OrderedDict()
_mapped_lock = threading.Lock()


def _map(path: str, token: int, total: int) -> torch.Tensor:
    with _mapped_lock:
        entry = _mapped.get(path)
        if entry is not None and entry[0] == token:
            _mapped.move_to_end(path)
            return entry[1]
        gone = RuntimeError(
            f"A DataLoader batch arrived after the shared-memory ring it was written to ({path}) was "
            f"removed: the worker that sent it has exited."
        )
        try:
            buffer = _open(path, total)
        except (FileNotFoundError, ValueError):  # no such fd, or another file of another size there now
            raise gone from None
        if int(buffer[:_HEADER_BYTES].view(torch.int64)[0]) != token:  # the pid or fd number was reused
            raise gone
        for stale in [p for p in _mapped if not os.path.exists(p)]:  # rings of workers that are gone
            del _mapped[stale]
        _mapped[path] = (token, buffer)
        while len(_mapped) > _MAX_MAPPED:
            _mapped.popitem(last=False)
        return buffer


def _receive(path, token, total, slots, slot, slot_bytes, layout, batch_size):
    """Runs in the receiving process: copies a slot out into ordinary tensors and frees the slot."""
    buffer = _map(path, token, total)
    base = _HEADER_BYTES + _STATE_BYTES * slots + slot * slot_bytes
    out = []
    for key, dtype, shape, offset in layout:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        target = torch.empty(shape, dtype=dtype)
        if nbytes:
            # numpy's copy is single-threaded: a parallel torch copy in the main process would wait for a core
            # that the workers keep busy (the ~8 ms stall of multi-threaded ops on a loaded machine)
            np.copyto(target.view(-1).view(torch.uint8).numpy(), buffer[base + offset : base + offset + nbytes].numpy())
        out.append((key, target))
    _states(buffer, slots)[slot] = 0
    if batch_size is None:
        return out[0][1]
    return TensorDict(dict(out), batch_size=batch_size)


class _RingBatch:
    """The message a worker sends for a batch in its ring; unpickling it yields the batch."""

    __slots__ = ("args",)

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return _receive, self.args


_worker_ring: BatchRing | None = None
_worker_ring_failed = False


def send_from_worker(batch):
    """In a DataLoader worker: the ring message for ``batch`` when the ring can carry it, else ``batch``."""
    global _worker_ring, _worker_ring_failed
    if _worker_ring_failed:
        return batch
    if _worker_ring is None:
        try:
            _worker_ring = BatchRing.for_batch(batch)
        except (OSError, RuntimeError):  # no shared memory here: keep torch's transport
            _worker_ring_failed = True
            return batch
        if _worker_ring is None:
            return batch
    message = _worker_ring.put(batch)
    return batch if message is None else message
