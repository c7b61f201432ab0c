"""SQLite's authorizer as the last line: what any SQL on an env's connection may do.

A tool's SQL is not filtered as text (comments, concatenation and odd spacing defeat any text
filter). Instead every connection the project opens for an env — the schema load and seed, every
episode, synthesis's scratch connections — carries a `SqlGuard`, which SQLite itself asks about
each action of each statement as it prepares it:

- never: ATTACH/DETACH (which create files; `VACUUM INTO` reaches the authorizer as an ATTACH),
  writing PRAGMAs, functions outside `ALLOWED_FUNCTIONS` (`load_extension`, `readfile`, …),
  SAVEPOINTs, and writes to SQLite's own `sqlite_*` tables (other than the bookkeeping rows
  SQLite writes itself for the DDL of a schema load);
- only while loading a schema: CREATE TABLE/INDEX/VIEW/TRIGGER;
- only while the runtime ends a transaction (`ending`): COMMIT and ROLLBACK;
- writes only to the tables in `writable` (None: any table of the env), so a tool writes only the
  tables its `writes=` names, triggers included.

SQLite asks only when it prepares a statement, and Python's sqlite3 keeps prepared statements in
a cache keyed by their text, so a statement authorized under one write set could be reused under a
narrower one. `allow_writes` therefore expires every prepared statement (by re-installing the
authorizer, which SQLite answers by re-preparing, and so re-authorizing, each on its next use)
whenever the new set does not cover every set granted since the last expiry.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from . import sqlclock, sqlfuncs

Authorizer = Callable[[int, str | None, str | None, str | None, str | None], int]

OK = sqlite3.SQLITE_OK
DENY = sqlite3.SQLITE_DENY

ALLOWED_FUNCTIONS = frozenset(
    # core scalar functions
    "abs char coalesce concat concat_ws format glob hex ifnull iif instr last_insert_rowid length like "
    "likelihood likely lower ltrim max min nullif octet_length printf quote random randomblob replace "
    "round rtrim sign soundex substr substring trim typeof unhex unicode unlikely upper zeroblob "
    "changes total_changes "
    # aggregates and window functions
    "avg count group_concat string_agg sum total row_number rank dense_rank percent_rank cume_dist "
    "ntile lag lead first_value last_value nth_value "
    # dates
    "date time datetime julianday unixepoch strftime timediff current_date current_time "
    "current_timestamp "
    # math
    "acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10 log2 "
    "mod pi pow power radians sin sinh sqrt tan tanh trunc "
    # JSON
    "json json_array json_array_length json_extract json_insert json_object json_quote "
    "json_remove json_replace json_set json_type json_valid json_group_array json_group_object "
    "jsonb jsonb_array jsonb_extract jsonb_insert jsonb_object jsonb_remove jsonb_replace "
    "jsonb_set jsonb_group_array jsonb_group_object json_error_position json_pretty".split()
)
"""Deterministic built-ins with no access outside the database (no files, no extensions; the date
functions read a fixed clock, `sqlclock`). Not
`json_patch`/`jsonb_patch`: SQLite merges two objects in time that grows with the product of their
key counts, inside one VM step (two objects of 40,000 keys: 5 s), out of a deadline's reach."""

READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
"""PRAGMAs that only describe the schema (their argument is a table or index name)."""

QUERY_PRAGMAS = frozenset({"foreign_key_check", "foreign_keys", "page_count"})
"""PRAGMAs allowed only without a value (`PRAGMA foreign_keys = OFF` is a write); `page_count`
is what `serialize()` asks."""

_ROW_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})
_ALWAYS = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE})
_SCHEMA_DDL = frozenset(
    {
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_VIEW,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_REINDEX,  # CREATE INDEX asks for it too
    }
)
_SQLITE_BOOKKEEPING = frozenset({"sqlite_master", "sqlite_schema"})


