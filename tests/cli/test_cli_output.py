"""What `envforge` prints, read as a user reads it in an 80-column terminal or a pipe: results on
stdout (progress and logs on stderr), nothing cut mid-name or mid-word, `--version`, a score a person
can read, `serve` announcing itself only once it answers. Each runs the real command in a fresh
process with `COLUMNS=80`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from support.paths import REPO

ENVS = REPO / "envs"
WIDTH = 80


def cli_env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": str(WIDTH), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def envforge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )


def assert_fits(text: str) -> None:
    too_wide = [line for line in text.splitlines() if len(line.rstrip()) > WIDTH]
    assert not too_wide, "\n".join(too_wide)


def test_version() -> None:
    done = envforge("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("envforge ") and done.stdout.split()[1][0].isdigit()


def test_eval_summary_is_on_stdout_with_whole_env_names_in_80_columns(tmp_path: Path) -> None:
    dirs = [str(ENVS / name) for name in ("car_rental", "flight_booking", "helpdesk_lite")]
    done = envforge(
        "eval", *dirs, "--agent", "oracle", "--limit", "1", "--trials", "2", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert "Run summary" in done.stdout and "Run summary" not in done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    for name in ("car_rental", "flight_booking", "helpdesk_lite", "overall"):
        assert name in rows, done.stdout  # whole, never `car_r…`
        assert rows[name][3:5] == ["1.000", "1.000"], rows[name]  # pass^1, pass^2 of the oracle
    assert "…" not in done.stdout
    assert_fits(done.stdout)


def test_eval_json_keeps_stdout_parseable(tmp_path: Path) -> None:
    done = envforge(
        "eval", str(ENVS / "gym"), "--agent", "oracle", "--limit", "1", "--json", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["overall"]["n_trials"] == 1


def test_score_without_json_reads_as_text(tmp_path: Path) -> None:
    task = json.loads((ENVS / "gym" / "tasks.jsonl").read_text().splitlines()[0])
    calls = [node["call"] for node in task["dag"]["nodes"] if node.get("call")]
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps(calls[:1]))  # the first golden call only: the state cannot match
    done = envforge("score", str(ENVS / "gym"), "--task", task["id"], "--actions", str(actions))
    assert done.returncode == 0, done.stderr
    assert "Score(" not in done.stdout and "reward=" not in done.stdout
    assert f"{task['id']}: reward 0.00" in done.stdout
    assert "state matches expected: no" in done.stdout
    assert_fits(done.stdout)


def test_inspect_shows_whole_descriptions_and_optional_enum_values() -> None:
    done = envforge("inspect", str(ENVS / "car_rental"))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # wrapped lines joined back: every word is whole
    assert "list_available_cars" in text and "send_to_maintenance" in text
    assert "Rent an available car to a customer with a valid licence for 1-30 days." in text
    assert 'category?: "economy" | "compact" | "suv" | "van" | null' in text
    assert ": any" not in text and "…" not in done.stdout
    assert_fits(done.stdout)


def test_serve_on_a_busy_port_is_one_line_and_announces_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = envforge("serve", str(ENVS / "gym"), "--port", str(port))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(port) in lines[0], done.stderr
    assert "serving" not in done.stderr + done.stdout and "Traceback" not in done.stderr


def start_serve(*env_dirs: str) -> subprocess.Popen[str]:
    """`envforge serve ENV_DIRS --port 0` with its announcements readable line by line (stderr)."""
    return subprocess.Popen(
        [sys.executable, "-m", "envforge.cli", "serve", *env_dirs, "--port", "0"],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_announces_only_once_it_answers() -> None:
    """The moment `serving` appears, the URL it names must already answer: a script may start on
    that line. `--port 0` (a free port) must name the port it got, not 0."""
    proc = start_serve(str(ENVS / "gym"))
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        line = ""
        while "serving" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, "serve never announced itself"
            line = proc.stderr.readline()
        url = line.split()[-1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/envs/gym/mcp"), line
        base = url.removesuffix("/envs/gym/mcp")
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    finally:
        proc.kill()
        proc.wait(10)


def test_serve_of_many_envs_announces_a_few_and_a_count(tmp_path: Path) -> None:
    """A fleet of many envs is not a screen of lines: the first few are named, the rest counted,
    and the control plane lists every one."""
    folders = []
    for i in range(12):
        folder = tmp_path / f"shop_{i:02d}"
        folder.mkdir()
        for name in ("schema.sql", "seed.json", "tools.py", "policy.md"):
            (folder / name).write_bytes((ENVS / "retail_orders" / name).read_bytes())
        toml = (ENVS / "retail_orders" / "env.toml").read_text()
        (folder / "env.toml").write_text(toml.replace('name = "retail_orders"', f'name = "{folder.name}"', 1))
        folders.append(str(folder))
    proc = start_serve(*folders)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while not lines or "control plane" not in lines[-1]:
            assert time.monotonic() < deadline and proc.poll() is None, "serve never announced itself"
            lines.append(proc.stderr.readline())
        serving = [line for line in lines if line.startswith("serving")]
        assert len(serving) == 10, lines
        assert "3 more envs" in serving[-1] and "all 12" in serving[-1]
        base = lines[-1].split()[-1].removesuffix("/control/episodes")
        listed = httpx.get(f"{base}/control/envs", timeout=5).json()
        assert len(listed["envs"] if isinstance(listed, dict) else listed) == 12
    finally:
        proc.kill()
        proc.wait(10)
