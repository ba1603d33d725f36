"""The sampler contract.

A sampler draws indices from a storage: ``sample(storage, batch_size) -> (index, info)``. ``index`` is a
1-D int64 tensor for 1-D storages and a tuple of per-dimension tensors for ``ndim > 1`` storages; ``info``
is a dict of per-sample tensors (priority weights, slice flags, ...) that TensorDict buffers write into the
batch. The buffer tells the sampler about writes (``extend``/``add``/``mark_update``) and priority updates
(``update_priority``). All randomness goes through ``self._rng`` (the buffer's ``torch.Generator``, set by
``ReplayBuffer.set_rng``) or, when it is ``None``, torch's global generator.

The one exception: :class:`~torchrl.data.PrioritizedSampler` without a generator draws from numpy's global
generator (``np.random``), as TorchRL's does, so code seeding it with ``np.random.seed`` reproduces its draws.

NOTE [sampler state validation]: ``load_state_dict(state_dict)`` is one step for every sampler:
:meth:`Sampler.validate_state_dict` checks the whole state against the sampler (types, ranges, that a permutation
is one, capacities) and returns it normalised (its own copies of the tensors), then ``_apply_state`` installs that
result and cannot fail. A sampler defines the two hooks ``_validate_state(state) -> state`` and
``_apply_state(state)``, never ``load_state_dict`` itself, so a refused state changes nothing. A checkpoint runs the
same check before any part of the buffer is loaded (:meth:`Sampler.check_checkpoint_part`), with the state decoded
from the checkpoint. The field checks (:func:`state_int`, :func:`state_bool`, :func:`state_index_tensor`) give every
sampler the same message.

``requires_shared_state`` says whether a copy of the sampler in another process (a DataLoader worker) would
change what is sampled: True for samplers holding an epoch permutation or priorities, False for samplers
whose draws depend only on the storage content and their configuration. It defaults to True, so a sampler
that does not declare it is treated as stateful. A stateful sampler that can put that state in shared memory
declares ``can_share_state = True`` and implements ``share_memory_()``/``is_shared``: once shared, the main
process and every DataLoader worker read and write one copy (``rb.as_dataset()`` shares it).

Samplers that run out (epochs without replacement) can be pinned to the epoch in progress
(``pin_epoch``/``unpin_epoch``): a DataLoader iteration then ends at that epoch's end in every worker (their
``sample`` raises :class:`~torchrl.data.EpochEnded`). See :mod:`._shared_epoch`.

Every sampler constructor also takes a ``replacement`` keyword (see :class:`Sampler`), resolved by the
metaclass :class:`_SamplerMeta` with the table :data:`_REPLACEMENT_DISPATCH` before ``__init__`` runs.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

import torchrl.data.replay_buffers._checkpoint.parts as _parts
from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_bool, check_positive_int, is_int
from torchrl.data.replay_buffers.component import Component
from torchrl.data.replay_buffers.errors import CheckpointError

PRIORITIZED_WITHOUT_REPLACEMENT = TorchRLPhrase(
    TypeError,
    "no without-replacement variant",
    "{cls} has no without-replacement variant (got replacement={replacement!r}): its draws are always with "
    "replacement. Drop the argument, or use a sampler without replacement ({choices}).",
)
CONSUMED_EMPTY = TorchRLPhrase(
    RuntimeError,
    "Cannot sample from an empty storage",
    "Cannot sample from an empty storage: {why}.",
)

_INT64_MAX = torch.iinfo(torch.int64).max

#: Sampler class with replacement -> the class that samples the same way without replacement. Filled next to
#: the classes (``random.py``, ``slice_without_replacement.py``) with :func:`register_without_replacement`.
#: The values, and their subclasses, are the classes that sample without replacement.
_REPLACEMENT_DISPATCH: dict[type, type] = {}


def register_without_replacement(with_replacement: type, without_replacement: type) -> None:
    """Declares ``without_replacement`` as what ``with_replacement(..., replacement=False)`` builds."""
    _REPLACEMENT_DISPATCH[with_replacement] = without_replacement


def _without_replacement_counterpart(cls: type) -> type | None:
    """The registered class with replacement whose counterpart ``cls`` is (or derives from), if any."""
    inverse = {without: with_ for with_, without in _REPLACEMENT_DISPATCH.items()}
    return next((inverse[base] for base in cls.__mro__ if base in inverse), None)


def _init_signature(cls: type) -> inspect.Signature:
    """The signature of ``cls.__init__`` without ``self`` (empty for classes without an ``__init__``)."""
    init = cls.__init__
    if init is object.__init__:
        return inspect.Signature()
    params = list(inspect.signature(init).parameters.values())
    return inspect.Signature(params[1:])


class _SamplerMeta(abc.ABCMeta):
    """Metaclass of samplers: resolves the ``replacement`` keyword of every sampler constructor.

    ``cls(*args, replacement=..., **kwargs)`` becomes:

    - ``replacement=False`` on a class listed in :data:`_REPLACEMENT_DISPATCH`: its counterpart without
      replacement, built with ``*args, **kwargs`` (arguments the counterpart does not take: TypeError);
    - ``replacement=False`` on a class that samples without replacement, or ``replacement=True`` on one that
      samples with replacement: ``cls(*args, **kwargs)``;
    - otherwise a TypeError that says which class to use.

    A class whose ``__init__`` declares its own ``replacement`` parameter receives it unchanged. Only
    construction goes through here: ``pickle`` and ``copy`` rebuild instances without calling the class.
    """

    def __call__(cls, *args, **kwargs):
        if "replacement" not in kwargs or "replacement" in _init_signature(cls).parameters:
            return super().__call__(*args, **kwargs)
        target = _replacement_target(cls, kwargs.pop("replacement"))
        if target is cls:
            return super().__call__(*args, **kwargs)
        _check_forwarded(cls, target, args, kwargs)
        return target(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        # inspect.signature (and Sphinx) would otherwise show this metaclass's ``__call__(*args, **kwargs)``.
        return _init_signature(cls)


def _replacement_target(cls: type, replacement) -> type:
    """The class that ``cls(..., replacement=replacement)`` builds (see :class:`_SamplerMeta`)."""
    replacement = check_bool(
        "replacement",
        replacement,
        hint="Pass replacement=False to sample without replacement, or leave it out.",
    )
    counterpart = _without_replacement_counterpart(cls)
    if counterpart is not None:  # cls samples without replacement
        if replacement:
            raise TypeError(
                f"{cls.__name__} samples without replacement, which `replacement`=True contradicts. Use "
                f"{counterpart.__name__} to sample with replacement, or leave `replacement` out."
            )
        return cls
    if replacement:
        return cls
    target = _REPLACEMENT_DISPATCH.get(cls)
    if target is None:
        choices = " or ".join(sorted(without.__name__ for without in _REPLACEMENT_DISPATCH.values()))
        raise PRIORITIZED_WITHOUT_REPLACEMENT.error(
            cls=cls.__name__, replacement=replacement, choices=choices
        )
    return target


def _check_forwarded(cls: type, target: type, args: tuple, kwargs: dict) -> None:
    """Raises a TypeError naming the arguments of ``cls(...)`` that ``target`` does not take."""
    signature = _init_signature(target)
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [] if takes_any else [name for name in kwargs if name not in params]
    if unknown:
        got = ", ".join(f"{name}={kwargs[name]!r}" for name in unknown)
        raise TypeError(
            f"{cls.__name__}(..., replacement=False) builds a {target.__name__}, which does not take "
            f"{', '.join(f'`{name}`' for name in unknown)} (got {got}). Leave these arguments out, or sample "
            f"with replacement ({cls.__name__} without `replacement`)."
        )
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(
            f"{cls.__name__}(..., replacement=False) builds a {target.__name__}{signature}, which cannot "
            f"take these arguments: {err}. Pass the arguments of {target.__name__}."
        ) from None


class Sampler(Component, metaclass=_SamplerMeta):
    """Base class of replay-buffer samplers (see the module docstring for the contract).

    Every sampler constructor takes a ``replacement`` keyword, so that code choosing the sampling mode with a
    flag runs unchanged: ``RandomSampler(replacement=False)`` returns a :class:`SamplerWithoutReplacement`
    and ``SliceSampler(..., replacement=False)`` a :class:`SliceSamplerWithoutReplacement` (the other
    arguments are forwarded; those the class without replacement does not take raise a TypeError).
    ``replacement=True`` on a class that samples with replacement, and ``replacement=False`` on one that
    samples without, change nothing; ``replacement=False`` on another class (e.g. a prioritized one) and
    ``replacement=True`` on a class without replacement raise a TypeError. The mapping is
    ``torchrl.data.replay_buffers.samplers.base._REPLACEMENT_DISPATCH``. Note that the object returned is
    then not an instance of the class called.

    Examples:
        >>> from torchrl.data import RandomSampler, SliceSampler
        >>> RandomSampler(replacement=False, drop_last=True)
        SamplerWithoutReplacement(drop_last=True, shuffle=True)
        >>> type(SliceSampler(slice_len=4, traj_key="episode", replacement=False)).__name__
        'SliceSamplerWithoutReplacement'
        >>> RandomSampler(replacement=True)
        RandomSampler()
    """

    requires_shared_state: bool = True
    #: Whether :meth:`share_memory_` can put the state that requires sharing in shared memory (``False``
    #: for samplers that do not declare it). A subclass that adds state of its own must share it too or set
    #: this back to ``False``.
    can_share_state: bool = False
    #: Whether draws consume items (:class:`~torchrl.data.ConsumingSampler`): ``len(rb)`` is then
    #: :meth:`num_sampleable`, writers fill the slots returned by ``free_slots(k)`` first, and iterating an
    #: exhausted buffer yields nothing.
    consumes_items: bool = False
    #: Whether every index :meth:`sample` returns is a position that holds data (``0 <= i < len(storage)``), by
    #: construction: a buffer then reads it with :meth:`Storage.read_rows <torchrl.data.Storage.read_rows>`,
    #: which skips the bounds check (a host sync on an accelerator). ``False`` (checked reads) by default.
    draws_in_bounds: bool = False
    #: The batch size a sampler that fixes its own count draws when neither ``sample`` nor the buffer gives one
    #: (:class:`~torchrl.data.GroupSampler` with ``num_groups``); ``None``: the buffer needs a ``batch_size``.
    default_batch_size: int | None = None
    checkpoint_role = "sampler"
    _rng: torch.Generator | None = None
    _remaining_batches: int = _INT64_MAX
    _ran_out: bool = False
    #: The attributes holding values derived from the storage content (caches of trajectory boundaries,
    #: weights, groups): the write notifications (:meth:`add`, :meth:`extend`, :meth:`mark_update`) and
    #: :meth:`_empty` set them to ``None``, and a pickled sampler carries them as ``None`` (its copy derives them
    #: again from the storage it reads). A subclass that overrides one of these methods calls ``super()``'s.
    _derived_state: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def sample(self, storage, batch_size: int) -> tuple[Any, dict]: ...

    def can_sample(self, storage, batch_size: int) -> bool:
        """Returns whether the sampler can draw ``batch_size`` items from ``storage`` now.

        The readiness rule behind ``rb.can_sample()`` and ``rb.sample(wait=True)``: the default is "the
        storage holds something"; samplers that need more (enough items left to consume, enough valid
        slices) override it. A configuration error (a batch size the sampler can never draw) is not a
        readiness question: ``sample`` raises it. Cheap: no draw, no change of state.

        Args:
            storage (Storage): the storage the sampler draws from.
            batch_size (int): the number of items of the batch.

        Examples:
            >>> import torch
            >>> from torchrl.data import LazyTensorStorage, RandomSampler
            >>> storage = LazyTensorStorage(4)
            >>> RandomSampler().can_sample(storage, 2)
            False
            >>> storage.set(torch.arange(1), torch.arange(1))
            >>> RandomSampler().can_sample(storage, 2)
            True
        """
        return len(storage) > 0

    def _forget_derived(self) -> None:
        """Sets every attribute of :attr:`_derived_state` to ``None``."""
        for name in self._derived_state:
            setattr(self, name, None)

    def add(self, index) -> None:
        """Called after one item was written at ``index``."""
        self._forget_derived()

    def extend(self, index) -> None:
        """Called after a batch was written at ``index``."""
        self._forget_derived()

    def update_priority(self, index, priority, *, storage=None) -> None:
        """Sets priorities; only prioritized samplers use them."""
        import warnings

        warnings.warn(
            f"update_priority() was called on {type(self).__name__}, which is not prioritized; the priorities "
            f"are ignored. Use PrioritizedSampler (or PrioritizedReplayBuffer) to sample by priority.",
            UserWarning,
            stacklevel=2,
        )

    def mark_update(self, index, *, storage=None) -> None:
        """Called by the writer (through the buffer) after ``index`` was written."""
        self._forget_derived()

    @property
    def default_priority(self) -> float:
        return 1.0

    @property
    def ran_out(self) -> bool:
        """True when a finite sampler finished an epoch with its last batch (never for endless samplers).

        Samplers that run out set ``self._ran_out``; a buffer resets it (``ran_out = False``) when an
        iteration over it starts.
        """
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._ran_out = bool(value)

    # -- sharing with DataLoader workers ---------------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        """Whether the sampler's state lives in shared memory (``False`` for samplers without state)."""
        return False

    def share_memory_(self) -> Sampler:
        """Moves the sampler's state to shared memory, so that processes receiving it afterwards (DataLoader
        workers) share one copy with this one. A no-op for a sampler without state
        (``requires_shared_state=False``).

        Raises:
            RuntimeError: the sampler is stateful and cannot share its state (``can_share_state=False``).
        """
        if not self.requires_shared_state:
            return self
        raise RuntimeError(
            f"{type(self).__name__} requires shared state (requires_shared_state=True) but cannot put it in shared "
            f"memory (can_share_state=False). Samplers that can: PrioritizedSampler, PrioritizedSliceSampler, "
            f"SamplerWithoutReplacement, SliceSamplerWithoutReplacement, ConsumingSampler, StalenessAwareSampler, "
            f"PromptGroupSampler and SamplerEnsembles of them."
        )

    def pin_epoch(self, key: int | None = None, readers: int = 1) -> None:
        """Pins this process's draws to the epoch in progress: once it ends, :meth:`sample` raises
        :class:`~torchrl.data.EpochEnded` instead of drawing from the next epoch, until :meth:`unpin_epoch`.

        A no-op for samplers without epochs (they never run out). Readers of one DataLoader iteration pass the
        same ``key`` and their number as ``readers``: a reader that starts after the others finished that
        epoch still pins it (and draws nothing) rather than the next one.

        Args:
            key (int, optional): what the readers of one iteration share. Defaults to ``None`` (this process
                only).
            readers (int): how many readers share ``key``. Defaults to ``1``.
        """

    def unpin_epoch(self) -> None:
        """Ends :meth:`pin_epoch`: draws run on across epochs again."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    # -- loading state: NOTE [sampler state validation] ----------------------------------------------------------
    def validate_state_dict(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """Checks that ``state_dict`` can be loaded into this sampler; returns the state :meth:`load_state_dict`
        installs (a new dict, with copies of its tensors). Changes nothing.

        Every entry is checked against this sampler: types, ranges (a cursor within its epoch, positions within
        the items the state covers), that a permutation is one, capacities. A checkpoint runs the same check
        before any part of a buffer is loaded.

        Raises:
            TypeError: ``state_dict`` is not a mapping, or an entry has the wrong type.
            ValueError: an entry is out of range or inconsistent with the others or with this sampler.

        Examples:
            >>> import torch
            >>> from torchrl.data import SamplerWithoutReplacement
            >>> sampler = SamplerWithoutReplacement()
            >>> state = {"len_storage": 3, "_sample_list": torch.tensor([0, 0]), "_ran_out": False}
            >>> sampler.validate_state_dict(state)
            Traceback (most recent call last):
            ...
            ValueError: SamplerWithoutReplacement state_dict['_sample_list'] repeats positions ([0]): ...
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"`state_dict` must be the dict returned by {type(self).__name__}.state_dict(), got "
                f"{type(state_dict).__name__}."
            )
        return self._validate_state(dict(state_dict))

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores a state returned by :meth:`state_dict`: :meth:`validate_state_dict`, then installs it. A
        refused state raises and leaves the sampler as it was."""
        self._apply_state(self.validate_state_dict(state_dict))

    def _validate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The hook of :meth:`validate_state_dict`: ``state`` (a new dict) checked and normalised. Raises
        ``TypeError``/``ValueError``; never changes the sampler. Default: a sampler without state accepts any
        mapping (TorchRL's ``{}``)."""
        return state

    def _apply_state(self, state: dict[str, Any]) -> None:
        """The hook of :meth:`load_state_dict`: installs a state returned by :meth:`_validate_state` (it must not
        raise: everything was checked). Default: nothing to install."""

    def check_checkpoint_part(self, doc: dict, tensors, ctx: _parts.PartContext) -> None:
        """Checks the saved part like every component's, then the saved state with :meth:`validate_state_dict`
        (before any part of the checkpoint is loaded).

        Raises:
            CheckpointError: the saved state would be refused by :meth:`load_state_dict`.
        """
        super().check_checkpoint_part(doc, tensors, ctx)
        if not isinstance(doc.get("state"), dict):
            return
        try:
            self.validate_state_dict(_parts.decode_state(doc["state"], tensors))
        except (TypeError, ValueError) as err:
            raise CheckpointError(
                f"The {type(self).__name__} state in the checkpoint {ctx.path!r} cannot be loaded: {err}"
            ) from err

    def _empty(self) -> None:
        self._forget_derived()

    def __getstate__(self):
        state = super().__getstate__()
        for name in self._derived_state:
            state[name] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_batch_size(batch_size) -> int:
    """Validates a sampling ``batch_size`` (a positive int)."""
    if type(batch_size) is int and batch_size > 0:  # the common case, without a call (run per batch)
        return batch_size
    return check_positive_int(
        "batch_size", batch_size, type_error=False, hint="Pass it to sample() or to the buffer."
    )


