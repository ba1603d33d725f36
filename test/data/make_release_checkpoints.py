"""Writes the checkpoints under ``test/data/checkpoints_release/`` that ``test_checkpoint_compat.py`` loads with
the current code: one per component kind the package had when its layout changed (issue 24).

They were made with the code of commit 688e823 (the last release before the layout change); keep them as they
are. Re-running this script with newer code would only prove that newer code reads its own output.

Run from ``test/data``: ``PYTHONPATH=<checkout of 688e823> python make_release_checkpoints.py <out dir>``
"""

from __future__ import annotations

import sys

import torch
from make_v1_checkpoints import transitions, write_set  # the same rows and procedure as the v1 set
from tensordict import TensorDict

from torchrl.data import (
    CompressedListStorage,
    ConsumingSampler,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    ReplayBufferEnsemble,
    SamplerWithoutReplacement,
    SliceSamplerWithoutReplacement,
    StalenessAwareSampler,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)


def buffers() -> dict:
    """The buffers, built the same way by the writer of the checkpoints and by the test that loads them."""
    g = torch.Generator().manual_seed(0)
    return {
        "td_prioritized": TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=LazyTensorStorage(16), batch_size=4, generator=g
        ),
        "prioritized_slice": TensorDictReplayBuffer(
            storage=LazyTensorStorage(16),
            sampler=PrioritizedSliceSampler(max_capacity=16, alpha=0.7, beta=0.5, slice_len=2, traj_key="episode"),
            batch_size=4,
        ),
        "slice_without_replacement": TensorDictReplayBuffer(
            storage=LazyTensorStorage(16),
            sampler=SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode"),
            batch_size=4,
        ),
        "consuming": TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=ConsumingSampler(1), batch_size=4),
        "staleness": TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=StalenessAwareSampler(max_staleness=3), batch_size=4),
        "memmap_ndim2": TensorDictReplayBuffer(storage=LazyMemmapStorage(16, ndim=2), batch_size=4),
        "stack": ReplayBuffer(storage=LazyStackStorage(16), batch_size=4),
        "compressed": ReplayBuffer(storage=CompressedListStorage(16), batch_size=4),
        "ensemble": ReplayBufferEnsemble(
            TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2),
            TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=SamplerWithoutReplacement(), batch_size=2),
            p=[0.5, 0.5],
            batch_size=4,
            generator=torch.Generator().manual_seed(0),
        ),
    }


def fill(name: str, rb) -> None:
    if name == "ensemble":
        rb[0].extend(transitions(6))
        rb[1].extend(transitions(6, 100))
        return
    if name == "memmap_ndim2":
        rb.extend(transitions(12).reshape(2, 6))
        return
    if name in ("stack", "compressed"):
        for i in range(6):
            rb.add(transitions(1, i)[0])
        return
    data = transitions(12)
    if name == "staleness":
        data["policy_version"] = -(torch.arange(12) // 6)  # staleness 0 and 1 at consumer_version 0
    rb.extend(data)
    if name in ("td_prioritized", "prioritized_slice"):
        rb.update_priority(torch.arange(12), torch.arange(12).float() + 1)
    if name in ("consuming", "slice_without_replacement", "staleness"):
        rb.sample()  # some items drawn: state to restore


def _actions(data):
    if isinstance(data, TensorDict) or hasattr(data, "batch_size"):
        return data["action"]
    return torch.stack([d["action"] for d in data])


def observe(rb) -> dict:
    """What a loaded buffer must reproduce: its content, length and next seeded draws."""
    out = {"len": len(rb)}
    if isinstance(rb, ReplayBufferEnsemble):
        out["actions"] = [_actions(rb[i][:]).reshape(-1).tolist() for i in range(len(rb))]
    else:
        out["actions"] = _actions(rb[:]).reshape(-1).tolist()
        out["write_count"] = rb.write_count
    torch.manual_seed(1)
    batch, info = rb.sample(return_info=True)
    out["sampled"] = _actions(batch).reshape(-1).tolist()
    if "priority_weight" in info:
        out["priority_weight"] = [round(w, 6) for w in torch.as_tensor(info["priority_weight"]).reshape(-1).tolist()]
    return out


def main(root: str) -> None:
    write_set(root, buffers, fill, observe)


if __name__ == "__main__":
    main(sys.argv[1])
