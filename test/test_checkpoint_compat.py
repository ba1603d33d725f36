"""Checkpoints written by earlier code (schema version 1, ``test/data/checkpoints_v1``) load unchanged.

The directories and ``expected.json`` were written by ``test/data/make_v1_checkpoints.py`` with the code of
commit f208935; each case builds the same buffer with today's code, loads the old checkpoint and compares
content, counters and the next seeded draws with what the old code observed after its own load.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))

from make_v1_checkpoints import buffers, observe  # noqa: E402

CHECKPOINTS = DATA / "checkpoints_v1"
EXPECTED = json.loads((CHECKPOINTS / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_checkpoints_written_by_earlier_code_load_with_the_same_content_and_draws(name, tmp_path):
    copy = tmp_path / name  # loading never writes, but a memmap buffer may adopt files: work on a copy
    shutil.copytree(CHECKPOINTS / name, copy)
    rb = buffers()[name]
    rb.loads(copy)
    assert observe(rb) == EXPECTED[name]
