"""Where a buffer runs: ``ReplayBuffer(..., service_backend=...)``, read by the metaclass :class:`ServiceBackendMeta`.

TorchRL's buffers take ``service_backend="direct"`` (the default: the buffer lives in this process) or
``"ray"`` (``cls(...)`` returns a :class:`~torchrl.data.RayReplayBuffer` whose Ray actor hosts a ``cls``), with
``service_backend_options`` (the service's own keywords), ``transport``/``transport_options`` (how calls reach
the service) and the deprecated ``use_ray_service``. :class:`ServiceBackendMeta` reads these keywords before
``__init__`` runs, so no buffer class declares them.

NOTE [service backend registry]: a backend other than ``"direct"`` is a factory registered under its name with
:func:`register_service_backend` by the module that implements it (``ray_buffer.py`` registers ``"ray"`` when it
is imported, and ``torchrl.data`` imports it). This module and ``base.py`` import no backend: the backend
modules import the buffers, not the reverse. A hosted buffer's handle says which class it hosts in its
``_service_cls`` attribute (TorchRL's name), and ``isinstance(handle, cls)`` is ``True`` when that class is a
subclass of ``cls``; ``issubclass`` is unchanged (the handle's class is no buffer class).
"""

from __future__ import annotations

import abc
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool

__all__ = [
    "HOSTED_CLASS_ATTRIBUTE",
    "READINESS_BACKENDS",
    "ReadinessBackendMeta",
    "TENSOR_CHANNEL_ALTERNATIVES",
    "ServiceBackendMeta",
    "check_direct_transport",
    "check_service_options",
    "register_service_backend",
]

#: The backends TorchRL defines; one that is not registered yet is named in the error.
KNOWN_BACKENDS = ("direct", "ray")
#: The transports of the direct backend (calls are plain method calls).
DIRECT_TRANSPORTS = ("auto", "direct")
#: The attribute by which a handle on a hosted buffer names the class it hosts (TorchRL's name).
HOSTED_CLASS_ATTRIBUTE = "_service_cls"
#: Where each backend of :data:`KNOWN_BACKENDS` is implemented (for the error when it is not registered).
_IMPLEMENTED_IN = {"ray": "torchrl.data.replay_buffers.ray_buffer"}
_SERVICE_KEYWORDS = frozenset(
    {"service_backend", "service_backend_options", "transport", "transport_options", "use_ray_service"}
)
_FACTORIES: dict[str, Callable[..., Any]] = {}


def register_service_backend(name: str, factory: Callable[..., Any]) -> None:
    """Makes ``cls(*args, service_backend=name, **kwargs)`` return ``factory(cls, args, kwargs, options=...,
    transport=..., transport_options=...)`` for every buffer class ``cls``.

    ``kwargs`` holds the buffer's own keywords (the service keywords removed); ``options`` is the
    ``service_backend_options`` dict (``{}`` when not given). Registering a name again replaces its factory.
    """
    if not isinstance(name, str) or not name or name == "direct":
        raise ValueError(f"`name` must be a non-empty str other than 'direct', got {name!r}.")
    if not callable(factory):
        raise TypeError(f"`factory` must be callable, got {factory!r}.")
    _FACTORIES[name] = factory


def _choices() -> str:
    names = dict.fromkeys((*KNOWN_BACKENDS, *sorted(_FACTORIES)))
    return ", ".join(repr(name) for name in names)


def check_service_options(backend: str, options, allowed: tuple[str, ...]) -> dict:
    """``service_backend_options`` as a new dict; ``TypeError`` unless it is a dict (or ``None``) whose keys
    are in ``allowed``."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(
            f"`service_backend_options` must be a dict of keyword arguments or None, got {options!r}."
        )
    unknown = [key for key in options if key not in allowed]
    if unknown:
        raise TypeError(
            f"`service_backend_options` of service_backend={backend!r} take {', '.join(map(repr, allowed))}; "
            f"got {', '.join(map(repr, unknown))}. Pass the buffer's own arguments (batch_size, storage, ...) "
            f"to the buffer itself, not in service_backend_options."
        )
    return dict(options)


def _resolve_backend(cls: type, kwargs: dict) -> str:
    """Pops ``service_backend`` and ``use_ray_service`` from ``kwargs``; returns the backend's name."""
    backend = kwargs.pop("service_backend", None)
    use_ray_service = kwargs.pop("use_ray_service", None)
    if use_ray_service is not None:
        use_ray_service = check_bool("use_ray_service", use_ray_service, hint="Prefer service_backend='ray'.")
        warnings.warn(
            f"`use_ray_service` is deprecated (as in TorchRL): pass {cls.__name__}(..., service_backend="
            f"{'ray' if use_ray_service else 'direct'!r}) instead.",
            DeprecationWarning,
            stacklevel=3,  # the caller of cls(...)
        )
        implied = "ray" if use_ray_service else "direct"
        if backend is not None and backend != implied:
            raise ValueError(
                f"`use_ray_service`={use_ray_service} contradicts `service_backend`={backend!r}. Pass "
                f"service_backend only (use_ray_service is deprecated)."
            )
        backend = implied
    if backend is None:
        return "direct"
    if backend != "direct" and backend not in _FACTORIES:
        if isinstance(backend, str) and backend in _IMPLEMENTED_IN:
            raise ValueError(
                f"`service_backend`={backend!r} is implemented by {_IMPLEMENTED_IN[backend]}, which is not "
                f"imported: import torchrl.data (or that module) first. Choices: {_choices()}."
            )
        raise ValueError(f"`service_backend` must be one of {_choices()}, got {backend!r}.")
    return backend


