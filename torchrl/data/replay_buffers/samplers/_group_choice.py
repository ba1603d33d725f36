"""Choosing ``k`` items in each of several groups at once, for
:class:`~torchrl.data.replay_buffers.samplers.PromptGroupSampler`.

The groups of a batch are laid out as the rows of a ``[G, M]`` matrix (``M``: the largest group), each row
holding the storage positions of one group's items in storage order, padded after ``sizes[g]`` items by
repeating the last one. Every function here works on all rows at once.
"""

from __future__ import annotations

import torch


def padded_members(
    order: torch.Tensor, starts: torch.Tensor, sizes: torch.Tensor, width: int, *, ragged: bool = True
) -> torch.Tensor:
    """``[G, width]`` storage positions: row ``g`` holds ``order[starts[g] : starts[g] + sizes[g]]``, padded
    by repeating its last item (``ragged=False``: every group holds ``width`` items, nothing to pad)."""
    col = torch.arange(width)
    if ragged:
        col = torch.minimum(col, (sizes - 1).unsqueeze(-1))
    return order[starts.unsqueeze(-1) + col]


def take_ranks(sizes: torch.Tensor, k: int, uniform: torch.Tensor | None) -> torch.Tensor:
    """``[G, k]`` ranks to take in each row: ``0 .. k - 1``, and in rows of ``sizes[g] < k`` items, ranks
    ``>= sizes[g]`` replaced by uniform draws in ``[0, sizes[g])`` (``uniform``: ``[G, k]`` in ``[0, 1)``,
    needed only when a row is short)."""
    ranks = torch.arange(k).expand(sizes.numel(), k)
    short = sizes < k
    if not bool(short.any()):
        return ranks
    last = (sizes - 1).unsqueeze(-1)
    extra = torch.minimum((uniform * sizes.unsqueeze(-1)).long(), last)
    return torch.where(ranks <= last, ranks, extra)


def ranked_columns(scores: torch.Tensor, real: torch.Tensor | None, lowest) -> torch.Tensor:
    """``[G, M]`` columns of each row, highest score first; ties keep storage order, padding (``~real``; no
    padding when ``real`` is ``None``) goes last."""
    if real is not None:
        scores = scores.masked_fill(~real, lowest)
    return torch.argsort(scores, dim=1, descending=True, stable=True)


def max_variance_columns(
    rewards: torch.Tensor, real: torch.Tensor, sizes: torch.Tensor, k: int
) -> torch.Tensor:
    """``[G, k]`` columns (increasing) of the ``k`` rewards of largest variance in each row of more than
    ``k`` items; among subsets of equal variance, the larger total, then the smallest rewards (and, among
    equal rewards, the oldest items). Rows of at most ``k`` items get meaningless columns: replace them.

    A subset of maximal variance is made of the ``j`` smallest and the ``k - j`` largest values for some
    ``j``, so only ``k + 1`` candidates per row are compared, with prefix sums of the sorted values.
    """
    g, m = rewards.shape
    values, order = torch.sort(rewards.double().masked_fill(~real, float("inf")), dim=1, stable=True)
    values = values.masked_fill(~real, 0.0)
    zero = values.new_zeros(g, 1)
    prefix = torch.cat([zero, values.cumsum(1)], 1)
    prefix_sq = torch.cat([zero, (values * values).cumsum(1)], 1)
    j = torch.arange(k + 1).clamp(max=m).expand(g, k + 1)
    size = sizes.unsqueeze(-1)
    high = (size - k + torch.arange(k + 1)).clamp(min=0, max=m)
    end = size.expand(g, k + 1)

    def window_sum(p: torch.Tensor) -> torch.Tensor:
        return p.gather(1, j) + p.gather(1, end) - p.gather(1, high)

    total, total_sq = window_sum(prefix), window_sum(prefix_sq)
    variance = total_sq / k - (total / k) ** 2
    variance = torch.where(variance.abs() < 1e-12, torch.zeros_like(variance), variance)
    best = variance == variance.amax(1, keepdim=True)
    total = total.masked_fill(~best, float("-inf"))
    best &= total == total.amax(1, keepdim=True)
    pick = (best.long() * torch.arange(1, k + 2)).argmax(1, keepdim=True)  # the largest j among the best
    t = torch.arange(k)
    sorted_pos = torch.where(t < pick, t, (size - k + t).clamp(min=0))
    return order.gather(1, sorted_pos.clamp(max=m - 1)).sort(1).values
