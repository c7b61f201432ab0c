"""Execute one tool call in one episode: validate, run in a transaction, render the result.

Every call is atomic whatever ends it: the transaction is committed only when the tool returned
normally; a `ToolError`, any other exception, cancellation (the client cancelled or went away, a
timeout) and the episode closing mid-call all roll it back; that rollback runs after any
statement still queued on the connection's thread, and on the cancelled path it is shielded. The tool's
SQL can neither end the transaction itself nor write a table outside its `writes=` (the
episode's `SqlGuard`). The agent gets text: strings as they are, everything else as JSON
(τ²-bench's rendering, so ported domains read identically).

Each result has a kind, so that a crashing env is never mistaken for a refusal: `ok`; `refused`
(the tool raised `ToolError`: a domain rule the agent should read); `invalid` (unknown tool, bad
arguments, text that is not valid Unicode, or values the schema's constraints refused:
`values_rejected`); `env_error` (an unexpected exception, a statement the guard denied or a call
over its time limit: a bug of the env, logged with its traceback and shown as an internal error
of the env).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import anyio
from pydantic import BaseModel, ValidationError

from ..core.db import Db
from ..core.dbthreads import on_db_thread
from ..core.errors import InvalidArguments, ToolError, ToolTimeout
from ..core.sqlguard import end_transaction
from ..core.tooldef import ToolSpec
from .episodes import Episode
from .loader import Environment

log = logging.getLogger(__name__)

MAX_STRING_CHARS = 10_000
MAX_ARGUMENT_CHARS = 100_000
MAX_ERROR_CHARS = 500
MAX_ARGUMENT_DEPTH = 32
"""How deeply an argument's lists and objects may nest (the control plane's JSON bound too)."""


ResultKind = Literal["ok", "refused", "invalid", "env_error"]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the agent sees: the text, whether it is an error, and which kind of outcome it is."""

    text: str
    is_error: bool
    kind: ResultKind = "ok"


def _error(message: str, kind: ResultKind = "invalid") -> ToolResult:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "…"
    return ToolResult(f"Error: {message}", True, kind)


ENV_ERROR_PREFIX = "Error: internal error of the environment"


def env_error_text(tool: str, cause: str) -> str:
    """What the agent reads when a tool crashed: an internal error of the env, not a rule of it.

    It names the exception's type only: its message is the env's internals, not a refusal."""
    return f"{ENV_ERROR_PREFIX} in tool '{tool}' ({cause}; a bug in the env, not a refusal)"


def _env_error(tool: str, cause: str) -> ToolResult:
    return ToolResult(env_error_text(tool, cause), True, "env_error")


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# `json.dumps(value, default=_json_default)` builds an encoder per call; one is enough.
_ENCODER = json.JSONEncoder(default=_json_default)


