"""The collectors guide's rate-limiter figure and batch counts: the committed SVG is what
``docs/draw_rate_limiter_band.py`` draws, and the batch range the guide gives for the example's defaults is the one
the library's limiter allows."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from torchrl.data import SampleToInsertRatio

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "source" / "guides" / "collectors_learners.rst"


def _script():
    path = ROOT / "docs" / "draw_rate_limiter_band.py"
    spec = importlib.util.spec_from_file_location("_draw_rate_limiter_band", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_figure_is_what_the_script_draws():
    assert _script().main(["--check"]) == 0, "run python docs/draw_rate_limiter_band.py and commit the SVG"
    assert ".. image:: rate_limiter_band.svg" in GUIDE.read_text(encoding="utf-8")


def _batch_counts(limiter, inserts_total: int, chunk: int, batch: int) -> tuple[int, int]:
    """Plays collectors that insert whenever permitted and a learner that samples otherwise: the batches taken
    when the last insert gets through (the fewest any schedule needs), and when the learner may take no more."""
    inserts = samples = 0
    fewest = None
    while True:
        if inserts < inserts_total and limiter.insert_permitted(inserts=inserts, samples=samples, size=inserts,
                                                                n=chunk):
            inserts += chunk
            if inserts == inserts_total:
                fewest = samples // batch
        elif limiter.sample_permitted(inserts=inserts, samples=samples, size=inserts, n=batch):
            samples += batch
        else:
            assert inserts == inserts_total, "the run stopped before its last insert"
            return fewest, samples // batch


def test_the_guide_s_batch_range_is_the_limiter_s():
    limiter = SampleToInsertRatio(4.0, 256, 512.0)  # the example's defaults
    inserts, batch = 2 * 200 * 64, 64
    fewest, most = _batch_counts(limiter, inserts, chunk=64, batch=batch)
    total = inserts * limiter.samples_per_insert
    formula = (math.ceil((total - limiter.max_diff) / batch), math.floor((total - limiter.min_diff) / batch))
    assert (fewest, most) == formula == (1576, 1592)
    assert "``1,576 <= N <= 1,592``" in GUIDE.read_text(encoding="utf-8")
