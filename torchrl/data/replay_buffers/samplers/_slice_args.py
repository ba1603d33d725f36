"""The constructor arguments shared by the slice samplers: :class:`SliceArgs`, checked once.

:class:`SliceSampler`, :class:`SliceSamplerWithoutReplacement` and :class:`PrioritizedSliceSampler` keep
TorchRL's explicit signatures and hand their arguments to :meth:`SliceArgs.from_arguments`, which validates
and normalizes them in one place. Each helper below checks one argument and returns its normalized value;
errors name the argument, show the value received and say what to pass instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_positive_int, is_int
from torchrl.data.replay_buffers.errors import ValueRuntimeError
from torchrl.data.replay_buffers.trajectories.interleaved import check_fragmented_step_key
from torchrl.data.replay_buffers.trajectories.keys import normalize_key

SLICE_END_KEYS = TorchRLPhrase(
    ValueRuntimeError,
    "exclusive",
    "end_key and end_keys are mutually exclusive (got end_key={end_key!r}, end_keys={end_keys!r}). Pass one "
    "key with end_key, or several with end_keys.",
)
SLICE_FRAGMENTED_SPAN = TorchRLPhrase(
    NotImplementedError,
    "span is not supported with fragmented=True",
    "span is not supported with fragmented=True (got span={span!r}): windows lie inside runs of consecutive "
    "steps. Pass span=False.",
)
SLICE_FRAGMENTED_COMPILE = TorchRLPhrase(
    NotImplementedError,
    "compile is not supported with fragmented=True",
    "compile is not supported with fragmented=True (got compile={compile!r}). Pass compile=False.",
)
SLICE_PAD_STRICT = TorchRLPhrase(
    ValueError,
    "pad_output=True is incompatible",
    "pad_output=True is incompatible with strict_length=True: padding keeps short trajectories, strict length "
    "drops them. Pass strict_length=False to pad, or pad_output=False to drop them.",
)


def normalize_span(span) -> tuple[bool | int, bool | int]:
    """``span`` as a ``(left, right)`` pair of bools or non-negative ints."""

    def side(value):
        if isinstance(value, bool) or (is_int(value) and value >= 0):
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
        raise SLICE_END_KEYS.error(end_key=end_key, end_keys=end_keys)
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


def check_fragmented(fragmented, step_key, span, compile, ends, trajectories) -> None:
    """``fragmented=True`` (interleaved trajectories): the arguments it refuses, as TorchRL refuses them."""
    if not check_fragmented_step_key(fragmented, step_key):
        return
    if ends is not None or trajectories is not None:
        name = "ends" if ends is not None else "trajectories"
        raise ValueError(
            f"`{name}` cannot be used with fragmented=True: interleaved trajectories are read from the stored "
            f"`traj_key` and `step_key` entries. Leave `{name}` out."
        )
    if any(normalize_span(span)):
        raise SLICE_FRAGMENTED_SPAN.error(span=span)
    if compile:
        raise SLICE_FRAGMENTED_COMPILE.error(compile=compile)


@dataclass(frozen=True)
class SliceArgs:
    """The validated slice arguments (see :class:`SliceSampler` for what each one means).

    ``static`` holds ``(tensor, is_done)`` when ``ends`` (``is_done=True``) or ``trajectories`` was given;
    ``end_keys`` is a tuple of normalized keys; ``span`` a ``(left, right)`` pair.
    """

    num_slices: int | None
    slice_len: int | None
    end_key: Any
    end_keys: tuple | None
    traj_key: Any
    static: tuple[torch.Tensor, bool] | None
    cache_values: bool
    truncated_key: Any
    strict_length: bool
    pad_output: bool
    span: tuple
    compile: bool | dict
    use_gpu: bool | torch.device
    fragmented: bool = False
    step_key: Any = "step_count"

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any], **fixed) -> SliceArgs:
        """Checks the slice arguments found by name in a constructor's ``locals()``.

        The names :meth:`check` does not take (``self``, ``max_capacity``, ...) are ignored; the slice
        arguments a constructor does not take get :meth:`check`'s defaults, and ``fixed`` overrides (e.g.
        ``cache_values=True``).
        """
        names = inspect.signature(cls.check).parameters
        given = {name: value for name, value in arguments.items() if name in names}
        return cls.check(**{**given, **fixed})

    @classmethod
    def check(
        cls,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key=None,
        end_keys=None,
        traj_key=None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key=("next", "truncated"),
        strict_length: bool = True,
        pad_output: bool = False,
        compile: bool | dict = False,
        span: bool | int | tuple = False,
        use_gpu: bool | torch.device = False,
        fragmented: bool = False,
        step_key="step_count",
    ) -> SliceArgs:
        """Validates and normalizes the arguments of :class:`SliceSampler` (same names and defaults)."""
        check_fragmented(fragmented, step_key, span, compile, ends, trajectories)
        if (num_slices is None) == (slice_len is None):
            raise TypeError(
                f"Pass exactly one of `num_slices` and `slice_len`, got num_slices={num_slices!r} and "
                f"slice_len={slice_len!r}. The other one is derived from the batch size."
            )
        num_slices = check_positive_int("num_slices", num_slices, allow_none=True, type_error=False)
        slice_len = check_positive_int("slice_len", slice_len, allow_none=True, type_error=False)
        if pad_output and strict_length:
            raise SLICE_PAD_STRICT.error()
        if ends is not None and trajectories is not None:
            raise ValueError("Pass at most one of `ends` and `trajectories`; got both.")
        static = ends if ends is not None else trajectories
        if static is not None:
            name = "ends" if ends is not None else "trajectories"
            if end_key is not None or end_keys is not None or traj_key is not None:
                raise ValueError(
                    f"`{name}` gives the trajectories directly and excludes `end_key`/`end_keys`/`traj_key` "
                    f"(got end_key={end_key!r}, end_keys={end_keys!r}, traj_key={traj_key!r}). Pass one or "
                    f"the other."
                )
            if not cache_values:
                raise ValueError(
                    f"`{name}` describes static data and needs `cache_values`=True (got {cache_values!r}); "
                    f"for data that is still written, pass `end_key` or `traj_key` instead."
                )
            static = (check_static(static, name), ends is not None)
        end_key, end_keys = normalize_end_keys(end_key, end_keys)
        return cls(
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            end_keys=end_keys,
            traj_key=None if traj_key is None else normalize_key(traj_key),
            static=static,
            cache_values=bool(cache_values),
            truncated_key=None if truncated_key is None else normalize_key(truncated_key),
            strict_length=bool(strict_length),
            pad_output=bool(pad_output),
            span=normalize_span(span),
            # compile and use_gpu: accepted for TorchRL compatibility; no effect (see SliceSampler)
            compile=check_compile(compile),
            use_gpu=check_use_gpu(use_gpu),
            fragmented=bool(fragmented),
            step_key=None if step_key is None else normalize_key(step_key),
        )