def render_result(value: Any) -> str:
    """Strings pass through unchanged; scalars become `str(x)`; anything else JSON (key order kept)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return _ENCODER.encode(value)


def _measure(value: Any, path: str, budget: list[int], depth: int = 1) -> str | None:
    """Find an oversized string or a value nested deeper than `MAX_ARGUMENT_DEPTH`, and spend
    `budget[0]` on every character seen (no JSON encoding).

    The depth bound keeps every later walk of the arguments (pydantic, a confined env's wire
    encoding, the worker's own check) far from Python's recursion limit, so a deeply nested
    argument is the agent's `invalid` call, never a `RecursionError` blamed on the env.
    """
    if depth > MAX_ARGUMENT_DEPTH and isinstance(value, dict | list):
        top = path.split("[", 1)[0].split(".", 1)[0]
        return f"argument {top!r} is nested too deeply (the limit is {MAX_ARGUMENT_DEPTH} levels)"
    if isinstance(value, str):
        budget[0] -= len(value)
        if len(value) > MAX_STRING_CHARS:
            return f"argument {path!r} is too long ({len(value)} characters; the limit is {MAX_STRING_CHARS})"
        if (at := lone_surrogate(value)) is not None:
            return f"argument {path!r} is not valid Unicode text (a lone surrogate at character {at})"
    elif isinstance(value, dict):
        for k, v in value.items():
            budget[0] -= len(str(k)) + 4
            if isinstance(k, str) and lone_surrogate(k) is not None:
                return f"argument {path!r} has a key that is not valid Unicode text"
            if (found := _measure(v, f"{path}.{k}", budget, depth + 1)) is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            budget[0] -= 2
            if (found := _measure(v, f"{path}[{i}]", budget, depth + 1)) is not None:
                return found
    else:
        budget[0] -= 8
    return None


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone UTF-16 surrogate ("\\ud800", which JSON can spell but UTF-8
    cannot encode), else None. Such a string fails wherever it is encoded (SQLite, a log, a
    record), so it is the caller's invalid argument, answered before any tool runs."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _enumerate_names(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    if len(quoted) == 1:
        return quoted[0]
    if len(quoted) == 2:
        return f"{quoted[0]} and {quoted[1]}"
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


class CheckedArguments(NamedTuple):
    """A call's arguments as checked: the keyword arguments to call the tool with, or (`kwargs`
    None) the problem, a message naming the offending parameter."""

    kwargs: dict[str, Any] | None
    problem: str | None


def check_arguments(env: Environment, spec: ToolSpec, arguments: Any) -> CheckedArguments:
    """Validated keyword arguments, or an error message naming the offending parameter."""
    return CheckedArguments(*_check_arguments(env, spec, arguments))


def _check_arguments(
    env: Environment, spec: ToolSpec, arguments: Any
) -> tuple[dict[str, Any] | None, str | None]:
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
    budget = [MAX_ARGUMENT_CHARS]
    for key, value in arguments.items():
        if (problem := _measure(value, key, budget)) is not None:
            return None, problem
    if budget[0] < 0:
        return None, f"arguments are too large (limit about {MAX_ARGUMENT_CHARS} characters in all)"
    if env.manifest.argument_errors == "python":
        owner = f"{env.manifest.python_owner}." if env.manifest.python_owner else ""
        unexpected = [k for k in arguments if k not in spec.parameters]
        if unexpected:
            return None, f"{owner}{spec.name}() got an unexpected keyword argument '{unexpected[0]}'"
        missing = [p for p in spec.parameters if p in spec.required and p not in arguments]
        if missing:
            plural = "argument" if len(missing) == 1 else "arguments"
            return None, f"{owner}{spec.name}() missing {len(missing)} required positional {plural}: " + (
                _enumerate_names(missing)
            )
        return dict(arguments), None
    unexpected = [k for k in arguments if k not in spec.parameters]
    if unexpected:
        takes = ", ".join(spec.parameters) or "no arguments"
        return None, f"unexpected argument '{unexpected[0]}' (tool '{spec.name}' takes: {takes})"
    missing = [p for p in spec.parameters if p in spec.required and p not in arguments]
    if missing:
        return None, f"missing required argument '{missing[0]}' for tool '{spec.name}'"
    try:
        model = spec.arguments_model.model_validate(arguments)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "arguments"
        return None, f"argument '{loc}': {first['msg']} (got {type(first.get('input')).__name__})"
    return {name: getattr(model, name) for name in spec.parameters}, None


async def execute(episode: Episode, name: str, arguments: Any) -> ToolResult:
    """Run one tool call in `episode` as one transaction and render what the agent sees."""
    env = episode.env
    spec = env.tools.get(name)
    if spec is None:
        return _error(f"Tool '{name}' not found.")
    if episode.read_only and not spec.read_only:
        return _error(f"tool '{name}' writes, and {episode.id} is read-only")
    kwargs, problem = check_arguments(env, spec, arguments)
    if problem is not None:
        return _error(problem)
    assert kwargs is not None
    async with episode.lock:
        if episode.closed:
            why = f" ({episode.stopped})" if episode.stopped else ""
            return _error(f"episode {episode.id!r} is closed{why}")
        episode.touch()
        episode.calls += 1
        conn = episode.conn
        guard = episode.guard
        if guard.allow_writes(spec.write_set):
            # No job of this episode is queued or running here (the lock, and the shielded
            # rollback of a cancelled call), so the connection is free to be touched from here.
            guard.install(conn._conn)
        changes_before = conn.total_changes
        refusal: ToolResult | None = None
        try:
            value = await spec.fn(Db(conn), **kwargs)
        except ToolError as exc:
            refusal = _error(str(exc), "refused")
        except InvalidArguments as exc:
            refusal = _error(str(exc))
        except Exception as exc:
            if _database_full(exc):  # the episode's room to grow is spent: the caller's doing
                refusal = _error(DATABASE_FULL, "refused")
            elif (rejected := values_rejected(exc, kwargs)) is not None:  # the agent's values
                refusal = _error(rejected)
            else:
                # a time limit is named (the agent may retry differently); any other message is the env's
                cause = str(exc) if isinstance(exc, ToolTimeout) else type(exc).__name__
                if guard.denied:
                    cause = f"SQL refused: {guard.denied}"
                    log.error("tool %s.%s was denied by the SQL guard: %s", env.name, name, guard.denied)
                log.exception("tool %s.%s raised unexpectedly (an env error)", env.name, name)
                refusal = _env_error(name, cause)
                if getattr(exc, "abandons_episode", False):
                    # a statement of the call still runs and cannot be waited for: nothing of the
                    # call is committed, and the episode is given up (`Episode.abandon`)
                    episode.abandon(f"a statement of tool '{name}' ran past the call's time limit")
                    return refusal
        except BaseException:  # cancelled (client gone, timeout, shutdown): keep nothing, then go
            with anyio.CancelScope(shield=True):
                await on_db_thread(conn, end_transaction, conn._conn, guard, False)
            raise
        if refusal is None and episode.closed:
            refusal = _error(f"episode {episode.id!r} was closed during the call; nothing was kept")
        if refusal is None and spec.read_only and conn.total_changes != changes_before:
            log.error("read tool %s.%s changed the database; rolled back", env.name, name)
            refusal = _env_error(name, "a read tool changed the database")
        failure = await _settle(conn, guard, commit=refusal is None)
        if refusal is not None:
            return refusal
        if failure is not None:  # a deferred constraint the tool's writes broke surfaces at COMMIT
            log.error("tool %s.%s left the database inconsistent: %s", env.name, name, failure)
            return _env_error(name, "its writes broke a constraint at commit")
    try:
        return ToolResult(render_result(value), False)
    except Exception:
        log.exception("tool %s.%s returned an unrenderable value", env.name, name)
        return _env_error(name, "its result cannot be shown")


DATABASE_FULL = (
    "the episode's database is full: an episode may grow a few MiB past the state it started from "
    "(episodes.DEFAULT_EPISODE_GROWTH); nothing of this call was kept"
)


def values_rejected(exc: BaseException, arguments: Mapping[str, Any]) -> str | None:
    """What the agent reads when the data refused the values its call passed in, else None.

    A constraint of the schema (CHECK, NOT NULL, UNIQUE, a foreign key: `sqlite3.IntegrityError`)
    is the agent's doing when the call holds a NUL character (SQLite's text functions end at it,
    so `length(x) > 0` fails on "\\x00") or the constraint names a column the call passed by name
    ("CHECK constraint failed: length(line1) > 0" after `line1=...`); a value past SQLite's
    integer range (`OverflowError`) is when the call passed such an integer (a tool that makes one
    itself has a bug of its own). That is the agent's `invalid` call, like a bad
    argument: charged to the env, a failure the agent provoked on purpose would leave its trial
    out of pass^k. A constraint on a value the tool derived itself (a balance it forgot to check)
    stays the env's bug. Nothing of the call is kept either way.
    """
    if isinstance(exc, OverflowError):
        if not _holds(arguments, _past_sqlite_integers):
            return None
        return f"a value of the call is out of the database's range ({exc}); nothing of this call was kept"
    if not isinstance(exc, sqlite3.IntegrityError):
        return None
    named = set(_IDENTIFIER.findall(str(exc).partition(":")[2]))
    if named & set(arguments) or _holds(arguments, _has_nul):
        return f"the data refused the call's values ({exc}); nothing of this call was kept"
    return None


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


_SQLITE_INTEGERS = range(-(2**63), 2**63)


def _has_nul(value: Any) -> bool:
    return isinstance(value, str) and "\x00" in value


def _past_sqlite_integers(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value not in _SQLITE_INTEGERS


def _holds(value: Any, found: Callable[[Any], bool]) -> bool:
    """Whether `value`, or anything nested in it (keys included), is one `found` looks for."""
    if found(value):
        return True
    if isinstance(value, Mapping):
        return any(_holds(k, found) or _holds(v, found) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds(v, found) for v in value)
    return False


def _database_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL: a write past the episode's `max_page_count` (`episode_connector`)."""
    return isinstance(exc, sqlite3.OperationalError) and "database or disk is full" in str(exc)


async def _settle(conn: Any, guard: Any, commit: bool) -> str | None:
    """End the call's transaction on the connection's thread: commit, or roll back.

    The job is queued (synchronously, before any await) behind every statement of the call still
    pending there, so it runs even if this await is cancelled, and nothing of a rolled-back call
    survives. Returns the error of a COMMIT that failed (and was rolled back), else None. (No
    cancel scope here: entering one costs more than a fast tool call; the cancelled path above
    shields its rollback so the episode's lock is held until it is done.)
    """
    if commit:
        if not conn.in_transaction:
            # The tool returned: each statement it sent has completed (it awaited them), so no
            # statement of the call is pending and a read tool costs no trip to the thread.
            return None
        try:
            await on_db_thread(conn, end_transaction, conn._conn, guard, True)
            return None
        except sqlite3.Error as exc:
            failure = str(exc)
        await on_db_thread(conn, end_transaction, conn._conn, guard, False)
        return failure
    await on_db_thread(conn, end_transaction, conn._conn, guard, False)
    return None
