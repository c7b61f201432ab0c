"""A small shop env whose tool dependencies are known by hand (graph, task and scoring tests)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

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
