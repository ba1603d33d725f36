"""The metaclass of buffers that only run in this process (``service_backend="direct"``).

:class:`~torchrl.data.RateLimitedReplayBuffer` reserves its budget under a lock shared by the processes that share
the buffer's memory; a Ray actor hosting it would hold a budget of its own that the clients' waits could not see
(``RayReplayBuffer.sample`` forwards no ``wait``). As in TorchRL, such a buffer refuses every other backend, at
construction, before the service keywords are read.
"""

from __future__ import annotations

from torchrl.data.replay_buffers.errors import torchrl_error
from torchrl.data.replay_buffers.replay_buffers._service_backend import ServiceBackendMeta

__all__ = ["DirectOnlyMeta"]


class DirectOnlyMeta(ServiceBackendMeta):
    """:class:`ServiceBackendMeta` that refuses ``service_backend`` other than ``"direct"`` (and
    ``use_ray_service=True``) with TorchRL's message."""

    def __call__(cls, *args, **kwargs):
        backend = kwargs.get("service_backend")
        if kwargs.get("use_ray_service") is True:
            backend = "ray"
        if backend is not None and backend != "direct":
            raise torchrl_error("rate_service_backend", cls=cls.__name__, backend=backend)
        return super().__call__(*args, **kwargs)
