"""Exact resume of a replay-buffer DataLoader: StatefulDataLoader + save_training_state / load_training_state.

Each equality test runs a small training loop three times: uninterrupted; interrupted after ``stop`` batches and
saved; resumed from the checkpoint in a NEW process (a forkserver child, which never shared the test's memory:
nothing survives but the directory). The batches of the two halves, concatenated, must equal the uninterrupted
ones bitwise, across the epoch boundary.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from helpers.extras import require
from tensordict import TensorDict

require("torchdata")

from helpers.resume import (  # noqa: E402
    BATCH,
    ITEMS,
    first_half,
    make_loader,
    new_process_context,
    noisy_buffer,
    run_in_new_process,
    save_then_die_mid_save,
    second_half,
    uninterrupted_run,
)
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ReplayBuffer,
    ReplayBufferDataset,
    TensorDictPrioritizedReplayBuffer,
    load_training_state,
    save_training_state,
    tensordict_collate,
)
from torchrl.data.replay_buffers.checkpointers import CheckpointError, read_checkpoint  # noqa: E402

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.extras,
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),  # torchdata 0.11 on torch >= 2.7
]


def _assert_same_batches(expected, got):
    assert len(got) == len(expected)
    for step, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"batch {step} differs after the resume: {a.tolist()} != {b.tolist()}"


def _resume_matches(tmp_path, cfg):
    expected = uninterrupted_run(cfg)
    path = str(tmp_path / "run")
    first = first_half(cfg, path)
    out = str(tmp_path / "rest.pt")
    run_in_new_process(second_half, cfg, path, out)
    rest = torch.load(out, weights_only=True)
    _assert_same_batches(expected, first + rest)
    return expected


# num_workers x start method x sampler; 6 batches an iteration, 2 iterations, interrupted mid-iteration 1. Without
# replacement an epoch is 10 batches (40 items, batches of 4): the run crosses an epoch boundary mid-iteration 2.
# Spawned workers (each a new interpreter: seconds of imports) run with 2 workers only: one worker is the fork
# runs' case, and what spawn adds (the worker states pickled to fresh workers) is the same for one or two.
GRID = [
    (0, None, "random"),
    (0, None, "without_replacement"),
    # with workers it cannot be exact: see test_save_warns_for_prioritized_sampling... Without a generator a
    # PrioritizedSampler draws from numpy's global generator (TorchRL's behaviour), which save_training_state records
    (0, None, "prioritized"),
    (1, "fork", "random"),
    (2, "fork", "random"),
    (2, "spawn", "random"),
    (1, "fork", "without_replacement"),
    (2, "fork", "without_replacement"),
    (2, "spawn", "without_replacement"),
]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("num_workers,start_method,sampler", GRID)
def test_resumed_run_yields_the_uninterrupted_batches(tmp_path, num_workers, start_method, sampler):
    cfg = {"sampler": sampler, "num_workers": num_workers, "start_method": start_method, "num_batches": 6,
           "total": 12, "stop": 4}
    expected = _resume_matches(tmp_path, cfg)
    assert len({tuple(b[:, 0].tolist()) for b in expected}) > 6  # random batches, not one repeated


@pytest.mark.timeout(400)
def test_prioritized_resume_with_a_generator(tmp_path):
    cfg = {"sampler": "prioritized", "num_workers": 0, "start_method": None, "num_batches": 6, "total": 12,
           "stop": 4, "generator": True}
    expected = _resume_matches(tmp_path, cfg)
    assert len({tuple(b[:, 0].tolist()) for b in expected}) > 6


def _assert_epochs_exactly_once(batches, per_epoch: int) -> None:
    ids = torch.cat([b[:, 0] for b in batches]).long()
    for start in range(0, ids.numel() - per_epoch * 4 + 1, per_epoch * 4):
        assert torch.equal(ids[start : start + per_epoch * 4].sort().values, torch.arange(ITEMS))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stop", [8, 10, 13])
def test_without_replacement_with_two_workers_resumes_exactly_in_one_epoch_iterations(tmp_path, stop):
    """num_batches=None: each DataLoader iteration is one epoch (10 batches); interrupted before, at and after
    the first epoch's end. Each epoch has every item once, and the resumed run has the same batches."""
    cfg = {"sampler": "without_replacement", "num_workers": 2, "start_method": "fork", "num_batches": None,
           "total": 20, "stop": stop}
    expected = _resume_matches(tmp_path, cfg)
    _assert_epochs_exactly_once(expected, 10)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stop", [16, 17])
