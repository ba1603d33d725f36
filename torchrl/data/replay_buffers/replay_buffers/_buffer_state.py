"""What a replay buffer saves and restores: ``state_dict``, pickling and its checkpoint part.

A mixin of :class:`~torchrl.data.ReplayBuffer`, kept apart from the read and write paths. The buffer's own
fields are combined with its components' parts (``replay_buffers/_checkpoint.py``); the batches already
prefetched travel with the state, as in TorchRL (``_prefetch_state.py``), except to a process being spawned.
"""

from __future__ import annotations

from typing import Any

import torchrl.data.replay_buffers.replay_buffers._prefetch_state as _prefetch_state
from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
from torchrl.data.replay_buffers._checkpoint.parts import PartContext
from torchrl.data.replay_buffers._shared.counters import is_spawning
from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
from torchrl.data.replay_buffers.replay_buffers._checkpoint import (
    buffer_part,
    check_buffer_part,
    load_buffer_part,
)


class BufferStateMixin:
    """State, pickling and checkpoint methods of :class:`~torchrl.data.ReplayBuffer`."""

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of every component; as in TorchRL, ``"_prefetch_state"`` holds the batches sampled ahead
        (``prefetch``) and not returned yet, so that a restored buffer returns the same next batches."""
        with self._futures_lock:  # after the tasks in flight: their draws moved the sampler and the generator
            prefetched = _prefetch_state.capture(self._prefetch_queue, self._prefetch)
        rng = self._rng
        return {
            "_prefetch_state": prefetched,
            "_storage": self._storage.state_dict(),
            "_sampler": self._sampler.state_dict(),
            "_writer": self._writer.state_dict(),
            "_transforms": self._transform.state_dict(),
            "_batch_size": self._batch_size,
            "_rng": generator_to_state(rng),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        prefetched = _prefetch_state.restore(state_dict.get("_prefetch_state"), self._prefetch)
        with self._futures_lock:
            self._prefetch_queue.clear()
        with self._replay_lock, self._storage.write_lock:
            self._storage.load_state_dict(state_dict["_storage"])
            self._sampler.load_state_dict(state_dict["_sampler"])
            self._writer.load_state_dict(state_dict["_writer"])
            self._transform.load_state_dict(state_dict["_transforms"])
            self._batch_size = state_dict.get("_batch_size", self._batch_size)
            rng = generator_from_state(state_dict.get("_rng"))
            if rng is not None:
                self.set_rng(rng)
        with self._futures_lock:  # once the components hold the state the batches were drawn from
            self._prefetch_queue.extend(prefetched)

    def __getstate__(self):
        prefetched = None
        if not is_spawning():  # a process being started (DataLoader workers) never gets the parent's batches
            with self._futures_lock:
                prefetched = _prefetch_state.capture(self._prefetch_queue, self._prefetch)
        state = self.__dict__.copy()
        for name in ("_replay_lock", "_futures_lock", "_prefetch_queue", "_prefetch_executor", "_last_draw_turn"):
            state.pop(name, None)
        state["_rng"] = generator_to_state(self._rng, as_bytes=True)
        if prefetched is not None:
            state["_prefetch_state"] = prefetched
        return state

    def __setstate__(self, state):
        rng = generator_from_state(state.pop("_rng", None))
        prefetched = state.pop("_prefetch_state", None)
        self.__dict__.update(state)
        self._make_runtime_state()
        self._prefetch_queue.extend(_prefetch_state.restore(prefetched, self._prefetch))
        self._storage.attach(self)
        self._writer.register_storage(self._storage)
        self.set_rng(rng)

    # -- persistence and adapters -------------------------------------------------------------------------------
    def dumps(self, path, **kwargs) -> None:
        """Saves the buffer (storage, writer, sampler, transforms, generator) to the directory ``path``.

        The format is memory-mapped tensor files plus JSON metadata, without pickle, written atomically (a
        crash leaves the previous checkpoint at ``path``); see :mod:`torchrl.data.replay_buffers.checkpointers`.
        Keyword arguments (``fsync=True``, ``progress=None``) go to
        :func:`~torchrl.data.replay_buffers.checkpointers.dump_component`.

        Examples:
            >>> import tempfile, torch
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
            >>> _ = rb.extend(torch.arange(4))
            >>> with tempfile.TemporaryDirectory() as d:
            ...     rb.dumps(d + "/ckpt")
            ...     fresh = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
            ...     fresh.loads(d + "/ckpt")
            >>> fresh[:]
            tensor([0, 1, 2, 3])
        """
        with self._futures_lock:
            _prefetch_state.wait(self._prefetch_queue)  # before the replay lock, which prefetch tasks take
            with self._replay_lock:
                dump_component(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a buffer saved by :meth:`dumps` into this one (built with the same configuration)."""
        with self._futures_lock, self._replay_lock, self._storage.write_lock:
            self._prefetch_queue.clear()
            load_component(self, path)

    dump = dumps
    save = dumps
    load = loads

    # -- checkpoint part (the protocol of torchrl.data.replay_buffers._checkpoint.parts) ----------------------------------
    checkpoint_role = "replay buffer"

    def _checkpoint_children(self) -> dict[str, Any]:
        return {"storage": self._storage, "sampler": self._sampler, "writer": self._writer, "transforms": self._transform}

    def checkpoint_part(self, ctx: PartContext) -> tuple[dict, dict]:
        with self._futures_lock:  # the prefetched batches, as in TorchRL (JSON + tensors, see _prefetch_state)
            prefetch_tensors, prefetch = _prefetch_state.to_part(
                _prefetch_state.capture(self._prefetch_queue, self._prefetch), ctx
            )
        tensors, doc = buffer_part(self, self._checkpoint_children(), self._batch_size, self._rng, ctx)
        if prefetch is not None:
            tensors.update(prefetch_tensors)
            doc["prefetch"] = prefetch
        return tensors, doc

    def check_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        check_buffer_part(self, self._checkpoint_children(), doc, tensors, ctx)
        _prefetch_state.check_part(doc.get("prefetch"), tensors, self._prefetch, ctx.path)

    def load_checkpoint_part(self, doc: dict, tensors, ctx: PartContext) -> None:
        self._batch_size, rng = load_buffer_part(self._checkpoint_children(), doc, tensors, ctx)
        if rng is not None:
            self.set_rng(rng)
        prefetched = _prefetch_state.from_part(doc.get("prefetch"), tensors)
        self._prefetch_queue.extend(_prefetch_state.restore(prefetched, self._prefetch))
