"""Attacks on the packaged local models: swapped weights, a tampered cache, and other local users.

The Qwen weights come from packages whose publisher and name have nothing to do with the model,
so the bytes a server loads must be the pinned ones: a part package with other bytes is refused
with a one-line error and leaves nothing in the cache; a cached file changed on disk is never
served (it is rebuilt from the packages). The server listens on 127.0.0.1, where any local user
can reach it: it answers only callers holding its per-run key.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from envforge.harness.local_models import (
    MODELS,
    LocalModel,
    LocalModelError,
    PackagedFile,
    assemble,
)
from envforge.harness.local_server import server_command, start, stop

from support.paths import REPO
from support.skips import LOCAL_MODEL_MISSING, local_model_missing


def _install_fake_distribution(site: Path, name: str, files: dict[str, bytes]) -> None:
    """A real installed distribution on `site` (dist-info with a RECORD), as pip would leave it."""
    dist_info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    record = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        record.append(f"{rel},,")
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def _model(sha256: str, size: int) -> LocalModel:
    parts = tuple(PackagedFile(f"weights-part{i}", "1.0", f"weights_part{i}/part.bin") for i in (1, 2))
    return LocalModel("fake", "fake", parts, size, sha256, tools_in_template=True)


def test_swapped_part_bytes_are_refused_and_leave_nothing_behind(fake_site: Path, tmp_path: Path) -> None:
    good = [b"GGUF" + b"a" * 1000, b"b" * 500]
    pinned = hashlib.sha256(b"".join(good)).hexdigest()
    swapped = [good[0], b"c" * 500]  # same size, other bytes: a hostile part package
    for i, data in enumerate(swapped, 1):
        _install_fake_distribution(fake_site, f"weights-part{i}", {f"weights_part{i}/part.bin": data})
    cache = tmp_path / "cache"
    with pytest.raises(LocalModelError, match="do not match the pinned model") as err:
        assemble(_model(pinned, 1504), root=cache)
    assert "\n" not in str(err.value)
    assert list(cache.iterdir()) == []  # no half-written or unverified file remains


def test_a_pinned_version_mismatch_is_refused(fake_site: Path, tmp_path: Path) -> None:
    _install_fake_distribution(fake_site, "weights-part1", {"weights_part1/part.bin": b"x"})
    model = LocalModel(
        "fake", "fake", (PackagedFile("weights-part1", "2.0", "weights_part1/part.bin"),), 1, "0" * 64, True
    )
    with pytest.raises(LocalModelError, match=r"the pinned 2\.0 is needed"):
        assemble(model, root=tmp_path / "cache")


def test_tampered_cache_file_is_rebuilt_not_served(fake_site: Path, tmp_path: Path) -> None:
    good = [b"GGUF" + b"a" * 1000, b"b" * 500]
    for i, data in enumerate(good, 1):
        _install_fake_distribution(fake_site, f"weights-part{i}", {f"weights_part{i}/part.bin": data})
    model = _model(hashlib.sha256(b"".join(good)).hexdigest(), 1504)
    cache = tmp_path / "cache"
    path = assemble(model, root=cache)
    assert path.read_bytes() == b"".join(good)
    path.write_bytes(b"GGUF" + b"EVIL" * 375)  # same size, other weights
    again = assemble(model, root=cache)
    assert again == path and again.read_bytes() == b"".join(good)


def test_unknown_local_model_is_a_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envforge.cli",
            "eval",
            str(REPO / "envs" / "retail_orders"),
            "--agent",
            "local/../../etc/passwd",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert "unknown local model" in said
    assert "Traceback" not in said
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
def test_local_server_answers_only_its_key_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFORGE_CACHE", str(tmp_path))
    model = MODELS["smollm2"]
    server = start(model, assemble(model))
    try:
        body = json.dumps(
            {"model": model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
        for headers in ({}, {"Authorization": "Bearer guessed"}):
            request = urllib.request.Request(
                server.base_url + "/chat/completions",
                data=body.encode(),
                headers={"Content-Type": "application/json", **headers},
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=60)
            assert err.value.code == 401
    finally:
        stop(server)
    assert server.process.poll() is not None


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
def test_a_key_that_begins_with_a_dash_still_starts_the_server(tmp_path: Path) -> None:
    """Keys are random URL-safe text, so one in 64 begins with "-": given as a separate argument,
    the server's parser took it for an option and refused to start (a CI run met one)."""
    model = MODELS["smollm2"]
    command = server_command(tmp_path / "absent.gguf", model, 1)
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    proc.stdin.write("-Zk3" + "x" * 28 + "\n")  # the key travels on stdin, which stays open
    proc.stdin.flush()
    try:
        proc.wait(timeout=120)  # stdin still open: it ends on its own, at the missing file
    finally:
        proc.kill()
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    assert "expected one argument" not in stderr, stderr[-500:]
    assert "absent.gguf" in stderr  # it got past its arguments, to the missing model file


STARTER = """
import json, os, sys, threading, time, urllib.request
from envforge.harness.local_models import MODELS, assemble
from envforge.harness.local_server import start

model = MODELS["smollm2"]
server = start(model, assemble(model))


def generate() -> None:  # a long answer in flight (end-of-text forbidden), as in a real eval
    body = {
        "model": model.name,
        "messages": [{"role": "user", "content": "Count from 1 to 5000."}],
        "max_tokens": 4000,
        "logit_bias": {"0": -100, "1": -100, "2": -100},
    }
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + server.api_key},
    )
    urllib.request.urlopen(request, timeout=600).read()


threading.Thread(target=generate, daemon=True).start()
time.sleep(2)
print(server.process.pid, server.api_key, server.log_path, flush=True)
time.sleep(600)
"""


def _start_in_a_child(tmp_path: Path) -> tuple[subprocess.Popen[str], int, str, Path]:
    """A real envforge process that starts a local server and lives on: (it, server pid, key, log)."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ENVFORGE_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp")},
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    assert starter.stdout is not None
    line = starter.stdout.readline().split()
    assert len(line) == 3, f"the starter printed {line!r}"
    return starter, int(line[0]), line[1], Path(line[2])


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # a zombie no longer runs: it waits only to be reaped


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
def test_the_servers_key_is_not_on_its_command_line(tmp_path: Path) -> None:
    """Any local user reads /proc/PID/cmdline; the key was there, and another uid got 200 with it."""
    starter, pid, key, log = _start_in_a_child(tmp_path)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"llama_cpp.server" in cmdline  # this is the server
        assert key.encode() not in cmdline
        assert key.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        assert log.is_relative_to(tmp_path / "cache") and not log.is_relative_to(tmp_path / "tmp")
        assert log.parent.stat().st_mode & 0o077 == 0
    finally:
        starter.kill()
        starter.wait()


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
def test_the_server_dies_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    """After SIGKILL of `eval` the server ran ~5 more minutes (874 MB), re-parented to PID 1."""
    starter, pid, _key, _log = _start_in_a_child(tmp_path)
    try:
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 5
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), "the server outlived its killed parent by 5 s"
    finally:
        starter.kill()
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
