"""Load an env folder into an `Environment`, validating everything and locating every problem.

An env folder is data: `env.toml`, `policy.md`, `schema.sql`, `tools.py` and a seed file. Loading
applies the DDL statement by statement, inserts the seed rows under the schema's constraints, and
derives every tool's schema, so a broken env fails here, with file and line, rather than in the
middle of an episode.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import linecache
import sqlite3
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..core.envfiles import env_file, env_file_exists, read_env_text
from ..core.errors import EnvLoadError, LoadProblem
from ..core.manifest import EnvManifest
from ..core.sqlguard import SqlGuard, end_transaction, protect
from ..core.state import State, TableInfo, export_state, quote_ident, read_tables, state_hash
from ..core.tooldef import TOOL_MARK, ToolDefinitionError, ToolSpec, build_tool_spec, def_line
from ..sandbox.schema_policy import check_confined_schema, statements

MANIFEST = "env.toml"
POLICY = "policy.md"
SCHEMA = "schema.sql"
TOOLS = "tools.py"


@dataclass
class Environment:
    """A loaded, validated environment: tools, schema, and the serialised seed database."""

    root: Path
    manifest: EnvManifest
    policy: str
    schema_sql: str
    tools: dict[str, ToolSpec]
    tables: list[TableInfo]
    seed_db: bytes = field(repr=False)
    _seed_state: State | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.manifest.name

    def seed_state(self) -> State:
        """The canonical export of the seed database (computed once)."""
        if self._seed_state is None:
            conn = open_database(self.seed_db)
            try:
                self._seed_state = export_state(conn, self.tables, self.manifest.volatile_columns)
            finally:
                conn.close()
        return self._seed_state

    def seed_hash(self) -> str:
        return state_hash(self.seed_state())

    def database_from_state(self, state: State) -> bytes:
        """Build a serialised database holding exactly `state` (e.g. a task's initial state).

        Raises `ValueError` naming the table and row when the state breaks the schema.
        """
        return state_database(self.schema_sql, self.root / SCHEMA, state, self.tables)


def state_database(
    schema_sql: str, schema_path: Path, state: State, tables: list[TableInfo] | None = None
) -> bytes:
    """`Environment.database_from_state` for a schema given as text: the serialised database
    holding exactly `state`, or `ValueError` naming the table and row. `tables` None: read off the
    schema once applied (in `schema_host`'s child, which has no `Environment`)."""
    if not isinstance(state, dict):
        raise ValueError(f"state must be an object of table -> list of rows, not {_kind(state)}")
    conn, guard = _fresh_connection()
    try:
        _apply_schema(conn, schema_sql, schema_path, guard)
        _end_schema(conn, guard)
        known = {t.name: t for t in (read_tables(conn) if tables is None else tables)}
        for table, rows in state.items():
            if table not in known:
                raise ValueError(f"state names unknown table {table!r}")
            if not isinstance(rows, (list, tuple)):
                raise ValueError(f"state table {table!r} must be a list of rows, not {_kind(rows)}")
            for i, row in enumerate(rows):
                try:
                    _insert_row(conn, table, row)
                except (sqlite3.Error, BadRow) as exc:
                    raise ValueError(f"state row {table}[{i}] rejected: {exc}") from exc
        violations = conn.execute("PRAGMA foreign_key_check").fetchall()
        if violations:
            t, rowid, parent, _ = violations[0]
            raise ValueError(f"state row in {t} (rowid {rowid}) references a missing {parent} row")
        return conn.serialize()
    finally:
        conn.close()


def _fresh_connection() -> tuple[sqlite3.Connection, SqlGuard]:
    """An empty database to apply a schema to, under a guard that allows DDL (nothing else that
    the guard denies: the schema and seed are env files, and model-written ones are untrusted)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")  # checked in bulk after inserting, to allow any row order
    guard = SqlGuard(schema=True)
    protect(conn, guard)
    return conn, guard


def _end_schema(conn: sqlite3.Connection, guard: SqlGuard) -> None:
    """The schema is in: from here on (seed rows, state rows) DDL is denied."""
    guard.schema = False
    guard.install(conn)


def open_database(data: bytes, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """An in-memory connection holding a private copy of a serialised database, guarded."""
    conn = sqlite3.connect(":memory:", check_same_thread=check_same_thread)
    conn.deserialize(data)
    conn.execute("PRAGMA foreign_keys = ON")
    protect(conn, SqlGuard())
    return conn


def _apply_schema(conn: sqlite3.Connection, sql: str, path: Path, guard: SqlGuard) -> None:
    for line, stmt in statements(sql):
        guard.denied = None
        try:
            conn.execute(stmt)
        except sqlite3.Error as exc:
            why = f"{exc}: {guard.denied}" if guard.denied else str(exc)
            raise EnvLoadError([LoadProblem(path, line, f"DDL failed: {why}")]) from exc


class BadRow(ValueError):
    """A state or seed row that SQLite could not even be handed: its message names the column."""


_SQLITE_INTEGERS = range(-(2**63), 2**63)


def _kind(value: object) -> str:
    """How a JSON value is named in an error: `null`, `true`, `an integer`, ..."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


def _column_value(column: object, value: Any) -> Any:
    """What SQLite is given for one column of a row, checked first so that a value it cannot bind
    (an integer past 64 bits, a lone surrogate, a foreign object) is a `BadRow` naming the
    column, not an `OverflowError` or `UnicodeEncodeError` from deep inside sqlite3."""
    if not isinstance(column, str) or not column or "\x00" in column or not _utf8(column):
        raise BadRow(f"column name {column!r} is not a valid identifier")
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value)
        except (ValueError, TypeError, RecursionError) as exc:
            raise BadRow(f"column {column!r}: the value cannot be stored as JSON ({exc})") from None
    if isinstance(value, bool) or value is None or isinstance(value, (float, bytes)):
        return value
    if isinstance(value, int):
        if value not in _SQLITE_INTEGERS:
            bits = value.bit_length()
            raise BadRow(f"column {column!r}: a {bits}-bit integer does not fit SQLite's 64 bits")
        return value
    if isinstance(value, str):
        if not _utf8(value):
            raise BadRow(f"column {column!r}: the string is not valid Unicode (a lone surrogate)")
        return value
    raise BadRow(f"column {column!r}: {_kind(value)} cannot be stored")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _insert_row(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    if not isinstance(row, dict) or not row:
        raise BadRow("a row must be a non-empty JSON object" + ("" if row == {} else f", not {_kind(row)}"))
    values = [_column_value(c, v) for c, v in row.items()]
    cols = ", ".join(quote_ident(c) for c in row)
    marks = ", ".join("?" for _ in row)
    conn.execute(f"INSERT INTO {quote_ident(table)} ({cols}) VALUES ({marks})", values)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _scan_seed_json(text: str, path: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """Parse `{table: [row, ...]}` keeping each row's line, so constraint errors can point at it."""
    decoder = json.JSONDecoder()
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise EnvLoadError([LoadProblem(path, exc.lineno, f"invalid JSON: {exc.msg}")]) from exc
    out: list[tuple[str, int, dict[str, Any]]] = []
    seen = [0, 1]  # (offset, line) reached so far: counting forward keeps this linear in the file size

    def line_at(offset: int) -> int:
        seen[1] += text.count("\n", seen[0], offset)
        seen[0] = offset
        return seen[1]

    pos = _skip_ws(text, 0)
    if text[pos : pos + 1] != "{":
        raise EnvLoadError([LoadProblem(path, 1, "seed JSON must be an object of table -> list of rows")])
    pos = _skip_ws(text, pos + 1)
    while text[pos] != "}":
        table, pos = decoder.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        pos = _skip_ws(text, pos + 1)  # ':'
        if text[pos] != "[":
            raise EnvLoadError(
                [LoadProblem(path, _line_of(text, pos), f"{table!r} must map to a list of rows")]
            )
        pos = _skip_ws(text, pos + 1)
        while text[pos] != "]":
            row_start = pos
            row, pos = decoder.raw_decode(text, pos)
            out.append((table, line_at(row_start), row))
            pos = _skip_ws(text, pos)
            if text[pos] == ",":
                pos = _skip_ws(text, pos + 1)
        pos = _skip_ws(text, pos + 1)
        if text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    return out


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _load_seed(conn: sqlite3.Connection, root: Path, name: str, tables: dict[str, TableInfo]) -> None:
    path = root / name
    if not env_file_exists(root, name):
        raise EnvLoadError([LoadProblem(path, None, "seed file is missing")])
    text = read_env_text(root, name)
    if path.suffix == ".sql":
        for line, stmt in statements(text):
            try:
                conn.execute(stmt)
            except sqlite3.Error as exc:
                raise EnvLoadError([LoadProblem(path, line, f"seed statement failed: {exc}")]) from exc
    elif path.suffix == ".json":
        rows = _scan_seed_json(text, path)
        rowid_lines: dict[tuple[str, int], int] = {}
        problems = []
        for table, line, row in rows:
            if table not in tables:
                problems.append(LoadProblem(path, line, f"unknown table {table!r}"))
                continue
            try:
                _insert_row(conn, table, row)
                rowid = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                rowid_lines[(table, rowid)] = line
            except (sqlite3.Error, BadRow) as exc:
                problems.append(LoadProblem(path, line, f"row for {table!r} rejected: {exc}"))
        if problems:
            raise EnvLoadError(problems)
        violations = conn.execute("PRAGMA foreign_key_check").fetchall()
        if violations:
            raise EnvLoadError(
                [
                    LoadProblem(
                        path,
                        rowid_lines.get((t, rowid)),
                        f"row for {t!r} references a missing {parent!r} row",
                    )
                    for t, rowid, parent, _ in violations[:20]
                ]
            )
        return
    else:
        raise EnvLoadError([LoadProblem(path, None, "seed must be a .json or .sql file")])
    violations = conn.execute("PRAGMA foreign_key_check").fetchall()
    if violations:
        t, rowid, parent, _ = violations[0]
        raise EnvLoadError(
            [LoadProblem(path, None, f"row {rowid} of {t!r} references a missing {parent!r} row")]
        )


def _load_manifest(root: Path) -> EnvManifest:
    path = root / MANIFEST
    if not env_file_exists(root, MANIFEST):
        raise EnvLoadError([LoadProblem(path, None, "manifest is missing")])
    try:
        data = tomllib.loads(read_env_text(root, MANIFEST))
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        raise EnvLoadError([LoadProblem(path, line, f"invalid TOML: {exc}")]) from exc
    try:
        return EnvManifest.model_validate(data)
    except ValidationError as exc:
        problems = [
            LoadProblem(path, None, f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}")
            for e in exc.errors()
        ]
        raise EnvLoadError(problems) from exc


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


def _load_tools(
    root: Path, manifest: EnvManifest, tables: set[str], *, static_gate: bool = True
) -> dict[str, ToolSpec]:
    path = root / TOOLS
    if not env_file_exists(root, TOOLS):
        raise EnvLoadError([LoadProblem(path, None, "tools.py is missing")])
    path = env_file(root, TOOLS)  # its real path, inside the folder: what the tools are read from
    if manifest.trust == "confined":
        from ..sandbox.confined_tools import load_confined_tools  # model-written code: never imported here

        if static_gate:
            _gate(path)
        tools = load_confined_tools(path, manifest)
    else:
        tools = tools_of_module(load_tool_module(path, manifest.name), path)
    _check_writes(tools, tables, path)
    return tools


def _gate(path: Path) -> None:
    """Model-written tools pass the static gate before any worker runs them, at load as at
    synthesis: a tools.py written or changed after synthesis (or never synthesized here) gets
    no way around the first filter. The sandbox stays the boundary either way."""
    from ..sandbox.static_gate import check_python

    violations = check_python(path.read_text(encoding="utf-8"))
    if violations:
        raise EnvLoadError(
            [
                LoadProblem(path, v.line, f"the static gate refuses it: {v.rule}: {v.detail}")
                for v in violations
            ]
        )


def _check_writes(tools: dict[str, ToolSpec], tables: set[str], path: Path) -> None:
    """A `writes=` naming a table the schema lacks is a load error (the SQL guard enforces the rest)."""
    problems = [
        LoadProblem(
            path,
            spec.source_line,
            f"tool {spec.name!r}: writes= names {', '.join(map(repr, unknown))}, "
            f"which schema.sql does not define",
        )
        for spec in tools.values()
        if (unknown := [t for t in spec.writes if t not in tables])
    ]
    if problems:
        raise EnvLoadError(problems)


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
        if spec.name in tools:
            problems.append(LoadProblem(path, spec.source_line, f"duplicate tool name {spec.name!r}"))
            continue
        tools[spec.name] = spec
    if not tools and not problems:
        problems.append(LoadProblem(path, None, "no tools found (decorate async functions with @tool)"))
    if problems:
        raise EnvLoadError(problems)
    return tools


def build_seed(root: Path, manifest: EnvManifest, schema_sql: str) -> tuple[bytes, list[TableInfo]]:
    """The env's schema applied and its seed loaded: the serialised database and its tables.

    Raises `EnvLoadError` with file and line. A confined env's runs in a bounded child process
    (`schema_host`), since its DDL, triggers and seed are model-written."""
    schema_path = root / SCHEMA
    conn, guard = _fresh_connection()
    try:
        _apply_schema(conn, schema_sql, schema_path, guard)
        _end_schema(conn, guard)
        tables = read_tables(conn)
        if not tables:
            raise EnvLoadError([LoadProblem(schema_path, None, "schema defines no tables")])
        no_pk = [t.name for t in tables if not t.primary_key]
        if no_pk:
            raise EnvLoadError([LoadProblem(schema_path, None, f"tables without a primary key: {no_pk}")])
        problems = [
            LoadProblem(root / MANIFEST, None, f"volatile_columns names unknown column {t}.{c}")
            for t, cols in manifest.volatile_columns.items()
            for c in cols
            if t not in {x.name for x in tables} or c not in next(x for x in tables if x.name == t).columns
        ]
        if problems:
            raise EnvLoadError(problems)
        conn.execute("BEGIN")
        _load_seed(conn, root, manifest.seed, {t.name: t for t in tables})
        end_transaction(conn, guard, commit=True)
        return conn.serialize(), tables
    finally:
        conn.close()


def load_env(root: str | Path, *, static_gate: bool = True) -> Environment:
    """Load and validate an env folder. Raises `EnvLoadError` listing problems with file and line.

    A confined env's tools.py must pass the static gate (`static_gate.check_python`) first, and
    its schema.sql the schema policy (`schema_policy.check_confined_schema`); `static_gate=False`
    skips both, for tests of the sandbox itself, which run code the gates would refuse to show
    that the OS layer holds without them. Every file is read without following a link out of
    the folder (`envfiles`)."""
    root = Path(root)
    if not root.is_dir():
        raise EnvLoadError([LoadProblem(root, None, "not a directory")])
    manifest = _load_manifest(root)
    policy_path = root / POLICY
    policy = read_env_text(root, POLICY) if env_file_exists(root, POLICY) else ""
    if not policy.strip():
        raise EnvLoadError([LoadProblem(policy_path, None, "policy.md is missing or empty")])
    schema_path = root / SCHEMA
    if not env_file_exists(root, SCHEMA):
        raise EnvLoadError([LoadProblem(schema_path, None, "schema.sql is missing")])
    schema_sql = read_env_text(root, SCHEMA)
    if manifest.trust == "confined" and static_gate:  # model-written: prepared and judged, never run
        check_confined_schema(schema_sql, schema_path)
    if manifest.trust == "confined":  # a model-written schema and seed: built in a bounded child
        from ..sandbox.schema_host import build_seed_bounded

        seed_db, tables = build_seed_bounded(root, manifest, schema_sql)
    else:
        seed_db, tables = build_seed(root, manifest, schema_sql)
    tools = _load_tools(root, manifest, {t.name for t in tables}, static_gate=static_gate)
    return Environment(
        root=root,
        manifest=manifest,
        policy=policy,
        schema_sql=schema_sql,
        tools=tools,
        tables=tables,
        seed_db=seed_db,
    )
