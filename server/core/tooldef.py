"""How an environment declares a tool: a typed async function, a docstring, and a read/write mark.

The signature is the schema. The first parameter, ``db``, receives the episode's `Db` handle;
every other parameter becomes a JSON-schema property whose description comes from the
docstring's ``Args:`` section. This keeps an env's ``tools.py`` plain Python that reads like
documentation, in the style of τ²-bench's toolkits. An env's tools.py is imported as a module of
its own (`load_tool_module`) and its `@tool` functions become specs (`tools_of_module`): the same
steps in the serving process for a trusted env and in a confined env's worker.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import linecache
import re
import sys
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model

from .errors import EnvLoadError, LoadProblem

TOOL_MARK = "__envforge_tool__"
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^\s*(Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")

Side = Literal["agent", "user", "setup", "check"]
"""Whose tool it is. "agent": the agent's (listed and served as ever). "user": the simulated user's,
on their own side of the state (dual control, τ²-bench telecom's user toolkit), served only on an
episode's user endpoint. "setup": a task's initialization action, which may write but is never
listed nor served, only called in-process. "check": an env assertion, read-only, in-process only."""
SIDES: tuple[Side, ...] = get_args(Side)
CallSide = Literal["agent", "user", "solo", "setup", "check"]
"""Whose call it is: a tool's side, or "solo" (τ²-bench's solo mode: the agent drives both the
agent's and the user's tools). A call reaches only the tools of its side (`on_side`)."""
CALL_SIDES: tuple[CallSide, ...] = get_args(CallSide)


def on_side(tool_side: Side, call_side: CallSide) -> bool:
    """Whether a call made on `call_side` may reach a tool of `tool_side`."""
    if call_side == "solo":
        return tool_side in ("agent", "user")
    return tool_side == call_side


@dataclass(frozen=True)
class ToolMark:
    """What ``@tool`` attaches to a function before the loader turns it into a `ToolSpec`."""

    writes: tuple[str, ...]
    name: str | None
    description: str | None
    side: Side = "agent"


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    writes: Sequence[str] = (),
    name: str | None = None,
    description: str | None = None,
    side: Side = "agent",
) -> Any:
    """Mark an async function as an environment tool.

    ``writes`` names the tables the tool may change (its triggers' tables included); SQLite's
    authorizer refuses a write to any other table and the call is rolled back as an env error. A
    tool with no ``writes`` is a read tool (MCP ``readOnlyHint``) and can change nothing. ``name``
    and ``description`` override the function name and docstring when a published tool
    surface must be matched exactly. ``side`` says whose tool it is (`Side`): a check is an
    assertion on the state and may declare no writes.
    """
    if side not in SIDES:
        raise TypeError(f"side={side!r}: a tool's side is one of {', '.join(SIDES)}")
    if side == "check" and writes:
        raise TypeError("a check tool asserts on the state and may not write (no writes=)")

    def mark(f: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"tool {f.__name__!r} must be declared with 'async def'")
        setattr(f, TOOL_MARK, ToolMark(tuple(writes), name, description, side))
        return f

    return mark(fn) if fn is not None else mark


@dataclass(frozen=True)
class ParsedDocstring:
    description: str
    params: dict[str, str] = field(default_factory=dict)


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """Split a Google-style docstring into the tool description and per-argument descriptions.

    The description is everything before the first section header; ``Returns:`` and similar
    sections are dropped (the agent sees results, not their documentation).
    """
    if not doc:
        return ParsedDocstring("")
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section = "description"
    current: str | None = None
    for line in lines:
        if _ARGS_HEADER.match(line):
            section, current = "args", None
            continue
        if _SECTION_HEADER.match(line):
            section, current = "other", None
            continue
        if section == "description":
            description.append(line)
        elif section == "args":
            m = _ARG_LINE.match(line)
            if m and (not line.startswith(" " * 8) or current is None):
                current = m.group(1).lstrip("*")
                params[current] = m.group(3).strip()
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return ParsedDocstring("\n".join(description).strip(), params)


@dataclass(frozen=True)
class ToolSpec:
    """A validated, callable tool: what the runtime executes and what MCP lists."""

    name: str
    description: str
    fn: Callable[..., Awaitable[Any]]
    input_schema: dict[str, Any]
    arguments_model: type[BaseModel]
    parameters: tuple[str, ...]
    required: frozenset[str]
    writes: tuple[str, ...]
    source_line: int
    side: Side = "agent"

    @property
    def read_only(self) -> bool:
        return not self.writes

    @cached_property
    def write_set(self) -> frozenset[str]:
        """The tables this tool's statements may write (the SQL guard enforces it)."""
        return frozenset(self.writes)


def def_line(fn: Callable[..., Any]) -> int:
    """The line of the `def` itself (not of its first decorator), for error messages."""
    code = getattr(fn, "__code__", None)
    start = getattr(code, "co_firstlineno", 0)
    # The code's first line is its first decorator's; the `def` follows within a few lines. Reading
    # them from linecache (not `inspect.getsourcelines`, which tokenizes the whole body) keeps
    # loading an env's tools cheap.
    lines = linecache.getlines(code.co_filename) if code is not None else []
    for number in range(start, min(start + 64, len(lines) + 1)):
        if lines[number - 1].lstrip().startswith(("def ", "async def ")):
            return number
    return start


class ToolDefinitionError(Exception):
    """A tool's signature or docstring cannot be turned into a schema."""


def build_tool_spec(fn: Callable[..., Awaitable[Any]]) -> ToolSpec:
    """Derive a tool's JSON schema and argument validator from its signature and docstring."""
    mark: ToolMark = getattr(fn, TOOL_MARK)
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # unresolvable annotation: report it against the tool
        raise ToolDefinitionError(f"tool {fn.__name__!r}: cannot resolve type hints ({exc})") from exc
    params = list(sig.parameters.values())
    if not params or params[0].name != "db":
        raise ToolDefinitionError(f"tool {fn.__name__!r}: the first parameter must be 'db'")
    doc = parse_docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    required: set[str] = set()
    for p in params[1:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise ToolDefinitionError(f"tool {fn.__name__!r}: parameter {p.name!r} must be a plain named one")
        if p.name not in hints:
            raise ToolDefinitionError(f"tool {fn.__name__!r}: parameter {p.name!r} has no type annotation")
        default = ... if p.default is inspect.Parameter.empty else p.default
        if default is ...:
            required.add(p.name)
        desc = doc.params.get(p.name)
        fields[p.name] = (hints[p.name], Field(default, description=desc) if desc else Field(default))
    name = mark.name or fn.__name__
    description = mark.description if mark.description is not None else doc.description
    if not description:
        raise ToolDefinitionError(f"tool {name!r}: a docstring is required (it is the agent's only manual)")
    try:
        arguments_model = create_model(
            f"{name}_arguments", __config__=ConfigDict(extra="forbid", strict=True), **fields
        )
        # The listed schema is the validator's, as a model without `extra="forbid"` would write
        # it: one model built per tool instead of two (most of an env's load time).
        input_schema = arguments_model.model_json_schema()
        input_schema.pop("additionalProperties", None)
        input_schema["title"] = "parameters"
    except Exception as exc:
        raise ToolDefinitionError(f"tool {name!r}: cannot derive a JSON schema ({exc})") from exc
    line = def_line(fn)
    return ToolSpec(
        name=name,
        description=description,
        fn=fn,
        input_schema=input_schema,
        arguments_model=arguments_model,
        parameters=tuple(p.name for p in params[1:]),
        required=frozenset(required),
        writes=mark.writes,
        source_line=line,
        side=mark.side,
    )


def load_tool_module(path: Path, env_name: str, *, source: str | None = None) -> Any:
    """Import an env's tools.py as an isolated module (it imports nothing from its neighbours).

    `source` is the file's text when the caller already has it (a confined worker gets it over
    its pipe and cannot read the env folder).
    """
    if source is None:
        source = path.read_text(encoding="utf-8")
    else:  # so `inspect` finds the source (def lines in error messages) without the file
        linecache.cache[str(path)] = (len(source), None, source.splitlines(keepends=True), str(path))
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise EnvLoadError([LoadProblem(path, exc.lineno, f"syntax error: {exc.msg}")]) from exc
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    mod_name = f"envforge_env_{env_name}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        tb = exc.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        raise EnvLoadError(
            [LoadProblem(path, line, f"importing failed: {type(exc).__name__}: {exc}")]
        ) from exc
    return module


def tools_of_module(module: Any, path: Path) -> dict[str, ToolSpec]:
    """The `@tool` functions an imported tools.py defines, as specs; problems carry file and line."""
    tools: dict[str, ToolSpec] = {}
    problems: list[LoadProblem] = []
    for obj in list(module.__dict__.values()):
        if (
            not callable(obj)
            or not hasattr(obj, TOOL_MARK)
            or getattr(obj, "__module__", None) != module.__name__
        ):
            continue
        try:
            spec = build_tool_spec(obj)
        except ToolDefinitionError as exc:
            line = def_line(obj)
            problems.append(LoadProblem(path, line, str(exc)))
            continue
        if spec.name in tools:  # names are one namespace across sides: a call names its tool alone
            other = tools[spec.name]
            where = "" if other.side == spec.side else f" (side {other.side!r} and side {spec.side!r})"
            problems.append(LoadProblem(path, spec.source_line, f"duplicate tool name {spec.name!r}{where}"))
            continue
        tools[spec.name] = spec
    if not tools and not problems:
        problems.append(LoadProblem(path, None, "no tools found (decorate async functions with @tool)"))
    if problems:
        raise EnvLoadError(problems)
    return tools
