"""The CLI's one error path: a mistake is raised where it is found and reported once, in `main`.

A command raises `UsageError` (through `common.fail`) at the point it detects bad input, a missing
key or an unreachable server; `report_and_exit` turns it into one line on stderr and the exit code
it carries. Any other exception ends the same way unless `--debug` asks for the traceback, so a
newcomer's mistake never shows up as hundreds of lines of someone else's stack.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class UsageError(Exception):
    """A mistake the user can fix: the message names what is wrong and how to fix it."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class DebugFlag:
    """Whether `--debug` was given: set by the root callback, read by the handler in `main`."""

    on = False


def one_line(text: str) -> str:
    """`text` with its line breaks and runs of spaces folded: a terminal shows it as one message."""
    return " ".join(text.split())


def report_and_exit(exc: BaseException) -> NoReturn:
    """Print `exc` as one `error:` line and exit with its code (2 for a usage error, else 1)."""
    if isinstance(exc, UsageError):
        message, code = exc.message, exc.code
    else:
        detail = one_line(str(exc)) or "(no message)"
        message = f"{type(exc).__name__}: {detail} (run again with --debug for the traceback)"
        code = 1
    prefix = "\x1b[1;31merror:\x1b[0m" if sys.stderr.isatty() else "error:"
    sys.stderr.write(f"{prefix} {one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(code)
