"""A tool call's arguments checked before any tool runs, and the data's refusals of them.

One check for every way a tool is reached (in-process episodes and a confined env's worker,
which holds no loaded env): the size and nesting bounds, text that is valid Unicode, then the
tool's parameters in the env's argument-error style (envforge's own messages, or Python's
`TypeError` wording for ported domains). `values_rejected` says when a constraint the data
refused was the agent's values, so the call is the agent's `invalid` one, not the env's bug.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from pydantic import ValidationError

from .tooldef import ToolSpec


class ArgumentStyle(Protocol):
    """What the check reads of an env's manifest: how argument errors are worded."""

    @property
    def argument_errors(self) -> str: ...

    @property
    def python_owner(self) -> str | None: ...

    @property
    def python_owners(self) -> Mapping[Any, str]: ...


class ArgumentOwner(Protocol):
    """An env as the check sees it: a loaded `Environment`, or the worker's stand-in for one."""

    @property
    def manifest(self) -> ArgumentStyle: ...


MAX_STRING_CHARS = 10_000


MAX_ARGUMENT_CHARS = 100_000


MAX_ARGUMENT_DEPTH = 32
"""How deeply an argument's lists and objects may nest (the control plane's JSON bound too)."""


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


def check_arguments(env: ArgumentOwner, spec: ToolSpec, arguments: Any) -> CheckedArguments:
    """Validated keyword arguments, or an error message naming the offending parameter."""
    return CheckedArguments(*_check_arguments(env, spec, arguments))


def _check_arguments(
    env: ArgumentOwner, spec: ToolSpec, arguments: Any
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
        named = env.manifest.python_owners.get(spec.side) or env.manifest.python_owner
        owner = f"{named}." if named else ""
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
