"""Runs of a small training loop for the resume tests (loading/test_resume.py).

Child-process targets live here, not in the test modules, so that a new process (forkserver, spawn) imports only
this light module. A "run" reads a replay buffer of 40 items (``obs`` = the item id, a random ``noise`` entry added
by a transform in the process that samples) through a ``StatefulDataLoader`` for two epochs, and each training step
draws from torch's global generator, as dropout would: so a resumed run matches the uninterrupted one only if
every random stream (the workers', the transform's, the main process's) is restored.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from tensordict import TensorDict

from helpers.factories import make_buffer
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    load_training_state,
    save_training_state,
    tensordict_collate,
)

ITEMS = 40
BATCH = 4
TIMEOUT = 60  # DataLoader timeout: a deadlock fails instead of hanging


def add_noise(td):
    """A random transform: it draws from the global generator of the process that samples."""
    return td.set("noise", torch.rand(td.shape))


def noisy_buffer(sampler: str, *, fill: bool = True, generator: bool = False, scratch_dir=None) -> ReplayBuffer:
    """A buffer of ``ITEMS`` items (``obs`` = the id) with the :func:`add_noise` transform, over a sampler by name
    (:func:`helpers.factories.make_sampler`); empty with ``fill=False``."""
    storage = LazyTensorStorage(ITEMS) if scratch_dir is None else LazyMemmapStorage(ITEMS, scratch_dir=scratch_dir)
    rb = make_buffer(storage=storage, sampler=sampler, capacity=ITEMS, batch_size=BATCH, seed=3 if generator else None)
    rb.append_transform(add_noise)
    if fill:
        rb.extend(TensorDict(obs=torch.arange(ITEMS), batch_size=[ITEMS]))
    return rb


def make_loader(dataset, num_workers: int, start_method: str | None, **kwargs):
    from torchdata.stateful_dataloader import StatefulDataLoader

    if num_workers:
        kwargs.update(multiprocessing_context=start_method, timeout=TIMEOUT)
    return StatefulDataLoader(
        dataset, num_workers=num_workers, collate_fn=tensordict_collate,
        generator=torch.Generator().manual_seed(7), **kwargs,
    )


def _rb_loader(cfg: dict, rb):
    if cfg.get("storage_dataset"):
        dataset = rb.storage.as_dataset()
        return make_loader(dataset, cfg["num_workers"], cfg["start_method"], batch_size=BATCH, shuffle=True)
    dataset = rb.as_dataset(num_batches=cfg["num_batches"])
    extra = {"persistent_workers": True} if cfg.get("persistent_workers") else {}
    return make_loader(dataset, cfg["num_workers"], cfg["start_method"], batch_size=None, **extra)


def _record(batch) -> torch.Tensor:
    """What a batch is, bitwise: its ids and its noise, side by side."""
    if "noise" not in batch.keys():
        return batch["obs"].to(torch.float64).clone()
    return torch.stack([batch["obs"].to(torch.float64), batch["noise"].to(torch.float64)], -1)


def consume(loader, total: int, done: int = 0, stop: int | None = None, on_stop=None, rb=None) -> list[torch.Tensor]:
    """Batches ``done + 1 .. total`` of a run (epoch after epoch), one training step each; at ``stop``
    (a global step), calls ``on_stop()`` and returns. With ``rb`` (a prioritized buffer), each step sets new
    priorities on the batch's items (``obs`` is the storage index), as a learner does."""
    out = []
    while done < total:
        for batch in loader:
            out.append(_record(batch))
            done += 1
            torch.rand(3)  # the training step's own random draws (dropout, exploration...)
            if rb is not None:
                rb.update_priority(batch["obs"], (batch["obs"] % 5 + 1 + done).to(torch.float32))
            if done == stop:
                on_stop()
                return out
            if done == total:
                break
    return out


def _prioritized(cfg: dict, rb):
    return rb if cfg["sampler"] == "prioritized" else None


def _seed(seed: int) -> None:
    """Seeds torch's and numpy's global generators (a PrioritizedSampler without a generator draws from numpy's)."""
    torch.manual_seed(seed)
    np.random.seed(seed)


def uninterrupted_run(cfg: dict) -> list[torch.Tensor]:
    _seed(0)
    rb = noisy_buffer(cfg["sampler"], generator=cfg.get("generator", False))
    return consume(_rb_loader(cfg, rb), cfg["total"], rb=_prioritized(cfg, rb))


def first_half(cfg: dict, path: str) -> list[torch.Tensor]:
    _seed(0)
    rb = noisy_buffer(cfg["sampler"], generator=cfg.get("generator", False))
    loader = _rb_loader(cfg, rb)

    def save():
        save_training_state(path, rb=rb, loader=loader, extra={"step": cfg["stop"]}, fsync=False)

    return consume(loader, cfg["total"], stop=cfg["stop"], on_stop=save, rb=_prioritized(cfg, rb))


def second_half(cfg: dict, path: str, out: str) -> None:
    """The resumed half, meant to run in a new process: an empty buffer and a fresh loader, then the rest."""
    _seed(1234)  # another seed: everything that matters must come from the checkpoint
    rb = noisy_buffer(cfg["sampler"], fill=False, generator=cfg.get("generator", False))
    if not cfg.get("storage_dataset"):  # one call, the dataset (and its shared sampler) built before the load
        loader = _rb_loader(cfg, rb)
        extra = load_training_state(path, rb=rb, loader=loader)
    else:  # a shuffled StorageDataset's loader draws its permutation over the storage length: content first
        load_training_state(path, rb=rb)
        loader = _rb_loader(cfg, rb)
        extra = load_training_state(path, loader=loader)
    batches = consume(loader, cfg["total"], done=extra["step"], rb=_prioritized(cfg, rb))
    torch.save(batches, out)


def new_process_context():
    """Where the resumed halves run: a forkserver child, a new process that never shared the test's memory (it
    receives the target and its arguments by pickling, as a spawned one does). It forks from a server that
    imported torch and torchrl.data once (test/conftest.py) instead of spending seconds importing them again."""
    return torch.multiprocessing.get_context("forkserver")


def run_in_new_process(target, *args, timeout: float = 240) -> None:
    """Runs ``target(*args)`` in a new process (:func:`new_process_context`); raises if it fails or does not
    finish in time."""
    ctx = new_process_context()
    proc = ctx.Process(target=target, args=args)
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise TimeoutError(f"{target.__name__} did not finish within {timeout} s")
    if proc.exitcode != 0:
        raise RuntimeError(f"{target.__name__} failed in its process (exit code {proc.exitcode})")


# -- SIGKILL during a save ----------------------------------------------------------------------------------------
def save_then_die_mid_save(path: str) -> None:
    """Saves a complete state at step 3, then is killed (SIGKILL) in the middle of the save at step 5."""
    import signal

    import torchrl.data.replay_buffers._checkpoint.fs as fs

    cfg = {"sampler": "random", "num_workers": 0, "start_method": None, "num_batches": 6, "total": 12}
    torch.manual_seed(0)
    rb = noisy_buffer(cfg["sampler"])
    loader = _rb_loader(cfg, rb)
    it = iter(loader)
    for _ in range(3):
        next(it)
        torch.rand(3)
    save_training_state(path, rb=rb, loader=loader, extra={"step": 3})

    def die(step):
        if step == "tensor_written":
            os.kill(os.getpid(), signal.SIGKILL)

    next(it), next(it)
    fs.STEP_HOOK = die
    save_training_state(path, rb=rb, loader=loader, extra={"step": 5})
