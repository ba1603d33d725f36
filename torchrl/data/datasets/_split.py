"""Rows of consecutive steps -> one row per trajectory (``split_trajs=True`` of the dataset classes).

A trajectory ends after each row whose done flag is set (and at the last row). The output has batch size
``[num_trajectories, max_len]``: each trajectory left-aligned and zero-padded, a root ``"mask"`` (bool, True on
real steps) and ``"traj_ids"`` (int64, the trajectory's number on each of its steps, ``0`` on padding like every
other entry), as TorchRL's ``split_trajectories`` builds it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

__all__ = ["split_by_done"]


def split_by_done(data: TensorDictBase, done_key=("next", "done")) -> TensorDictBase:
    """``data`` ``[N]`` split at ``done_key`` into ``[num_trajectories, max_len]`` (see the module docstring)."""
    if data.batch_dims != 1 or data.batch_size[0] == 0:
        raise ValueError(
            f"split_trajs needs a non-empty 1-dimensional dataset, got batch size {data.batch_size}."
        )
    from tensordict import NonTensorData, NonTensorStack

    non_tensor = [k for k, v in data.items(True) if isinstance(v, (NonTensorData, NonTensorStack))]
    if non_tensor:
        raise ValueError(
            f"split_trajs=True does not support text entries ({non_tensor}); load the dataset with "
            f"split_trajs=False and use a SliceSampler to sample trajectories."
        )
    done = data.get(done_key).reshape(data.batch_size[0], -1).any(-1)
    ends = done.clone()
    ends[-1] = True
    traj = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1].long().cumsum(0)])
    lengths = torch.bincount(traj)
    num, width = lengths.numel(), int(lengths.max())
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    step = torch.arange(data.batch_size[0]) - starts[traj]
    mask = torch.zeros(num, width, dtype=torch.bool)
    mask[traj, step] = True

    def _pad(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((num, width, *t.shape[1:]), dtype=t.dtype)
        out[traj, step] = t
        return out

    out = data.apply(_pad, batch_size=[num, width])
    out.set("traj_ids", _pad(traj))
    out.set("mask", mask)
    return out