def test_without_replacement_resumes_exactly_with_persistent_workers_over_three_epochs(tmp_path, stop):
    """5 batches an iteration: stop 16 is one batch into iteration 4, before worker 1 produced one in it."""
    cfg = {"sampler": "without_replacement", "num_workers": 2, "start_method": "fork", "num_batches": 5,
           "total": 30, "stop": stop, "persistent_workers": True}
    expected = _resume_matches(tmp_path, cfg)
    _assert_epochs_exactly_once(expected, 10)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stop", [6, 7])
def test_resume_at_and_after_the_epoch_boundary(tmp_path, stop):
    cfg = {"sampler": "random", "num_workers": 2, "start_method": "fork", "num_batches": 6, "total": 12,
           "stop": stop}
    _resume_matches(tmp_path, cfg)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stop", [6, 7])
def test_resume_with_persistent_workers_over_three_epochs(tmp_path, stop):
    """Stop 6: one batch into the second iteration, whose first batch came from worker 0 only (worker 1's state
    is the one torchdata took when the iteration began)."""
    cfg = {"sampler": "random", "num_workers": 2, "start_method": "fork", "num_batches": 5, "total": 15,
           "stop": stop, "persistent_workers": True}
    _resume_matches(tmp_path, cfg)


@pytest.mark.timeout(400)
def test_resume_with_a_buffer_generator_without_workers(tmp_path):
    cfg = {"sampler": "without_replacement", "num_workers": 0, "start_method": None, "num_batches": 7,
           "total": 14, "stop": 9, "generator": True}
    _resume_matches(tmp_path, cfg)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_storage_dataset_shuffled_resumes_exactly(tmp_path, num_workers):
    cfg = {"sampler": "random", "num_workers": num_workers, "start_method": "fork", "total": 15, "stop": 4,
           "storage_dataset": True}  # 40 items, batches of 4: 10 an epoch
    expected = _resume_matches(tmp_path, cfg)
    epoch = torch.cat(expected[:10]).sort().values  # no transform on storage reads: the ids only
    assert torch.equal(epoch, torch.arange(ITEMS, dtype=torch.float64))  # a shuffled epoch: each item once


@pytest.mark.timeout(300)
def test_sigkill_during_save_leaves_the_previous_state_loadable(tmp_path):
    path = str(tmp_path / "run")
    cfg = {"sampler": "random", "num_workers": 0, "start_method": None, "num_batches": 6, "total": 12}
    expected = uninterrupted_run(cfg)
    proc = new_process_context().Process(target=save_then_die_mid_save, args=(path,))
    proc.start()
    proc.join(240)
    assert proc.exitcode == -signal.SIGKILL
    assert any(".tmp-" in name for name in os.listdir(tmp_path))  # it died mid-save
    out = str(tmp_path / "rest.pt")
    run_in_new_process(second_half, cfg, path, out)
    rest = torch.load(out, weights_only=True)
    _assert_same_batches(expected[3:], rest)  # resumed from step 3, the last complete save


# -- format -------------------------------------------------------------------------------------------------------
def _small_run(tmp_path, num_workers=0, **kwargs):
    rb = noisy_buffer("random")
    loader = make_loader(rb.as_dataset(num_batches=6), num_workers, "fork", batch_size=None)
    it = iter(loader)
    next(it)
    path = str(tmp_path / "run")
    save_training_state(path, rb=rb, loader=loader, fsync=False, **kwargs)
    return rb, loader, path


def test_checkpoint_is_pickle_free_json_and_tensors_and_loads_as_a_buffer(tmp_path):
    rb, _, path = _small_run(tmp_path, extra={"step": 1, "weights": torch.ones(3), "raw": b"\x00\x01"})
    assert sorted(n for n in os.listdir(path) if not os.path.isdir(os.path.join(path, n))) == [
        "COMPLETE", "metadata.json"]
    tensors, metadata = read_checkpoint(path)  # validated: no pickle anywhere, versioned
    assert metadata["training_state"]["version"] == 1
    assert all(t.dtype in (torch.uint8, torch.int64, torch.float32, torch.bool) for t in tensors.values())
    fresh = noisy_buffer("random", fill=False)
    fresh.loads(path)  # a training state is also a buffer checkpoint
    assert torch.equal(fresh.storage.get(torch.arange(ITEMS))["obs"], torch.arange(ITEMS))
    extra = load_training_state(path)
    assert extra["step"] == 1 and torch.equal(extra["weights"], torch.ones(3)) and extra["raw"] == b"\x00\x01"


