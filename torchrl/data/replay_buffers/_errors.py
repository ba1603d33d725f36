"""Exception classes that are both our precise type and the ``RuntimeError`` TorchRL raises in the same case.

TorchRL raises ``RuntimeError`` in a few places where we raise a more precise type. Code written for
TorchRL catches ``RuntimeError``; code written for us catches the precise type. Each class below subclasses
both, so either ``except`` clause works, and the messages stay ours.
"""

from __future__ import annotations


class TypeRuntimeError(TypeError, RuntimeError):
    """A :class:`TypeError` that TorchRL raises as a :class:`RuntimeError`."""


class ValueRuntimeError(ValueError, RuntimeError):
    """A :class:`ValueError` that TorchRL raises as a :class:`RuntimeError`."""


class FileExistsRuntimeError(FileExistsError, RuntimeError):
    """A :class:`FileExistsError` that TorchRL raises as a :class:`RuntimeError`."""
