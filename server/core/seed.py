"""An env's database built from its text: the schema applied, the seed or a posted state loaded.

Statement by statement, each problem located by file and line, under a guard that allows DDL
only while the schema is applied. Kept in core (no loader, no `Environment`): a confined env's
schema and seed are model-written and built here by `sandbox.schema_host`'s bounded child,
which loads nothing beyond the core and the sandbox.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .envfiles import env_file_exists, read_env_text
from .errors import EnvLoadError, LoadProblem
from .manifest import EnvManifest
from .sqlguard import SqlGuard, end_transaction, protect
from .state import State, TableInfo, quote_ident, read_tables

MANIFEST = "env.toml"
SCHEMA = "schema.sql"


def statements(sql: str) -> Iterator[tuple[int, str]]:
    """Split an SQL script into complete statements, each with the line it starts on.

    A statement ends at a `;` where SQLite's own `complete_statement` says it is whole (so a `;`
    inside a string, a comment or a trigger body does not end it), wherever on a line it stands:
    `CREATE TABLE a(...); CREATE TABLE b(...);` on one line is two statements. Blank lines and
    comments between statements are passed over.
    """
    start = 0
    end = sql.find(";")
    while end != -1:
        text = sql[start : end + 1]
        if sqlite3.complete_statement(text):
            if _has_sql(text):
                yield _trimmed(sql, start, text)
            start = end + 1
        end = sql.find(";", end + 1)
    rest = sql[start:]
    if _has_sql(rest):
        yield _trimmed(sql, start, rest)


def _has_sql(text: str) -> bool:
    """Whether a piece of a script holds more than white space and `--` comments."""
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


def _trimmed(sql: str, start: int, text: str) -> tuple[int, str]:
    """`text` (found at offset `start` of `sql`) from its first word on, with that word's line."""
    skipped = 0
    for line in text.splitlines(keepends=True):
        if line.strip() and not line.strip().startswith("--"):
            skipped += len(line) - len(line.lstrip())
            break
        skipped += len(line)
    return sql.count("\n", 0, start + skipped) + 1, text[skipped:]


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
