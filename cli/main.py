"""The `envforge` command: one root app; each package contributes its own commands."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer._click.core import Context  # the vendored click that TyperGroup subclasses
from typer._click.exceptions import ClickException
from typer.core import TyperGroup
from typer.exceptions import Abort

from . import (
    demo,
    envsynth_commands,
    harness_commands,
    import_commands,
    report_commands,
    server_commands,
    synth_commands,
    trainer_commands,
)
from .errors import DebugFlag, UsageError, print_error, report_and_exit
from .help_width import keep_option_names_whole

keep_option_names_whole()


class ReportingGroup(TyperGroup):
    """The root command group, however it is invoked (the console script, `python -m`, a test's
    runner): multi-value options are spelled out before parsing, and a `UsageError` from any command
    becomes its one line and exit code."""

    reports_usage_errors = True
    """Read by `common.fail`: under this group a `UsageError` is reported here."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_multi_value_options(args))

    def main(  # type: ignore[override]  # the same call as click's, standalone_mode handled here
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **kwargs: Any
    ) -> Any:
        """Run the CLI; in standalone mode (the console script, a test's runner) a parser mistake
        (unknown option or command, a bad or missing value) ends as one `error:` line and exit 2,
        like every other mistake, instead of typer's boxed panel."""
        if not kwargs.pop("standalone_mode", True):
            return super().main(args, prog_name, standalone_mode=False, **kwargs)
        try:
            code = super().main(args, prog_name, standalone_mode=False, **kwargs)
        except ClickException as exc:
            print_error(parser_error(exc))
            sys.exit(exc.exit_code)
        except Abort:
            print_error("aborted")
            sys.exit(1)
        sys.exit(code if type(code) is int else 0)  # non-standalone: an `Exit`'s code comes back

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            if DebugFlag.on:
                traceback.print_exc()
            print_error(exc.message)
            raise typer.Exit(exc.code) from None


app = typer.Typer(
    cls=ReportingGroup,
    no_args_is_help=True,
    add_completion=False,
    help=__doc__,
    pretty_exceptions_enable=False,
)

MULTI_VALUE_OPTIONS = ("--envs",)
"""Options that take several values after one flag (`--envs a b`), as the README writes them; click
options take one value each, so the root group spells them out as repeated flags before parsing."""


def _package_version() -> str:
    try:
        return version("envforge")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"envforge {_package_version()}")
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback of an error instead of one line.")
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    DebugFlag.on = debug


server_commands.register(app)
synth_commands.register(app)
envsynth_commands.register(app)
import_commands.register(app)
report_commands.register(app)
harness_commands.register(app)
trainer_commands.register(app)
app.command("demo")(demo.demo)


def parser_error(exc: ClickException) -> str:
    """A click error as one line, pointing at the help of the command it concerns."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return message
    return f"{message} (see '{ctx.command_path} --help')"


def expand_multi_value_options(argv: Sequence[str]) -> list[str]:
    """`--envs a b --steps 2` -> `--envs a --envs b --steps 2`: every bare word after a multi-value
    option belongs to it (the commands that take one have no positional arguments)."""
    out: list[str] = []
    current: str | None = None
    for arg in argv:
        if arg == "--":
            current = None
        elif arg.startswith("-"):
            current = arg if arg in MULTI_VALUE_OPTIONS else None
        elif current is not None and out[-1] != current:
            out.append(current)
        elif current is not None:
            pass  # the flag's first value
        out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: usage errors end in `ReportingGroup`, anything unexpected here, as one
    line (`--debug`: the traceback)."""
    args = list(sys.argv[1:] if argv is None else argv)
    DebugFlag.on = "--debug" in args[: args.index("--") if "--" in args else len(args)]
    try:
        app(args=args, prog_name="envforge")
    except Exception as exc:
        if DebugFlag.on:
            raise
        report_and_exit(exc)
