"""Helpers shared by the CLI's command modules: loading envs with readable errors, console, JSON out."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, get_args

import typer
from rich.console import Console
from typer._click.globals import get_current_context

from envforge.server import Environment, EnvLoadError, load_env
from envforge.synth import AnswersMode

from .errors import UsageError, print_error

if TYPE_CHECKING:
    from envforge import SettingError

console = Console(stderr=True)
"""Progress, logs and warnings: stderr, so stdout carries only results."""
results = Console()
"""Results (summary tables, scores, listings): stdout, where a pipe or a file picks them up."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Stop the command: `message` becomes one `error:` line and the exit code `code`.

    Under the root app its group reports the `UsageError`; a command registered on another app (a
    test's) prints the same line here, instead of click's boxed and wrapped error panel."""
    ctx = get_current_context(silent=True)
    if ctx is None or not getattr(ctx.find_root().command, "reports_usage_errors", False):
        print_error(message)
        raise typer.Exit(code)
    raise UsageError(message, code)


def option_name(name: str) -> str:
    """The flag the running command takes `name` (a parameter) by, with its environment variable
    when it has one: `--sqlite-work-mib (ENVFORGE_SQLITE_WORK_MIB)`; `name` itself outside a command."""
    ctx = get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.name == name and param.opts:
            flag = max(param.opts, key=len)
            envvar = getattr(param, "envvar", None)
            return f"{flag} ({envvar})" if isinstance(envvar, str) else flag
    return name


def fail_setting(exc: SettingError) -> NoReturn:
    """Stop the command on an API setting out of its range, the setting named by its flag."""
    fail(exc.render(option_name))


ANSWERS_MODES: tuple[AnswersMode, ...] = get_args(AnswersMode)
"""`--answers` of `eval` and `score`: how a task's required outputs are matched (docs/scoring.md)."""

Choice = TypeVar("Choice", bound=str)


def choice(option: str, value: str, choices: Sequence[Choice]) -> Choice:
    """`value` as the one of `choices` it names (their own type: a `Literal`'s values keep it); any
    other value exits 2 with `OPTION must be A, B or C, not 'VALUE'`."""
    for known in choices:
        if known == value:
            return known
    *most, last = choices
    fail(f"{option} must be {', '.join(most)} or {last}, not {value!r}")


def load_envs(dirs: list[Path]) -> list[Environment]:
    """Load every env dir; on failure print each problem as `file:line: message` and exit 2."""
    envs = []
    for d in dirs:
        try:
            envs.append(load_env(d))
        except EnvLoadError as exc:
            if len(exc.problems) == 1:
                fail(f"cannot load env {exc.problems[0]}")
            for problem in exc.problems:
                console.print(str(problem), markup=False, highlight=False)
            fail(f"cannot load env {d}: {len(exc.problems)} problems (listed above)")
    return envs


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def quiet_tool_failures() -> None:
    """Silence the logs of tool calls failing: probing and synthesis make such calls on purpose
    (wrong arguments, a candidate's crashing code) and report what they found themselves, so
    the runtime's error lines and a confined worker's tracebacks would only bury the progress."""
    logging.getLogger("envforge.server.runtime").setLevel(logging.CRITICAL)
    logging.getLogger("envforge.server.sandbox.confined_tools").setLevel(logging.CRITICAL)
