"""Sampling contiguous slices of trajectories: :class:`SliceSampler`.

A batch of ``batch_size`` steps is made of ``num_slices`` slices of ``slice_len`` consecutive steps, each
taken from one trajectory and never crossing a trajectory boundary, the ring-buffer wrap (newest data next
to the oldest) or, for ``ndim=2`` storages, an env column. Trajectories are found from a trajectory-id entry
or from done flags (see :mod:`torchrl.data.replay_buffers.trajectories` for the data model); the sampler then picks trajectories
uniformly and a uniform start inside each one.

NOTE [host syncs of slice draws]
Once the trajectory index is up to date, a draw reads no number back from the storage's device: one float64
uniform per slice picks the trajectory and the start (scaled by counts the index holds: :class:`_Eligible`, kept
per index and slice length), the steps are ``start + arange(slice_len)`` and the flags are gathers. The index is
up to date:

- on a 1-D CPU tensor storage, with the live index (NOTE [live trajectory index]): appends are caught up on the
  host (numpy), so a draw right after an append makes no sync either;
- on a 1-D tensor storage on an accelerator with ``strict_length=True``, with the dense index (NOTE [dense
  trajectory index] in ``trajectories/dense_index.py``): fixed-shape tensors found again after each write without
  reading anything back, so a draw right after a write makes no sync either, except that whether a trajectory
  holds a slice is read back when the index is first built, after a write that is not an append, and when the
  ring overwrites the trajectory that said so (about once per lap of the ring);
- on any other tensor storage (``ndim=2``, ``strict_length=False`` off the CPU, a layout neither index follows),
  with the boundaries found in the whole storage, kept until the storage's write revision changes whatever
  ``cache_values``: the first draw after a write finds them again (``unique``, ``nonzero``: host syncs), the
  draws after it make none;
- a ``compilable=True`` storage keeps its counters (write revision, length) as a tensor on its device, where
  reading them syncs: the sampler keeps its boundaries until it hears of a write (``add``, ``extend``,
  ``mark_update``, which the buffer calls, or ``empty``) and reads the counters only then. Write such a storage
  through the buffer, or call ``sampler.mark_update(index, storage=storage)`` after a ``storage.set``.

Left by contract: with ``strict_length=False``, when a slice may leave its trajectory (a trajectory shorter than
the slice, or a span), the steps outside are dropped or padded, so the batch size or the presence of the
``("collector", "mask")`` entry depends on the data (one sync). A generator on another device than the storage
has its uniforms copied there. :class:`SliceSamplerWithoutReplacement` (the epoch order) and
:class:`PrioritizedSliceSampler` (the priority trees) draw on the host and copy their picks to a device storage.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import NestedKey

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_positive_int
from torchrl.data.replay_buffers.errors import TypeRuntimeError, ValueRuntimeError
from torchrl.data.replay_buffers.samplers._slice_args import SliceArgs
from torchrl.data.replay_buffers.samplers._stable_items import unstable_items_error
from torchrl.data.replay_buffers.samplers.base import (
    Sampler,
    check_batch_size,
    check_has_rows,
    check_not_empty,
)
from torchrl.data.replay_buffers.storages.compressed import CompressedListStorage
from torchrl.data.replay_buffers.storages.list import ListStorage
from torchrl.data.replay_buffers.storages.stack import LazyStackStorage
from torchrl.data.replay_buffers.trajectories.columns import (
    as_step_values,
    flags_at,
    has_key,
    read_column,
    read_ring_range,
)
from torchrl.data.replay_buffers.trajectories.dense_index import DenseEligible, DenseTrajectories
from torchrl.data.replay_buffers.trajectories.ends import find_trajectories, format_lengths
from torchrl.data.replay_buffers.trajectories.interleaved import InterleavedRuns, RunTrajectories
from torchrl.data.replay_buffers.trajectories.keys import DONE_KEY, sibling_key, trajectory_keys
from torchrl.data.replay_buffers.trajectories.layout import TrajectoryIndex, ring_layout
from torchrl.data.replay_buffers.trajectories.live_index import (
    LiveEligible,
    LiveTrajectoryIndex,
    TrajectoryEnds,
)
from torchrl.data.replay_buffers.trajectories.sync import TrajectorySync, supports_live_index

_MASK_KEY = ("collector", "mask")
_IS_INIT_KEY = "is_init"
#: The trajectory-id entries probed without `traj_key`: TorchRL's SliceSampler looks for no root "traj_ids".
_PROBED_TRAJ_KEYS = trajectory_keys(exclude=("traj_ids",))
_BELOW_ONE = 1.0 - 2.0**-52  # floor(u * n * _BELOW_ONE) < n for every float64 u in [0, 1)

SLICE_DONE_NDIM = TorchRLPhrase(
    ValueRuntimeError,
    "Expected the end-of-trajectory signal to be 1-dimensional",
    "Expected the end-of-trajectory signal to be 1-dimensional once its trailing singleton dims are "
    "squeezed, got entry {key!r} of shape {shape}: slice samplers need one done flag per step ({per_step}). "
    "Reduce it to one flag per step first, e.g. data[{key!r}] = data[{key!r}].any(-1, keepdim=True), or pass "
    "`traj_key`.",
)
SLICE_LIST_STORAGE = TorchRLPhrase(
    TypeRuntimeError,
    "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the "
    r"trajectories\.",
    "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the "
    "trajectories. {cls} got a {storage}; use a LazyTensorStorage, LazyMemmapStorage or LazyStackStorage of "
    "TensorDicts.",
)


def _check_end_signal(column, n_rows: int, n_cols: int, key) -> None:
    """Refuses an end signal with several flags per step (e.g. ``[N, 2]`` or ``[N, 5, 1]``), as TorchRL does."""
    if column.numel() != n_rows * n_cols:
        per_step = (
            f"[{n_rows}] or [{n_rows}, 1]"
            if n_cols == 1
            else f"[{n_rows}, {n_cols}] or [{n_rows}, {n_cols}, 1]"
        )
        raise SLICE_DONE_NDIM.error(key=key, shape=list(column.shape), per_step=per_step)


def _check_tensordict_storage(sampler, storage) -> None:
    """Refuses a plain :class:`ListStorage`, whose items are not read as one TensorDict (as TorchRL does).

    A :class:`LazyStackStorage` (a lazy stack of its items) and a :class:`CompressedListStorage` are read.
    """
    if isinstance(storage, ListStorage) and not isinstance(
        storage, (LazyStackStorage, CompressedListStorage)
    ):
        raise SLICE_LIST_STORAGE.error(cls=type(sampler).__name__, storage=type(storage).__name__)


@dataclass
class _Eligible:
    """The trajectories a slice of a given length may come from, and the range of start offsets in each.

    A slice starting at offset ``k`` (relative to its trajectory's first step) covers offsets
    ``k .. k + slice_len - 1``; ``k`` is drawn uniformly in ``[low, low + count)``.
    """

    traj: torch.Tensor | None  # positions in TrajectoryIndex.starts (None: all of them)
    starts: torch.Tensor
    lengths: torch.Tensor
    low: int
    count: torch.Tensor
    count_float: torch.Tensor  # count, as float64 shrunk by 2**-52 so that floor(u * count_float) < count
    n_float: float  # number of trajectories, shrunk the same way
    all_full: bool = False  # every slice lies inside its trajectory (nothing clamped, dropped or padded)

    @property
    def size(self) -> int:
        """The number of trajectories a slice may come from."""
        return self.starts.numel()

    @property
    def device(self) -> torch.device:
        return self.starts.device

    def starts_at(self, chosen: torch.Tensor) -> torch.Tensor:
        """The flat position of the first step of the trajectories ``chosen`` (positions in this table)."""
        return self.starts.index_select(0, chosen)

    def lengths_at(self, chosen: torch.Tensor) -> torch.Tensor:
        return self.lengths.index_select(0, chosen)

    def draw(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, offsets)`` from uniform float64 draws ``u``: the integer part of ``u * size`` picks the
        trajectory, the fractional part the start offset."""
        draw = u.mul_(self.n_float)
        chosen = draw.long()
        return chosen, self.offsets(chosen, draw.sub_(chosen))

    def offsets(self, chosen: torch.Tensor, frac: torch.Tensor) -> torch.Tensor:
        """Start offsets (relative to each trajectory's first step) from uniform draws ``frac`` in [0, 1)."""
        offsets = frac.mul_(self.count_float.index_select(0, chosen)).long()
        return offsets.add_(self.low) if self.low else offsets


@dataclass
class _Boundaries:
    """What a sampler knows about the storage content, cached between calls when ``cache_values=True``."""

    key: tuple
    index: TrajectoryIndex | LiveTrajectoryIndex
    done: torch.Tensor | None  # [cells, 1] stored done flags (row-major cells), or None
    terminated: torch.Tensor | None
    is_init: torch.Tensor | None  # [cells, 1] stored "is_init" flags, or None when not stored
    eligible: dict[int, _Eligible] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # what subclasses derive from the boundaries
    live: TrajectoryEnds | None = None  # the incremental index (NOTE [live trajectory index]), or None
    storage: Any = None  # with ``live``: the flags below are read from it at the sampled cells
    flag_keys: dict = field(default_factory=dict)  # with ``live``: "done"/"terminated"/"is_init" -> stored key

    def has_flag(self, name: str) -> bool:
        """Whether the storage holds the flags ``name`` ("done", "terminated" or "is_init")."""
        return getattr(self, name) is not None or name in self.flag_keys

    def flag(self, name: str, cells: torch.Tensor) -> torch.Tensor | None:
        """The stored flags ``name`` at ``cells`` (``[len(cells), 1]`` bool), ``None`` when not stored."""
        column = getattr(self, name)
        if column is not None:
            return column.index_select(0, cells)
        key = self.flag_keys.get(name)
        if key is None:
            return None
        column = self.storage.get_entry(key) if hasattr(self.storage, "get_entry") else None
        if column is None or column.device.type != "cpu":
            return flags_at(self.storage, [key], cells, who="SliceSampler")
        if self.storage.ndim == 2:  # cells are row-major positions (interleaved runs)
            column = column.flatten(0, 1)
        values = column.index_select(0, cells).reshape(cells.numel(), -1)  # one gather, as the stored column
        flags = values if values.dtype == torch.bool else values != 0
        return flags if flags.shape[1] == 1 else flags.any(-1, keepdim=True)


class SliceSampler(Sampler):
    """Samples slices of consecutive steps from the trajectories held in a storage.

    Slices are what recurrent policies, sequence models and n-step targets train on. Each slice lies inside
    one trajectory: it never crosses a done flag or a change of trajectory id, never runs from the newest
    data into the oldest across the ring-buffer wrap, and never crosses from one env column to the next in
    an ``ndim=2`` (``[time, envs]``) storage. Trajectories are drawn uniformly, then a start uniformly
    among the positions that fit a full slice.

    The sampler is stateless (``requires_shared_state = False``): its draws depend only on the storage
    content, its arguments and the generator, so DataLoader workers can each hold a copy.

    On a 1-D tensor storage on the CPU, the trajectory boundaries are an index kept up to date on each write
    (NOTE [live trajectory index] in ``trajectories/live_index.py``): a write of ``k`` rows at the ring's
    newest row costs ``O(k)``, wrap-around overwrites included, and a draw does not depend on the number of
    stored rows. The index follows the storage's shared append counters, so writes from any process (the
    parent of DataLoader workers, collectors writing into a shared storage) are caught up in ``O(k)`` too;
    anything else (``storage.set`` elsewhere than after the newest row, ``empty``, a load, more rows than the
    ring holds) rebuilds it from the whole storage, so draws are always those of the stored content. The draws
    are the same as a search of the whole storage gives, for the same generator state. A 1-D tensor storage on an
    accelerator finds them again after each write as fixed-shape tensors, without reading a number back (with
    ``strict_length=True``; the same draws). Other storages (``ndim=2``, lists) find the boundaries in the whole
    storage: a tensor storage keeps them until it is written again, a list storage with ``cache_values``.

    Draws between writes make no host sync on any device, nor do draws right after appends to a 1-D tensor
    storage (on an accelerator: with ``strict_length=True``, and for a read about once per lap of the ring); the
    first draw after a write to another storage finds the boundaries again and syncs.
    A ``compilable=True`` storage is read again only after a write notification (the buffer sends them; after a
    direct ``storage.set``, call :meth:`mark_update`).
    ``strict_length=False`` with a span or with trajectories shorter than the slice syncs once per draw (the
    batch's size, or whether it holds a mask, depends on the data). See NOTE [host syncs of slice draws] in
    ``samplers/slice.py``.

    Keyword Args:
        num_slices (int, optional): slices per batch; the slice length is ``batch_size // num_slices``.
            Exactly one of ``num_slices``/``slice_len`` must be given.
        slice_len (int, optional): steps per slice; a batch holds ``batch_size // slice_len`` slices.
        end_key (NestedKey, optional): the done flags that end trajectories, one per step (shape ``[N]`` or
            ``[N, 1]``; several flags per step, e.g. ``[N, 2]``, raise a RuntimeError (also a ValueError), as in
            TorchRL). With neither end keys nor
            ``traj_key``, the sampler uses ``("collector", "traj_ids")`` if stored, else ``"episode"``, else
            ``("next", "done")``; a trajectory-id key found this way is stored in :attr:`traj_key` at the
            first sample and used from then on (as TorchRL does). Defaults to ``None``.
        end_keys (list of NestedKey, optional): several done flags, OR-ed together (e.g.
            ``[("next", "terminated"), ("next", "truncated")]``); the keys the storage does not hold are
            skipped. Excludes ``end_key``. Defaults to ``None``.
        traj_key (NestedKey, optional): an entry holding a trajectory id per step; a trajectory is a run of
            consecutive steps with the same id. Takes precedence over the end keys when both are stored.
            A missing key falls back to the other kind: a ``traj_key`` that is not stored to the end keys
            (``("next", "done")`` if none is given), end keys none of which is stored to trajectory ids
            (``traj_key``, or the probed ``("collector", "traj_ids")`` and ``"episode"``).
            Defaults to ``None``.
        step_key (NestedKey): with ``fragmented=True``, the entry holding each step's number in its trajectory.
            Defaults to ``"step_count"``.
        fragmented (bool): steps of several trajectories interleaved (envs or collectors writing step by step):
            trajectories come from ``traj_key`` (probed as above; done flags alone are refused) and ``step_key``, a
            missing step ends a run as a trajectory end does, and slices are drawn from runs as from trajectories,
            wherever their steps lie (NOTE [interleaved runs index] in ``trajectories/interleaved.py``). Excludes
            ``span``, ``compile`` and ``ends``/``trajectories``, as in TorchRL. Defaults to ``False``.
        ends (Tensor, optional): static done flags, one per stored step in storage order, for data that is
            not written any more. Needs ``cache_values=True``; excludes the key arguments.
            Defaults to ``None``.
        trajectories (Tensor, optional): static trajectory ids, as ``ends``. Defaults to ``None``.
        cache_values (bool): keep the trajectory boundaries between calls, until the storage is written again
            (keyed on the storage's write revision). Storages with the live index (see above) keep them
            whatever its value, updated on writes instead of forgotten, and other tensor storages keep the last
            ones found until the write revision changes, so it changes what is computed only for list storages
            (keyed on their length). Defaults to ``False``.
        truncated_key (NestedKey, optional): the info entry marking the last step of each slice; its
            ``"done"`` and ``"terminated"`` siblings (the key with its last element replaced, e.g.
            ``("next", "done")`` for the default, ``"done"`` for ``truncated_key="truncated"``) are returned
            with it. ``None`` returns none of the three. Defaults to ``("next", "truncated")``.
        strict_length (bool): ``True`` only samples trajectories that hold a full slice; ``False`` also
            samples shorter trajectories, whose slices are then shorter (the batch is shorter than
            ``batch_size`` unless ``pad_output=True``). Defaults to ``True``.
        pad_output (bool): with ``strict_length=False``, pad short slices to ``slice_len`` by repeating their
            last step, and return the mask ``("collector", "mask")`` (``True`` on real steps); as in TorchRL,
            the mask is returned only when the batch holds padding, and only the last real step of a padded
            slice is marked truncated (not the repeats after it). Defaults to ``False``.
        compile (bool or dict): accepted for compatibility with TorchRL, where it ``torch.compile``-s the
            search for trajectory boundaries (a dict holds ``torch.compile`` keyword arguments). It has no
            effect here, and the samples are the same whatever its value: that search is already a single
            vectorized pass (a few milliseconds for a million steps), with nothing left to compile.
            Defaults to ``False``.
        span (bool, int or (left, right)): let slices start up to ``left`` steps before the first step of a
            trajectory and end up to ``right`` steps after its last step (``True`` means ``slice_len - 1``
            steps; an int is capped there), so that the first and last steps are sampled as often as the
            others. Steps outside the trajectory are clamped to its first/last step (repeated, and masked out
            when ``pad_output=True``); with ``strict_length=False`` and ``pad_output=False`` they are dropped.
            With a span, a trajectory is long enough if ``length + left + right >= slice_len``.
            Defaults to ``False``.
        use_gpu (bool or torch.device): accepted for compatibility with TorchRL, where it moves the search
            for trajectory boundaries to an accelerator. It has no effect here (same samples whatever its
            value): the search runs on the device of the storage, vectorized, so a CUDA storage already uses
            its GPU and a CPU storage does not pay a round trip for it. Defaults to ``False``.

    ``sample`` returns ``(index, info)``: ``index`` is a tuple of per-dimension index tensors (one tensor
    for 1-D storages) whose entries ``[i * slice_len, (i + 1) * slice_len)`` are slice ``i``, in time
    order; ``info`` holds ``truncated_key`` (``[B, 1]``, ``True`` on the last real step of each slice,
    and, without ``pad_output``, on the steps a span repeats after it), its ``"done"`` sibling (the stored
    done flag OR truncated; just truncated when the storage holds no such entry) and its ``"terminated"``
    sibling (the stored flag, or ``False``). When the storage holds an ``"is_init"`` entry,
    ``info["is_init"]`` (``[B, 1]``, bool) is ``True`` on the first step of each slice and where the stored
    ``"is_init"`` is ``True`` (it is returned even with ``truncated_key=None``).

    :attr:`batch_size_multiplier` (``1`` by default; TorchRL's ``_batch_size_multiplier`` is an alias) scales
    the batch size of :meth:`sample`: ``CatFrames.make_rb_transform_and_sampler`` sets it to ``slice_len`` so
    that ``rb.sample(B)`` gives ``B`` slices. :meth:`can_sample` says whether a batch can be drawn now.

    ``SliceSampler(..., replacement=False)`` returns a :class:`SliceSamplerWithoutReplacement` built with
    the other arguments (see :class:`Sampler`); ``cache_values``, ``pad_output`` and ``span`` are then
    refused with a TypeError, since that class does not take them.

    The trajectories are read from stored TensorDicts: a plain :class:`ListStorage` raises a
    ``RuntimeError`` at :meth:`sample` (use a :class:`LazyTensorStorage`, a :class:`LazyMemmapStorage` or a
    :class:`LazyStackStorage`), unless ``ends``/``trajectories`` give them.

    .. note:: With ``cache_values=True`` and a list-based storage (:class:`LazyStackStorage`,
        :class:`CompressedListStorage`, which have no write revision), the cache
        is keyed on the storage length and cleared by the buffer's ``extend``/``add`` notifications; write
        through a buffer, not ``storage.set``, to keep it fresh.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> from torchrl.data.replay_buffers.samplers.slice import SliceSampler
        >>> storage = LazyTensorStorage(100)
        >>> episode = torch.arange(40) // 10  # 4 trajectories of 10 steps
        >>> data = TensorDict(episode=episode, obs=torch.randn(40, 3), batch_size=[40])
        >>> storage.set(torch.arange(40), data)
        >>> sampler = SliceSampler(slice_len=5, traj_key="episode")
        >>> index, info = sampler.sample(storage, 20)
        >>> data = storage.get(index)
        >>> data["episode"].view(4, 5).unique(dim=1).shape  # one episode per slice
        torch.Size([4, 1])
        >>> info[("next", "truncated")].view(4, 5)[:, -1].all()
        tensor(True)
    """

    requires_shared_state = False
    # the from-scratch boundaries with cache_values, forgotten at every write (see Sampler); the live index (_live)
    # is kept up to date by the writes instead, and the last boundaries without cache_values (_revision_bounds,
    # NOTE [host syncs of slice draws]) are keyed on the write revision; a copy in another process builds its own
    # (see __getstate__)
    _derived_state = ("_cache",)
    _live: TrajectorySync | None = None
    _live_bounds: _Boundaries | None = None
    _revision_bounds: tuple[weakref.ref, _Boundaries] | None = None
    # compilable storages: (storage, _writes_heard when found, boundaries), and the write notifications heard
    _bounds_until_write: tuple[weakref.ref, int, _Boundaries] | None = None
    _writes_heard = 0
    # the last dense index (NOTE [dense trajectory index]): (storage, revision, appended rows, index, source)
    _dense_label: tuple | None = None
    _multiplier = 1
    fragmented = False  # (class defaults: samplers pickled before these arguments load)
    step_key: NestedKey | None = "step_count"
    _runs: InterleavedRuns | None = None

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        end_keys: list[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        pad_output: bool = False,
        compile: bool | dict = False,
        span: bool | int | tuple = False,
        use_gpu: bool | torch.device = False,
    ):
        self._configure_slices(SliceArgs.from_arguments(locals()))

    def _configure_slices(self, args: SliceArgs) -> None:
        """Takes the checked slice arguments (subclasses build them from their own constructor's)."""
        self.num_slices, self.slice_len = args.num_slices, args.slice_len
        self.end_key, self.end_keys, self.traj_key = args.end_key, args.end_keys, args.traj_key
        self._static = args.static
        self.cache_values = args.cache_values
        self.truncated_key = args.truncated_key
        self.strict_length = args.strict_length
        self.pad_output = args.pad_output
        self.span = args.span
        self.compile = args.compile  # accepted for TorchRL compatibility; no effect (see docstring)
        self.use_gpu = args.use_gpu  # idem
        self.fragmented, self.step_key = args.fragmented, args.step_key
        self._runs = None  # fragmented: NOTE [interleaved runs index]; per process, never pickled
        self._cache: _Boundaries | None = None
        self._revision_bounds: tuple[weakref.ref, _Boundaries] | None = None  # (storage, its boundaries)
        self._bounds_until_write: tuple[weakref.ref, int, _Boundaries] | None = None
        self._writes_heard = 0
        self._dense_label: tuple | None = None
        self._templates: dict = {}
        self._multiplier = 1
        self._live: TrajectorySync | None = None  # NOTE [live trajectory index]; per process, never pickled
        self._live_bounds: _Boundaries | None = None

    # -- batch layout ----------------------------------------------------------------------------------------
    @property
    def batch_size_multiplier(self) -> int:
        """``sample(storage, batch_size)`` draws ``batch_size * batch_size_multiplier`` steps (``1``: as asked).

        With ``slice_len=N`` and ``batch_size_multiplier=N``, a batch of ``B`` is ``B`` slices of ``N`` steps
        (what :meth:`CatFrames.make_rb_transform_and_sampler` sets up). Defaults to ``1``.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, SliceSampler
            >>> storage = LazyTensorStorage(40)
            >>> storage.set(torch.arange(40), TensorDict(episode=torch.arange(40) // 10, batch_size=[40]))
            >>> sampler = SliceSampler(slice_len=4, traj_key="episode")
            >>> sampler.batch_size_multiplier = 4
            >>> index, _ = sampler.sample(storage, 3)  # 3 slices of 4 steps
            >>> index[0].shape
            torch.Size([12])
        """
        return self._multiplier

    @batch_size_multiplier.setter
    def batch_size_multiplier(self, value: int) -> None:
        self._multiplier = check_positive_int(
            "batch_size_multiplier", value, type_error=True, hint="Pass 1 to draw the batch size asked."
        )

    @property
    def _batch_size_multiplier(self) -> int:
        """TorchRL's spelling of :attr:`batch_size_multiplier` (set by ``CatFrames``)."""
        return self._multiplier

    @_batch_size_multiplier.setter
    def _batch_size_multiplier(self, value: int) -> None:
        self.batch_size_multiplier = value

    def _scaled_batch_size(self, batch_size) -> int:
        """``batch_size`` checked, times :attr:`batch_size_multiplier`."""
        return check_batch_size(batch_size) * self._multiplier

    def _slice_shape(self, batch_size: int) -> tuple[int, int]:
        """``(num_slices, slice_len)`` for a batch."""
        if self.num_slices is not None:
            if batch_size % self.num_slices:
                raise ValueError(
                    f"`batch_size`={batch_size} is not divisible by `num_slices`={self.num_slices}. Pass a "
                    f"multiple of {self.num_slices}."
                )
            return self.num_slices, batch_size // self.num_slices
        if batch_size % self.slice_len:
            raise ValueError(
                f"`batch_size`={batch_size} is not divisible by `slice_len`={self.slice_len}. Pass a "
                f"multiple of {self.slice_len}."
            )
        return batch_size // self.slice_len, self.slice_len

    def _span_steps(self, slice_len: int) -> tuple[int, int]:
        cap = slice_len - 1
        return tuple(cap if s is True else 0 if s is False else min(s, cap) for s in self.span)

    # -- boundaries ------------------------------------------------------------------------------------------
    @staticmethod
    def _cache_key(storage) -> tuple:
        revision = storage.write_revision
        if revision is not None:
            return (id(storage), "revision", revision)
        return (id(storage), "len", len(storage))

    def _boundaries(self, storage) -> _Boundaries:
        """The trajectories of ``storage``, from the cache when it is still valid."""
        if not getattr(storage, "stable_items", True):  # e.g. a DatasetStorage: no trajectory to index
            raise unstable_items_error(self, storage)
        if self.fragmented:
            return self._fragmented_boundaries(storage)
        if self._static is None:  # the trajectories are read from the stored entries
            _check_tensordict_storage(self, storage)
        if not getattr(storage, "compilable", False):
            return self._current_boundaries(storage)
        # a compilable storage keeps its counters (revision, length) on its device, where reading them syncs: the
        # boundaries are kept until the sampler hears of a write (NOTE [host syncs of slice draws])
        check_has_rows(storage)
        kept = self._bounds_until_write
        if kept is not None and kept[0]() is storage and kept[1] == self._writes_heard:
            return kept[2]
        bounds = self._current_boundaries(storage)
        self._bounds_until_write = (weakref.ref(storage), self._writes_heard, bounds)
        return bounds

    def _current_boundaries(self, storage) -> _Boundaries:
        """The trajectories of ``storage`` as its write counters say it is now (the live index, or a cache)."""
        check_not_empty(storage)
        if self._static is None and self._uses_live_index() and supports_live_index(storage):
            bounds = self._live_boundaries(storage)
            if bounds is not None:
                return bounds
        key = self._cache_key(storage)
        cache = self._cache
        if cache is not None and cache.key == key:
            return cache
        kept = self._revision_bounds
        if kept is not None and kept[0]() is storage and kept[1].key == key:
            return kept[1]
        bounds = self._find_boundaries(storage, key)
        self._cache = bounds if self.cache_values else None
        # keyed on the write revision, the boundaries are exact until the next write: kept whatever cache_values,
        # so that draws between writes make no host sync (NOTE [host syncs of slice draws])
        revisioned = not self.cache_values and key[1] == "revision"
        self._revision_bounds = (weakref.ref(storage), bounds) if revisioned else None
        return bounds

    def _source_candidates(self) -> list[tuple[tuple, bool]]:
        """``(keys, is_done)`` groups to look for in the storage, in order (see ``traj_key``'s docs)."""
        traj = ((self.traj_key,) if self.traj_key is not None else _PROBED_TRAJ_KEYS), False
        end_keys = self.end_keys or ((self.end_key,) if self.end_key is not None else None)
        if end_keys is None:
            return [traj, ((DONE_KEY,), True)]  # the done sibling of the default truncated_key
        if self.traj_key is not None:
            return [traj, (end_keys, True)]
        return [(end_keys, True), traj]

    def _resolve_source(self, storage) -> tuple[Any, bool]:
        """``(static tensor or stored keys, is_done)``: where the trajectories come from.

        The first group of :meth:`_source_candidates` with a stored key wins: its first stored key for
        trajectory ids, every stored key (OR-ed) for done flags.
        """
        if self._static is not None:
            return self._static
        tried = []
        for keys, is_done in self._source_candidates():
            present = [key for key in keys if has_key(storage, key)]
            if present:
                if not is_done and self.traj_key is None:  # probed: exposed and kept, as TorchRL does
                    self.traj_key = present[0]
                return (present if is_done else present[:1]), is_done
            tried += [key for key in keys if key not in tried]
        args = (("traj_key", self.traj_key), ("end_key", self.end_key), ("end_keys", self.end_keys))
        given = ", ".join(f"{name}={value!r}" for name, value in args if value is not None)
        raise RuntimeError(
            f"{type(self).__name__} found no trajectory information in the storage: it holds none of the "
            f"entries {tried}{f' (from {given})' if given else ''}. Pass `traj_key` (per-step trajectory "
            f"ids) or `end_key`/`end_keys` (per-step done flags) naming stored entries, or "
            f"`ends`/`trajectories` tensors (with cache_values=True)."
        )

    # -- the live index: NOTE [live trajectory index] in trajectories/live_index.py ---------------------------------------
    def _uses_live_index(self) -> bool:
        """Whether draws use the incremental index on storages that support it (subclasses may opt out)."""
        return True

    def _fragmented_boundaries(self, storage) -> _Boundaries:
        """Interleaved runs as trajectories in sorted positions (NOTE [interleaved runs index])."""
        check_not_empty(storage)
        runs = self._runs = self._runs or InterleavedRuns(self.traj_key, self.step_key)
        runs.refresh(storage)  # the traj_key probed is exposed and kept, as TorchRL does:
        self.traj_key, key, bounds = runs.traj_key, ("fragmented", id(runs), runs.version), self._live_bounds
        if bounds is None or bounds.key != key or bounds.storage is not storage:
            bounds = _Boundaries(key, runs.as_trajectories(), None, None, None, storage=storage)
            bounds.flag_keys, self._live_bounds = self._flag_keys(storage), bounds
        return bounds

    def _flag_keys(self, storage) -> dict:
        """``"done"``/``"terminated"``/``"is_init"`` -> the stored entry the info flags are read from."""
        flag_keys = {}
        if self.truncated_key is not None:
            done_key, terminated_key = self._info_keys()
            if has_key(storage, done_key):
                flag_keys["done"] = done_key
            if has_key(storage, terminated_key):
                flag_keys["terminated"] = terminated_key
        if has_key(storage, self._init_key()):
            flag_keys["is_init"] = self._init_key()
        return flag_keys

    def _live_boundaries(self, storage) -> _Boundaries | None:
        """The boundaries from the incremental index, or ``None`` when the storage layout needs a full read."""
        source, is_done = self._resolve_source(storage)
        source_key = (tuple(source), is_done)
        live = self._live
        if live is None:
            live = self._live = TrajectorySync()
        index = live.current(storage, source_key, self._live_values_all, self._live_values_at)
        if index is None:
            return None
        key = (id(index), live.revision, index.total)
        bounds = self._live_bounds
        if bounds is not None and bounds.key == key and bounds.storage is storage:
            if self.cache_values:
                self._cache = bounds
            return bounds
        flag_keys = self._flag_keys(storage)
        bounds = _Boundaries(
            key=key,
            index=LiveTrajectoryIndex(index),
            done=None,
            terminated=None,
            is_init=None,
            live=index,
            storage=storage,
            flag_keys=flag_keys,
        )
        self._live_bounds = bounds
        if self.cache_values:  # the same object the next draws reuse (forgotten at writes, as every cache)
            self._cache = bounds
        return bounds

    def _live_values_all(self, storage, source_key: tuple, n_rows: int) -> torch.Tensor:
        """``[n_rows, 1]``: the done flags or trajectory ids of every filled row (a full read, at rebuilds)."""
        source, is_done = source_key
        return self._trajectory_values(storage, list(source), is_done, n_rows, 1)

    def _live_values_at(self, storage, source_key: tuple, start: int, k: int):
        """The done flags (bool) or trajectory ids of the ``k`` rows from ``start`` (modulo the capacity), 1-D."""
        source, is_done = source_key
        return read_ring_range(storage, source, is_done, start, k, who=type(self).__name__)

    def _init_key(self):
        """The stored entry whose flags mark slice starts in ``info`` (``"is_init"``)."""
        return _IS_INIT_KEY

    # -- reading the whole storage ---------------------------------------------------------------------------------
    def _trajectory_values(self, storage, source, is_done: bool, n_rows: int, n_cols: int) -> torch.Tensor:
        """``[n_rows, n_cols]``: the done flags or trajectory ids of every filled row, from ``source``."""
        if isinstance(source, torch.Tensor):
            name = "`ends` tensor" if is_done else "`trajectories` tensor"
            values = as_step_values(source, n_rows, n_cols, name=name, reduce_any=False)
        elif len(source) == 1:
            what = "done flags" if is_done else "trajectory ids"
            column = read_column(storage, source[0], n_rows)
            if is_done:
                _check_end_signal(column, n_rows, n_cols, source[0])
            values = as_step_values(column, n_rows, n_cols, name=f"{what} {source[0]!r}", reduce_any=is_done)
        else:  # several end keys: a step ends a trajectory if any of them is set
            for end_key in source:
                _check_end_signal(read_column(storage, end_key, n_rows), n_rows, n_cols, end_key)
            flags = [self._flags(storage, end_key, n_rows, n_cols) for end_key in source]
            values = torch.stack(flags).any(0).view(n_rows, n_cols)
        return values

    def _find_boundaries(self, storage, key: tuple) -> _Boundaries:
        n_rows, n_cols, offset, last_row = ring_layout(storage)
        source, is_done = self._resolve_source(storage)
        values = self._trajectory_values(storage, source, is_done, n_rows, n_cols)
        if self._finds_dense(storage, key, n_rows, last_row):
            index = self._dense_trajectories(storage, values, (tuple(source), is_done), offset)
        else:
            self._dense_label = None
            layout = {"n_rows": n_rows, "n_cols": n_cols, "offset": offset, "last_row": last_row}
            index = find_trajectories(values, is_done=is_done, ndim=storage.ndim, **layout)
        done = terminated = is_init = None
        if self.truncated_key is not None:  # the stored siblings of truncated_key, returned with it
            done_key, terminated_key = self._info_keys()
            if has_key(storage, done_key):
                done = self._flags(storage, done_key, n_rows, n_cols)
            if has_key(storage, terminated_key):
                terminated = self._flags(storage, terminated_key, n_rows, n_cols)
        if has_key(storage, self._init_key()):
            is_init = self._flags(storage, self._init_key(), n_rows, n_cols)
        return _Boundaries(key=key, index=index, done=done, terminated=terminated, is_init=is_init)

    def _finds_dense(self, storage, key: tuple, n_rows: int, last_row: int) -> bool:
        """Whether the boundaries are found as fixed-shape tensors (NOTE [dense trajectory index]): 1-D tensor
        storages off the CPU (where the live index serves) whose newest row is the last one in time order, with
        ``strict_length=True`` (without it, whether a slice may leave its trajectory would be read back at every
        draw instead of once per write)."""
        if not self.strict_length or self._static is not None or storage.ndim != 1 or key[1] != "revision":
            return False
        device = getattr(storage, "device", None)
        if device is None or device == "auto" or torch.device(device).type == "cpu":
            return False
        return n_rows >= storage.max_size or last_row == n_rows - 1

    def _dense_trajectories(self, storage, values, source: tuple, offset: int) -> DenseTrajectories:
        """The dense index of ``storage`` from ``values`` read from ``source`` (``(keys, is_done)``), carrying the
        witnesses of the previous one over the rows appended since (the storage's append counters: NOTE [catching
        up on appends] in ``trajectories/sync.py``)."""
        revision, appended, broken = storage.append_state()
        label, previous = self._dense_label, None
        if label is not None and label[0]() is storage and label[4] == source and broken <= label[1]:
            old = label[3]
            added = appended - label[2]
            dropped = old.n_rows + added - values.shape[0]
            if 0 <= added < storage.max_size and 0 <= dropped <= old.n_rows:
                previous = (old, dropped)
        index = DenseTrajectories(values, is_done=source[1], offset=offset, previous=previous)
        self._dense_label = (weakref.ref(storage), revision, appended, index, source)
        return index

    def _info_keys(self) -> tuple:
        """``(done_key, terminated_key)``: the siblings of ``truncated_key`` (its last element replaced)."""
        return sibling_key(self.truncated_key, "done"), sibling_key(self.truncated_key, "terminated")

    @staticmethod
    def _flags(storage, key, n_rows: int, n_cols: int) -> torch.Tensor:
        column = read_column(storage, key, n_rows)
        flags = as_step_values(column, n_rows, n_cols, name=f"entry {key!r}", reduce_any=True)
        return flags.reshape(-1, 1) if flags.dtype == torch.bool else flags.reshape(-1, 1).bool()

    def _eligible(self, bounds: _Boundaries, slice_len: int) -> _Eligible | LiveEligible:
        """The trajectories a slice of ``slice_len`` steps may come from (cached per length)."""
        elig = bounds.eligible.get(slice_len)
        if elig is not None:
            return elig
        if bounds.live is not None:
            left, right = self._span_steps(slice_len)
            elig = LiveEligible(bounds.live, slice_len, left, right, self.strict_length)
            if self.strict_length and not elig.size:
                self._raise_too_short(elig.all_lengths(), slice_len)
            bounds.eligible[slice_len] = elig
            return elig
        if isinstance(bounds.index, RunTrajectories):  # fragmented (no span): kept up to date by the index
            elig = bounds.index.eligible_table(slice_len, self.strict_length)
            if self.strict_length and not elig.size:
                self._raise_too_short(bounds.index.lengths, slice_len)
            bounds.eligible[slice_len] = elig
            return elig
        if isinstance(bounds.index, DenseTrajectories):  # strict_length=True (see _finds_dense)
            left, right = self._span_steps(slice_len)
            elig = DenseEligible(bounds.index, slice_len, left, right, strict_length=True)
            if not bounds.index.has_trajectory_of(slice_len - left - right, elig.before):
                self._raise_too_short(bounds.index.lengths, slice_len)
            bounds.eligible[slice_len] = elig
            return elig
        index = bounds.index
        lengths = index.lengths
        left, right = self._span_steps(slice_len)
        traj = None
        if self.strict_length:
            ok = lengths + (left + right) >= slice_len
            if not bool(ok.all()):
                if not bool(ok.any()):
                    self._raise_too_short(lengths, slice_len)
                traj = ok.nonzero().squeeze(-1)
        starts = index.starts if traj is None else index.starts[traj]
        lengths = lengths if traj is None else lengths[traj]
        high = lengths - slice_len + right
        if not self.strict_length:
            high = high.clamp_min(-left)
        count = high + left + 1
        # a slice never leaves its trajectory: the draws then need no clamp, drop or padding mask (one check per
        # index, not per draw: NOTE [host syncs of slice draws])
        inside = left == right == 0 and (self.strict_length or bool((lengths >= slice_len).all()))
        elig = _Eligible(
            traj=traj,
            starts=starts,
            lengths=lengths,
            low=-left,
            count=count,
            count_float=count.double() * _BELOW_ONE,
            n_float=starts.numel() * _BELOW_ONE,
            all_full=inside,
        )
        bounds.eligible[slice_len] = elig
        return elig

    def _raise_too_short(self, lengths: torch.Tensor, slice_len: int):
        if self.fragmented:
            raise self._runs.too_short(slice_len)
        raise RuntimeError(
            f"No trajectory is long enough for slices of `slice_len`={slice_len} with "
            f"strict_length=True: the storage holds {lengths.numel()} trajectories of lengths "
            f"{format_lengths(lengths)}. Lower the slice length (or raise `num_slices`), pass "
            f"strict_length=False to also sample shorter slices, or pass span=True."
        )

    # -- drawing ---------------------------------------------------------------------------------------------
    def _uniform(self, size: int, device) -> torch.Tensor:
        """``size`` float64 draws in ``[0, 1)`` from the sampler's generator (or torch's global one)."""
        gen = self._rng
        if gen is None:
            return torch.rand(size, dtype=torch.float64, device=device)
        out = torch.rand(size, generator=gen, dtype=torch.float64, device=gen.device)
        return out if out.device == device else out.to(device)

    def _draw_slices(self, elig: _Eligible, num_slices: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, offsets)``: uniform trajectories (positions in ``elig``) and a uniform start in each.

        One float64 draw per slice gives both: its integer part (scaled by the number of trajectories) picks
        the trajectory, its fractional part the start offset.
        """
        return elig.draw(self._uniform(num_slices, elig.device))

    @staticmethod
    def _offsets(elig: _Eligible | LiveEligible, chosen: torch.Tensor, frac: torch.Tensor) -> torch.Tensor:
        """Start offsets (relative to each trajectory's first step) from uniform draws ``frac`` in [0, 1)."""
        return elig.offsets(chosen, frac)

    def _steps(self, num_slices: int, slice_len: int, device) -> tuple[torch.Tensor, ...]:
        """``arange(slice_len)`` and the ``[B, 1]`` last-step and first-step flags of full slices (cached).

        The cached tensors are shared between calls: never modify them in place.
        """
        key = (num_slices, slice_len, device)
        cached = self._templates.get(key)
        if cached is None:
            steps = torch.arange(slice_len, device=device)
            last = (steps == slice_len - 1).repeat(num_slices).unsqueeze(-1)
            first = (steps == 0).repeat(num_slices).unsqueeze(-1)
            cached = self._templates[key] = (steps, last, first)
        return cached

    def _drops_outside_steps(self) -> bool:
        """Whether the steps of a slice outside its trajectory (past a span's edge) are dropped (the slice is
        shorter) rather than clamped to the trajectory's first/last step."""
        return not self.pad_output and not self.strict_length

    def sample(self, storage, batch_size: int) -> tuple[tuple[torch.Tensor, ...], dict]:
        return self._sample_steps(storage, self._scaled_batch_size(batch_size))

    def _sample_steps(self, storage, batch_size: int) -> tuple[tuple[torch.Tensor, ...], dict]:
        """:meth:`sample` of ``batch_size`` steps (:attr:`batch_size_multiplier` already applied)."""
        num_slices, slice_len = self._slice_shape(batch_size)
        bounds = self._boundaries(storage)
        elig = self._eligible(bounds, slice_len)
        chosen, offsets = self._draw_slices(elig, num_slices)
        return self._build_slices(bounds, elig, chosen, offsets, slice_len)

    def _build_slices(
        self,
        bounds: _Boundaries,
        elig: _Eligible,
        chosen: torch.Tensor,
        offsets: torch.Tensor,
        slice_len: int,
        per_slice: dict | None = None,
    ) -> tuple[tuple[torch.Tensor, ...], dict]:
        """Index and info of slices given their trajectories (positions in ``elig``) and start offsets.

        ``per_slice`` maps info keys to one value per slice, repeated on every step of the slice.
        """
        info: dict = {}
        num_slices = chosen.numel()
        steps, last, first = self._steps(num_slices, slice_len, chosen.device)
        traj_starts = elig.starts_at(chosen)
        real = None
        if elig.all_full:  # every slice lies inside its trajectory
            flat = (traj_starts.add_(offsets).unsqueeze_(-1) + steps).view(-1)
            truncated = last.clone()
            for key, value in (per_slice or {}).items():
                info[key] = value.repeat_interleave(slice_len)
        else:
            within = offsets.unsqueeze(-1) + steps  # [S, L] offsets inside each trajectory
            last_step = elig.lengths_at(chosen).unsqueeze(-1) - 1
            clamped = torch.minimum(within.clamp_min(0), last_step)
            real = clamped == within
            # with padding, only the last real step is truncated (as TorchRL), not the repeats padding it
            truncated = (within if self.pad_output else clamped) == clamped[:, -1:]
            flat = clamped.add_(traj_starts.unsqueeze(-1))
            drop = self._drops_outside_steps()
            for key, value in (per_slice or {}).items():
                value = value.unsqueeze(-1).expand(-1, slice_len)
                info[key] = value[real] if drop else value.reshape(-1)
            if drop:
                if bounds.has_flag("is_init"):  # a slice now starts at its first step inside the trajectory
                    first = ((real.cumsum(1) == 1) & real)[real].unsqueeze(-1)
                flat, truncated, real = flat[real], truncated[real], None
            else:
                flat, truncated = flat.view(-1), truncated.view(-1)
            truncated = truncated.unsqueeze(-1)
        index, cells = bounds.index.storage_index(flat)
        if self.truncated_key is not None:
            done = bounds.flag("done", cells)
            done = truncated.clone() if done is None else done.logical_or_(truncated)
            terminated = bounds.flag("terminated", cells)
            if terminated is None:
                terminated = torch.zeros_like(truncated)
            done_key, terminated_key = self._info_keys()
            info[self.truncated_key] = truncated
            info[done_key] = done
            info[terminated_key] = terminated
        is_init = bounds.flag("is_init", cells)
        if is_init is not None:  # a slice starts a sequence, as a stored trajectory start does
            info[_IS_INIT_KEY] = is_init.logical_or_(first)
        if self.pad_output and real is not None and not bool(real.all()):  # only when something is padded
            info[_MASK_KEY] = real.view(-1)
        return index, info

    # -- writes and readiness --------------------------------------------------------------------------------
    def mark_update(self, index, *, storage=None) -> None:
        """Called by the buffer after ``index`` was written to ``storage``. The live index needs no notice: it
        reads the storage's append counters at the next draw (NOTE [catching up on appends] in
        ``trajectories/sync.py``), whichever process wrote. A ``compilable=True`` storage is the exception: its
        counters are read only after a notice (NOTE [host syncs of slice draws] in ``samplers/slice.py``)."""
        Sampler.mark_update(self, index, storage=storage)  # not super(): subclasses call each base explicitly

    def _empty(self) -> None:
        Sampler._empty(self)  # not super(): subclasses call each base explicitly
        self._revision_bounds = self._bounds_until_write = self._dense_label = None
        for index in (self._live, self._runs):
            if index is not None:
                index.reset()

    def _forget_derived(self) -> None:
        # every write notification (add, extend, mark_update) and empty pass here: counted for compilable storages
        Sampler._forget_derived(self)
        self._writes_heard += 1

    def __getstate__(self):
        state = super().__getstate__()
        # per process: a copy builds its own from its storage
        for name in ("_live", "_live_bounds", "_revision_bounds", "_bounds_until_write", "_dense_label"):
            state[name] = None
        state["_runs"] = None  # fragmented: NOTE [interleaved runs index]
        return state

    @property
    def trajectory_index_stats(self) -> dict[str, int]:
        """How this copy of the sampler followed the writes: ``{"rebuilds": n, "catch_ups": m}``.

        ``rebuilds`` counts the times its trajectory index was built from the whole storage (``O(N)``: the first
        draw, then writes that are not appends), ``catch_ups`` the draws that applied the rows written since in
        ``O(rows written)`` (NOTE [catching up on appends] in ``trajectories/sync.py``). Per process: a
        DataLoader worker's copy counts its own. Both ``0`` before the first draw and on storages without the
        live index.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, SliceSampler
            >>> storage = LazyTensorStorage(100)
            >>> sampler = SliceSampler(slice_len=2, traj_key="episode")
            >>> storage.set(torch.arange(10), TensorDict(episode=torch.arange(10) // 5, batch_size=[10]))
            >>> _ = sampler.sample(storage, 4)
            >>> storage.set(torch.arange(10, 15), TensorDict(episode=torch.full((5,), 2), batch_size=[5]))
            >>> _ = sampler.sample(storage, 4)
            >>> sampler.trajectory_index_stats
            {'rebuilds': 1, 'catch_ups': 1}
        """
        live = self._runs if self.fragmented else self._live
        none = live is None
        return {"rebuilds": 0 if none else live.rebuilds, "catch_ups": 0 if none else live.catch_ups}

    def can_sample(self, storage, batch_size: int) -> bool:
        """Whether :meth:`sample` can draw a batch of ``batch_size`` from ``storage`` now.

        ``False`` when the storage is empty or, with ``strict_length=True``, when no trajectory holds a full
        slice (with its span); the checks of :meth:`sample` on the arguments (``batch_size`` not divisible into
        slices, a storage the sampler cannot read, no trajectory entry) raise as :meth:`sample` does.

        Args:
            storage (Storage): the storage to draw from.
            batch_size (int): the batch size (before :attr:`batch_size_multiplier`).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, SliceSampler
            >>> storage = LazyTensorStorage(100)
            >>> sampler = SliceSampler(slice_len=8, traj_key="episode")
            >>> sampler.can_sample(storage, 16)
            False
            >>> storage.set(torch.arange(12), TensorDict(episode=torch.arange(12) // 6, batch_size=[12]))
            >>> sampler.can_sample(storage, 16)  # two trajectories of 6 steps: too short for 8
            False
            >>> SliceSampler(slice_len=4, traj_key="episode").can_sample(storage, 16)
            True
        """
        num_slices, slice_len = self._slice_shape(self._scaled_batch_size(batch_size))
        if len(storage) == 0:
            return False
        return self._can_draw(self._boundaries(storage), num_slices, slice_len)

    def _can_draw(self, bounds: _Boundaries, num_slices: int, slice_len: int) -> bool:
        """Whether the boundaries hold enough trajectories for ``num_slices`` slices of ``slice_len`` steps."""
        try:
            return self._eligible(bounds, slice_len).size > 0
        except RuntimeError:  # no trajectory long enough (strict_length=True)
            return False

    # -- repr ------------------------------------------------------------------------------------------------
    def _repr_fields(self) -> list[str]:
        """``name=value`` parts of the repr: the size, the trajectory source and the sampling options."""
        if self.num_slices is not None:
            fields = [f"num_slices={self.num_slices}"]
        else:
            fields = [f"slice_len={self.slice_len}"]
        if self._static is not None:
            fields.append("source=static")
        elif self.end_keys is not None:
            fields += [f"traj_key={self.traj_key!r}", f"end_keys={list(self.end_keys)!r}"]
        else:
            fields += [f"traj_key={self.traj_key!r}", f"end_key={self.end_key!r}"]
        fields += [
            f"strict_length={self.strict_length}",
            f"pad_output={self.pad_output}",
            f"span={self.span}",
            f"cache_values={self.cache_values}",
        ]
        if self.fragmented:
            fields += ["fragmented=True", f"step_key={self.step_key!r}"]
        compat = (("compile", self.compile), ("use_gpu", self.use_gpu))  # shown when set
        return fields + [f"{name}={value!r}" for name, value in compat if value is not False]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._repr_fields())})"
