"""A seed generator skeleton written from schema.sql: `generate()` with a loop per table, every
column named, keys and references filled in, and a `...` for each value the model writes.

Asked for seed data as JSON, Qwen2.5-Coder-1.5B wrote 7 rows, then 21, of the 100 the load gate
wants (captured on the corpus's Petstore set): a hundred rows do not fit a small model's answer,
and each row is tokens it must spend. A loop is a few lines whatever the count, so the seed stage
is given the loop written out from the schema: the table order (a referenced table first), the row
counts, integer keys, text ids as short codes (`C-14`), references drawn from the rows of the table
they name. What is left to the
model is what only the domain can say: a plausible value for each column, made unique with `i`
where the schema says UNIQUE. The answer still runs only as a seed generator does: statically
gated, then confined (`sandbox.run_seed_generator`).
"""

from __future__ import annotations

import math
import re
import sqlite3
from dataclasses import dataclass, field

from envforge.server import schema_violations

from ..wording.phrases import service_word, singular


@dataclass
class Column:
    name: str
    decl: str  # the column's declared type and constraints, as a comment for the model
    integer_key: bool = False
    primary: bool = False
    references: tuple[str, str] | None = None  # (table, column)
    implied: tuple[str, str] | None = None  # (table, column) its name points at, with no REFERENCES


@dataclass
class Table:
    name: str
    columns: list[Column] = field(default_factory=list)


def _tables(schema_sql: str) -> list[Table] | None:
    """The schema's tables and columns, read by SQLite from a throwaway in-memory database; None
    when the schema is not one a confined env may hold (nothing of it is then applied: the static
    gate will say why). `schema_violations` applies every statement to such a database itself
    before it passes them, so applying them here does nothing it has not already done."""
    if schema_violations(schema_sql):
        return None
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    try:
        conn.executescript(schema_sql)
        listed = "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        names = [r[0] for r in conn.execute(listed)]
        tables = []
        for name in names:
            table = Table(name)
            fks = conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,))
            refs = {r[3]: (r[2], r[4]) for r in fks}
            info = list(conn.execute('SELECT name, type, "notnull", pk FROM pragma_table_info(?)', (name,)))
            single_pk = sum(1 for r in info if r[3]) == 1
            sql = conn.execute("SELECT sql FROM sqlite_schema WHERE name = ?", (name,)).fetchone()[0] or ""
            for col, kind, _notnull, pk in info:
                integer_key = bool(pk) and single_pk and "INT" in str(kind).upper()
                decl = _declaration(sql, col) or f"{col} {kind}".strip()
                table.columns.append(Column(col, decl, integer_key, bool(pk), refs.get(col)))
            tables.append(table)
        for table in tables:
            for col in table.columns:
                if col.references is None:
                    col.implied = _implied_reference(col.name, table.name, tables)
        return tables
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _implied_reference(column: str, own: str, tables: list[Table]) -> tuple[str, str] | None:
    """The one other table a `<thing>_id` column names by its own name (`user_id` and
    `slack_users`), with that table's single primary key, or None. Qwen2.5-Coder-1.5B's Slack
    schema keyed `slack_user_profiles` by a `user_id` with no REFERENCES, so the seed gave each
    profile an id of its own, no user had a profile, and its tester's first profile lookup failed."""
    if not column.endswith("_id") or len(column) <= 3:
        return None
    base = column[:-3].lower()
    names = {base, f"{base}s", f"{base}es"}
    found = []
    for table in tables:
        keys = [c.name for c in table.columns if c.primary]
        name = table.name.lower()
        if table.name != own and len(keys) == 1 and any(name == n or name.endswith(f"_{n}") for n in names):
            found.append((table.name, keys[0]))
    return found[0] if len(found) == 1 else None


def schema_tables(schema_sql: str) -> list[Table]:
    """The schema's tables, columns and references as SQLite reads them (none when the schema is
    not one a confined env may hold)."""
    return _tables(schema_sql) or []


def _definitions(create_sql: str) -> list[str]:
    """The comma-separated parts of a CREATE TABLE's body, split at the top level only."""
    start = create_sql.find("(")
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for c in create_sql[start + 1 :] if start >= 0 else "":
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    parts.append("".join(current))
    return [" ".join(p.split()) for p in parts if p.strip()]


