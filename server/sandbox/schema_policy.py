"""What a model-written `schema.sql` may contain, decided by SQLite's own parser before any of it runs.

A confined env's schema is applied at load, again for every client's posted state, and by
synthesis's load gate. Statements that do work there (a `CREATE TABLE ... AS WITH RECURSIVE ...`
that never ends) or that leave work for later writes to set off (a trigger waiting for a value
the seed lacks, fired by a state a client posts) must not get that far. A text filter cannot say
which is which; SQLite can: each statement is prepared as `EXPLAIN <statement>` on a throwaway
in-memory connection whose authorizer only records what SQLite asks about, so nothing of the
statement runs, and the recorded actions are judged against one allowlist:

- `CREATE TABLE` with column definitions: types, `PRIMARY KEY`, `UNIQUE`, `NOT NULL`,
  `REFERENCES`, `CHECK`, `DEFAULT`, generated columns (SQLite itself refuses subqueries in
  those, so each is one expression over one row);
- `CREATE INDEX`, partial and on expressions;
- `CREATE VIEW` over a `SELECT` of tables only: no other view, no `WITH` clause (a view runs
  only inside a tool's own statement, under that statement's bounds; its body is checked by
  preparing a read of it, and nesting is what would make that preparing itself cost);
- functions only from the SQL guard's allowlist, wherever they appear.

Everything else is refused: `CREATE TABLE ... AS SELECT` (a query at load, before any call's
budget applies; rows belong in the seed), triggers (docs/security.md: they run on writes no tool
chose), temporary and virtual tables, recursive CTEs, and any statement that is not one of the
creations above (INSERT, PRAGMA, DROP, ALTER, ATTACH, BEGIN, ...). A statement passing the
check is a plain creation, so it is then applied to the same empty throwaway database, where it
does no data work, only so that the next statement (an index on that table) can be prepared.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import EnvLoadError, LoadProblem
from ..core.seed import statements
from ..core.sqlguard import ALLOWED_FUNCTIONS

MAX_SCHEMA_CHARS = 256 * 1024
"""A confined schema.sql is at most this long (the synthesized ones are under 3,000 characters):
preparing is linear in the text, so this bounds the whole check."""

_CREATIONS = {
    sqlite3.SQLITE_CREATE_TABLE: "table",
    sqlite3.SQLITE_CREATE_INDEX: "index",
    sqlite3.SQLITE_CREATE_VIEW: "view",
}
_TRIGGERS = frozenset({sqlite3.SQLITE_CREATE_TRIGGER, sqlite3.SQLITE_CREATE_TEMP_TRIGGER})
_TEMPORARY = frozenset(
    {sqlite3.SQLITE_CREATE_TEMP_TABLE, sqlite3.SQLITE_CREATE_TEMP_INDEX, sqlite3.SQLITE_CREATE_TEMP_VIEW}
)
_ONLY = "a schema may only CREATE TABLE, INDEX or VIEW, one per statement"
_BOOKKEEPING = frozenset({"sqlite_master", "sqlite_schema"})
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "INSERT UPDATE DELETE PRAGMA TRANSACTION ATTACH DETACH ALTER_TABLE REINDEX ANALYZE "
        "SAVEPOINT DROP_TABLE DROP_INDEX DROP_VIEW DROP_TRIGGER DROP_TEMP_TABLE DROP_TEMP_INDEX "
        "DROP_TEMP_VIEW DROP_TEMP_TRIGGER DROP_VTABLE SELECT"
    ).split()
}

Action = tuple[int, str | None, str | None, str | None, str | None]


@dataclass(frozen=True)
class SchemaViolation:
    """One statement of schema.sql that breaks a rule: where it starts, how it begins, which rule."""

    line: int
    statement: str
    rule: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule} (statement: {self.statement})"


class _Recorder:
    """An authorizer that allows everything and remembers what it was asked, for a statement that
    is only prepared (`EXPLAIN`), never run."""

    def __init__(self) -> None:
        self.actions: list[Action] = []

    def __call__(self, action: int, a1: str | None, a2: str | None, db: str | None, src: str | None) -> int:
        self.actions.append((action, a1, a2, db, src))
        return sqlite3.SQLITE_OK


def _head(stmt: str) -> str:
    """The statement as an error quotes it: its code on one line, cut at 80 characters."""
    code = " ".join(part for line in stmt.splitlines() if (part := line.split("--", 1)[0].strip()))
    return code if len(code) <= 80 else code[:77] + "..."


def _prepare(conn: sqlite3.Connection, sql: str) -> list[Action] | str:
    """The actions SQLite asks about while preparing `sql` (nothing runs), or why it would not."""
    recorder = _Recorder()
    conn.set_authorizer(recorder)
    try:
        conn.execute("EXPLAIN " + sql).close()
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return str(exc)
    finally:
        conn.set_authorizer(None)
    return recorder.actions


def _judge(actions: list[Action]) -> tuple[str, str] | str:
    """(kind of creation, its name) for an allowed statement, or the rule it breaks."""
    made = [
        (action, a1 or "")
        for action, a1, *_ in actions
        if action in _CREATIONS and not (a1 or "").startswith("sqlite_autoindex_") and a1 != "sqlite_sequence"
    ]  # an autoindex is the one SQLite makes for a PRIMARY KEY or UNIQUE column, sqlite_sequence
    # the table it keeps AUTOINCREMENT's counters in (made with the first such table)
    kind = _CREATIONS[made[0][0]] if len(made) == 1 else None
    for action, _a1, a2, _db, _src in actions:  # the named rules first: they say most
        if action == sqlite3.SQLITE_RECURSIVE:
            return "a recursive CTE is not allowed in a schema"
        if action in _TRIGGERS:
            return "CREATE TRIGGER is not allowed in a model-written schema (docs/security.md)"
        if action in _TEMPORARY:
            return "a TEMP table, index or view is not allowed: a schema creates the env's own objects"
        if action == sqlite3.SQLITE_CREATE_VTABLE:
            return "CREATE VIRTUAL TABLE is not allowed: a schema creates ordinary tables"
        if action == sqlite3.SQLITE_FUNCTION and (a2 or "").lower() not in ALLOWED_FUNCTIONS:
            return f"function {a2}() is not allowed"
        if action == sqlite3.SQLITE_SELECT and kind == "table":
            return "CREATE TABLE ... AS SELECT is not allowed: a query at load; rows belong in the seed"
    # SQLite's own bookkeeping rows last, so the refusal names the statement's own action
    for action, a1, _a2, _db, _src in sorted(actions, key=lambda a: (a[1] or "").startswith("sqlite_")):
        allowed = (
            action in _CREATIONS
            or action in (sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION)
            or (action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE) and a1 in _BOOKKEEPING)
            or (action == sqlite3.SQLITE_REINDEX and kind == "index" and a1 == made[0][1])
        )
        if not allowed:
            return f"{_ACTION_NAMES.get(action, f'action {action}')} is not allowed: {_ONLY}"
    if kind is None:
        return f"this statement is not allowed: {_ONLY}"
    return kind, made[0][1]


def schema_violations(sql: str) -> list[SchemaViolation]:
    """The first statement of `sql` that a model-written schema may not hold, with its rule
    (an empty list: the schema passes).

    Statements are only prepared; one passing the check is then applied to a throwaway empty
    database (it is a plain creation, which does no data work) so later ones can refer to it.
    Last, an insert into each table is prepared, because SQLite authorizes the expressions of
    generated columns and indexes only where a row is written, and each `DEFAULT` apart. The
    check stops at the first refusal: preparing a hostile statement (a deeply nested `WITH`) can
    itself take a second, and one refusal refuses the schema, so it is paid at most once."""
    if len(sql) > MAX_SCHEMA_CHARS:
        return [SchemaViolation(1, _head(sql), f"the schema is longer than {MAX_SCHEMA_CHARS:,} characters")]
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    try:
        return _first_violation(conn, sql)
    finally:
        conn.close()


def _first_violation(conn: sqlite3.Connection, sql: str) -> list[SchemaViolation]:
    tables: dict[str, tuple[int, str]] = {}
    for line, stmt in statements(sql):
        if _only_comments(stmt):
            continue
        prepared = _prepare(conn, stmt)
        if isinstance(prepared, str):
            return [SchemaViolation(line, _head(stmt), f"SQLite cannot prepare it: {prepared}")]
        judged = _judge(prepared)
        if isinstance(judged, str):
            return [SchemaViolation(line, _head(stmt), judged)]
        kind, name = judged
        try:
            conn.execute(stmt)
        except sqlite3.Error as exc:
            return [SchemaViolation(line, _head(stmt), f"SQLite refuses it: {exc}")]
        if kind == "table":
            tables[name] = (line, _head(stmt))
        elif kind == "view":
            body = _prepare(conn, f"SELECT * FROM {_quote(name)}")
            rule = body if isinstance(body, str) else _view_rule(name, body)
            if rule:
                return [SchemaViolation(line, _head(stmt), f"the view's query: {rule}")]
    for name, (line, head) in tables.items():
        written = _prepare(conn, f"INSERT INTO {_quote(name)} DEFAULT VALUES")
        rule = written if isinstance(written, str) else _expression_rule(written)
        if rule:
            return [SchemaViolation(line, head, f"writing a row of {name}: {rule}")]
        defaults = _default_rules(conn, name)
        if defaults:
            return [SchemaViolation(line, head, defaults[0])]
    return []


def _default_rules(conn: sqlite3.Connection, table: str) -> list[str]:
    """SQLite resolves a column's `DEFAULT` when the table is created, so no later statement asks
    the authorizer about its functions: each default (SQLite's own text of the parsed
    expression) is prepared on its own."""
    rules = []
    for column in conn.execute(f"PRAGMA table_xinfo({_quote(table)})").fetchall():
        default = column[4]
        if default is None:
            continue
        prepared = _prepare(conn, f"SELECT {default}")
        rule = prepared if isinstance(prepared, str) else _expression_rule(prepared)
        if rule:
            rules.append(f"the default of {table}.{column[1]}: {rule}")
    return rules


def _only_comments(stmt: str) -> bool:
    """Whether SQLite would read `stmt` as nothing: comments, spaces and semicolons only. Read
    from the left as SQLite's tokenizer does, so a comment marker inside a string never counts."""
    rest = stmt
    while True:
        rest = rest.lstrip(" \t\r\n\f;")
        if rest.startswith("--"):
            newline = rest.find("\n")
            rest = "" if newline < 0 else rest[newline + 1 :]
        elif rest.startswith("/*"):
            end = rest.find("*/", 2)
            rest = "" if end < 0 else rest[end + 2 :]
        else:
            return rest == ""


