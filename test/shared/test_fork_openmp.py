"""A child forked from a process that ran OpenMP work never waits on the parent's thread team.

Building the default-size shared buffer of ``examples/replay-buffers/collectors_and_learner.py`` runs a parallel
op in the parent (NOTE [OpenMP and fork] in ``torchrl/data/replay_buffers/_shared/openmp_fork.py``); without the
at-fork handler, a collector forked after it blocks forever at its first parallel op. Each scenario runs in a
fresh interpreter (``python -c``) so that the parent's OpenMP state is the scenario's own, not the test runner's;
a child still running after its deadline is killed and fails the test.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from torchrl.data.replay_buffers._shared.openmp_fork import loaded_libgomp_paths, release_openmp_pools

TIMEOUT = 120
OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()

# The parent runs with at least 2 threads, so that a team of 2 exists even on a 1-core machine.
PRELUDE = """
import os, sys, time
import torch
if torch.get_num_threads() < 2:
    torch.set_num_threads(2)
THREADS = torch.get_num_threads()

def parallel_ops():
    q = torch.linalg.qr(torch.randn(4, 4))[0]  # the collectors' first op in the example
    big = torch.randn(1_000_000).mul_(2).sum()  # well above torch's grain size: a parallel region
    return q, big

def wait(pid, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "stuck"
"""

COLLECTOR = PRELUDE + """
import multiprocessing as mp
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, SampleToInsertRatio, TensorDictReplayBuffer

def collector(rb, threads):
    assert torch.get_num_threads() == threads, (torch.get_num_threads(), threads)  # all its threads
    parallel_ops()
    rb.extend(TensorDict({"obs": torch.randn(64, 4)}, batch_size=[64]), timeout=30.0)

if __name__ == "__main__":
    # the example's defaults: 2 collectors x 200 chunks x 64 transitions
    limiter = SampleToInsertRatio(4.0, 256, 512.0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2 * 200 * 64, shared_init=True), batch_size=64,
                                shared=True, rate_limiter=limiter)
    proc = mp.get_context("fork").Process(target=collector, args=(rb, THREADS))
    proc.start()
    print(wait(proc.pid), len(rb), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 30)
def test_a_collector_forked_after_building_the_default_size_shared_buffer_runs_parallel_ops():
    proc = subprocess.run([sys.executable, "-c", COLLECTOR], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "64"], proc.stdout + proc.stderr  # exit code 0, its rows written


FORKED = PRELUDE + """
import torchrl.data
parallel_ops()  # the parent's team exists now
pid = os.fork()
if pid == 0:
    parallel_ops()
    os._exit(0 if torch.get_num_threads() == THREADS else 3)
print(wait(pid), flush=True)
parallel_ops()  # the parent builds a new team
pid = os.fork()
if pid == 0:
    parallel_ops()
    os._exit(0)
print(wait(pid), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 30)
def test_os_fork_after_parallel_ops_gives_a_child_that_runs_them_with_all_its_threads():
    proc = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "0"], proc.stdout + proc.stderr


# A runtime named like libgomp that has no omp_pause_resource_all (older than OpenMP 5.0): the child is given one
# thread, which never opens a team. The stand-in is a real shared library (a copy of one of Python's extension
# modules, loaded as a plain library, its PyInit never called).
NO_PAUSE = PRELUDE + """
import ctypes
from torchrl.data.replay_buffers._shared.openmp_fork import loaded_libgomp_paths, release_openmp_pools
ctypes.CDLL(sys.argv[1])
assert sys.argv[1] in loaded_libgomp_paths()
assert not release_openmp_pools([sys.argv[1]])
parallel_ops()
pid = os.fork()
if pid == 0:
    parallel_ops()
    os._exit(0 if torch.get_num_threads() == 1 else 3)
print(wait(pid), torch.get_num_threads() == THREADS, flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 30)
def test_a_runtime_that_cannot_release_its_pool_leaves_the_child_one_thread(tmp_path):
    import _ctypes
    import _json

    library = next((m.__file__ for m in (_json, _ctypes) if getattr(m, "__file__", "").endswith(".so")), None)
    if library is None:
        pytest.skip("this Python has no extension module in a shared library to stand in")
    stand_in = tmp_path / "libgomp-stand-in.so.1"
    shutil.copyfile(library, stand_in)
    proc = subprocess.run([sys.executable, "-c", NO_PAUSE, str(stand_in)], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "True"], proc.stdout + proc.stderr  # the parent keeps its threads


@pytest.mark.skipif(not (OPENMP and sys.platform.startswith("linux")), reason="needs torch's GNU OpenMP on Linux")
def test_torch_s_libgomp_is_found_and_releases_its_pool():
    # in a fresh interpreter: in this one, a thread left by an earlier test may be inside a parallel region,
    # where libgomp refuses to pause (the before-fork handler then falls back to one thread in the child)
    code = (
        "import os, torch\n"
        "from torchrl.data.replay_buffers._shared.openmp_fork import loaded_libgomp_paths, release_openmp_pools\n"
        "torch.zeros(1_000_000).add_(1)\n"
        "paths = loaded_libgomp_paths()\n"
        "print(any(os.path.basename(p).startswith('libgomp') for p in paths), release_openmp_pools(),\n"
        "      torch.zeros(1_000_000).add_(1).sum().item() == 1_000_000)\n"  # a new team, in that process
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True"], proc.stdout + proc.stderr


def test_loaded_libgomp_paths_reads_the_maps_format():
    lines = [
        "7f0-7f1 r-xp 00000000 fe:00 54   /venv/torch/lib/libgomp.so.1\n",
        "7f1-7f2 r--p 00037000 fe:00 54   /venv/torch/lib/libgomp.so.1\n",  # one path, listed once
        "7f2-7f3 r-xp 00000000 fe:00 55   /venv/sklearn/.libs/libgomp-a34b3233.so.1.0.0\n",
        "7f3-7f4 r-xp 00000000 fe:00 56   /usr/lib/libgompish.txt\n",  # not a shared library
        "7f4-7f5 rw-p 00000000 00:00 0 \n",  # anonymous
        "7f5-7f6 r-xp 00000000 fe:00 57   /usr/lib/libomp.so.5\n",  # LLVM's runtime handles fork itself
    ]
    assert loaded_libgomp_paths(lines) == ["/venv/torch/lib/libgomp.so.1",
                                           "/venv/sklearn/.libs/libgomp-a34b3233.so.1.0.0"]


def test_release_reports_a_runtime_it_cannot_reach():
    assert release_openmp_pools([]) is True
    # a library that is not loaded is never loaded by the check (RTLD_NOLOAD): nothing could be released
    assert release_openmp_pools(["/nonexistent/libgomp.so.1"]) is False
