"""Playing a policy in gymnasium and writing frames as an animated GIF (helpers of ``rlrender``).

gymnasium, pygame and Pillow are optional: they are imported here, inside the functions that need them, so
``import torchrl.render`` works without them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn


class RenderError(RuntimeError):
    """A user-facing failure of ``rlrender`` (missing dependency, unknown env, incompatible policy)."""


@dataclasses.dataclass
class Episode:
    """The outcome of one played episode: its return, its length and (when recorded) its frames."""

    episode_return: float
    steps: int
    frames: list[np.ndarray]


def _headless() -> None:
    # pygame draws CartPole's frames; without a display it needs SDL's dummy driver. Respect a user setting.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def make_env(env_id: str, *, render: bool) -> Any:
    """Creates the gymnasium environment, with ``render_mode="rgb_array"`` when frames are wanted."""
    _headless()
    try:
        import gymnasium
    except ImportError:
        raise RenderError("playing a policy needs gymnasium: pip install gymnasium pygame") from None
    try:
        return gymnasium.make(env_id, render_mode="rgb_array" if render else None)
    except gymnasium.error.UnregisteredEnv as err:
        raise RenderError(
            f"unknown environment id {env_id!r}: {err} Pass a registered id with --env."
        ) from None
    except gymnasium.error.Error as err:
        raise RenderError(f"cannot create environment {env_id!r}: {err}") from None


def check_compatible(env: Any, policy: nn.Module, env_id: str) -> None:
    """Fails clearly when the policy's input/output sizes do not fit the environment's spaces."""
    from gymnasium import spaces

    obs_space, action_space = env.observation_space, env.action_space
    if not isinstance(action_space, spaces.Discrete):
        raise RenderError(
            f"the policy picks among {policy.num_actions} discrete actions, but {env_id!r} has action space "
            f"{action_space}; use a discrete-action environment."
        )
    if int(action_space.n) != policy.num_actions:
        raise RenderError(
            f"the policy has {policy.num_actions} actions, but {env_id!r} has {int(action_space.n)}; "
            f"pass the environment the policy was trained on."
        )
    shape = getattr(obs_space, "shape", None)
    if shape is None or int(np.prod(shape)) != policy.obs_dim:
        raise RenderError(
            f"the policy reads observations of size {policy.obs_dim}, but {env_id!r} has observation space "
            f"{obs_space}; pass the environment the policy was trained on."
        )


def play_episode(
    env: Any, policy: nn.Module, *, seed: int | None, max_steps: int | None, record: bool
) -> Episode:
    """Plays one greedy episode; stops at termination, truncation or after ``max_steps`` steps."""
    observation, _ = env.reset(seed=seed)
    frames = [env.render()] if record else []
    start = int(getattr(env.action_space, "start", 0))
    total, steps = 0.0, 0
    while max_steps is None or steps < max_steps:
        action = int(policy.act(np.asarray(observation, dtype=np.float32).reshape(-1))) + start
        observation, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if record:
            frames.append(env.render())
        if terminated or truncated:
            break
    return Episode(episode_return=total, steps=steps, frames=frames)


def require_pillow() -> None:
    """Fails early (before playing) when Pillow, needed to write a GIF, is missing."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        raise RenderError("writing a GIF needs Pillow: pip install pillow") from None


def write_gif(path: str | os.PathLike, frames: list[np.ndarray], *, fps: float) -> Path:
    """Writes ``frames`` (HxWx3 uint8 arrays) as a looping animated GIF at ``fps`` frames per second."""
    from PIL import Image

    if not frames:
        raise RenderError("no frame to write: the environment rendered nothing")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in frames]
    # GIF delays are in hundredths of a second; Pillow takes milliseconds and rounds down to 10 ms steps.
    duration = max(20, int(round(1000.0 / fps)))
    images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0)
    return path