def check_not_empty(storage) -> int:
    """``len(storage)``; a ``RuntimeError`` that says to write data first when it is ``0``."""
    n = len(storage)
    if n == 0:
        raise CONSUMED_EMPTY.error(why="add data first (rb.add / rb.extend)")
    return n


def check_has_rows(storage) -> torch.Tensor:
    """:func:`check_not_empty` for paths that must not sync: ``storage.len_tensor()``, after checking
    ``storage.has_rows`` (known on the host)."""
    if not storage.has_rows:
        raise CONSUMED_EMPTY.error(why="add data first (rb.add / rb.extend)")
    return storage.len_tensor()


def uniform_draws(count, generator: torch.Generator | None, device) -> torch.Tensor:
    """``count`` float64 uniforms in ``[0, 1)``, from ``generator`` (on its device) or torch's default one (on
    ``device``). ``generator=None`` is not passed on: ``torch.compile`` fails to trace ``torch.rand`` of a
    symbolic size with an explicit ``generator=None``."""
    if generator is None:
        return torch.rand(count, device=device, dtype=torch.float64)
    return torch.rand(count, generator=generator, device=generator.device, dtype=torch.float64)


def unravel(flat: torch.Tensor, storage):
    """Flat cell positions -> what ``storage.get`` takes (the tensor itself for 1-D storages)."""
    if storage.ndim == 1:
        return flat
    return torch.unravel_index(flat, tuple(storage.shape))


