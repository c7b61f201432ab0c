"""A packaged model behind a real OpenAI-compatible server on 127.0.0.1, for the run's duration.

`--agent local` (and `--user`, `--judge`) reach their model the way a vLLM or hosted model is
reached: an `LLMConfig` with an api base. This module only provides that base: it assembles the
model (`local_models`), starts llama-cpp-python's server (`python -m llama_cpp.server`, the
runtime chosen by measurement in docs/benchmarks/local-models.md) on an ephemeral port with a per-server
random API key, no logits kept beyond the last token and no RAM prompt cache (the live context's
prefix is reused), waits until it answers `/v1/models`, and stops it when
the block ends — normally, on an error or on Ctrl-C. The child gets its own process group (so a
Ctrl-C in the terminal reaches envforge, which stops it in order).

Other local users must not reach the server, and it must not outlive envforge however envforge
ends. The key is therefore never on the command line (`/proc/PID/cmdline` is readable by every
user; another uid got 200 with a key read there): a small launcher (`LAUNCHER`, run as
`python -c`) reads it as the first line of its stdin, a pipe from envforge, and hands it to the
server's own argument parser in-process. That pipe then stays open for the server's life: when
envforge dies, SIGKILL included, the kernel closes its end, the launcher's watcher thread reads
end-of-file and SIGKILLs the server. `PR_SET_PDEATHSIG` (SIGKILL, not SIGTERM: uvicorn finishes
the answers in flight on SIGTERM, and a long generation kept a server alive ~5 minutes after
`eval` was killed) is the second line. The log goes to the cache (`local_models.log_dir`, mode
0700), not to the shared /tmp.

One server per role: the agent's long system prompt (policy and tools) stays in its own cache
instead of being evicted by the user's or the judge's prompts.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .llm import LLMConfig
from .local_models import (
    LocalModel,
    LocalModelError,
    Progress,
    assemble,
    available,
    log_dir,
    model_for_spec,
)

READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 5.0
LOG_TAIL_CHARS = 800
REQUEST_TIMEOUT_S = 600.0
"""Per model call: prompt processing on two busy cores runs at ~100 tokens/s, and an agent's
first prompt (policy + tools) is thousands of tokens."""

Notice = Callable[[str], None]


class LocalServerError(RuntimeError):
    """The local inference server could not be started (or is not installed)."""


@dataclass
class LocalServer:
    model: LocalModel
    process: subprocess.Popen[bytes]
    port: int
    api_key: str
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def llm_config(self, temperature: float | None = None) -> LLMConfig:
        """How the harness reaches this server: the ordinary OpenAI-compatible HTTP route."""
        return LLMConfig(
            model=f"openai/{self.model.name}",
            api_base=self.base_url,
            api_key=self.api_key,
            temperature=temperature,
            max_tokens=self.model.max_tokens,
            timeout_s=REQUEST_TIMEOUT_S,
            retries=1,
            transport="http",
            tools_in_prompt=not self.model.tools_in_template,
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


LAUNCHER = textwrap.dedent(
    """
    import os, runpy, signal, sys, threading

    key = b""
    while not key.endswith(b"\\n"):
        chunk = os.read(0, 1)
        if not chunk:
            os._exit(3)
        key += chunk

    def watch():
        while os.read(0, 4096):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    sys.argv = ["llama_cpp.server", *sys.argv[1:], "--api_key=" + key.decode().strip()]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
    """
)
"""The server's entry point: the key from the first line of stdin, then SIGKILL of itself when
stdin ends (its parent died or stopped it); `sys.argv` changed in-process is not what
`/proc/PID/cmdline` shows."""


def _die_with_parent(parent: int) -> Callable[[], None]:
    """In the child, before exec: SIGKILL when the parent dies (Linux), and exit at once if it
    already has (between fork and this call the signal would be missed)."""

    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(1)

    return arm


def _log_tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text[-LOG_TAIL_CHARS:].splitlines() if line.strip()]
    return lines[-1] if lines else ""


def runtime_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("llama_cpp") is not None and find_spec("llama_cpp.server") is not None


def local_model_ready(spec: str) -> bool:
    """Whether `spec` (`local` or `local/<name>`) can run now: the runtime is installed and the
    model's packages are there to assemble it from."""
    return runtime_installed() and available(model_for_spec(spec))


