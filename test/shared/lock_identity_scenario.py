"""One run of writer processes sharing a buffer whose creator goes away first (run as a script by
``test_lock_identity.py``).

``python lock_identity_scenario.py METHOD N_WRITERS ROWS SCENARIO OUT_DIR``: the main process builds a shared
buffer, starts ``N_WRITERS`` writer processes (start method ``METHOD``), each writing
``ROWS`` tagged rows (writer id, sequence number, a payload and the CRC32 of that payload), then:

- ``join``: joins them explicitly;
- ``exit``: returns, leaving multiprocessing to join them at interpreter exit (after the lock file is removed);
- ``sigterm``: sends itself SIGTERM (its cleanup removes the lock file; it dies, its writers live on);
- ``del``: drops its buffer (``del rb``: the lock file is removed) while the writers run, then joins them.

The writers start writing together (a barrier of ``ready-<id>`` files). Each marks its end with a file
``done-<id>`` naming the inode of the lock file it held; writer 0 then checks: it waits for all of them,
reads the buffer, and writes ``result.json``: rows stored, missing, duplicated and torn, and how many locks the writers held. The main process writes ``parent.json``
(whether the lock file existed after the scenario's removal step).
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import signal
import sys
import time
import zlib

import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

WIDTH = 8
BATCH = 5
SEED_ROWS = 2  # rows written by the main process before the writers start (writer id 99)


def tagged(writer: int, start: int, n: int) -> TensorDict:
    seq = torch.arange(start, start + n)
    payload = (writer * 1_000_003 + seq).double().unsqueeze(-1) * 7.0 + torch.arange(
        WIDTH, dtype=torch.float64
    )
    crc = torch.tensor([zlib.crc32(row.numpy().tobytes()) for row in payload], dtype=torch.int64)
    return TensorDict(
        {"writer": torch.full((n,), writer), "seq": seq, "payload": payload, "crc": crc}, batch_size=[n]
    )


def _wait_for(paths: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.02)


def write(rb, writer: int, n_writers: int, rows: int, out: str) -> None:
    # a barrier made of files (the main process may be gone): the writers overlap, so a split lock shows
    open(os.path.join(out, f"ready-{writer}"), "w").close()
    _wait_for([os.path.join(out, f"ready-{w}") for w in range(n_writers)], 60.0)
    for start in range(0, rows, BATCH):
        rb.extend(tagged(writer, start, min(BATCH, rows - start)))
    lock = rb.write_lock  # which lock this writer took: the inode of the file it holds open
    with open(os.path.join(out, f"done-{writer}.tmp"), "w") as f:
        json.dump({"lock_inode": os.fstat(lock._fd).st_ino}, f)
    os.replace(os.path.join(out, f"done-{writer}.tmp"), os.path.join(out, f"done-{writer}"))
    if writer == 0:  # the first writer is also the checker (one process less to start)
        check(rb, n_writers, rows, out, 120.0)


def check(rb, n_writers: int, rows: int, out: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(out, f"done-{w}")) for w in range(n_writers)):
            break
        time.sleep(0.05)
    inodes = []
    for w in range(n_writers):
        try:
            with open(os.path.join(out, f"done-{w}")) as f:
                inodes.append(json.load(f)["lock_inode"])
        except (OSError, ValueError):
            pass
    data = rb[:]
    torn = sum(
        zlib.crc32(payload.numpy().tobytes()) != crc
        for payload, crc in zip(data["payload"], data["crc"].tolist())
    )
    stored = list(zip(data["writer"].tolist(), data["seq"].tolist()))
    expected = [(99, s) for s in range(SEED_ROWS)] + [(w, s) for w in range(n_writers) for s in range(rows)]
    missing = len(set(expected) - set(stored))
    result = {
        "writers_done": len(inodes),
        "lock_inodes": len(set(inodes)),
        "len": len(rb),
        "stored": len(stored),
        "missing": missing,
        "duplicated": len(stored) - len(set(stored)),
        "torn": int(torn),
    }
    with open(os.path.join(out, "result.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(out, "result.json.tmp"), os.path.join(out, "result.json"))


def main(method: str, n_writers: int, rows: int, scenario: str, out: str) -> None:
    ctx = mp.get_context(method)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(SEED_ROWS + n_writers * rows), batch_size=4, shared=True
    )
    rb.extend(tagged(99, 0, SEED_ROWS))  # a lazy storage allocates at its first write: here
    lock_path = rb.write_lock.path
    writers = [ctx.Process(target=write, args=(rb, w, n_writers, rows, out)) for w in range(n_writers)]
    for p in writers:
        p.start()

    def report(**fields) -> None:
        with open(os.path.join(out, "parent.json"), "w") as f:
            json.dump({"lock_path": lock_path, **fields}, f)

    if scenario == "join":
        for p in writers:
            p.join(150)
        report(lock_file_existed=os.path.exists(lock_path))
    elif scenario == "exit":
        report(lock_file_existed=os.path.exists(lock_path))  # multiprocessing joins them after atexit cleanup
    elif scenario == "sigterm":
        report(lock_file_existed=os.path.exists(lock_path))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # not reached: the default action ends this process
    elif scenario == "del":
        del rb
        gc.collect()
        report(lock_file_existed=os.path.exists(lock_path))  # False: the buffer and its lock are gone
        for p in writers:
            p.join(150)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