def test_load_restores_the_global_random_state(tmp_path):
    torch.manual_seed(5)
    save_training_state(str(tmp_path / "s"))
    expected = torch.rand(4)
    load_training_state(str(tmp_path / "s"))
    assert torch.equal(torch.rand(4), expected)
    load_training_state(str(tmp_path / "s"), restore_rng=False)
    assert not torch.equal(torch.rand(4), expected)


# -- errors -------------------------------------------------------------------------------------------------------
def test_mismatched_number_of_workers_is_refused_before_anything_changes(tmp_path):
    _, _, path = _small_run(tmp_path)
    rb = noisy_buffer("random", fill=False)
    loader = make_loader(rb.as_dataset(num_batches=6), 2, "fork", batch_size=None)
    with pytest.raises(ValueError, match=r"num_workers=0.*num_workers=2"):
        load_training_state(path, rb=rb, loader=loader)
    assert len(rb) == 0  # the buffer was not loaded


@pytest.mark.parametrize(
    "change,match",
    [
        ({"num_batches": 7}, r"num_batches 6, and this run has 7"),
        ({"batch_size": 5}, r"batch_size 4, and this run has 5"),
    ],
)
def test_mismatched_dataset_is_refused(tmp_path, change, match):
    _, _, path = _small_run(tmp_path)
    rb = ReplayBuffer(storage=LazyTensorStorage(ITEMS), batch_size=change.get("batch_size", BATCH))
    ds = rb.as_dataset(num_batches=change.get("num_batches", 6))
    loader = StatefulDataLoader(ds, batch_size=None, collate_fn=tensordict_collate)
    with pytest.raises(ValueError, match=match):
        load_training_state(path, loader=loader)


def test_a_shorter_buffer_is_refused(tmp_path):
    _, loader, _ = _small_run(tmp_path)
    state = loader.state_dict()
    rb = noisy_buffer("random", fill=False)
    rb.extend(TensorDict(obs=torch.arange(10), batch_size=[10]))
    fresh = make_loader(rb.as_dataset(num_batches=6), 0, None, batch_size=None)
    fresh.load_state_dict(state)
    with pytest.raises(ValueError, match=r"buffer of length 40, and this run has 10.*load_training_state"):
        next(iter(fresh))


def test_storage_dataset_refuses_another_length(tmp_path):
    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), torch.zeros(4, 2))
    ds = storage.as_dataset()
    state = ds.state_dict()
    storage.set(torch.arange(4, 6), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"storage of length 4, and this storage holds 6"):
        ds.load_state_dict(state)
    with pytest.raises(ValueError, match="not a StorageDataset state"):
        ds.load_state_dict({"length": 6})


def test_reader_state_errors():
    rb = noisy_buffer("random")
    ds = rb.as_dataset(num_batches=6)
    with pytest.raises(ValueError, match="not a ReplayBufferDataset reader state"):
        ds.load_state_dict({"draws": 3})
    state = ds.state_dict()
    with pytest.raises(ValueError, match="version 99"):
        ds.load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match=r"num_workers 2, and this run has 0"):
        ds.load_state_dict({**state, "reader": {**state["reader"], "num_workers": 2, "worker": 1}})
    with pytest.raises(ValueError, match=r"world_size 2, and this run has 1"):
        ds.load_state_dict({**state, "reader": {**state["reader"], "world_size": 2}})
    with pytest.raises(ValueError, match=r"sampler .*SamplerWithoutReplacement"):
        noisy_buffer("without_replacement").as_dataset(num_batches=6).load_state_dict(state)


