"""The metaclass of buffers whose readiness must reach every client: only backends that forward it are accepted.

:class:`~torchrl.data.RateLimitedReplayBuffer` reserves its budget where the buffer lives, in one atomic step per
draw: in this process and the processes sharing its memory (``service_backend="direct"``), or in the Ray actor
that hosts it (``service_backend="ray"``, whose clients forward ``sample(wait=..., timeout=..., cancel_event=...)``
and ``can_sample``, waiting in the caller: NOTE [waiting through a Ray actor] in ``_ray/waiting.py``). A backend
registered by someone else (:func:`~torchrl.data.replay_buffers.replay_buffers._service_backend.register_service_backend`)
makes no such promise, so it is refused at construction with TorchRL's message, before the service keywords are
read. (TorchRL refuses every backend but ``"direct"``; accepting ``"ray"`` goes beyond it.)
"""

from __future__ import annotations

from torchrl.data.replay_buffers.errors import torchrl_error
from torchrl.data.replay_buffers.replay_buffers._service_backend import ServiceBackendMeta

__all__ = ["READINESS_BACKENDS", "ReadinessBackendMeta"]

#: The backends whose handles forward the readiness calls (``wait``/``timeout``/``cancel_event``, ``can_sample``).
READINESS_BACKENDS = ("direct", "ray")


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
            raise torchrl_error("rate_service_backend", cls=cls.__name__, backend=backend)
        check = getattr(cls, "check_hosted_kwargs", None)
        if backend is not None and backend != "direct" and check is not None:
            check(kwargs)
        return super().__call__(*args, **kwargs)
