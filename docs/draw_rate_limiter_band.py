"""Draws ``docs/source/guides/rate_limiter_band.svg``: the (inserts, samples) band a ``SampleToInsertRatio`` permits.

The limiter is the one of ``examples/replay-buffers/collectors_and_learner.py`` (4 sampled records per insert,
sampling from 256 items, an error buffer of 512 records), over a run of 2,048 inserts in chunks of 64 and learner
batches of 64 (the example inserts 25,600: the band keeps the same height, 2 x 512 records, so a short run shows
it). The bounds come from the library's limiter and the two runs are played through its ``sample_permitted`` and
``insert_permitted``:

- samples above ``inserts * samples_per_insert - min_diff``: never (the learner waits in ``sample(wait=True)``);
- samples below ``inserts * samples_per_insert - max_diff``: inserts wait (``extend(..., timeout=...)``), once
  the buffer holds ``min_size_to_sample`` items (filling up to it never waits);
- at the last insert, the learner's batch count lies between the two bounds (the segment on the right).

The figure is plain SVG written with the standard library, so drawing it needs nothing beyond the package.
Run it from the repository root after changing the limiter's rule or this script::

    python docs/draw_rate_limiter_band.py           # writes the SVG
    python docs/draw_rate_limiter_band.py --check   # exit code 1 if the committed SVG is not what it draws
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "source" / "guides" / "rate_limiter_band.svg"

SPI, MIN_SIZE, ERROR_BUFFER = 4.0, 256, 512.0  # the example's limiter
INSERTS, CHUNK, BATCH = 2048, 64, 64  # the run drawn

WIDTH, HEIGHT = 760, 600
LEFT, RIGHT, TOP, BOTTOM = 78, 24, 20, 190  # margins around the plot area (the legend below)
COLORS = {"band": "#cfe3f7", "upper": "#c0392b", "lower": "#1f6fb2", "target": "#555555",
          "learner": "#e67e22", "collectors": "#27ae60", "text": "#222222", "axis": "#444444"}


def limiter():
    sys.path.insert(0, str(ROOT))
    from torchrl.data import SampleToInsertRatio

    return SampleToInsertRatio(SPI, MIN_SIZE, ERROR_BUFFER)


def play(lim, learner_first: bool) -> list[tuple[int, int]]:
    """One run to the last insert and on until the learner may sample no more: the (inserts, samples) after
    each chunk and each batch. ``learner_first``: the learner samples whenever permitted (it runs ahead and
    waits at the upper bound); otherwise the collectors insert whenever permitted (they wait at the lower one)."""
    inserts = samples = 0
    points = [(0, 0)]
    while True:
        can_insert = inserts < INSERTS and lim.insert_permitted(inserts=inserts, samples=samples, size=inserts,
                                                                n=CHUNK)
        can_sample = lim.sample_permitted(inserts=inserts, samples=samples, size=inserts, n=BATCH)
        if not (can_insert or can_sample):
            return points
        if can_sample and (learner_first or not can_insert):
            samples += BATCH
        else:
            inserts += CHUNK
        points.append((inserts, samples))


def batch_range(lim) -> tuple[int, int]:
    """The learner batch counts with which every insert is permitted and every batch is served."""
    total = INSERTS * lim.samples_per_insert
    return math.ceil((total - lim.max_diff) / BATCH), math.floor((total - lim.min_diff) / BATCH)


def draw(lim) -> str:
    x_max, y_max = INSERTS * 1.08, INSERTS * SPI * 1.02
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return round(LEFT + x / x_max * plot_w, 1)

    def py(y: float) -> float:
        return round(TOP + plot_h - y / y_max * plot_h, 1)

    def polyline(points, color, width, dash=""):
        coords = " ".join(f"{px(x)},{py(y)}" for x, y in points)
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="{width}"{dashed}/>'

    def text(x, y, body, size=13, anchor="start", color=COLORS["text"], weight="normal"):
        return (f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
                f'font-weight="{weight}">{body}</text>')

    spi, lo, hi = lim.samples_per_insert, lim.min_diff, lim.max_diff
    start = hi / spi  # where the insert bound leaves the axis
    band = [(MIN_SIZE, 0), (MIN_SIZE, MIN_SIZE * spi - lo), (INSERTS, INSERTS * spi - lo),
            (INSERTS, INSERTS * spi - hi), (start, 0)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Arial, sans-serif">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           '<polygon points="' + " ".join(f"{px(x)},{py(y)}" for x, y in band) + f'" fill="{COLORS["band"]}"/>']
    # axes, ticks and grid
    for x in range(0, INSERTS + 1, 256):
        out.append(f'<line x1="{px(x)}" y1="{py(0)}" x2="{px(x)}" y2="{py(0) + 5}" stroke="{COLORS["axis"]}"/>')
        out.append(text(px(x), py(0) + 20, f"{x:,}", size=11, anchor="middle"))
    for y in range(0, int(y_max) + 1, 1024):
        out.append(f'<line x1="{px(0)}" y1="{py(y)}" x2="{px(x_max)}" y2="{py(y)}" stroke="#eeeeee"/>')
        out.append(text(px(0) - 8, py(y) + 4, f"{y:,}", size=11, anchor="end"))
    out.append(f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(x_max)}" y2="{py(0)}" stroke="{COLORS["axis"]}"/>')
    out.append(f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(0)}" y2="{py(y_max)}" stroke="{COLORS["axis"]}"/>')
    out.append(text(px(x_max / 2), py(0) + 42, "inserts (write_count)", anchor="middle"))
    out.append(f'<text x="18" y="{py(y_max / 2)}" font-size="13" text-anchor="middle" fill="{COLORS["text"]}" '
               f'transform="rotate(-90 18 {py(y_max / 2)})">samples (samples_returned)</text>')
    # the bounds and the target
    out.append(polyline([(MIN_SIZE, MIN_SIZE * spi - lo), (INSERTS, INSERTS * spi - lo)], COLORS["upper"], 2))
    out.append(polyline([(start, 0), (INSERTS, INSERTS * spi - hi)], COLORS["lower"], 2))
    out.append(polyline([(MIN_SIZE, 0), (INSERTS, (INSERTS - MIN_SIZE) * spi)], COLORS["target"], 1, "5,4"))
    out.append(polyline([(0, 0), (MIN_SIZE, 0)], COLORS["collectors"], 4))  # filling up: inserts only
    # the two runs
    out.append(polyline(play(lim, learner_first=True), COLORS["learner"], 1.5))
    out.append(polyline(play(lim, learner_first=False), COLORS["collectors"], 1.5))
    # the learner's batch count at the last insert
    low, high = batch_range(lim)
    out.append(f'<line x1="{px(INSERTS)}" y1="{py(low * BATCH)}" x2="{px(INSERTS)}" y2="{py(high * BATCH)}" '
               f'stroke="black" stroke-width="4"/>')
    out.append(text(px(INSERTS) - 10, py(high * BATCH) - 12,
                    f"after the last insert: {low} to {high} learner batches of {BATCH}", size=12, anchor="end",
                    weight="bold"))
    # legend
    legend = [
        (COLORS["upper"], "", f"samples = {spi:g} x inserts - min_diff ({lo:g}): the learner waits above"),
        (COLORS["lower"], "", f"samples = {spi:g} x inserts - max_diff ({hi:g}): inserts wait below"),
        (COLORS["target"], "5,4", f"target: {spi:g} sampled records per insert after min_size_to_sample ({MIN_SIZE})"),
        (COLORS["learner"], "", "a learner that runs ahead"),
        (COLORS["collectors"], "", "collectors that run ahead (filling up to min_size_to_sample never waits)"),
    ]
    x0, y0 = px(0) + 14, py(0) + 76
    for i, (color, dash, label) in enumerate(legend):
        y = y0 + i * 19
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{x0}" y1="{y - 4}" x2="{x0 + 26}" y2="{y - 4}" stroke="{color}" stroke-width="2"'
                   f'{dashed}/>')
        out.append(text(x0 + 34, y, label, size=11.5))
    y = y0 + len(legend) * 19
    out.append(f'<rect x="{x0}" y="{y - 11}" width="26" height="10" fill="{COLORS["band"]}"/>')
    out.append(text(x0 + 34, y, "permitted: both sides may move", size=11.5))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed SVG, write nothing")
    args = parser.parse_args(argv)
    svg = draw(limiter())
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != svg:
            print(f"{OUT} is out of date: run python docs/draw_rate_limiter_band.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(svg, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