def _declaration(create_sql: str, column: str) -> str:
    """The column's definition in its CREATE TABLE (a comment for the model), or ""."""
    for part in _definitions(create_sql):
        if part.split()[0].strip('"`[]') == column:
            return part
    return ""


def _ordered(tables: list[Table]) -> list[Table]:
    """Referenced tables before the tables that reference them (cycles keep the schema's order)."""
    done: list[Table] = []
    left = list(tables)
    while left:
        waiting = {t.name for t in left}

        def ready(t: Table, waiting: set[str] = waiting) -> bool:
            refs = [ref[0] for c in t.columns if (ref := c.references or c.implied) is not None]
            return all(r == t.name or r not in waiting for r in refs)

        nxt = next((t for t in left if ready(t)), left[0])
        done.append(nxt)
        left.remove(nxt)
    return done


_HEAD = (
    "import datetime",
    "import random",
    "",
    "",
    "def generate() -> dict:",
    "    rng = random.Random(7)",
    "    start = datetime.datetime(2025, 1, 6, 9, 0)  # dates: start + datetime.timedelta(days=i)",
)


def _hint(decl: str) -> str:
    """What kind of value a column's declared type asks for, where a model got it wrong."""
    kind = decl.split()[1].upper() if len(decl.split()) > 1 else ""
    if "DATE" in kind or "TIME" in kind:
        return " (an ISO date string)"
    return ""


def _var(name: str) -> str:
    var = "".join(c if c.isalnum() or c == "_" else "_" for c in name).lower()
    return f"{var}_rows" if var.isidentifier() else "rows"


def _is_id(column: str) -> bool:
    """Whether a column names an identifier, not a natural key (a username, an email)."""
    return column.lower() == "id" or column.lower().endswith("_id") or column.endswith("Id")


def key_codes(tables: list[str]) -> dict[str, str]:
    """A short code per table for the text keys the skeleton writes, `C-14` for a channel: the
    initials of its singular, less a service word every table starts with. Left to the model,
    Qwen2.5-Coder-1.5B wrote `slack_message_14`, which task instructions then said raw (a code word
    to the realism check, in 7 of 50 tasks of its Slack env)."""
    service = service_word(tables)
    codes = {}
    for name in tables:
        words = name.split("_")[1 if service is not None else 0 :]
        words[-1] = singular(words[-1])
        codes[name] = "".join(w[0] for w in words if w).upper() or "R"
    return codes


def seed_skeleton(schema_sql: str, min_rows: int) -> str | None:
    """`generate()` for this schema with `...` where the model writes a value, or None when the
    schema has no table SQLite reads (the seed stage is then asked without a skeleton)."""
    tables = _tables(schema_sql)
    if not tables:
        return None
    tables = _ordered(tables)
    per_table = max(10, math.ceil(min_rows / len(tables)))
    variables: dict[str, str] = {}
    for t in tables:
        var = _var(t.name)
        while var in variables.values() or var in ("rng", "i", "random", "generate"):
            var += "_"
        variables[t.name] = var
    codes = key_codes([t.name for t in tables])
    lines = [*_HEAD]
    for table in tables:
        var = variables[table.name]
        lines += [f"    {var} = []", f"    for i in range(1, {per_table + 1}):", f"        {var}.append({{"]
        for col in table.columns:
            if col.integer_key:
                value = "i"
            elif (ref := col.references or col.implied) and ref[0] in variables and ref[0] != table.name:
                parent = next(t for t in tables if t.name == ref[0])
                key = ref[1] or next((c.name for c in parent.columns if c.primary), None)
                rows = variables[parent.name]
                # a key that is also a reference (a user's profile): one row per parent row
                drawn = f"{rows}[(i - 1) % len({rows})]" if col.primary else f"rng.choice({rows})"
                value = f"{drawn}[{key!r}]" if key else "..."
            elif col.primary and _is_id(col.name) and sum(c.primary for c in table.columns) == 1:
                value = f'f"{codes[table.name]}-{{i}}"'
            else:
                value = "..."
            lines.append(f"            {col.name!r}: {value},  # {col.decl}{_hint(col.decl)}")
        lines.append("        })")
    returned = ", ".join(f"{t.name!r}: {variables[t.name]}" for t in tables)
    lines.append(f"    return {{{returned}}}")
    return "\n".join(lines) + "\n"


