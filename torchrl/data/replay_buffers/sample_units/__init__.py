"""Sample units: what one draw of a sampler stands for. :class:`Transition` (one step), :class:`Sequence`
(a window of steps around each drawn step, for recurrent learners) and :class:`FrameStack` (the last ``k`` frames
of each drawn step). TorchRL's module path.

Contract. A buffer calls, after its sampler and before reading the storage::

    index, info = sampler.sample(storage, batch_size)
    index, info = sample_unit.expand(index, info, storage)
    info["index"] = index
    data = sample_unit.read(storage, index)

``expand`` turns the drawn positions (*anchors*) into the positions to read and may add entries to ``info``;
``read`` reads them and returns data shaped like the expanded index (:meth:`Storage.get` reads a flat
batch). A prioritized buffer maps priorities computed on sampled data back to the anchors with
:meth:`SampleUnit.anchor_priorities`. :func:`check_sample_unit` validates the ``sample_unit=`` argument of a
buffer.

- ``base``: :class:`SampleUnit` (the contract), :class:`Transition` (one step per draw, the default) and
  :func:`check_sample_unit`;
- ``sequence``: :class:`Sequence` (windows of steps around each drawn step);
- ``frame_stack``: :class:`FrameStack` (stacks of the last ``k`` frames, rebuilt at sample time).

Episodes are read through :mod:`torchrl.data.replay_buffers.trajectories`.
"""

from torchrl.data.replay_buffers.sample_units.base import SampleUnit, Transition, check_sample_unit  # noqa: F401
from torchrl.data.replay_buffers.sample_units.frame_stack import FrameStack  # noqa: F401  (its own module's __all__)
from torchrl.data.replay_buffers.sample_units.sequence import Sequence

__all__ = ["SampleUnit", "Transition", "Sequence"]

for _cls in (SampleUnit, Transition, Sequence):  # TorchRL's module path, as before the split
    _cls.__module__ = __name__
