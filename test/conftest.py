"""Shared pytest fixtures and settings for the whole test suite.

Markers (registered in pyproject.toml, ``--strict-markers`` rejects any other):

- ``slow``: minutes rather than seconds; CI and the README's test command deselect them (``-m "not slow"``).
- ``multiprocess``: starts worker processes; give each such test a DataLoader ``timeout`` or a
  ``@pytest.mark.timeout(...)`` so that a deadlock fails fast.
- ``extras``: needs an optional integration (``datasets``, ``transformers``, ``trl``, ``gymnasium``, ``ray``,
  ``torchdata``, ``h5py``...). Each such test calls ``helpers.extras.require("<package>")`` itself (at module
  level or in the test), so a machine without the extra reports it as skipped, naming the extra to install, and
  never fails on it. The README's test command installs every extra the tests use (the ``tests`` extra pulls
  them in) and CI runs that command, so they run there. ``TORCHRL_TEST_WITHOUT_EXTRAS=h5,hf`` hides the packages
  of those extras, to check the skips on a machine that has them.

Fixtures:

- ``seed``: seeds torch's global generator (and restores its state afterwards); returns the seed.

Process start-up (the costly part of the multiprocess tests on CI's 2 cores): forkserver children fork from a
server with torch and torchrl.data preloaded, and DataLoader workers a test leaves behind are stopped when it
returns (see the comments below).

Layout: one folder per package of ``torchrl`` (``storages/``, ``samplers/``, ``writers/``, ``buffers/``,
``checkpoint/``, ``loading/``, ``shared/``, ``hf/``, ``ray_buffer/``, ``compat/``, ...), ``project/`` for the
project itself (architecture, docs, examples), ``data/`` for stored fixtures. A file is named after the component or
behaviour it tests, never after the work item that asked for it. A TorchRL-compatibility test lives in its area's
folder (``samplers/test_slice_torchrl_compat.py`` beside the slice sampler's tests); ``compat/`` keeps only what
crosses areas: public names, import paths, constructor keywords and error phrases. The contracts every storage,
sampler and writer keeps (checkpoint round trip, worker copy) run over all of them in
``checkpoint/test_component_contracts.py``; buffers are built by the one factory ``helpers.factories.make_buffer``. The folders have no ``__init__.py``:
pytest imports each test module by its file name, so a file name is used once in the whole tree (pytest refuses
a second one). ``pythonpath = ["test"]`` (pyproject.toml) makes ``helpers/`` importable as ``helpers``, in this
process and in the children it spawns (multiprocessing hands them its ``sys.path``): data and component factories
(``helpers.factories``), assertions (``helpers.assertions``) and child-process targets (``helpers.targets``,
``helpers.resume``, ``helpers.ranks``, ``helpers.rpc``). A test module imports from ``helpers``, never from another
test module. No folder is named after a package a test imports: with ``test/`` on ``sys.path``, a ``test/ray/``
folder would be imported as a namespace package ``ray`` where Ray is not installed (so ``importorskip("ray")``
would not skip); hence ``ray_buffer/``.
"""

from __future__ import annotations

import multiprocessing
import os
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import dataloader as torch_dataloader

# Tests never download: Hugging Face libraries fail at once instead of retrying a network that is not there.
# Set before any test module imports them (they read these at import time); subprocesses inherit them.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

# Forkserver children (DataLoader workers, writers, the resumed halves of loading/test_resume.py) fork from a
# server that imported torch, tensordict and torchrl.data once, as a user's set_forkserver_preload does: each
# child then starts in a fraction of a second instead of importing torch again (seconds on CI's 2 cores). They
# still receive everything by pickling, from a process that never shared the test's memory; the tests with
# spawn keep covering a child that imports everything itself. Set before the first forkserver child starts.
multiprocessing.set_forkserver_preload(["__main__", "torch", "tensordict", "torchrl.data"])

if os.environ.get("TORCHRL_TEST_WITHOUT_EXTRAS"):
    from helpers.extras import HiddenPackages

    HiddenPackages(os.environ["TORCHRL_TEST_WITHOUT_EXTRAS"].split(",")).install()


@pytest.fixture
def seed() -> Iterator[int]:
    """Seeds torch's global generator with 0 for the test and restores its previous state afterwards."""
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    yield 0
    torch.random.set_rng_state(state)


# DataLoader iterators a test leaves alive with their workers (most often in the traceback of an exception caught
# by pytest.raises: traceback -> test frame -> exception, a reference cycle) are shut down when the test returns.
# Left to a later garbage collection, their workers would cost that later test 5 s: the collector closes the
# iterator's queues before the iterator's own finalizer tells the workers to stop, so each shutdown waits for the
# DataLoader's 5-s status interval. Only iterators made by the test itself (not by a fixture) and without
# persistent workers are stopped, as deleting them would.
_LOADER_ITERATORS: weakref.WeakSet = weakref.WeakSet()
_base_iterator_init = torch_dataloader._BaseDataLoaderIter.__init__


def _tracked_iterator_init(self, *args, **kwargs) -> None:
    _base_iterator_init(self, *args, **kwargs)
    _LOADER_ITERATORS.add(self)


torch_dataloader._BaseDataLoaderIter.__init__ = _tracked_iterator_init


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    before = {id(it) for it in _LOADER_ITERATORS}
    try:
        return (yield)
    finally:
        for it in list(_LOADER_ITERATORS):
            if id(it) in before or getattr(it, "_persistent_workers", False):
                continue
            if getattr(it, "_workers", None) and not getattr(it, "_shutdown", True):
                it._shutdown_workers()
