"""The tool graph: measured footprints and value edges match what is known by hand.

`write_shop_env` (`support.shop`) builds a small env whose dependencies are known exactly; the task
and scoring tests play on it too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.synth_commands import register
from envforge.server import Environment, load_env
from envforge.synth import build_graph, graph_json, to_dot, to_mermaid

from support.shop import write_shop_env


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
