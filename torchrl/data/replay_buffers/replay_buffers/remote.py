"""A TensorDict buffer whose methods can be called over ``torch.distributed.rpc``:
:class:`RemoteTensorDictReplayBuffer`.

How it works. ``rpc.remote(owner, RemoteTensorDictReplayBuffer, kwargs=...)`` builds the buffer in the
``owner`` process and returns an ``RRef``; any process then calls a public method on the owner with
``rpc.rpc_sync(rref.owner(), RemoteTensorDictReplayBuffer.sample, args=(rref, batch_size))``. Every public
method of the class accepts the ``RRef`` in place of ``self`` and runs on the buffer the ``RRef`` holds
(:func:`accept_remote_rref_udf_invocation`); called on the buffer itself, it is a plain
:class:`TensorDictReplayBuffer`. Arguments and results travel by value (pickled by the rpc agent).
"""

from __future__ import annotations

import functools
import inspect

from torchrl.data.replay_buffers.replay_buffers.tensordict import TensorDictReplayBuffer

__all__ = ["RemoteTensorDictReplayBuffer", "accept_remote_rref_invocation", "accept_remote_rref_udf_invocation"]


@functools.cache
def _rref_type():
    """The class of the RRefs the rpc agent passes (``torch.distributed.rpc.PyRRef``, the base of ``RRef``);
    ``None`` when this torch build has no rpc support."""
    import torch.distributed

    if not torch.distributed.is_available():
        return None
    from torch.distributed import rpc

    return rpc.PyRRef if rpc.is_available() else None


def accept_remote_rref_invocation(func):
    """Lets method ``func`` be called with an ``RRef`` to its object as ``self`` (it runs on the local value).

    Only the owner of the ``RRef`` holds the value: call the method on ``rref.owner()`` (``rpc.rpc_sync``).
    """

    @functools.wraps(func)
    def unwrap_rref(self, *args, **kwargs):
        rref = _rref_type()
        if rref is not None and isinstance(self, rref):
            self = self.local_value()
        return func(self, *args, **kwargs)

    return unwrap_rref


def accept_remote_rref_udf_invocation(cls: type) -> type:
    """Class decorator: every public method of ``cls`` (inherited ones included) accepts an ``RRef`` as ``self``.

    ``__len__`` is wrapped too; properties, class methods, static methods and the other names starting with
    ``_`` are left as they are. Each wrapper
    is set on ``cls`` under the qualified name ``cls.<method>``, so the rpc agent (which pickles functions by
    name) finds the wrapper, not the method it wraps.
    """
    for name in dir(cls):
        if name.startswith("_") and name != "__len__":
            continue
        raw = inspect.getattr_static(cls, name)
        if not inspect.isfunction(raw):
            continue
        wrapper = accept_remote_rref_invocation(raw)
        wrapper.__qualname__ = f"{cls.__qualname__}.{name}"
        wrapper.__module__ = cls.__module__
        setattr(cls, name, wrapper)
    return cls


@accept_remote_rref_udf_invocation
class RemoteTensorDictReplayBuffer(TensorDictReplayBuffer):
    """A :class:`TensorDictReplayBuffer` whose public methods can be called through an rpc ``RRef``.

    Takes the arguments of :class:`TensorDictReplayBuffer`. Build it on the process that holds the data with
    ``rpc.remote``, and call its methods from other processes with ``rpc.rpc_sync(rref.owner(),
    RemoteTensorDictReplayBuffer.<method>, args=(rref, ...))``. Used directly, it is a local buffer.

    .. note:: Import this module (``import torchrl.data``) in the owner process before ``rpc.init_rpc``: the
        rpc agent unpickles requests in several threads, and two of them importing the package at once fail.

    The number of items is ``rpc.rpc_sync(rref.owner(), RemoteTensorDictReplayBuffer.__len__, args=(rref,))``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, RemoteTensorDictReplayBuffer
        >>> rb = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
        >>> _ = rb.extend(TensorDict(obs=torch.arange(4), batch_size=[4]))
        >>> rb.sample()["obs"].shape, len(rb)
        (torch.Size([2]), 4)

        Over rpc (``owner`` is the name of the process that built it)::

            rref = rpc.remote(owner, RemoteTensorDictReplayBuffer, kwargs={"storage": LazyTensorStorage(100)})
            rpc.rpc_sync(rref.owner(), RemoteTensorDictReplayBuffer.extend, args=(rref, data))
            batch = rpc.rpc_sync(rref.owner(), RemoteTensorDictReplayBuffer.sample, args=(rref, 32))
    """

    def __init__(self, *args, **kwargs) -> None:
        # TorchRL's signature forwards *args, and TensorDictReplayBuffer takes keywords only: say so here.
        if args:
            raise TypeError(
                f"RemoteTensorDictReplayBuffer takes the arguments of TensorDictReplayBuffer by keyword only (e.g. "
                f"storage=LazyTensorStorage(100), batch_size=32), got {len(args)} positional argument(s): "
                f"{', '.join(type(a).__name__ for a in args)}."
            )
        super().__init__(**kwargs)

    def sample(
        self,
        batch_size: int | None = None,
        include_info: bool | None = None,
        return_info: bool = False,
        *,
        wait: bool = False,
        timeout: float | None = None,
        cancel_event=None,
    ):
        """:meth:`TensorDictReplayBuffer.sample`, with this class's positional order in TorchRL: ``include_info``
        before ``return_info``."""
        return super().sample(
            batch_size, return_info, include_info, wait=wait, timeout=timeout, cancel_event=cancel_event
        )

