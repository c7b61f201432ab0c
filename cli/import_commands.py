"""Commands that import environments and tasks from other benchmarks: `import tau2`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from envforge.server import EnvLoadError, load_env
from envforge.synth import (
    CHECK_REASONS,
    ENV_CODE,
    GENERATED,
    Tau2ImportError,
    VerifyReport,
    import_tau2_env,
    verify_report,
)

from .common import console, fail, quiet_tool_failures

import_app = typer.Typer(no_args_is_help=True, help="Import environments and tasks from other benchmarks.")


@import_app.command("tau2")
def import_tau2(
    src_dir: Path = typer.Argument(
        ...,
        help="τ²-bench's retail, airline or telecom data folder as published (db.json, tasks.json, "
        "policy.md, split_tasks.json; telecom: db.toml, user_db.toml, main_policy.md, "
        "tech_support_manual.md, tasks.json, split_tasks.json); the domain is recognised from its DB.",
    ),
    env_dir: Path = typer.Option(
        ...,
        "-o",
        "--out",
        help="The env folder to write (created if needed; never another env's), e.g. envs/tau2_airline.",
    ),
    strict_tools: bool = typer.Option(
        False,
        "--strict-tools",
        help="Fail when SRC_DIR's optional tools.json disagrees with the port's tools.",
    ),
    policy_rules: bool = typer.Option(
        False,
        "--policy-rules",
        help="Opt in to envforge's policy part: write policy_rules.toml (identity before a write, "
        "the user's yes before each write, a transfer only where the task expects one). "
        "Default: τ²'s own reward.",
    ),
) -> None:
    """Write the tau2_retail, tau2_airline or tau2_telecom env into ENV_DIR from τ²'s data, then
    self-check the tasks (telecom's dual-control tasks are checked against τ²'s replays instead).

    ENV_DIR gets the port's code (env.toml, schema.sql, tools.py, shipped with envforge), and
    seed.json, policy.md and tasks.jsonl generated from SRC_DIR. The port's tools define the tool
    schema; a tools.json (telecom: and user_tools.json) in SRC_DIR is only cross-checked
    (differences are warnings, errors with --strict-tools). Idempotent: files whose bytes would
    not change are not rewritten. Tasks failing a self-check are kept (τ² keeps them) and listed
    with the reason.
    """
    quiet_tool_failures()  # the self-checks replay gold calls that fail on purpose
    try:
        imported = import_tau2_env(src_dir, env_dir, strict_tools=strict_tools, policy_rules=policy_rules)
        env = load_env(env_dir)
    except Tau2ImportError as exc:
        fail(str(exc))
    except EnvLoadError as exc:
        fail(f"could not load {env_dir}: " + "; ".join(str(p) for p in exc.problems))
    except OSError as exc:  # an -o that cannot be created or written
        fail(f"cannot write {env_dir}: {exc}")
    for line in imported.tool_mismatches:
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    tasks = imported.tasks
    assert tasks is not None  # imported with tasks, or raised
    # The self-checks replay gold calls of one side from the seed: a dual-control task (telecom:
    # setup, both sides' calls, env assertions) is checked against τ²'s own replays instead.
    dual = bool(env.tools_of("user"))
    report = VerifyReport(total=len(tasks)) if dual else verify_report(env, tasks)

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
    if not dual:
        console.print(checks)
    if imported.tools_json is not None and not imported.tool_mismatches:
        console.print(f"{imported.tools_json}: agrees with the port's tools")
    written = ENV_CODE + GENERATED + (("policy_rules.toml",) if policy_rules else ())
    console.print(f"wrote {', '.join(written)} in {env_dir}")


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
