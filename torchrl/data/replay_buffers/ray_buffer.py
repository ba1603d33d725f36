"""A replay buffer hosted in a Ray actor: :class:`RayReplayBuffer`, its clients and its DataLoader dataset.

Data model. One Ray actor holds one replay buffer (any :class:`~torchrl.data.ReplayBuffer` class), built inside
the actor from constructors; its storage, sampler (priorities, epoch permutations), writer and transforms exist
there only. Every other object is a handle that sends method calls to that actor and gets results back by value:

- :class:`RayReplayBuffer` creates the actor and owns its lifecycle (``close()`` kills it and, if it started
  Ray, shuts Ray down);
- :class:`RayReplayBufferClient` (``rb.client()``, ``rb.clients(n)``, or a pickled ``rb``) has no lifecycle
  rights; it is picklable and finds the actor by name, joining the same cluster if its process is not connected
  yet. Collectors, learners and DataLoader workers hold clients;
- :class:`~torchrl.data.replay_buffers._ray.dataset.RayReplayBufferDataset` (``rb.as_dataset()``, in
  ``_ray/dataset.py``): each DataLoader worker draws raw batches from the actor and runs the buffer's transforms
  itself.

Ray is imported on first use only (``_ray/runtime.py``); the actor side is ``_ray/host.py``.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import types
import uuid
from typing import TYPE_CHECKING, Any

import torch

from torchrl._validation import check_bool, check_positive_int
from torchrl.data.replay_buffers._ray.dataset import RayReplayBufferDataset
from torchrl.data.replay_buffers._ray.host import CANCELLED, SELF, BufferHost, check_constructors
from torchrl.data.replay_buffers._ray.runtime import (
    RuntimeLease,
    check_not_forked,
    connect,
    dead_actor_error,
    import_ray,
    ray_shut_down_error,
)
from torchrl.data.replay_buffers._ray.sharded_buffer import (
    ShardedRayReplayBuffer,
    ShardedRayReplayBufferClient,
)
from torchrl.data.replay_buffers._ray.waiting import poll_until
from torchrl.data.replay_buffers._ray.wire import decode, decode_all
from torchrl.data.replay_buffers.distributed import DataParallelReplayBufferClient
from torchrl.data.replay_buffers.loading.worker_transport import DEFAULT_TRANSPORT
from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers._readiness import check_wait_args
from torchrl.data.replay_buffers.replay_buffers._service_backend import (
    TENSOR_CHANNEL_TRANSPORTS,
    check_service_options,
    register_service_backend,
)

if TYPE_CHECKING:  # annotations only: the forwarding methods have the hosted buffer's signatures
    from torchrl.data.replay_buffers.replay_buffers.conditional_update import ConditionalUpdateResult
    from torchrl.data.replay_buffers.samplers import Sampler
    from torchrl.data.replay_buffers.storages import Storage
    from torchrl.data.replay_buffers.writers import Writer

__all__ = ["RayReplayBuffer", "RayReplayBufferDataset", "ShardedRayReplayBuffer", "ShardedRayReplayBufferClient"]

#: ``ray.init`` keywords used when this process has not initialized Ray (``ray_init_config`` overrides them).
DEFAULT_RAY_INIT_CONFIG: dict[str, Any] = {"include_dashboard": False}
#: Options of the actor (``ray.remote(**remote_config)``; ``remote_config`` overrides them).
DEFAULT_REMOTE_CONFIG: dict[str, Any] = {"num_cpus": 1}
#: Seconds the constructor waits for the actor to start (it waits for free resources on the cluster first).
ACTOR_START_TIMEOUT: float = 300.0


def _to_cpu(value):
    """``value`` on the CPU when it is a tensor or a TensorDict on another device (the actor has no GPU)."""
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu" and hasattr(value, "cpu"):
        return value.cpu()
    return value


class PendingBatches:
    """Batches requested from the actor by :meth:`RayReplayBufferClient.request_raw`, not received yet."""

    def __init__(self, client: RayReplayBufferClient, ref, count: int) -> None:
        self.client = client
        self.ref = ref
        self.count = count

    def result(self) -> list:
        """Waits for the batches; raises as :class:`RayReplayBufferClient` calls do."""
        return decode_all(self.client._fetch(self.ref))


#: The owner's lifecycle methods: a client neither defines them nor forwards them to the hosted buffer.
LIFECYCLE_NAMES = frozenset({"close", "shutdown"})


def _rebuild_client(identity: dict) -> RayReplayBufferClient:
    return RayReplayBufferClient(**identity)


class RayReplayBufferClient:
    """A handle on the replay buffer of a :class:`RayReplayBuffer` actor, without lifecycle rights.

    Every method call runs in the actor and returns its result by value. The client is picklable: it carries the
    actor's name and namespace and the cluster's address, and finds the actor again where it is unpickled (a Ray
    task or actor, a spawned process, a DataLoader worker), connecting that process to the same cluster first if
    it is not connected. Get clients from ``rb.client()`` / ``rb.clients(n)``.

    Methods forwarded: ``add``, ``extend``, ``sample`` (with ``wait``/``timeout``/``cancel_event``, waiting in this
    process: see :meth:`sample`), ``can_sample``, ``stats``, ``update_priority``, ``update_tensordict_priority``,
    ``len()``, ``empty``, ``state_dict``/``load_state_dict``, ``dumps``/``loads`` (run by the actor, so ``path``
    is a path on the actor's machine), ``append_transform``/``insert_transform``, ``next``, iteration,
    ``rb[index]``, ``update_if_present``, ``share``, and the properties ``batch_size``, ``write_count`` and
    ``dim_extend``. ``set_storage``, ``set_writer``, ``set_sampler``, ``set_rng`` and the save/load hooks send a
    pickled copy of their argument to the actor (NOTE [sending objects to the actor]). Any other public name
    of the hosted buffer is forwarded too (a method becomes a remote call, a property is read remotely); a name
    the buffer lacks raises ``AttributeError``, and so do ``close`` and ``shutdown``: they are the owner's.

    A call to a dead actor raises ``RuntimeError`` naming the actor; a call from a process forked from a Ray
    driver raises ``RuntimeError`` (such calls hang in Ray).

    Examples:
        >>> import functools, pickle, ray, torch
        >>> from torchrl.data import LazyTensorStorage, RayReplayBuffer
        >>> rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 100), batch_size=4,
        ...                      ray_init_config={"num_cpus": 2})
        >>> client = pickle.loads(pickle.dumps(rb.client()))  # what another process receives
        >>> _ = client.extend(torch.arange(10))
        >>> len(rb), client.sample().shape
        (10, torch.Size([4]))
        >>> rb.close()
    """

    #: The class of the hosted buffer: ``isinstance(client, cls)`` is ``True`` for its base classes (TorchRL's name).
    _service_cls: type | None = None
    #: The :class:`~torchrl.data.ReplayBuffer` class whose methods this handle's methods forward to, with the same
    #: signatures (those of TorchRL's default ``replay_buffer_cls`` on the class; a handle's own hosted class on a
    #: handle that knows it). ``extend`` takes ``*args, **kwargs``: the hosted classes' ``extend`` differ.
    hosted_class: type = ReplayBuffer

    def __init__(self, actor_name: str, namespace: str | None, address: str | None, *, to_cpu: bool = True,
                 buffer_class: str = "ReplayBuffer", service_cls: type | None = None, handle=None) -> None:
        self._service_cls = service_cls
        if service_cls is not None:
            self.hosted_class = service_cls
        self._actor_name = actor_name
        self._namespace = namespace
        self._address = address
        self._to_cpu = bool(to_cpu)
        self._buffer_class = buffer_class
        self._handle = handle
        self._kinds: dict[str, str | None] = {}

    # -- identity and pickling --------------------------------------------------------------------------------
    @property
    def actor_name(self) -> str:
        """The Ray name of the actor that hosts the buffer (``ray.get_actor(name, namespace=namespace)``)."""
        return self._actor_name

    @property
    def namespace(self) -> str | None:
        """The Ray namespace of the actor."""
        return self._namespace

    @property
    def address(self) -> str | None:
        """The address of the Ray cluster (its GCS) that a client joins where Ray is not initialized."""
        return self._address

    def _identity(self) -> dict:
        return {"actor_name": self._actor_name, "namespace": self._namespace, "address": self._address,
                "to_cpu": self._to_cpu, "buffer_class": self._buffer_class, "service_cls": self._service_cls}

    def __reduce__(self):
        return (_rebuild_client, (self._identity(),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(actor={self._actor_name!r}, buffer={self._buffer_class})"

    @property
    def service_backend(self) -> str:
        """``"ray"``: the buffer lives in a Ray actor (``"direct"`` on a buffer of this process)."""
        return "ray"

    @property
    def transport_kind(self) -> str:
        """``"ray"``: calls go through Ray (the only transport here)."""
        return "ray"

    # -- remote calls --------------------------------------------------------------------------------------------
    def _actor(self):
        check_not_forked(type(self).__name__)
        ray = import_ray()
        if self._handle is not None and not ray.is_initialized():
            # a handle of a cluster this process left: using it would start a new local cluster without the actor
            raise ray_shut_down_error(self._actor_name, self._address)
        if self._handle is None:
            connect(ray, self._address, self._namespace)
            try:
                self._handle = ray.get_actor(self._actor_name, namespace=self._namespace)
            except ValueError as err:  # no live actor of that name
                raise dead_actor_error(self._actor_name, self._namespace, "no live actor has that name") from err
        return self._handle

    def _remote(self, method: str, *args):
        return self._fetch(self._submit(method, *args))

    def _submit(self, method: str, *args):
        """Sends a call to the actor; returns its ``ObjectRef`` (:meth:`_fetch` gets the result)."""
        return getattr(self._actor(), method).remote(*args)

    def _fetch(self, ref):
        """The result of a call sent by :meth:`_submit`; the actor's errors raised as described in the class."""
        ray = import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            raise dead_actor_error(self._actor_name, self._namespace, err) from err
        except ray.exceptions.RayTaskError as err:  # the buffer's own error, raised here as it was raised there
            cause = err.cause
            if not isinstance(cause, Exception):
                raise
            cause.add_note(f"(raised by the buffer in Ray actor {self._actor_name!r})")
            raise cause from None

    def _call(self, name: str, *args, **kwargs):
        out = self._remote("call", name, args, kwargs)
        return self if out is SELF else out

    def _cpu(self, value):
        return _to_cpu(value) if self._to_cpu else value

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in LIFECYCLE_NAMES:  # the owner's (RayReplayBuffer's), never forwarded to the hosted buffer
            raise AttributeError(
                f"{type(self).__name__} has no attribute {name!r}: a client has no lifecycle rights; the "
                f"RayReplayBuffer that created the actor closes it (close() or shutdown())."
            )
        kinds = self.__dict__.setdefault("_kinds", {})
        if name not in kinds:
            kinds[name] = self._remote("describe", name)
        kind = kinds[name]
        if kind is None:
            raise AttributeError(
                f"The {self._buffer_class} hosted by Ray actor {self._actor_name!r} has no attribute {name!r}."
            )
        if kind == "value":
            return self._remote("get", name)
        return functools.partial(self._call, name)

    # -- writes ---------------------------------------------------------------------------------------------------
    def add(self, data, *, timeout: float | None = None) -> Any:
        """Writes one item in the actor's buffer; returns its index. ``timeout``: see :meth:`extend`."""
        return self._write("add", (data,), {} if timeout is None else {"timeout": timeout})

    def extend(self, *args, **kwargs):
        """Writes a batch in the actor's buffer; returns the written indices. Takes the arguments of the hosted
        class's ``extend`` (``extend(data, *, timeout=None)``; a TensorDict buffer also takes
        ``update_priority``), sent to the actor by value (tensors moved to the CPU unless the actor has GPUs).

        With a ``rate_limiter`` that blocks inserts (:class:`~torchrl.data.SampleToInsertRatio`), the wait for
        its permission runs here, as attempts that never wait in the actor, up to ``timeout`` seconds (``None``:
        as long as it takes), then raises the ``TimeoutError`` of a local buffer."""
        return self._write("extend", args, kwargs)

    def _write(self, method: str, args: tuple, kwargs: dict):
        kwargs = dict(kwargs)
        timeout = kwargs.pop("timeout", None)
        if timeout is not None:
            timeout = check_wait_args(False, timeout, None)
        payload = [tuple(self._cpu(arg) for arg in args)]
        kwargs = {name: self._cpu(value) for name, value in kwargs.items()}

        def attempt(first: bool):
            if not first and not isinstance(payload[0], import_ray().ObjectRef):
                payload[0] = import_ray().put(payload[0])  # sent once, not once per attempt
            return self._remote("poll_write", method, payload[0], kwargs, timeout, first)

        out = poll_until(attempt, timeout=timeout)
        return self if out is SELF else out

    def update_if_present(
        self, *, index, generation, patch, version_key=None, version=None, require_newer=False
    ) -> ConditionalUpdateResult:
        """Writes ``patch`` into the records at ``index`` of the actor's buffer that were not overwritten since
        they were read (``generation``, as sampled), in one call of the actor; see :meth:`ReplayBuffer.update_if_present
        <torchrl.data.ReplayBuffer.update_if_present>`. Returns the actor's result by value."""
        return self._call(
            "update_if_present", index=self._cpu(index), generation=self._cpu(generation), patch=self._cpu(patch),
            version_key=version_key, version=self._cpu(version), require_newer=require_newer,
        )  # fmt: skip

    def update_priority(self, index, priority) -> None:
        """Sets priorities in the actor's sampler (prioritized buffers)."""
        self._call("update_priority", self._cpu(index), self._cpu(priority))

    def update_tensordict_priority(self, data) -> None:
        """Sets priorities from a sampled TensorDict (its ``index`` and priority entries)."""
        self._call("update_tensordict_priority", self._cpu(data))

    def empty(self, empty_write_count: bool = True) -> None:
        """Removes every item of the actor's buffer."""
        self._call("empty", empty_write_count=empty_write_count)

    def __setitem__(self, index, value) -> None:
        self._call("__setitem__", index, self._cpu(value))

    def mark_update(self, index) -> None:
        self._call("mark_update", index)

    # -- reads ----------------------------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False, *, wait: bool = False,
               timeout: float | None = None, cancel_event=None):
        """A batch sampled (and transformed) by the actor's buffer; see :meth:`ReplayBuffer.sample
        <torchrl.data.ReplayBuffer.sample>`. A dense TensorDict or tensor batch travels as numpy arrays: its
        tensors view Ray's object store (no copy), which keeps that memory while they are referenced.

        ``wait=True`` waits here, not in the actor: this client sends attempts that never wait and sleeps
        between them (a few ms at most), so the actor keeps serving the other clients, the writers included,
        and each attempt draws atomically from the buffer's budget (a ``RateLimitedReplayBuffer``, a
        ``rate_limiter``). ``timeout`` and ``cancel_event`` (checked in this process) end the wait with the
        errors of a local buffer (see NOTE [waiting through a Ray actor] in ``_ray/waiting.py``)."""
        if wait is False and timeout is None and cancel_event is None:
            data, info = self._remote("sample", batch_size, bool(return_info))
        else:
            timeout = check_wait_args(wait, timeout, cancel_event)
            if wait:
                def attempt(first: bool):
                    event = CANCELLED if first and cancel_event is not None and cancel_event.is_set() else None
                    return self._remote("poll_sample", batch_size, bool(return_info), first, event)

                data, info = poll_until(attempt, timeout=timeout, cancel_event=cancel_event)
            else:
                readiness = {"timeout": timeout} if timeout is not None else {}
                if cancel_event is not None:
                    readiness["cancel_event"] = CANCELLED if cancel_event.is_set() else None
                data, info = self._remote("sample", batch_size, bool(return_info), readiness)
        data = decode(data)  # see _ray/wire.py: the batch's tensors view Ray's object store (no copy)
        return (data, info) if return_info else data

    def can_sample(self, batch_size: int | None = None) -> bool:
        """Whether the actor's buffer can serve a batch of ``batch_size`` now (its sampler's readiness and its
        rate limiter's permission); see :meth:`ReplayBuffer.can_sample <torchrl.data.ReplayBuffer.can_sample>`.
        Advisory: another client may draw first."""
        return self._call("can_sample", batch_size)

    def stats(self) -> dict[str, Any]:
        """The actor's buffer ``stats()``: sizes, the cumulative readiness counters and, for a rate-limited
        buffer, its budget entries (``sample_budget``, ``target_samples_per_insert``, ...)."""
        return self._call("stats")

    def data_parallel(self, rank: int, world_size: int) -> DataParallelReplayBufferClient:
        """This handle as data-parallel rank ``rank`` of ``world_size`` sees it: a
        :class:`~torchrl.data.DataParallelReplayBufferClient` whose ``sample()`` draws the rank's share of a global
        batch from the actor's buffer."""
        return DataParallelReplayBufferClient(self, rank=rank, world_size=world_size)

    def _sample_data_parallel(self, batch_size: int, return_info: bool = False, *, wait: bool = False,
                              timeout: float | None = None, cancel_event=None):
        """The actor's buffer's ``_sample_data_parallel`` (one rank's share: ``batch_size`` items, refused when the
        buffer prefetches), returned by value. ``wait``/``timeout``/``cancel_event``: as :meth:`sample`, the wait
        runs here (NOTE [waiting through a Ray actor]): attempts that never wait in the actor."""
        if wait is False and timeout is None and cancel_event is None:
            return self._call("_sample_data_parallel", batch_size, bool(return_info))
        timeout = check_wait_args(wait, timeout, cancel_event)
        if not wait:  # a wait=False call with a timeout or an event: the buffer's own check, at once
            readiness = {"timeout": timeout} if timeout is not None else {}
            if cancel_event is not None:
                readiness["cancel_event"] = CANCELLED if cancel_event.is_set() else None
            return self._call("_sample_data_parallel", batch_size, bool(return_info), **readiness)

        def attempt(first: bool):
            if not first and not self.can_sample(batch_size):
                return False, None, None
            event = CANCELLED if first and cancel_event is not None and cancel_event.is_set() else None
            try:
                out = self._call("_sample_data_parallel", batch_size, bool(return_info), wait=True, timeout=0.0,
                                 cancel_event=event)  # fmt: skip
            except TimeoutError as err:
                return False, None, str(err)
            return True, out, None

        return poll_until(attempt, timeout=timeout, cancel_event=cancel_event)

    def sample_raw(self, batch_size: int | None = None):
        """A batch sampled by the actor's buffer without its forward transforms (:meth:`sample_transform`)."""
        return self._remote("sample_raw", batch_size)

    def request_raw(self, batch_size: int | None, count: int) -> PendingBatches:
        """Asks the actor for ``count`` batches of :meth:`sample_raw` in one call, without waiting:
        ``.result()`` of the returned object waits for them and returns them as a list. The batches travel
        through Ray's object store as numpy arrays and their tensors view that memory (no copy). The actor
        runs calls in the order they were sent, so batches arrive in the order they were sampled."""
        count = check_positive_int("count", count, type_error=False)
        return PendingBatches(self, self._submit("sample_raw_batches", batch_size, count), count)

    def poll_raw(self, batch_size: int | None, count: int, *, timeout: float | None = None) -> list:
        """Up to ``count`` batches of :meth:`sample_raw` (at least one), waiting in this process until the
        actor's buffer serves one: the wait of :meth:`sample` (``wait=True``), by attempts that never wait in
        the actor. ``timeout``: the longest wait in seconds (``TimeoutError`` past it); ``None``: as long as it
        takes. What ``RayReplayBuffer.as_dataset(wait=True)`` readers draw with."""
        count = check_positive_int("count", count, type_error=False)
        timeout = check_wait_args(True, timeout, None)
        encoded = poll_until(lambda first: self._remote("poll_raw_batches", batch_size, count, first), timeout=timeout)
        return decode_all(encoded)

    def sample_transform(self):
        """A copy of the actor's forward transforms (a ``Compose``), as they are now."""
        return self._remote("sample_transform")

    def __len__(self) -> int:
        return self._call("__len__")

    def __getitem__(self, index):
        return self._call("__getitem__", index)

    def next(self):
        """One batch of the actor's persistent iteration (``None`` at the end of a pass); see
        :meth:`ReplayBuffer.next <torchrl.data.ReplayBuffer.next>`."""
        return self._call("next")

    def __iter__(self):
        while (batch := self.next()) is not None:
            yield batch

    @property
    def batch_size(self) -> int | None:
        return self._remote("get", "batch_size")

    @property
    def write_count(self) -> int:
        return self._remote("get", "write_count")

    @property
    def dim_extend(self) -> int:
        return self._remote("get", "dim_extend")

    # -- state and persistence -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The actor's buffer ``state_dict()`` (its storage content included), copied here."""
        return self._call("state_dict")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._call("load_state_dict", state_dict)

    def dumps(self, path, **kwargs) -> None:
        """The actor saves its buffer to the directory ``path`` (a path on the actor's machine), in the
        pickle-free checkpoint format of :meth:`ReplayBuffer.dumps <torchrl.data.ReplayBuffer.dumps>`."""
        self._call("dumps", str(path), **kwargs)

    def loads(self, path) -> None:
        """The actor loads the checkpoint at ``path`` (on the actor's machine) into its buffer."""
        self._call("loads", str(path))

    dump = dumps
    save = dumps

    def load(self, *args, **kwargs) -> None:
        """Alias of :meth:`loads`."""
        self.loads(*args, **kwargs)

    # -- transforms -----------------------------------------------------------------------------------------------
    def append_transform(self, transform, *, invert: bool = False) -> ReplayBuffer:
        """Appends ``transform`` (pickled and sent to the actor) to the actor's buffer's sample path; returns
        this handle."""
        return self._send("append_transform", "transform", transform, invert=invert)

    def insert_transform(self, index: int, transform, *, invert: bool = False) -> ReplayBuffer:
        """Inserts ``transform`` (pickled and sent to the actor) at ``index`` of the actor's transforms."""
        return self._send("insert_transform", "transform", transform, index, invert=invert)

    # -- components, generator and hooks, sent to the actor by value ------------------------------------------
    # NOTE [sending objects to the actor]: a storage, sampler, writer, generator or hook passed to these methods
    # is pickled (with Ray's cloudpickle: functions and classes defined in __main__ or a notebook travel by
    # value, others by module path, which the actor must be able to import) and the actor's buffer gets the
    # copy. The object passed stays in this process, unchanged and unconnected: later changes to it (an extend
    # on that storage, draws from that generator, attributes a hook sets on itself) are not the buffer's. What
    # cannot be pickled is refused with a TypeError naming the argument, before anything is sent.

    def _send(self, method: str, what: str, value, *args, **kwargs):
        """``self._call(method, *args, value, **kwargs)`` (``value`` after ``args``), with a ``TypeError`` naming
        ``what`` when ``value`` cannot be pickled for the actor."""
        ray = import_ray()
        self._actor()  # a closed buffer, a cluster left or a forked process raise first: nothing is put in the store
        try:
            ref = ray.put(value)
        except Exception as err:  # Ray raises TypeError or a pickling error, depending on the object
            raise TypeError(
                f"{type(self).__name__}.{method}() sends `{what}` to the Ray actor that hosts the buffer by pickling "
                f"it, and this {type(value).__name__} cannot be pickled ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}). Pass an object that pickles "
                f"(no open files, locks or threads), or build it in the actor from a picklable constructor."
            ) from None
        out = self._remote("call_with_object", method, args, ref, kwargs)
        return self if out is SELF else out

    def set_storage(self, storage: Storage, collate_fn=None) -> Storage:
        """Replaces the actor's storage by a copy of ``storage`` (pickled and sent, see NOTE [sending objects to
        the actor]: its content travels too) and returns the previous one, copied back here; see
        :meth:`ReplayBuffer.set_storage <torchrl.data.ReplayBuffer.set_storage>`."""
        return self._send("set_storage", "storage", storage, collate_fn=collate_fn)

    def set_writer(self, writer: Writer) -> Writer:
        """Replaces the actor's writer by a copy of ``writer`` and returns the previous one, copied back here."""
        return self._send("set_writer", "writer", writer)

    def set_sampler(self, sampler: Sampler) -> Sampler:
        """Replaces the actor's sampler by a copy of ``sampler`` (its priorities or epoch state travel with it)
        and returns the previous one, copied back here."""
        return self._send("set_sampler", "sampler", sampler)

    def set_rng(self, generator: torch.Generator | None) -> None:
        """The actor's buffer draws with a copy of ``generator`` (its state as it is now): the actor's draws
        are reproducible from that state, and ``generator`` itself does not advance. A CUDA generator is
        refused (``ValueError``) when the actor has no GPU (``remote_config`` without ``num_gpus``)."""
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}.")
        if generator is not None and generator.device.type != "cpu" and self._to_cpu:
            raise ValueError(
                f"`generator` is a {generator.device.type} generator, and the Ray actor that hosts the buffer has "
                f"no GPU (remote_config without num_gpus): pass a CPU generator, e.g. "
                f"torch.Generator().manual_seed(seed)."
            )
        self._send("set_rng", "generator", generator)

    def share(self, shared: bool = True) -> ReplayBuffer:
        """Runs the hosted buffer's :meth:`~torchrl.data.ReplayBuffer.share` in the actor; returns this handle.

        Every client already writes and samples the one buffer in the actor, so this is not needed to share it
        between collectors and learners: it moves the actor's storage to shared memory, as it would for a local
        buffer (only processes started by the actor itself could map that memory)."""
        return self._call("share", check_bool("shared", shared))

    def register_save_hook(self, hook) -> None:
        """Registers a copy of ``hook`` (pickled and sent, see NOTE [sending objects to the actor]) with the
        actor's buffer: it runs in the actor at :meth:`dumps`, and attributes it sets on itself (``shift``,
        ``is_full``) are set on that copy. See :meth:`ReplayBuffer.register_save_hook
        <torchrl.data.ReplayBuffer.register_save_hook>`."""
        if not callable(hook):
            raise TypeError(f"A save hook must be a callable hook(data, path=path), got {type(hook).__name__}.")
        self._send("register_save_hook", "hook", hook)

    def register_load_hook(self, hook) -> None:
        """Sends a copy of ``hook`` to the actor's buffer, whose storage checkpointer receives it (and refuses it,
        as a local buffer's does: see :meth:`ReplayBuffer.register_load_hook
        <torchrl.data.ReplayBuffer.register_load_hook>`)."""
        self._send("register_load_hook", "hook", hook)


