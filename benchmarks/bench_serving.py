"""Serving speed: envforge vs a bare `mcp` server doing the same aiosqlite query, same run.

Prints tool calls/s for one env in-process, over stdio and over streamable HTTP, with 1 and 32
concurrent episodes (the bare server has no episodes: its 32 workers share its one connection),
and episode creation time for a ~1 MB database next to building the same database naively.
Target: >= 0.8x the bare server on every transport; episode creation < 2 ms.
The same env served confined (`trust = "confined"`: tools in a sandboxed worker, SQL served by
the parent) is measured in the same run next to the trusted in-process path and the bare server.
Target: confined >= 0.5x trusted.

usage: python benchmarks/bench_serving.py [--calls N] [--confined-only]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import httpx
from _util import PY, REPO, free_port, start_http
from bare_server import BANK, build_bare_server
from mcp import Client, StdioServerParameters
from rich.console import Console
from rich.table import Table

from envforge.server import EPISODE_META_KEY, Fleet, load_env

ARGS = {"account_id": "A-1"}
Caller = Callable[[int], Awaitable[None]]


async def rate(workers: int, total_calls: int, make_caller: Callable[[int], Awaitable[Caller]]) -> float:
    """Calls/s with `workers` concurrent callers sharing `total_calls` (connection setup excluded)."""
    callers = [await make_caller(i) for i in range(workers)]
    per_worker = max(1, total_calls // workers)

    async def run(caller: Caller) -> None:
        for i in range(per_worker):
            await caller(i)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for caller in callers:
            tg.start_soon(run, caller)
    return per_worker * workers / (time.perf_counter() - t0)


def _check(result: Any) -> None:
    if result.is_error:
        raise RuntimeError(result.content[0].text)


def confined_copy(root: Path) -> Path:
    """The bank env as a confined one: same files, `trust = "confined"` in its manifest."""
    target = root / "bank"
    shutil.copytree(BANK, target)
    manifest = (target / "env.toml").read_text()
    (target / "env.toml").write_text(
        manifest.replace('version = "0.1.0"\n', 'version = "0.1.0"\ntrust = "confined"\n')
    )
    return target


async def confined_in_process(workers: int, calls: int) -> tuple[float, float, float]:
    """Calls/s of the confined env, the trusted env and the bare server, in-process, same run."""
    with tempfile.TemporaryDirectory() as tmp:
        confined_env = load_env(confined_copy(Path(tmp)))
    assert confined_env.manifest.trust == "confined"
    fleet = Fleet([confined_env])
    async with Client(fleet.mcp(confined_env.name).server) as client:

        async def caller(i: int) -> Caller:
            meta = {EPISODE_META_KEY: (await fleet.create_episode(confined_env.name)).id}

            async def call(_: int) -> None:
                _check(await client.call_tool("get_account", ARGS, meta=meta))

            return call

        await rate(1, 200, caller)  # starts the worker
        r_confined = await rate(workers, calls, caller)
    await fleet.aclose()
    r_trusted, r_bare = await in_process(workers, calls)
    return r_confined, r_trusted, r_bare


async def in_process(workers: int, calls: int) -> tuple[float, float]:
    env = load_env(BANK)
    fleet = Fleet([env])
    bare, bare_conn = build_bare_server(env.seed_db)
    async with Client(fleet.mcp(env.name).server) as ours, Client(bare) as theirs:

        async def ours_caller(i: int) -> Caller:
            meta = {EPISODE_META_KEY: (await fleet.create_episode(env.name)).id}

            async def call(_: int) -> None:
                _check(await ours.call_tool("get_account", ARGS, meta=meta))

            return call

        async def bare_caller(i: int) -> Caller:
            async def call(_: int) -> None:
                _check(await theirs.call_tool("get_account", ARGS))

            return call

        await rate(1, 200, bare_caller)  # warm both paths
        await rate(1, 200, ours_caller)
        r_bare = await rate(workers, calls, bare_caller)
        r_ours = await rate(workers, calls, ours_caller)
    await fleet.aclose()
    for conn in bare_conn:  # its thread is not a daemon: left open, it would hold the process at exit
        await conn.close()
    return r_ours, r_bare


async def stdio(workers: int, calls: int) -> tuple[float, float]:
    ours = StdioServerParameters(
        command=PY,
        args=["-m", "envforge.cli", "serve", str(BANK), "--transport", "stdio"],
        cwd=str(REPO),
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    bare = StdioServerParameters(
        command=PY,
        args=[str(REPO / "benchmarks" / "bare_server.py"), "stdio"],
        cwd=str(REPO),
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    rates = []
    for params in (ours, bare):
        async with Client(params) as client:

            async def caller(i: int, client: Client = client) -> Caller:
                async def call(_: int) -> None:
                    _check(await client.call_tool("get_account", ARGS))

                return call

            await rate(1, 100, caller)
            rates.append(await rate(workers, calls, caller))
    return rates[0], rates[1]


async def http(workers: int, calls: int) -> tuple[float, float]:
    from mcp.client.streamable_http import streamable_http_client

    p_ours, p_bare = free_port(), free_port()
    procs = [
        start_http(["-m", "envforge.cli", "serve", str(BANK), "--port", str(p_ours)], p_ours),
        start_http([str(REPO / "benchmarks" / "bare_server.py"), "http", str(p_bare)], p_bare),
    ]
    rates = []
    try:
        async with httpx.AsyncClient() as control:
            for which, port in (("ours", p_ours), ("bare", p_bare)):
                async with anyio.create_task_group() as tg:
                    clients: list[Client] = []
                    stop = anyio.Event()
                    ready = anyio.Event()

                    async def hold(
                        url: str,
                        stop: anyio.Event = stop,
                        clients: list[Client] = clients,
                        ready: anyio.Event = ready,
                    ) -> None:
                        async with Client(streamable_http_client(url)) as client:
                            clients.append(client)
                            if len(clients) == workers:
                                ready.set()
                            await stop.wait()

                    for _ in range(workers):
                        if which == "ours":
                            r = await control.post(
                                f"http://127.0.0.1:{port}/control/episodes", json={"env": "bank"}
                            )
                            url = f"http://127.0.0.1:{port}{r.json()['mcp_path']}"
                        else:
                            url = f"http://127.0.0.1:{port}/mcp"
                        tg.start_soon(hold, url)
                    await ready.wait()

                    async def caller(i: int, clients: list[Client] = clients) -> Caller:
                        async def call(_: int) -> None:
                            _check(await clients[i].call_tool("get_account", ARGS))

                        return call

                    await rate(workers, workers * 5, caller)
                    rates.append(await rate(workers, calls, caller))
                    stop.set()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    return rates[0], rates[1]


def megabyte_state(env: Any) -> dict[str, list[dict[str, Any]]]:
    state = {k: [dict(r) for r in v] for k, v in env.seed_state().items()}
    state["transfers"] = [
        {"transfer_id": i, "src": "A-1", "dst": "A-2", "amount": 1.0, "memo": "x" * 200}
        for i in range(1, 4700)
    ]
    return state


async def episode_creation(n: int = 300) -> tuple[float, float, int]:
    """Median ms to create (and close) an episode on a ~1 MB database, vs a naive schema+inserts build."""
    env = load_env(BANK)
    state = megabyte_state(env)
    data = env.database_from_state(state)
    fleet = Fleet([env], max_episodes=n + 10)
    ours = []
    for _ in range(n):
        t0 = time.perf_counter()
        ep = await fleet.store.create(env, data)
        ours.append(time.perf_counter() - t0)
        await fleet.store.close(ep.id)
    naive = []
    rows = [(t, list(r), list(r[0].keys()) if r else []) for t, r in state.items()]
    for _ in range(max(5, n // 30)):
        t0 = time.perf_counter()
        conn = await aiosqlite.connect(":memory:")
        await conn.executescript(env.schema_sql)
        for table, table_rows, cols in rows:
            if table_rows:
                sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
                await conn.executemany(sql, [tuple(r[c] for c in cols) for r in table_rows])
        await conn.commit()
        naive.append(time.perf_counter() - t0)
        await conn.close()
    return statistics.median(ours) * 1e3, statistics.median(naive) * 1e3, len(data)


async def confined_table(console: Console, calls: int, repeat: int) -> None:
    table = Table(title="confined (sandboxed worker) vs trusted (in-process) vs bare, in-process MCP")
    for col in ("episodes", "confined calls/s", "trusted calls/s", "bare calls/s", "confined/trusted"):
        table.add_column(col, justify="right")
    for workers in (1, 32):
        runs = [await confined_in_process(workers, calls) for _ in range(repeat)]
        confined, trusted, bare = (statistics.median(r[i] for r in runs) for i in range(3))
        ratio = statistics.median(r[0] / r[1] for r in runs)
        table.add_row(str(workers), f"{confined:,.0f}", f"{trusted:,.0f}", f"{bare:,.0f}", f"{ratio:.2f}x")
        rounds = ", ".join(f"{r[0] / r[1]:.2f}" for r in runs)
        console.print(f"confined x{workers}: {confined:,.0f} vs trusted {trusted:,.0f} calls/s ({rounds})")
    console.print(table)


async def main(calls: int, repeat: int, confined_only: bool) -> None:
    console = Console()
    await confined_table(console, calls, repeat)
    if confined_only:
        return
    table = Table(title="envforge vs bare mcp server (get_account, same aiosqlite query)")
    for col in ("transport", "episodes", "envforge calls/s", "bare calls/s", "median ratio"):
        table.add_column(col, justify="right")
    for name, fn, n in (
        ("in-process", in_process, calls),
        ("stdio", stdio, calls // 2),
        ("http", http, calls // 4),
    ):
        for workers in (1, 32):
            runs = [await fn(workers, n) for _ in range(repeat)]  # this machine is noisy: median of rounds
            ours = statistics.median(r[0] for r in runs)
            bare = statistics.median(r[1] for r in runs)
            ratio = statistics.median(r[0] / r[1] for r in runs)
            table.add_row(name, str(workers), f"{ours:,.0f}", f"{bare:,.0f}", f"{ratio:.2f}x")
            rounds = ", ".join(f"{a / b:.2f}" for a, b in runs)
            console.print(
                f"{name} x{workers}: {ours:,.0f} vs {bare:,.0f} calls/s (ratio per round: {rounds})"
            )
    ours_ms, naive_ms, size = await episode_creation()
    console.print(table)
    console.print(
        f"episode creation, {size / 1e6:.2f} MB database: {ours_ms:.3f} ms median "
        f"(naive schema + inserts: {naive_ms:.1f} ms, {naive_ms / ours_ms:.0f}x slower)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per cell; medians are printed")
    parser.add_argument("--confined-only", action="store_true", help="only the confined/trusted/bare table")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.repeat, args.confined_only)
