"""envforge's code reads no private attribute of a dependency's object.

A private attribute (aiosqlite's `Connection._execute`, its worker queue `_tx`) can change or
vanish in any release without notice, and a version bound only hides that until the bound is
lifted. Two rules, over every module of every envforge package:

- an attribute named like one of the private fields envforge once borrowed from aiosqlite
  (`_conn`, `_execute`, `_connection`, `_tx`, ...) is read only on `self`/`cls` (an envforge
  object's own field), never on another object, which may be a dependency's;
- a third-party module (not envforge, not the standard library) is never reached for a `_name`,
  neither as `module._name` nor as `from module import _name`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import REPO

PACKAGES = ("api", "server", "synth", "harness", "trainer", "integrations", "cli")

BORROWED = frozenset(
    {
        "_conn",
        "_connection",
        "_connector",
        "_cursor",
        "_execute",
        "_execute_fetchall",
        "_execute_insert",
        "_iter_chunk_size",
        "_running",
        "_thread",
        "_tx",
    }
)
"""aiosqlite's private fields (`Connection`, `Cursor`), once read across the server."""

OWN = frozenset({"self", "cls"})


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return bool(top) and top != "envforge" and top not in sys.stdlib_module_names


def private_reads(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each read of a dependency's private attribute in `source`."""
    tree = ast.parse(source)
    modules: set[str] = set()  # local names bound to third-party modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _third_party(alias.name):
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _third_party(node.module):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        yield node.lineno, f"from {node.module} import {alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in OWN:
            continue
        if node.attr in BORROWED:
            yield node.lineno, f"{ast.unparse(owner)}.{node.attr}"
        elif isinstance(owner, ast.Name) and owner.id in modules:
            yield node.lineno, f"{owner.id}.{node.attr}"


def _modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def test_no_module_reads_a_private_attribute_of_a_dependency() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _modules()
        for line, what in private_reads(path.read_text())
    ]
    assert not found, "private attributes of dependencies read:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("async def f(conn):\n    return await conn._execute(g)\n", "conn._execute"),
        ("def f(ep):\n    return ep.conn._conn.serialize()\n", "ep.conn._conn"),
        ("def f(conn):\n    conn._tx.put_nowait(job)\n", "conn._tx"),
        ("import aiosqlite\nx = aiosqlite._STOP_RUNNING_SENTINEL\n", "aiosqlite._STOP_RUNNING_SENTINEL"),
        ("from anyio import _backends\n", "from anyio import _backends"),
    ],
)
def test_the_scan_catches_each_kind_of_read(source: str, caught: str) -> None:
    assert [what for _, what in private_reads(source)] == [caught]


@pytest.mark.parametrize(
    "source",
    [
        "class C:\n    def f(self):\n        return self._conn\n",  # an object's own field
        "import os\nos._exit(0)\n",  # the standard library documents its few `_` names
        "from .db import _dicts\n",  # envforge's own modules
    ],
)
def test_the_scan_leaves_own_fields_alone(source: str) -> None:
    assert list(private_reads(source)) == []
