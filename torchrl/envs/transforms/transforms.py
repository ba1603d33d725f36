"""Transforms: modules that edit TensorDicts on a replay buffer's sample path and, inverted, on its write path.

A :class:`Transform` is an :class:`torch.nn.Module`. On the sample path the buffer calls ``forward(td)``,
which reads each of ``in_keys``, applies :meth:`Transform._apply_transform` and writes the result at the
matching ``out_keys``. On the write path the buffer calls ``inv(td)``, which does the same with
``in_keys_inv``/``out_keys_inv`` and :meth:`Transform._inv_apply_transform`. Subclasses override those two
element-wise hooks, or ``forward``/``inv`` for transforms that need the whole TensorDict. A stateful transform
keeps its state in parameters or buffers, so ``state_dict()`` saves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase
from torch import nn

from torchrl._validation import check_positive_int


def _as_keys(keys) -> list:
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        return [keys]
    return list(keys)


class Transform(nn.Module):
    """Base class of transforms (see the module docstring).

    Args:
        in_keys (NestedKey or list, optional): the entries read by ``forward``.
        out_keys (NestedKey or list, optional): where ``forward`` writes. Defaults to ``in_keys``.
        in_keys_inv (NestedKey or list, optional): the entries read by ``inv``.
        out_keys_inv (NestedKey or list, optional): where ``inv`` writes. Defaults to ``in_keys_inv``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.transforms import Transform
        >>> class Double(Transform):
        ...     def _apply_transform(self, x):
        ...         return x * 2
        >>> Double(in_keys=["obs"])(TensorDict(obs=torch.ones(2)))["obs"]
        tensor([2., 2.])
    """

    #: Whether the transform keeps a state that its ``inv`` updates on the write path (e.g. running statistics)
    #: and that every process writing to a shared buffer must see: such a transform needs a ``share_memory_()``
    #: method, which ``rb.share()`` (and ``append_transform``/``insert_transform`` on a shared buffer) calls; one
    #: without it is refused with a ``RuntimeError`` (as in TorchRL).
    requires_shared_write_state: bool = False

    def __init__(self, in_keys=None, out_keys=None, in_keys_inv=None, out_keys_inv=None):
        super().__init__()
        self.in_keys = _as_keys(in_keys)
        self.out_keys = _as_keys(out_keys) or list(self.in_keys)
        self.in_keys_inv = _as_keys(in_keys_inv)
        self.out_keys_inv = _as_keys(out_keys_inv) or list(self.in_keys_inv)
        for name, a, b in (("out_keys", self.in_keys, self.out_keys), ("out_keys_inv", self.in_keys_inv,
                                                                         self.out_keys_inv)):
            if len(a) != len(b):
                raise ValueError(f"`{name}` must have as many keys as its input keys: got {b} for {a}.")

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            value = tensordict.get(in_key, None)
            if value is not None:
                tensordict.set(out_key, self._apply_transform(value))
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys_inv, self.out_keys_inv):
            value = tensordict.get(in_key, None)
            if value is not None:
                tensordict.set(out_key, self._inv_apply_transform(value))
        return tensordict

    def __repr__(self) -> str:
        return f"{type(self).__name__}(in_keys={self.in_keys}, out_keys={self.out_keys})"


class _CallableTransform(Transform):
    """Wraps a callable ``data -> data`` as a forward transform."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, tensordict):
        return self.fn(tensordict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fn!r})"


