"""Confined envs written from a tools.py text, and the raw MCP calls the attack tests send them."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from envforge.server import ERROR_META_KEY

STATELESS = "2026-07-28"
"""The MCP protocol version whose requests carry no session (each call stands alone)."""

COUNT_NOTES_TOOLS = textwrap.dedent(
    '''
    """Counts notes."""

    from __future__ import annotations

    from envforge.server import Db, tool


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)
"""A confined env's tools.py with one read: what tests whose attack is the state, not the code, serve."""


def make_confined_env(root: Path, tools: str) -> Path:
    """A confined env named `payloads` at `root`: one `notes` table seeded with one note, `tools` as
    its tools.py."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "env.toml").write_text(
        'name = "payloads"\ndescription = "payloads"\nseed = "seed.json"\ntrust = "confined"\n'
    )
    (root / "policy.md").write_text("Payloads.\n")
    (root / "schema.sql").write_text("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n")
    (root / "seed.json").write_text(json.dumps({"notes": [{"id": 1, "body": "seed"}]}))
    (root / "tools.py").write_text(tools)
    return root


def open_episode(http: httpx.Client, env: str) -> str:
    answer = http.post("/control/episodes", json={"env": env})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["episode_id"])


def call_tool(
    http: httpx.Client, env: str, episode: str, tool: str, arguments: dict[str, Any]
) -> tuple[str | None, str]:
    """One stateless MCP `tools/call` on the episode's own URL: (error kind or None, text)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Mcp-Protocol-Version": STATELESS,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    answer = http.post(f"/envs/{env}/episodes/{episode}/mcp", content=json.dumps(body), headers=headers)
    assert answer.status_code == 200, answer.text[:300]
    result: dict[str, Any] = answer.json()["result"]
    return (result.get("_meta") or {}).get(ERROR_META_KEY), result["content"][0]["text"]


MEMORY_TOOLS = textwrap.dedent(
    '''
    """Statements that ask SQLite for gigabytes inside one step, bound to short SQL."""

    from __future__ import annotations

    from envforge.server import Db, tool

    # a distinct 16 MB JSON array of 8M elements (its last element differs), parsed whole
    DOCUMENT = "json_extract('[' || replace(hex(zeroblob(8000000)), '00', '0,') || '%d]', '$[0]')"


    @tool(writes=["notes"])
    async def eight_documents(db: Db) -> int:
        """Write a note, then parse eight distinct 16 MB JSON documents in one statement."""
        await db.execute("INSERT INTO notes (body) VALUES ('kept only if the call is')")
        columns = ", ".join(DOCUMENT % i for i in range(8))
        row = await db.fetch_one("SELECT " + columns)
        return len(row)


    @tool(writes=["notes"])
    async def group_huge_values(db: Db) -> int:
        """Write a note, then group 1,000 distinct values of 4 MB each."""
        await db.execute("INSERT INTO notes (body) VALUES ('kept only if the call is')")
        return await db.fetch_value(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000) "
            "SELECT count(*) FROM (SELECT zeroblob(4000000) || x AS b FROM c GROUP BY b)"
        )


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


def forget_env_modules(prefix: str) -> None:
    """Drop the tool modules named `prefix...` that earlier tests of this process imported: a test
    that checks a confined env's module is never imported in-process must start without them."""
    for name in [m for m in sys.modules if m.startswith(prefix)]:
        del sys.modules[name]


def trusted_copy(env_dir: Path, where: Path) -> Path:
    """A copy of a confined env folder with the same code, marked trusted (imported in-process)."""
    copy = where / env_dir.name
    shutil.copytree(env_dir, copy)
    manifest = (env_dir / "env.toml").read_text()
    (copy / "env.toml").write_text(manifest.replace('trust = "confined"\n', ""))
    return copy


def imported(prefix: str) -> list[str]:
    """The modules of this process named `prefix...` (an env's tools are imported as such)."""
    return [m for m in sys.modules if m.startswith(prefix)]


def check_served_confined(env_dir: Path, where: Path, play: Callable[[Path], str]) -> None:
    """`play` (a framework reading one car through an env folder, returning what the tool said)
    on the confined env, then on a trusted copy of it: the confined env's tool module is never
    imported in this process, the trusted copy's is (so the check can see an import at all)."""
    module = f"envforge_env_{env_dir.name}"
    forget_env_modules(module)  # a trusted copy imported by an earlier test
    assert "V-621" in play(env_dir)
    assert not imported(module)
    assert "V-621" in play(trusted_copy(env_dir, where))
    assert imported(module)


def with_file_reading_tool(env_dir: Path, where: Path) -> Path:
    """A copy of `env_dir` whose tools.py gained a tool that opens a file: a model-written payload
    the static gate must refuse before anything serves it."""
    payload = where / env_dir.name
    shutil.copytree(env_dir, payload)
    with (payload / "tools.py").open("a") as f:
        f.write(
            '\n\n@tool\nasync def read_file(db: Db, path: str) -> str:\n    """Read.\n\n    Args:\n'
            '        path: Which.\n    """\n    return open(path).read()\n'
        )
    return payload
