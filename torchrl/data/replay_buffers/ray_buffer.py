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
import uuid
from typing import Any

from torchrl._validation import check_positive_int
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
from torchrl.data.replay_buffers._ray.waiting import poll_until
from torchrl.data.replay_buffers._ray.wire import decode, decode_all
from torchrl.data.replay_buffers.loading.worker_transport import DEFAULT_TRANSPORT
from torchrl.data.replay_buffers.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.replay_buffers._readiness import check_wait_args
from torchrl.data.replay_buffers.replay_buffers._service_backend import (
    check_service_options,
    register_service_backend,
)

__all__ = ["RayReplayBuffer", "RayReplayBufferDataset"]

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
    ``rb[index]``, and the properties ``batch_size``, ``write_count`` and ``dim_extend``. Any other public name
    of the hosted buffer is forwarded too (a method becomes a remote call, a property is read remotely); a name
    the buffer lacks raises ``AttributeError``.

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

    def __init__(self, actor_name: str, namespace: str | None, address: str | None, *, to_cpu: bool = True,
                 buffer_class: str = "ReplayBuffer", service_cls: type | None = None, handle=None) -> None:
        self._service_cls = service_cls
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
    def add(self, data, *, timeout: float | None = None):
        """Writes one item in the actor's buffer; returns its index. ``timeout``: see :meth:`extend`."""
        return self._write("add", data, timeout, {})

    def extend(self, data, *, timeout: float | None = None, **kwargs):
        """Writes a batch in the actor's buffer; returns the written indices.

        With a ``rate_limiter`` that blocks inserts (:class:`~torchrl.data.SampleToInsertRatio`), the wait for
        its permission runs here, as attempts that never wait in the actor, up to ``timeout`` seconds (``None``:
        as long as it takes), then raises the ``TimeoutError`` of a local buffer."""
        return self._write("extend", data, timeout, kwargs)

    def _write(self, method: str, data, timeout, kwargs: dict):
        if timeout is not None:
            timeout = check_wait_args(False, timeout, None)
        payload = [self._cpu(data)]

        def attempt(first: bool):
            if not first and not isinstance(payload[0], import_ray().ObjectRef):
                payload[0] = import_ray().put(payload[0])  # sent once, not once per attempt
            return self._remote("poll_write", method, payload[0], kwargs, timeout, first)

        out = poll_until(attempt, timeout=timeout)
        return self if out is SELF else out

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
    load = loads

    # -- transforms -----------------------------------------------------------------------------------------------
    def append_transform(self, transform, *, invert: bool = False) -> RayReplayBufferClient:
        """Appends ``transform`` (sent by value) to the actor's buffer's sample path."""
        return self._call("append_transform", transform, invert=invert)

    def insert_transform(self, index: int, transform, *, invert: bool = False) -> RayReplayBufferClient:
        return self._call("insert_transform", index, transform, invert=invert)


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
        transport (str): ``"auto"`` or ``"ray"`` (calls through Ray, the only transport here).
            Defaults to ``"auto"``.
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
                 remote_config: dict | None = None, transport: str = "auto", **kwargs) -> None:
        if not (isinstance(replay_buffer_cls, type) and issubclass(replay_buffer_cls, ReplayBuffer)):
            raise TypeError(
                f"`replay_buffer_cls` must be a ReplayBuffer class (e.g. TensorDictReplayBuffer), got "
                f"{replay_buffer_cls!r}."
            )
        if transport == "distributed":
            raise NotImplementedError(
                "RayReplayBuffer(transport='distributed') (tensor channels over torch.distributed) is not "
                "implemented: pass transport='ray' or 'auto'."
            )
        if transport not in ("auto", "ray"):
            raise ValueError(f"`transport` must be 'auto' or 'ray', got {transport!r}.")
        for name, value in (("ray_init_config", ray_init_config), ("remote_config", remote_config)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"`{name}` must be a dict of keyword arguments or None, got {value!r}.")
        check_constructors(kwargs)
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

    def clients(self, n: int) -> list[RayReplayBufferClient]:
        """``n`` clients (one per collector or learner)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"`n` must be a non-negative int, got {n!r}.")
        return [self.client() for _ in range(n)]

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

    shutdown = close

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


#: The keywords of :class:`RayReplayBuffer` that ``service_backend_options`` may hold.
RAY_SERVICE_OPTIONS = ("ray_init_config", "remote_config", "transport")


def _ray_service(cls: type, args: tuple, kwargs: dict, *, options, transport, transport_options) -> RayReplayBuffer:
    """``cls(*args, service_backend="ray", **kwargs)``: a :class:`RayReplayBuffer` whose actor hosts a ``cls``."""
    options = check_service_options("ray", options, RAY_SERVICE_OPTIONS)
    if transport_options:  # None or {}: nothing to configure
        raise ValueError(
            f"`transport_options`={transport_options!r} configure TorchRL's transport='distributed' (tensor "
            f"channels), which is not implemented here: calls go through Ray. Leave `transport_options` out."
        )
    if "transport" in options and transport not in ("auto", options["transport"]):
        raise ValueError(
            f"`transport`={transport!r} contradicts service_backend_options['transport']="
            f"{options['transport']!r}: pass one of them."
        )
    options.setdefault("transport", transport)
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