def _view_rule(name: str, actions: list[Action]) -> str | None:
    """What a view's body may not do: read another view or a `WITH` clause's table (SQLite
    expands each reference afresh when it prepares a read, so nesting them doubles the work per
    level: 16 levels of one view took 1 s to prepare, a chain of views 40 s), or run what
    `_expression_rule` refuses. Reading tables only, a view costs a read what its text says."""
    rule = _expression_rule(actions)
    if rule is None:
        for _action, _a1, _a2, _db, src in actions:
            if src is not None and src != name:
                return f"a view may read only tables, not another view or a WITH clause ({src!r})"
    return rule


def _expression_rule(actions: list[Action]) -> str | None:
    """What reading a view or writing a row runs that a schema may not: recursion, or a function
    off the allowlist."""
    for action, _a1, a2, _db, _src in actions:
        if action == sqlite3.SQLITE_RECURSIVE:
            return "a recursive CTE is not allowed in a schema"
        if action == sqlite3.SQLITE_FUNCTION and (a2 or "").lower() not in ALLOWED_FUNCTIONS:
            return f"function {a2}() is not allowed"
    return None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def check_confined_schema(sql: str, path: Path) -> None:
    """Raise `EnvLoadError` naming file, line, statement and rule for the first statement of a
    model-written schema that breaks the policy above."""
    found = schema_violations(sql)
    if found:
        raise EnvLoadError(
            [
                LoadProblem(
                    path, v.line, f"the schema policy refuses it: {v.rule} (statement: {v.statement})"
                )
                for v in found
            ]
        )
