"""Documented paging arguments as integers, written by the pipeline at the top of each tool.

A list tool's `limit`, `cursor`, `offset` or `page` arrives as the caller sends it: absent, an empty
string, text that is no number. SQLite's `LIMIT`/`OFFSET` take integers only (`OFFSET ''` and
`LIMIT NULL` are "datatype mismatch", `OFFSET` without `LIMIT` a syntax error), and a small model
binds the argument as it is: Qwen2.5-Coder-1.5B's `slack_list_channels` crashed on its own tester's
`cursor: ""` in every round of nine, though each repair was told to convert the cursor and to leave
an empty one out; on the Museum set its `listSpecialEvents` bound an absent `limit`. What a paging
argument means is the documents' (a count, a row offset, a page number) and its default and
largest value are written there too, so the pipeline, not the model, turns each into an integer:
one assignment per argument, first in the body, which the skeleton shows and every answer keeps
(`with_paging_prologue`). The model is left the query. A cursor is a row offset here: the model
returns the next one as `cursor + limit`, which the next call reads back.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal

from .docs_input import ToolDoc

Kind = Literal["count", "offset", "page"]

_KINDS: dict[str, Kind] = {
    "limit": "count",
    "perpage": "count",
    "pagesize": "count",
    "maxresults": "count",
    "maxcount": "count",
    "maxnumresults": "count",
    "offset": "offset",
    "skip": "offset",
    "cursor": "offset",
    "page": "page",
    "pagenumber": "page",
}
"""Parameter names (lower case, no underscores) whose meaning is paging in every API of the corpus.
Opaque tokens (`page_token`, OpenAI's `after`: an object id) are not: they are the model's to read."""

_LARGEST_OFFSET = 1_000_000_000  # SQLite's integers are 64-bit: a larger value overflows the bind
_LARGEST_PAGE = 1_000_000
_DEFAULT_SAID = re.compile(r"(?i)\bdefault(?:s? to| is|:)?\s*(\d{1,9})\b")
_LARGEST_SAID = re.compile(r"(?i)\b(?:max(?:imum)?(?: is|:)?|up to|between \d+ and)\s*(\d{1,9})\b")


def _types(schema: dict[str, Any]) -> set[Any]:
    """The JSON types a parameter's schema allows, through `anyOf`, less null."""
    return {o.get("type") for o in schema.get("anyOf") or [schema]} - {None, "null"}


def paging_kind(name: str, schema: dict[str, Any]) -> Kind | None:
    """What the parameter `name` pages by, if its name says so and its type can hold a number."""
    kind = _KINDS.get(name.lower().replace("_", ""))
    if kind is None or not _types(schema) <= {"integer", "number", "string"}:
        return None
    return kind


def _documented(schema: dict[str, Any], key: str, said: re.Pattern[str]) -> int | None:
    value = schema.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < _LARGEST_OFFSET:
        return int(value)
    m = said.search(str(schema.get("description", "")))
    return int(m[1]) if m and int(m[1]) > 0 else None


def _bounds(kind: Kind, schema: dict[str, Any]) -> tuple[int, int, int]:
    """(default, smallest, largest) of a paging argument: a count's from its documentation (a
    default of 100 and largest of 1,000 where it says none), an offset's and a page's fixed."""
    if kind == "offset":
        return 0, 0, _LARGEST_OFFSET
    if kind == "page":
        return 1, 1, _LARGEST_PAGE
    largest = _documented(schema, "maximum", _LARGEST_SAID) or 1000
    default = _documented(schema, "default", _DEFAULT_SAID) or 100
    return min(default, largest), 1, largest


def _assignment(name: str, kind: Kind, schema: dict[str, Any]) -> str:
    default, smallest, largest = _bounds(kind, schema)
    types = _types(schema)
    if types and types <= {"integer", "number"}:  # the server has checked it is a number or None
        # clamped before `int()`, which raises on infinity; NaN (unequal to itself) is the default
        clamped = f"int(min(max({name}, {smallest}), {largest}))"
        return f"{name} = {default} if {name} is None or {name} != {name} else {clamped}"
    text = f"str({name})"  # text that is a short decimal number, or the default
    clamped = f"min(max(int({text}), {smallest}), {largest})"
    return f"{name} = {clamped} if {text}.isdecimal() and len({text}) < 10 else {default}"


def paging_arguments(doc: ToolDoc) -> dict[str, Kind]:
    """`doc`'s paging parameters and what each pages by, in the documents' order."""
    found = {p: paging_kind(p, s) for p, s in doc.properties.items()}
    return {p: k for p, k in found.items() if k is not None}


def paging_prologue(doc: ToolDoc) -> list[str]:
    """The statements that make `doc`'s paging arguments integers (none when it has none)."""
    return [_assignment(p, k, doc.properties[p]) for p, k in paging_arguments(doc).items()]


def paging_comment(doc: ToolDoc) -> str | None:
    """What the skeleton says above the prologue: what each integer means and how it binds."""
    found = paging_arguments(doc)
    if not found:
        return None
    meaning = {"count": "a row count", "offset": "a row offset", "page": "a page number from 1"}
    said = ", ".join(f"{p} {meaning[k]}" for p, k in found.items())
    count = next((p for p, k in found.items() if k == "count"), None)
    where = next((p for p, k in found.items() if k != "count"), None)
    if count and where and found[where] == "page":
        how = f"LIMIT ? OFFSET ? with ({count}, ({where} - 1) * {count})"
    elif count and where:
        how = f"LIMIT ? OFFSET ? with ({count}, {where})"
    elif count:
        how = f"LIMIT ? with {count}"
    else:
        how = "LIMIT -1 OFFSET ?"
    return f"# Paging, made integers here: {said}; bind {how}."


def with_paging_prologue(tools_py: str, docs: list[ToolDoc]) -> str:
    """The model's tools.py with each documented tool's paging prologue first in its body (after
    the docstring), where its answer left it out or moved it. A file that does not parse, and a
    function whose first statement shares a line with another, are returned as they are."""
    try:
        tree = ast.parse(tools_py)
    except (SyntaxError, ValueError):
        return tools_py
    prologues = {d.name: paging_prologue(d) for d in docs}
    lines = tools_py.splitlines(keepends=True)
    inserts: list[tuple[int, list[str]]] = []
    for fn in tree.body:
        prologue = prologues.get(getattr(fn, "name", ""))
        if not prologue or not isinstance(fn, ast.AsyncFunctionDef):
            continue
        body = fn.body[1:] if _is_docstring(fn.body[0]) else fn.body
        wanted = [ast.dump(s) for s in ast.parse("\n".join(prologue)).body]
        if [ast.dump(s) for s in body[: len(wanted)]] == wanted or not body:
            continue
        first = body[0]
        indent = lines[first.lineno - 1][: first.col_offset]
        if first.lineno == fn.lineno or indent.strip():
            continue
        inserts.append((first.lineno - 1, [f"{indent}{s}\n" for s in prologue]))
    for at, added in sorted(inserts, reverse=True):
        lines[at:at] = added
    return "".join(lines)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )
