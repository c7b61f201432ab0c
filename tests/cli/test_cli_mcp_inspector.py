"""The README's desktop-client config, launched by the real MCP Inspector in its CLI mode.

The Inspector is the client newcomers try first, and it keeps `--transport` for itself: launched
as `inspector --cli envforge serve ENV --transport stdio`, envforge never sees that flag. Both
launches the README gives (`envforge mcp ENV` and `envforge serve ENV`) must serve over stdio and
answer. The Inspector (`@modelcontextprotocol/inspector`, pinned) is installed with npm into the
envforge cache on first use; the tests skip, saying why, where node/npm are missing or the install
fails (no registry).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envforge.server import load_env

from support.paths import ENVS

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
ENVFORGE = str(Path(sys.executable).parent / "envforge")
ENV = ENVS / "retail_orders"


def _cache() -> Path:
    root = os.environ.get("ENVFORGE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "envforge") / "mcp-inspector-2.12.0"


@pytest.fixture(scope="module")
def inspector() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the MCP Inspector is a node program")
    where = _cache()
    binary = where / "node_modules" / ".bin" / "mcp-inspector"
    if not binary.exists():
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(where), INSPECTOR],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0 or not binary.exists():
            pytest.skip(f"npm could not install {INSPECTOR}: {(done.stderr or done.stdout).strip()[-300:]}")
    return binary


def _inspect(inspector: Path, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [str(inspector), "--cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    start = done.stdout.find("{")
    assert start >= 0, f"exit {done.returncode}: {done.stdout[-800:]} {done.stderr[-800:]}"
    answer: dict[str, object] = json.loads(done.stdout[start:])
    return answer


def test_the_readme_config_lists_the_envs_tools(inspector: Path) -> None:
    answer = _inspect(inspector, ENVFORGE, "mcp", str(ENV), "--method", "tools/list")
    names = [tool["name"] for tool in answer["tools"]]  # type: ignore[attr-defined]
    assert sorted(names) == sorted(load_env(ENV).tools)


def test_serve_answers_when_the_inspector_keeps_the_transport_flag(inspector: Path) -> None:
    answer = _inspect(
        inspector,
        ENVFORGE,
        "serve",
        str(ENV),
        "--transport",  # the Inspector's own option: envforge is launched without it
        "stdio",
        "--method",
        "tools/call",
        "--tool-name",
        "find_customer_by_email",
        "--tool-arg",
        "email=olivia.johnson@example.com",
    )
    assert not answer.get("isError"), answer
    assert "C-1001" in json.dumps(answer["content"])
