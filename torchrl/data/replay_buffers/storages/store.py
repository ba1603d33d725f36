"""TorchRL's module path of ``StoreStorage``, its storage over a Redis-compatible key-value server.

Not implemented yet: the module imports, and importing or reading ``StoreStorage`` raises
:class:`~torchrl.data._torchrl_names.NotProvidedError` (an :class:`ImportError`) that says so, as from
``torchrl.data`` and ``torchrl.data.replay_buffers.storages``.
"""

from torchrl.data._torchrl_names import not_provided_getattr

__all__: list[str] = []

__getattr__ = not_provided_getattr(__name__, ["StoreStorage"])
