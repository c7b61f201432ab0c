"""Helpers shared by the CLI's command modules: loading envs with readable errors, console, JSON out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from envforge.server import Environment, EnvLoadError, load_env

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def load_envs(dirs: list[Path]) -> list[Environment]:
    """Load every env dir; on failure print each problem as `file:line: message` and exit 2."""
    envs = []
    for d in dirs:
        try:
            envs.append(load_env(d))
        except EnvLoadError as exc:
            for problem in exc.problems:
                console.print(f"[red]{problem}[/]")
            fail(f"could not load env {d}")
    return envs


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()
