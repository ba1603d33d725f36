"""Child-process targets of the EncodedFrameStorage tests (importable by spawned children)."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def child_read_frames_after(storage, event, queue) -> None:
    """Waits for the parent to write (``event``), then sends back the length and every frame's bytes."""
    try:
        event.wait(30)
        frames = storage.get(torch.arange(len(storage)))["pixels"]
        queue.put(("ok", len(storage), frames.numpy().tobytes()))
    except Exception as err:  # the parent reports it
        queue.put(("error", -1, repr(err)))


def child_write_frames(storage, queue) -> None:
    """Tries to write one frame into a storage built by the parent; sends back the error."""
    try:
        storage.set(torch.arange(1), TensorDict(pixels=torch.zeros(1, 3, 16, 16, dtype=torch.uint8), batch_size=[1]))
        queue.put(("ok", ""))
    except Exception as err:
        queue.put((type(err).__name__, str(err)))


def child_forget_then_read(storage, path, queue) -> None:
    """In a fork child of a process that decoded ``path``: drops this process's decoders of ``path`` (as removing
    its segment does), reads every frame again and sends back their bytes."""
    import torchrl.data.replay_buffers.storages._video_segments as video

    try:
        video.forget(path)
        frames = storage.get(torch.arange(len(storage)))["pixels"]
        queue.put(("ok", frames.numpy().tobytes()))
    except Exception as err:
        queue.put(("error", repr(err)))
