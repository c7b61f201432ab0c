"""Execute one tool call in one episode: validate, run in a transaction, render the result.

Every call is atomic: any exception rolls the episode back to where it was before the call, and
a read tool that changes anything is rolled back and refused. The agent gets text: strings as
they are, everything else as JSON (τ²-bench's rendering, so ported domains read identically).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel, ValidationError

from .db import Db
from .episodes import Episode
from .errors import ToolError
from .loader import Environment
from .tooldef import ToolSpec

log = logging.getLogger(__name__)

MAX_STRING_CHARS = 10_000
MAX_ARGUMENT_CHARS = 100_000
MAX_ERROR_CHARS = 500


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the agent sees: the text, and whether it is an error."""

    text: str
    is_error: bool


def _error(message: str) -> ToolResult:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "…"
    return ToolResult(f"Error: {message}", True)


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


def _measure(value: Any, path: str, budget: list[int]) -> str | None:
    """Find an oversized string, and spend `budget[0]` on every character seen (no JSON encoding)."""
    if isinstance(value, str):
        budget[0] -= len(value)
        if len(value) > MAX_STRING_CHARS:
            return f"argument {path!r} is too long ({len(value)} characters; the limit is {MAX_STRING_CHARS})"
    elif isinstance(value, dict):
        for k, v in value.items():
            budget[0] -= len(str(k)) + 4
            if (found := _measure(v, f"{path}.{k}", budget)) is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            budget[0] -= 2
            if (found := _measure(v, f"{path}[{i}]", budget)) is not None:
                return found
    else:
        budget[0] -= 8
    return None


def _enumerate_names(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    if len(quoted) == 1:
        return quoted[0]
    if len(quoted) == 2:
        return f"{quoted[0]} and {quoted[1]}"
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def check_arguments(
    env: Environment, spec: ToolSpec, arguments: Any
) -> tuple[dict[str, Any] | None, str | None]:
    """Validated keyword arguments, or an error message naming the offending parameter."""
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
    kwargs, problem = check_arguments(env, spec, arguments)
    if problem is not None:
        return _error(problem)
    assert kwargs is not None
    async with episode.lock:
        if episode.closed:
            return _error(f"episode {episode.id!r} is closed")
        episode.touch()
        episode.calls += 1
        conn = episode.conn
        changes_before = conn.total_changes
        try:
            value = await spec.fn(Db(conn), **kwargs)
        except ToolError as exc:
            await _rollback(conn)
            return _error(str(exc))
        except Exception as exc:
            await _rollback(conn)
            log.exception("tool %s.%s raised unexpectedly", env.name, name)
            return _error(str(exc) or type(exc).__name__)
        except BaseException:  # cancelled mid-call: nothing of it may stay for the next commit
            with anyio.CancelScope(shield=True):
                await _rollback(conn)
            raise
        if spec.read_only and conn.total_changes != changes_before:
            await _rollback(conn)
            log.error("read tool %s.%s changed the database; rolled back", env.name, name)
            return _error(f"internal error: read-only tool '{name}' attempted to change state")
        if conn.in_transaction:
            try:
                await conn.commit()
            except Exception as exc:  # deferred constraint failures surface here
                await _rollback(conn)
                return _error(str(exc))
    try:
        return ToolResult(render_result(value), False)
    except Exception as exc:
        log.exception("tool %s.%s returned an unrenderable value", env.name, name)
        return _error(f"tool '{name}' returned a value that cannot be shown: {exc}")


async def _rollback(conn: Any) -> None:
    if conn.in_transaction:
        await conn.rollback()
