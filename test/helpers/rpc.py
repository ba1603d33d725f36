"""Child processes of the rpc test in compat/test_compat_names.py: an rpc owner of a RemoteTensorDictReplayBuffer
and a client.

They live in their own module so that ``spawn`` children import them without importing a test module.
Everything stays on 127.0.0.1: TensorPipe is told to use the loopback interface only.
"""

from __future__ import annotations

import os
import traceback


def _init_rpc(name: str, rank: int, port: int) -> None:
    os.environ["TP_SOCKET_IFNAME"] = "lo"  # TensorPipe's sockets on the loopback interface only
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from torch.distributed import rpc

    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=4, rpc_timeout=60
    )
    rpc.init_rpc(name, rank=rank, world_size=2, rpc_backend_options=options)


def rpc_owner(port: int, results) -> None:
    """Rank 0: hosts whatever the client builds on it, then waits for the client to finish."""
    try:
        # import before serving: rpc threads unpickling the first requests concurrently would import it twice
        import torchrl.data  # noqa: F401

        _init_rpc("owner", 0, port)
        from torch.distributed import rpc

        rpc.shutdown()  # graceful: waits until every rank is done
        results.put(("owner", "ok"))
    except BaseException:  # reported to the test, which fails with the traceback
        results.put(("owner", traceback.format_exc()))


def rpc_client(port: int, results) -> None:
    """Rank 1: builds a buffer on the owner, writes and samples through rpc, reports what it saw."""
    started = False
    try:
        _init_rpc("client", 1, port)
        started = True
        import torch
        from tensordict import TensorDict
        from torch.distributed import rpc

        from torchrl.data import LazyTensorStorage, RemoteTensorDictReplayBuffer

        buffer = RemoteTensorDictReplayBuffer
        rref = rpc.remote("owner", buffer, kwargs={"storage": LazyTensorStorage(100), "batch_size": 8})
        owner = rref.owner()
        seen = {"owner_name": owner.name}
        data = TensorDict(obs=torch.arange(10, 20), batch_size=[10])
        seen["extend_index"] = rpc.rpc_sync(owner, buffer.extend, args=(rref, data)).tolist()
        seen["caller_index"] = data["index"].tolist() if "index" in data.keys() else None
        seen["add_index"] = int(rpc.rpc_sync(owner, buffer.add, args=(rref, TensorDict(obs=torch.tensor(20)))))
        seen["len"] = rpc.rpc_sync(owner, buffer.__len__, args=(rref,))
        batch = rpc.rpc_sync(owner, buffer.sample, args=(rref,))
        seen["batch_obs"] = batch["obs"].tolist()
        seen["batch_index"] = batch["index"].tolist()
        batch, info = rpc.rpc_sync(owner, buffer.sample, args=(rref, 3), kwargs={"return_info": True})
        seen["info_keys"] = sorted(info)
        seen["sample_3"] = batch["obs"].shape[0]
        seen["write_count"] = rpc.rpc_sync(owner, buffer.state_dict, args=(rref,))["_storage"]["_len"]
        try:
            rpc.rpc_sync(owner, buffer.extend, args=(rref, torch.zeros(3)))
            seen["bad_extend"] = None
        except TypeError as err:
            seen["bad_extend"] = str(err)
        # the buffer lives on the owner: a local copy of it sees the same content there
        seen["owner_content"] = rref.to_here()[:]["obs"].tolist()
        del rref
        results.put(("client", seen))
    except BaseException:
        results.put(("client", traceback.format_exc()))
    finally:
        if started:
            from torch.distributed import rpc

            rpc.shutdown()  # lets the owner's graceful shutdown return, even after a failure
