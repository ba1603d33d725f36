"""The policy architecture a render checkpoint can describe: :class:`MLPPolicy`.

A checkpoint stores weights plus a JSON description of the architecture (:meth:`MLPPolicy.config`), and the
loader rebuilds the module from that description (:meth:`MLPPolicy.from_config`) before loading the weights:
no code and no pickled object travel with a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from torchrl._validation import check_positive_int

__all__ = ["MLPPolicy", "ACTIVATIONS"]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}
"""Activation names accepted by :class:`MLPPolicy`."""

_CONFIG_KEYS = ("obs_dim", "num_actions", "hidden", "activation")


def _check_hidden(hidden) -> tuple[int, ...]:
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise TypeError(f"`hidden` must be a sequence of positive ints (e.g. (64, 64)), got {hidden!r}.")
    return tuple(check_positive_int("hidden", size, type_error=False) for size in hidden)


def _check_activation(activation) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"`activation` must be one of {sorted(ACTIVATIONS)}, got {activation!r}.")
    return activation


class MLPPolicy(nn.Module):
    """A multilayer perceptron policy over discrete actions: observation -> logits.

    It is the architecture the render checkpoint format knows how to rebuild, so a policy trained with it
    (e.g. by behaviour cloning with :class:`~torchrl.objectives.BCLoss`) can be saved with
    :func:`~torchrl.render.save_policy_checkpoint` and played back by ``rlrender``.

    Args:
        obs_dim (int): size of the (flat) observation vector.
        num_actions (int): number of discrete actions (size of the logits).
        hidden (sequence of int, optional): sizes of the hidden layers; empty for a linear policy.
            Defaults to ``(64, 64)``.
        activation (str, optional): activation after each hidden layer, one of :data:`ACTIVATIONS`.
            Defaults to ``"tanh"``.

    Examples:
        >>> import torch
        >>> from torchrl.render import MLPPolicy
        >>> policy = MLPPolicy(4, 2, hidden=(32,))
        >>> policy(torch.zeros(5, 4)).shape
        torch.Size([5, 2])
        >>> policy.act(torch.zeros(4)).shape
        torch.Size([])
        >>> MLPPolicy.from_config(policy.config()).config() == policy.config()
        True
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.obs_dim = check_positive_int("obs_dim", obs_dim, type_error=False)
        self.num_actions = check_positive_int("num_actions", num_actions, type_error=False)
        self.hidden = _check_hidden(hidden)
        self.activation = _check_activation(activation)
        layers: list[nn.Module] = []
        in_size = self.obs_dim
        for size in self.hidden:
            layers += [nn.Linear(in_size, size), ACTIVATIONS[self.activation]()]
            in_size = size
        layers.append(nn.Linear(in_size, self.num_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """Returns the logits over actions, shape ``observation.shape[:-1] + (num_actions,)``."""
        if observation.shape[-1:] != (self.obs_dim,):
            raise ValueError(
                f"`observation` must have a last dim of size obs_dim={self.obs_dim}, got shape "
                f"{list(observation.shape)}."
            )
        return self.net(observation.to(self.net[0].weight.dtype))

    @torch.no_grad()
    def act(self, observation: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Returns the greedy action (argmax of the logits) as an int64 tensor of the batch shape.

        Args:
            observation (Tensor or ndarray): one observation (shape ``(obs_dim,)``) or a batch of them.
        """
        observation = torch.as_tensor(observation, device=self.net[0].weight.device)
        return self(observation).argmax(dim=-1)

    def config(self) -> dict[str, Any]:
        """Returns the JSON-serializable description that :meth:`from_config` rebuilds the module from."""
        return {
            "obs_dim": self.obs_dim,
            "num_actions": self.num_actions,
            "hidden": list(self.hidden),
            "activation": self.activation,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MLPPolicy:
        """Builds a (freshly initialized) policy from :meth:`config`'s description.

        Args:
            config (Mapping): a dict with ``obs_dim``, ``num_actions``, ``hidden`` and ``activation``.
        """
        if not isinstance(config, Mapping):
            raise TypeError(f"`config` must be a mapping, got {type(config).__name__}.")
        missing = [key for key in _CONFIG_KEYS if key not in config]
        unknown = sorted(set(config) - set(_CONFIG_KEYS))
        if missing or unknown:
            raise ValueError(
                f"`config` must have exactly the keys {list(_CONFIG_KEYS)}; missing {missing}, unknown "
                f"{unknown}."
            )
        return cls(config["obs_dim"], config["num_actions"], config["hidden"], config["activation"])

    def extra_repr(self) -> str:
        return f"obs_dim={self.obs_dim}, num_actions={self.num_actions}, activation={self.activation!r}"
