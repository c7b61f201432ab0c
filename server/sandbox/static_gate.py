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
  attribute walks), no string literal containing `__`, no `global`/`nonlocal`. The attribute rules
  hold wherever the code names an attribute, not only in `x.attr`: a class pattern's keywords
  (`case C(attr=v)`), and the member or field names given to Enum's and namedtuple's functional
  forms (which must be literal strings). A class pattern's positional sub-patterns read the
  attributes its class's `__match_args__` names at run time, so they are allowed only for the
  builtin types that match the subject itself (`case int(n)`). Nothing in the allowlist reads an
  attribute named by a runtime string (`dataclasses.asdict`, `replace`, `fields` read the names
  of Field objects, which code can rename, so they are not listed);
- annotations within a small grammar: names, dotted names, subscripts, `|`, `None`, and constants
  only inside `Literal[...]`; a string annotation is rejected, and so is a type alias (a name an
  annotation uses) outside the same grammar, so `typing.get_type_hints` never evaluates a string
  as code (`X = Optional["..."]` would be);
- at module top level only imports, defs, classes, docstrings and assignments to names; what runs
  at import time (values, decorators, defaults, class headers and bodies) never calls the file's
  own code: the only calls are `IMPORT_TIME_CALLS`, resolved by what their name is bound to (a def
  or assignment of the same name makes it the file's own), without callback arguments (`key=`,
  `dict(x)`, which calls `x.keys()`); decorators are `IMPORT_TIME_DECORATORS` (or a property's
  `.setter`); no metaclass; attributes read only of modules, imported names and, one level deep, of
  the file's classes (anything else may be a property); no `classmethod` over `property`; an Enum
  of the file holds members only (pydantic reads a member's `value` while the tools are described,
  so a method or property there would be the file's code running at load);
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
    # not asdict/astuple/replace/fields: they read attributes named by Field objects, and a Field
    # object the code holds (the default it gave `x: int = F`) can be renamed at run time
    "dataclasses": frozenset({"dataclass", "field"}),
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
}  # fmt: skip
TOOLS_IMPORTS = frozenset(MODULE_ATTRS) - {"random"}
SEED_IMPORTS = (TOOLS_IMPORTS - {"envforge.server"}) | {"random"}
FROM_ONLY = frozenset({"envforge.server"})  # never bound as a module name
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
        "envforge.server.tool",
        "builtins.frozenset",
        "builtins.set",
        "builtins.tuple",
        "builtins.list",
        "builtins.dict",  # with literal arguments only: `dict(x)` calls `x.keys()`
        "builtins.range",
        "builtins.len",
        "builtins.sorted",  # without `key=`
        "decimal.Decimal",
        "datetime.date",
        "datetime.datetime",
        "datetime.time",
        "datetime.timedelta",
        "datetime.timezone",
        "datetime.date.fromisoformat",
        "datetime.datetime.fromisoformat",
        "re.compile",
        "typing.TypeVar",
        "dataclasses.field",
        "dataclasses.dataclass",
        "functools.lru_cache",
    }
)  # qualified by what the called name is bound to (`from datetime import date` -> datetime.date)
IMPORT_TIME_DECORATORS = frozenset(
    {
        "envforge.server.tool",
        "dataclasses.dataclass",
        "builtins.staticmethod",
        "builtins.classmethod",
        "builtins.property",
        "functools.cache",
        "functools.lru_cache",
        "functools.total_ordering",
    }
)
CALLBACK_KEYWORDS = frozenset({"key"})  # an import-time call would call back into the file through it
PROPERTY_DECORATORS = frozenset({"setter", "getter", "deleter"})
SELF_MATCHING = frozenset(
    {"bool", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str", "tuple"}
)
NAME_FACTORIES = frozenset(
    {"enum.Enum", "enum.IntEnum", "enum.StrEnum", "collections.namedtuple", "typing.NamedTuple"}
)
_DATA_LITERALS = (ast.Dict, ast.List, ast.Tuple, ast.DictComp, ast.ListComp)
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


def _attribute_problem(attr: str) -> tuple[str, str] | None:
    """The rule an attribute name breaks (None: none), however the code names the attribute.

    `x.attr`, a class pattern's `case C(attr=v)` and an Enum member or namedtuple field all name
    an attribute; one set of rules for every spelling, so no spelling reaches `__globals__`.
    """
    if attr.startswith("_"):
        return "private or dunder attribute", attr
    if attr in FORBIDDEN_ATTRS or attr.startswith(FRAME_ATTR_PREFIXES):
        return "forbidden attribute", attr
    return None


def _bound_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _class_scope(node: ast.ClassDef) -> set[str]:
    """The names a class body binds: inside it they hide the module's and the builtins'."""
    out: set[str] = set()
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                out |= _bound_names(t)
        elif isinstance(stmt, ast.AnnAssign):
            out |= _bound_names(stmt.target)
    return out


def _literal_names(node: ast.expr) -> list[str] | None:
    """The member or field names of a functional Enum/namedtuple, when written as literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace(",", " ").split()
    if isinstance(node, ast.List | ast.Tuple):
        out = []
        for elt in node.elts:
            first = elt.elts[0] if isinstance(elt, ast.List | ast.Tuple) and elt.elts else elt
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                return None
            out.append(first.value)
        return out
    if isinstance(node, ast.Dict):
        keys = [
            k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None for k in node.keys
        ]
        return None if None in keys else [k for k in keys if k is not None]
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, imports: frozenset[str]) -> None:
        self.imports = imports
        self.found: list[Violation] = []
        self.modules: dict[str, str] = {}  # local name -> module it is bound to
        self.from_imports: dict[str, str] = {}  # top-level `from m import x as y`: y -> "m.x"
        self.module_bound: frozenset[str] = frozenset()  # top-level names the file binds itself
        self.classes: frozenset[str] = frozenset()  # top-level names bound only by a `class`
        self.file_bound: frozenset[str] = frozenset()  # every name the file binds, in any scope
        self.enum_classes: set[str] = set()  # the file's classes derived from an Enum
        self.class_fields: set[int] = set()  # ids of `name: type` targets in class bodies
        self.params: list[frozenset[str]] = []  # the parameters of each enclosing function body
        self.factory_refs: set[int] = set()  # ids of nodes where a name factory may appear
        self.annotation_names: set[str] = set()
        self.assigned: dict[str, list[ast.expr]] = {}  # module and class level: name -> values

    def bad(self, node: ast.AST, rule: str, detail: str) -> None:
        self.found.append(Violation(getattr(node, "lineno", None), rule, detail))

    def scan(self, tree: ast.Module) -> None:
        """What the rules need to know of the whole file before checking any of it."""
        top: set[str] = set()
        only_class: set[str] = set()
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
                for a in stmt.names:
                    self.from_imports[a.asname or a.name] = f"{stmt.module}.{a.name}"
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                top.add(stmt.name)
            elif isinstance(stmt, ast.ClassDef):
                only_class.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    top |= _bound_names(t)
            elif isinstance(stmt, ast.AnnAssign):
                top |= _bound_names(stmt.target)
        self.module_bound = frozenset(top | only_class)
        self.classes = frozenset(only_class - top)
        bound: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
            if isinstance(node, ast.Call):
                self.factory_refs.add(id(node.func))
                if isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass"):
                    for arg in node.args[1:]:
                        self.factory_refs |= {id(n) for n in ast.walk(arg)}
            elif isinstance(node, ast.ClassDef):
                self.factory_refs |= {id(b) for b in node.bases}
                for stmt in node.body:
                    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                        for name in set().union(*(_bound_names(t) for t in targets)):
                            self.assigned.setdefault(name, []).append(stmt.value)
        for stmt in tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for name in set().union(*(_bound_names(t) for t in targets)):
                    self.assigned.setdefault(name, []).append(stmt.value)
        self.file_bound = frozenset(bound - set(self.modules))
        grew = True
        while grew:  # classes derived (within the file) from an Enum
            grew = False
            for stmt in tree.body:
                if isinstance(stmt, ast.ClassDef) and stmt.name not in self.enum_classes:
                    for b in stmt.bases:
                        q = self.qualify(b, frozenset())
                        if q in NAME_FACTORIES or (isinstance(b, ast.Name) and b.id in self.enum_classes):
                            self.enum_classes.add(stmt.name)
                            grew = True
                            break

    def qualify(self, node: ast.expr, local: frozenset[str]) -> str | None:
        """What a name or dotted name is bound to ("datetime.date", "builtins.len"); None when it is
        a value of the file itself (bound in `local`, the enclosing class body, or at top level)."""
        if isinstance(node, ast.Attribute):
            base = self.qualify(node.value, local)
            return None if base is None else f"{base}.{node.attr}"
        if not isinstance(node, ast.Name) or node.id in local or node.id in self.module_bound:
            return None
        name = node.id
        if name in self.modules:
            return self.modules[name]
        if name in self.from_imports:
            return self.from_imports[name]
        return f"builtins.{name}" if name in _BUILTIN_NAMES else None

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
            if a.asname is not None and (_dunder(a.asname) or a.asname in ATTR_FUNCS):
                self.bad(node, "forbidden name", a.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or mod not in self.imports:
            self.bad(node, "forbidden import", "." * node.level + mod)
            return
        allowed = MODULE_ATTRS[mod]
        for a in node.names:
            if a.name not in allowed:
                self.bad(node, "forbidden import", f"from {mod} import {a.name}")
            if a.asname is not None:
                self.binding(node, a.asname)

    # names and attributes
    def binding(self, node: ast.AST, name: str) -> None:
        """A name the code binds without an `ast.Name` node (`except E as n`, `case [*n]`, `as n`)."""
        if name in self.modules or name in ATTR_FUNCS or _dunder(name):
            self.bad(node, "forbidden name", name)
        elif name in _BUILTIN_NAMES and name not in SAFE_BUILTINS:
            self.bad(node, "forbidden name", name)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name in self.modules:
            verb = "rebound" if isinstance(node.ctx, ast.Store | ast.Del) else "used as a value"
            self.bad(node, "module reference", f"module {name!r} {verb} (use only its listed attributes)")
        elif name in ATTR_FUNCS:
            self.bad(node, "forbidden attribute access", f"{name} (attributes are named in the code)")
        elif _dunder(name):
            self.bad(node, "forbidden name", name)
        elif (
            name in _BUILTIN_NAMES
            and name not in SAFE_BUILTINS
            and id(node) not in self.class_fields
            and not any(name in params for params in self.params)
        ):
            self.bad(node, "forbidden name", name)
        else:
            self.factory_reference(node)

    def factory_reference(self, node: ast.Name | ast.Attribute) -> None:
        """Enum and namedtuple take attribute names as strings: only called (names checked) or subclassed."""
        if id(node) not in self.factory_refs and self.qualify(node, frozenset()) in NAME_FACTORIES:
            what = node.id if isinstance(node, ast.Name) else node.attr
            self.bad(node, "name factory used as a value", f"{what} (call it, or subclass it)")

    def visit_arg(self, node: ast.arg) -> None:
        if node.arg in ATTR_FUNCS or _dunder(node.arg) or node.arg in self.modules:
            self.bad(node, "forbidden name", node.arg)
        if node.annotation is not None:
            self.annotation(node.annotation)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg is not None and _dunder(node.arg):
            self.bad(node, "forbidden name", node.arg)
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.binding(node, node.name)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if isinstance(node.value, ast.Name) and node.value.id in self.modules:
            module = self.modules[node.value.id]
            if attr not in MODULE_ATTRS.get(module, frozenset()):
                self.bad(node, "forbidden module attribute", f"{module}.{attr}")
            self.factory_reference(node)
            return  # the module name itself is fine as the root of a listed attribute
        if (problem := _attribute_problem(attr)) is not None:
            self.bad(node, *problem)
        self.generic_visit(node)

    # match statements: patterns read attributes and bind names without Attribute or Name nodes
    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:
            if (problem := _attribute_problem(attr)) is not None:
                self.bad(node, problem[0], f"{attr} (in a class pattern)")
        if node.patterns:
            cls = node.cls
            itself = isinstance(cls, ast.Name) and cls.id in SELF_MATCHING and cls.id not in self.file_bound
            if not itself or len(node.patterns) > 1:
                name = _callee(cls)
                self.bad(
                    node,
                    "positional class pattern",
                    f"{name}(...) reads attributes its class names at run time; "
                    f"name them as keywords: {name}(x=...)",
                )
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.binding(node, node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.binding(node, node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self.binding(node, node.rest)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        q = self.qualify(node.func, frozenset())
        enum_class = isinstance(node.func, ast.Name) and node.func.id in self.enum_classes
        if q in NAME_FACTORIES or (enum_class and (len(node.args) > 1 or node.keywords)):
            self.factory_call(node, q or "enum.Enum")
        self.generic_visit(node)

    def factory_call(self, node: ast.Call, factory: str) -> None:
        """Enum's and namedtuple's functional forms set attributes named by strings: literal, checked."""
        names = node.args[1] if len(node.args) > 1 else None
        for kw in node.keywords:
            if kw.arg in ("names", "field_names", "fields"):
                names = kw.value
            elif factory == "typing.NamedTuple" and kw.arg is not None:
                if (problem := _attribute_problem(kw.arg)) is not None:
                    self.bad(kw, problem[0], f"{kw.arg} (a field of {_callee(node.func)})")
        if names is None:
            return
        literal = _literal_names(names)
        if literal is None:
            self.bad(
                node,
                "attribute names from a value",
                f"{_callee(node.func)}: write the names as literal strings",
            )
            return
        for name in literal:
            if (problem := _attribute_problem(name)) is not None:
                self.bad(node, problem[0], f"{name} (a member or field of {_callee(node.func)})")

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
        if isinstance(node, ast.ClassDef):
            # A class body looks a name it binds up in itself, then the module, then the builtins,
            # skipping the enclosing function: `open` read there before `open = 1` is the builtin
            # even inside `def tool(db, open)`. No enclosing parameter shadows anything in it.
            outer, self.params = self.params, []
            try:
                self.generic_visit(node)
            finally:
                self.params = outer
            return
        if node.returns is not None:
            self.annotation(node.returns)
            self.visit(node.returns)  # as generic_visit did
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        # In the body a parameter is the caller's value, never the builtin of its name: a tool
        # documented with a parameter `id` (Petstore's createUser) reads it as `id`. Only the
        # body: a default or an annotation is evaluated outside the function, where `id=id`
        # would still be the builtin.
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        self.params.append(frozenset(a.arg for a in every if a is not None))
        try:
            for stmt in node.body:
                self.visit(stmt)
        finally:
            self.params.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _def

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """A field declared `id: int` in a class body (a dataclass's, a TypedDict's) names an
        attribute, read only as `x.id`: a builtin's name is fine there. Only the declaration is
        let through; reading the bare name anywhere is still the builtin, and still refused."""
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self.class_fields.add(id(stmt.target))
        self._def(node)

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
            self.annotation_names.add(node.id)
            self.factory_refs.add(id(node))  # naming a type is not using it as a value
            self.visit_Name(node) if node.id not in self.modules else self.bad(
                node, "annotation outside the grammar", f"module {node.id!r}"
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
            if not self.readable_at_import(node, frozenset()):
                self.bad(node, "annotation outside the grammar", f"{node.attr} (an attribute of a value)")
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

    def type_aliases(self) -> None:
        """Values of the names annotations use are evaluated with them: the same grammar holds.

        `X = Optional["code"]` and then `x: X` would have `get_type_hints` evaluate the string.
        """
        done: set[str] = set()
        while todo := self.annotation_names - done:
            for name in todo:
                done.add(name)
                for value in self.assigned.get(name, []):
                    if (
                        isinstance(value, ast.Call)
                        and self.qualify(value.func, frozenset()) == "typing.TypeVar"
                    ):
                        for arg in [*value.args[1:], *(k.value for k in value.keywords)]:
                            self.annotation(arg)
                    else:
                        self.annotation(value)

    # import time: what runs when the module is imported builds data and never calls the file's code
    def readable_at_import(self, node: ast.Attribute, local: frozenset[str]) -> bool:
        """Attributes of modules and imported names, or one level of the file's own classes.

        Reading an attribute of anything else (an Enum member, a value of the file) can run a
        property of the file's code.
        """
        root: ast.expr = node
        depth = 0
        while isinstance(root, ast.Attribute):
            root, depth = root.value, depth + 1
        if not isinstance(root, ast.Name) or root.id in local:
            return False
        if root.id in self.classes:
            return depth == 1
        return root.id not in self.module_bound and (
            root.id in self.modules or root.id in self.from_imports or root.id in _BUILTIN_NAMES
        )

    def import_time(self, node: ast.AST, where: str, local: frozenset[str] = frozenset()) -> None:
        """Calls evaluated when the module is imported must be on the short allowlist."""
        comprehension = {
            n for c in ast.walk(node) if isinstance(c, ast.comprehension) for n in _bound_names(c.target)
        }
        local = local | comprehension
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                self.import_time_call(sub, where, local)
            elif isinstance(sub, ast.Attribute) and not self.readable_at_import(sub, local):
                self.bad(sub, f"attribute read at import time ({where})", sub.attr)
            if isinstance(sub, (ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
                self.bad(sub, f"expression at import time ({where})", type(sub).__name__)

    def import_time_call(self, node: ast.Call, where: str, local: frozenset[str]) -> None:
        q = self.qualify(node.func, local)
        if q not in IMPORT_TIME_CALLS:
            self.bad(node, f"call at import time ({where})", _callee(node.func))
            return
        for kw in node.keywords:
            if kw.arg is None or kw.arg in CALLBACK_KEYWORDS:
                self.bad(kw, f"callback argument at import time ({where})", f"{kw.arg or '**'}=")
        if q == "builtins.dict" and not all(isinstance(a, _DATA_LITERALS) for a in node.args):
            self.bad(
                node,
                f"call at import time ({where})",
                "dict() of a value (it calls .keys()): write a literal",
            )

    def assignment_target(self, node: ast.expr, where: str) -> None:
        """Import-time assignments bind names: setting an attribute can run a property setter."""
        if isinstance(node, ast.Tuple | ast.List):
            for elt in node.elts:
                self.assignment_target(elt, where)
        elif isinstance(node, ast.Starred):
            self.assignment_target(node.value, where)
        elif not isinstance(node, ast.Name):
            self.bad(
                node, f"assignment at import time ({where})", f"to {type(node).__name__} (assign names only)"
            )

    def decorators(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        local: frozenset[str],
        props: set[str],
    ) -> None:
        """A decorator is called with the function at import time: only the listed ones."""
        seen: set[str] = set()
        for d in node.decorator_list:
            if isinstance(d, ast.Call):
                self.import_time(d, "decorator", local)
                seen.add(self.qualify(d.func, local) or "")
            elif (
                isinstance(d, ast.Attribute)
                and d.attr in PROPERTY_DECORATORS
                and isinstance(d.value, ast.Name)
                and d.value.id in props
            ):
                props.add(node.name)
            elif (q := self.qualify(d, local)) in IMPORT_TIME_DECORATORS:
                seen.add(q)
                if q == "builtins.property":
                    props.add(node.name)
            else:
                self.bad(
                    d,
                    "decorator at import time",
                    f"{_callee(d)} (decorators: tool, dataclass, property, ...)",
                )
        if {"builtins.classmethod", "builtins.property"} <= seen:
            self.bad(
                node,
                "decorator at import time",
                "classmethod over property (reading the class attribute runs it)",
            )

    def statement_at_import(self, stmt: ast.stmt, local: frozenset[str], props: set[str], where: str) -> None:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                self.assignment_target(target, where)
            if stmt.value is not None:
                self.import_time(stmt.value, where, local)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.decorators(stmt, local, props)
            for default in [*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d is not None]]:
                self.import_time(default, "default", local)
        elif isinstance(stmt, ast.ClassDef):
            self.decorators(stmt, local, set())
            for base in stmt.bases:
                self.import_time(base, "class header", local)
            for kw in stmt.keywords:
                if kw.arg == "metaclass" or not isinstance(kw.value, ast.Constant):
                    self.bad(
                        kw, "class keyword at import time", f"{kw.arg}= (a metaclass or value runs code)"
                    )
            body_local = local | _class_scope(stmt)
            body_props: set[str] = set()
            for sub in stmt.body:
                if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.statement_at_import(sub, body_local, body_props, "class body")
                elif not (
                    isinstance(sub, ast.Pass)
                    or (isinstance(sub, ast.Expr) and isinstance(sub.value, ast.Constant))
                ):
                    self.bad(sub, "statement in class body", type(sub).__name__)


_TOP_OK = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


def _enum_bodies(tree: ast.Module, checker: _Checker) -> None:
    """An Enum of the file holds members only: pydantic reads a member's `value` and `name` while
    the tools are described (a parameter's type, its default), so a method there, a property
    named `value` above all, would be the file's own code running at load."""
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name in checker.enum_classes:
            for inner in stmt.body:
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                    checker.bad(
                        inner, "method in an Enum", f"{stmt.name}.{inner.name} (an Enum holds members only)"
                    )


def _top_level(tree: ast.Module, checker: _Checker) -> None:
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and i == 0:
            continue  # the module docstring
        if not isinstance(stmt, _TOP_OK):
            checker.bad(stmt, "statement at module top level", type(stmt).__name__)
            continue
        checker.statement_at_import(stmt, frozenset(), set(), "assignment")


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
    checker.scan(tree)
    _top_level(tree, checker)
    _enum_bodies(tree, checker)
    checker.visit(tree)
    checker.type_aliases()
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
