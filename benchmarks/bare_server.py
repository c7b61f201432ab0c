"""The baseline: a bare low-level `mcp` server answering one tool with the same aiosqlite query.

No episodes, no validation, no transactions: the cheapest correct thing the mcp SDK can serve.
envforge's serving is measured against it in the same run (`bench_serving.py`).

usage: python benchmarks/bare_server.py stdio | http PORT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import mcp_types as types
from mcp.server import Server

from envforge.server import load_env

BANK = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "bank"
QUERY = "SELECT account_id, customer_id, balance, status FROM accounts WHERE account_id = ?"


def build_bare_server(seed_db: bytes) -> tuple[Server[Any], list[aiosqlite.Connection]]:
    holder: list[aiosqlite.Connection] = []

    async def connection() -> aiosqlite.Connection:
        if not holder:
            import sqlite3

            def connect() -> sqlite3.Connection:
                conn = sqlite3.connect(":memory:", check_same_thread=False)
                conn.deserialize(seed_db)
                return conn

            holder.append(await aiosqlite.Connection(connect, 64))
        return holder[0]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        schema = {
            "type": "object",
            "properties": {"account_id": {"type": "string"}},
            "required": ["account_id"],
        }
        return types.ListToolsResult(
            tools=[types.Tool(name="get_account", description="Get.", input_schema=schema)]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        conn = await connection()
        rows = await conn.execute_fetchall(QUERY, ((params.arguments or {}).get("account_id"),))
        a, c, b, s = rows[0]
        text = json.dumps({"account_id": a, "customer_id": c, "balance": b, "status": s})
        return types.CallToolResult(content=[types.TextContent(text=text)])

    return Server("bare", on_list_tools=list_tools, on_call_tool=call_tool), holder


def main() -> None:
    server, _ = build_bare_server(load_env(BANK).seed_db)
    if sys.argv[1] == "stdio":
        from mcp.server.stdio import stdio_server

        async def run() -> None:
            async with stdio_server() as (r, w):
                await server.run(r, w, server.create_initialization_options())

        anyio.run(run)
    else:
        import uvicorn

        uvicorn.run(
            server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )


if __name__ == "__main__":
    main()
