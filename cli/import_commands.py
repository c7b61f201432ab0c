"""Commands that import environments and tasks from other benchmarks: `import tau2`."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import typer
from rich.table import Table

from envforge.server import EnvLoadError, load_env
from envforge.synth import CHECK_REASONS, ENV_CODE, GENERATED, Tau2ImportError, import_tau2_env, verify_report

from .common import console, fail

import_app = typer.Typer(no_args_is_help=True, help="Import environments and tasks from other benchmarks.")


@import_app.command("tau2")
def import_tau2(
    src_dir: Path = typer.Argument(..., help="τ²-bench's retail data folder (db.json, tasks.json, ...)."),
    env_dir: Path = typer.Option(
        ..., "-o", "--out", help="The tau2_retail env folder (holding env.toml, schema.sql, tools.py)."
    ),
) -> None:
    """Write seed.json, policy.md and tasks.jsonl into ENV_DIR from τ²'s data, then self-check the tasks.

    Idempotent: files whose bytes would not change are not rewritten. Tasks failing a self-check
    are kept (τ² keeps them) and listed with the reason.
    """
    # The self-checks replay gold calls that fail on purpose; the runtime logs those.
    logging.getLogger("envforge.server.runtime").setLevel(logging.CRITICAL)
    if not env_dir.is_dir():
        fail(f"{env_dir}: not a directory (expected the tau2_retail env folder with {', '.join(ENV_CODE)})")
    try:
        tasks = import_tau2_env(src_dir, env_dir, tasks=True)
        env = load_env(env_dir)
    except Tau2ImportError as exc:
        fail(str(exc))
    except EnvLoadError as exc:
        fail(f"could not load {env_dir}: " + "; ".join(str(p) for p in exc.problems))
    assert tasks is not None  # tasks=True: imported or raised
    report = verify_report(env, tasks)

    splits: Counter[str] = Counter(s for t in tasks for s in t.split)
    table = Table(title=f"{env.name}: {len(tasks)} τ² tasks -> {env_dir / 'tasks.jsonl'}")
    table.add_column("split")
    table.add_column("tasks", justify="right")
    for name, count in splits.items():
        table.add_row(name, str(count))
    unsplit = sum(1 for t in tasks if not t.split)
    if unsplit:
        table.add_row("(in no split)", str(unsplit))
    console.print(table)

    checks = Table(title="self-checks (failing tasks are kept)")
    for col in ("check", "failed", "tasks", "reason"):
        checks.add_column(col, justify="right" if col == "failed" else "left")
    for check, ids in report.by_check().items():
        checks.add_row(check, str(len(ids)), ", ".join(ids) or "-", CHECK_REASONS[check] if ids else "")
    console.print(checks)
    console.print(f"wrote {', '.join(GENERATED)} in {env_dir}")


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
