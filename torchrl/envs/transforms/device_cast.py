"""Sampled batches moved to a device, and written data moved back: :class:`DeviceCastTransform`.

NOTE [non-blocking device casts]: a copy to a CUDA device is issued with ``non_blocking=True``: from pinned
(page-locked) host memory it runs asynchronously, and the caller's stream orders every later use of the result
after it; from pageable memory CUDA stages it and it returns once the source is read, so it is correct either
way. Torch's caching host allocator keeps a pinned source alive until the copy that reads it has run, so the
batch may be dropped at once. A copy to the host (or to any device other than CUDA) must be finished before
the result is read: a TensorDict is moved with :meth:`tensordict.TensorDictBase.to`'s default, which issues
non-blocking copies and synchronizes once at the end for such targets; a tensor is copied blocking.
A buffer built with ``pin_memory=True`` pins the collated batch before its transforms run, so the copy of this
transform is the asynchronous one.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, is_tensor_collection

from torchrl.envs.transforms.transforms import Transform

__all__ = ["DeviceCastTransform"]


def _check_device(name: str, device, *, optional: bool = False) -> torch.device | None:
    if device is None and optional:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"`{name}` must be a torch.device, a device string such as 'cuda:0' or 'cpu', or a device index; got "
            f"{device!r} ({type(device).__name__})."
        )
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"`{name}` must name a device, such as 'cuda', 'cuda:1' or 'cpu'; got {device!r} ({err})."
        ) from None


def _move(value, device: torch.device):
    """``value`` on ``device``: see NOTE [non-blocking device casts]."""
    if is_tensor_collection(value):
        return value.to(device)
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=device.type == "cuda")
    return value


class DeviceCastTransform(Transform):
    """Moves sampled data to ``device``, and written data to ``orig_device``.

    On a replay buffer's sample path (``forward``) the batch, or only the entries in ``in_keys``, is copied to
    ``device``; on the write path (``inv``) data is copied to ``orig_device`` if one is given, and left where it
    is otherwise. A copy to a CUDA device does not block the host; build the buffer with ``pin_memory=True``
    so that it copies from pinned memory and runs asynchronously (see NOTE [non-blocking device casts] in this
    module). A copy to the host blocks until the data is there.

    Args:
        device (torch.device, str or int): where ``forward`` puts the data.
        orig_device (torch.device, str or int, optional): where ``inv`` puts the data. Defaults to ``None``:
            ``inv`` leaves the data unchanged (needed with ``in_keys_inv``).

    Keyword Args:
        in_keys (list of NestedKey, optional): the entries ``forward`` moves. Defaults to ``None``: the whole
            TensorDict (or tensor), and then ``inv`` moves the whole of it to ``orig_device``.
        out_keys (list of NestedKey, optional): where the moved entries are written. Defaults to ``in_keys``.
        in_keys_inv (list of NestedKey, optional): the entries ``inv`` moves to ``orig_device``. Defaults to
            ``None``.
        out_keys_inv (list of NestedKey, optional): where ``inv`` writes them. Defaults to ``in_keys_inv``.

    A TensorDict whose own ``device`` differs from the target is returned as a shallow copy without a device
    when only some of its entries move (its other entries stay where they are).

    Raises:
        TypeError: ``device`` or ``orig_device`` is not a device, a device string or an index.
        ValueError: a device string names no device, or ``in_keys_inv`` is given without ``orig_device``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl.envs.transforms import DeviceCastTransform
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
        ...                             transform=DeviceCastTransform("meta"))  # "cuda" on a GPU
        >>> _ = rb.extend(TensorDict(obs=torch.zeros(10, 3), batch_size=[10]))
        >>> rb.sample()["obs"].device
        device(type='meta')
    """

    def __init__(self, device, orig_device=None, *, in_keys=None, out_keys=None, in_keys_inv=None,
                 out_keys_inv=None):
        device = _check_device("device", device)
        orig_device = _check_device("orig_device", orig_device, optional=True)
        super().__init__(in_keys=in_keys, out_keys=out_keys, in_keys_inv=in_keys_inv, out_keys_inv=out_keys_inv)
        if self.in_keys_inv and orig_device is None:
            raise ValueError(
                f"`in_keys_inv`={self.in_keys_inv} needs `orig_device`, the device `inv` moves those entries to: "
                f"pass DeviceCastTransform(device, orig_device, in_keys_inv=...)."
            )
        self.device = device
        self.orig_device = orig_device
        self._whole = not self.in_keys and not self.in_keys_inv

    def forward(self, tensordict):
        """The sample path: ``tensordict`` (or its ``in_keys`` entries, written at ``out_keys``) on ``device``."""
        if self._whole:
            return _move(tensordict, self.device)
        return self._move_entries(tensordict, self.in_keys, self.out_keys, self.device)

    def inv(self, tensordict):
        """The write path: ``tensordict`` (or its ``in_keys_inv`` entries) on ``orig_device``; unchanged without
        ``orig_device``."""
        if self._whole:
            return tensordict if self.orig_device is None else _move(tensordict, self.orig_device)
        if not self.in_keys_inv:
            return tensordict
        return self._move_entries(tensordict, self.in_keys_inv, self.out_keys_inv, self.orig_device)

    @staticmethod
    def _move_entries(tensordict: TensorDictBase, in_keys, out_keys, device: torch.device) -> TensorDictBase:
        if tensordict.device is not None and tensordict.device != device:
            # a TensorDict bound to a device would cast the moved entries back: a shallow copy without a device
            tensordict = tensordict.copy().clear_device_()
        for in_key, out_key in zip(in_keys, out_keys):
            value = tensordict.get(in_key, None)
            if value is not None:
                tensordict.set(out_key, _move(value, device))
        return tensordict

    def __repr__(self) -> str:
        keys = f", in_keys={self.in_keys}" if self.in_keys else ""
        keys_inv = f", in_keys_inv={self.in_keys_inv}" if self.in_keys_inv else ""
        return f"{type(self).__name__}(device={self.device}, orig_device={self.orig_device}{keys}{keys_inv})"