class RayReplayBuffer(RayReplayBufferClient):
    """A replay buffer that lives in a Ray actor, written and sampled from any Ray task or process.

    The buffer (``replay_buffer_cls(*args, **kwargs)``) is built inside the actor. Its ``storage``,
    ``sampler``, ``writer`` and ``transform`` are therefore passed as constructors, e.g.
    ``storage=functools.partial(LazyTensorStorage, 100_000)`` or ``sampler=SamplerWithoutReplacement``; the
    other keyword arguments (``batch_size``, ``alpha``/``beta`` of prioritized buffers, ...) are passed as they
    are. This object forwards the buffer's methods to the actor (see :class:`RayReplayBufferClient`) and owns the
    actor: :meth:`close` kills it. Hand :meth:`client` / :meth:`clients` to collectors and learners; pickling
    this object also gives a client.

    ``replay_buffer_cls(..., service_backend="ray", service_backend_options={"ray_init_config": ...,
    "remote_config": ...})`` builds one too, as in TorchRL. The buffer and its clients pass for the hosted
    class: ``isinstance(rb, ReplayBuffer)`` is ``True``, and so is ``isinstance(rb, TensorDictReplayBuffer)``
    when it hosts that class (``issubclass(RayReplayBuffer, ReplayBuffer)`` stays ``False``).

    Ray is started with ``ray.init(**ray_init_config)`` only if it is not initialized in this process, and
    :meth:`close` shuts it down only if this object (or another buffer of this process) started it and no other
    buffer still uses it.

    Args:
        *args: positional arguments of ``replay_buffer_cls``.

    Keyword Args:
        replay_buffer_cls (type): the :class:`~torchrl.data.ReplayBuffer` class to host. Defaults to
            :class:`~torchrl.data.ReplayBuffer`.
        ray_init_config (dict, optional): keywords of ``ray.init`` when Ray is not initialized yet. Defaults
            to ``{"include_dashboard": False}``, merged with what is passed.
        remote_config (dict, optional): options of the actor (``num_cpus``, ``num_gpus``, ``name``,
            ``namespace``, ...). Without ``num_gpus``, tensors sent to the actor are moved to the CPU first.
            Defaults to ``{"num_cpus": 1}``, merged with what is passed, and a unique ``name``.
        transport (str): ``"auto"`` or ``"ray"`` (calls through Ray, the only transport here). TorchRL's
            ``"distributed"`` (tensor channels over gloo / NCCL) raises ``NotImplementedError`` naming what to use
            instead. Defaults to ``"auto"``.
        transport_options (dict, optional): options of TorchRL's ``"distributed"`` transport; anything but
            ``None`` or ``{}`` is refused (``ValueError``). Defaults to ``None``.
        delayed_init (bool or None): passed to ``replay_buffer_cls``: ``True`` builds the hosted buffer's
            components at its first write, in the actor; ``False`` builds them when the actor starts, so that their
            errors are raised by this constructor; ``None`` leaves the hosted class's own default (for a
            :class:`~torchrl.data.ReplayBuffer`: delayed exactly when ``transform_factory`` is given). Defaults to
            ``False`` (as in TorchRL).
        **kwargs: keyword arguments of ``replay_buffer_cls``, with constructors for the components.

    Raises:
        ImportError: Ray is not installed (``pip install 'torchrl[ray]'``).
        TypeError: a component instance was passed instead of a constructor, or ``replay_buffer_cls`` is not a
            ReplayBuffer class. The buffer's own argument errors are raised as the buffer raises them.

    .. warning:: Processes forked from a process connected to Ray cannot use the buffer (Ray calls hang there):
        use ``spawn`` or ``forkserver`` (``DataLoader(..., multiprocessing_context="spawn")``).

    Examples:
        >>> import functools, ray, torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, RayReplayBuffer, SamplerWithoutReplacement
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 1000),
        ...                      sampler=SamplerWithoutReplacement, batch_size=8,
        ...                      replay_buffer_cls=TensorDictReplayBuffer, ray_init_config={"num_cpus": 2})
        >>> @ray.remote(num_cpus=0)
        ... def collect(rb, start):
        ...     return rb.extend(TensorDict(obs=torch.arange(start, start + 16), batch_size=[16])).numel()
        >>> ray.get([collect.remote(client, 16 * i) for i, client in enumerate(rb.clients(2))])
        [16, 16]
        >>> sorted(torch.cat([batch["obs"] for batch in rb]).tolist()) == list(range(32))  # one epoch
        True
        >>> rb.close()
    """

    def __init__(self, *args, replay_buffer_cls: type = ReplayBuffer, ray_init_config: dict | None = None,
                 remote_config: dict | None = None, transport: str = "auto", transport_options: dict | None = None,
                 delayed_init: bool = False, **kwargs) -> None:
        if not (isinstance(replay_buffer_cls, type) and issubclass(replay_buffer_cls, ReplayBuffer)):
            raise TypeError(
                f"`replay_buffer_cls` must be a ReplayBuffer class (e.g. TensorDictReplayBuffer), got "
                f"{replay_buffer_cls!r}."
            )
        _check_transport(transport, transport_options)
        if "num_shards" in kwargs:
            raise TypeError(
                f"RayReplayBuffer hosts one buffer in one actor and takes no `num_shards` (got "
                f"{kwargs['num_shards']!r}): build ShardedRayReplayBuffer(num_shards=N, ...) with the same arguments."
            )
        for name, value in (("ray_init_config", ray_init_config), ("remote_config", remote_config)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"`{name}` must be a dict of keyword arguments or None, got {value!r}.")
        if delayed_init is not None:  # None (a ReplayBuffer's own default, e.g. from service_backend="ray"): not passed
            delayed_init = check_bool("delayed_init", delayed_init)
        check_constructors(kwargs)
        if delayed_init is not None and _takes_keyword(replay_buffer_cls, "delayed_init"):
            kwargs["delayed_init"] = delayed_init
        elif delayed_init:
            raise TypeError(
                f"RayReplayBuffer(delayed_init=True) passes `delayed_init` to replay_buffer_cls, and "
                f"{replay_buffer_cls.__name__} does not take it: build it with delayed_init=False."
            )
        ray = import_ray()
        self._closed = True  # until the actor exists
        self._prefetch = kwargs.get("prefetch")
        remote_config = {**DEFAULT_REMOTE_CONFIG, **(remote_config or {})}
        self._max_concurrency = remote_config.get("max_concurrency", 1)
        RuntimeLease.acquire(ray, {**DEFAULT_RAY_INIT_CONFIG, **(ray_init_config or {})})
        try:
            name = remote_config.pop("name", None) or f"torchrl-replay-buffer-{uuid.uuid4().hex[:12]}"
            namespace = remote_config.pop("namespace", None) or ray.get_runtime_context().namespace
            handle = ray.remote(BufferHost).options(name=name, namespace=namespace, **remote_config).remote(
                replay_buffer_cls, args, kwargs
            )
            try:
                buffer_class = ray.get(handle.ready.remote(), timeout=ACTOR_START_TIMEOUT)
            except ray.exceptions.GetTimeoutError:
                ray.kill(handle, no_restart=True)
                raise RuntimeError(
                    f"The actor {name!r} of RayReplayBuffer did not start within {ACTOR_START_TIMEOUT:g} s: the "
                    f"cluster has no free resources for remote_config={remote_config} (ray.available_resources()"
                    f" = {ray.available_resources()}). Free CPUs (fewer concurrent actors or tasks), or ask for "
                    f"less, e.g. remote_config={{'num_cpus': 0}}."
                ) from None
            except ray.exceptions.RayTaskError as err:  # the buffer's constructor raised: raise its error here
                ray.kill(handle, no_restart=True)
                if isinstance(err.cause, Exception):
                    raise err.cause from None
                raise
            except BaseException:
                ray.kill(handle, no_restart=True)
                raise
        except BaseException:
            RuntimeLease.release(ray)
            raise
        super().__init__(name, namespace, ray.get_runtime_context().gcs_address,
                         to_cpu=not remote_config.get("num_gpus"), buffer_class=buffer_class,
                         service_cls=replay_buffer_cls, handle=handle)
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> RayReplayBuffer:
        """Returns this buffer: its actor is started by the constructor (TorchRL's service API)."""
        return self

    def client(self) -> RayReplayBufferClient:
        """A picklable handle on the actor's buffer, without lifecycle rights (it cannot close the buffer)."""
        return RayReplayBufferClient(**self._identity(), handle=self._handle)

    def clients(self, num_clients: int) -> list[RayReplayBufferClient]:
        """``num_clients`` clients (one per collector or learner), each as :meth:`client` returns it."""
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 0:
            raise ValueError(f"`num_clients` must be a non-negative int, got {num_clients!r}.")
        return [self.client() for _ in range(num_clients)]

    def data_parallel(self, rank: int, world_size: int) -> DataParallelReplayBufferClient:
        """A :class:`~torchrl.data.DataParallelReplayBufferClient` for rank ``rank`` of ``world_size`` over a
        :meth:`client` (no lifecycle rights): its ``sample()`` draws the rank's share of a global batch."""
        return DataParallelReplayBufferClient(self.client(), rank=rank, world_size=world_size)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def is_alive(self) -> bool:
        """Whether the actor answers (``False`` once closed, killed or crashed)."""
        if self._closed:
            return False
        try:
            self._remote("ready")
        except RuntimeError:
            return False
        return True

    def close(self) -> None:
        """Kills the actor (its data is lost: save it with :meth:`dumps` first) and releases Ray, shutting it
        down if this process started it for buffers and none is left. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        try:
            if ray.is_initialized():
                ray.kill(self._handle, no_restart=True)
        finally:
            self._handle = None
            RuntimeLease.release(ray)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stops the buffer gracefully, then closes it as :meth:`close` does (the actor is killed, its data lost).

        The actor first runs the calls it already received, then the hosted buffer's own
        :meth:`~torchrl.data.ReplayBuffer.shutdown` (its prefetching threads stop; clients waiting in
        ``sample(wait=True)`` get its ``RuntimeError``). This waits up to ``timeout`` seconds for that (``None``:
        as long as it takes) and kills the actor in any case. Calling it again does nothing.

        Raises:
            ValueError: ``timeout`` is not ``None`` or a non-negative number (checked before anything stops).
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
        ):
            raise ValueError(f"`timeout` must be None or a non-negative number of seconds, got {timeout!r}.")
        if self._closed:
            return
        ray = import_ray()
        try:
            if ray.is_initialized():
                ray.get(self._handle.call.remote("shutdown", (), {"timeout": timeout}), timeout=timeout)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            pass  # too slow, or already dead: close() kills it anyway
        except ray.exceptions.RayTaskError:
            pass  # the hosted buffer has no shutdown of its own, or it failed: the actor is killed anyway
        finally:
            self.close()

    def __enter__(self) -> RayReplayBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _actor(self):
        if self._closed:
            raise RuntimeError(
                f"This RayReplayBuffer was closed (actor {self._actor_name!r} killed): build a new one."
            )
        return super()._actor()

    # -- DataLoader -----------------------------------------------------------------------------------------------
    def as_dataset(
        self, *, num_batches: int | None = None, transport: str = DEFAULT_TRANSPORT, prefetch: int = 1,
        batches_per_call: int = 8, wait: bool = False, timeout: float | None = None,
    ) -> RayReplayBufferDataset:
        """A :class:`RayReplayBufferDataset`: DataLoader workers draw raw batches from the actor and run the
        buffer's transforms themselves. Use ``multiprocessing_context="spawn"`` (or ``"forkserver"``).
        ``prefetch``, ``batches_per_call``, ``wait`` and ``timeout``: see :class:`RayReplayBufferDataset`.

        The actor must run one call at a time (no ``max_concurrency`` above 1) and the buffer must not prefetch.
        """
        if self._prefetch:
            raise ValueError(
                f"as_dataset() draws untransformed batches from the actor, and this buffer prefetches "
                f"(prefetch={self._prefetch}) transformed ones: build the RayReplayBuffer with prefetch=None."
            )
        if self._max_concurrency != 1 and not self._remote("can_sample_raw_concurrently"):
            raise ValueError(
                f"as_dataset() needs an actor that runs one call at a time, and this one was built with "
                f"remote_config max_concurrency={self._max_concurrency}: leave max_concurrency at 1."
            )
        return RayReplayBufferDataset(self.client(), num_batches=num_batches, transport=transport,
                                      prefetch=prefetch, batches_per_call=batches_per_call, wait=wait,
                                      timeout=timeout)  # fmt: skip


def _check_transport(transport, transport_options) -> None:
    """Refuses what :class:`RayReplayBuffer` cannot do, before Ray starts: TorchRL's ``"distributed"`` transport
    (gloo / NCCL tensor channels), any other transport than Ray's, and transport options."""
    if transport in TENSOR_CHANNEL_TRANSPORTS:
        raise NotImplementedError(
            f"RayReplayBuffer(transport={transport!r}): TorchRL's transport='distributed' (tensor channels over "
            f"torch.distributed, gloo or NCCL) is not implemented here. Pass transport='ray' or 'auto': calls go "
            f"through Ray, and sampled batches reach the caller through Ray's object store without a copy "
            f"(DataLoader workers read with rb.as_dataset()). For processes of one machine only, a local buffer "
            f"built with shared=True (or rb.share()) needs no actor at all."
        )
    if transport not in ("auto", "ray"):
        raise ValueError(f"`transport` must be 'auto' or 'ray', got {transport!r}.")
    if transport_options is not None and not isinstance(transport_options, dict):
        raise TypeError(f"`transport_options` must be a dict or None, got {transport_options!r}.")
    if transport_options:  # None or {}: nothing to configure
        raise ValueError(
            f"`transport_options`={transport_options!r} configure TorchRL's transport='distributed' (tensor "
            f"channels), which is not implemented here: calls go through Ray. Leave `transport_options` out."
        )


