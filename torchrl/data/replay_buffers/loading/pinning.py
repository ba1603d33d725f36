"""Sampled batches put in pinned (page-locked) host memory: :func:`pin_host_memory`.

A copy from pinned memory to a CUDA device can run asynchronously (``to(device, non_blocking=True)``); from
pageable memory it cannot. Pinning needs an accelerator runtime: on a CPU-only torch, ``Tensor.pin_memory()``
raises, so nothing is pinned without CUDA. Only host tensors can be pinned: a batch already moved to a device,
or a TensorDict with leaves on several devices, keeps its device leaves as they are. Pinning a pinned tensor
returns it (torch's ``pin_memory`` does), so pinning a batch twice copies only what changed in between.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import is_tensor_collection

__all__ = ["pin_host_memory"]


def _pin_if_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory() if tensor.device.type == "cpu" else tensor


def pin_host_memory(data: Any) -> Any:
    """``data`` with its host tensors in pinned memory when CUDA is available; ``data`` itself otherwise.

    A tensor or a tensor collection (TensorDict, lazy stack, tensorclass) has its CPU leaves pinned and its
    other leaves kept; anything else (a list, a dict, a string) is returned unchanged.

    Args:
        data: a sampled batch.

    Returns:
        The batch, pinned where it lives on the host.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.loading.pinning import pin_host_memory
        >>> batch = torch.zeros(4)
        >>> pinned = pin_host_memory(batch)
        >>> torch.equal(pinned, batch)
        True
        >>> pinned.is_pinned() == torch.cuda.is_available()
        True
    """
    if not torch.cuda.is_available():  # a CPU-only runtime has no pinned allocator
        return data
    if isinstance(data, torch.Tensor):
        return _pin_if_host(data)
    if is_tensor_collection(data):
        device = data.device
        if device is None:  # leaves on several devices (or none bound): leaf by leaf
            return data.apply(_pin_if_host)
        return data.pin_memory() if device.type == "cpu" else data
    return data
