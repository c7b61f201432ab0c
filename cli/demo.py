"""`envforge demo`: the main job on the embedded default.

Until the evaluation harness lands, it shows what serving means: a fleet in-process, an MCP
client attached to two episodes of the same env, a write in one, and proof that the other
did not see it.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

from envforge.server import Fleet, load_env
from envforge.server.client import episode_client

REPO = Path(__file__).resolve().parents[1]
DEMO_ENV = REPO / "tests" / "fixtures" / "bank"


async def _demo(console: Console) -> None:
    env = load_env(DEMO_ENV)
    fleet = Fleet([env])
    one = await fleet.create_episode(env.name)
    two = await fleet.create_episode(env.name)
    async with episode_client(fleet, env.name, one.id) as a, episode_client(fleet, env.name, two.id) as b:
        tools = await a.list_tools()
        console.print(f"[bold]{env.name}[/]: {len(tools)} tools over MCP: {', '.join(t.name for t in tools)}")
        write = await a.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 30})
        console.print(f"episode {one.id}: transfer -> {write.text}")
        refused = await a.call_tool("transfer", {"src": "A-3", "dst": "A-2", "amount": 5})
        console.print(f"episode {one.id}: transfer from a frozen account -> {refused.text}")
        table = Table(title="A-1 balance per episode")
        table.add_column("episode")
        table.add_column("balance")
        for ep, client in ((one, a), (two, b)):
            account = json.loads((await client.call_tool("get_account", {"account_id": "A-1"})).text)
            table.add_row(ep.id, str(account["balance"]))
        console.print(table)
    for ep in (one, two):
        _, digest = await fleet.export(ep.id)
        console.print(f"state hash {ep.id}: {digest[:16]}…")
    await fleet.aclose()


def demo() -> None:
    """Run the main job on the embedded default (serving two isolated episodes in-process)."""
    anyio.run(_demo, Console())
