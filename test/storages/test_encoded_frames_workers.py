"""EncodedFrameStorage across processes: DataLoader workers decode their own draws, bit-identical to what was
written; a shared storage shows frames written after a reader started; frames are written by one process."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from helpers.frame_targets import child_forget_then_read, child_read_frames_after, child_write_frames
from helpers.frames import moving_frames
from tensordict import TensorDict
from torch.utils.data import DataLoader

from torchrl.data import EncodedFrameStorage, ReplayBuffer, tensordict_collate


def steps(n: int, start: int = 0, length: int = 6) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "pixels": moving_frames(n, 16, 16, start=start),
            "obs": ids,
            "episode": ids // length,
            ("next", "done"): (ids % length == length - 1).unsqueeze(-1),
        },
        batch_size=[n],
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", *(pytest.param(c, marks=pytest.mark.slow) for c in ("forkserver", "spawn"))])
def test_dataloader_workers_sample_bit_identical_frames(context):
    data = steps(41)
    rb = ReplayBuffer(storage=EncodedFrameStorage(64, segment_frames=4), batch_size=8)
    rb.extend(data)
    assert rb.storage.stats()["tail_frames"] > 0  # reads mix closed segments and the raw tail
    loader = rb.as_dataset(num_batches=4).loader(num_workers=2, multiprocessing_context=context, timeout=90)
    batches = list(loader)
    assert len(batches) == 4
    for batch in batches:
        assert torch.equal(batch["pixels"], data["pixels"][batch["obs"]])


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_map_style_workers_read_bit_identical_frames():
    data = steps(30)
    storage = EncodedFrameStorage(32, segment_frames=5)
    storage.set(torch.arange(30), data)
    loader = DataLoader(storage.as_dataset(), batch_size=7, num_workers=2, collate_fn=tensordict_collate, timeout=90,
                        multiprocessing_context="fork")  # fmt: skip
    seen = torch.cat([batch["obs"] for batch in loader])
    assert seen.tolist() == list(range(30))
    frames = torch.cat([batch["pixels"] for batch in loader])
    assert torch.equal(frames, data["pixels"])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_a_shared_storage_shows_frames_written_after_a_reader_started(context):
    storage = EncodedFrameStorage(32, segment_frames=4)
    storage.set(torch.arange(6), steps(6))
    storage.share_memory_()
    ctx = mp.get_context(context)
    event, queue = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=child_read_frames_after, args=(storage, event, queue))
    child.start()
    try:
        more = steps(15, start=6)
        storage.set(torch.arange(6, 21), more)  # new segments (files) and tail frames (shared ring) after the start
        event.set()
        status, length, payload = queue.get(timeout=90)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert status == "ok", payload
    assert length == 21
    expected = torch.cat([steps(6)["pixels"], more["pixels"]])
    assert payload == expected.numpy().tobytes()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_frames_are_written_by_the_process_that_built_the_storage_only():
    storage = EncodedFrameStorage(8)
    storage.set(torch.arange(2), steps(2))
    storage.share_memory_()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=child_write_frames, args=(storage, queue))
    child.start()
    try:
        kind, message = queue.get(timeout=60)
    finally:
        child.join(30)
    assert kind == "RuntimeError"
    assert "takes frame writes from the process that built it" in message
    assert torch.equal(storage.get(torch.arange(2))["pixels"], steps(2)["pixels"])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_fork_child_dropping_decoders_leaves_the_parents_alone():
    storage = EncodedFrameStorage(16, codec="h264", segment_frames=8)
    storage.set(torch.arange(8), steps(8))
    expected = storage.get(torch.arange(8))["pixels"]  # the parent's decoder of the segment is open (threads)
    path = storage.segments()[0].path
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=child_forget_then_read, args=(storage, path, queue))
    child.start()
    try:
        status, payload = queue.get(timeout=60)  # closing the inherited decoder would hang the child here
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert status == "ok", payload
    assert payload == expected.numpy().tobytes()
    assert torch.equal(storage.get(torch.arange(8))["pixels"], expected)  # the parent's decoder still reads