#: TorchRL's transport over ``torch.distributed`` tensor channels, and the process-group backends it runs on.
TENSOR_CHANNEL_TRANSPORTS = ("distributed", "gloo", "nccl")
#: What to use instead of TorchRL's tensor channels (gloo / NCCL), in the errors that refuse them.
TENSOR_CHANNEL_ALTERNATIVES = (
    "To write and sample one buffer from several processes of this machine, build it with shared=True (or call "
    "rb.share()) and hand it to them (rb.as_dataset() for DataLoader workers); to reach it from other machines, "
    "host it in a Ray actor: service_backend='ray' (transport='ray')."
)


def check_direct_transport(owner: str, transport, transport_options) -> None:
    """Raises ``ValueError`` unless ``transport`` is an in-process transport (``"auto"``, ``"direct"``) and
    ``transport_options`` configures nothing (``None`` or ``{}``), as TorchRL's direct backend requires.

    TorchRL's gloo / NCCL tensor channels (``transport="distributed"``) reach a buffer hosted as a service; this
    package has none, and the error names what does the same here: a shared buffer, or a Ray actor.
    """
    if transport in TENSOR_CHANNEL_TRANSPORTS:
        raise ValueError(
            f"`transport`={transport!r}: TorchRL's transport='distributed' sends tensors over torch.distributed "
            f"(gloo or NCCL) to a buffer hosted as a service, and this package does not implement those "
            f"channels; {owner} runs in this process (service_backend='direct'), which takes transport='auto' "
            f"or 'direct'. {TENSOR_CHANNEL_ALTERNATIVES}"
        )
    if transport not in DIRECT_TRANSPORTS:
        raise ValueError(
            f"`transport`={transport!r} is a transport to a service, and {owner} runs in this process "
            f"(service_backend='direct'), which takes transport='auto' or 'direct'. Pass service_backend='ray' "
            f"for a buffer in a Ray actor, or leave `transport` out."
        )
    if transport_options:  # None or {}: nothing to configure
        raise ValueError(
            f"`transport_options`={transport_options!r} configure a transport to a service (TorchRL's gloo / NCCL "
            f"channels), and {owner} runs in this process (service_backend='direct'): leave `transport_options` "
            f"out. {TENSOR_CHANNEL_ALTERNATIVES}"
        )


def _check_direct(cls: type, options, transport, transport_options) -> None:
    """The direct backend takes no service options and only the in-process transports (TorchRL's rules)."""
    if options:
        raise ValueError(
            f"`service_backend_options`={options!r} configure a service, and {cls.__name__} runs in this process "
            f"(service_backend='direct'): pass service_backend='ray' with them, or leave them out."
        )
    check_direct_transport(cls.__name__, transport, transport_options)