def _takes_keyword(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` accepts the keyword ``name`` (named in its signature, or taken by ``**kwargs``)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True  # no signature to read: the class reports a bad keyword itself
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


#: The keywords of :class:`RayReplayBuffer` that ``service_backend_options`` may hold.
RAY_SERVICE_OPTIONS = ("ray_init_config", "remote_config", "transport")


def _ray_service(cls: type, args: tuple, kwargs: dict, *, options, transport, transport_options) -> RayReplayBuffer:
    """``cls(*args, service_backend="ray", **kwargs)``: a :class:`RayReplayBuffer` whose actor hosts a ``cls``."""
    options = check_service_options("ray", options, RAY_SERVICE_OPTIONS)
    _check_transport(options.get("transport", transport), transport_options)
    if "transport" in options and transport not in ("auto", options["transport"]):
        raise ValueError(
            f"`transport`={transport!r} contradicts service_backend_options['transport']="
            f"{options['transport']!r}: pass one of them."
        )
    options.setdefault("transport", transport)
    if transport_options is not None:
        options["transport_options"] = transport_options  # checked by RayReplayBuffer before Ray starts
    both = sorted(options.keys() & kwargs.keys())
    if both:
        raise TypeError(f"{', '.join(map(repr, both))} passed both to the buffer and in `service_backend_options`: "
                        f"pass each once.")
    try:
        check_constructors(kwargs)
    except TypeError as err:
        raise TypeError(
            f'{cls.__name__}(..., service_backend="ray") builds the buffer in a Ray actor (a RayReplayBuffer): '
            f"{err}"
        ) from None
    return RayReplayBuffer(*args, replay_buffer_cls=cls, **options, **kwargs)


register_service_backend("ray", _ray_service)


# -- TorchRL's `ReplayBuffer.as_remote` ----------------------------------------------------------------------------
def default_remote_class_config() -> dict[str, Any]:
    """The actor options :func:`as_remote` uses by default (TorchRL's ``DEFAULT_REMOTE_CLASS_CONFIG``): one CPU,
    a fifth of a GPU when CUDA is available, 2 GiB of memory."""
    return {"num_cpus": 1, "num_gpus": 0.2 if torch.cuda.is_available() else None, "memory": 2 * 1024**3}


def _as_remote(cls: type, remote_config: dict[str, Any] | None = None) -> type:
    """``cls`` as a Ray actor class: ``ray.remote(**remote_config)(cls)``, marked ``is_remote = True``.

    TorchRL's ``ReplayBuffer.as_remote``: a lower-level way than :class:`RayReplayBuffer` to host a buffer in a
    Ray actor (build it with ``.remote(...)``, call it with ``handle.method.remote(...)`` and ``ray.get``). Ray
    is imported here (``ImportError`` naming the ``ray`` extra when it is not installed).

    Args:
        remote_config (dict, optional): the actor options (``num_cpus``, ``num_gpus``, ``memory``, ...).
            Defaults to :func:`default_remote_class_config`.

    Examples:
        >>> from torchrl.data import ReplayBuffer
        >>> ReplayBuffer.as_remote({"num_cpus": 1}).is_remote  # doctest: +SKIP
        True
    """
    ray = import_ray()
    if remote_config is None:
        remote_config = default_remote_class_config()
    elif not isinstance(remote_config, dict):
        raise TypeError(
            f"`remote_config` must be a dict of Ray actor options (e.g. {{'num_cpus': 1}}) or None, got "
            f"{remote_config!r}."
        )
    # Ray sets a ``__signature__`` with a tracing keyword on each method function of the class it wraps, which
    # ``cls``'s own methods share (ReplayBuffer, used locally by everyone): put them back once the actor class
    # holds what it needs.
    functions = {f for klass in cls.__mro__ for f in vars(klass).values() if isinstance(f, types.FunctionType)}
    missing = object()
    saved = {f: f.__dict__.get("__signature__", missing) for f in functions}
    try:
        remote_cls = ray.remote(**remote_config)(cls)
    finally:
        for f, signature in saved.items():
            if signature is missing:
                f.__dict__.pop("__signature__", None)
            else:
                f.__signature__ = signature
    remote_cls.is_remote = True
    return remote_cls


#: TorchRL's module-level classmethod, attached to :class:`~torchrl.data.ReplayBuffer` below (as in TorchRL, where
#: importing ``torchrl.data.replay_buffers`` attaches it): call it as ``ReplayBuffer.as_remote(remote_config)``.
#: The buffer classes sit a layer below this module, so the attachment is made from here.
as_remote = classmethod(_as_remote)
ReplayBuffer.as_remote = as_remote