class SqlGuard:
    """The authorizer of one connection; see the module docstring for its rules.

    `denied` keeps the last refusal in words, for the log and the env error it becomes.
    """

    def __init__(self, *, schema: bool = False) -> None:
        self.schema = schema
        self.writable: frozenset[str] | None = None
        self.ending = False
        self._reopening = False
        self.denied: str | None = None
        # The union of the write sets statements were authorized under since the last expiry
        # (None: any table): a cached statement writes no table outside it.
        self.granted: frozenset[str] | None = frozenset()

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        if action in _ALWAYS:
            return OK
        if action in _ROW_WRITES:
            return self._write(arg1 or "", src)
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in ALLOWED_FUNCTIONS:
                return OK
            return self._deny(f"function {arg2}() is not allowed")
        if action == sqlite3.SQLITE_TRANSACTION:
            if arg1 == "BEGIN" or self.ending:
                return OK
            return self._deny(f"{arg1} is the runtime's to issue, not a tool's")
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in READ_PRAGMAS or (name in QUERY_PRAGMAS and arg2 is None):
                return OK
            return self._deny(f"PRAGMA {arg1} is not allowed")
        if action in _SCHEMA_DDL and self.schema and db in (None, "main"):
            return OK
        if action == sqlite3.SQLITE_ATTACH and self._reopening:
            return OK  # sqlite3_deserialize re-attaches "main" to the new bytes, in memory
        return self._deny(f"{_ACTION_NAMES.get(action, f'action {action}')} is not allowed")

    def _write(self, table: str, src: str | None) -> int:
        if table.startswith("sqlite_"):
            # SQLite records a schema load's own DDL in sqlite_master; SQL never writes it directly
            # (SQLite refuses that itself without PRAGMA writable_schema, which is denied).
            if self.schema and table in _SQLITE_BOOKKEEPING:
                return OK
            return self._deny(f"writing {table} is not allowed")
        if self.writable is None or table in self.writable:
            return OK
        via = f" (through trigger {src})" if src else ""
        return self._deny(f"writing table {table!r}{via} is not among this tool's writes")

    def _deny(self, reason: str) -> int:
        self.denied = reason
        return DENY

    def allow_writes(self, writable: frozenset[str] | None) -> bool:
        """Set the tables statements may write from now on; True when cached statements must be
        expired first (call `install` on the connection's thread), because one prepared earlier
        may write a table outside `writable`."""
        self.writable = writable
        self.denied = None
        granted = self.granted
        covered = writable is None or (granted is not None and granted <= writable)
        self.granted = writable
        return not covered

    @contextmanager
    def trusted(self) -> Iterator[None]:
        """Let the project's own code (never a tool) write any table and end its transaction
        through this connection, e.g. task setup rows. Statements it prepares may stay cached,
        so the next `allow_writes` expires them all."""
        writable, self.writable, self.ending = self.writable, None, True
        try:
            yield
        finally:
            self.writable, self.ending, self.granted = writable, False, None

    def deserialize(self, conn: sqlite3.Connection, data: bytes) -> None:
        """Replace `conn`'s database by `data` (SQLite does it through an internal ATTACH, which
        is allowed for exactly this call)."""
        self._reopening = True
        try:
            conn.deserialize(data)
        finally:
            self._reopening = False

    def install(self, conn: sqlite3.Connection) -> None:
        """(Re-)install on `conn`: SQLite expires its prepared statements, so each is authorized
        again on its next use."""
        conn.set_authorizer(self)


def end_transaction(conn: sqlite3.Connection, guard: SqlGuard, commit: bool) -> None:
    """COMMIT or ROLLBACK `conn`'s open transaction as the runtime: one job on the connection's
    thread, so no tool statement runs while `guard` allows ending it. Python's sqlite3 prepares
    these two afresh each time (they never enter the statement cache), so the permission does
    not outlive the call. A no-op when no transaction is open."""
    if not conn.in_transaction:
        return
    guard.ending = True
    try:
        conn.commit() if commit else conn.rollback()
    finally:
        guard.ending = False


def protect(conn: sqlite3.Connection, guard: Authorizer) -> None:
    """Install `guard` on `conn`, and set SQLite's attached-database limit to zero as a second
    lock on ATTACH and `VACUUM INTO` (which attaches its target). The functions SQLite runs in
    superlinear time inside one VM step are replaced by linear ones (`sqlfuncs`), and its clock
    by a fixed instant (`sqlclock`)."""
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(guard)
    sqlfuncs.install(conn)
    sqlclock.install(conn)


_ACTION_NAMES = {
    getattr(sqlite3, name): name.removeprefix("SQLITE_").replace("_", " ")
    for name in (
        "SQLITE_ATTACH",
        "SQLITE_DETACH",
        "SQLITE_ALTER_TABLE",
        "SQLITE_REINDEX",
        "SQLITE_ANALYZE",
        "SQLITE_CREATE_VTABLE",
        "SQLITE_DROP_VTABLE",
        "SQLITE_SAVEPOINT",
        "SQLITE_CREATE_TABLE",
        "SQLITE_CREATE_INDEX",
        "SQLITE_CREATE_VIEW",
        "SQLITE_CREATE_TRIGGER",
        "SQLITE_CREATE_TEMP_TABLE",
        "SQLITE_CREATE_TEMP_INDEX",
        "SQLITE_CREATE_TEMP_VIEW",
        "SQLITE_CREATE_TEMP_TRIGGER",
        "SQLITE_DROP_TABLE",
        "SQLITE_DROP_INDEX",
        "SQLITE_DROP_VIEW",
        "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_TEMP_TABLE",
        "SQLITE_DROP_TEMP_INDEX",
        "SQLITE_DROP_TEMP_VIEW",
        "SQLITE_DROP_TEMP_TRIGGER",
    )
}
