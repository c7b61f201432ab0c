"""The CLI's words about local models render: rich reads `[...]` as markup, and `local[/<name>]`
in a help text or a console line crashed `envforge eval --help` and the end of `make demo`."""

from __future__ import annotations

import subprocess
import sys

from rich.console import Console

from envforge.cli import demo


def test_eval_help_names_the_local_roles() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "eval", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "local or local/NAME" in proc.stdout


def test_demo_closing_lines_render() -> None:
    console = Console(record=True, width=200)
    demo.print_next_steps(console, [demo.REPO / "envs" / "retail_orders"])
    assert "local[/<name>]" in console.export_text()
