"""RemoteTensorDictReplayBuffer over torch.distributed.rpc: two processes on 127.0.0.1 (TensorPipe)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import socket

import pytest
from _rpc_helpers import rpc_client, rpc_owner

torch_distributed = pytest.importorskip("torch.distributed")
if not torch_distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_remote_buffer_is_written_and_sampled_over_rpc():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=fn, args=(port, results)) for fn in (rpc_owner, rpc_client)]
    for p in procs:
        p.start()
    reports = {}
    try:
        for _ in procs:
            who, report = results.get(timeout=90)
            reports[who] = report
    except queue.Empty:
        pytest.fail(f"rpc processes did not report in time; got {reports}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    assert reports["owner"] == "ok", reports["owner"]
    seen = reports["client"]
    assert isinstance(seen, dict), seen
    assert seen["owner_name"] == "owner"
    assert seen["extend_index"] == list(range(10))
    assert seen["add_index"] == 10 and seen["len"] == 11
    assert len(seen["batch_obs"]) == 8
    assert all(obs == index + 10 for obs, index in zip(seen["batch_obs"], seen["batch_index"]))
    assert seen["sample_3"] == 3 and "index" in seen["info_keys"]
    assert seen["write_count"] == 11
    assert seen["bad_extend"] is not None and "TensorDict" in seen["bad_extend"]
    assert seen["owner_content"] == list(range(10, 21))
