"""Behaviour cloning on CartPole from replay-buffer batches sampled in DataLoader workers.

1. A scripted expert (a state-feedback controller on the pole angle and the cart position, written below)
   plays ``CartPole-v1``; its demonstrations go into a ``TensorDictReplayBuffer`` over a
   ``LazyMemmapStorage`` (memory-mapped files that the DataLoader workers share instead of copying).
2. A small ``MLPPolicy`` learns to pick the expert's action with ``BCLoss`` (cross-entropy). The batches are
   sampled by the replay buffer inside DataLoader workers::

       DataLoader(rb.as_dataset(num_batches=updates), batch_size=None, num_workers=2,
                  collate_fn=tensordict_collate)

3. The policy plays a few evaluation episodes (their returns are printed; 500 is the maximum), and is saved
   with ``save_policy_checkpoint`` for ``rlrender`` to play back, e.g. as an animated GIF.

Run it (about ten seconds on a laptop CPU)::

    python examples/replay-buffers/dataloader_behavior_cloning.py
    python examples/replay-buffers/dataloader_behavior_cloning.py --smoke   # a few updates, for CI

The demonstrations can be published as a Hugging Face dataset and trained from later (``hf`` extra)::

    python examples/replay-buffers/dataloader_behavior_cloning.py --export-hf out/cartpole_demos
    python examples/replay-buffers/dataloader_behavior_cloning.py --from-hf out/cartpole_demos

Needs the ``examples`` extra: ``pip install -e '.[examples]'`` (gymnasium, pygame, pillow, tqdm).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

try:
    import gymnasium as gym
    from tqdm import tqdm
except ImportError as err:  # pragma: no cover - depends on the installed extras
    sys.exit(f"this example needs gymnasium and tqdm ({err}): pip install -e '.[examples]'")

from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer, tensordict_collate
from torchrl.objectives import BCLoss
from torchrl.render import MLPPolicy, save_policy_checkpoint

ENV_ID = "CartPole-v1"
MAX_EPISODE_STEPS = 500  # CartPole-v1 truncates episodes there: 500 is the best possible return
EVAL_SEED_OFFSET = 10_000  # evaluation episodes start from states the demonstrations never started from

# Defaults of the full run and of --smoke, for the arguments that --smoke changes unless they are given.
DEFAULTS = {"updates": 500, "demo_episodes": 20, "eval_episodes": 5}
SMOKE = {"updates": 8, "demo_episodes": 2, "eval_episodes": 1}


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line; ``--smoke`` lowers the updates and episodes that are not given explicitly."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--updates", type=_positive_int, help=f"gradient updates (default {DEFAULTS['updates']})")
    add("--num-workers", type=_non_negative_int, default=2, help="DataLoader workers sampling batches")
    add("--batch-size", type=_positive_int, default=256, help="transitions per batch")
    add("--lr", type=float, default=3e-3, help="Adam learning rate")
    add("--seed", type=int, default=0, help="seed of the environment, the networks and the sampling")
    add("--out", default="out/bc_cartpole", help="checkpoint directory (played back by rlrender)")
    add("--demo-episodes", type=_positive_int, help=f"expert episodes (default {DEFAULTS['demo_episodes']})")
    add("--expert-noise", type=_probability, default=0.1, help="chance of playing a random action instead")
    add("--eval-episodes", type=_positive_int, help=f"evaluation episodes (default {DEFAULTS['eval_episodes']})")
    add("--check-return", type=float, default=None, help="exit 1 unless every eval episode reaches this")
    add("--smoke", action="store_true", help="a few updates on a little data (for CI)")
    add("--export-hf", metavar="PATH", help="also export the demonstrations as a Hugging Face dataset there")
    add("--from-hf", metavar="PATH", help="train from a dataset written by --export-hf instead of the expert")
    args = parser.parse_args(argv)
    for name, default in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


# --------------------------------------------------------------------------------------------- the expert
def expert_action(observation: np.ndarray) -> int:
    """The scripted expert: push the cart under the pole (1 = push right), keeping the cart near the center.

    A linear state feedback: a PD term on the pole angle and angular velocity dominates, and a small PD term
    on the cart position and velocity stops the cart from drifting off the track. It reaches 500 from every
    start state, also while one action in ten is replaced by a random one.
    """
    x, x_dot, theta, theta_dot = (float(v) for v in observation)
    return int(18.0 * theta + 3.0 * theta_dot + 1.0 * x + 1.5 * x_dot > 0.0)


def collect_demonstrations(
    rb: TensorDictReplayBuffer, *, episodes: int, noise: float, seed: int
) -> list[float]:
    """Plays ``episodes`` expert episodes into ``rb``; returns their returns.

    With probability ``noise`` the environment plays a random action instead of the expert's, but the label
    stored is always the expert's action: the demonstrations then also show how to recover from small
    mistakes, which a policy cloned from perfect trajectories alone never sees (as in DART).
    """
    env = gym.make(ENV_ID)
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed + episode)
        observations, actions, total, done = [], [], 0.0, False
        while not done:
            action = expert_action(observation)
            observations.append(observation)
            actions.append(action)
            played = int(rng.integers(2)) if rng.random() < noise else action
            observation, reward, terminated, truncated, _ = env.step(played)
            total += float(reward)
            done = terminated or truncated
        steps = len(actions)
        rb.extend(
            TensorDict(
                {"observation": torch.from_numpy(np.stack(observations)), "action": torch.tensor(actions)},
                batch_size=[steps],
            )
        )
        returns.append(total)
    env.close()
    return returns


# --------------------------------------------------------------------------------------------- training
def train(policy: MLPPolicy, rb: TensorDictReplayBuffer, args: argparse.Namespace) -> float:
    """Runs ``args.updates`` BC updates on batches sampled by ``rb`` in DataLoader workers; returns the last loss."""
    loader = DataLoader(
        rb.as_dataset(num_batches=args.updates),  # items are rb.sample() batches: batch_size=None
        batch_size=None,
        num_workers=args.num_workers,
        collate_fn=tensordict_collate,
        generator=torch.Generator().manual_seed(args.seed),  # seeds each worker's copy of the sampler
        timeout=120 if args.num_workers else 0,  # a stuck worker fails the run instead of hanging it
    )
    loss_module = BCLoss(policy)  # cross-entropy between the policy's logits and the expert's action
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    loss = torch.zeros(())
    with tqdm(total=args.updates, desc="behaviour cloning", unit="update") as progress:
        for update, batch in enumerate(loader):
            loss = loss_module(batch)["loss_bc"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            progress.update()
            if update % 25 == 0 or update == args.updates - 1:
                progress.set_postfix(loss=f"{loss.item():.4f}")
    return loss.item()


@torch.no_grad()
def evaluate(policy: MLPPolicy, *, episodes: int, seed: int) -> list[float]:
    """Plays ``episodes`` greedy episodes (the argmax of the logits) and returns their returns."""
    env = gym.make(ENV_ID)
    policy.eval()
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed + EVAL_SEED_OFFSET + episode)
        total, done = 0.0, False
        while not done:
            observation, reward, terminated, truncated, _ = env.step(int(policy.act(observation)))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    policy.train()
    return returns


def rlrender_command() -> str:
    """How to call ``rlrender`` from here: on the PATH, next to this Python (an unactivated venv), or ``-m``."""
    if shutil.which("rlrender"):
        return "rlrender"
    script = Path(sys.executable).parent / "rlrender"
    if script.is_file():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m torchrl.render"


def main(argv: Sequence[str] | None = None) -> int:
    """Collects demonstrations, clones them, evaluates and saves the policy; returns the exit code."""
    args = parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    # The network is tiny: intra-op threads would only compete with the DataLoader workers for the cores.
    torch.set_num_threads(1)

    if args.from_hf:  # columns "observation" and "action", as --export-hf writes them
        rb = TensorDictReplayBuffer.from_hf(
            args.from_hf, batch_size=args.batch_size, generator=torch.Generator().manual_seed(args.seed)
        )
        print(f"demonstrations: {len(rb)} transitions read from {args.from_hf}")
    else:
        capacity = args.demo_episodes * MAX_EPISODE_STEPS
        rb = TensorDictReplayBuffer(
            storage=LazyMemmapStorage(capacity),  # files in a temporary directory, removed at exit
            batch_size=args.batch_size,
            generator=torch.Generator().manual_seed(args.seed),
        )
        expert_returns = collect_demonstrations(
            rb, episodes=args.demo_episodes, noise=args.expert_noise, seed=args.seed
        )
        print(
            f"expert: {len(rb)} transitions from {len(expert_returns)} episodes, mean return "
            f"{np.mean(expert_returns):.1f} (with {args.expert_noise:.0%} random actions played)"
        )
    if args.export_hf:
        rb.export_hf(args.export_hf)
        print(f"demonstrations exported to {args.export_hf} (train from them with --from-hf)")
    collected = time.perf_counter()

    obs_dim = rb.storage.get(0)["observation"].numel()
    policy = MLPPolicy(obs_dim, 2, hidden=(64, 64), activation="tanh")
    final_loss = train(policy, rb, args)
    trained = time.perf_counter()

    returns = evaluate(policy, episodes=args.eval_episodes, seed=args.seed)
    for episode, episode_return in enumerate(returns):
        print(f"eval episode {episode}: return {episode_return:.0f} / {MAX_EPISODE_STEPS}")
    evaluated = time.perf_counter()

    path = save_policy_checkpoint(
        args.out,
        policy,
        env_id=ENV_ID,
        metadata={
            "algorithm": "behaviour cloning",
            "updates": args.updates,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "demo_transitions": len(rb),
            "final_loss": final_loss,
            "eval_returns": returns,
        },
    )
    print(
        f"done in {time.perf_counter() - start:.1f} s (collect {collected - start:.1f} s, train "
        f"{trained - collected:.1f} s, eval {evaluated - trained:.1f} s)"
    )
    print(f"policy checkpoint: {path}")
    print("play it back:")
    gif = shlex.quote(str(path / "cartpole.gif"))
    print(f"  {rlrender_command()} {shlex.quote(str(path))} --episodes 3 --gif {gif}")

    if args.check_return is not None and min(returns) < args.check_return:
        print(
            f"error: --check-return {args.check_return:g} not reached: the eval returns are {returns}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
