"""Checkpoints written by earlier code (schema version 1) load unchanged.

Two sets, each a directory of checkpoints and an ``expected.json`` written by a script beside them in
``test/data``: ``checkpoints_v1`` by ``make_v1_checkpoints.py`` with the code of commit f208935 (before
components owned their persistence), and ``checkpoints_release`` by ``make_release_checkpoints.py`` with the
code of commit 688e823 (the release before the package layout changed: prioritized, slice, consuming, staleness,
stacked, compressed, ``ndim=2`` memory-mapped and ensemble buffers). Each case builds the same buffer with today's
code, loads the old checkpoint and compares content, counters and the next seeded draws with what the old code
observed after its own load.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from torchrl.data import PrioritizedSampler

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))

import make_release_checkpoints  # noqa: E402
import make_v1_checkpoints  # noqa: E402

SETS = {"checkpoints_v1": make_v1_checkpoints, "checkpoints_release": make_release_checkpoints}
CASES = [
    (directory, name)
    for directory in SETS
    for name in sorted(json.loads((DATA / directory / "expected.json").read_text()))
]
#: Draws that changed on purpose since the set was written (content and counters still compared as written):
#: PrioritizedSliceSampler draws its starts from the trajectory index since issue 30 (rejection from the whole
#: priority tree instead of a cumulative sum over the eligible starts): the same distribution, another stream.
CHANGED_DRAWS = {
    ("checkpoints_release", "prioritized_slice"): {"sampled": [10, 11, 10, 11], "priority_weight": [0.432029] * 4},
}


@pytest.mark.parametrize(("directory", "name"), CASES)
def test_checkpoints_written_by_earlier_code_load_with_the_same_content_and_draws(directory, name, tmp_path):
    maker = SETS[directory]
    expected = json.loads((DATA / directory / "expected.json").read_text())[name]
    expected.update(CHANGED_DRAWS.get((directory, name), {}))
    copy = tmp_path / name  # loading never writes, but a memmap buffer may adopt files: work on a copy
    shutil.copytree(DATA / directory / name, copy)
    rb = maker.buffers()[name]
    rb.loads(copy)
    if isinstance(getattr(rb, "sampler", None), PrioritizedSampler) and rb._rng is None:
        # observe() seeds torch's global generator with 1, the stream the old code drew from; without a generator a
        # PrioritizedSampler now draws from numpy's global one (TorchRL's behaviour): a generator seeded alike gives
        # the recorded stream back
        rb.set_rng(torch.Generator().manual_seed(1))
    assert maker.observe(rb) == expected
