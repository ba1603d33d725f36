"""The timing loop and the peak-RSS child harness that the benchmark scripts share.

Timing (all in seconds, ``time.perf_counter``):

- :func:`timed`: one call of ``fn``;
- :func:`per_call`: the mean time of one call over ``number`` calls in a row; :func:`repeat` does that
  ``repeats`` times (take the median);
- :func:`rate`: calls per second of ``fn`` over a window of ``seconds``;
- :func:`interleaved`: two sides timed round by round (A then B, or alternating), for a median of per-round
  ratios (:func:`median_ratio`), so that a change of machine load hits both sides alike;
- :class:`ScratchDirs`: one call timed at a time for calls that write new directories (dumps, exports, loads
  into new files), the directories removed untimed after each call.

Peak resident memory (Linux, ``/proc/self``), measured in a fresh child process so that nothing the parent
allocated counts:

- :func:`child_output`: runs a child (``python script --some-child-flag ...``) and returns the last line it
  prints, where the child writes its numbers;
- :func:`peak_rss_added`, in the child: how much ``fn`` adds to the peak RSS (``VmHWM`` after a reset through
  ``/proc/self/clear_refs``) and, when asked, to the peak anonymous RSS (``RssAnon``, sampled every 5 ms: it
  leaves out the pages of memory-mapped files).

The scripts import it as ``_timing`` (they run from this folder: ``python benchmarks/x.py`` puts it first on
``sys.path``, and so does pytest for the files it collects here).
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

# -- timing ------------------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    """Seconds taken by one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def per_call(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn``, over ``number`` calls in a row."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def repeat(fn: Callable[[], object], repeats: int, number: int) -> list[float]:
    """:func:`per_call` measured ``repeats`` times: one seconds-per-call value per block of ``number`` calls."""
    return [per_call(fn, number) for _ in range(repeats)]


def rate(fn: Callable[[], object], seconds: float, *, chunk: int = 1) -> float:
    """Calls per second of ``fn``, called for about ``seconds`` (the clock is read every ``chunk`` calls)."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(chunk):
            fn()
        n += chunk
    return n / (time.perf_counter() - start)


def interleaved(
    a: Callable[[], object],
    b: Callable[[], object],
    *,
    rounds: int,
    number: int,
    alternate: bool = False,
    before_round: Callable[[], object] | None = None,
) -> tuple[list[float], list[float]]:
    """Seconds per call of ``a`` and of ``b``, one value of each per round (``number`` calls per side).

    Every round times ``a`` then ``b``; with ``alternate=True`` the odd rounds time ``b`` first.
    ``before_round`` (untimed) runs at the start of each round, e.g. to refill a buffer.
    """
    a_times, b_times = [], []
    for r in range(rounds):
        if before_round is not None:
            before_round()
        if alternate and r % 2:
            tb, ta = per_call(b, number), per_call(a, number)
        else:
            ta, tb = per_call(a, number), per_call(b, number)
        a_times.append(ta)
        b_times.append(tb)
    return a_times, b_times


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-round ratios ``numerators[i] / denominators[i]``."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))


class ScratchDirs:
    """New directory paths under ``root`` for the calls being timed, removed after each call (untimed).

    Removing a call's new files drops their dirty pages, so the next call does not wait for their writeback.
    """

    def __init__(self, root: str):
        self.root = root
        self._paths: list[str] = []

    def new(self, name: str) -> str:
        """A path under ``root`` that does not exist yet (the timed call creates it)."""
        self._paths.append(os.path.join(self.root, f"{name}-{len(self._paths)}"))
        return self._paths[-1]

    def timed(self, fn: Callable[[], object]) -> float:
        """Seconds taken by one call of ``fn``; then (untimed) frees what it left, e.g. a loaded buffer and
        its memory maps, and removes the directories handed out by :meth:`new` since the last call."""
        elapsed = timed(fn)
        gc.collect()
        for path in self._paths:
            shutil.rmtree(path, ignore_errors=True)
        self._paths.clear()
        return elapsed


# -- peak RSS in a child process ---------------------------------------------------------------------------------


def child_output(argv: Sequence[str], *, env: dict | None = None, cwd: str | None = None) -> str:
    """Runs ``python *argv`` (this interpreter) to the end and returns the last line of its stdout.

    A failing child writes its stderr to this process's stderr, then raises
    :class:`subprocess.CalledProcessError`.
    """
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=cwd)
    if out.returncode:
        sys.stderr.write(out.stderr)
        out.check_returncode()
    return out.stdout.strip().splitlines()[-1]


def has_peak_reset() -> bool:
    """Whether this system lets a process reset and read its peak RSS (Linux ``/proc/self/clear_refs``)."""
    return os.path.exists("/proc/self/clear_refs")


def status_bytes(field: str) -> int:
    """A memory field of ``/proc/self/status`` (``"VmHWM"``, ``"RssAnon"``, ...), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak() -> None:
    """Resets this process's peak RSS (``VmHWM``) to its current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PeakAdded(NamedTuple):
    """What :func:`peak_rss_added` measured: bytes added to the peak RSS and to the peak anonymous RSS
    (``None`` unless sampled), and the seconds ``fn`` took."""

    rss: int
    anonymous: int | None
    seconds: float


def peak_rss_added(fn: Callable[[], object], *, anonymous: bool = False) -> PeakAdded:
    """Runs ``fn`` once and measures how much it raises this process's peak memory above what it held before.

    Call it in a fresh child process, after building the inputs (their memory is then the baseline).
    """
    reset_peak()
    base_rss = status_bytes("VmHWM")
    base_anon = status_bytes("RssAnon") if anonymous else 0
    peak_anon = [base_anon]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak_anon[0] = max(peak_anon[0], status_bytes("RssAnon"))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True) if anonymous else None
    if sampler is not None:
        sampler.start()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if sampler is not None:
        stop.set()
        sampler.join()
        peak_anon[0] = max(peak_anon[0], status_bytes("RssAnon"))
    added_anon = peak_anon[0] - base_anon if anonymous else None
    return PeakAdded(status_bytes("VmHWM") - base_rss, added_anon, elapsed)
