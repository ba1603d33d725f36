"""What a :class:`~torchrl.data.ShardedRayReplayBuffer` costs per request, and a projection to 8-64 shards.

Data: the core transitions of ``benchmarks/dataloader_workers.py`` (``obs: f32[84], action: i64, reward: f32,
("next", "obs"): f32[84], done: bool``), ``--rows`` rows in all split evenly over the shards (each shard a
``TensorDictReplayBuffer`` or a ``TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5)`` over a
``LazyTensorStorage`` of its share, random priorities), draws of ``B = --batch`` (256) items, writes of
``E = --extend-rows`` (256) rows.

Table 1, the shard's own work, in this process (``ShardHost``, the object a shard actor holds, one torch thread
as in an actor): ``a_E`` = an extend of E rows, ``a_S`` = the shard's weight (``summary``), ``a_D(k)`` = a draw of
``k`` items (the shard's share ``B / S`` of a draw over ``S`` shards; encoding for the object store included).

Table 2, Ray's cost per call: ``g(S)`` = a trivial call to each of ``S`` shards in parallel (``shard_lengths()``),
wall time and the caller's CPU time; ``h`` = the CPU time a shard's process spends per trivial call (read from
``/proc/<pid>/stat`` around ``--pipelined`` calls in flight).

Table 3, clients: ``C`` client processes (Ray actors, each holding a client from ``rb.client()``, unpickled
there) call ``extend`` (E rows, round robin: one shard per write) for ``--seconds``, then ``sample(B)`` for
``--seconds``, all clients at once. Per cell: the median round trip per call seen by a client, the CPU time per
request of a client's process and of each shard's process (``/proc``: what the actor spends per request, Ray's
own work included, e.g. serializing the reply), next to the shard's own work of table 1, and the aggregate
throughput (batches/s summed over the clients).

Table 4: the model of ``docs/source/sharding_projection.rst`` evaluated for S = 8-64 shards on as many nodes,
with constants from tables 1-3: ``h`` (a shard's CPU per call), ``kappa`` (a client's CPU per extra shard in a
fan-out: the slope of table 2's caller CPU), ``K1`` (a client's CPU per draw over one shard), ``sigma`` (a
shard's CPU per byte of its reply), the CPU of a write at its shard and its client (medians over the shard
counts measured); ``--net-ms``: latency a network hop adds per round trip; ``--net-gbps``: NIC bandwidth.

Honesty: this machine may have 2 cores for every shard, client, Ray's own processes and this driver (and
whatever else runs). Per-request CPU times (tables 1-3) are what a dedicated core would spend; round trips and
aggregate throughput with more busy processes than cores measure the cores being shared, not how the buffer
scales, so the scaling is the model's (table 4), not a measurement. ``/proc`` counts CPU in clock ticks (10 ms):
``--quick`` runs too few calls for the CPU columns to mean much.

Run: ``python benchmarks/sharded.py`` (full: 1, 2, 4 shards x 1-4 clients: 14 shard actors started in turn and
48 timed cells of ``--seconds``) or ``--quick`` (1, 2 shards x 1-2 clients, tiny sizes: 6 shard actors, 16 cells of
0.3 s; 1.5-2.5 minutes on a loaded 2-core machine, most of it starting Ray and the actors). Usage statistics
are off (``RAY_USAGE_STATS_ENABLED=0``).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before ray is imported

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from _timing import repeat  # noqa: E402  (same folder)
from tensordict import TensorDict  # noqa: E402

from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ShardedRayReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers._ray.shard_host import ShardHost  # noqa: E402

SAMPLERS = ("uniform", "prioritized")
PROJECTED_SHARDS = (8, 16, 32, 64)


def core_data(n: int) -> TensorDict:
    return TensorDict(
        {"obs": torch.randn(n, 84), "action": torch.randint(0, 4, (n,)), "reward": torch.randn(n),
         ("next", "obs"): torch.randn(n, 84), "done": torch.zeros(n, dtype=torch.bool)}, batch_size=[n])


def batch_bytes(batch: TensorDict) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values(include_nested=True, leaves_only=True))


def buffer_spec(sampler: str, capacity: int) -> tuple[type, dict]:
    storage = functools.partial(LazyTensorStorage, capacity)
    if sampler == "prioritized":
        return TensorDictPrioritizedReplayBuffer, {"alpha": 0.7, "beta": 0.5, "storage": storage}
    return TensorDictReplayBuffer, {"storage": storage}


# -- table 1: the shard's own work, in this process ------------------------------------------------------------


def actor_costs(sampler: str, rows: int, shards: int, batch: int, extend_rows: int, draw_sizes, repeats: int,
                number: int) -> dict:
    """Seconds (fastest block: the machine is shared) of a shard host's extend, summary and draws of each
    size in ``draw_sizes``, for a shard holding ``rows // shards`` rows."""
    cls, kwargs = buffer_spec(sampler, rows // shards)
    host = ShardHost(cls, (), kwargs, 0, shards)
    host.ready()
    index = host.call("extend", (core_data(rows // shards),), {})
    if sampler == "prioritized":
        host.call("update_priority", (index, torch.rand(len(index)) + 0.01), {})
    new = core_data(extend_rows)
    out = {"extend": min(repeat(lambda: host.call("extend", (new,), {}), repeats, number)),
           "summary": min(repeat(host.summary, repeats, number * 4))}
    for k in draw_sizes:
        out[("draw", k)] = min(repeat(lambda k=k: host.draw(k), repeats, number))
    return out


# -- table 3: client processes ---------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid`` (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@ray.remote(num_cpus=1)
class ClientProcess:
    """One client process: runs a client's extend or sample in a loop and reports its round trips."""

    def __init__(self) -> None:
        torch.set_num_threads(1)

    def ready(self) -> bool:
        return True

    def run(self, client, op: str, data, batch: int, start_at: float, seconds: float) -> tuple:
        """``(calls, elapsed seconds, median seconds per call, CPU seconds of this process)`` of ``op`` called
        from ``start_at`` (a ``time.time()`` shared by the clients of one measurement) for ``seconds``."""
        call = (lambda: client.extend(data)) if op == "extend" else (lambda: client.sample(batch))
        call()  # warm: the client finds the shard actors once
        while time.time() < start_at:
            time.sleep(0.001)
        latencies = []
        cpu0 = process_cpu(os.getpid())
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - t0)
            if t0 - start >= seconds:
                break
        elapsed = time.perf_counter() - start
        return len(latencies), elapsed, statistics.median(latencies), process_cpu(os.getpid()) - cpu0


def client_run(rb, pids, runners, op: str, data, batch: int, seconds: float) -> dict:
    """One measurement of ``len(runners)`` clients at once: the median round trip over the clients, the
    aggregate calls/s, and the CPU seconds per call of a client and of one shard (mean over the shards)."""
    start_at = time.time() + 0.3
    refs = [runner.run.remote(rb.client(), op, data, batch, start_at, seconds) for runner in runners]
    time.sleep(max(0.0, start_at - time.time()))  # the clients' warm-up calls are not counted
    shard_cpu0 = [process_cpu(pid) for pid in pids]
    results = ray.get(refs, timeout=seconds * 20 + 120)
    shard_cpu = sum(process_cpu(pid) for pid in pids) - sum(shard_cpu0)
    calls = sum(r[0] for r in results)
    return {"rt": statistics.median(r[2] for r in results), "rate": sum(r[0] / r[1] for r in results),
            "client_cpu": sum(r[3] for r in results) / calls, "shards_cpu": shard_cpu / calls,
            "shard_cpu": shard_cpu / calls / len(pids)}


def fill(rb: ShardedRayReplayBuffer, sampler: str, rows: int) -> None:
    per_shard = rows // rb.num_shards
    for s in range(rb.num_shards):
        index = rb.extend(core_data(per_shard), shard=s)
        if sampler == "prioritized":
            rb.update_priority(index, torch.rand(per_shard) + 0.01)


def ray_overheads(rb: ShardedRayReplayBuffer, pids, repeats: int, number: int, pipelined: int) -> dict:
    """``g``: wall time of a trivial call to every shard in parallel (``shard_lengths()``), ``g_cpu``: this
    process's CPU time for it; ``h``: the CPU time one shard process spends per trivial call (``summary``,
    ``pipelined`` calls in flight), read from ``/proc``."""
    g = min(repeat(rb.shard_lengths, repeats, number))
    cpu0 = time.process_time()
    for _ in range(repeats * number):
        rb.shard_lengths()
    g_cpu = (time.process_time() - cpu0) / (repeats * number)
    handle = ray.get_actor(rb.actor_names[0], namespace=rb.namespace)
    ray.get([handle.summary.remote() for _ in range(pipelined)])
    cpu0 = process_cpu(pids[0])
    ray.get([handle.summary.remote() for _ in range(pipelined * repeats)])
    h = (process_cpu(pids[0]) - cpu0) / (pipelined * repeats)
    return {"g": g, "g_cpu": g_cpu, "h": h}


# -- the model -------------------------------------------------------------------------------------------------


def fit_line(xs, ys) -> tuple[float, float]:
    """``(intercept, slope)`` of a least-squares line (slope 0 with one point); the slope clipped at >= 0."""
    if len(set(xs)) < 2:
        return float(statistics.mean(ys)), 0.0
    slope, _ = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    slope = max(float(slope), 0.0)
    return float(statistics.mean(ys)) - slope * float(statistics.mean(xs)), slope


def projection(c: dict, sampler: str, args) -> list[dict]:
    """The model's rows for S in PROJECTED_SHARDS (formulas: docs/source/sharding_projection.rst)."""
    net = args.net_ms / 1e3
    nic = args.net_gbps * 1e9 / 8 / c["batch_bytes"]  # batches/s one node's NIC carries
    rows = []
    for S in PROJECTED_SHARDS:
        k = max(1, round(args.batch / S))
        # A(S): each shard's CPU per draw (every shard, every draw): two calls, the summary, a draw of B/S items,
        # and sending its share W/S of the batch's bytes.
        shard_busy = (2 * c["h"] + c["summary", sampler] + c["draw", sampler][k]
                      + c["sigma", sampler] * c["batch_bytes"] / S)
        client_cpu = c["K1", sampler] + 2 * c["kappa"] * (S - 1)  # K(S): the client's CPU per draw
        latency = client_cpu + shard_busy + 2 * net
        shard_cap = 1.0 / shard_busy
        client_rate = min(1.0 / latency, nic)
        at_s = min(S * client_rate, shard_cap)
        write_cap = S / c["write_shard", sampler]
        first = "shards: every draw costs every shard A(S)" if shard_cap < S * client_rate else \
            "clients: fan-out to S shards per draw"
        rows.append({"S": S, "k": k, "shard_busy": shard_busy, "client_cpu": client_cpu,
                     "latency": latency, "client_rate": client_rate, "shard_cap": shard_cap,
                     "needed": math.ceil(shard_cap / client_rate), "at_s": at_s, "write_cap": write_cap,
                     "write_client": 1.0 / (c["write_client", sampler] + c["write_shard", sampler] + 2 * net),
                     "first": first})
    return rows


# -- main ------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: 1, 2 shards x 1-2 clients")
    parser.add_argument("--rows", type=int, default=100_000, help="rows in all, split over the shards")
    parser.add_argument("--batch", type=int, default=256, help="B: items per draw")
    parser.add_argument("--extend-rows", type=int, default=256, help="E: rows per write")
    parser.add_argument("--seconds", type=float, default=0.8, help="client measurement time per cell and op")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--repeats", type=int, default=5, help="blocks of in-process timings (fastest kept)")
    parser.add_argument("--number", type=int, default=40, help="calls per block of in-process timings")
    parser.add_argument("--pipelined", type=int, default=200, help="trivial calls in flight to measure h")
    parser.add_argument("--net-ms", type=float, default=0.1,
                        help="projection: latency a network hop adds per round trip (ms)")
    parser.add_argument("--net-gbps", type=float, default=10.0, help="projection: NIC bandwidth of a node (Gb/s)")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.seconds, args.shards, args.clients = 8_000, 0.3, [1, 2], [1, 2]
        args.repeats, args.number, args.pipelined = 3, 10, 50
    t_start = time.perf_counter()
    torch.manual_seed(0)
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    share = {S: max(1, round(args.batch / S)) for S in args.shards}
    draw_sizes = sorted({*share.values(), *(max(1, round(args.batch / S)) for S in PROJECTED_SHARDS)}, reverse=True)

    # Table 1: in this process, one torch thread (an actor's setting).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    c: dict = {"batch_bytes": batch_bytes(core_data(args.batch))}
    actor = {}
    for sampler in SAMPLERS:
        for S in args.shards:
            sizes = draw_sizes if S == max(args.shards) else [share[S]]
            actor[sampler, S] = actor_costs(sampler, args.rows, S, args.batch, args.extend_rows, sizes,
                                            args.repeats, args.number)
        largest = actor[sampler, max(args.shards)]
        c["extend", sampler] = largest["extend"]
        c["summary", sampler] = largest["summary"]
        c["draw", sampler] = {k: largest["draw", k] for k in draw_sizes}
    torch.set_num_threads(threads)

    # Tables 2 and 3: Ray.
    ray.init(num_cpus=max(args.shards) + max(args.clients) + 1, include_dashboard=False, log_to_driver=False)
    clients: dict = {}
    overheads: dict = {}
    try:
        runners = [ClientProcess.remote() for _ in range(max(args.clients))]
        ray.get([r.ready.remote() for r in runners], timeout=300)
        extend_data = core_data(args.extend_rows)
        for sampler in SAMPLERS:
            for S in args.shards:
                cls, kwargs = buffer_spec(sampler, args.rows // S)
                rb = ShardedRayReplayBuffer(num_shards=S, replay_buffer_cls=cls, batch_size=args.batch,
                                            remote_config={"num_cpus": 1}, **kwargs)
                try:
                    fill(rb, sampler, args.rows)
                    rb.sample()
                    pids = rb.shard_pids()
                    if sampler == SAMPLERS[0]:
                        overheads[S] = ray_overheads(rb, pids, args.repeats, args.number, args.pipelined)
                    for C in args.clients:
                        for op, data in (("extend", extend_data), ("sample", None)):
                            clients[sampler, S, C, op] = client_run(rb, pids, runners[:C], op, data, args.batch,
                                                                    args.seconds)
                finally:
                    rb.close()
    finally:
        ray.shutdown()

    # Constants of the model (docs/source/sharding_projection.rst). Medians over the shard counts measured, so
    # that one stalled cell (a shared machine) does not bend them.
    c["h"] = statistics.median(o["h"] for o in overheads.values())  # a shard's CPU per call
    _, c["kappa"] = fit_line(list(overheads), [o["g_cpu"] for o in overheads.values()])  # a client's CPU per call
    for sampler in SAMPLERS:
        one = {S: clients[sampler, S, 1, "sample"] for S in args.shards}
        # K(S) = K1 + 2 kappa (S - 1): the client's CPU per draw, two fan-outs to S shards.
        c["K1", sampler] = statistics.median(one[S]["client_cpu"] - 2 * c["kappa"] * (S - 1) for S in args.shards)
        # sigma: a shard's CPU per byte it sends, what its CPU per draw leaves beyond two calls and its own work.
        c["sigma", sampler] = statistics.median(
            max(0.0, one[S]["shard_cpu"] - 2 * c["h"] - actor[sampler, S]["summary"]
                - actor[sampler, S]["draw", share[S]]) * S / c["batch_bytes"] for S in args.shards)
        writes = [clients[sampler, S, 1, "extend"] for S in args.shards]
        c["write_shard", sampler] = statistics.median(m["shards_cpu"] for m in writes)
        c["write_client", sampler] = statistics.median(m["client_cpu"] for m in writes)

    ms = 1e3
    quick = ", --quick sizes" if args.quick else ""
    print(f"\nShardedRayReplayBuffer per-request costs ({cores} cores, load average {load:.1f} at the start{quick}; "
          f"{args.rows} core rows split over the shards; B={args.batch} items per draw, E={args.extend_rows} rows "
          f"per write; {c['batch_bytes'] / 1e3:.0f} kB per batch of B)")
    print("\nTable 1. A shard's own work per request, in this process (ShardHost, 1 torch thread; fastest of "
          f"{args.repeats} blocks; ms)\n")
    print("| sampler | shards S | rows/shard | a_E: extend E rows | a_S: summary | a_D(B/S): draw B/S | "
          "a_S + a_D(B/S) |")
    print("|---|---|---|---|---|---|---|")
    for sampler in SAMPLERS:
        for S in args.shards:
            a = actor[sampler, S]
            d = a["draw", share[S]]
            print(f"| {sampler} | {S} | {args.rows // S} | {a['extend'] * ms:.3f} | {a['summary'] * ms:.3f} | "
                  f"{d * ms:.3f} | {(a['summary'] + d) * ms:.3f} |")
    print(f"\na_D(k) on a shard of {args.rows // max(args.shards)} rows (ms): " + "; ".join(
        f"{sampler}: " + ", ".join(f"k={k}: {c['draw', sampler][k] * ms:.3f}" for k in draw_sizes)
        for sampler in SAMPLERS))
    print("\nTable 2. Ray's cost per call (ms). g(S): a trivial call to each of S shards in parallel, wall time "
          "(fastest block) and the caller's CPU; h: a shard process's CPU per trivial call (from /proc)\n")
    print("| shards S | g(S) wall | g(S) caller CPU | h |")
    print("|---|---|---|---|")
    for S, o in overheads.items():
        print(f"| {S} | {o['g'] * ms:.3f} | {o['g_cpu'] * ms:.3f} | {o['h'] * ms:.3f} |")
    print(f"\nTable 3. C client processes at once (Ray actors, each with a client from rb.client()). Round trip: "
          f"median per call seen by a client; CPU per request: a client's process and one shard's process (mean "
          f"over the shards), from /proc; aggregate: batches/s summed over the clients. The {cores} cores are "
          f"shared by S shard actors, C clients, Ray and everything else running: past {cores} busy processes the "
          f"aggregate shows the cores being shared, not how the buffer scales.\n")
    print("| sampler | S | C | op | round trip (ms) | client CPU/request (ms) | shard CPU/request, per shard (ms) | "
          "shard's own work (ms, table 1) | aggregate (batches/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sampler in SAMPLERS:
        for S in args.shards:
            a = actor[sampler, S]
            own = {"extend": a["extend"] / S, "sample": a["summary"] + a["draw", share[S]]}
            for C in args.clients:
                for op in ("extend", "sample"):
                    m = clients[sampler, S, C, op]
                    print(f"| {sampler} | {S} | {C} | {op} | {m['rt'] * ms:.3f} | {m['client_cpu'] * ms:.3f} | "
                          f"{m['shard_cpu'] * ms:.3f} | {own[op] * ms:.3f} | {m['rate']:.0f} |")
    print("\n(extend: one shard per write, so a shard's share is 1/S of a write: its own work a_E / S per request.)")
    print(f"\nModel constants (ms; table 2 and the one-client rows of table 3): h = {c['h'] * ms:.3f}, "
          f"kappa = {c['kappa'] * ms:.3f} (a client's CPU per extra shard per fan-out); " + "; ".join(
              f"{s}: K1 = {c['K1', s] * ms:.3f}, sigma*W = {c['sigma', s] * c['batch_bytes'] * ms:.3f} "
              f"(a shard's CPU to send a whole batch), write CPU: shard w_s = {c['write_shard', s] * ms:.3f}, "
              f"client w_c = {c['write_client', s] * ms:.3f}" for s in SAMPLERS)
          + "; a_S, a_D(k): table 1.")
    fill_note = "; --quick constants: TO FILL from the full run" if args.quick else ""
    print(f"\nTable 4. Projection to S shards on S nodes, one client per node, B={args.batch} (model of "
          f"docs/source/sharding_projection.rst; network {args.net_ms:g} ms per round trip, {args.net_gbps:g} Gb/s "
          f"NICs{fill_note})\n")
    print("| sampler | S | B/S | A(S): shard CPU per draw (ms) | K(S): client CPU per draw (ms) | L(S): draw "
          "latency (ms) | draws/s per client | draw cap, all shards (draws/s) | clients to reach it | draws/s, C=S "
          "clients | writes/s per client | write cap (writes of E/s) | saturates first (C=S) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for sampler in SAMPLERS:
        for r in projection(c, sampler, args):
            print(f"| {sampler} | {r['S']} | {r['k']} | {r['shard_busy'] * ms:.3f} | {r['client_cpu'] * ms:.3f} | "
                  f"{r['latency'] * ms:.2f} | {r['client_rate']:.0f} | {r['shard_cap']:.0f} | {r['needed']} | "
                  f"{r['at_s']:.0f} | {r['write_client']:.0f} | {r['write_cap']:.0f} | {r['first']} |")
    print(f"\n(total {time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
