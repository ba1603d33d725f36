"""Minari episodes -> TED rows (TorchRL's mapping; one row per step).

For an episode of T steps (T = len(actions)): ``observations`` (T + 1 entries) give ``"observation"`` = obs[:-1]
and ``("next", "observation")`` = obs[1:], Dict spaces staying nested; ``infos`` and ``state`` get the same shift,
an entry of T items getting a zero (or ``""``) prepended first (missing at reset); ``actions`` -> ``"action"``;
``rewards`` -> ``("next", "reward")`` ``[T, 1]``; ``terminations`` / ``truncations`` -> ``("next", "terminated")``
/ ``("next", "truncated")`` ``[T, 1]`` bool; ``("next", "done")`` = terminated | truncated; ``"episode"`` the id
(int64). Other per-step arrays keep their name at the root. Dtypes stay as stored; text becomes non-tensor data.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from torchrl._phrases import TorchRLPhrase

MINARI_MISMATCHING_STEPS = TorchRLPhrase(
    RuntimeError,
    "Mismatching number of steps for key",
    "Mismatching number of steps for key {key!r} in episode {episode} of {source}: {got} entries, expected "
    "{expected} (one per step, or one more for observations and infos). The dataset file is inconsistent.",
)

__all__ = ["episode_to_td", "episodes_to_td"]

_SHIFTED = {"observations": "observation", "infos": "info", "state": "state"}
_FLAGS = {"terminations": "terminated", "truncations": "truncated"}


def _length(values) -> int:
    if isinstance(values, dict):
        for leaf in values.values():
            n = _length(leaf)
            if n >= 0:
                return n
        return -1
    return len(values)


def _leaf(values, steps: int):
    """A numpy array or list as a tensor (or NonTensorStack for text) of ``steps`` rows."""
    if isinstance(values, list):
        return NonTensorStack(*values) if values else None
    array = np.asarray(values)
    if array.dtype.kind in "OSU":
        return NonTensorStack(*[str(v) for v in array.tolist()])
    return torch.from_numpy(
        np.array(array, copy=True)
    )  # a writable copy (arrow/h5py arrays may be read-only)


def _shift(values, steps: int, key: tuple, episode: int, source: str, *, allow_short: bool):
    """``(current, next)`` for one entry of T + 1 items (or T items with ``allow_short``), nested dicts walked."""
    if isinstance(values, dict):
        current, nxt = {}, {}
        for name, sub in values.items():
            pair = _shift(sub, steps, key + (name,), episode, source, allow_short=allow_short)
            if pair is not None:
                current[name], nxt[name] = pair
        return (current, nxt) if current else None
    n = len(values)
    if n == steps and allow_short:
        if isinstance(values, list):
            values = [""] + list(values)
        else:
            array = np.asarray(values)
            values = np.concatenate([np.zeros((1, *array.shape[1:]), dtype=array.dtype), array])
    elif n != steps + 1:
        raise MINARI_MISMATCHING_STEPS.error(
            key=key, episode=episode, source=source, got=n, expected=steps + 1
        )
    return values[:-1], values[1:]


def _check_steps(values, steps: int, key: tuple, episode: int, source: str) -> None:
    if isinstance(values, dict):
        for name, sub in values.items():
            _check_steps(sub, steps, key + (name,), episode, source)
    elif len(values) != steps:
        raise MINARI_MISMATCHING_STEPS.error(
            key=key,
            episode=episode,
            source=source,
            got=len(values),
            expected=steps,
        )


def _to_td(values: dict, steps: int) -> dict:
    out = {}
    for name, sub in values.items():
        if isinstance(sub, dict):
            nested = _to_td(sub, steps)
            if nested:
                out[name] = TensorDict(nested, batch_size=[steps])
        else:
            leaf = _leaf(sub, steps)
            if leaf is not None:
                out[name] = leaf
    return out


def episode_to_td(episode: dict, source: str) -> TensorDictBase:
    """The TED rows of one episode (a dict as the readers return it)."""
    ep_id = int(episode["id"])
    if "actions" not in episode:
        raise RuntimeError(f"Episode {ep_id} of {source} has no 'actions' entry: it is not a Minari episode.")
    steps = _length(episode["actions"])
    root: dict = {"episode": np.full(steps, ep_id, dtype=np.int64)}
    nxt: dict = {}
    for name, values in episode.items():
        if name == "id":
            continue
        if name in _SHIFTED:
            if isinstance(values, dict) and not values:
                continue  # an empty info group
            pair = _shift(values, steps, (name,), ep_id, source, allow_short=name != "observations")
            if pair is not None:
                root[_SHIFTED[name]], nxt[_SHIFTED[name]] = pair
            continue
        _check_steps(values, steps, (name,), ep_id, source)
        if name == "actions":
            root["action"] = values
        elif name == "rewards":
            nxt["reward"] = np.asarray(values).reshape(steps, 1)
        elif name in _FLAGS:
            nxt[_FLAGS[name]] = np.asarray(values).astype(bool).reshape(steps, 1)
        else:
            root[name] = values
    if "terminated" in nxt or "truncated" in nxt:
        done = np.zeros((steps, 1), dtype=bool)
        for flag in ("terminated", "truncated"):
            if flag in nxt:
                done = done | nxt[flag]
        nxt["done"] = done
    root["next"] = nxt
    return TensorDict(_to_td(root, steps), batch_size=[steps])


def episodes_to_td(episodes: Iterable[dict], source: str) -> TensorDictBase:
    """All episodes' rows, concatenated in the order given."""
    parts = [episode_to_td(ep, source) for ep in episodes]
    if not parts:
        raise RuntimeError(f"{source} holds no episode: there is nothing to convert.")
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts, 0)
