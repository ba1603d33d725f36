"""Shared pytest fixtures and settings for the whole test suite.

Markers (registered in pyproject.toml, ``--strict-markers`` rejects any other):

- ``slow``: minutes rather than seconds; CI and the README's test command deselect them (``-m "not slow"``).
- ``multiprocess``: starts worker processes; give each such test a DataLoader ``timeout`` or a
  ``@pytest.mark.timeout(...)`` so that a deadlock fails fast.
- ``extras``: needs an optional integration (``datasets``, ``transformers``, ``trl``, ``gymnasium``...). Each such
  test calls ``pytest.importorskip("<package>")`` itself (at module level or in the test), so a machine without
  the extra reports it as skipped, with the missing package as the reason, and never fails on it. CI installs
  every extra (``.ci/run``), so they run there.

Fixtures:

- ``seed``: seeds torch's global generator (and restores its state afterwards); returns the seed.
- ``td_batch``: a factory ``td_batch(n, *, generator=None)`` of the benchmark transitions
  ``{obs: f32[84], action: i64, reward: f32, ("next", "obs"): f32[84], done: bool}`` with batch size ``[n]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from tensordict import TensorDict

# Tests never download: Hugging Face libraries fail at once instead of retrying a network that is not there.
# Set before any test module imports them (they read these at import time); subprocesses inherit them.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

OBS_DIM = 84
NUM_ACTIONS = 4


def make_td_batch(n: int, *, generator: torch.Generator | None = None) -> TensorDict:
    """Returns ``n`` random transitions in the layout of the core benchmark data (about 5% of them ``done``).

    Args:
        n (int): the number of transitions (the batch size of the result).

    Keyword Args:
        generator (torch.Generator, optional): the generator of the random values. Defaults to ``None``
            (torch's global generator).
    """
    return TensorDict(
        {
            "obs": torch.randn(n, OBS_DIM, generator=generator),
            "action": torch.randint(NUM_ACTIONS, (n,), generator=generator),
            "reward": torch.randn(n, generator=generator),
            ("next", "obs"): torch.randn(n, OBS_DIM, generator=generator),
            "done": torch.rand(n, generator=generator) < 0.05,
        },
        batch_size=[n],
    )


@pytest.fixture
def seed() -> Iterator[int]:
    """Seeds torch's global generator with 0 for the test and restores its previous state afterwards."""
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    yield 0
    torch.random.set_rng_state(state)


@pytest.fixture
def td_batch():
    """The :func:`make_td_batch` factory: ``td_batch(n)`` returns ``n`` random benchmark transitions."""
    return make_td_batch
