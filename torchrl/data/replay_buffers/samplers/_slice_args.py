"""Validation of the constructor arguments shared by the slice samplers.

Each helper checks one argument and returns its normalized value; errors name the argument, show the value
received and say what to pass instead.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchrl.data.replay_buffers.samplers._trajectories import normalize_key


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    return value


def normalize_span(span) -> tuple[bool | int, bool | int]:
    """``span`` as a ``(left, right)`` pair of bools or non-negative ints."""

    def side(value):
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value >= 0:
            return value
        raise TypeError(
            f"`span` must be a bool, a non-negative int or a (left, right) pair of them, got {span!r}."
        )

    if isinstance(span, (tuple, list)):
        if len(span) != 2:
            raise TypeError(f"`span` as a sequence must be a (left, right) pair, got {span!r}.")
        return side(span[0]), side(span[1])
    return side(span), side(span)


def check_static(values, name: str) -> torch.Tensor:
    """``ends``/``trajectories``: a 1-D or 2-D tensor."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(
            f"`{name}` must be a torch.Tensor with one value per stored step, got {type(values).__name__}."
        )
    if values.ndim not in (1, 2):
        raise ValueError(
            f"`{name}` must be 1-D ([steps]) or 2-D ([time, envs] for ndim=2 storages), got shape "
            f"{list(values.shape)}."
        )
    return values


def normalize_end_keys(end_key, end_keys) -> tuple[object, tuple | None]:
    """``(end_key, end_keys)`` normalized; at most one of them is given.

    ``end_keys`` is a list (or tuple) of nested keys whose done flags are OR-ed together.
    """
    if end_keys is None:
        return (None if end_key is None else normalize_key(end_key)), None
    if end_key is not None:
        raise ValueError(
            f"Pass at most one of `end_key` and `end_keys`; got end_key={end_key!r} and "
            f"end_keys={end_keys!r}. Put every done key in end_keys (their flags are OR-ed together)."
        )
    if isinstance(end_keys, str) or not isinstance(end_keys, (list, tuple)):
        raise TypeError(
            f"`end_keys` must be a list of keys, got {end_keys!r}. Pass e.g. end_keys=[('next', 'done'), "
            f"('next', 'truncated')], or end_key=... for a single key."
        )
    if not end_keys:
        raise ValueError("`end_keys` is empty: pass at least one key, or leave it out (end_key=None).")
    return None, tuple(normalize_key(key) for key in end_keys)


def check_compile(compile) -> bool | dict:
    """``compile``: a bool, or a mapping of ``torch.compile`` keyword arguments (as TorchRL takes)."""
    if isinstance(compile, bool):
        return compile
    if isinstance(compile, Mapping):
        return dict(compile)
    raise TypeError(
        f"`compile` must be a bool or a dict of torch.compile keyword arguments, got {compile!r}. Pass "
        f"compile=False (it has no effect on this sampler either way)."
    )


def check_use_gpu(use_gpu) -> bool | torch.device:
    """``use_gpu``: a bool or a device (as TorchRL takes)."""
    if isinstance(use_gpu, (bool, torch.device)):
        return use_gpu
    if isinstance(use_gpu, str):
        try:
            return torch.device(use_gpu)
        except RuntimeError:
            pass
    raise TypeError(
        f"`use_gpu` must be a bool or a torch.device, got {use_gpu!r}. Pass use_gpu=False (it has no effect "
        f"on this sampler either way)."
    )
