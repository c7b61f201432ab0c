"""An agent's malformed arguments, sent over real HTTP to the same tools served trusted and confined.

A confined env's tools run in a sandboxed worker, so its arguments cross a pipe and are checked
against the real signature there. Whatever shape an agent sends, the answer must be the one the
trusted env gives: kind `invalid` with the same one-line message, never a refusal of the env or
an env error, and nothing logged (a deeply nested argument once cost a 137 KB traceback per call).
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from envforge.server import ERROR_META_KEY, Fleet, build_app, load_env

from support.serving import ServerThread

TOOLS = textwrap.dedent(
    '''
    """One write tool with a typed argument."""

    from __future__ import annotations

    from envforge.server import Db, tool


    @tool(writes=["notes"])
    async def add_note(db: Db, body: str) -> int:
        """Add a note.

        Args:
            body: The note's text.
        """
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)

STATELESS = "2026-07-28"


def _env_dir(root: Path, name: str, trust: str) -> Path:
    root.mkdir(parents=True)
    (root / "env.toml").write_text(
        f'name = "{name}"\ndescription = "notes"\nseed = "seed.json"\ntrust = "{trust}"\n'
    )
    (root / "policy.md").write_text("Notes.\n")
    (root / "schema.sql").write_text("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n")
    (root / "seed.json").write_text(json.dumps({"notes": [{"id": 1, "body": "seed"}]}))
    (root / "tools.py").write_text(TOOLS)
    return root


def _call(http: httpx.Client, path: str, raw_arguments: str) -> tuple[str | None, str]:
    """One stateless `tools/call` of `add_note` whose arguments are `raw_arguments`, sent as written
    (JSON nested deeper than Python's recursion limit cannot be built as a Python value first)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = json.dumps({"name": "add_note", "_meta": meta})[:-1] + f', "arguments": {raw_arguments}}}'
    body = f'{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {params}}}'
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Mcp-Protocol-Version": STATELESS,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "add_note",
    }
    answer = http.post(path, content=body, headers=headers)
    assert answer.status_code == 200, answer.text[:300]
    result: dict[str, Any] = answer.json()["result"]
    return (result.get("_meta") or {}).get(ERROR_META_KEY), result["content"][0]["text"]


def _nested(depth: int) -> str:
    return '{"body": ' + "[" * depth + "]" * depth + "}"


MALFORMED = {
    "a list for a string": '{"body": ["x"]}',
    "an object for a string": '{"body": {"x": 1}}',
    "a missing argument": "{}",
    "an unknown argument": '{"body": "x", "extra": 1}',
    "nested 40 deep": _nested(40),
    "nested 400 deep": _nested(400),
    "nested 600 deep": _nested(600),
    "nested 900 deep": _nested(900),
}


@pytest.fixture(scope="module")
def twin_fleet(tmp_path_factory: pytest.TempPathFactory):
    """The same tools served trusted (in-process) and confined (a sandboxed worker), over HTTP."""
    root = tmp_path_factory.mktemp("twins")
    envs = [load_env(_env_dir(root / n, n, t)) for n, t in (("trusted", "trusted"), ("confined", "confined"))]
    fleet = Fleet(envs)
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        paths = {
            e.name: http.post("/control/episodes", json={"env": e.name}).json()["mcp_path"] for e in envs
        }
        yield http, paths


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_arguments_are_invalid_on_a_confined_env_as_on_a_trusted_one(twin_fleet, case, caplog):
    http, paths = twin_fleet
    caplog.set_level(logging.INFO, logger="envforge")
    trusted = _call(http, paths["trusted"], MALFORMED[case])
    confined = _call(http, paths["confined"], MALFORMED[case])
    assert trusted[0] == "invalid", trusted
    assert confined == trusted, f"confined {confined} vs trusted {trusted}"
    assert "\n" not in confined[1] and len(confined[1]) < 300, confined[1]
    logged = [r for r in caplog.records if r.name.startswith("envforge")]
    assert not logged, [r.getMessage()[:200] for r in logged]
    # the worker still serves well-formed calls
    assert _call(http, paths["confined"], '{"body": "fine"}')[0] is None