def test_plain_dataloader_and_bad_arguments_are_refused(tmp_path):
    rb = noisy_buffer("random")
    plain = torch.utils.data.DataLoader(rb.as_dataset(num_batches=2), batch_size=None, collate_fn=tensordict_collate)
    with pytest.raises(TypeError, match="StatefulDataLoader"):
        save_training_state(str(tmp_path / "x"), rb=rb, loader=plain)
    with pytest.raises(TypeError, match="`rb` must be a replay buffer"):
        save_training_state(str(tmp_path / "x"), rb=object())
    with pytest.raises(TypeError, match="`extra` must be a mapping"):
        save_training_state(str(tmp_path / "x"), extra=[1])
    with pytest.raises(TypeError, match="would need pickle"):
        save_training_state(str(tmp_path / "x"), extra={"f": object()})
    assert not os.path.exists(tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        load_training_state(str(tmp_path / "missing"))
    rb.dumps(str(tmp_path / "rb"))
    with pytest.raises(CheckpointError, match="holds no training state"):
        load_training_state(str(tmp_path / "rb"))
    save_training_state(str(tmp_path / "only_rng"))
    with pytest.raises(CheckpointError, match="holds no replay buffer"):
        load_training_state(str(tmp_path / "only_rng"), rb=noisy_buffer("random", fill=False))
    with pytest.raises(CheckpointError, match="holds no loader state"):
        load_training_state(str(tmp_path / "only_rng"), loader=make_loader(rb.as_dataset(), 0, None, batch_size=None))


def test_worker_restore_is_not_overwritten_by_the_worker_reseed(tmp_path):
    """One worker: the state after 2 batches, loaded into a fresh loader, yields batch 3 (not batch 1 again)."""
    rb = noisy_buffer("random")
    loader = make_loader(rb.as_dataset(num_batches=6), 1, "fork", batch_size=None)
    it = iter(loader)
    batches = [next(it)["noise"].clone() for _ in range(3)]
    del it
    loader = make_loader(rb.as_dataset(num_batches=6), 1, "fork", batch_size=None)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    del it
    resumed = make_loader(rb.as_dataset(num_batches=6), 1, "fork", batch_size=None)
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed))["noise"], batches[2])


class _Items(ReplayBufferDataset):
    """Yields the 4 items of each draw one by one."""

    def items(self, batch):
        yield from batch.unbind(0)


@pytest.mark.timeout(300)
def test_resume_in_the_middle_of_a_draw_redraws_it_and_skips_what_was_yielded():
    rb = noisy_buffer("random")
    expected = [item["noise"].clone() for item in make_loader(_Items(rb, num_batches=4), 1, "fork", batch_size=None)]
    loader = make_loader(_Items(rb, num_batches=4), 1, "fork", batch_size=None)
    it = iter(loader)
    first = [next(it)["noise"].clone() for _ in range(6)]  # the 2nd draw is half yielded
    state = loader.state_dict()
    del it
    resumed = make_loader(_Items(rb, num_batches=4), 1, "fork", batch_size=None)
    resumed.load_state_dict(state)
    rest = [item["noise"].clone() for item in resumed]
    _assert_same_batches(expected, first + rest)


@pytest.mark.timeout(300)
def test_save_warns_for_prioritized_sampling_with_workers_only(tmp_path):
    import warnings

    rb = noisy_buffer("without_replacement")
    loader = make_loader(rb.as_dataset(num_batches=4), 1, "fork", batch_size=None)
    next(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # without replacement: exact, no warning
        save_training_state(str(tmp_path / "run"), rb=rb, loader=loader, fsync=False)
    prb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(ITEMS), batch_size=BATCH)
    prb.extend(TensorDict(obs=torch.arange(ITEMS), batch_size=[ITEMS]))
    loader = make_loader(prb.as_dataset(num_batches=4), 1, "fork", batch_size=None)
    next(iter(loader))
    with pytest.warns(UserWarning, match="sampler PrioritizedSampler keeps one state shared"):
        save_training_state(str(tmp_path / "prioritized"), rb=prb, loader=loader, fsync=False)


@pytest.mark.timeout(300)
def test_two_seeded_runs_with_workers_draw_the_same_batches_without_replacement():
    cfg = {"sampler": "without_replacement", "num_workers": 2, "start_method": "fork", "num_batches": None,
           "total": 20}
    first, second = uninterrupted_run(cfg), uninterrupted_run(cfg)
    _assert_same_batches(first, second)
    _assert_epochs_exactly_once(first, 10)
