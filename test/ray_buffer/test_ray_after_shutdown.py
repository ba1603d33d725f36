"""Issue 29: a RayReplayBuffer client used after ``ray.shutdown()`` says so, and starts no new cluster.

Run in a child process of its own (it shuts Ray down, which the other Ray tests' shared cluster must not see).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers.extras import require

require("ray")
pytestmark = [pytest.mark.extras, pytest.mark.multiprocess]

SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import functools, ray, torch
    from torchrl.data import LazyTensorStorage, RayReplayBuffer

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rb = RayReplayBuffer(storage=functools.partial(LazyTensorStorage, 16), batch_size=4)
    client = rb.client()
    client.extend(torch.arange(8))
    assert len(client) == 8
    ray.shutdown()
    for call in (lambda: client.sample(), lambda: client.extend(torch.arange(2)), lambda: len(client)):
        try:
            call()
        except RuntimeError as err:
            assert type(err) is RuntimeError, type(err)
            assert "ray.shutdown()" in str(err) and "nothing was sent" in str(err), str(err)
        else:
            raise AssertionError("a call after ray.shutdown() succeeded")
        assert not ray.is_initialized(), "the call started a new Ray cluster"
    print("OK")
    """
)


@pytest.mark.timeout(240)
def test_a_client_used_after_ray_shutdown_raises_a_clear_error_and_starts_no_cluster():
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=200, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-4000:]
