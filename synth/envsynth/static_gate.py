"""The static gate: generated code is parsed and checked against an AST allowlist BEFORE it is imported.

`load_env` imports tools.py, and importing runs its top level, so nothing the model wrote may reach
the loader until this gate has passed. The rules are an allowlist where that is practical:

- imports only from `TOOLS_IMPORTS` (`SEED_IMPORTS` for seed generators);
- at module top level only imports, defs, classes, docstrings and assignments, and the only calls
  evaluated at import time (top level, decorators, defaults, class bodies) are `IMPORT_TIME_CALLS`;
- annotations contain no calls (`typing.get_type_hints` evaluates them when the tool is loaded);
- no `open`/`eval`/`exec`/`compile`/`__import__`/`globals`/`locals`/`vars`/`input`/`breakpoint`,
  no `getattr`/`setattr`/`delattr`/`hasattr` with a non-literal or private name, no dunder or
  private attribute access (`db._conn` would reach the raw sqlite3 connection), no dunder names, no
  string literal containing `__` (format-string attribute walks), no `global`;
- SQL literals and schema.sql never ATTACH (which creates files), run PRAGMAs, VACUUM INTO or load
  extensions.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

TOOLS_IMPORTS = frozenset(
    {
        "__future__",
        "typing",
        "datetime",
        "math",
        "json",
        "re",
        "decimal",
        "collections",
        "itertools",
        "functools",
        "dataclasses",
        "enum",
        "string",
        "envforge.server",
        "aiosqlite",
    }
)
SEED_IMPORTS = (TOOLS_IMPORTS - {"envforge.server", "aiosqlite"}) | {"random"}
# `aiosqlite` is allowed for the `Connection` type annotation only.
RESTRICTED_FROM = {"aiosqlite": {"Connection"}, "envforge.server": {"Db", "tool", "ToolError"}}
FORBIDDEN_NAMES = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "input",
        "breakpoint",
        "exit",
        "quit",
        "help",
        "memoryview",
        "object",
        "super",
    }
)
ATTR_FUNCS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
IMPORT_TIME_CALLS = frozenset(
    {
        "tool",
        "frozenset",
        "set",
        "tuple",
        "list",
        "dict",
        "range",
        "Decimal",
        "date",
        "datetime",
        "timedelta",
        "compile",  # only as re.compile (a bare `compile` Name is forbidden above)
        "TypeVar",
        "Literal",
        "field",
        "dataclass",
        "len",
        "sorted",
    }
)
DANGEROUS_SQL = re.compile(
    r"\b(ATTACH|DETACH|PRAGMA|load_extension|VACUUM\s+INTO|readfile|writefile)\b", re.I
)


@dataclass(frozen=True)
class Violation:
    """One rule broken, with the line, so the repair prompt can point the model at it."""

    line: int | None
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule}: {self.detail}" if self.line else f"{self.rule}: {self.detail}"


def _callee(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _callee(node.value)
    return type(node).__name__


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _Checker(ast.NodeVisitor):
    def __init__(self, imports: frozenset[str]) -> None:
        self.imports = imports
        self.found: list[Violation] = []

    def bad(self, node: ast.AST, rule: str, detail: str) -> None:
        self.found.append(Violation(getattr(node, "lineno", None), rule, detail))

    # imports
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name not in self.imports:
                self.bad(node, "forbidden import", a.name)
            elif a.name in RESTRICTED_FROM:
                self.bad(node, "forbidden import", f"import {a.name} (only 'from {a.name} import ...')")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or mod not in self.imports:
            self.bad(node, "forbidden import", "." * node.level + mod)
            return
        allowed = RESTRICTED_FROM.get(mod)
        for a in node.names:
            if a.name == "*" or (allowed is not None and a.name not in allowed):
                self.bad(node, "forbidden import", f"from {mod} import {a.name}")

    # names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.bad(node, "forbidden name", node.id)
        elif _dunder(node.id) and node.id != "__name__":
            self.bad(node, "forbidden name", node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self.bad(node, "private or dunder attribute", node.attr)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.bad(node, "forbidden statement", "global")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            if "__" in node.value:
                self.bad(node, "forbidden string", "string literals may not contain '__'")
            if DANGEROUS_SQL.search(node.value):
                self.bad(node, "forbidden SQL", DANGEROUS_SQL.search(node.value).group(0))  # type: ignore[union-attr]

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCS:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or name.value.startswith(
                "_"
            ):
                self.bad(
                    node, "forbidden attribute access", f"{node.func.id} with a non-literal or private name"
                )
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        if node.annotation is not None:
            self._no_calls(node.annotation, "annotation")
        self.generic_visit(node)

    def _no_calls(self, node: ast.AST, where: str) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                self.bad(sub, f"call in {where}", _callee(sub.func))

    def import_time(self, node: ast.AST, where: str) -> None:
        """Calls evaluated when the module is imported must be on the short allowlist."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and _callee(sub.func) not in IMPORT_TIME_CALLS:
                self.bad(sub, f"call at import time ({where})", _callee(sub.func))
            if isinstance(sub, (ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
                self.bad(sub, f"expression at import time ({where})", type(sub).__name__)


_TOP_OK = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


def _top_level(tree: ast.Module, checker: _Checker) -> None:
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and i == 0:
            continue  # the module docstring
        if not isinstance(stmt, _TOP_OK):
            checker.bad(stmt, "statement at module top level", type(stmt).__name__)
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            if stmt.value is not None:
                checker.import_time(stmt.value, "assignment")
            if isinstance(stmt, ast.AnnAssign):
                checker._no_calls(stmt.annotation, "annotation")
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in stmt.decorator_list:
                checker.import_time(d, "decorator")
            for default in [*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d is not None]]:
                checker.import_time(default, "default")
            if stmt.returns is not None:
                checker._no_calls(stmt.returns, "annotation")
        elif isinstance(stmt, ast.ClassDef):
            for d in [*stmt.decorator_list, *stmt.bases, *[k.value for k in stmt.keywords]]:
                checker.import_time(d, "class header")
            for sub in stmt.body:
                if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None:
                    checker.import_time(sub.value, "class body")
                elif not isinstance(
                    sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Expr, ast.Pass, ast.AnnAssign)
                ):
                    checker.bad(sub, "statement in class body", type(sub).__name__)


def check_python(source: str, *, imports: frozenset[str] = TOOLS_IMPORTS) -> list[Violation]:
    """Every rule `source` breaks (empty: it may be imported). Never executes anything."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Violation(exc.lineno, "syntax error", exc.msg)]
    checker = _Checker(imports)
    _top_level(tree, checker)
    checker.visit(tree)
    seen: set[tuple[int | None, str, str]] = set()
    out = []
    for v in checker.found:
        key = (v.line, v.rule, v.detail)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return sorted(out, key=lambda v: (v.line or 0, v.rule))


def check_sql(sql: str) -> list[Violation]:
    """schema.sql may create tables, indexes, views and triggers; it may not touch files or pragmas."""
    out = []
    for lineno, line in enumerate(sql.splitlines(), start=1):
        code = line.split("--", 1)[0]
        m = DANGEROUS_SQL.search(code)
        if m:
            out.append(Violation(lineno, "forbidden SQL", m.group(0)))
    return out
