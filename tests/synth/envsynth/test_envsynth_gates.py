"""The static gate and the seed sandbox: what may never be imported or run, and what may."""

from __future__ import annotations

from pathlib import Path

import pytest

from envforge.server import SEED_IMPORTS, check_python, check_sql
from envforge.synth.envsynth import SeedRunError, run_seed_generator

from support.paths import REPO


def rules(source: str, **kw: object) -> set[str]:
    return {v.rule for v in check_python(source, **kw)}  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["it_tickets", "retail_orders"])
def test_hand_written_envs_pass_the_gate(name: str) -> None:
    assert check_python((REPO / "envs" / name / "tools.py").read_text()) == []


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("import os\n", "forbidden import"),
        ("import urllib.request\n", "forbidden import"),
        ("from subprocess import run\n", "forbidden import"),
        ("from aiosqlite import connect\n", "forbidden import"),
        ("from . import x\n", "forbidden import"),
        ("async def f(db):\n    return open('/etc/passwd').read()\n", "forbidden name"),
        ("async def f(db):\n    return eval('1')\n", "forbidden name"),
        ("async def f(db):\n    return __import__('os')\n", "forbidden name"),
        ("async def f(db):\n    return globals()\n", "forbidden name"),
        ("async def f(db):\n    return db._conn\n", "private or dunder attribute"),
        ("async def f(db):\n    return ().__class__\n", "private or dunder attribute"),
        ("async def f(db, n):\n    return getattr(db, n)\n", "forbidden attribute access"),
        ("async def f(db):\n    return '{0.__class__}'.format(db)\n", "forbidden string"),
        ("async def f(db):\n    await db.execute(\"ATTACH DATABASE 'x.db' AS y\")\n", "forbidden SQL"),
        ("print('hello at import')\n", "statement at module top level"),
        ("X = len(sorted([3]))\nY = print('x')\n", "call at import time (assignment)"),
        ("def f(x=print('x')):\n    pass\n", "call at import time (default)"),
        ("def f(x: print('x')):\n    pass\n", "call in annotation"),
        ("def f(:\n", "syntax error"),
    ],
)
def test_each_rule_bites(source: str, rule: str) -> None:
    assert rule in rules(source)


def test_seed_allowlist_admits_random_only_for_seeds() -> None:
    assert rules("import random\n") == {"forbidden import"}
    assert rules("import random\n", imports=SEED_IMPORTS) == set()


def test_sql_gate() -> None:
    assert [v.line for v in check_sql("CREATE TABLE t (id TEXT PRIMARY KEY);\nATTACH 'x' AS y;\n")] == [2]
    assert check_sql("CREATE TABLE t (id TEXT PRIMARY KEY); -- pragma in a comment is fine\n") == []


async def test_sandbox_runs_a_generator() -> None:
    src = (
        "import random\n\ndef generate():\n    r = random.Random(1)\n"
        "    return {'t': [{'id': r.randrange(9)}]}\n"
    )
    assert (await run_seed_generator(src))["t"][0]["id"] in range(9)


async def test_sandbox_refuses_imports_and_open_even_unchecked(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(SeedRunError, match="not allowed"):
        await run_seed_generator("import os\n\ndef generate():\n    return {}\n")
    with pytest.raises(SeedRunError, match="open"):
        await run_seed_generator(f"def generate():\n    open({str(marker)!r}, 'w')\n    return {{}}\n")
    assert not marker.exists()


async def test_sandbox_time_limit() -> None:
    with pytest.raises(SeedRunError, match="longer than"):
        await run_seed_generator("def generate():\n    while True:\n        pass\n", timeout=1.0)


async def test_sandbox_checks_the_shape() -> None:
    with pytest.raises(SeedRunError, match="generate"):
        await run_seed_generator("def generate():\n    return [1, 2]\n")
