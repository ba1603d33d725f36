"""What a :class:`~torchrl.data.RayReplayBuffer` actor holds: :class:`BufferHost`, and the constructor checks.

The buffer is built inside the actor from constructors (``storage=functools.partial(LazyTensorStorage, n)``),
so its storage, sampler, writer and transforms exist once, in the actor; clients send the name of a buffer
method and its arguments (:meth:`BufferHost.call`) and get the result back by value. A call whose result is the
buffer itself (``append_transform`` returns ``self``) returns :data:`SELF` instead of a copy of the buffer.

:meth:`BufferHost.sample_raw` (and :meth:`BufferHost.sample_raw_batches`, several at once, encoded for the
object store by ``wire.py``) samples without the buffer's forward transforms, and
:meth:`BufferHost.sample_transform` returns them: ``RayReplayBuffer.as_dataset`` runs the transforms in the
DataLoader workers while the sampler's state stays in the actor.

:meth:`BufferHost.poll_sample` and :meth:`BufferHost.poll_write` are the attempts of a client that waits
(``sample(wait=True)``, a rate-limited ``extend``): they never wait in the actor (NOTE [waiting through a Ray
actor] in ``waiting.py``).
"""

from __future__ import annotations

import contextlib
import inspect

from torch import nn

from torchrl.data.replay_buffers._ray.wire import encode, encode_all
from torchrl.data.replay_buffers.replay_buffers._batch_layout import items_in
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import Writer
from torchrl.envs.transforms import Transform

__all__ = ["CANCELLED", "SELF", "BufferHost", "check_constructors"]

# The keyword arguments built inside the actor, and the class of what each constructor must return.
COMPONENTS = {"storage": Storage, "sampler": Sampler, "writer": Writer, "transform": (Transform, nn.Module)}


class _SelfMarker:
    """Stands for "the buffer itself" in a reply (a client returns itself for it)."""

    def __repr__(self) -> str:
        return "SELF"

    def __reduce__(self):
        return (_self_marker, ())


def _self_marker() -> _SelfMarker:
    return SELF


SELF = _SelfMarker()


