"""Attacks on atomicity: a call cut short by its caller, a tool that commits behind the runtime's back,
a tool writing a table it did not declare, and a `writes=` naming a table that does not exist."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from envforge.server import EnvLoadError, Fleet, build_app, load_env

from support.paths import FIXTURES
from support.serving import ServerThread

ATTACK_SHOP = FIXTURES / "attack_shop"
ITEMS = 12


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _assert_no_fragment(state: dict[str, list[dict]], order_id: str) -> None:
    """The order is either all there (order, every item, payment) or not there at all."""
    orders = [r for r in state["orders"] if r["order_id"] == order_id]
    items = [r for r in state["order_items"] if r["order_id"] == order_id]
    payments = [r for r in state["payments"] if r["order_id"] == order_id]
    assert (len(orders), len(items), len(payments)) in {(0, 0, 0), (1, ITEMS, 1)}, (orders, items, payments)


async def _cut_short(client: Client, order_id: str) -> None:
    """Call the slow write tool with a caller-side timeout well before it can finish."""
    with anyio.move_on_after(0.4):
        await client.call_tool("place_order", {"order_id": order_id, "items": ITEMS, "pause": 0.1})
        pytest.fail("the slow call finished before the caller's timeout")


async def test_http_call_cut_short_by_the_caller_leaves_no_fragment() -> None:
    fleet = Fleet([load_env(ATTACK_SHOP)], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            ep = (await http.post("/control/episodes", json={"env": "attack_shop"})).json()
            url = server.url + ep["mcp_path"]
            for attempt in range(3):
                async with Client(url) as client:
                    await _cut_short(client, f"O-cut-{attempt}")
                await anyio.sleep(ITEMS * 0.1 + 0.5)  # whatever the server still does with it is done
                async with Client(url) as client:  # the next write must commit only itself
                    note = await client.call_tool("add_note", {"text": f"after {attempt}"})
                    assert not note.is_error, _text(note)
                state = (await http.get(f"/control/episodes/{ep['episode_id']}/state")).json()["state"]
                _assert_no_fragment(state, f"O-cut-{attempt}")
                assert f"after {attempt}" in [n["text"] for n in state["notes"]]


async def test_stdio_call_cut_short_by_the_caller_leaves_no_fragment() -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "envforge.cli", "serve", str(ATTACK_SHOP), "--transport", "stdio"],
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},
    )
    async with Client(params) as client:
        await _cut_short(client, "O-cut")
        await anyio.sleep(ITEMS * 0.1 + 0.5)
        note = await client.call_tool("add_note", {"text": "after"})
        assert not note.is_error, _text(note)
        counts = {}
        for table in ("orders", "order_items", "payments"):
            counts[table] = json.loads(_text(await client.call_tool("count_rows", {"table": table})))
    assert (counts["orders"], counts["order_items"], counts["payments"]) in {(1, 1, 1), (2, 1 + ITEMS, 2)}


async def test_in_process_cancellation_and_shutdown_roll_back() -> None:
    fleet = Fleet([load_env(ATTACK_SHOP)])
    episode = await fleet.create_episode("attack_shop")
    with anyio.move_on_after(0.25):
        await fleet.call(episode.id, "place_order", {"order_id": "O-cancel", "items": ITEMS, "pause": 0.05})
    assert not (await fleet.call(episode.id, "add_note", {"text": "next"})).is_error
    _assert_no_fragment((await fleet.export(episode.id))[0], "O-cancel")

    # the episode closed while a call is in flight: the call keeps nothing and says so
    async with anyio.create_task_group() as tg:
        results = []

        async def slow() -> None:
            results.append(
                await fleet.call(episode.id, "place_order", {"order_id": "O-shut", "items": 4, "pause": 0.05})
            )

        tg.start_soon(slow)
        await anyio.sleep(0.05)
        episode.closed = True  # what EpisodeStore.close does first, before it waits for the call
    assert results[0].is_error and "closed during the call" in results[0].text
    rows = await episode.conn.execute_fetchall("SELECT count(*) FROM orders WHERE order_id = 'O-shut'")
    assert rows == [(0,)]
    await fleet.aclose()


async def test_commit_then_raise_keeps_nothing() -> None:
    fleet = Fleet([load_env(ATTACK_SHOP)])
    episode = await fleet.create_episode("attack_shop")
    _, before = await fleet.export(episode.id)
    result = await fleet.call(episode.id, "commit_then_raise", {"text": "kept?"})
    assert result.is_error and result.kind == "env_error"
    assert (await fleet.export(episode.id))[1] == before
    await fleet.aclose()


async def test_write_to_an_undeclared_table_is_refused_and_rolled_back() -> None:
    fleet = Fleet([load_env(ATTACK_SHOP)])
    episode = await fleet.create_episode("attack_shop")
    _, before = await fleet.export(episode.id)
    result = await fleet.call(episode.id, "note_and_audit", {"text": "x"})
    assert result.kind == "env_error" and "writing table 'audit'" in result.text
    assert (await fleet.export(episode.id))[1] == before  # the declared note is rolled back too
    await fleet.aclose()


def test_writes_naming_a_missing_table_is_a_load_error_with_file_and_line(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    shutil.copytree(ATTACK_SHOP, env_dir)
    tools = env_dir / "tools.py"
    text = tools.read_text().replace(
        '@tool(writes=["notes"])\nasync def add_note', '@tool(writes=["notez"])\nasync def add_note'
    )
    tools.write_text(text)
    line = text.splitlines().index("async def add_note(db: Db, text: str) -> str:") + 1
    with pytest.raises(EnvLoadError) as caught:
        load_env(env_dir)
    assert f"tools.py:{line}: tool 'add_note': writes= names 'notez'" in str(caught.value)
