"""Hindsight experience replay on a sparse-reward goal-reaching task, with and without relabelling.

The task: a point on a line of ``size`` cells starts at a random cell and must reach a goal cell at least
``min_distance`` cells away within ``horizon`` steps (actions: left, right). The reward is 1 only on the step that
reaches the goal, so an agent exploring at random almost never sees one. A small goal-conditioned Q-network
``Q(position, goal) -> [left, right]`` learns from batches of an :class:`~torchrl.data.HERReplayBuffer`: with
``her_ratio=0.8`` most sampled transitions get a goal the episode did reach later (strategy ``"future"``) and a
recomputed reward, so every episode teaches something; with ``her_ratio=0`` the same buffer returns the stored goals
and rewards. The script prints the greedy success rate of both.

Run: ``python examples/replay-buffers/her_goal_reaching.py`` (``--smoke`` for a short run, < 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from torchrl.data import HERReplayBuffer, LazyTensorStorage


@dataclass
class Args:
    size: int = 41  # cells on the line
    horizon: int = 25  # steps per episode
    min_distance: int = 12  # start-goal distance of every task (training and evaluation)
    envs: int = 16  # episodes collected per iteration (in parallel)
    iterations: int = 40
    updates: int = 25  # Q-network updates per iteration
    batch_size: int = 128
    her_ratio: float = 0.8
    gamma: float = 0.9
    lr: float = 3e-3
    epsilon: float = 0.3
    target_every: int = 50  # updates between target-network copies
    seed: int = 0


def reward_fn(td: TensorDict) -> torch.Tensor:
    """1 on the step that reaches the goal: the position after the step equals the goal."""
    return (td["next", "achieved_goal"] == td["desired_goal"]).float()


def tasks(n: int, args: Args, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` (start, goal) pairs at least ``min_distance`` apart."""
    start = torch.randint(0, args.size, (4 * n,), generator=gen)
    goal = torch.randint(0, args.size, (4 * n,), generator=gen)
    far = (start - goal).abs() >= args.min_distance
    return start[far][:n], goal[far][:n]


def features(pos: torch.Tensor, goal: torch.Tensor, size: int) -> torch.Tensor:
    pos, goal = pos.float().reshape(-1, 1) / size, goal.float().reshape(-1, 1) / size
    return torch.cat([pos, goal, goal - pos], -1)


def act(q: nn.Module, pos, goal, args: Args, gen: torch.Generator, epsilon: float) -> torch.Tensor:
    with torch.no_grad():
        greedy = q(features(pos, goal, args.size)).argmax(-1)
    explore = torch.rand(pos.shape, generator=gen) < epsilon
    return torch.where(explore, torch.randint(0, 2, pos.shape, generator=gen), greedy)


def collect(q: nn.Module, args: Args, gen: torch.Generator) -> TensorDict:
    """``envs`` epsilon-greedy episodes, one after the other (``[envs * horizon]`` transitions)."""
    pos, goal = tasks(args.envs, args, gen)
    steps = []
    for t in range(args.horizon):
        action = act(q, pos, goal, args, gen, args.epsilon)
        new_pos = (pos + 2 * action - 1).clamp(0, args.size - 1)
        n = pos.shape[0]
        steps.append(TensorDict({
            "achieved_goal": pos.unsqueeze(-1).float(), "desired_goal": goal.unsqueeze(-1).float(), "action": action,
            "next": {"achieved_goal": new_pos.unsqueeze(-1).float(), "done": torch.full((n, 1), t == args.horizon - 1),
                     "reward": (new_pos == goal).float().unsqueeze(-1)},
        }, batch_size=[n]))  # fmt: skip
        pos = new_pos
    return torch.stack(steps, 1).reshape(-1)  # env-major: each episode contiguous, done at its last step


def update(q: nn.Module, target: nn.Module, optim, batch: TensorDict, args: Args) -> None:
    """One DQN step; reaching the goal ends the episode (no bootstrap after it)."""
    s, g = batch["achieved_goal"], batch["desired_goal"]
    r = batch["next", "reward"].squeeze(-1)
    with torch.no_grad():
        next_q = target(features(batch["next", "achieved_goal"], g, args.size)).max(-1).values
    value = q(features(s, g, args.size)).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    loss = (value - (r + args.gamma * next_q * (1 - r))).pow(2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()


def success_rate(q: nn.Module, args: Args, n: int = 500) -> float:
    """The fraction of new tasks that the greedy policy solves within the horizon."""
    gen = torch.Generator().manual_seed(1234)
    pos, goal = tasks(n, args, gen)
    reached = torch.zeros_like(pos, dtype=torch.bool)
    for _ in range(args.horizon):
        action = act(q, pos, goal, args, gen, epsilon=0.0)
        pos = torch.where(reached, pos, (pos + 2 * action - 1).clamp(0, args.size - 1))
        reached |= pos == goal
    return float(reached.float().mean())


def train(args: Args, her_ratio: float, eval_every: int = 10) -> list[float]:
    """Trains a fresh Q-network; returns the success rate after every ``eval_every`` iterations."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rb = HERReplayBuffer(
        reward_fn,
        her_ratio=her_ratio,
        strategy="future",
        achieved_goal_key=("next", "achieved_goal"),  # relabel with a position the episode reached
        storage=LazyTensorStorage(args.envs * args.horizon * args.iterations),
        batch_size=args.batch_size,
        generator=torch.Generator().manual_seed(args.seed),
    )
    q = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    target = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    target.load_state_dict(q.state_dict())
    optim = torch.optim.Adam(q.parameters(), lr=args.lr)
    done_updates, curve = 0, []
    for iteration in range(1, args.iterations + 1):
        rb.extend(collect(q, args, gen))
        for _ in range(args.updates):
            update(q, target, optim, rb.sample(), args)
            done_updates += 1
            if done_updates % args.target_every == 0:
                target.load_state_dict(q.state_dict())
        if iteration % eval_every == 0 or iteration == args.iterations:
            curve.append(success_rate(q, args))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run (< 30 s on 2 cores)")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    torch.set_num_threads(1)
    args = Args(seed=options.seed)
    if options.smoke:
        args.iterations = 20
    if options.iterations is not None:
        args.iterations = options.iterations
    start = time.perf_counter()
    with_her = train(args, args.her_ratio)
    without = train(args, 0.0)
    points = [min(10 * (i + 1), args.iterations) for i in range(len(with_her))]
    print(f"greedy success rate on new tasks {args.min_distance}+ cells away, after N iterations "
          f"({args.envs} episodes and {args.updates} updates each):")
    print("  N                               " + "".join(f"{n:>6}" for n in points))
    print(f"  HER (her_ratio={args.her_ratio}, future)     " + "".join(f"{v:6.2f}" for v in with_her))
    print("  no relabelling (her_ratio=0)    " + "".join(f"{v:6.2f}" for v in without))
    print(f"({time.perf_counter() - start:.1f} s)")
    if options.smoke and with_her[-1] <= without[-1]:
        raise SystemExit(f"HER did not beat the baseline: {with_her[-1]:.2f} <= {without[-1]:.2f}")


if __name__ == "__main__":
    main()
