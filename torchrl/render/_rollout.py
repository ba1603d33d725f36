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
    """The outcome of one played episode: its return and its length."""

    episode_return: float
    steps: int


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
    env: Any,
    policy: nn.Module,
    *,
    seed: int | None,
    max_steps: int | None,
    recorder: GifRecorder | None = None,
) -> Episode:
    """Plays one greedy episode; stops at termination, truncation or after ``max_steps`` steps.

    With a ``recorder``, the frame after the reset and after each step is rendered and added to it.
    """
    observation, _ = env.reset(seed=seed)
    if recorder is not None:
        recorder.add(env.render())
    start = int(getattr(env.action_space, "start", 0))
    total, steps = 0.0, 0
    while max_steps is None or steps < max_steps:
        action = int(policy.act(np.asarray(observation, dtype=np.float32).reshape(-1))) + start
        observation, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if recorder is not None:
            recorder.add(env.render())
        if terminated or truncated:
            break
    return Episode(episode_return=total, steps=steps)


def require_pillow() -> None:
    """Fails early (before playing) when Pillow, needed to write a GIF, is missing."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        raise RenderError("writing a GIF needs Pillow: pip install pillow") from None


class GifRecorder:
    """Collects rendered RGB frames as palette images and writes them as a looping animated GIF.

    Each frame is mapped, as it arrives, onto a 256-color palette built from the first frame: a palette
    image takes a third of the memory of the RGB frame (a 500-step CartPole episode: ~120 MB instead of
    ~360 MB), and letting Pillow quantize every RGB frame while saving would cost ~60 ms a frame instead of
    ~2 ms. Rendered scenes draw with few colors, so frames differ from the rendering by a few levels per
    channel at most; a color absent from the first frame gets its nearest palette color. A frame whose
    shape differs from the first is kept in RGB and quantized by Pillow.
    """

    def __init__(self) -> None:
        require_pillow()
        self._images: list[Any] = []
        self._palette = None
        self._shape: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self._images)

    def add(self, frame: np.ndarray) -> None:
        """Adds one HxWx3 uint8 frame."""
        from PIL import Image

        frame = np.ascontiguousarray(frame, dtype=np.uint8)
        image = Image.fromarray(frame)
        if self._palette is None and frame.ndim == 3 and frame.shape[-1] == 3:
            self._palette, self._shape = image.quantize(colors=256), frame.shape
        if frame.shape == self._shape:
            image = image.quantize(palette=self._palette, dither=Image.Dither.NONE)
        self._images.append(image)

    def save(self, path: str | os.PathLike, *, fps: float) -> Path:
        """Writes the frames to ``path`` (parent folders are created) at ``fps`` frames per second."""
        if not self._images:
            raise RenderError("no frame to write: the environment rendered nothing")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # GIF delays are in hundredths of a second (Pillow takes milliseconds); viewers play delays under
        # 20 ms at 100 ms, so faster frame rates are capped at 50 fps.
        duration = max(20, int(round(1000.0 / fps)))
        first, *rest = self._images
        first.save(
            path, format="GIF", save_all=True, append_images=rest, duration=duration, loop=0, optimize=False
        )
        return path


def write_gif(path: str | os.PathLike, frames: list[np.ndarray], *, fps: float) -> Path:
    """Writes ``frames`` (HxWx3 uint8 arrays) as a looping animated GIF at ``fps`` frames per second."""
    recorder = GifRecorder()
    for frame in frames:
        recorder.add(frame)
    return recorder.save(path, fps=fps)