def _init_signature(cls: type) -> inspect.Signature:
    """``cls.__init__``'s signature without ``self``, plus the service keywords read by the metaclass."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = {p.name for p in params}
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
        for name, default in (("service_backend", "direct"), ("service_backend_options", None),
                              ("transport", "auto"), ("transport_options", None))
        if name not in names
    ]
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    return inspect.Signature(params[:at] + extra + params[at:])


class ServiceBackendMeta(abc.ABCMeta):
    """Metaclass of the replay buffers: reads TorchRL's service keywords and answers ``isinstance`` for handles.

    ``cls(*args, service_backend=..., service_backend_options=..., transport=..., transport_options=...,
    use_ray_service=..., **kwargs)``:

    - ``service_backend="direct"`` (the default): ``cls(*args, **kwargs)``, with ``transport`` in ``"auto"`` /
      ``"direct"``, no ``transport_options`` and no ``service_backend_options`` (``ValueError`` otherwise);
    - another registered backend (``"ray"``): what its factory returns, e.g. a
      :class:`~torchrl.data.RayReplayBuffer` hosting ``cls``;
    - an unknown name: ``ValueError`` naming the choices. ``use_ray_service=True``/``False`` means ``"ray"``/
      ``"direct"`` and warns (``DeprecationWarning``).

    Only construction goes through here: ``pickle`` and ``copy`` rebuild buffers without calling the class.
    Derived from :class:`abc.ABCMeta` so that buffers mix with ABCs (``IterableDataset``) without a metaclass
    conflict.

    Examples:
        >>> from torchrl.data import ReplayBuffer
        >>> rb = ReplayBuffer(service_backend="direct", transport="auto")  # a buffer in this process
        >>> rb.service_backend, rb.client() is rb
        ('direct', True)
        >>> ReplayBuffer(transport="ray")
        Traceback (most recent call last):
          ...
        ValueError: `transport`='ray' is a transport to a service, and ReplayBuffer runs in this process ...
    """

    def __call__(cls, *args, **kwargs):
        if kwargs.keys().isdisjoint(_SERVICE_KEYWORDS):
            return super().__call__(*args, **kwargs)
        backend = _resolve_backend(cls, kwargs)
        options = kwargs.pop("service_backend_options", None)
        transport = kwargs.pop("transport", "auto")
        transport_options = kwargs.pop("transport_options", None)
        if backend == "direct":
            _check_direct(cls, options, transport, transport_options)
            return super().__call__(*args, **kwargs)
        return _FACTORIES[backend](cls, args, kwargs, options=options, transport=transport,
                                   transport_options=transport_options)

    def __instancecheck__(cls, obj) -> bool:
        if super().__instancecheck__(obj):
            return True
        if not hasattr(type(obj), HOSTED_CLASS_ATTRIBUTE):
            return False  # not a handle on a hosted buffer (asked of the class: no __getattr__ runs)
        hosted = getattr(obj, HOSTED_CLASS_ATTRIBUTE, None)
        return isinstance(hosted, type) and issubclass(hosted, cls)

    @property
    def __signature__(cls) -> inspect.Signature:
        # inspect.signature (and Sphinx) would otherwise show this metaclass's ``__call__(*args, **kwargs)``.
        return _init_signature(cls)


# -- buffers whose readiness must reach every client ----------------------------------------------------------------
# RateLimitedReplayBuffer reserves its budget where the buffer lives, in one atomic step per draw: in this process
# and the processes sharing its memory ("direct"), or in the Ray actor that hosts it ("ray", whose clients forward
# sample(wait=..., timeout=..., cancel_event=...) and can_sample, waiting in the caller: NOTE [waiting through a Ray
# actor] in _ray/waiting.py). A backend registered by someone else makes no such promise, so it is refused at
# construction with TorchRL's message, before the service keywords are read. (TorchRL refuses every backend but
# "direct"; accepting "ray" goes beyond it.)

#: The backends whose handles forward the readiness calls (``wait``/``timeout``/``cancel_event``, ``can_sample``).
READINESS_BACKENDS = ("direct", "ray")

RATE_SERVICE_BACKEND = TorchRLPhrase(
    ValueError,
    "does not support service_backend=",
    "{cls} does not support service_backend={backend!r}: its sample budget is reserved where the buffer lives, "
    "and only the 'direct' and 'ray' backends forward sample(wait=...) and can_sample. Use "
    "service_backend='direct' (share the buffer: rb.share(), or rb.as_dataset() for DataLoader workers) or "
    "service_backend='ray'.",
)


class ReadinessBackendMeta(ServiceBackendMeta):
    """:class:`ServiceBackendMeta` that refuses a ``service_backend`` outside :data:`READINESS_BACKENDS` with
    TorchRL's message (``use_ray_service=True`` means ``"ray"``).

    For a hosted buffer (``"ray"``), the class's ``check_hosted_kwargs(kwargs)`` classmethod, when it has one,
    checks its own arguments first, so that a bad one raises here before any actor starts.
    """

    def __call__(cls, *args, **kwargs):
        backend = kwargs.get("service_backend")
        if kwargs.get("use_ray_service") is True:
            backend = "ray"
        if backend is not None and backend not in READINESS_BACKENDS:
            raise RATE_SERVICE_BACKEND.error(cls=cls.__name__, backend=backend)
        check = getattr(cls, "check_hosted_kwargs", None)
        if backend is not None and backend != "direct" and check is not None:
            check(kwargs)
        return super().__call__(*args, **kwargs)
