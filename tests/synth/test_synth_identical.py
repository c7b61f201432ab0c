"""Synthesis is deterministic to the byte: for every bundled env that ships tasks, `envforge synth
tasks envs/E --n N --seed 0 --out OUT` (N: the lines of envs/E/tasks.jsonl) writes exactly
envs/E/tasks.jsonl. Speed work and refactors of synthesis must keep this true."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.synth_commands import register

from support.paths import ENVS, bundled_env_dirs

SHIPPING = [
    p.name for p in bundled_env_dirs() if (p / "tasks.jsonl").exists() and (p / "tasks.jsonl").stat().st_size
]


def test_every_shipping_env_is_covered() -> None:
    assert len(SHIPPING) >= 8, SHIPPING


@pytest.mark.parametrize("name", SHIPPING)
def test_synthesis_reproduces_shipped_tasks(name: str, tmp_path: Path) -> None:
    shipped = ENVS / name / "tasks.jsonl"
    n = len(shipped.read_bytes().splitlines())
    out = tmp_path / "tasks.jsonl"
    app = typer.Typer()
    register(app)
    args = ["synth", "tasks", str(ENVS / name), "--n", str(n), "--seed", "0", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == shipped.read_bytes()
