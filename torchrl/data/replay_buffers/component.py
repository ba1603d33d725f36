"""The base class of storages, samplers and writers: their checkpoint part, ``dumps``/``loads``, and pickling
without the buffer's generator."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

import torchrl.data.replay_buffers._checkpoint.parts as _persistence
from torchrl.data.replay_buffers._checkpoint.format import dump_component, load_component


class Component(abc.ABC):
    """Base class of replay-buffer components: :class:`~torchrl.data.Storage`, :class:`~torchrl.data.Sampler`
    and :class:`~torchrl.data.Writer` derive from it (and from nothing else).

    - ``dumps``/``loads`` (aliases ``dump``/``save``/``load``) save the component alone to a checkpoint
      directory;
    - ``checkpoint_part``/``check_checkpoint_part``/``load_checkpoint_part`` are its part of a checkpoint (the
      protocol of :mod:`torchrl.data.replay_buffers._checkpoint.parts`); the default saves ``state_dict()``;
    - the pickled state leaves out the buffer's generator (``_rng``, re-installed by the buffer that owns the
      component).
    """

    #: What the component is called in checkpoint error messages.
    checkpoint_role: ClassVar[str] = "component"

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The component's state: what :meth:`checkpoint_part` saves by default."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state returned by :meth:`state_dict`."""

    def checkpoint_part(self, ctx: _persistence.PartContext) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This component's tensors and JSON document in a checkpoint (default: its ``state_dict()``)."""
        return _persistence.dump_state_part(self, ctx)

    def check_checkpoint_part(
        self, doc: dict, tensors: Mapping[str, torch.Tensor], ctx: _persistence.PartContext
    ) -> None:
        """Raises ``ValueError`` if the part ``doc`` does not fit this component; changes nothing."""
        _persistence.check_state_part(self, doc, tensors, ctx)

    def load_checkpoint_part(
        self, doc: dict, tensors: Mapping[str, torch.Tensor], ctx: _persistence.PartContext
    ) -> None:
        """Restores the part ``doc`` checked by :meth:`check_checkpoint_part` (default: ``load_state_dict``)."""
        _persistence.load_state_part(self, doc, tensors, ctx)

    def dumps(self, path, **kwargs) -> None:
        """Saves this component to the checkpoint directory ``path``.

        The format is documented in :mod:`torchrl.data.replay_buffers.checkpointers`; keyword arguments
        (``fsync``, ``progress``) go to :func:`~torchrl.data.replay_buffers.checkpointers.dump_component`.
        """
        dump_component(self, path, **kwargs)

    def loads(self, path) -> None:
        """Loads a checkpoint written by :meth:`dumps` into this component (validated first)."""
        load_component(self, path)

    def dump(self, path, **kwargs) -> None:
        """Alias of :meth:`dumps`."""
        self.dumps(path, **kwargs)

    def save(self, path, **kwargs) -> None:
        """Alias of :meth:`dumps`."""
        self.dumps(path, **kwargs)

    def load(self, path) -> None:
        """Alias of :meth:`loads`."""
        self.loads(path)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_rng", None)
        return state
