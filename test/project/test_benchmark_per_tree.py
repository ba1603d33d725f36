"""The floor rows of ``benchmarks/per_tree.py`` (issue 30) time real samplers: the wide-layout draw picks the
positions the segment tree picks for the same uniform numbers, and ``--floor`` adds its rows to the table."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from torchrl.data.replay_buffers.samplers import _tree_kernels
from torchrl.data.replay_buffers.samplers.segment_tree import SumSegmentTree

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "per_tree.py"


@pytest.fixture(scope="module")
def per_tree():
    spec = importlib.util.spec_from_file_location("per_tree_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n, arity", [(4096, 64), (1024, 32)])
def test_the_wide_draw_picks_the_positions_the_tree_picks(per_tree, n, arity):
    priorities = np.random.default_rng(0).random(n) + 0.01
    tree = SumSegmentTree(n, kernel="numpy")
    tree.set_all(priorities)
    np.random.seed(1)
    wide = per_tree._wide_draw(priorities, arity)()
    np.random.seed(1)
    expected = tree.draw(np.random.random_sample(per_tree.BATCH))[0]
    assert wide.shape == (per_tree.BATCH,)
    assert (wide == expected).mean() > 0.99  # equal but where a float rounding tie falls on the other side


def test_floor_adds_the_tree_only_and_wide_rows(per_tree):
    rows = {name for _, name, _, _ in per_tree.table([4096], rounds=1, number=1, floor=True)}
    assert {"uniform", "tree only (numpy)", "64-ary draw (numpy)"} <= rows
    assert ("tree only (numba)" in rows) == (_tree_kernels.compiled_kernels() is not None)
    plain = {name for _, name, _, _ in per_tree.table([4096], rounds=1, number=1)}
    assert not any("tree only" in name or "-ary" in name for name in plain)
