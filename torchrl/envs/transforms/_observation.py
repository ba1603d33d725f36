"""CatFrames: frame stacks built from single stored frames at sample time. TorchRL's module path.

Data model. A batch of consecutive steps (``[*batch, T]``, time along the dim named ``"time"`` or the last batch
dim) holds one frame per step; a trajectory ends at a step whose ``("next", done_key)`` is set, and the batch's
time edges bound trajectories too. The window of step ``t`` is the frames ``t-N+1 .. t`` (``t .. t+N-1`` with
``future=True``) of ``t``'s trajectory, oldest first; its slots outside the trajectory are padded (``"same"``:
the trajectory's first (last, with ``future``) frame, ``"constant"``: ``padding_value``). The frames of a window
are concatenated along ``dim``, as TorchRL does (``[C, H, W]`` frames with ``dim=-3`` give ``[N*C, H, W]``).

Only the replay-buffer ("unfolding") use is provided: the env-side modes of TorchRL (stepping an environment,
``as_inverse``) need an environment, which this package has not. Imports of ``torchrl.data`` are deferred
(inside functions): ``torchrl.data`` imports this package.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase

from torchrl._phrases import TorchRLPhrase
from torchrl._validation import check_positive_int, is_int, is_real
from torchrl.envs.transforms.transforms import Compose, Transform

CATFRAMES_DIM = TorchRLPhrase(
    ValueError,
    "dim must be < 0",
    "dim must be < 0: CatFrames concatenates frames along a dim of each frame, counted from its end (e.g. "
    "dim=-3 for [C, H, W] images, dim=-1 for vectors); got dim={dim}.",
)
CATFRAMES_UNFOLDING_DONE = TorchRLPhrase(
    KeyError,
    "CatFrames.unfolding requires",
    "CatFrames.unfolding requires the done entry {key!r} to tell where trajectories start in a batch of "
    "consecutive steps; the data holds {keys}. Store it, pass `done_key` naming the stored done entry (read "
    "under 'next'), or pass future=True.",
)

__all__ = ["CatFrames"]

_PADDINGS = ("same", "constant")


def _env_side_error(what: str) -> RuntimeError:
    return RuntimeError(
        f"CatFrames {what} is TorchRL's env-side use (stacking frames while an environment steps), which this "
        f"package does not provide: it only provides the replay-buffer use, where frames are stored once and "
        f"stacked at sample time. Call the transform on a batch of consecutive steps (its forward), or use "
        f"CatFrames.make_rb_transform_and_sampler(...) with a replay buffer."
    )


def _next_key(key: NestedKey) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def _root_of_next(key: NestedKey):
    """``k`` for ``("next", *k)`` (a str for one level), else ``None``."""
    if isinstance(key, tuple) and len(key) >= 2 and key[0] == "next":
        return key[1] if len(key) == 2 else key[1:]
    return None


class CatFrames(Transform):
    """Concatenates the last ``N`` frames of each step, rebuilt at sample time from frames stored once.

    Storing stacked observations costs ``N`` times the memory of the frames; this transform rebuilds the
    stacks from consecutive stored steps instead. Given a batch of consecutive steps, it replaces each frame
    entry by the concatenation (along ``dim``) of the frames ``t-N+1 .. t`` of the same trajectory; slots
    before the trajectory's first step are padded. Use it in a replay buffer through
    :meth:`make_rb_transform_and_sampler`, which pairs it with a :class:`~torchrl.data.SliceSampler`. For
    ``[B, N, ...]`` stacks of frames with any sampler, see
    :class:`~torchrl.data.replay_buffers.sample_units.FrameStack`.

    Only the replay-buffer ("unfolding") use of TorchRL's ``CatFrames`` is provided: the env-side use
    (stepping an environment, ``as_inverse=True``) raises a ``RuntimeError``.

    Args:
        N (int): the number of frames per stack.
        dim (int): the (negative) dim of a frame along which frames are concatenated, e.g. ``-3`` for
            ``[C, H, W]`` images.
        in_keys (list of NestedKey, optional): the frame entries. Defaults to ``["pixels"]``.
        out_keys (list of NestedKey, optional): where the stacks are written. Defaults to ``in_keys``.
        padding (str): ``"same"`` (repeat the trajectory's first frame) or ``"constant"`` (fill with
            ``padding_value``). Defaults to ``"same"``.
        padding_value (float): the fill value of ``"constant"`` padding. Defaults to ``0``.
        as_inverse (bool): TorchRL's env-side inverse mode; ``True`` raises a ``RuntimeError`` here.
            Defaults to ``False``.
        reset_key (NestedKey, optional): TorchRL's env-side reset entry; accepted and unused.
            Defaults to ``None``.
        done_key (NestedKey, optional): the done entry under ``"next"`` that ends trajectories.
            Defaults to ``"done"``.
        future (bool): stack the frames ``t .. t+N-1`` instead (padding after the trajectory's last step).
            Defaults to ``False``.
        mask_key (NestedKey, optional): where to write a bool ``[*batch, N]`` mask, ``True`` on padded slots.
            Defaults to ``None`` (no mask).

    When both a key ``k`` and ``("next", k)`` are in ``in_keys``, the ``("next", k)`` stack is the ``k`` stack
    shifted by one frame, with the stored ``("next", k)`` frame of the step appended.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.transforms import CatFrames
        >>> done = torch.tensor([False, False, True, False, False]).unsqueeze(-1)
        >>> td = TensorDict({"obs": torch.arange(5.).unsqueeze(-1), ("next", "done"): done}, batch_size=[5])
        >>> td = td.refine_names("time")
        >>> CatFrames(N=3, dim=-1, in_keys=["obs"])(td)["obs"]  # the episode starting at step 3 is padded
        tensor([[0., 0., 0.],
                [0., 0., 1.],
                [0., 1., 2.],
                [3., 3., 3.],
                [3., 3., 4.]])
    """

    def __init__(
        self,
        N: int,
        dim: int,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        padding: str = "same",
        padding_value: float = 0,
        as_inverse: bool = False,
        reset_key: NestedKey | None = None,
        done_key: NestedKey | None = None,
        future: bool = False,
        mask_key: NestedKey | None = None,
    ):
        N = check_positive_int("N", N, hint="Pass the number of frames per stack, e.g. N=4.")
        if not is_int(dim):
            raise TypeError(f"`dim` must be a negative int (a dim of one frame, e.g. -3), got {dim!r}.")
        if dim >= 0:
            raise CATFRAMES_DIM.error(dim=dim)
        if padding == "zeros":
            raise RuntimeError(
                "CatFrames(padding='zeros') is deprecated (as in TorchRL): pass padding='constant' (its "
                "padding_value defaults to 0)."
            )
        if padding not in _PADDINGS:
            raise ValueError(f"`padding` must be one of {_PADDINGS}, got {padding!r}.")
        if not is_real(padding_value):
            raise TypeError(f"`padding_value` must be a number, got {padding_value!r}.")
        if as_inverse:
            raise _env_side_error("with as_inverse=True")
        super().__init__(in_keys=in_keys if in_keys is not None else ["pixels"], out_keys=out_keys)
        self.N = N
        self.dim = int(dim)
        self.padding = padding
        self.padding_value = padding_value
        self.as_inverse = False
        self.reset_key = reset_key
        self.done_key = done_key if done_key is not None else "done"
        self.future = bool(future)
        self.mask_key = mask_key

    # -- the env-side use is not provided ------------------------------------------------------------------------
    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise _env_side_error("stepping an environment (_call)")

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        raise _env_side_error("stepping an environment (_step)")

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        raise _env_side_error("resetting an environment (_reset)")

    # -- the replay-buffer use ("unfolding") -----------------------------------------------------------------------
    def _time_dim(self, tensordict: TensorDictBase) -> int:
        if tensordict.batch_dims == 0:
            raise ValueError(
                f"CatFrames stacks frames along a time dim, but got an unbatched TensorDict (batch_size="
                f"{list(tensordict.batch_size)}): pass a batch of consecutive steps, e.g. [T] or [B, T]."
            )
        names = tensordict.names
        if "time" in names:
            return names.index("time")
        warnings.warn(
            f"CatFrames found no dim named 'time' in a TensorDict of batch size {list(tensordict.batch_size)} "
            f"and uses its last batch dim as time. Name it, e.g. td.refine_names(..., 'time'), to silence this.",
            UserWarning,
            stacklevel=3,
        )
        return tensordict.batch_dims - 1

    def _ends(self, tensordict: TensorDictBase) -> torch.Tensor:
        """Per-step bool ``[*batch]``: whether the step ends its trajectory."""
        key = _next_key(self.done_key)
        done = tensordict.get(key, None)
        if done is None:
            if not self.future:
                raise CATFRAMES_UNFOLDING_DONE.error(key=key, keys=list(tensordict.keys(True, True)))
            return torch.zeros(tensordict.batch_size, dtype=torch.bool, device=tensordict.device)
        done = torch.as_tensor(done)
        if done.shape[: tensordict.batch_dims] != tensordict.batch_size:
            raise ValueError(
                f"The done entry {key!r} has shape {list(done.shape)}, expected one flag per step "
                f"{list(tensordict.batch_size)} (or [..., 1])."
            )
        done = done.reshape(*tensordict.batch_size, -1)
        return done.bool().any(-1) if done.shape[-1] else torch.zeros(tensordict.batch_size, dtype=torch.bool)

    def _windows(self, ends: torch.Tensor, tdim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source, padded)``: ``[*batch, N]`` time positions to read (padded slots already clamped for
        ``"same"``) and the mask of padded slots."""
        e = ends.movedim(tdim, -1)  # [*rest, T]
        T = e.shape[-1]
        t = torch.arange(T, device=e.device)
        if self.future:
            last = e.clone()
            last[..., -1] = True
            big = torch.full_like(t, T - 1).expand_as(last)
            bound = torch.where(last, t.expand_as(last), big).flip(-1).cummin(-1).values.flip(-1)  # end of traj
            steps = t.unsqueeze(-1) + torch.arange(self.N, device=e.device)  # [T, N]
            padded = steps > bound.unsqueeze(-1)
            source = torch.minimum(steps, bound.unsqueeze(-1))
        else:
            first = torch.zeros_like(e)
            first[..., 0] = True
            first[..., 1:] = e[..., :-1]
            bound = torch.where(first, t.expand_as(first), torch.zeros_like(t).expand_as(first)).cummax(-1).values
            steps = t.unsqueeze(-1) + torch.arange(-self.N + 1, 1, device=e.device)
            padded = steps < bound.unsqueeze(-1)
            source = torch.maximum(steps, bound.unsqueeze(-1))
        return source.movedim(-2, tdim), padded.movedim(-2, tdim)

    def _gather(self, value: torch.Tensor, source: torch.Tensor, tdim: int, batch_dims: int) -> torch.Tensor:
        """``value[*batch, *frame]`` read at ``source`` along ``tdim``: ``[*batch, N, *frame]`` (one flat
        ``index_select``: much faster on CPU than advanced indexing with several broadcast index tensors)."""
        shape = source.shape  # [*batch, N]
        flat = torch.zeros((), dtype=torch.long, device=source.device)
        stride = 1
        for d in range(batch_dims - 1, -1, -1):
            if d == tdim:
                position = source
            else:
                view = [1] * len(shape)
                view[d] = shape[d]
                position = torch.arange(shape[d], device=source.device).view(view)
            flat = flat + position * stride
            stride *= shape[d]
        rows = value.reshape(stride, *value.shape[batch_dims:])
        return rows.index_select(0, flat.reshape(-1).to(value.device)).view(*shape, *value.shape[batch_dims:])

    def _concat(self, frames: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``[*batch, N, *frame]`` -> ``[*batch, *frame]`` with the frames concatenated along ``dim``."""
        frame_dims = frames.ndim - batch_dims - 1
        if -self.dim > frame_dims:
            raise ValueError(
                f"CatFrames(dim={self.dim}) concatenates along a dim of each frame, but the frames have shape "
                f"{list(frames.shape[batch_dims + 1:])}: pass a dim in [-{frame_dims}, -1]."
            )
        axis = batch_dims + frame_dims + self.dim  # the frame dim, once the N axis is moved before it
        moved = frames.movedim(batch_dims, axis)
        shape = list(moved.shape)
        shape[axis : axis + 2] = [shape[axis] * shape[axis + 1]]
        return moved.reshape(shape)

    def _pad(self, frames: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
        if self.padding == "constant" and bool(padded.any()):
            mask = padded.reshape(*padded.shape, *([1] * (frames.ndim - padded.ndim)))
            frames = frames.masked_fill(mask, self.padding_value)
        return frames

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Replaces each frame entry of a batch of consecutive steps by its stacks (see the class docstring)."""
        keys = [(i, o) for i, o in zip(self.in_keys, self.out_keys) if tensordict.get(i, None) is not None]
        if not keys and self.mask_key is None:
            return tensordict
        tdim = self._time_dim(tensordict)
        nb = tensordict.batch_dims
        source, padded = self._windows(self._ends(tensordict), tdim)
        roots = {i for i, _ in keys}
        gathered: dict = {}
        for in_key, _ in keys:  # the root frames first: ("next", k) stacks may be built from them
            if _root_of_next(in_key) not in roots:
                gathered[in_key] = self._pad(self._gather(tensordict.get(in_key), source, tdim, nb), padded)
        for in_key, _ in keys:
            root = _root_of_next(in_key)
            if root in roots and not self.future:  # shift the root stack, append the step's next frame
                nxt = tensordict.get(in_key).unsqueeze(nb)
                gathered[in_key] = torch.cat([gathered[root].narrow(nb, 1, self.N - 1), nxt], nb)
        for in_key, out_key in keys:
            tensordict.set(out_key, self._concat(gathered[in_key], nb))
        if self.mask_key is not None:
            tensordict.set(self.mask_key, padded)
        return tensordict

    # -- replay buffers ----------------------------------------------------------------------------------------------
    def make_rb_transform_and_sampler(self, batch_size: int | None = None, **sampler_kwargs) -> tuple:
        """A replay-buffer transform and a slice sampler that together sample frame stacks.

        The sampler is ``SliceSampler(slice_len=N, **sampler_kwargs)`` with ``batch_size_multiplier = N``, so
        ``rb.sample(B)`` draws ``B`` slices of ``N`` consecutive steps; the transform reshapes them to
        ``[B, N]``, applies a copy of this ``CatFrames`` to the frame entries and their ``("next", ...)``
        entries, keeps the last step of each slice (a ``[B]`` batch) and, on writes, drops stacked outputs
        that are not frame entries, so the storage holds each frame once. Use a plain
        :class:`~torchrl.data.ReplayBuffer` (as TorchRL does: the slice sampler's info has ``B * N`` entries).

        Args:
            batch_size (int, optional): accepted for TorchRL compatibility and unused. Defaults to ``None``.
            **sampler_kwargs: passed to :class:`~torchrl.data.SliceSampler`, e.g. ``traj_key`` and
                ``strict_length``.

        Returns:
            ``(transform, sampler)``.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> from torchrl.envs.transforms import CatFrames
            >>> cat = CatFrames(N=4, dim=-1, in_keys=["obs"], out_keys=["obs_stack"])
            >>> transform, sampler = cat.make_rb_transform_and_sampler(traj_key="episode")
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, transform=transform)
            >>> data = TensorDict({"obs": torch.arange(40.).unsqueeze(-1), "episode": torch.arange(40) // 10,
            ...     ("next", "done"): (torch.arange(40) % 10 == 9).unsqueeze(-1)}, batch_size=[40])
            >>> _ = rb.extend(data)
            >>> stack = rb.sample(8)["obs_stack"]
            >>> bool((stack.diff(dim=-1) == 1).all())  # consecutive frames
            True
        """
        del batch_size  # TorchRL takes it and does not use it
        from torchrl.data.replay_buffers.samplers.slice import SliceSampler

        sampler = SliceSampler(slice_len=self.N, **sampler_kwargs)
        sampler.batch_size_multiplier = self.N  # rb.sample(B) draws B slices of N steps
        in_keys = [*self.in_keys, *(_next_key(k) for k in self.in_keys)]
        out_keys = [*self.out_keys, *(_next_key(k) for k in self.out_keys)]
        cat = CatFrames(
            self.N,
            self.dim,
            in_keys=in_keys,
            out_keys=out_keys,
            padding=self.padding,
            padding_value=self.padding_value,
            reset_key=self.reset_key,
            done_key=self.done_key,
            future=self.future,
            mask_key=self.mask_key,
        )
        inputs = set(map(_normalized, in_keys))
        dropped = [k for k in out_keys if _normalized(k) not in inputs]
        transform = Compose(_SlicesToTime(self.N), cat, _LastStep(), _DropOnWrite(dropped))
        return transform, sampler

    def __repr__(self) -> str:
        return (
            f"CatFrames(N={self.N}, dim={self.dim}, in_keys={self.in_keys}, out_keys={self.out_keys}, "
            f"padding={self.padding!r}, future={self.future})"
        )


def _normalized(key: NestedKey):
    return key if isinstance(key, str) else (key[0] if len(key) == 1 else tuple(key))


class _SlicesToTime(Transform):
    """``[B * N]`` steps (``B`` slices of ``N``) -> ``[B, N]`` with the time dim named ``"time"``."""

    def __init__(self, N: int):
        super().__init__()
        self.N = N

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        n = tensordict.batch_size.numel() if tensordict.batch_dims else 0
        if tensordict.batch_dims != 1 or n % self.N:
            raise ValueError(
                f"CatFrames' replay-buffer transform expects {self.N}-step slices laid end to end ([B * {self.N}]), "
                f"got a batch of size {list(tensordict.batch_size)}: sample with the sampler "
                f"make_rb_transform_and_sampler returned."
            )
        return tensordict.reshape(-1, self.N).refine_names(None, "time")


class _LastStep(Transform):
    """``[B, N]`` -> ``[B]``: the last step of each slice, which holds the full stacks."""

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict[:, -1]


class _DropOnWrite(Transform):
    """On writes (``inv``), removes the stacked outputs, so the storage holds each frame once."""

    def __init__(self, keys: list):
        super().__init__()
        self.keys = list(keys)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        if isinstance(tensordict, TensorDictBase) and self.keys:
            return tensordict.exclude(*self.keys)
        return tensordict

