"""Shared pytest fixtures and settings for the whole test suite.

Markers (registered in pyproject.toml, ``--strict-markers`` rejects any other):

- ``slow``: minutes rather than seconds; CI and the README's test command deselect them (``-m "not slow"``).
- ``multiprocess``: starts worker processes; give each such test a DataLoader ``timeout`` or a
  ``@pytest.mark.timeout(...)`` so that a deadlock fails fast.
- ``extras``: needs an optional integration (``datasets``, ``transformers``, ``trl``, ``gymnasium``, ``ray``, ``torchdata``, ``h5py``...). Each such
  test calls ``pytest.importorskip("<package>")`` itself (at module level or in the test), so a machine without
  the extra reports it as skipped, with the missing package as the reason, and never fails on it. CI installs
  every extra (``.ci/run``), so they run there.

Fixtures:

- ``seed``: seeds torch's global generator (and restores its state afterwards); returns the seed.

Data and component factories live in ``_helpers.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

# Tests never download: Hugging Face libraries fail at once instead of retrying a network that is not there.
# Set before any test module imports them (they read these at import time); subprocesses inherit them.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")


@pytest.fixture
def seed() -> Iterator[int]:
    """Seeds torch's global generator with 0 for the test and restores its previous state afterwards."""
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    yield 0
    torch.random.set_rng_state(state)
