"""The tool graph: measured footprints and value edges match what is known by hand.

`write_shop_env` builds a small env whose dependencies are known exactly; the task and scoring
tests import it from here.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.synth_commands import register
from envforge.server import Environment, load_env
from envforge.synth import build_graph, graph_json, to_dot, to_mermaid

SHOP_SCHEMA = """
CREATE TABLE customers (customer_id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE,
                        balance REAL NOT NULL);
CREATE TABLE orders (order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers(customer_id),
                     status TEXT NOT NULL CHECK (status IN ('pending', 'shipped', 'cancelled')),
                     total REAL NOT NULL);
CREATE TABLE notes (note_id INTEGER PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers(customer_id),
                    body TEXT NOT NULL);
"""

SHOP_TOOLS = '''
import random

from envforge.server import ToolError, tool


@tool
async def find_customer(db, email: str) -> dict:
    """Find a customer by email.

    Args:
        email: The customer's email.
    """
    rows = await db.execute_fetchall(
        "SELECT customer_id, name, balance FROM customers WHERE email = ?", (email,)
    )
    if not rows:
        raise ToolError("no such customer")
    return {"customer_id": rows[0][0], "name": rows[0][1], "balance": rows[0][2]}


@tool
async def list_orders(db, customer_id: str) -> list:
    """List a customer's orders.

    Args:
        customer_id: The customer id.
    """
    rows = await db.execute_fetchall(
        "SELECT order_id, status, total FROM orders WHERE customer_id = ? ORDER BY order_id", (customer_id,)
    )
    return [{"order_id": o, "status": s, "total": t} for o, s, t in rows]


@tool
async def get_order(db, order_id: str) -> dict:
    """Get an order.

    Args:
        order_id: The order id.
    """
    rows = await db.execute_fetchall(
        "SELECT order_id, customer_id, status, total FROM orders WHERE order_id = ?", (order_id,)
    )
    if not rows:
        raise ToolError("no such order")
    o, c, s, t = rows[0]
    return {"order_id": o, "customer_id": c, "status": s, "total": t}


@tool(writes=["orders", "customers"])
async def cancel_order(db, order_id: str) -> dict:
    """Cancel a pending order and refund its total to the customer's balance.

    Args:
        order_id: The order id.
    """
    rows = await db.execute_fetchall(
        "SELECT customer_id, status, total FROM orders WHERE order_id = ?", (order_id,)
    )
    if not rows or rows[0][1] != "pending":
        raise ToolError("only pending orders can be cancelled")
    await db.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (order_id,))
    await db.execute(
        "UPDATE customers SET balance = round(balance + ?, 2) WHERE customer_id = ?", (rows[0][2], rows[0][0])
    )
    return {"order_id": order_id, "status": "cancelled"}


@tool(writes=["notes"])
async def add_note(db, customer_id: str, body: str) -> dict:
    """Add a note to a customer's file.

    Args:
        customer_id: The customer id.
        body: The note.
    """
    cur = await db.execute("INSERT INTO notes (customer_id, body) VALUES (?, ?)", (customer_id, body))
    return {"note_id": cur.lastrowid, "customer_id": customer_id}


@tool(writes=["notes"])
async def add_lucky_note(db, customer_id: str) -> str:
    """Add a note with a random lucky number (not reproducible on purpose).

    Args:
        customer_id: The customer id.
    """
    await db.execute(
        "INSERT INTO notes (customer_id, body) VALUES (?, ?)", (customer_id, str(random.random()))
    )
    return "ok"
'''

SHOP_SEED = {
    "customers": [
        {"customer_id": "C-1", "name": "Ada Lovelace", "email": "ada@example.com", "balance": 10.0},
        {"customer_id": "C-2", "name": "Bo Chen", "email": "bo@example.com", "balance": 0.0},
    ],
    "orders": [
        {"order_id": "O-1", "customer_id": "C-1", "status": "pending", "total": 30.5},
        {"order_id": "O-2", "customer_id": "C-1", "status": "shipped", "total": 12.25},
        {"order_id": "O-3", "customer_id": "C-1", "status": "pending", "total": 99.0},
        {"order_id": "O-4", "customer_id": "C-2", "status": "pending", "total": 5.0},
        {"order_id": "O-5", "customer_id": "C-2", "status": "cancelled", "total": 7.75},
    ],
    "notes": [{"note_id": 1, "customer_id": "C-2", "body": "prefers email"}],
}


def write_shop_env(root: Path, *, lucky: bool = True) -> Path:
    """A small shop env with hand-known dependencies; `lucky=False` leaves out the random tool."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "env.toml").write_text('name = "shop"\ndescription = "A tiny shop for synthesis tests."\n')
    (root / "policy.md").write_text("Only pending orders can be cancelled.\n")
    (root / "schema.sql").write_text(textwrap.dedent(SHOP_SCHEMA))
    (root / "seed.json").write_text(json.dumps(SHOP_SEED, indent=1))
    tools = SHOP_TOOLS
    if not lucky:
        tools = tools[: tools.index('@tool(writes=["notes"])\nasync def add_lucky_note')]
    (root / "tools.py").write_text(tools)
    return root


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    return load_env(write_shop_env(tmp_path_factory.mktemp("graph") / "shop"))