class Compose(Transform):
    """Applies transforms in order on ``forward`` and in reverse order on ``inv``.

    Args:
        *transforms (Transform or callable): the transforms; callables are wrapped.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.transforms import Compose
        >>> t = Compose(lambda td: td.set("a", td["a"] + 1), lambda td: td.set("a", td["a"] * 10))
        >>> t(TensorDict(a=torch.zeros(1)))["a"]
        tensor([10.])
    """

    def __init__(self, *transforms: Transform | Callable):
        super().__init__()
        self.transforms = nn.ModuleList([as_transform(t) for t in transforms])

    def forward(self, tensordict):
        for t in self.transforms:
            tensordict = t(tensordict)
        return tensordict

    def inv(self, tensordict):
        for t in reversed(self.transforms):
            tensordict = t.inv(tensordict)
            if tensordict is None:
                return None
        return tensordict

    def append(self, transform: Transform | Callable) -> None:
        self.transforms.append(as_transform(transform))

    def insert(self, index: int, transform: Transform | Callable) -> None:
        self.transforms.insert(index, as_transform(transform))

    def __len__(self) -> int:
        return len(self.transforms)

    def __getitem__(self, index):
        return self.transforms[index]

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"


def as_transform(transform) -> Transform:
    """A :class:`Transform` from a transform or a callable (TypeError otherwise)."""
    if isinstance(transform, Transform):
        return transform
    if callable(transform):
        return _CallableTransform(transform)
    raise TypeError(
        f"`transform` must be a Transform or a callable taking and returning the sampled data; got "
        f"{type(transform).__name__}."
    )


class Resize(Transform):
    """Resizes image entries ``[..., C, H, W]`` to ``(h, w)`` with :func:`torch.nn.functional.interpolate`.

    uint8 images are resized in float32 and rounded back to uint8, so the result keeps the input dtype.

    Args:
        w (int): the output width.
        h (int): the output height. Defaults to ``w``.
        interpolation (str): ``"bilinear"``, ``"nearest"``, ``"bicubic"`` or ``"area"``. Defaults to
            ``"bilinear"``.
        in_keys (list of NestedKey): the image entries. Defaults to ``["pixels"]``.
        out_keys (list of NestedKey, optional): where to write. Defaults to ``in_keys``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.transforms import Resize
        >>> td = TensorDict(pixels=torch.zeros(4, 3, 96, 96, dtype=torch.uint8), batch_size=[4])
        >>> Resize(64)(td)["pixels"].shape
        torch.Size([4, 3, 64, 64])
    """

    _MODES = ("bilinear", "nearest", "bicubic", "area")

    def __init__(self, w: int, h: int | None = None, interpolation: str = "bilinear",
                 in_keys: Sequence | None = None, out_keys: Sequence | None = None):
        super().__init__(in_keys=in_keys if in_keys is not None else ["pixels"], out_keys=out_keys)
        if interpolation not in self._MODES:
            raise ValueError(f"`interpolation` must be one of {self._MODES}, got {interpolation!r}.")
        for name, v in (("w", w), ("h", h if h is not None else w)):
            check_positive_int(name, v, type_error=False)
        self.w, self.h = w, h if h is not None else w
        self.interpolation = interpolation

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        if value.ndim < 3:
            raise ValueError(f"Resize expects images [..., C, H, W]; got an entry of shape {list(value.shape)}.")
        lead = value.shape[:-3]
        x = value.reshape(-1, *value.shape[-3:])
        is_int = not x.is_floating_point()
        y = x.float() if is_int else x
        kwargs = {"align_corners": False} if self.interpolation in ("bilinear", "bicubic") else {}
        y = nn.functional.interpolate(y, size=(self.h, self.w), mode=self.interpolation, **kwargs)
        if is_int:
            y = y.round_().clamp_(torch.iinfo(x.dtype).min, torch.iinfo(x.dtype).max).to(x.dtype)
        return y.reshape(*lead, *y.shape[-3:])

    def __repr__(self) -> str:
        return f"Resize(w={self.w}, h={self.h}, interpolation={self.interpolation!r}, in_keys={self.in_keys})"


class _InvertTransform(Transform):
    """Runs a transform's ``inv`` on the sample path and its ``forward`` on the write path."""

    def __init__(self, transform: Transform):
        super().__init__()
        self.transform = as_transform(transform)

    def forward(self, tensordict):
        return self.transform.inv(tensordict)

    def inv(self, tensordict):
        return self.transform(tensordict)

    def __repr__(self) -> str:
        return f"_InvertTransform({self.transform!r})"
