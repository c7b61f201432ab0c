"""A thousand envs in one fleet: one `envforge serve` process over N env folders.

For each N (a curve from one run), N copies of a bundled env under distinct names are written to a
temporary folder and served by one real `envforge serve` subprocess on 127.0.0.1 (an ephemeral
port). Printed per N: seconds until `/healthz` answers (ready), the server's resident memory when
ready, and the overhead per env against the smallest N. At the largest N, one read tool is then
called on *every* env through the stock `mcp` client (episode created on the control plane, a
streamable-HTTP session on its URL, the episode closed), and the sweep's time, its errors and
the server's memory after it are printed.

usage: python benchmarks/bench_fleet_size.py [--sizes 1,100,300,1000] [--env library]
       [--concurrency 32]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import psutil
from _util import REPO, child_env, free_port
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

READS = {
    "library": ("get_member", {"member_id": "M-1001"}, "M-1001"),
    "retail_orders": ("get_customer", {"customer_id": "C-1001"}, "C-1001"),
}
"""A read every copy answers from its seed, and a text its answer holds, per env that can be copied."""


def make_copies(source: Path, root: Path, n: int) -> list[Path]:
    """`n` copies of the env folder `source` named `<name>_00000`…, each with its own env.toml name."""
    toml = (source / "env.toml").read_text(encoding="utf-8")
    name = re.search(r'^name = "([^"]+)"', toml, flags=re.MULTILINE)
    assert name is not None, f"{source}/env.toml has no name"
    folders = []
    for i in range(n):
        folder = root / f"{name.group(1)}_{i:05d}"
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("tasks.jsonl", "docs", "__pycache__"))
        (folder / "env.toml").write_text(toml.replace(name.group(0), f'name = "{folder.name}"', 1))
        folders.append(folder)
    return folders


def serve(
    folders: list[Path], port: int, timeout_s: float, log: Path
) -> tuple[subprocess.Popen[bytes], float]:
    """Start `envforge serve FOLDERS...` with its output in `log` (a pipe nobody reads would fill
    and stall it); (the process, seconds until `/healthz` answered)."""
    started = time.perf_counter()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "envforge.cli", "serve", *map(str, folders), "--port", str(port)],
            cwd=REPO,
            env=child_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = started + timeout_s
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envforge serve exited: {log.read_text(errors='replace')[-400:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                return proc, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"envforge serve of {len(folders)} envs was not ready in {timeout_s:.0f} s")


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


async def call_every_env(
    base: str, names: list[str], read: tuple[str, dict, str], concurrency: int
) -> tuple[int, float]:
    """One read call on each env (its own episode, a stock MCP client): (errors, seconds). A call
    that fails, or whose answer lacks the expected text, is an error."""
    tool, args, expected = read
    errors = 0
    limiter = anyio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with (
        httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as control,
        httpx2.AsyncClient(timeout=httpx2.Timeout(120)) as http,
    ):

        async def one(name: str) -> None:
            nonlocal errors
            async with limiter:
                try:
                    created = (await control.post("/control/episodes", json={"env": name})).json()
                    try:
                        transport = streamable_http_client(base + created["mcp_path"], http_client=http)
                        async with Client(transport) as client:
                            result = await client.call_tool(tool, args)
                            errors += bool(result.is_error) or expected not in str(result.content)
                    finally:
                        await control.delete(f"/control/episodes/{created['episode_id']}")
                except Exception as exc:  # every failure is an error to count
                    errors += 1
                    print(f"  {name}: {type(exc).__name__}: {exc}"[:200])

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, name)
        return errors, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,300,1000")
    parser.add_argument("--env", default="library", choices=sorted(READS))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    read = READS[args.env]
    print(f"env: copies of envs/{args.env}; load before: {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}")
    print(f"{'envs':>6} {'ready s':>8} {'RSS MB':>8} {'MB per env':>11} {'ms per env':>11}")
    base_point: tuple[int, float, float] | None = None
    with tempfile.TemporaryDirectory(prefix="envforge-fleet-") as tmp:
        folders = make_copies(REPO / "envs" / args.env, Path(tmp), sizes[-1])
        for n in sizes:
            port = free_port()
            proc, ready = serve(folders[:n], port, args.timeout, Path(tmp) / f"serve-{n}.log")
            try:
                rss = rss_mb(proc.pid)
                if base_point is None:
                    base_point = (n, ready, rss)
                    per_mb = per_ms = "–"
                else:
                    n0, ready0, rss0 = base_point
                    per_mb = f"{(rss - rss0) / (n - n0):.3f}"
                    per_ms = f"{1000 * (ready - ready0) / (n - n0):.2f}"
                print(f"{n:>6} {ready:>8.2f} {rss:>8.1f} {per_mb:>11} {per_ms:>11}", flush=True)
                if n == sizes[-1]:
                    names = [f.name for f in folders[:n]]
                    errors, seconds = anyio.run(
                        call_every_env, f"http://127.0.0.1:{port}", names, read, args.concurrency
                    )
                    print(
                        f"one `{read[0]}` call on each of the {n} envs (stock mcp client, episode per env, "
                        f"{args.concurrency} at a time): {seconds:.1f} s, {n / seconds:.1f} envs/s, "
                        f"{errors} errors; server RSS after {rss_mb(proc.pid):.1f} MB"
                    )
            finally:
                proc.kill()
                proc.wait(10)
    print(f"load after: {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}")


if __name__ == "__main__":
    main()
