"""``load_training_state`` refuses a crafted checkpoint before it changes anything: the buffer (its rows, writer,
sampler and generator), its files, torch's random state and the loader are as they were after the refusal.

Each checkpoint is a valid one edited as an attacker would (metadata rewritten, its completion marker re-signed):
a random state of the wrong type or size, a loader generator state of the wrong size, a reader position that
cannot be applied (a negative draw count, a random stream of the wrong size), a buffer length the buffer cannot
have.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest
import torch
from helpers.assertions import assert_same_state, observable_state
from helpers.factories import make_buffer, rewrite_checkpoint_metadata

from torchrl.data import (
    LazyMemmapStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    load_training_state,
    save_training_state,
)
from torchrl.data.replay_buffers.errors import CheckpointError

StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

ITEMS = 40


def _buffer(scratch, fill: int) -> ReplayBuffer:
    storage = LazyMemmapStorage(ITEMS, scratch_dir=scratch)
    rb = make_buffer(
        storage=storage, sampler=SamplerWithoutReplacement(), batch_size=4, seed=1, data=torch.arange(100, 100 + fill)
    )
    rb.sample()  # the sampler and the generator have moved
    return rb


def _loader(rb) -> StatefulDataLoader:
    return StatefulDataLoader(
        rb.as_dataset(num_batches=6), batch_size=None, generator=torch.Generator().manual_seed(2)
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A training state of a full buffer and a loader two batches into its epoch, with spare tensors to point at."""
    root = tmp_path_factory.mktemp("saved")
    rb = _buffer(root / "rb", ITEMS)
    loader = _loader(rb)
    it = iter(loader)
    next(it), next(it)
    extra = {"small": torch.zeros(10, dtype=torch.uint8), "floats": torch.zeros(5056, dtype=torch.float32)}
    save_training_state(root / "run", rb=rb, loader=loader, extra=extra)
    return root / "run"


def _entry(node: dict, *keys):
    """The node of ``keys`` in an encoded state (``{"dict": [[key, node], ...]}``)."""
    for key in keys:
        node = dict(node["dict"])[key]
    return node


def _set_entry(node: dict, key, value) -> None:
    node["dict"] = [[k, value if k == key else v] for k, v in node["dict"]]


def _training(doc: dict) -> dict:
    return doc["metadata"]["training_state"]


def _extra_tensor(doc: dict, name: str) -> dict:
    return _entry(_training(doc)["extra"], name)


def _reader_state(doc: dict) -> dict:
    return _entry(_training(doc)["loader"]["state"], "dataset_state")


def _rng_of_floats(doc):
    _training(doc)["rng"] = _extra_tensor(doc, "floats")


def _rng_of_a_string(doc):
    _training(doc)["rng"] = {"value": "not a random state"}


def _rng_too_small(doc):
    _training(doc)["rng"] = _extra_tensor(doc, "small")


def _loader_generator_too_small(doc):
    _training(doc)["loader_generator"] = _extra_tensor(doc, "small")


def _negative_draws(doc):
    _set_entry(_reader_state(doc), "draws", {"value": -5})


def _global_stream_too_small(doc):
    stream = _entry(_reader_state(doc), "stream")
    _set_entry(stream, "global", {"dict": [["torchrl.bytes", _extra_tensor(doc, "small")]]})


def _numpy_keys_too_small(doc):
    _training(doc)["numpy_rng"]["keys"] = _extra_tensor(doc, "small")["tensor"]


def _numpy_position_out_of_range(doc):
    _training(doc)["numpy_rng"]["pos"] = 10**6


def _buffer_length(value):
    def mutate(doc):
        _training(doc)["buffer_length"] = value

    return mutate


VARIANTS = {
    "buffer-length-beyond-capacity": (
        _buffer_length(10**9),
        CheckpointError,
        r"`buffer_length` 1000000000, expected an int in \[0, 40\]",
    ),
    "buffer-length-negative": (_buffer_length(-1), CheckpointError, r"`buffer_length` -1, expected an int"),
    "buffer-length-not-an-int": (_buffer_length("40"), CheckpointError, r"`buffer_length` '40', expected an int"),
    "rng-wrong-type-float-tensor": (_rng_of_floats, CheckpointError, r"`rng`.*1-D uint8 tensor.*float32"),
    "rng-wrong-type-string": (_rng_of_a_string, CheckpointError, r"`rng`.*got a str"),
    "rng-wrong-size": (_rng_too_small, CheckpointError, r"`rng`.*refuses its 10 bytes"),
    "loader-generator-wrong-size": (
        _loader_generator_too_small,
        CheckpointError,
        r"`loader_generator`.*10 bytes",
    ),
    "numpy-rng-wrong-size": (_numpy_keys_too_small, CheckpointError, r"`numpy_rng`.*624 words"),
    "numpy-rng-position": (_numpy_position_out_of_range, CheckpointError, r"`numpy_rng`.*position.*1000000"),
    "reader-negative-draws": (_negative_draws, ValueError, r"`draws` is -5, expected an int >= 0"),
    "reader-stream-wrong-size": (
        _global_stream_too_small,
        ValueError,
        r"`stream\['global'\]` is '<10 bytes>'",
    ),
}


def _files(directory) -> dict[str, str]:
    return {
        os.path.relpath(os.path.join(d, name), directory): hashlib.sha256(
            open(os.path.join(d, name), "rb").read()
        ).hexdigest()
        for d, _, names in os.walk(directory)
        for name in names
    }


def _snapshot(rb, loader, scratch) -> dict:
    return {
        "buffer": observable_state(rb),
        "generator": rb._rng.get_state(),
        "files": _files(scratch),
        "global_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state()[1].copy(),
        "loader_generator": loader.generator.get_state(),
        "loader_next_state": loader.next_iter_state,  # what load_state_dict sets (state_dict() would draw seeds)
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_refused_training_state_changes_nothing(variant, saved, tmp_path):
    mutate, error, match = VARIANTS[variant]
    crafted = tmp_path / "crafted"
    shutil.copytree(saved, crafted)
    rewrite_checkpoint_metadata(crafted, mutate)
    rb = _buffer(tmp_path / "rb", 5)  # 5 rows, where the checkpoint holds 40
    loader = _loader(rb)
    torch.manual_seed(123)
    before = _snapshot(rb, loader, tmp_path / "rb")
    with pytest.raises(error, match=match):
        load_training_state(crafted, rb=rb, loader=loader)
    assert len(rb) == 5
    assert_same_state(_snapshot(rb, loader, tmp_path / "rb"), before)


def test_the_unedited_checkpoint_loads(saved, tmp_path):
    """The control: the same buffer and loader take the checkpoint the variants were made from."""
    rb = _buffer(tmp_path / "rb", 5)
    load_training_state(saved, rb=rb, loader=_loader(rb))
    assert len(rb) == ITEMS


def test_restore_rng_false_ignores_the_random_states(saved, tmp_path):
    crafted = tmp_path / "crafted"
    shutil.copytree(saved, crafted)
    rewrite_checkpoint_metadata(crafted, _rng_too_small)
    rb = _buffer(tmp_path / "rb", 5)
    state = torch.get_rng_state()
    load_training_state(crafted, rb=rb, restore_rng=False)
    assert len(rb) == ITEMS and torch.equal(torch.get_rng_state(), state)
