"""The CLI's one error path: a mistake is raised where it is found and reported once, in `main`.

A command raises `UsageError` (through `common.fail`) at the point it detects bad input, a missing
key or an unreachable server; the root group in `main` prints it as one line on stderr and exits
with the code it carries. Any other exception ends the same way unless `--debug` asks for the traceback, so a
newcomer's mistake never shows up as hundreds of lines of someone else's stack.
"""

from __future__ import annotations

import sys
from typing import NoReturn

# typer vendors click: its commands catch its own ClickException, not the `click` package's.
from typer._click.exceptions import ClickException


class UsageError(ClickException):
    """A mistake the user can fix: the message names what is wrong and how to fix it.

    A `ClickException`, so a command registered on an app other than the root (a test's, a
    plugin's) still exits with `code` and shows the message, in click's own format."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = code


class DebugFlag:
    """Whether `--debug` was given: set by the root callback, read by the handler in `main`."""

    on = False


def one_line(text: str) -> str:
    """`text` with its line breaks and runs of spaces folded: a terminal shows it as one message."""
    return " ".join(text.split())


def print_error(message: str) -> None:
    """`error: MESSAGE` as one line on stderr (coloured only on a terminal)."""
    prefix = "\x1b[1;31merror:\x1b[0m" if sys.stderr.isatty() else "error:"
    sys.stderr.write(f"{prefix} {one_line(message)}\n")
    sys.stderr.flush()


def report_and_exit(exc: BaseException) -> NoReturn:
    """Print `exc` as one `error:` line and exit with its code (2 for a usage error, else 1). A
    group of one error (raised inside a task group) is reported as that error."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, UsageError):
        print_error(exc.message)
        raise SystemExit(exc.code)
    detail = one_line(str(exc)) or "(no message)"
    print_error(f"{type(exc).__name__}: {detail} (run again with --debug for the traceback)")
    raise SystemExit(1)
