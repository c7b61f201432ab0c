"""The bank fixture env served by `envforge serve` behind a bearer token, with its log in a file: the
HTTP attacks' target."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from support.paths import BANK_DIR
from support.serving import free_port

TOKEN = "s3cret-token"


@contextmanager
def serve_bank(
    *options: str, log: Path, nofile: int | None = None, token: str | None = TOKEN
) -> Iterator[str]:
    """`envforge serve` on an ephemeral loopback port; yields its base URL. stderr goes to `log`."""
    port = free_port()
    args = [sys.executable, "-m", "envforge.cli", "serve", str(BANK_DIR), "--port", str(port), *options]
    if token:
        args += ["--token", token]

    def limit_descriptors() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with log.open("wb") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=sink, env=env, preexec_fn=limit_descriptors)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"envforge serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