class _CancelledEvent:
    """A ``cancel_event`` that is set: what a client sends for its own event, which cannot travel, once it is set."""

    def is_set(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "CANCELLED"

    def __reduce__(self):
        return (_cancelled_event, ())


def _cancelled_event() -> _CancelledEvent:
    return CANCELLED


CANCELLED = _CancelledEvent()


def check_constructors(kwargs: dict) -> None:
    """Raises ``TypeError`` unless each component in ``kwargs`` is a constructor callable with no arguments."""
    for name, base in COMPONENTS.items():
        value = kwargs.get(name)
        if value is None:
            continue
        example = "functools.partial(LazyTensorStorage, 100_000)" if name == "storage" else (
            f"the class or functools.partial(<{name} class>, ...)"
        )
        if isinstance(value, base):
            raise TypeError(
                f"RayReplayBuffer(`{name}`=...) needs a constructor, got a {type(value).__name__} instance: the "
                f"{name} is built inside the Ray actor that hosts the buffer, and an instance would be copied "
                f"there, so its data and state would live in two places and this one would never see the "
                f"buffer's writes. Pass {name}={example}."
            )
        if not callable(value):
            raise TypeError(
                f"RayReplayBuffer(`{name}`=...) needs a constructor (a zero-argument callable returning the "
                f"{name}), got {value!r} of type {type(value).__name__}. Pass {name}={example}."
            )
        try:
            inspect.signature(value).bind()
        except TypeError:
            raise TypeError(
                f"RayReplayBuffer(`{name}`=...) is called with no arguments inside the actor, and {value!r} "
                f"needs some. Bind them with functools.partial: {name}={example}."
                + (" A function used as the transform goes in transform_factory=lambda: fn." if name == "transform" else "")
            ) from None
        except ValueError:  # no signature to inspect (a builtin): the actor reports any error
            pass


def _build_components(kwargs: dict) -> dict:
    built = dict(kwargs)
    for name in COMPONENTS:
        if built.get(name) is not None:
            built[name] = built[name]()
    return built


@contextlib.contextmanager
def _forward_transforms_off(compose):
    """Empties the buffer's forward transform pipeline (a ``Compose``) for one call; the actor runs one call at
    a time (``RayReplayBuffer.as_dataset`` refuses threaded actors and prefetching buffers)."""
    saved = compose.transforms
    compose.transforms = nn.ModuleList()
    try:
        yield
    finally:
        compose.transforms = saved


class BufferHost:
    """The object a Ray actor holds: a replay buffer built from constructors, and the calls clients make.

    An error of the buffer's constructor is kept and raised by :meth:`ready`, so that the process creating
    the actor gets it as it is (a ``TypeError`` stays a ``TypeError``) rather than as a dead actor.
    """

    def __init__(self, replay_buffer_cls: type, args: tuple, kwargs: dict) -> None:
        self._error: BaseException | None = None
        self.buffer = None
        # The limiter passed to the buffer (the same object, which the buffer keeps): poll_write asks it whether
        # an insert is permitted, from the buffer's public stats().
        limiter = kwargs.get("rate_limiter")
        self._insert_limiter = limiter if getattr(limiter, "blocks_inserts", False) else None
        try:
            self.buffer = replay_buffer_cls(*args, **_build_components(kwargs))
        except Exception as err:  # raised by ready(), in the creating process
            self._error = err

    def ready(self) -> str:
        """The buffer's class name, once built; re-raises the constructor's error."""
        if self._error is not None:
            raise self._error
        return type(self.buffer).__qualname__

    def describe(self, name: str) -> str | None:
        """``"method"``, ``"value"`` (a property or attribute) or ``None`` when the buffer has no ``name``."""
        try:
            static = inspect.getattr_static(self.buffer, name)
        except AttributeError:
            return None
        if isinstance(static, (staticmethod, classmethod)) or inspect.isfunction(static) or inspect.ismethod(static):
            return "method"
        return "value"

    def call(self, name: str, args: tuple, kwargs: dict):
        out = getattr(self.buffer, name)(*args, **kwargs)
        return SELF if out is self.buffer else out

    def call_with_object(self, name: str, args: tuple, value, kwargs: dict):
        """``buffer.<name>(*args, value, **kwargs)``: ``value`` (a component, generator, hook or transform) was
        put in the object store by the client, which checked there that it pickles, and Ray resolved it here."""
        return self.call(name, (*args, value), kwargs)

    def get(self, name: str):
        out = getattr(self.buffer, name)
        return SELF if out is self.buffer else out

    def set(self, name: str, value) -> None:
        setattr(self.buffer, name, value)

    def sample(self, batch_size: int | None, return_info: bool, readiness: dict | None = None):
        """``buffer.sample(batch_size, return_info, **readiness)`` with the batch encoded for the object store
        (``wire.encode``; the info dict travels as it is). ``readiness`` holds the ``timeout`` and
        ``cancel_event`` (:data:`CANCELLED` or ``None``) of a ``wait=False`` call, passed only when given."""
        out = self.buffer.sample(batch_size, return_info=return_info, **(readiness or {}))
        return (encode(out[0]), out[1]) if return_info else (encode(out), None)

    def poll_sample(self, batch_size: int | None, return_info: bool, first: bool, cancel_event=None):
        """One attempt of a client's ``sample(wait=True)``: ``(True, (batch, info), None)``, or ``(False, None,
        message)`` when the buffer cannot serve it now. The first attempt is the buffer's own wait with a zero
        timeout (it counts the wait and returns its ``TimeoutError`` message); the next ones draw only when
        ``can_sample`` says yes, and count nothing. Never waits (NOTE [waiting through a Ray actor])."""
        if not first and not self.buffer.can_sample(batch_size):
            return False, None, None
        try:
            out = self.buffer.sample(batch_size, return_info=True, wait=True, timeout=0.0,
                                     cancel_event=cancel_event)  # fmt: skip
        except TimeoutError as err:
            return False, None, str(err)
        return True, (encode(out[0]), out[1] if return_info else None), None

    def _insert_permitted(self, n: int) -> bool:
        """Whether the buffer's limiter permits writing ``n`` items now (read from the public ``stats()``)."""
        stats = self.buffer.stats()
        pending = stats.get("reserved_inserts", 0)
        return self._insert_limiter.insert_permitted(
            inserts=stats["write_count"] + pending, samples=stats["samples_returned"],
            size=stats["size"] + pending, n=n,
        )  # fmt: skip

    def poll_write(self, method: str, args: tuple, kwargs: dict, timeout: float | None, first: bool):
        """One attempt of a client's ``add``/``extend`` (``method``, with the caller's ``args`` and ``kwargs``
        but ``timeout``): ``(True, result, None)``, or ``(False, None, message)`` while a limiter that blocks
        inserts refuses it. Without such a limiter the write runs at once (``timeout`` is the buffer's to
        check). With one, the first attempt is the buffer's own wait with a zero timeout (it counts the wait and
        returns its ``TimeoutError`` message); the next ones write only when the limiter permits it. Never waits
        (NOTE [waiting through a Ray actor])."""
        write = getattr(self.buffer, method)
        if self._insert_limiter is None:
            out = write(*args, **kwargs) if timeout is None else write(*args, timeout=timeout, **kwargs)
            return True, SELF if out is self.buffer else out, None
        data = args[0] if args else kwargs.get("data", kwargs.get("tensordicts"))
        if not first and data is not None and not self._insert_permitted(1 if method == "add" else items_in(data)):
            return False, None, None
        try:
            out = write(*args, timeout=0.0, **kwargs)
        except TimeoutError as err:
            return False, None, str(err)
        return True, SELF if out is self.buffer else out, None

    def sample_raw(self, batch_size: int | None = None, readiness: dict | None = None):
        """``buffer.sample(batch_size, **readiness)`` without the forward transforms (see :meth:`sample_transform`):
        the buffer's own ``sample_raw`` when its class has one, else ``sample`` with the transforms emptied for
        the call (the actor runs one call at a time: ``as_dataset`` refuses ``max_concurrency`` above 1)."""
        own = getattr(type(self.buffer), "sample_raw", None)
        if callable(own):
            return self.buffer.sample_raw(batch_size, **(readiness or {}))
        with _forward_transforms_off(self.buffer.transform):
            return self.buffer.sample(batch_size, **(readiness or {}))

    def can_sample_raw_concurrently(self) -> bool:
        """Whether :meth:`sample_raw` is safe in a threaded actor (the buffer samples without transforms
        itself, without emptying its transforms for the other threads)."""
        return callable(getattr(type(self.buffer), "sample_raw", None))

    def sample_raw_batches(self, batch_size: int | None, count: int) -> list:
        """``count`` batches of :meth:`sample_raw`, encoded for the object store (``wire.encode``): the
        reader gets their tensors without a copy, and one call (one reply) carries them all."""
        return encode_all([self.sample_raw(batch_size) for _ in range(count)])

    def poll_raw_batches(self, batch_size: int | None, count: int, first: bool):
        """One attempt of a waiting reader (``RayReplayBuffer.as_dataset(wait=True)``): ``(True, batches,
        None)`` with up to ``count`` batches of :meth:`sample_raw`, as many as the buffer serves now (encoded as
        :meth:`sample_raw_batches` does), or ``(False, None, message)`` when it serves none. The first batch of
        a first attempt is the buffer's own wait with a zero timeout (it counts the wait and returns its
        ``TimeoutError`` message); every other batch is drawn only when ``can_sample`` says yes. Never waits
        (NOTE [waiting through a Ray actor])."""
        batches = []
        if first:
            try:
                batches.append(self.sample_raw(batch_size, {"wait": True, "timeout": 0.0}))
            except TimeoutError as err:
                return False, None, str(err)
        while len(batches) < count and self.buffer.can_sample(batch_size):
            batches.append(self.sample_raw(batch_size))
        return (True, encode_all(batches), None) if batches else (False, None, None)

    def sample_transform(self):
        """The buffer's forward transforms (a ``Compose``), for a process that samples with :meth:`sample_raw`."""
        return self.buffer.transform
