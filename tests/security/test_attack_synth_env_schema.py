"""`envforge synth env` fed a poisoned schema must not hang at "round 0: gates".

The recorded library responses are replayed with a `schema.sql` whose last statement is a
`CREATE TABLE ... AS WITH RECURSIVE ...` that computes for ever: it passed the text check of SQL,
and synthesis's load gate applied it in-process with no deadline, so `synth env` never got past
its first round's gates. Three layers stop it now: synthesis's static gate and `load_env` both
judge the schema by SQLite's authorizer (the schema policy) and refuse it unrun, and past them the
schema is built in a confined child under a deadline (`ENVFORGE_SCHEMA_TIMEOUT_S`, here 4 s). With
all three removed the test fails (still at its gates after 120 s); with only the child, it passes
in ~5 s.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli import envsynth_commands, synth_commands

from support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "envsynth"
LIBRARY_DOCS = REPO / "envs" / "library" / "docs"
SCHEMA_TIMEOUT_S = 4.0
ENDLESS = (
    "CREATE TABLE spin AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT max(x) AS x FROM c;\n"
)


def test_synth_env_with_a_poisoned_schema_ends_its_round_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    monkeypatch.setenv("ENVFORGE_SCHEMA_TIMEOUT_S", str(SCHEMA_TIMEOUT_S))
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURES / "library", fixture)
    (fixture / "responses.json").write_text(
        (fixture / "responses.json").read_text().replace("../../../../envs", str(REPO / "envs"))
    )
    schema = fixture / "schema.0.sql.txt"
    schema.write_text(schema.read_text().rstrip() + "\n" + ENDLESS)
    app = typer.Typer()
    synth_commands.register(app)
    envsynth_commands.register(app)
    out = tmp_path / "out" / "library"
    args = ["synth", "env", str(LIBRARY_DOCS), "-o", str(out), "--replay", str(fixture), "--max-rounds", "0"]
    done: dict[str, Any] = {}

    def synthesize() -> None:
        done["result"] = CliRunner().invoke(app, args)

    start = time.monotonic()
    runner = threading.Thread(target=synthesize, daemon=True)  # a hang must fail the test, not hold it
    runner.start()
    runner.join(120)
    took = time.monotonic() - start
    assert not runner.is_alive(), f"synth env was still at its gates after {took:.0f}s"
    result = done["result"]
    assert result.exit_code != 0 or "rejected" in result.output, result.output[-2000:]
    assert "schema" in result.output, result.output[-2000:]
    assert not (out / "tools.py").exists()
