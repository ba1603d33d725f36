"""The one codec of a :class:`torch.Generator`'s state: pickles, ``state_dict()`` and checkpoints use it.

A state is ``{"state": <uint8 tensor or bytes>, "device": "<device>"}``:

- ``state_dict()`` holds a tensor (``torch.save`` and the checkpoint format store tensors as such);
- pickles hold ``bytes`` (``as_bytes=True``): a temporary tensor sent to a spawned process through torch's
  file-descriptor sharing could be freed before the child opens it;
- a checkpoint stores the tensor as a file and ``{"device": ..., "state": <tensor name>}`` in its JSON.

:func:`generator_from_state` reads either form, and refuses a malformed state with a message that names it
before any generator is touched.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["generator_from_state", "generator_to_state"]


def generator_to_state(generator: torch.Generator | None, *, as_bytes: bool = False) -> dict[str, Any] | None:
    """``{"state": ..., "device": ...}`` for ``generator`` (``None`` for ``None``).

    Keyword Args:
        as_bytes (bool): the state as ``bytes`` instead of a uint8 tensor (for pickles). Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers._checkpoint.generator_state import generator_from_state, generator_to_state
        >>> g = torch.Generator().manual_seed(0)
        >>> copy = generator_from_state(generator_to_state(g, as_bytes=True))
        >>> torch.rand(2, generator=copy).tolist() == torch.rand(2, generator=g).tolist()
        True
    """
    if generator is None:
        return None
    state = generator.get_state()
    return {"state": state.numpy().tobytes() if as_bytes else state.clone(), "device": str(generator.device)}


def generator_from_state(state: dict[str, Any] | None) -> torch.Generator | None:
    """A new generator in the state ``state`` (from :func:`generator_to_state`); ``None`` for ``None``.

    ``state["state"]`` may be a uint8 tensor (any subclass, e.g. a memory-mapped one) or ``bytes``.

    Raises:
        ValueError: if ``state`` is not such a dict, names an unknown device, or holds a state of the wrong
            dtype or size for that device's generator.
    """
    if state is None:
        return None
    if not isinstance(state, dict) or not {"state", "device"} <= state.keys():
        raise ValueError(
            f"A generator state must be a dict with keys 'state' and 'device' (see generator_to_state); got "
            f"{state!r:.200}."
        )
    raw, device = state["state"], state["device"]
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 1:
        found = f"a {raw.dtype} tensor of shape {list(raw.shape)}" if isinstance(raw, torch.Tensor) else repr(raw)
        raise ValueError(f"A generator state must be a 1-D uint8 tensor or bytes; got {found:.200}.")
    try:
        generator = torch.Generator(device=device)
        generator.set_state(raw.as_subclass(torch.Tensor).detach().cpu().clone())
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"Cannot restore a generator on device {device!r} from a state of {raw.numel()} bytes: {err}"
        ) from None
    return generator
