"""Tool sides (dual control): each call reaches only its own side's tools, whatever the way in.

The fixture env `dual_phone` has agent tools, the user's phone tools, setup actions and env
assertions. Each test is an attack: a tool of another side called from the agent's side (in
process, over MCP, over HTTP), a user tool writing the agent's tables, a name used on two sides.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import mcp_types as types
import pytest
from mcp import Client

from envforge.server import EnvLoadError, Fleet, build_app, load_env, tool

from support.confined import call_tool, open_episode
from support.paths import DUAL_PHONE_DIR
from support.serving import ServerThread

NOT_AGENT = [
    ("check_status_bar", {}),
    ("toggle_airplane_mode", {}),
    ("turn_airplane_mode_on", {}),
    ("suspend_line", {"line_id": "L-100"}),
    ("assert_service_status", {"expected": "connected"}),
]


@pytest.fixture(scope="module")
def phone():
    return load_env(DUAL_PHONE_DIR)


def test_sides_are_split_and_agent_tools_stay_the_env_tools(phone):
    assert list(phone.tools) == ["get_line", "resume_line"]
    assert list(phone.tools_of("user")) == ["check_status_bar", "toggle_airplane_mode", "toggle_data"]
    assert list(phone.tools_of("solo")) == [*phone.tools, *phone.tools_of("user")]
    assert list(phone.tools_of("setup")) == ["turn_airplane_mode_on", "turn_data_off", "suspend_line"]
    assert list(phone.tools_of("check")) == ["assert_service_status", "assert_mobile_data"]
    assert {s.side for s in phone.all_tools.values()} == {"agent", "user", "setup", "check"}
    assert phone.manifest.user_tables == ["device"]


async def test_each_side_reaches_only_its_own_tools(phone):
    async with Fleet([phone]) as fleet:
        ep = await fleet.create_episode("dual_phone")
        for name, args in NOT_AGENT:
            r = await fleet.call(ep.id, name, args)
            assert (r.is_error, r.kind, r.text) == (True, "invalid", f"Error: Tool '{name}' not found.")
        r = await fleet.call(ep.id, "get_line", {"line_id": "L-100"}, side="user")
        assert r.text == "Error: Tool 'get_line' not found."
        r = await fleet.call(ep.id, "assert_service_status", {"expected": "connected"}, side="user")
        assert r.text == "Error: Tool 'assert_service_status' not found."
        r = await fleet.call(ep.id, "toggle_airplane_mode", {}, side="solo")
        assert r.text == "Airplane mode is now on."
        r = await fleet.call(ep.id, "check_status_bar", {}, side="user")
        assert r.text == "Airplane mode is on. No signal."
        r = await fleet.call(ep.id, "get_line", {"line_id": "L-100"}, side="solo")
        assert not r.is_error
        r = await fleet.call(ep.id, "assert_service_status", {"expected": "connected"}, side="check")
        assert (r.is_error, r.text) == (False, "False")
        r = await fleet.call(ep.id, "suspend_line", {"line_id": "L-100"}, side="setup")
        assert not r.is_error
        r = await fleet.call(ep.id, "suspend_line", {"line_id": "L-100"}, side="solo")
        assert r.text == "Error: Tool 'suspend_line' not found."
        state = (await fleet.export(ep.id)).state
        assert state["lines"][0]["status"] == "Suspended" and state["device"][0]["line_active"] == 0


def _with_tools(tmp_path: Path, extra: str) -> Path:
    root = tmp_path / "dual_phone"
    shutil.copytree(DUAL_PHONE_DIR, root)
    with (root / "tools.py").open("a") as f:
        f.write(extra)
    return root


async def test_a_user_tool_cannot_write_the_agents_tables(tmp_path):
    """The user's side is declared by writes=: a user tool that touches the carrier's lines is
    refused by the SQL guard and rolled back, as any tool outside its writes=."""
    root = _with_tools(
        tmp_path,
        '''

@tool(writes=["device"], side="user")
async def activate_my_line(db: Db) -> str:
    """Resume the line from the phone."""
    await db.execute("UPDATE device SET line_active = 1")
    await db.execute("UPDATE lines SET status = 'Active'")
    return "ok"
''',
    )
    async with Fleet([load_env(root)]) as fleet:
        ep = await fleet.create_episode("dual_phone")
        await fleet.call(ep.id, "suspend_line", {"line_id": "L-100"}, side="setup")
        before = await fleet.export(ep.id)
        r = await fleet.call(ep.id, "activate_my_line", {}, side="user")
        assert r.kind == "env_error" and "SQL refused" in r.text
        assert (await fleet.export(ep.id)).state_hash == before.state_hash


def test_a_name_on_two_sides_fails_to_load_with_one_line(tmp_path):
    root = _with_tools(
        tmp_path,
        '''

@tool(side="user", name="get_line")
async def my_line(db: Db, line_id: str) -> str:
    """The user's own view of a line.

    Args:
        line_id: The line.
    """
    return line_id
''',
    )
    with pytest.raises(EnvLoadError) as info:
        load_env(root)
    [problem] = info.value.problems
    assert "duplicate tool name 'get_line' (side 'agent' and side 'user')" in str(problem)
    assert "\n" not in str(problem)


def test_a_check_tool_may_not_write_and_a_side_is_checked():
    async def f(db: object) -> None:
        """x"""

    with pytest.raises(TypeError, match="may not write"):
        tool(writes=["device"], side="check")(f)
    with pytest.raises(TypeError, match="side='admin'"):
        tool(side="admin")(f)  # type: ignore[arg-type]


def test_user_tables_must_exist(tmp_path):
    root = tmp_path / "dual_phone"
    shutil.copytree(DUAL_PHONE_DIR, root)
    toml = (root / "env.toml").read_text().replace('["device"]', '["device", "handset"]')
    (root / "env.toml").write_text(toml)
    with pytest.raises(EnvLoadError, match="user_tables names 'handset'"):
        load_env(root)


async def test_only_agent_tools_are_listed_and_callable_over_mcp(phone):
    fleet = Fleet([phone])
    ep = await fleet.create_episode("dual_phone")
    async with Client(fleet.mcp("dual_phone").server) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["get_line", "resume_line"]
        for name, args in NOT_AGENT:
            r = await client.call_tool(name, args, meta={"envforge/episode": ep.id})
            assert r.is_error and isinstance(r.content[0], types.TextContent)
            assert r.content[0].text == f"Error: Tool '{name}' not found."
    assert (await fleet.export(ep.id)).state_hash == phone.seed_hash()
    await fleet.aclose()


def test_no_other_side_is_reachable_over_http(phone):
    fleet = Fleet([phone], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url) as http:
        listed = http.get("/control/envs").json()["envs"]
        assert [e["tools"] for e in listed] == [["get_line", "resume_line"]]
        episode = open_episode(http, "dual_phone")
        for name, args in NOT_AGENT:
            kind, text = call_tool(http, "dual_phone", episode, name, args)
            assert (kind, text) == ("invalid", f"Error: Tool '{name}' not found.")
        state = http.get(f"/control/episodes/{episode}/state").json()
        assert state["state_hash"] == phone.seed_hash()
        assert json.dumps(state).count('"airplane_mode": 0') == 1


CONFINED_SIDES = '''
"""Notes, with a tool of each side."""

from __future__ import annotations

from envforge.server import Db, tool


@tool
async def count_notes(db: Db) -> int:
    """How many notes there are."""
    return await db.fetch_value("SELECT COUNT(*) FROM notes")


@tool(writes=["notes"], side="user")
async def add_my_note(db: Db, body: str) -> str:
    """The user writes a note.

    Args:
        body: The note.
    """
    await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
    return "added"


@tool(side="check")
async def assert_notes(db: Db, n: int) -> bool:
    """Whether there are n notes.

    Args:
        n: How many.
    """
    return await db.fetch_value("SELECT COUNT(*) FROM notes") == n
'''


async def test_a_confined_envs_sides_travel_from_its_worker(tmp_path):
    """A confined env's tools.py is loaded only in its sandboxed worker: the side of each tool
    comes back over the pipe, and the serving process splits them as for a trusted env."""
    from support.confined import make_confined_env

    env = load_env(make_confined_env(tmp_path / "payloads", CONFINED_SIDES))
    assert list(env.tools) == ["count_notes"]
    assert list(env.tools_of("user")) == ["add_my_note"] and list(env.tools_of("check")) == ["assert_notes"]
    async with Fleet([env]) as fleet:
        ep = await fleet.create_episode("payloads")
        r = await fleet.call(ep.id, "add_my_note", {"body": "x"})
        assert r.text == "Error: Tool 'add_my_note' not found."
        assert (await fleet.call(ep.id, "add_my_note", {"body": "x"}, side="user")).text == "added"
        assert (await fleet.call(ep.id, "assert_notes", {"n": 2}, side="check")).text == "True"
        assert (await fleet.call(ep.id, "count_notes", {}, side="user")).text.startswith("Error: Tool")


async def test_python_style_errors_name_each_sides_owner(tmp_path):
    """τ² names the user's toolkit in a user tool's argument error (`TelecomUserTools.x()`), the
    agent's in an agent tool's: `python_owners` gives a side its own class name."""
    root = tmp_path / "dual_phone"
    shutil.copytree(DUAL_PHONE_DIR, root)
    toml = (root / "env.toml").read_text()
    extra = 'argument_errors = "python"\npython_owner = "PhoneTools"\n'
    extra += 'python_owners = { user = "PhoneUserTools" }\n'
    (root / "env.toml").write_text(toml + extra)
    async with Fleet([load_env(root)]) as fleet:
        ep = await fleet.create_episode("dual_phone")
        r = await fleet.call(ep.id, "toggle_data", {"x": 1}, side="user")
        assert r.text == "Error: PhoneUserTools.toggle_data() got an unexpected keyword argument 'x'"
        r = await fleet.call(ep.id, "get_line", {})
        assert r.text == "Error: PhoneTools.get_line() missing 1 required positional argument: 'line_id'"
    (root / "env.toml").write_text(toml + 'python_owners = { phone = "X" }\n')
    with pytest.raises(EnvLoadError, match=r"python_owners\.phone"):
        load_env(root)
