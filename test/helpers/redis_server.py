"""A real ``redis-server`` for the tests of :class:`~torchrl.data.StoreStorage`, and the targets of its writer
processes.

:func:`redis_server` (a pytest fixture; import it into the test module) starts ``redis-server`` on a free localhost
port with a temporary directory and no persistence (``--save "" --appendonly no``), waits until it answers PING,
yields a :class:`RedisServer` and stops the server afterwards, also when a test failed. Where the binary is
missing it skips, naming ``redis-server`` and how to install it; without the Python package it skips naming the
``redis`` extra. CI installs the server in ``.ci/run``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import NamedTuple

import pytest

from helpers.extras import require

_START_TIMEOUT = 20.0


class RedisServer(NamedTuple):
    host: str
    port: int
    process: subprocess.Popen


def free_port() -> int:
    """A TCP port of localhost that nothing listens on (now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_ping(client, process: subprocess.Popen, port: int) -> None:
    import redis

    deadline = time.monotonic() + _START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode} before answering on port {port}")
        try:
            if client.ping():
                return
        except redis.exceptions.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-server did not answer PING on port {port} within {_START_TIMEOUT} s")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def redis_server():
    """A ``redis-server`` of this test module (one per module; each test uses its own ``td_id``)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs `redis-server` on PATH (apt-get install redis-server), which is not installed")
    redis = require("redis")
    with tempfile.TemporaryDirectory(prefix="torchrl-redis-") as directory:
        port = free_port()
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        try:
            _wait_for_ping(client, process, port)
            yield RedisServer("127.0.0.1", port, process)
        finally:
            client.close()
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


# -- targets of writer processes (module-level: spawn pickles them by name) -----------------------------------------
def write_batches(port: int, td_id: str, writer: int, batches: int, batch: int, queue) -> None:
    """Extends a buffer over the shared storage with ``batches`` batches of ``batch`` rows whose ``"value"`` is
    ``writer * 10_000 + i`` and ``"name"`` its string; puts ``(writer, indices, values)`` on ``queue``."""
    import torch
    from tensordict import TensorDict

    from torchrl.data import ReplayBuffer, StoreStorage

    storage = StoreStorage(1000, host="127.0.0.1", port=port, td_id=td_id)
    rb = ReplayBuffer(storage=storage, batch_size=4)
    indices, values = [], []
    for b in range(batches):
        value = torch.arange(b * batch, (b + 1) * batch) + writer * 10_000
        data = TensorDict(value=value, obs=value.float().unsqueeze(-1).expand(batch, 3), batch_size=[batch])
        data["name"] = [f"w{v}" for v in value.tolist()]
        indices += rb.extend(data).tolist()
        values += value.tolist()
    storage.close()
    queue.put((writer, indices, values, os.getpid()))
