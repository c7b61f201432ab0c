"""What the resource attacks measure: `/healthz` answering throughout, a server's pid and whether it
lives, and how far this process's peak RSS rose."""

from __future__ import annotations

import gc
import os
import re
import threading
import time
from pathlib import Path

import httpx

from support.confined import call_tool


class Health:
    """Asks `/healthz` over and over while an attack runs; every answer must be 200."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self.stop.is_set():
                start = time.monotonic()
                try:
                    status = http.get("/healthz").status_code
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.times.append(time.monotonic() - start)
                if status != 200:
                    self.failures.append(str(status))
                time.sleep(0.05)

    def __enter__(self) -> Health:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(30)


def server_pid(url: str) -> int:
    """The pid of the process listening on `url`'s port (the test's `envforge serve` child)."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return int(conn.pid)
    raise AssertionError(f"nothing listens on {port}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().split()[2] != "Z"


def _status_mb(field: str) -> float:
    status = Path("/proc/self/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None, status
    return int(found.group(1)) / 1024


def peak_growth_mb_since_reset() -> float:
    """How far this process's peak RSS rose above its RSS at the last `reset_peak()`."""
    return _status_mb("VmHWM") - _reset_at[0]


_reset_at = [0.0]


def reset_peak() -> None:
    """Start this process's peak RSS (VmHWM) afresh, so a test sees its own peak, not an earlier one."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    _reset_at[0] = _status_mb("VmRSS")


class Probe:
    """Times `/healthz` and another env's read, back to back, while an attack runs."""

    def __init__(self, url: str, bank_episode: str) -> None:
        self.url, self.bank_episode = url, bank_episode
        self.health: list[float] = []
        self.reads: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self.stop.is_set():
                start = time.monotonic()
                assert http.get("/healthz").status_code == 200
                self.health.append(time.monotonic() - start)
                start = time.monotonic()
                kind, text = call_tool(http, "bank", self.bank_episode, "get_account", {"account_id": "A-1"})
                assert kind is None and "A-1" in text, text
                self.reads.append(time.monotonic() - start)
                time.sleep(0.05)


def proc_mib(pid: int, field: str) -> float:
    """A `/proc/PID/status` figure (`VmRSS`, `VmHWM`: the peak since the last reset), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def reset_proc_peak(pid: int) -> None:
    """Make `VmHWM` start again from the current RSS (`clear_refs` 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")
