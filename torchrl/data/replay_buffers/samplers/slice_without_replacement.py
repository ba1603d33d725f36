"""Epochs of trajectory slices: :class:`SliceSamplerWithoutReplacement`."""

from __future__ import annotations

import torch
from tensordict import NestedKey

from torchrl.data.replay_buffers.samplers._slice_args import SliceArgs
from torchrl.data.replay_buffers.samplers.base import register_without_replacement
from torchrl.data.replay_buffers.samplers.slice import SliceSampler, _Eligible
from torchrl.data.replay_buffers.samplers.without_replacement import SamplerWithoutReplacement


class SliceSamplerWithoutReplacement(SliceSampler, SamplerWithoutReplacement):
    """Samples one slice from every trajectory per epoch, in a random (or fixed) order of trajectories.

    An epoch is a permutation of the trajectories that can hold a slice; each batch takes the next
    ``num_slices`` of them and draws one uniform start in each, so a trajectory appears at most once per
    batch and exactly once per epoch. When the epoch is exhausted, :attr:`ran_out` is set and a new
    permutation is drawn. Slices obey the rules of :class:`SliceSampler` (no slice crosses a trajectory
    boundary, the ring-buffer wrap or an env column).

    Stateful (``requires_shared_state = True``): the epoch permutation and the position in it would be
    duplicated by a per-worker copy. Shared with DataLoader workers, it draws by number as
    :class:`SamplerWithoutReplacement` does (:meth:`~SamplerWithoutReplacement.planned_draw`): batch ``g`` of
    an iteration takes the same trajectories of the same epoch whatever the workers' speeds (the starts inside
    them come from the worker's generator). Boundaries are always cached (keyed on the storage write revision); a
    new epoch starts when the number of sampleable trajectories changes.

    Keyword Args:
        num_slices (int, optional): slices (trajectories) per batch; exactly one of ``num_slices`` and
            ``slice_len``.
        slice_len (int, optional): steps per slice.
        drop_last (bool): drop the last batch of an epoch when fewer than ``num_slices`` trajectories are
            left; ``False`` returns it with fewer slices. Defaults to ``False``.
        end_key, end_keys, traj_key, step_key, fragmented, ends, trajectories, truncated_key, strict_length: as in
            :class:`SliceSampler`. With ``fragmented=True`` (interleaved trajectories; TorchRL refuses it here), an
            epoch visits every run of consecutive steps long enough for a slice once.
        shuffle (bool): ``False`` visits trajectories in storage order (oldest first). Defaults to ``True``.
        compile, use_gpu: accepted for compatibility with TorchRL, without effect, as in
            :class:`SliceSampler`.

    The info of a sample is that of :class:`SliceSampler` (``"is_init"`` included). It is also what
    ``SliceSampler(..., replacement=False)`` returns (see :class:`Sampler`); ``replacement=True`` here is a
    contradiction and raises a TypeError.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl.data.replay_buffers.samplers.slice_without_replacement import (
        ...     SliceSamplerWithoutReplacement,
        ... )
        >>> storage = LazyTensorStorage(100)
        >>> episode = torch.arange(60) // 10  # 6 trajectories of 10 steps
        >>> storage.set(torch.arange(60), TensorDict(episode=episode, batch_size=[60]))
        >>> sampler = SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode")
        >>> seen = []
        >>> while not sampler.ran_out:
        ...     index, _ = sampler.sample(storage, 8)
        ...     seen += storage.get(index)["episode"][::4].tolist()
        >>> sorted(seen)
        [0, 1, 2, 3, 4, 5]
    """

    requires_shared_state = True

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        drop_last: bool = False,
        end_key: NestedKey | None = None,
        end_keys: list[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        shuffle: bool = True,
        compile: bool | dict = False,
        use_gpu: bool | torch.device = False,
    ):
        self._configure_slices(SliceArgs.from_arguments(locals(), cache_values=True))
        SamplerWithoutReplacement.__init__(self, drop_last=drop_last, shuffle=shuffle)

    def _draw_slices(self, elig: _Eligible, num_slices: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``num_slices`` trajectories of the epoch, and a uniform start in each."""
        n = elig.size
        if self.drop_last and n < num_slices:
            raise ValueError(
                f"The storage holds {n} trajectories that can give a slice, fewer than the {num_slices} "
                f"slices of a batch, and `drop_last`=True drops every batch. Lower `num_slices` (or the "
                f"batch size) or pass drop_last=False."
            )
        chosen = self._next_in_epoch(n, num_slices).to(elig.device)
        return chosen, self._offsets(elig, chosen, self._uniform(chosen.numel(), chosen.device))

    def _can_draw(self, bounds, num_slices: int, slice_len: int) -> bool:
        # with drop_last, a batch needs num_slices distinct trajectories
        try:
            n = self._eligible(bounds, slice_len).size
        except RuntimeError:  # no trajectory long enough (strict_length=True)
            return False
        return n >= num_slices if self.drop_last else n > 0

    def _empty(self) -> None:
        SliceSampler._empty(self)
        SamplerWithoutReplacement._empty(self)

    def _repr_fields(self) -> list[str]:
        # pad_output, span and cache_values are fixed in this class (not arguments): not shown
        fixed = ("pad_output=", "span=", "cache_values=")
        fields = [field for field in super()._repr_fields() if not field.startswith(fixed)]
        return fields + [f"drop_last={self.drop_last}", f"shuffle={self.shuffle}"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._repr_fields())})"


register_without_replacement(SliceSampler, SliceSamplerWithoutReplacement)
