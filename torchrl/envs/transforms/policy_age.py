"""Rows collected by a policy too old for the learner dropped: :class:`PolicyAgeFilter`.

Data model: each row carries the version of the policy that collected it (``"policy_version"``, an int per step,
as TorchRL's ``PolicyVersion`` env transform writes it). A row is stale when ``current_version - version`` exceeds
``max_policy_lag``; for a row with trailing dims (a ``[B, T]`` trajectory item) its oldest step decides.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import is_int
from torchrl.envs.transforms.transforms import Transform

POLICY_LAG_NEGATIVE = TorchRLPhrase(
    ValueError,
    "max_policy_lag must be non-negative",
    "max_policy_lag must be non-negative, got {value!r}: pass 0 to keep the current policy's data only, or the "
    "largest number of policy versions a row may lag.",
)
POLICY_VERSION_MISSING = TorchRLPhrase(
    KeyError,
    "PolicyAgeFilter:",
    "PolicyAgeFilter: the data has no {key!r} entry (strict=True). Write each row's policy version there, "
    "pass the key that holds it with `policy_version_key=`, or strict=False to let such data through.",
)

__all__ = ["PolicyAgeFilter"]


class PolicyAgeFilter(Transform):
    """Drops rows whose policy version lags the current one by more than ``max_policy_lag``.

    Off-policy corrections only hold for data collected by a recent policy (IMPALA- or APPO-style learners bound
    the lag). On a replay buffer this transform filters on both paths: on the write path (``extend``/``add``)
    stale rows are never stored, and on the sample path rows that became stale since they were written are
    dropped from the batch, so a sampled batch may be smaller than asked, possibly empty. A row is kept when
    ``current_version - version <= max_policy_lag``; the version of a row with trailing dims (``[B, T]``
    items) is its smallest one.

    ``current_version`` may be a zero-argument callable, called at each write and each sample (e.g. reading
    the learner's update counter); with DataLoader workers, each worker calls its own copy, so the callable
    must read a value the workers see (a shared-memory counter), or the workers use the version they were
    started with.

    .. note:: Every buffer takes it on both paths. On the sample path, a
        :class:`~torchrl.data.TensorDictReplayBuffer` whose batch lost rows leaves out of it the sampler's info
        entries that hold one value per drawn row (``"priority_weight"``, slice flags), as they no longer match
        the rows kept; the ``"index"`` its writer stores with each row stays with the row, and
        ``sample(return_info=True)`` still returns the info of every drawn row.

    Args:
        current_version (int or callable): the learner's policy version, or a zero-argument callable
            returning it.
        max_policy_lag (int): the largest lag kept, ``>= 0`` (``0``: the current version only).

    Keyword Args:
        policy_version_key (NestedKey): the entry holding each row's version. Defaults to ``"policy_version"``.
        strict (bool): a batch without that entry raises ``KeyError``; ``False`` lets it through unfiltered
            (with a warning, once). Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl.envs.transforms import PolicyAgeFilter
        >>> version = {"now": 3}
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10),
        ...                   transform=PolicyAgeFilter(lambda: version["now"], max_policy_lag=1))
        >>> data = TensorDict(policy_version=torch.tensor([0, 2, 2, 3]), obs=torch.arange(4), batch_size=[4])
        >>> _ = rb.extend(data)  # version 0 lags by 3: not stored
        >>> len(rb)
        3
        >>> version["now"] = 4  # versions 2 are now stale too
        >>> rb.sample(8)["policy_version"].unique()
        tensor([3])
    """

    def __init__(
        self,
        current_version: int | Callable[[], int],
        max_policy_lag: int,
        *,
        policy_version_key: Any = "policy_version",
        strict: bool = False,
    ):
        super().__init__()
        if not (is_int(current_version) or callable(current_version)):
            raise TypeError(
                f"`current_version` must be an int or a zero-argument callable returning the current policy "
                f"version, got {current_version!r} ({type(current_version).__name__})."
            )
        if not is_int(max_policy_lag) and not (isinstance(max_policy_lag, float) and max_policy_lag.is_integer()):
            raise TypeError(f"`max_policy_lag` must be an int >= 0, got {max_policy_lag!r} "
                            f"({type(max_policy_lag).__name__}).")
        if max_policy_lag < 0:
            raise POLICY_LAG_NEGATIVE.error(value=max_policy_lag)
        if not (isinstance(policy_version_key, str) or (isinstance(policy_version_key, tuple) and policy_version_key)):
            raise TypeError(f"`policy_version_key` must be a key (str or tuple of str), got {policy_version_key!r}.")
        if not isinstance(strict, bool):
            raise TypeError(f"`strict` must be a bool, got {strict!r}.")
        self.current_version = current_version
        self.max_policy_lag = int(max_policy_lag)
        self.policy_version_key = policy_version_key
        self.strict = strict
        self._warned = False

    def version(self) -> int:
        """The current policy version (``current_version``, called when it is a callable)."""
        value = self.current_version() if callable(self.current_version) else self.current_version
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not is_int(value):
            raise TypeError(
                f"`current_version` returned {value!r} ({type(value).__name__}); it must return an int: the "
                f"learner's policy version."
            )
        return int(value)

    def _filter(self, data):
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"PolicyAgeFilter takes TensorDicts, got {type(data).__name__}.")
        versions = data.get(self.policy_version_key, None)
        if versions is None:
            if self.strict:
                raise POLICY_VERSION_MISSING.error(key=self.policy_version_key)
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"PolicyAgeFilter: the data has no {self.policy_version_key!r} entry, so it is not filtered "
                    f"(this warning is shown once). Write the policy version of each row there, or pass "
                    f"strict=True to raise instead.",
                    UserWarning,
                    stacklevel=3,
                )
            return data
        if data.batch_dims == 0:
            raise ValueError("PolicyAgeFilter filters rows: pass a TensorDict with a batch dim.")
        rows = data.batch_size[0]
        if not isinstance(versions, torch.Tensor) or versions.ndim == 0 or versions.shape[0] != rows:
            raise ValueError(
                f"The {self.policy_version_key!r} entry must hold one version per row (shape ({rows}, ...)), got "
                f"{list(versions.shape) if isinstance(versions, torch.Tensor) else type(versions).__name__}."
            )
        oldest = versions.reshape(rows, -1).amin(-1) if versions.ndim > 1 else versions
        keep = (self.version() - oldest) <= self.max_policy_lag
        if bool(keep.all()):
            return data
        return data[keep.to(data.device) if data.device is not None else keep]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The sample path: the rows of ``tensordict`` that are not stale (possibly none)."""
        return self._filter(tensordict)

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        """The write path: the rows of ``tensordict`` that are not stale; the others are not stored.

        Returns ``None`` when every row is stale, so that the buffer writes nothing (``add`` of a stale item
        included).
        """
        kept = self._filter(tensordict)
        return None if kept.batch_dims and kept.batch_size[0] == 0 and tensordict.batch_size[0] else kept

    def __repr__(self) -> str:
        return (
            f"PolicyAgeFilter(current_version={self.current_version!r}, max_policy_lag={self.max_policy_lag}, "
            f"policy_version_key={self.policy_version_key!r}, strict={self.strict})"
        )