def _keyless_references(schema_sql: str) -> list[tuple[str, str, str, str]]:
    """(table, column, parent, parent column) of each foreign key whose parent column is no key
    of its table; empty when SQLite cannot read the schema or it is not one a confined env may
    hold (the static gate's other checks say why)."""
    if schema_violations(schema_sql):
        return []
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    found: list[tuple[str, str, str, str]] = []
    try:
        conn.executescript(schema_sql)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
        for table in tables:
            for fk in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)):
                parent, child_col, parent_col = fk[2], fk[3], fk[4]
                if parent in tables and parent_col is not None and not _is_key(conn, parent, parent_col):
                    found.append((table, child_col, parent, parent_col))
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return found


_ACTIONS = r"(?:\s+ON\s+(?:DELETE|UPDATE)\s+(?:SET\s+NULL|SET\s+DEFAULT|CASCADE|RESTRICT|NO\s+ACTION))*"


def without_keyless_references(schema_sql: str) -> str:
    """schema.sql without the foreign keys that reference a column which is no key of its table
    (`FOREIGN KEY (c) REFERENCES p(x)` as a table constraint, or `REFERENCES p(x)` on the column):
    SQLite refuses every row of the child table under such a key ("foreign key mismatch"), so it
    constrains nothing that could ever be written. Captured on Slack: Qwen2.5-Coder-1.5B kept
    `FOREIGN KEY (thread_ts) REFERENCES slack_messages(timestamp)` through three repairs that
    named it. Only such clauses are cut; the schema is then gated as any other."""
    for _table, column, parent, parent_col in _keyless_references(schema_sql):
        names = [re.escape(n) for n in (column, parent, parent_col)]
        q = '["`\\[]?'
        clause = (
            rf"(?i),\s*(?:CONSTRAINT\s+\w+\s+)?FOREIGN\s+KEY\s*\(\s*{q}{names[0]}{q}\s*\)\s*REFERENCES\s+"
            rf"{q}{names[1]}{q}\s*\(\s*{q}{names[2]}{q}\s*\){_ACTIONS}"
        )
        inline = rf"(?i)\s+REFERENCES\s+{q}{names[1]}{q}\s*\(\s*{q}{names[2]}{q}\s*\){_ACTIONS}"
        cut = re.sub(clause, "", schema_sql)
        if cut == schema_sql:
            cut = re.sub(inline, "", schema_sql, count=1)
        schema_sql = cut
    return schema_sql


def reference_problems(schema_sql: str) -> list[str]:
    """Foreign keys whose parent columns are no key of their table (neither the primary key nor
    UNIQUE): SQLite accepts the schema and then refuses every row written to the child table
    ("foreign key mismatch"), at load. Captured on Slack: `FOREIGN KEY (thread_ts) REFERENCES
    slack_messages(timestamp)`; the pipeline cuts such keys (`without_keyless_references`), and
    names any it could not cut."""
    return [
        f"schema.sql: {table}.{column} references {parent}.{parent_col}, which is not a key of {parent}"
        f" (SQLite then refuses every {table} row): reference its PRIMARY KEY or make that column UNIQUE"
        for table, column, parent, parent_col in _keyless_references(schema_sql)
    ]


def _is_key(conn: sqlite3.Connection, table: str, column: str) -> bool:
    """Whether `column` alone is the primary key of `table` or has a UNIQUE index of its own."""
    info = list(conn.execute("SELECT name, pk FROM pragma_table_info(?)", (table,)))
    if [r[0] for r in info if r[1]] == [column]:
        return True
    for index in conn.execute('SELECT name, "unique" FROM pragma_index_list(?)', (table,)):
        cols = [r[0] for r in conn.execute("SELECT name FROM pragma_index_info(?)", (index[0],))]
        if index[1] and cols == [column]:
            return True
    return False
