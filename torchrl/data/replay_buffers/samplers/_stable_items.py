"""Which samplers fit a storage whose items are not stable: the error, written once.

A storage declares ``stable_items = False`` (read with ``getattr``, default ``True``; see
:class:`~torchrl.data.DatasetStorage`) when reading index ``i`` twice may give two different items and it holds
no trajectory metadata it could index. Only samplers that draw indices uniformly fit it. A buffer refuses the
other samplers when it is built (``replay_buffers/_capabilities.py``); the prioritized and trajectory samplers
also refuse such a storage when they are used on their own (``sampler.sample(storage, n)``), with the same
message, built here so that both places say the same thing.
"""

from __future__ import annotations

__all__ = ["unstable_items_error"]


def unstable_items_error(sampler, storage) -> TypeError:
    """The ``TypeError`` raised when ``sampler`` (not a uniform one) meets a ``stable_items = False`` storage."""
    return TypeError(
        f"{type(storage).__name__} cannot be sampled by {type(sampler).__name__}: its items carry no trajectory "
        f"metadata it could index, a read of an index may return a different item each time (a stochastic "
        f"__getitem__), and a priority applies to an index, not to the sample realised when it was read. Use "
        f"RandomSampler() or SamplerWithoutReplacement(), or copy the data into a LazyTensorStorage first (e.g. "
        f"`ReplayBuffer.from_hf(...)`) to sample trajectories or by priority."
    )
