"""n-step returns computed as data is written to a replay buffer: :class:`MultiStepTransform`.

Data model: a collector hands ``extend`` a stream of TED steps (:mod:`torchrl.data.replay_buffers.ted`) in chunks
of any length, time along the last batch dim (``[T]``, or ``[*B, T]`` for batched environments). The transform
holds back the last ``n_steps`` steps it received. Each write runs :class:`~torchrl.data.MultiStep` over the held
steps followed by the new ones and passes on all but the last ``n_steps`` of them, which it holds for the next
write. A step is passed on only once the ``n_steps - 1`` steps after it are known, so what it looks ahead over is
what a whole-rollout :class:`~torchrl.data.MultiStep` sees: the stored data does not depend on how the stream was
chunked, and equals ``MultiStep`` over the whole stream, except its last ``n_steps`` steps, still held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import is_int, is_real
from torchrl.envs.transforms.transforms import Transform

MULTISTEP_N_STEPS = TorchRLPhrase(
    ValueError,
    "The value of n_steps must be a strictly positive integer.",
    "The value of n_steps must be a strictly positive integer. Got n_steps={value!r} ({cls}): pass an int >= 1 "
    "(the number of steps each transition looks ahead; 1 leaves one-step transitions).",
)

if TYPE_CHECKING:
    from torchrl.data.postprocs.postprocs import MultiStep

__all__ = ["MultiStepTransform"]


_HELD_STATE_VERSION = 1


def _check_key(name: str, key):
    """``key`` as a NestedKey (a str or a non-empty tuple of str); ``TypeError`` otherwise."""
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    raise TypeError(
        f"`{name}` must be a key: a str or a tuple of str (a nested key), got {key!r} ({type(key).__name__})."
    )


def _check_keys(name: str, keys, default: Sequence) -> list:
    """``keys`` as a list of NestedKeys: a single key or a list of keys; ``default`` when ``None``."""
    if keys is None:
        return list(default)
    if isinstance(keys, (str, tuple)) and _is_key(keys):
        return [keys]
    if not isinstance(keys, (list, tuple)) or not keys:
        raise TypeError(f"`{name}` must be a key or a non-empty list of keys, got {keys!r}.")
    return [_check_key(name, k) for k in keys]


def _is_key(value) -> bool:
    return isinstance(value, str) or (isinstance(value, tuple) and bool(value) and all(isinstance(k, str) for k in value))


def _as_tuple(key) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def check_gamma(gamma) -> float:
    """``gamma`` as a float in ``(0, 1]``; ``TypeError`` for a non-number, ``ValueError`` out of range."""
    if not is_real(gamma):
        raise TypeError(f"`gamma` must be a float in (0, 1] (the discount of one step), got {gamma!r} "
                        f"({type(gamma).__name__}).")
    if not 0 < float(gamma) <= 1:
        raise ValueError(f"`gamma` must be in (0, 1] (the discount of one step, e.g. 0.99), got {gamma!r}.")
    return float(gamma)


def check_n_steps(n_steps) -> int:
    """``n_steps`` as an int ``>= 1`` (TorchRL's ``ValueError`` otherwise, non-int values included)."""
    if not is_int(n_steps) or n_steps < 1:
        raise MULTISTEP_N_STEPS.error(value=n_steps, cls=type(n_steps).__name__)
    return int(n_steps)


class MultiStepTransform(Transform):
    """Rewrites the steps written to a replay buffer into n-step transitions, whatever the chunk sizes.

    A collector writes its rollouts to a buffer in chunks; :class:`~torchrl.data.MultiStep` applied to each
    chunk would look ahead fewer steps at the end of every chunk (the steps after it are not known yet). This
    transform, run by the buffer on the write path (``extend`` and ``add``), holds back the last ``n_steps``
    steps of each write and processes them with the next one (see the module docstring): the stored data equals
    :class:`~torchrl.data.MultiStep` over the whole stream, for any chunking.

    Each stored step ``t`` gets the entries of :class:`~torchrl.data.MultiStep` (TorchRL's semantics), ``k + 1``
    being the number of steps looked ahead (``n_steps``, fewer before the end of a trajectory):

    - ``("next", reward_key)``: the discounted sum of the ``k + 1`` rewards, for each of ``reward_keys``; the
      step's own reward goes to ``("next", "original_reward")`` (with several reward keys, each to
      ``("next", ..., "original_<name>")``);
    - every other ``"next"`` entry but ``done_keys``: its value at step ``t + k`` (so ``("next",
      "observation")`` is the observation ``k + 1`` steps ahead); the done flags stay those of step ``t``;
    - ``"steps_to_next_obs"`` (``k + 1``), ``"gamma"`` (``gamma ** (k + 1)``) and ``"nonterminal"`` (``k != 0``
      and the step's ``mask_key`` flag, when present).

    A write that leaves ``n_steps`` steps or fewer held stores nothing (the buffer's ``extend`` returns an empty
    index). Data of batch size ``[*B, T]`` (batched environments, time last) needs a storage with ``ndim=2`` and
    the buffer's ``dim_extend=1``, so that the ``[*B, T']`` output is written along time.

    .. note:: It acts on the write path only: sampling returns the stored (already n-step) data unchanged, so a
        buffer read through :meth:`~torchrl.data.ReplayBuffer.as_dataset` with DataLoader workers behaves as
        without it. Its held steps belong to the process that writes: each writer process of a shared buffer
        keeps its own (one stream per writer, as each collector process runs its own rollouts).

    The held steps are part of ``state_dict()`` (as a TensorDict), so ``rb.dumps``/``rb.loads`` and
    ``rb.state_dict()``/``rb.load_state_dict()`` resume a stream where it was cut (TorchRL loses them).

    Args:
        n_steps (int): the number of steps looked ahead, ``>= 1``. It may be changed between writes
            (``transform.n_steps = 5``).
        gamma (float): the discount factor, in ``(0, 1]``.

    Keyword Args:
        reward_keys (NestedKey or list of NestedKey, optional): the rewards summed, read under ``"next"``.
            Defaults to ``["reward"]``.
        done_key (NestedKey, optional): the flag that ends a trajectory, read under ``"next"``. Defaults to
            ``"done"``.
        done_keys (list of NestedKey, optional): the end-of-step flags, kept as they are (not looked ahead).
            Defaults to ``["done", "truncated", "terminated"]``.
        mask_key (NestedKey, optional): a per-step validity flag: ``"nonterminal"`` is ``False`` where it is
            ``False``. Defaults to ``"mask"``.
        traj_key (NestedKey, optional): the trajectory id of each step, for a stream whose steps of several
            trajectories are interleaved (several environments or collectors writing one ``[T]`` stream step by
            step). Each trajectory is then looked ahead over its own steps only, in the order written: the
            transform holds back the last ``n_steps`` steps of each trajectory, and all of them once its last
            held step is done; the stored steps keep the order in which they were written. ``None`` treats the
            stream as one time line (TorchRL's behaviour). Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl.envs.transforms import MultiStepTransform
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(20), transform=MultiStepTransform(n_steps=3, gamma=0.5))
        >>> def steps(start, n):
        ...     t = torch.arange(start, start + n)
        ...     return TensorDict({"obs": t, "next": {"obs": t + 1, "reward": torch.ones(n),
        ...                                          "done": torch.zeros(n, dtype=torch.bool)}}, batch_size=[n])
        >>> rb.extend(steps(0, 2)).numel()  # 2 steps, both held back
        0
        >>> _ = rb.extend(steps(2, 4))  # 6 steps seen: the first 3 are stored
        >>> stored = rb[:]
        >>> stored["next", "reward"], stored["next", "obs"], stored["steps_to_next_obs"]
        (tensor([1.7500, 1.7500, 1.7500]), tensor([3, 4, 5]), tensor([3, 3, 3]))
    """

    def __init__(
        self,
        n_steps: int,
        gamma: float,
        *,
        reward_keys: Any = None,
        done_key: Any = None,
        done_keys: Sequence | None = None,
        mask_key: Any = None,
        traj_key: Any = None,
    ):
        super().__init__()
        self.n_steps = n_steps
        self.gamma = gamma
        self.reward_keys = reward_keys
        self.done_key = done_key
        self.done_keys = done_keys
        self.mask_key = mask_key
        self.traj_key = None if traj_key is None else _check_key("traj_key", traj_key)
        self._buffer: TensorDictBase | None = None

    @property
    def n_steps(self) -> int:
        """The number of steps looked ahead (``>= 1``); may be changed between writes."""
        return self._n_steps

    @n_steps.setter
    def n_steps(self, value: int) -> None:
        self._n_steps = check_n_steps(value)

    @property
    def gamma(self) -> float:
        """The discount factor, in ``(0, 1]``."""
        return self._gamma

    @gamma.setter
    def gamma(self, value: float) -> None:
        self._gamma = check_gamma(value)

    # TorchRL's key properties: each may be changed between writes; ``None`` sets the default back
    @property
    def reward_keys(self) -> list:
        """The reward entries (under ``"next"``) summed over the look-ahead. Defaults to ``["reward"]``."""
        return self._reward_keys

    @reward_keys.setter
    def reward_keys(self, value) -> None:
        self._reward_keys = _check_keys("reward_keys", value, ["reward"])

    @property
    def done_key(self):
        """The entry (under ``"next"``) whose flags end the look-ahead. Defaults to ``"done"``."""
        return self._done_key

    @done_key.setter
    def done_key(self, value) -> None:
        self._done_key = _check_key("done_key", value if value is not None else "done")

    @property
    def done_keys(self) -> list:
        """All the done entries, carried from the step at the end of the look-ahead. Defaults to
        :data:`~torchrl.data.DEFAULT_DONE_KEYS`."""
        return self._done_keys

    @done_keys.setter
    def done_keys(self, value) -> None:
        from torchrl.data.replay_buffers.ted import DEFAULT_DONE_KEYS  # NOTE [deferred torchrl.data imports]

        self._done_keys = _check_keys("done_keys", value, DEFAULT_DONE_KEYS)

    @property
    def mask_key(self):
        """The entry that marks the steps whose look-ahead is complete. Defaults to ``"mask"``."""
        return self._mask_key

    @mask_key.setter
    def mask_key(self, value) -> None:
        self._mask_key = _check_key("mask_key", value if value is not None else "mask")

    def _multistep(self) -> MultiStep:
        from torchrl.data.postprocs.postprocs import MultiStep  # NOTE [deferred torchrl.data imports]

        module = MultiStep(self.gamma, self.n_steps)
        module.reward_keys, module.done_key = list(self.reward_keys), self.done_key
        module.done_keys, module.mask_key = list(self.done_keys), self.mask_key
        return module

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The sample path: returns ``tensordict`` unchanged (the stored data is already n-step)."""
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        """The write path: the n-step version of the steps held and received, but the last ``n_steps``.

        Returns ``None`` when ``n_steps`` steps or fewer are held after this write (nothing to store yet).
        Nothing is held or changed when the data is refused.
        """
        window = self._window(tensordict)
        if self.traj_key is not None:
            return self._inv_interleaved(window)
        n = self.n_steps
        length = window.batch_size[-1]
        if length <= n:
            self._buffer = window.clone()
            return None
        out = self._multistep()(window)
        self._buffer = window[..., length - n:].clone()
        return out[..., : length - n]

    def _inv_interleaved(self, window: TensorDictBase) -> TensorDictBase | None:
        """:meth:`inv` with ``traj_key``: each trajectory of the window looked ahead over its own steps."""
        ids = self._trajectory_ids(window)
        length, n = window.batch_size[0], self.n_steps
        if not length:
            self._buffer = window.clone()
            return None
        order = torch.argsort(ids, stable=True)  # each trajectory's steps side by side, in the order written
        grouped = window[order]
        sid = ids[order]
        last = torch.ones(length, dtype=torch.bool, device=sid.device)
        last[:-1] = sid[1:] != sid[:-1]  # the newest held step of each trajectory
        position = torch.arange(length, device=sid.device)
        group_end = torch.where(last, position, torch.full_like(position, length))
        group_end = group_end.flip(0).cummin(0).values.flip(0)
        done_key = ("next", *_as_tuple(self.done_key))
        done = grouped.get(done_key)
        done = done.reshape(length, -1).bool().any(-1).to(sid.device)
        release = (group_end - position >= n) | done[group_end]  # n steps known after it, or its trajectory ended
        if not bool(release.any()):
            self._buffer = window.clone()
            return None
        bounded = grouped.clone(False)  # a trajectory's newest step ends its look-ahead (never a released one's)
        flags = grouped.get(done_key)
        bounded.set(done_key, flags | last.reshape(-1, *[1] * (flags.ndim - 1)).to(flags.device))
        out = self._multistep()(bounded)
        out.set(done_key, flags)
        written = order[release]
        out = out[release][torch.argsort(written)]  # in the order the steps were written
        kept = torch.sort(order[~release]).values
        self._buffer = window[kept].clone()
        return out

    def _trajectory_ids(self, window: TensorDictBase) -> torch.Tensor:
        if window.batch_dims != 1:
            raise ValueError(
                f"MultiStepTransform(traj_key={self.traj_key!r}) takes one interleaved stream of batch size [T], got "
                f"{list(window.batch_size)}: write each environment's steps with their trajectory ids as one [T] "
                f"stream, or leave traj_key=None for [*B, T] data."
            )
        ids = window.get(self.traj_key, None)
        if not isinstance(ids, torch.Tensor) or ids.shape[:1] != window.batch_size or ids.shape[1:].numel() != 1:
            raise KeyError(
                f"MultiStepTransform(traj_key={self.traj_key!r}) needs one trajectory id per step under "
                f"{self.traj_key!r}; the data written holds "
                f"{'none' if ids is None else 'an entry of shape ' + str(list(getattr(ids, 'shape', [])))}. Pass "
                f"the entry holding trajectory ids with `traj_key=`."
            )
        return ids.reshape(-1)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        """TorchRL's name of the write path (its tests call ``transform._inv_call(rollout)``): :meth:`inv`."""
        return self.inv(tensordict)

    def _window(self, data) -> TensorDictBase:
        """The held steps followed by ``data`` (checked: a TensorDict with a time dim and the needed keys)."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"MultiStepTransform takes TensorDicts (TED steps, time last), got {type(data).__name__}: use it "
                f"in a TensorDictReplayBuffer or a ReplayBuffer written with TensorDicts."
            )
        if data.batch_dims == 0:
            raise ValueError(
                "MultiStepTransform needs a time dim: write a TensorDict of batch size [T] or [*B, T] (time last)."
            )
        for key in (*[("next", *_as_tuple(k)) for k in self.reward_keys], ("next", *_as_tuple(self.done_key))):
            if data.get(key, None) is None:
                raise KeyError(
                    f"MultiStepTransform needs the entry {key!r} in the data written; it has none. Pass the "
                    f"reward and done entries the data holds with `reward_keys=` and `done_key=`."
                )
        held = self._buffer
        if held is None:
            return data
        if held.batch_size[:-1] != data.batch_size[:-1]:
            raise ValueError(
                f"MultiStepTransform holds steps of batch size {list(held.batch_size)} and received "
                f"{list(data.batch_size)}: the leading (environment) dims must stay the same from one write to "
                f"the next."
            )
        if held.device != data.device:
            held = held.to(data.device)
        try:
            return torch.cat([held, data], dim=-1)
        except (KeyError, RuntimeError, ValueError) as err:
            raise ValueError(
                f"MultiStepTransform cannot append the data written to the steps it holds ({err}): every write "
                f"must carry the same entries, with the same shapes and dtypes."
            ) from err

    # -- state: the held steps, saved with state_dict() (so by dumps/loads too) --------------------------------
    def get_extra_state(self) -> dict:
        """The held steps, as ``{"version": 1, "held": TensorDict or None}``: part of ``state_dict()``."""
        return {"version": _HELD_STATE_VERSION, "held": self._buffer}

    def set_extra_state(self, state: Any) -> None:
        """Restores the held steps saved by :meth:`get_extra_state` (checked first)."""
        if not isinstance(state, dict) or state.get("version") != _HELD_STATE_VERSION or "held" not in state:
            raise ValueError(
                f"The MultiStepTransform state must be a dict {{'version': {_HELD_STATE_VERSION}, 'held': "
                f"TensorDict or None}}, got {state!r}: load a state saved by this version's state_dict()."
            )
        held = state["held"]
        if held is not None and (not isinstance(held, TensorDictBase) or held.batch_dims == 0):
            raise ValueError(
                f"The held steps of a MultiStepTransform state must be a TensorDict with a time dim, or None; got "
                f"{type(held).__name__}."
            )
        self._buffer = None if held is None else held.clone()

    def extra_repr(self) -> str:
        held = 0 if self._buffer is None else self._buffer.batch_size[-1]
        traj = "" if self.traj_key is None else f", traj_key={self.traj_key!r}"
        return f"n_steps={self.n_steps}, gamma={self.gamma}, reward_keys={self.reward_keys}{traj}, held={held}"

    def __repr__(self) -> str:
        return f"MultiStepTransform({self.extra_repr()})"
