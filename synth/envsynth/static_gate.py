"""The static gate: generated code is parsed and checked against an AST allowlist BEFORE it is imported.

It is a first filter, not the security boundary: model-written tools.py and seed generators run
only in OS-confined workers (`envforge.server.confinement`, docs/security.md). The rules are an
allowlist of what may be referenced, so a new trick fails by default:

- imports only of `TOOLS_IMPORTS` (`SEED_IMPORTS` for seed generators), and of each module only
  the attributes in `MODULE_ATTRS` (`from m import x`, `m.x`); a module name is never a value
  (`f(json)`, `x = re`), so no chain can walk from a module to another (`typing.sys`,
  `json.codecs`, `dataclasses.builtins`, `re.enum` all fail: those attributes are not listed);
- builtins only from `SAFE_BUILTINS`: no `getattr`/`setattr`/`vars`/`type`/`open`/`eval`/...,
  not even as a name bound to something else;
- no dunder names, no attribute starting with `_`, no frame/code/traceback attributes
  (`gi_frame`, `f_globals`, `tb_frame`, ...), no `.format`/`.format_map` (format-string
  attribute walks), no string literal containing `__`, no `global`/`nonlocal`;
- annotations within a small grammar: names, dotted names, subscripts, `|`, `None`, and constants
  only inside `Literal[...]`; a string annotation is rejected, so `typing.get_type_hints` never
  evaluates code;
- at module top level only imports, defs, classes, docstrings and assignments, and the only calls
  evaluated at import time (top level, decorators, defaults, class bodies) are `IMPORT_TIME_CALLS`;
- SQL literals and schema.sql never ATTACH, run PRAGMAs, VACUUM INTO or load extensions (SQLite's
  authorizer enforces this for real; this only gives the model an early, precise repair hint).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

_MATH = frozenset(
    {
        "ceil", "floor", "sqrt", "isclose", "fabs", "fsum", "prod", "log", "log10", "log2", "exp",
        "pow", "trunc", "isfinite", "isnan", "isinf", "copysign", "hypot", "gcd", "inf", "nan",
        "pi", "e", "tau", "comb", "perm", "factorial", "dist", "modf", "fmod",
    }
)  # fmt: skip
MODULE_ATTRS: dict[str, frozenset[str]] = {
    "__future__": frozenset({"annotations"}),
    "typing": frozenset(
        {
            "Any", "Literal", "Optional", "Union", "TypedDict", "NamedTuple", "Iterable",
            "Iterator", "Sequence", "Mapping", "MutableMapping", "Callable", "TypeVar", "Final",
            "ClassVar", "List", "Dict", "Set", "FrozenSet", "Tuple", "Type", "NotRequired",
            "Required", "cast",
        }
    ),
    "datetime": frozenset({"date", "datetime", "timedelta", "time", "timezone", "UTC"}),
    "math": _MATH,
    "json": frozenset({"dumps", "loads", "JSONDecodeError"}),
    "re": frozenset(
        {
            "compile", "match", "fullmatch", "search", "sub", "subn", "findall", "finditer",
            "split", "escape", "IGNORECASE", "I", "MULTILINE", "M", "DOTALL", "S", "VERBOSE",
            "X", "ASCII", "A", "Pattern", "Match", "error",
        }
    ),
    "decimal": frozenset(
        {
            "Decimal", "InvalidOperation", "ROUND_HALF_UP", "ROUND_HALF_EVEN", "ROUND_HALF_DOWN",
            "ROUND_UP", "ROUND_DOWN", "ROUND_FLOOR", "ROUND_CEILING",
        }
    ),
    "collections": frozenset({"Counter", "defaultdict", "OrderedDict", "deque", "namedtuple", "ChainMap"}),
    "itertools": frozenset(
        {
            "chain", "islice", "groupby", "count", "product", "permutations", "combinations",
            "combinations_with_replacement", "accumulate", "zip_longest", "repeat", "pairwise",
            "compress", "takewhile", "dropwhile", "cycle", "batched",
        }
    ),
    "functools": frozenset({"partial", "lru_cache", "cache", "cmp_to_key", "total_ordering"}),
    "dataclasses": frozenset({"dataclass", "field", "asdict", "astuple", "replace", "fields"}),
    "enum": frozenset({"Enum", "IntEnum", "StrEnum", "auto"}),
    "string": frozenset(
        {
            "ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits", "hexdigits",
            "octdigits", "punctuation", "whitespace", "printable", "capwords",
        }
    ),
    "random": frozenset(
        {
            "Random", "seed", "random", "randint", "randrange", "choice", "choices", "sample",
            "shuffle", "uniform", "gauss", "normalvariate", "triangular",
        }
    ),
    "envforge.server": frozenset({"tool", "ToolError", "Db"}),
    "aiosqlite": frozenset({"Connection"}),
}  # fmt: skip
TOOLS_IMPORTS = frozenset(MODULE_ATTRS) - {"random"}
SEED_IMPORTS = (TOOLS_IMPORTS - {"envforge.server", "aiosqlite"}) | {"random"}
FROM_ONLY = frozenset({"envforge.server", "aiosqlite"})  # never bound as a module name
SAFE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "bool", "bytes", "callable", "chr", "dict", "divmod", "enumerate",
        "filter", "float", "frozenset", "int", "isinstance", "issubclass", "iter", "len", "list",
        "map", "max", "min", "next", "ord", "pow", "print", "range", "repr", "reversed", "round",
        "set", "slice", "sorted", "str", "sum", "tuple", "zip", "hash", "bin", "hex", "oct",
        "ascii", "staticmethod", "classmethod", "property", "NotImplemented", "Ellipsis",
        "True", "False", "None", "Exception", "ValueError", "KeyError", "IndexError",
        "TypeError", "StopIteration", "StopAsyncIteration", "ArithmeticError", "LookupError",
        "ZeroDivisionError", "OverflowError", "AssertionError", "RuntimeError",
        "NotImplementedError", "AttributeError", "UnicodeError",
    }
)  # fmt: skip
ATTR_FUNCS = frozenset({"getattr", "setattr", "delattr", "hasattr", "vars", "dir"})
FORBIDDEN_ATTRS = frozenset({"format", "format_map", "mro"})
FRAME_ATTR_PREFIXES = ("gi_", "cr_", "ag_", "f_", "tb_", "co_")
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
        "compile",  # only as re.compile (a bare `compile` Name is not a safe builtin)
        "TypeVar",
        "Literal",
        "field",
        "dataclass",
        "len",
        "sorted",
    }
)
DANGEROUS_SQL = re.compile(r"\b(ATTACH|DETACH|PRAGMA|load_extension|VACUUM|readfile|writefile)\b", re.I)
_BUILTIN_NAMES = frozenset(dir(builtins))


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
        self.modules: dict[str, str] = {}  # local name -> module it is bound to

    def bad(self, node: ast.AST, rule: str, detail: str) -> None:
        self.found.append(Violation(getattr(node, "lineno", None), rule, detail))

    # imports: the module, and of it only listed attributes
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name not in self.imports:
                self.bad(node, "forbidden import", a.name)
            elif a.name in FROM_ONLY:
                self.bad(node, "forbidden import", f"import {a.name} (only 'from {a.name} import ...')")
            elif "." in a.name and a.asname is None:
                self.bad(node, "forbidden import", f"import {a.name} (use 'from ... import')")
            else:
                self.modules[a.asname or a.name] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or mod not in self.imports:
            self.bad(node, "forbidden import", "." * node.level + mod)
            return
        allowed = MODULE_ATTRS[mod]
        for a in node.names:
            if a.name not in allowed:
                self.bad(node, "forbidden import", f"from {mod} import {a.name}")

    # names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name in self.modules:
            verb = "rebound" if isinstance(node.ctx, ast.Store | ast.Del) else "used as a value"
            self.bad(node, "module reference", f"module {name!r} {verb} (use only its listed attributes)")
        elif name in ATTR_FUNCS:
            self.bad(node, "forbidden attribute access", f"{name} (attributes are named in the code)")
        elif _dunder(name) or (name in _BUILTIN_NAMES and name not in SAFE_BUILTINS):
            self.bad(node, "forbidden name", name)

    def visit_arg(self, node: ast.arg) -> None:
        if node.arg in ATTR_FUNCS or _dunder(node.arg) or node.arg in self.modules:
            self.bad(node, "forbidden name", node.arg)
        if node.annotation is not None:
            self.annotation(node.annotation)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if isinstance(node.value, ast.Name) and node.value.id in self.modules:
            module = self.modules[node.value.id]
            if attr not in MODULE_ATTRS.get(module, frozenset()):
                self.bad(node, "forbidden module attribute", f"{module}.{attr}")
            return  # the module name itself is fine as the root of a listed attribute
        if attr.startswith("_"):
            self.bad(node, "private or dunder attribute", attr)
        elif attr in FORBIDDEN_ATTRS or attr.startswith(FRAME_ATTR_PREFIXES):
            self.bad(node, "forbidden attribute", attr)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.bad(node, "forbidden statement", "global")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.bad(node, "forbidden statement", "nonlocal")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            if "__" in node.value:
                self.bad(node, "forbidden string", "string literals may not contain '__'")
            if (m := DANGEROUS_SQL.search(node.value)) is not None:
                self.bad(node, "forbidden SQL", m.group(0))

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        if _dunder(node.name) or node.name in ATTR_FUNCS or node.name in self.modules:
            self.bad(node, "forbidden name", node.name)
        if not isinstance(node, ast.ClassDef) and node.returns is not None:
            self.annotation(node.returns)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    # annotations: a small grammar that `get_type_hints` can evaluate without running code
    def annotation(self, node: ast.expr, *, literal: bool = False) -> None:
        if isinstance(node, ast.Constant):
            if (
                node.value is None
                or node.value is ...
                or (literal and isinstance(node.value, str | int | bool))
            ):
                if literal:
                    self.visit_Constant(node)
                return
            what = "a string annotation" if isinstance(node.value, str) else repr(node.value)
            self.bad(node, "annotation outside the grammar", f"{what} (write the type itself)")
        elif isinstance(node, ast.Name):
            self.visit_Name(node) if node.id not in self.modules else self.bad(
                node, "annotation outside the grammar", f"module {node.id!r}"
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
            self.visit_Attribute(node)
        elif isinstance(node, ast.Subscript):
            self.annotation(node.value)
            is_literal = _callee(node.value) == "Literal"
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            for item in items:
                self.annotation(item, literal=is_literal)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            self.annotation(node.left)
            self.annotation(node.right)
        elif isinstance(node, ast.List):  # Callable[[int], str]
            for item in node.elts:
                self.annotation(item)
        elif isinstance(node, ast.Call):
            self.bad(node, "call in annotation", _callee(node.func))
        else:
            self.bad(node, "annotation outside the grammar", type(node).__name__)

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
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in stmt.decorator_list:
                checker.import_time(d, "decorator")
            for default in [*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d is not None]]:
                checker.import_time(default, "default")
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
    for node in ast.walk(tree):  # bind module names first: a use may precede its import
        if isinstance(node, ast.Import):
            checker.visit_Import(node)
    checker.found.clear()
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
