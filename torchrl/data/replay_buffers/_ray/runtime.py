"""The Ray runtime as :class:`~torchrl.data.RayReplayBuffer` uses it: the import, who starts and stops it, how
another process joins the same cluster, and the refusal to use it in a forked child.

- Ray is imported here only, on first use (:func:`import_ray`): importing ``torchrl.data`` never imports it.
- :class:`RuntimeLease`: ``ray.init`` runs only when Ray is not initialized yet, and ``ray.shutdown`` only when
  the last buffer that started it is closed (buffers of one process share the runtime they found or started).
  A runtime started here reports no usage statistics (``RAY_USAGE_STATS_ENABLED=0`` unless the environment
  sets it).
- :func:`connect`: a process that receives a client (a spawned DataLoader worker, a process of its own) joins
  the cluster whose address the client carries, never a new local one.
- Fork: a child forked from a process connected to Ray inherits the connection's state but not its threads,
  and any Ray call there hangs (a known Ray limitation). :func:`check_not_forked` raises instead.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

__all__ = ["RuntimeLease", "check_not_forked", "connect", "dead_actor_error", "import_ray"]

_INSTALL_HINT = "pip install 'torchrl[ray]' (the `ray` extra) or pip install ray"

# Set in a child forked from a process connected to Ray (see _after_fork_in_child).
_FORKED_FROM_RAY = False


def import_ray():
    """The ``ray`` module; ``ImportError`` naming the ``ray`` extra when it is not installed."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(f"RayReplayBuffer needs Ray, which is not installed here: {_INSTALL_HINT}.") from err
    return ray


def _after_fork_in_child() -> None:
    global _FORKED_FROM_RAY
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", None) is not None and ray.is_initialized():
        _FORKED_FROM_RAY = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked(what: str) -> None:
    """Raises if this process was forked from a process connected to Ray (its Ray calls would hang)."""
    if _FORKED_FROM_RAY:
        raise RuntimeError(
            f"{what} cannot be used in a process forked from a process connected to Ray: Ray calls in a forked "
            f"child hang (a known Ray limitation). Start the process with 'spawn' or 'forkserver' instead, e.g. "
            f"DataLoader(..., multiprocessing_context='spawn'), or pass a client to a Ray task or actor."
        )


def connect(ray, address: str | None, namespace: str | None) -> None:
    """Joins the cluster at ``address`` unless this process is connected to Ray already."""
    if ray.is_initialized():
        return
    if address is None:
        raise RuntimeError(
            "This RayReplayBuffer client does not know the address of its Ray cluster and Ray is not initialized "
            "in this process: call ray.init(address=...) first."
        )
    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)


def dead_actor_error(name: str, namespace: str | None, cause: BaseException | str) -> RuntimeError:
    """The error of a call to a replay-buffer actor that is dead (killed, crashed, or its owner exited)."""
    reason = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    return RuntimeError(
        f"The replay buffer's Ray actor {name!r} (namespace {namespace!r}) is dead ({reason}). Its data is lost "
        f"unless it was saved with dumps(). Build a new RayReplayBuffer (and loads() the last checkpoint into "
        f"it), then hand new clients to the collectors and learners."
    )


def ray_shut_down_error(name: str, address: str | None) -> RuntimeError:
    """The error of a client call after ``ray.shutdown()`` in this process (its actor handle is of that cluster)."""
    where = f"ray.init(address={address!r})" if address else "ray.init(address=...) with the cluster's address"
    return RuntimeError(
        f"Ray was shut down in this process (ray.shutdown()) after this client reached the replay buffer's actor "
        f"{name!r}, so the client has no cluster to call; nothing was sent. If that cluster still runs, reconnect "
        f"with {where} and build a new client with pickle or rb.client(); if it was shut down, the buffer is gone: "
        f"build a new RayReplayBuffer (and loads() its last checkpoint)."
    )


class RuntimeLease:
    """Reference-counted use of the Ray runtime by the buffers of this process.

    :meth:`acquire` starts Ray (``ray.init(**config)``) only when it is not initialized, and :meth:`release`
    shuts it down only when the last holder lets go of a runtime that a lease started.
    """

    _lock = threading.Lock()
    _holders = 0
    _started = False

    @classmethod
    def acquire(cls, ray, config: dict) -> None:
        with cls._lock:
            if not ray.is_initialized():
                # A cluster started for a buffer reports no usage statistics unless the user asked for them.
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(**config)
                cls._started = True
            cls._holders += 1

    @classmethod
    def release(cls, ray) -> None:
        with cls._lock:
            cls._holders = max(cls._holders - 1, 0)
            if cls._holders == 0 and cls._started:
                cls._started = False
                if ray.is_initialized():
                    ray.shutdown()

    @classmethod
    def started_by_lease(cls) -> bool:
        """Whether the runtime in use was started by a lease (and will be shut down by the last release)."""
        return cls._started
