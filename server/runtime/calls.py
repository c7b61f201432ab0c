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
`values_rejected`, and ids naming no row that a foreign key refused: `dangling_reference`);
`env_error` (an unexpected exception, a statement the guard denied or a call
over its time limit: a bug of the env, logged with its traceback and shown as an internal error
of the env).
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from ..core.arguments import check_arguments, values_rejected
from ..core.db import Db
from ..core.dbthreads import on_db_thread
from ..core.errors import InvalidArguments, ToolError, ToolTimeout
from ..core.references import breaks_a_foreign_key, dangling_reference
from ..core.results import render_result
from ..core.sqlguard import end_transaction
from ..core.tooldef import CallSide
from .episodes import Episode

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 500


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


async def execute(episode: Episode, name: str, arguments: Any, side: CallSide = "agent") -> ToolResult:
    """Run one tool call in `episode` as one transaction and render what the agent sees.

    `side` is whose call it is: a tool of another side is refused as if it did not exist (τ²-bench:
    a user's tool is simply not found by the agent, and the reverse)."""
    env = episode.env
    spec = env.tools.get(name) if side == "agent" else env.tool_on(name, side)
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
            guard.install(conn.raw)
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
            elif breaks_a_foreign_key(exc) and (
                dangling := await on_db_thread(conn, dangling_reference, conn.raw, kwargs)
            ):  # an id of the call that names no row, refused by the schema, not the tool
                refusal = _error(dangling)
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
                await on_db_thread(conn, end_transaction, conn.raw, guard, False)
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
            await on_db_thread(conn, end_transaction, conn.raw, guard, True)
            return None
        except sqlite3.Error as exc:
            failure = str(exc)
        await on_db_thread(conn, end_transaction, conn.raw, guard, False)
        return failure
    await on_db_thread(conn, end_transaction, conn.raw, guard, False)
    return None
