"""MixedReplayBuffer through DataLoader workers, and its exact resume with torchdata's StatefulDataLoader.

A run reads a mixer of three buffers (rows ``1000 * member + i``) with a random transform on the mixed batch
(so the workers' global streams matter too) for two epochs of 6 batches; it is interrupted after 4 batches,
saved with ``save_training_state(rb=mixer, loader=loader)``, and resumed with fresh, empty members: the batches of
the two halves must equal the uninterrupted run's, bitwise, with 0 and 2 workers.
"""

from __future__ import annotations

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

from torchrl.data import (
    LazyTensorStorage,
    MixedReplayBuffer,
    ReplayBuffer,
    load_training_state,
    save_training_state,
    tensordict_collate,
)

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),  # torchdata 0.11 on torch >= 2.7
]

ROWS = 12
BATCH = 6
TIMEOUT = 60


def _add_noise(batch):
    return batch.set("noise", torch.rand(batch.shape))


def _mixer(fill: bool = True, proportions=(0.5, 0.3, 0.2)) -> MixedReplayBuffer:
    members = []
    for i in range(3):
        rb = ReplayBuffer(storage=LazyTensorStorage(ROWS))
        if fill:
            rb.extend(TensorDict(obs=torch.arange(ROWS) + 1000 * i, batch_size=[ROWS]))
        members.append(rb)
    return MixedReplayBuffer(members, list(proportions), batch_size=BATCH, transform=_add_noise)


def _counts(batch) -> list[int]:
    return torch.bincount(batch["obs"] // 1000, minlength=3).tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_workers_sample_exact_counts_and_follow_set_proportions(start_method):
    mixer = _mixer()
    loader = mixer.as_dataset(num_batches=4).loader(
        num_workers=2, multiprocessing_context=start_method, persistent_workers=True, timeout=TIMEOUT,
        prefetch_factor=1,
    )
    first = list(loader)
    assert [_counts(b) for b in first] == [[3, 2, 1]] * 4
    assert len({tuple(b["obs"].tolist()) for b in first}) > 1  # the workers draw different batches
    mixer.set_proportions([0, 1, 1])  # seen by the persistent workers through shared memory
    second = list(loader)
    assert [_counts(b) for b in second] == [[0, 3, 3]] * 4
    del loader


def _record(batch) -> torch.Tensor:
    return torch.stack([batch["obs"].to(torch.float64), batch["noise"].to(torch.float64)], -1)


def _loader(mixer, num_workers: int, start_method: str = "fork"):
    from torchdata.stateful_dataloader import StatefulDataLoader

    kwargs = {"multiprocessing_context": start_method, "timeout": TIMEOUT} if num_workers else {}
    return StatefulDataLoader(
        mixer.as_dataset(num_batches=6), batch_size=None, collate_fn=tensordict_collate, num_workers=num_workers,
        generator=torch.Generator().manual_seed(7), **kwargs,
    )


def _consume(loader, total: int, done: int = 0, stop: int | None = None, on_stop=None) -> list[torch.Tensor]:
    out = []
    while done < total:
        for batch in loader:
            out.append(_record(batch))
            done += 1
            torch.rand(3)  # the training step's own random draws
            if done == stop:
                on_stop()
                return out
            if done == total:
                break
    return out


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "num_workers,start_method", [(0, None), (2, "fork"), pytest.param(2, "spawn", marks=pytest.mark.slow)]
)
def test_resume_is_bitwise_with_stateful_dataloader(tmp_path, num_workers, start_method):
    require("torchdata")
    total, stop = 12, 4
    torch.manual_seed(0)
    expected = _consume(_loader(_mixer(), num_workers, start_method), total)

    torch.manual_seed(0)
    mixer = _mixer()
    loader = _loader(mixer, num_workers, start_method)
    path = tmp_path / "run"

    def save():
        save_training_state(path, rb=mixer, loader=loader, extra={"step": stop}, fsync=False)

    first = _consume(loader, total, stop=stop, on_stop=save)
    del loader

    torch.manual_seed(1234)  # everything that matters must come from the checkpoint
    fresh = _mixer(fill=False, proportions=(1, 1, 1))
    loader = _loader(fresh, num_workers, start_method)
    extra = load_training_state(path, rb=fresh, loader=loader)
    assert fresh.proportions == pytest.approx((0.5, 0.3, 0.2)) and len(fresh) == 3 * ROWS
    rest = _consume(loader, total, done=extra["step"])
    got = first + rest
    assert len(got) == len(expected) == total
    for step, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"batch {step} differs after the resume"
        counts = torch.bincount(a[:, 0].long() // 1000, minlength=3).tolist()
        assert counts == [3, 2, 1]
    assert len({tuple(b[:, 0].tolist()) for b in expected}) > 6  # random batches, not one repeated
