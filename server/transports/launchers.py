"""Where a multi-process fleet's workers run: child processes here, or Ray actors on a cluster.

The front (`http_front`) supervises its workers through one `Launcher` method, `run`: start a
worker, say where it listens (`Running`), return when it has exited. Everything else (routing by
episode id, the token, the guard, the per-client caps) only needs that address, so it is the same
whichever launcher placed the worker.

- `LocalLauncher`: a worker is a child process of the front on a loopback port (`serve --workers N`).
- `RayLauncher`: each worker runs inside a Ray actor on whichever node of a cluster has a CPU free
  (`serve --ray ADDRESS --workers N`). The actor starts the very same worker process on its node,
  bound to that node's address on an ephemeral port, and holds the worker's stdin: an actor that
  dies, however, takes its worker with it, and the front, awaiting the actor, starts a new one.

Why actors hosting the front's own workers rather than Ray Serve: an episode is state in the one
process that created it, so every request naming it must reach that process. Ray Serve picks a
replica per request (its model multiplexing prefers a replica that already holds an id, else loads
it on another one; custom request routers are alpha), and its HTTP proxy would stand where the
front's token, guard and per-client caps stand. Ray does here what it is for: placing processes on
nodes and reporting their deaths.

`ray` is imported inside functions only (the `ray` extra): a fleet without `--ray` never loads it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import anyio
from anyio.abc import Process

from .http_worker import WorkerConfig, worker_command, worker_stdin

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT = 120.0
"""Seconds a worker may take to listen (loading every env) before the front gives up on it."""


@dataclass(frozen=True)
class Running:
    """A worker that listens: its address, the process the front supervises, and its node."""

    host: str
    port: int
    pid: int | None
    node: str | None = None

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class Launcher(Protocol):
    """Where and how workers run: the front supervises them and routes to them the same way."""

    async def run(self, config: WorkerConfig, listening: Callable[[Running], None]) -> object:
        """Run one worker with `config` until it exits; call `listening` once it listens (never if
        it does not come up). Returns what ended it; cancelled, it stops the worker first."""
        ...


class LocalLauncher:
    """Workers as child processes of the front, on loopback ports of this machine."""

    async def run(self, config: WorkerConfig, listening: Callable[[Running], None]) -> object:
        process = await anyio.open_process(worker_command(), stderr=None)
        try:
            assert process.stdin is not None  # held open: the worker exits when it closes
            await process.stdin.send(worker_stdin(config))
            port = await _read_port(process)
            if port is not None:
                listening(Running(config.host, port, process.pid))
            return await process.wait()
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def _read_port(process: Process) -> int | None:
    """The port a starting worker prints as its first line, or None if it exits or stalls first."""
    assert process.stdout is not None
    line = b""
    with anyio.move_on_after(WORKER_START_TIMEOUT):
        while not line.endswith(b"\n"):
            try:
                line += await process.stdout.receive(64)
            except anyio.EndOfStream:
                break
    return int(line) if line.strip().isdigit() else None


def _check_reachable(address: str) -> None:
    """Refuse a HOST:PORT where nothing listens at once: `ray.init` would retry it for minutes."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return  # Ray resolves these itself, and says so quickly when it cannot
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise ValueError(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc}") from None


class WorkerHost:
    """The body of one Ray actor: runs a fleet worker on the actor's node and waits for it.

    A plain class (Ray wraps it in `RayLauncher`), so this module imports without ray."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, config_json: str) -> tuple[str, int | None, int, str]:
        """Start the worker bound to this node's address: (host, port or None, actor pid, node)."""
        import ray

        host = ray.util.get_node_ip_address()
        config = replace(WorkerConfig(**json.loads(config_json)), host=host)
        # stdin stays open in this actor: the worker exits as soon as the actor is gone
        pipe = subprocess.PIPE
        self._process = subprocess.Popen(worker_command(), stdin=pipe, stdout=pipe)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(worker_stdin(config))
        self._process.stdin.flush()
        line = self._process.stdout.readline()  # its port, or b"" once it has exited
        port = int(line) if line.strip().isdigit() else None
        return host, port, os.getpid(), ray.get_runtime_context().get_node_id()

    def wait(self) -> int:
        """Block until the worker exits; its exit status."""
        assert self._process is not None
        return self._process.wait()


class RayLauncher:
    """Workers inside Ray actors, one CPU each, spread over the nodes of the cluster at `address`.

    Connects on construction (the front is then a Ray driver); the actors die with it."""

    def __init__(self, address: str, workers: int) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs the ray extra: pip install 'envforge[ray]'") from None
        if not ray.is_initialized():
            _check_reachable(address)
            try:
                ray.init(address=address, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ValueError(f"cannot join the Ray cluster at {address!r}: {first}") from None
        cpus = ray.cluster_resources().get("CPU", 0.0)
        if cpus < workers:
            raise ValueError(
                f"the Ray cluster at {address!r} has {cpus:g} CPUs; --workers {workers} needs "
                f"{workers} (each worker's actor reserves one)"
            )
        self._actor: Any = ray.remote(WorkerHost)

    async def run(self, config: WorkerConfig, listening: Callable[[Running], None]) -> object:
        import ray
        from ray.exceptions import RayError

        actor = self._actor.options(num_cpus=1, scheduling_strategy="SPREAD").remote()
        try:
            started = None
            with anyio.move_on_after(WORKER_START_TIMEOUT):
                started = await actor.start.remote(config.to_json())
            if started is None or started[1] is None:
                return "the worker did not come up on its Ray actor"
            host, port, pid, node = started
            listening(Running(host, port, pid, node))
            return await actor.wait.remote()
        except RayError as exc:
            return f"its Ray actor ended ({type(exc).__name__})"
        finally:
            ray.kill(actor)
