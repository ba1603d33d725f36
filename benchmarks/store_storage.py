"""What a buffer over a Redis server costs: :class:`~torchrl.data.StoreStorage` against
:class:`~torchrl.data.LazyTensorStorage`, for a fill (``rb.extend``) and a draw (``rb.sample()``, and with
``prefetch=4``), with TorchRL's benchmark rows.

Rows as in TorchRL's ``test_benchmark_store_storage.py``: ``obs: f32[64]``, ``action: f32[4]``, ``reward: f32[1]``;
a buffer of 10_000 rows, ``ReplayBuffer(RandomSampler(), RoundRobinWriter(), batch_size=256)``, filled in chunks of
500. A fill writes 5_000 rows into an emptied buffer; draws run after a 5_000-row prefill. Each pair is timed in
interleaved rounds; the table gives the median time per call of each side and the median of the per-round ratios.

The script starts its own ``redis-server`` (a free localhost port, a temporary directory, no persistence) unless
``--port`` names a running one. Run::

    python benchmarks/store_storage.py            # full size (about a minute)
    python benchmarks/store_storage.py --quick    # tiny sizes, seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid

import torch
from _timing import interleaved, median_ratio
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer, RoundRobinWriter, StoreStorage


@contextlib.contextmanager
def _server(port: int | None):
    """``(host, port)`` of a running server: the one given, or a ``redis-server`` started for the run."""
    if port is not None:
        yield "localhost", port
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server), and no --port was given")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="torchrl-redis-bench-") as directory:
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            import redis

            client = redis.Redis(host="127.0.0.1", port=port)
            for _ in range(500):
                with contextlib.suppress(redis.exceptions.ConnectionError):
                    if client.ping():
                        break
                time.sleep(0.02)
            client.close()
            yield "127.0.0.1", port
        finally:
            process.terminate()
            process.wait(timeout=10)


def _rows(n: int) -> TensorDict:
    return TensorDict(obs=torch.randn(n, 64), action=torch.randn(n, 4), reward=torch.randn(n, 1), batch_size=[n])


def _buffer(storage, batch: int, prefetch: int | None = None) -> ReplayBuffer:
    return ReplayBuffer(storage=storage, sampler=RandomSampler(), writer=RoundRobinWriter(), batch_size=batch,
                        prefetch=prefetch)  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds): checks that the script runs")
    parser.add_argument("--port", type=int, default=None, help="a running server's port (default: start one)")
    args = parser.parse_args(argv)
    size, fill, chunk, batch, rounds, number = (
        (1_000, 500, 100, 32, 2, 3) if args.quick else (10_000, 5_000, 500, 256, 7, 20)
    )
    torch.manual_seed(0)
    chunks = [_rows(chunk) for _ in range(fill // chunk)]
    with _server(args.port) as (host, port):

        def store(**kwargs):
            return StoreStorage(size, host=host, port=port, td_id=f"bench-{uuid.uuid4()}", **kwargs)

        storages = {"lazy_tensor": LazyTensorStorage(size), "store": store()}
        fill_rbs = {name: _buffer(s, batch) for name, s in storages.items()}

        def filler(rb):
            def run():
                rb.empty()
                for data in chunks:
                    rb.extend(data)

            return run

        rows = []
        a, b = interleaved(filler(fill_rbs["lazy_tensor"]), filler(fill_rbs["store"]), rounds=rounds, number=1)
        rows.append((f"fill {fill} rows ({fill // chunk} x extend)", a, b))
        for prefetch in (None, 4):
            draw = {}
            for name, storage in (("lazy_tensor", LazyTensorStorage(size)), ("store", store())):
                rb = _buffer(storage, batch, prefetch)
                for data in chunks:
                    rb.extend(data)
                draw[name] = rb
            a, b = interleaved(draw["lazy_tensor"].sample, draw["store"].sample, rounds=rounds, number=number)
            label = f"sample({batch})" + ("" if prefetch is None else f", prefetch={prefetch}")
            rows.append((label, a, b))  # (the storages stay open: a prefetch may still be reading)

    print(f"StoreStorage vs LazyTensorStorage: {size} rows (obs f32[64], action f32[4], reward f32[1]), "
          f"median of {rounds} interleaved rounds{' (--quick)' if args.quick else ''}")  # fmt: skip
    print(f"{'operation':<34}{'LazyTensorStorage':>20}{'StoreStorage':>16}{'ratio':>10}")
    for label, a_s, b_s in rows:
        a_med, b_med = statistics.median(a_s), statistics.median(b_s)
        print(f"{label:<34}{a_med * 1e3:>17.3f} ms{b_med * 1e3:>13.3f} ms{median_ratio(b_s, a_s):>9.1f}x")


if __name__ == "__main__":
    main()