def server_threads() -> int:
    """Half the cores (at most 8), or `ENVFORGE_LOCAL_THREADS`: llama.cpp's threads wait for each
    other in spin barriers, so on shared, oversubscribed cores fewer threads are faster — on two
    busy cores one thread answered a short prompt 4× faster than two (docs/benchmarks/local-models.md)."""
    configured = os.environ.get("ENVFORGE_LOCAL_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def server_command(model_path: Path, model: LocalModel, port: int) -> list[str]:
    """Memory stays bounded. `--logits_all false`: the server's default keeps every prompt token's
    logits (tokens × vocabulary floats: 1.8 GB for a 3,000-token prompt to Qwen's 151,936-token
    vocabulary); nothing here asks for prompt logprobs. `--cache false`: the RAM prompt cache copies
    those logits into every saved state while counting only the KV bytes against its capacity, so
    a judge reading many distinct conversations grew one server to 8.7 GB until the kernel killed
    it (docs/benchmarks/local-models.md). A role's next prompt still reuses the common prefix of what its
    context holds (the policy and tools of the previous turn): llama-cpp-python matches it against
    the live context, with or without that cache. The API key is not here: `LAUNCHER` reads it
    from stdin and adds it as one `--api_key=KEY` argument (a key may begin with "-")."""
    threads = server_threads()
    return [
        sys.executable,
        "-c",
        LAUNCHER,
        "--model",
        str(model_path),
        "--model_alias",
        model.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(model.context),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--cache",
        "false",
        "--logits_all",
        "false",
        "--verbose",
        "false",
    ]


def _ready(server: LocalServer) -> bool:
    request = urllib.request.Request(
        server.base_url + "/models", headers={"Authorization": f"Bearer {server.api_key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(server: LocalServer) -> None:
    """Stop the server and wait for it: SIGTERM to its process group, SIGKILL after a grace period."""
    proc = server.process
    crashed = proc.poll() is not None
    if not crashed:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    if proc.stdin is not None:
        proc.stdin.close()
    if not crashed:  # a server that died on its own keeps its log for a post-mortem
        server.log_path.unlink(missing_ok=True)


def start(model: LocalModel, model_path: Path, *, ready_timeout_s: float = READY_TIMEOUT_S) -> LocalServer:
    """Start a server for `model_path` and return it once it answers; stopped again on failure.

    Call it from a thread that outlives the server (the main thread): the child's parent-death
    signal fires when the thread that started it ends. The log is in `local_models.log_dir()`."""
    if not runtime_installed():
        raise LocalServerError(
            "the local runtime (llama-cpp-python with its server) is not installed: "
            "pip install -e '.[local]' (make setup does)"
        )
    port, api_key = _free_port(), secrets.token_urlsafe(24)
    fd, log_name = tempfile.mkstemp(prefix=f"{model.name}-", suffix=".log", dir=log_dir())
    log_path = Path(log_name)
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(
            server_command(model_path, model, port),
            stdin=subprocess.PIPE,  # the key, then held open: its end is the server's end
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
    server = LocalServer(model, process, port, api_key, log_path)
    assert process.stdin is not None
    try:
        process.stdin.write(api_key.encode() + b"\n")
        process.stdin.flush()
    except OSError:  # it died at once; the wait below says why, from its log
        pass
    deadline = time.monotonic() + ready_timeout_s
    try:
        while not _ready(server):
            if process.poll() is not None:
                raise LocalServerError(
                    f"the {model.name} server exited with code {process.returncode} before it was ready: "
                    f"{_log_tail(log_path) or 'no output'}"
                )
            if time.monotonic() > deadline:
                raise LocalServerError(
                    f"the {model.name} server was not ready within {ready_timeout_s:g} s "
                    f"(last output: {_log_tail(log_path) or 'none'})"
                )
            time.sleep(0.2)
    except BaseException:
        stop(server)
        raise
    return server


@contextmanager
def running_local_server(
    spec: str,
    *,
    on_progress: Progress | None = None,
    on_notice: Notice | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[LocalServer]:
    """The server for a `local` / `local/<name>` spec, stopped when the block ends."""
    model = model_for_spec(spec)
    path = assemble(model, on_progress=on_progress)
    if on_notice:
        on_notice(f"starting {model.title} on 127.0.0.1")
    server = start(model, path, ready_timeout_s=ready_timeout_s)
    try:
        yield server
    finally:
        stop(server)


__all__ = [
    "LocalModelError",
    "LocalServer",
    "LocalServerError",
    "running_local_server",
    "runtime_installed",
    "start",
    "stop",
]
