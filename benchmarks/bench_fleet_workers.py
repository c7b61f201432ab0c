"""Calls/s and episodes in flight with 1, 2, ... worker processes behind one URL (`serve --workers N`).

For each N: start the fleet (N = 0 means one plain `envforge serve` process, no front: the
baseline the front's own cost is measured against), open `--episodes` episodes through its one
URL and keep them open, then let `--callers` concurrent stock MCP clients, each on an episode of
its own, call `get_customer` for `--seconds`. Prints calls/s, its ratio to one worker, the
front's overhead per call against the plain server, the episodes held and the errors (target 0).

With `--ray`, each N > 0 is measured again with the workers in Ray actors (`serve --ray`) on a local
multi-node cluster (`ray.cluster_utils.Cluster`: a head with no CPU, one 1-CPU node per worker), the
many-machine path on one machine: the ratio printed is to the same N as local child processes.

usage: python benchmarks/bench_fleet_workers.py [--workers 0,1,2] [--callers 32] [--seconds 10]
       [--episodes 1000] [--ray]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import httpx
import httpx2
from _util import PY, REPO, child_env, free_port
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ENV = REPO / "envs" / "retail_orders"


def start(workers: int, port: int, ray_address: str | None = None) -> subprocess.Popen[bytes]:
    """The fleet on `port`: plain `serve` for 0 workers, else the front with `workers` processes
    (for 1 too, unlike the CLI, whose `--workers 1` is the plain server), in Ray actors of the
    cluster at `ray_address` if given."""
    if workers == 0:
        args = [
            "-m",
            "envforge.cli",
            "serve",
            str(ENV),
            "--port",
            str(port),
            "--max-episodes-per-client",
            "100000",
            "--max-episode-mib-per-client",
            str(1 << 20),
        ]
    else:
        code = (
            "import sys; from envforge.server import build_front, serve_http, HTTPLimits;"
            "from envforge import listening_socket;"
            f"app, _ = build_front([{str(ENV)!r}], {workers},"
            f" max_episodes=10**5, max_episodes_per_client=10**5, max_episode_bytes_per_client=1 << 40,"
            f" ray_address={ray_address!r});"
            f"sock = listening_socket('127.0.0.1', {port});"
            f"serve_http(app, host='127.0.0.1', port={port}, limits=HTTPLimits(), sock=sock)"
        )
        args = ["-c", code]
    proc = subprocess.Popen([PY, *args], cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"fleet with {workers} workers did not start")


async def measure(base: str, callers: int, seconds: float, episodes: int) -> tuple[float, int, int]:
    """(calls/s, episodes held, errors)."""
    errors = 0
    held: list[dict] = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as control:
        gate = anyio.Semaphore(32)

        async def create() -> None:
            nonlocal errors
            async with gate:
                made = await control.post("/control/episodes", json={"env": "retail_orders"})
                if made.status_code == 201:
                    held.append(made.json())
                else:
                    errors += 1

        async with anyio.create_task_group() as tg:
            for _ in range(max(episodes, callers)):
                tg.start_soon(create)
        calls = 0
        stop = time.monotonic() + seconds
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:

            async def call(episode: dict, i: int) -> None:
                nonlocal calls, errors
                url = base + episode["mcp_path"]
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    n = 0
                    while time.monotonic() < stop:
                        result = await client.call_tool(
                            "get_customer", {"customer_id": f"C-{1001 + (i + n) % 40}"}
                        )
                        errors += bool(result.is_error)
                        calls += 1
                        n += 1

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for i, episode in enumerate(held[:callers]):
                    tg.start_soon(call, episode, i)
            elapsed = time.monotonic() - started
        open_now = (await control.get("/control/stats")).json()["open_episodes"]
        for episode in held:
            closed = await control.delete(f"/control/episodes/{episode['episode_id']}")
            errors += closed.status_code != 200
    return calls / elapsed, open_now, errors


def run_one(workers: int, args: argparse.Namespace, ray_address: str | None = None) -> tuple[float, int, int]:
    """(calls/s, episodes held, errors) of a fleet started for this measurement alone."""
    port = free_port()
    proc = start(workers, port, ray_address)
    try:
        return anyio.run(measure, f"http://127.0.0.1:{port}", args.callers, args.seconds, args.episodes)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="0,1,2", help="comma-separated; 0: plain serve, no front")
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument(
        "--ray", action="store_true", help="each N > 0 also in Ray actors on a local cluster, right after"
    )
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.1f}")
    with local_cluster(max(counts) if args.ray else 0) as ray_address:
        rates: dict[int, float] = {}
        for workers in counts:
            rate, held, errors = run_one(workers, args)
            rates[workers] = rate
            name = "plain serve (no front)" if workers == 0 else f"{workers} worker(s) behind the front"
            ratio = f", {rate / rates[1]:.2f}x one worker" if 1 in rates and workers > 1 else ""
            print(f"{name}: {rate:,.0f} calls/s{ratio}; {held} episodes held open; {errors} errors")
            if ray_address is not None and workers > 0:
                rate, held, errors = run_one(workers, args, ray_address)
                print(
                    f"{workers} worker(s) in Ray actors behind the front: {rate:,.0f} calls/s, "
                    f"{rate / rates[workers]:.2f}x the same {workers} local; {held} episodes held open; "
                    f"{errors} errors"
                )
    if 0 in rates and 1 in rates:
        overhead = (1 / rates[1] - 1 / rates[0]) * 1e3
        print(f"the front's cost per call: {overhead:+.2f} ms of machine time (1 worker behind it vs plain)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


@contextmanager
def local_cluster(nodes: int) -> Iterator[str | None]:
    """A local Ray cluster of a head with no CPU and `nodes` 1-CPU nodes (its address); None for 0."""
    if nodes == 0:
        yield None
        return
    from ray.cluster_utils import Cluster

    os.environ["RAY_worker_niceness"] = "0"  # Ray's default, 15, would put its workers behind the local ones
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
