"""Load: many concurrent episodes against one fleet process over streamable HTTP.

Each of N workers creates an episode on the control plane, attaches a stock MCP client to the
episode's URL, makes M tool calls (reads and a write), exports its state, and closes it. Prints
errors (target 0), the server's resident memory before, at peak during, and after, and whether
every episode was freed at the end.

usage: python benchmarks/load_http.py [--episodes 1000] [--calls 20]
"""

from __future__ import annotations

import argparse
import time

import anyio
import httpx
import httpx2
import psutil
from _util import REPO, free_port, start_http
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.progress import Progress

ENV = REPO / "envs" / "retail_orders"


async def worker(base: str, control: httpx.AsyncClient, http: httpx2.AsyncClient, calls: int, i: int) -> int:
    """Returns the number of errors this worker saw (failed calls or exceptions)."""
    errors = 0
    created = await control.post(f"{base}/control/episodes", json={"env": "retail_orders"})
    episode = created.json()
    try:
        errors += await _calls(base, episode, http, calls, i)
        state = await control.get(f"{base}/control/episodes/{episode['episode_id']}/state")
        errors += state.status_code != 200
    finally:  # free the episode even when the client failed: the test is that nothing leaks
        closed = await control.delete(f"{base}/control/episodes/{episode['episode_id']}")
        errors += closed.status_code != 200
    return errors


async def _calls(base: str, episode: dict, http: httpx2.AsyncClient, calls: int, i: int) -> int:
    errors = 0
    async with Client(streamable_http_client(base + episode["mcp_path"], http_client=http)) as client:
        for n in range(calls):
            if n == calls - 1:
                result = await client.call_tool(
                    "update_order_address",
                    {"customer_id": "C-1039", "order_id": "O-5001", "address_id": "A-2068"},
                )
                continue  # a refused write (the order is cancelled) is expected: it must not count
            name, args = (
                ("get_order", {"order_id": f"O-{5001 + (i + n) % 60}"})
                if n % 2
                else ("get_customer", {"customer_id": f"C-{1001 + (i + n) % 40}"})
            )
            result = await client.call_tool(name, args)
            errors += bool(result.is_error)
    return errors


async def main(episodes: int, calls: int) -> None:
    console = Console()
    port = free_port()
    proc = start_http(
        ["-m", "envforge.cli", "serve", str(ENV), "--port", str(port), "--max-episodes", str(episodes + 100)],
        port,
    )
    server = psutil.Process(proc.pid)
    base = f"http://127.0.0.1:{port}"
    rss_before = server.memory_info().rss
    peak = rss_before
    errors = 0
    failures: list[str] = []
    done = 0
    limits_old = httpx.Limits(max_connections=500, max_keepalive_connections=500)
    limits_new = httpx2.Limits(max_connections=3000, max_keepalive_connections=3000)
    t0 = time.perf_counter()
    try:
        async with (
            httpx.AsyncClient(limits=limits_old, timeout=120) as control,
            httpx2.AsyncClient(limits=limits_new, timeout=httpx2.Timeout(120)) as http,
        ):
            with Progress(console=console, transient=True) as progress:
                bar = progress.add_task("episodes", total=episodes)

                async def run(i: int) -> None:
                    nonlocal errors, done
                    try:
                        seen = await worker(base, control, http, calls, i)
                    except Exception as exc:
                        seen = 1
                        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
                            exc = exc.exceptions[0]
                        failures.append(f"{type(exc).__name__}: {exc}"[:200])
                    errors += seen  # after the await: `errors += await ...` would lose concurrent updates
                    done += 1
                    progress.advance(bar)

                async def sample() -> None:
                    nonlocal peak
                    while done < episodes:
                        peak = max(peak, server.memory_info().rss)
                        await anyio.sleep(0.1)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(sample)
                    for i in range(episodes):
                        tg.start_soon(run, i)
            elapsed = time.perf_counter() - t0
            stats = (await control.get(f"{base}/control/stats")).json()
        await anyio.sleep(1.0)
        rss_after = server.memory_info().rss
    finally:
        proc.terminate()
        proc.wait()
    mb = 1024 * 1024
    console.print(
        f"{episodes} concurrent episodes x {calls} calls over HTTP in {elapsed:.1f} s "
        f"({episodes * calls / elapsed:,.0f} calls/s)"
    )
    console.print(f"errors: {errors}" + (f" (first: {failures[0]})" if failures else ""))
    console.print(
        f"server RSS: before {rss_before / mb:.0f} MiB, peak {peak / mb:.0f} MiB, "
        f"after {rss_after / mb:.0f} MiB"
    )
    console.print(f"episodes: created {stats['created']}, open at the end {stats['open_episodes']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    anyio.run(main, args.episodes, args.calls)
