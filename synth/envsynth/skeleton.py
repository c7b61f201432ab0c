"""A tools.py skeleton written from the tool documents: every documented tool's exact signature and
docstring, with a body for the model to write.

Asked to "implement every documented tool", Qwen2.5-Coder-0.5B answered with the tool documents
themselves as a JSON dict in a python block (captured on the corpus's Petstore and Slack sets:
the static gate's "statement at module top level: Expr", three rounds running). The surface is
not the model's to invent anyway: names, parameter names, types, required/optional and allowed
values are the docs', and the probes gate compares them exactly (`probes.schema_problems`). So
the tools stage is given that surface written out, and only the bodies (and each write tool's
`writes=[...]`) are left to it: a smaller stage, the same gates.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from typing import Any, TypeGuard

from envforge.server.sandbox.static_gate import DANGEROUS_SQL

from .docs_input import ToolDoc
from .paging import paging_comment, paging_prologue

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


def _annotation(schema: dict[str, Any]) -> str:
    """The Python type the server turns back into `schema`'s JSON type and allowed values
    (`probes.schema_problems` reads both through `anyOf`). `List`/`Dict` rather than `list`/`dict`:
    a tool named `list` (Redis's) would otherwise be the annotation."""
    values = [v for opt in schema.get("anyOf") or [schema] for v in opt.get("enum") or []]
    if values and all(isinstance(v, str) for v in values):
        return f"Literal[{', '.join(json.dumps(v) for v in dict.fromkeys(values))}]"
    kind = next(
        (o.get("type") for o in schema.get("anyOf") or [schema] if o.get("type") not in (None, "null")), None
    )
    if isinstance(kind, list):  # ["string", "null"]: the first real type
        kind = next((k for k in kind if k != "null"), None)
    if kind in _SCALARS:
        return _SCALARS[str(kind)]
    if kind == "array":
        items = schema.get("items")
        return f"List[{_annotation(items) if isinstance(items, dict) else 'Any'}]"
    if kind == "object":
        return "Dict[str, Any]"
    return "Any"


# Words the static gate refuses in any string, a docstring too (`DANGEROUS_SQL`), as plain English
# says them: "If you need to attach multiple uploaded files" (OpenAI's Files API) refused the
# skeleton itself. A description keeps its meaning in other words.
_REFUSED_WORDS = {"attach": "add", "detach": "remove", "pragma": "setting", "vacuum": "compact"}


def _one_line(text: str) -> str:
    """Description text as a docstring line the static gate takes: one line, no closing quotes,
    no backslash, no double underscore, none of the SQL words it refuses in strings."""
    text = " ".join(str(text).split()).replace('"""', "'''").replace("\\", "/")
    while "__" in text:
        text = text.replace("__", "_")
    return DANGEROUS_SQL.sub(lambda m: _REFUSED_WORDS.get(m.group(0).lower(), "..."), text)


def _tool(doc: ToolDoc) -> str:
    required = [p for p in doc.properties if p in doc.required]
    optional = [p for p in doc.properties if p not in doc.required]
    params = ["db: Db"]
    params += [f"{p}: {_annotation(doc.properties[p])}" for p in required]
    params += [f"{p}: {_annotation(doc.properties[p])} | None = None" for p in optional]
    args = [f"        {p}: {_one_line(s.get('description', '')) or p}" for p, s in doc.properties.items()]
    lines = [
        "@tool",
        f"async def {doc.name}({', '.join(params)}) -> Any:",
        f'    """{_one_line(doc.description) or doc.name}',
    ]
    if args:
        lines += ["", "    Args:", *args]
    lines.append('    """')
    comment = paging_comment(doc)
    if comment:
        lines += [f"    {comment}", *(f"    {s}" for s in paging_prologue(doc))]
    lines += [f"    {PLACEHOLDER_TODO}", "    raise NotImplementedError"]
    return "\n".join(lines)


PLACEHOLDER_TODO = "# TODO: the body (SQL on schema.sql; ToolError for an unknown id or a refusal; return)"
"""The skeleton's body, for the model to replace. It was `raise ToolError("<tool>: write this
body")`, which Qwen2.5-Coder-1.5B kept as the refusal of a check it wrote above it, in every tool
(captured on Petstore); a kept placeholder is now named by the static gate
(`left_placeholders`)."""


def left_placeholders(tools_py: str) -> list[str]:
    """The tools whose body is still the skeleton's placeholder, or raises it."""
    try:
        tree = ast.parse(tools_py)
    except (SyntaxError, ValueError):
        return []
    left = []
    for fn in tree.body:
        if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            raised = node.exc if isinstance(node, ast.Raise) else None
            name = raised.func if isinstance(raised, ast.Call) else raised
            said = raised.args[0] if isinstance(raised, ast.Call) and raised.args else None
            if (isinstance(name, ast.Name) and name.id == "NotImplementedError") or (
                isinstance(said, ast.Constant) and str(said.value).endswith(": write this body")
            ):
                left.append(fn.name)
                break
    return left


def speakable(doc: ToolDoc) -> bool:
    """Whether every parameter of `doc` can be a Python parameter (a name, not a keyword)."""
    return all(p.isidentifier() and not keyword.iskeyword(p) and p != "db" for p in doc.properties)


def tools_skeleton(docs: list[ToolDoc]) -> str:
    """tools.py with every documented tool's signature and docstring and a placeholder body; a tool
    whose parameters are no Python names is left to the model (the gates then say what is wrong)."""
    head = "from __future__ import annotations\n\nfrom typing import Any, Dict, List, Literal\n\n"
    head += "from envforge.server import Db, ToolError, tool\n"
    return head + "".join(f"\n\n{_tool(d)}\n" for d in docs if speakable(d))


_HEADER = (
    "from __future__ import annotations",
    "from typing import Any, Dict, List, Literal",
    "from envforge.server import Db, ToolError, tool",
)
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(", re.MULTILINE)


def _header_end(text: str, start: int) -> int | None:
    """The index of the `:` that ends the def header whose `(` is at `start`, scanning brackets
    and strings; None when a line ends first outside brackets (a header that is no header)."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ":" and depth == 0:
            return i
        elif c == "\n" and depth == 0:
            return None
        i += 1
    return None


def with_documented_signatures(tools_py: str, docs: list[ToolDoc]) -> str:
    """The model's tools.py with each documented tool's header replaced by the skeleton's, and the
    skeleton's imports made sure of: the surface is the docs', only bodies and `writes=` are the
    model's. Captured: Qwen2.5-Coder-0.5B copied the skeleton but left `= None` off one optional
    parameter ("non-default argument follows default argument"), and again each repair round;
    it also dropped the typing import the annotations need. Only docs-derived text is written
    (names are identifiers, allowed values JSON strings); the static gate still judges it all."""
    headers = {d.name: _tool(d).splitlines()[1] for d in docs if speakable(d)}
    edits: list[tuple[int, int, str]] = []
    seen: set[str] = set()
    for m in _DEF.finditer(tools_py):
        name = m.group(1)
        if name not in headers or name in seen:
            continue
        end = _header_end(tools_py, m.end() - 1)
        if end is None:
            continue
        seen.add(name)
        indent = m.group(0)[: len(m.group(0)) - len(m.group(0).lstrip())]
        edits.append((m.start(), end + 1, indent + headers[name]))
    text = tools_py
    for start, end, header in reversed(edits):
        text = text[:start] + header + text[end:]
    lines = text.splitlines()
    missing = [h for h in _HEADER[1:] if h not in lines]
    if _HEADER[0] in lines:
        at = lines.index(_HEADER[0]) + 1
        lines[at:at] = missing
    else:
        lines[0:0] = [_HEADER[0], *missing]
    return "\n".join(lines) + "\n"


_WRITE_SQL = re.compile(
    r"(?i)\b(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|REPLACE\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM)\s+[\"`\[]?(\w+)"
)


def _written_tables(fn: ast.AsyncFunctionDef | ast.FunctionDef, tables: set[str]) -> list[str]:
    """The schema's tables that the SQL in `fn`'s string literals writes, in order of appearance."""
    found: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [t for t in _WRITE_SQL.findall(node.value) if t in tables]
    return list(dict.fromkeys(found))


def _declared(decorator: ast.expr) -> list[str] | None:
    """What a `@tool` / `@tool(writes=[...])` decorator declares (None: not the tool decorator, or
    a declaration that is no list of string literals, left as written)."""
    if isinstance(decorator, ast.Name) and decorator.id == "tool":
        return []
    func = decorator.func if isinstance(decorator, ast.Call) else None
    if isinstance(decorator, ast.Call) and isinstance(func, ast.Name) and func.id == "tool":
        writes = next((k.value for k in decorator.keywords if k.arg == "writes"), None)
        if writes is None and not decorator.keywords and not decorator.args:
            return []
        if isinstance(writes, ast.List | ast.Tuple) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in writes.elts
        ):
            return [str(e.value) for e in writes.elts]  # type: ignore[attr-defined]
    return None


def with_declared_writes(tools_py: str, tables: set[str]) -> str:
    """The model's tools.py with each tool's `writes=[...]` including every schema table its own SQL
    inserts into, updates or deletes from. Captured: Qwen2.5-Coder-1.5B kept the skeleton's
    comment about `writes=` on every tool and declared none, so each tool whose body wrote would
    be refused at run time as a read tool writing. The declaration only ever names tables the
    tool's own SQL text writes; the runtime still confines each call to its declared tables and the
    probes gate measures what it writes (SQLite's authorizer), so nothing is granted that the code
    did not already ask for in plain view. A file that does not parse is returned as it is."""
    try:
        tree = ast.parse(tools_py)
    except (SyntaxError, ValueError):
        return tools_py
    edits: list[Edit] = []
    for fn in tree.body:
        if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        for dec in fn.decorator_list:
            declared = _declared(dec)
            if declared is None:
                continue
            wanted = list(dict.fromkeys([*declared, *_written_tables(fn, tables)]))
            if wanted != declared and dec.end_lineno is not None and dec.end_col_offset is not None:
                text = f"tool(writes={json.dumps(wanted)})"
                edits.append((dec.lineno, dec.col_offset, dec.end_lineno, dec.end_col_offset, text))
    return _with_edits(tools_py, edits)


_DB_CALLS = frozenset(
    {"execute", "executemany", "execute_fetchall", "fetch_all", "fetch_one", "fetch_value", "require_one"}
)

Edit = tuple[int, int, int, int, str]
"""Replace the source from (line, column) to (end line, end column) with the text: lines 1-based,
columns in UTF-8 bytes, as `ast` gives them; an insertion starts and ends at one place."""


def _with_edits(source: str, edits: list[Edit]) -> str:
    """`source` with each edit made, the last first so every earlier position still holds; edits
    must not overlap (an insertion may sit where a removal ends)."""
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    for start, col, end, end_col, text in sorted(set(edits), key=lambda e: (e[0], e[1]), reverse=True):
        lines[start - 1 : end] = [lines[start - 1][:col] + text.encode() + lines[end - 1][end_col:]]
    return b"".join(lines).decode()


def _db_tools(tree: ast.Module) -> list[ast.AsyncFunctionDef]:
    """The async functions whose first argument is the tool's `db`."""
    return [
        fn
        for fn in ast.walk(tree)
        if isinstance(fn, ast.AsyncFunctionDef) and fn.args.args and fn.args.args[0].arg == "db"
    ]


def with_awaited_db_calls(tools_py: str) -> str:
    """The model's tools.py with each call of the tool's `db` awaited where it is made, inside an
    async function. Captured from Qwen2.5-Coder-1.5B: `db.execute("INSERT ...")` and
    `result = db.fetch_one(...)` unawaited (Redis): the statement never runs, and the result is a
    coroutine, so the tool reports a write it never made; and `await db.fetch_one(...)['n']`
    (Slack, in every repair of one tool over four rounds), which subscripts the coroutine before
    awaiting it and crashes on every call. A call is given `await ` in front, or `(await ...)`
    around it when a subscript, attribute or method is taken of its result, and an `await` over
    such a chain moves onto the call. Only the keyword and the parentheses change; the file is
    judged by the static gate as before."""
    try:
        tree = ast.parse(tools_py)
    except (SyntaxError, ValueError):
        return tools_py
    parent = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    edits: list[Edit] = []
    for fn in _db_tools(tree):
        for call in ast.walk(fn):
            if not _is_db_call(call) or isinstance(parent.get(id(call)), ast.Await):
                continue
            assert call.end_lineno is not None and call.end_col_offset is not None
            top = _chain_top(call, parent)
            if top is call:
                edits.append((call.lineno, call.col_offset, call.lineno, call.col_offset, "await "))
                continue
            above = parent.get(id(top))
            if isinstance(above, ast.Await):  # `await db.f(...)[k]`: the await leaves the chain
                edits.append((above.lineno, above.col_offset, top.lineno, top.col_offset, ""))
            edits.append((call.end_lineno, call.end_col_offset, call.end_lineno, call.end_col_offset, ")"))
            edits.append((call.lineno, call.col_offset, call.lineno, call.col_offset, "(await "))
    return _with_edits(tools_py, edits)


_SQL_TEXT = re.compile(r"(?is)^\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|WITH)\b")
_PYFORMAT = re.compile(r"%\((\w+)\)s")


def with_sqlite_placeholders(tools_py: str) -> str:
    """The model's tools.py with SQL placeholders of other drivers written as SQLite's: `%(name)s`
    as `:name` and `%s` as `?`, outside the SQL's quoted literals, in each SQL string of an async
    tool taking `db` (docstrings and f-strings left as written). Captured from
    Qwen2.5-Coder-1.5B on Slack: `VALUES (%(thread_ts)s, ...)` with a dict of parameters, MySQL's
    paramstyle, which SQLite refuses at `%` on every call; asked over eight rounds with that
    crash in its evidence, it answered the function unchanged each time. The parameters the call
    passes are SQLite's already (a dict binds `:name`, a sequence binds `?`); only the string's
    text changes, re-quoted as a Python literal where it does."""
    try:
        tree = ast.parse(tools_py)
    except (SyntaxError, ValueError):
        return tools_py
    lines = [line.encode() for line in tools_py.splitlines(keepends=True)]
    edits: list[Edit] = []
    for fn in _db_tools(tree):
        doc = fn.body[0].value if fn.body and isinstance(fn.body[0], ast.Expr) else None
        inside_fstring = {id(v) for n in ast.walk(fn) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(fn):
            if (
                not isinstance(node, ast.Constant)
                or not isinstance(node.value, str)
                or node is doc
                or id(node) in inside_fstring
                or not _SQL_TEXT.match(node.value)
            ):
                continue
            fixed = _sqlite_placeholders(node.value)
            if fixed != node.value and node.end_lineno is not None and node.end_col_offset is not None:
                written = lines[node.lineno - 1][node.col_offset : node.col_offset + 1]
                edits.append(
                    (
                        node.lineno,
                        node.col_offset,
                        node.end_lineno,
                        node.end_col_offset,
                        _literal(fixed, written),
                    )
                )
    return _with_edits(tools_py, edits)


def _literal(value: str, quote: bytes) -> str:
    """`value` as a Python literal, in double quotes where it was written so and can stay so."""
    if quote == b'"' and not any(c in value for c in '"\\\n'):
        return f'"{value}"'
    return repr(value)


def _sqlite_placeholders(sql: str) -> str:
    parts = sql.split("'")  # the even parts lie outside SQL's quoted literals ('50%s off' stays)
    for i in range(0, len(parts), 2):
        parts[i] = _PYFORMAT.sub(r":\1", parts[i]).replace("%s", "?")
    return "'".join(parts)


def _is_db_call(node: ast.AST) -> TypeGuard[ast.Call]:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "db"
        and node.func.attr in _DB_CALLS
    )


def _chain_top(call: ast.Call, parent: dict[int, ast.AST]) -> ast.expr:
    """The outermost expression that only subscripts, reads an attribute of, or calls a method of
    `call`'s result (`db.f(...)['n']`, `db.f(...).get('n')`); `call` itself when none does."""
    node: ast.expr = call
    while True:
        up = parent.get(id(node))
        if isinstance(up, ast.Subscript | ast.Attribute) and up.value is node:
            node = up
        elif isinstance(up, ast.Call) and up.func is node and node is not call:
            node = up
        else:
            return node


def tool_list(docs: list[ToolDoc], tools_py: str) -> str:
    """One line per documented tool: its call, what it does, and whether it reads or writes (as
    tools.py declares). What the policy stages need of the tools; shown the documents' JSON,
    schema.sql and tools.py instead, Qwen2.5-Coder-1.5B answered policy.md with those sections
    copied under their headings (captured on Redis, Petstore and Slack)."""
    try:
        tree = ast.parse(tools_py)
    except (SyntaxError, ValueError):
        tree = ast.Module(body=[], type_ignores=[])
    writes: dict[str, list[str]] = {}
    for fn in tree.body:
        if isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            for dec in fn.decorator_list:
                declared = _declared(dec)
                if declared is not None:
                    writes[fn.name] = declared
    lines = []
    for doc in docs:
        params = ", ".join(p + ("" if p in doc.required else "?") for p in doc.properties)
        kind = f"writes {', '.join(writes[doc.name])}" if writes.get(doc.name) else "reads only"
        lines.append(f"- {doc.name}({params}): {_one_line(doc.description)[:160]} [{kind}]")
    return "\n".join(lines)