# -- the field checks of validate_state_dict (NOTE [sampler state validation]) ------------------------------------
_REQUIRED = object()


def _state_error(who: str, key: str, value, expected: str, *, kind=ValueError) -> Exception:
    shown = value if isinstance(value, (int, float, bool, str, type(None))) else type(value).__name__
    return kind(
        f"{who} state_dict[{key!r}] is {shown!r}, expected {expected}. Load a state saved by "
        f"{who}.state_dict() (a crafted or edited state is refused). Nothing was changed."
    )


def _entry(state: Mapping, key: str, who: str, default):
    if key in state:
        return state[key]
    if default is _REQUIRED:
        raise ValueError(
            f"{who} state_dict has no {key!r} entry (it has {sorted(map(str, state))}): pass what "
            f"{who}.state_dict() returned. Nothing was changed."
        )
    return default


def state_int(state: Mapping, key: str, who: str, low: int, high: int | None = None, *, default=_REQUIRED):
    """``state[key]`` as an int in ``[low, high]`` (``high=None``: no upper bound; a one-element integer tensor is
    accepted); ``default`` when the entry is missing (required if not given). ``who`` names the sampler."""
    value = _entry(state, key, who, default)
    if value is default and key not in state:
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item() if value.dtype is not torch.bool else value
    allowed = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
    if not is_int(value):
        raise _state_error(who, key, value, allowed, kind=TypeError)
    if value < low or (high is not None and value > high):
        raise _state_error(who, key, int(value), allowed)
    return int(value)


def state_bool(state: Mapping, key: str, who: str, *, default=_REQUIRED) -> bool:
    """``state[key]`` as a bool (a bool or a one-element bool tensor); ``default`` when missing."""
    value = _entry(state, key, who, default)
    if value is default and key not in state:
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype is torch.bool:
        value = bool(value)
    if not isinstance(value, (bool, np.bool_)):
        raise _state_error(who, key, value, "a bool", kind=TypeError)
    return bool(value)


def state_index_tensor(
    state: Mapping, key: str, who: str, bound: int, *, unique: bool = False, default=_REQUIRED
) -> torch.Tensor | None:
    """``state[key]`` as a new 1-D int64 CPU tensor of positions in ``[0, bound)`` (``None`` stays ``None``), all
    distinct when ``unique``; ``default`` when missing."""
    value = _entry(state, key, who, default)
    if value is None or (value is default and key not in state):
        return value
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if (
        not isinstance(value, torch.Tensor)
        or value.is_floating_point()
        or value.is_complex()
        or value.dtype is torch.bool
    ):
        raise _state_error(who, key, value, "a 1-D tensor of integer positions", kind=TypeError)
    if value.ndim != 1:
        raise _state_error(who, key, f"a tensor of shape {list(value.shape)}", "a 1-D tensor of positions")
    value = value.detach().to("cpu", torch.int64, copy=True)
    if value.numel():
        lo, hi = int(value.min()), int(value.max())
        if lo < 0 or hi >= bound:
            bad = value[(value < 0) | (value >= bound)][:3].tolist()
            raise ValueError(
                f"{who} state_dict[{key!r}] holds positions out of [0, {bound}) (e.g. {bad}): the state covers "
                f"{bound} items. Load a state saved by {who}.state_dict(). Nothing was changed."
            )
        if unique:
            ordered = value.sort().values
            repeated = ordered[1:][ordered[1:] == ordered[:-1]]
            if repeated.numel():
                raise ValueError(
                    f"{who} state_dict[{key!r}] repeats positions ({repeated.unique()[:3].tolist()}): it must list "
                    f"each item at most once. Load a state saved by {who}.state_dict(). Nothing was changed."
                )
    return value
