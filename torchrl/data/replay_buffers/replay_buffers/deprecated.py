"""Names TorchRL keeps at ``replay_buffers.replay_buffers.deprecated`` for old code: :class:`InPlaceSampler`,
which TorchRL removed without replacement (building one raises), and :func:`stack_tensors`."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from torchrl._phrases import TorchRLPhrase

__all__ = ["InPlaceSampler", "stack_tensors"]

IN_PLACE_SAMPLER_REMOVED = TorchRLPhrase(
    RuntimeError,
    "This class has been removed without replacement. In-place sampling should be avoided.",
    "InPlaceSampler(device={device!r}): This class has been removed without replacement. In-place sampling "
    "should be avoided. Sample a batch with rb.sample() and move it with batch.to(device) instead.",
)


class InPlaceSampler:
    """TorchRL's removed in-place sampler: building one raises ``RuntimeError`` (as in TorchRL).

    Kept so that code importing the name still imports; the message says what to do instead.

    Args:
        device (torch.device, optional): ignored (TorchRL's signature). Defaults to ``None``.

    Examples:
        >>> from torchrl.data.replay_buffers.replay_buffers import InPlaceSampler
        >>> InPlaceSampler()
        Traceback (most recent call last):
        ...
        RuntimeError: InPlaceSampler(device=None): This class has been removed without replacement. ...
    """

    def __init__(self, device=None) -> None:
        raise IN_PLACE_SAMPLER_REMOVED.error(device=device)


def stack_tensors(list_of_tensor_iterators: Iterable[Iterable[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Stacks the i-th tensors of each iterable together: ``tuple(torch.stack(column, 0) for column in zip(...))``.

    Args:
        list_of_tensor_iterators: iterables of tensors, e.g. a list of ``(obs, action)`` pairs. Iteration stops
            at the shortest one (``zip``).

    Returns:
        one stacked tensor per position, in a tuple (empty when no iterable is given).

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.replay_buffers import stack_tensors
        >>> obs, action = stack_tensors([(torch.zeros(3), torch.tensor(0)), (torch.ones(3), torch.tensor(1))])
        >>> obs.shape, action
        (torch.Size([2, 3]), tensor([0, 1]))
    """
    return tuple(torch.stack(column, 0) for column in zip(*list_of_tensor_iterators))