async def test_footprints_are_measured_by_the_authorizer(shop: Environment) -> None:
    graph = await build_graph(shop)
    cancel = graph.tool("cancel_order")
    assert cancel.writes == {"customers": ["balance"], "orders": ["status"]}
    assert set(cancel.reads) == {"orders", "customers"}
    assert graph.tool("add_note").writes == {"notes": ["*"]}
    assert graph.tool("list_orders").reads == {"orders": ["customer_id", "order_id", "status", "total"]}
    assert graph.tool("find_customer").writes == {}
    assert graph.tool("find_customer").result_keys == ["balance", "customer_id", "name"]


async def test_value_edges_match_hand_known_dependencies(shop: Environment) -> None:
    graph = await build_graph(shop)
    edges = {(e.source, e.target, e.param) for e in graph.edges}
    known = {
        ("find_customer", "list_orders", "customer_id"),
        ("find_customer", "add_note", "customer_id"),
        ("list_orders", "get_order", "order_id"),
        ("list_orders", "cancel_order", "order_id"),
        ("get_order", "list_orders", "customer_id"),
        ("get_order", "cancel_order", "order_id"),
        ("cancel_order", "get_order", "order_id"),
    }
    assert known <= edges
    # Order ids never feed customer parameters, nothing feeds an email, and no tool feeds itself.
    assert ("list_orders", "add_note", "customer_id") not in edges
    assert not any(t == "find_customer" for _, t, _ in edges)
    assert not any(s == t for s, t, _ in edges)
    state = {(s.writer, s.reader) for s in graph.state_edges}
    assert ("cancel_order", "get_order") in state and ("add_note", "get_order") not in state


async def test_values_evidence_links_differently_named_keys(bank_env: Environment) -> None:
    graph = await build_graph(bank_env)
    ev = {(e.source, e.target, e.key, e.param): e.evidence for e in graph.edges}
    assert ev[("list_accounts", "transfer", "account_id", "src")] == "values"
    assert ev[("list_accounts", "get_account", "account_id", "account_id")] == "name"
    assert ("list_accounts", "transfer", "status", "src") not in ev


async def test_graph_output_is_deterministic_and_renders(shop: Environment) -> None:
    a, b = await build_graph(shop), await build_graph(shop)
    assert graph_json(a) == graph_json(b)
    assert "list_orders -->|order_id| cancel_order" in to_mermaid(a)
    assert '"list_orders" -> "cancel_order" [label="order_id"];' in to_dot(a)


def test_graph_command_writes_graph_json(tmp_path: Path) -> None:
    root = write_shop_env(tmp_path / "shop")
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["graph", str(root), "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("graph LR")
    data = json.loads((root / "graph.json").read_text())
    assert data["env"] == "shop" and {t["name"] for t in data["tools"]} >= {"cancel_order", "add_note"}
    bad = CliRunner().invoke(app, ["graph", str(root), "--format", "svg"])
    assert bad.exit_code != 0
