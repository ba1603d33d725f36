"""The sample-unit contract (:class:`SampleUnit`), the default unit :class:`Transition` and the check of a buffer's
``sample_unit=`` argument (see :mod:`torchrl.data.replay_buffers.sample_units` for the contract)."""

from __future__ import annotations

import abc

import torch
from tensordict import TensorDictBase


class SampleUnit(abc.ABC):
    """Base class of sample units: turns the positions a sampler drew into the positions a buffer reads.

    Subclasses implement :meth:`expand`; :meth:`read` and :meth:`anchor_priorities` have defaults for units
    that read one item per drawn position.
    """

    @abc.abstractmethod
    def expand(self, index, info: dict, storage) -> tuple:
        """Returns ``(index, info)``: the positions to read for the drawn ``index`` and the updated info."""

    def read(self, storage, index):
        """Reads ``index`` (as returned by :meth:`expand`) from ``storage``."""
        return storage.get(index)

    def anchor_priorities(self, data: TensorDictBase, priority: torch.Tensor, *, index_key="index"):
        """Returns ``(index, priority)`` to give a prioritized sampler for sampled ``data``: one per item."""
        return data.get(index_key), priority

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Transition(SampleUnit):
    """One step per draw: the sampler's index is read as is (the default of every buffer).

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers.sample_units import Transition
        >>> Transition().expand(torch.tensor([3, 1]), {}, storage=None)
        (tensor([3, 1]), {})
    """

    def expand(self, index, info: dict, storage) -> tuple:
        return index, info


def check_sample_unit(sample_unit) -> SampleUnit | None:
    """Validates the ``sample_unit=`` argument of a buffer: ``None`` or a :class:`SampleUnit` instance.

    Returns ``None`` for ``None`` and for :class:`Transition` (nothing to do on the sample path).
    """
    if sample_unit is None:
        return None
    if isinstance(sample_unit, type) and issubclass(sample_unit, SampleUnit):
        raise TypeError(
            f"`sample_unit` must be an instance, got the class {sample_unit.__name__}: pass "
            f"{sample_unit.__name__}(...)."
        )
    if not isinstance(sample_unit, SampleUnit):
        raise TypeError(
            f"`sample_unit` must be a SampleUnit (Transition() or Sequence(length)), got "
            f"{type(sample_unit).__name__}: {sample_unit!r}."
        )
    return None if type(sample_unit) is Transition else sample_unit
