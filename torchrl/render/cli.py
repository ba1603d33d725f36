"""``rlrender``: play a saved policy in gymnasium, print its returns, optionally write a GIF.

Usage::

    rlrender CHECKPOINT [--env ENV_ID] [--episodes 3] [--seed 0] [--gif out.gif] [--max-steps N] [--fps F]
    python -m torchrl.render CHECKPOINT ...

``CHECKPOINT`` is a directory written by :func:`torchrl.render.save_policy_checkpoint`. Failures the user
can fix (missing file, another format, unknown environment, missing optional dependency) exit with status 2
and a message starting with ``rlrender: error:``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from torchrl.render._rollout import (
    GifRecorder,
    RenderError,
    check_compatible,
    make_env,
    play_episode,
    require_pillow,
)
from torchrl.render.checkpoint import CheckpointFormatError, load_policy_checkpoint

__all__ = ["main", "build_parser"]

PROG = "rlrender"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Returns the ``rlrender`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Play a policy checkpoint (written by torchrl.render.save_policy_checkpoint) in a "
        "gymnasium environment, print the return of each episode and optionally write an animated GIF of the "
        "first one.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="the policy checkpoint directory")
    parser.add_argument(
        "--env",
        metavar="ENV_ID",
        default=None,
        help="gymnasium environment id (e.g. CartPole-v1); defaults to the one stored in the checkpoint",
    )
    parser.add_argument("--episodes", type=_positive_int, default=3, help="episodes to play (default: 3)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the first episode; episode i uses seed + i (default: 0)"
    )
    parser.add_argument(
        "--gif", metavar="PATH", default=None, help="write an animated GIF of the first episode"
    )
    parser.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        metavar="N",
        help="stop each episode after N steps (default: the environment's own limit)",
    )
    parser.add_argument(
        "--fps",
        type=_positive_float,
        default=None,
        help="GIF frame rate (default: the environment's render_fps, else 30)",
    )
    return parser


def _run(args: argparse.Namespace) -> None:
    ckpt = load_policy_checkpoint(args.checkpoint)
    env_id = args.env or ckpt.env_id
    if args.gif is not None:
        require_pillow()
    env = make_env(env_id, render=args.gif is not None)
    try:
        check_compatible(env, ckpt.policy, env_id)
        print(f"{PROG}: playing {ckpt.path} ({type(ckpt.policy).__name__}) in {env_id}", flush=True)
        returns = []
        recorder = GifRecorder() if args.gif is not None else None
        for i in range(args.episodes):
            episode = play_episode(
                env,
                ckpt.policy,
                seed=args.seed + i,
                max_steps=args.max_steps,
                recorder=recorder if i == 0 else None,  # the GIF shows the first episode
            )
            returns.append(episode.episode_return)
            print(f"episode {i + 1}: return {episode.episode_return:.1f} ({episode.steps} steps)", flush=True)
        mean = sum(returns) / len(returns)
        print(f"mean return over {len(returns)} episode(s): {mean:.1f}")
        if args.gif is not None:
            fps = args.fps or float((getattr(env, "metadata", None) or {}).get("render_fps") or 30)
            path = recorder.save(args.gif, fps=fps)
            print(f"wrote {path} ({len(recorder)} frames)")
    finally:
        env.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``rlrender``; returns 0 on success and exits with status 2 on a user error.

    Args:
        argv (sequence of str, optional): the arguments, without the program name. Defaults to ``None``
            (``sys.argv[1:]``).

    Examples:
        >>> from torchrl.render.cli import build_parser
        >>> build_parser().parse_args(["ckpt", "--episodes", "1"]).episodes
        1
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _run(args)
    except (OSError, CheckpointFormatError, RenderError) as err:  # OSError: no checkpoint, unwritable GIF
        parser.exit(2, f"{PROG}: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
