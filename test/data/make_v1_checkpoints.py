"""Writes the checkpoints under ``test/data/checkpoints_v1/`` (schema version 1) that
``test/checkpoint/test_checkpoint_compat.py`` loads with the current code.

They were made with the code of commit f208935 (before components owned their persistence); keep them as
they are. Re-running this script with newer code would only prove that newer code reads its own output.

Run: ``PYTHONPATH=<checkout of f208935> python test/data/make_v1_checkpoints.py test/data/checkpoints_v1``
"""

from __future__ import annotations

import json
import sys

import torch
from tensordict import TensorDict

from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)


def transitions(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": ids.float().unsqueeze(-1).expand(n, 3).clone(),
            "action": ids.clone(),
            ("next", "done"): (ids % 4 == 3).unsqueeze(-1),
            "episode": ids // 4,
            "reward": ids.float() / 10,
        },
        batch_size=[n],
    )


def buffers() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "lazy_tensor": ReplayBuffer(storage=LazyTensorStorage(16), batch_size=4, generator=g),
        "memmap": TensorDictReplayBuffer(storage=LazyMemmapStorage(16), batch_size=4),
        "list": ReplayBuffer(storage=ListStorage(16), batch_size=4),
        "prioritized": PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(16), batch_size=4),
        "without_replacement": ReplayBuffer(
            storage=LazyTensorStorage(16), sampler=SamplerWithoutReplacement(), batch_size=4
        ),
        "slice": TensorDictReplayBuffer(
            storage=LazyTensorStorage(16), sampler=SliceSampler(slice_len=4, traj_key="episode"), batch_size=8
        ),
        "max_value": TensorDictReplayBuffer(
            storage=LazyTensorStorage(8), writer=TensorDictMaxValueWriter(rank_key="reward"), batch_size=4
        ),
    }


def fill(name: str, rb) -> None:
    if name == "list":
        for i in range(6):
            rb.add(transitions(1, i)[0])
        return
    rb.extend(transitions(12))
    if name == "prioritized":
        rb.update_priority(torch.arange(12), torch.arange(12).float() + 1)
    if name == "without_replacement":
        rb.sample()  # a partly consumed epoch


def observe(rb) -> dict:
    """What a loaded buffer must reproduce: its content, counters and next seeded draws."""
    data = rb[:]
    actions = data["action"] if isinstance(data, TensorDict) else torch.stack([d["action"] for d in data])
    torch.manual_seed(1)
    batch, info = rb.sample(return_info=True)
    sampled = batch["action"] if isinstance(batch, TensorDict) else torch.stack([d["action"] for d in batch])
    out = {
        "len": len(rb),
        "actions": actions.reshape(-1).tolist(),
        "write_count": rb.write_count,
        "cursor": rb.writer.cursor,
        "sampled": sampled.reshape(-1).tolist(),
    }
    if "priority_weight" in info:
        out["priority_weight"] = [round(w, 6) for w in torch.as_tensor(info["priority_weight"]).tolist()]
    return out


def write_set(root: str, buffers, fill, observe) -> None:
    """Fills each of ``buffers()``, dumps it under ``root/<name>``, loads it into a fresh one and records in
    ``root/expected.json`` what ``observe`` sees of that fresh buffer."""
    expected = {}
    for name, rb in buffers().items():
        fill(name, rb)
        rb.dumps(f"{root}/{name}")
        fresh = buffers()[name]
        fresh.loads(f"{root}/{name}")
        expected[name] = observe(fresh)
    with open(f"{root}/expected.json", "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)


def main(root: str) -> None:
    write_set(root, buffers, fill, observe)


if __name__ == "__main__":
    main(sys.argv[1])
