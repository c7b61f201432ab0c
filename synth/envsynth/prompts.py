"""Prompt templates, one per stage, each versioned so a synthesis report says exactly what was asked.

Bump a stage's version whenever its wording changes: `synthesis.json` records the versions used,
so two envs can be compared knowing whether they were asked the same thing.
"""

from __future__ import annotations

import ast
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .seed_template import Table

PROMPT_VERSIONS: dict[str, str] = {
    "schema": "schema/v5",
    "tools": "tools/v5",
    "seed": "seed/v4",
    "policy": "policy/v3",
    "policy_rules": "policy_rules/v4",
    "tester": "tester/v2",
    "checker": "checker/v2",
    "repair": "repair/v3",
    "tool": "tool/v2",
}

SYSTEM = """envsynth stage={stage} round={round} prompt={version}
You build executable tool-using environments for the envforge framework. Answer with exactly one
fenced block and nothing else."""

ENV_FORMAT = """An envforge env is: schema.sql (SQLite DDL; every table has a PRIMARY KEY; CHECKs and
FOREIGN KEYs encode the domain rules), seed data, policy.md, and tools.py of async functions:

    from envforge.server import ToolError, tool

    @tool                                   # read tool: must change nothing
    async def get_x(db, x_id: str) -> dict:
        \"\"\"What it does.

        Args:
            x_id: The id.
        \"\"\"

    @tool(writes=["table_a"])               # write tool: may change only the tables it names

The first parameter is `db: Db` (`await db.fetch_all(sql, params)` -> list of dicts,
`db.fetch_one`, `db.fetch_value`, `db.require_one(sql, params, "x not found")`, `db.execute`);
always bind values with `?`; raise ToolError for refusals and unknown ids; return dicts/lists
keyed by the schema's column names. Allowed imports: __future__, typing, datetime, math, json,
re, decimal, collections, itertools, functools, dataclasses, enum, string,
`from envforge.server import Db, tool, ToolError`. Nothing else: no file, network, process,
eval/exec, dunders."""

RULES_FORMAT = """policy_rules.toml declares the rules of policy.md that a verifier checks from an
episode's record (the calls, their results, who said what, in order). Every key is optional;
declare only what policy.md says, and quote the sentence each rule stands for in a # comment.
The sections, commented out (a file with no rule at all is valid: uncomment and fill in only the
sections policy.md asks for, with this env's own tool and parameter names):

    # [identity]              # the person the task acts for is verified before a write
    # tools = ["get_x"]       # READ tools whose result names that one person by their key; their
    #                         # required parameters are columns of that person's row
    # exempt = []             # WRITE tools that act for no person (a restock)

    # [confirmation]          # the user's explicit yes before each write
    # required = true
    # exempt = []             # WRITE tools that need no yes

    # [[lookup]]              # a WRITE naming param = X comes after a READ that showed X
    # param = "x_id"          # a parameter of at least one write tool
    # tools = ["get_x"]       # READ tools; the first one takes `param`

    # [[forbidden]]           # a call policy.md bans outright (every listed argument equal)
    # tool = "delete_x"
    # arguments = {}          # keys are parameters of `tool`
    # reason = "why"

    # [transfer]              # handing the user to a human
    # allowed = true          # true | false | "when_expected" (only where the task needs it)
    # tools = []

Name only tools that tools.py defines, with their exact names. A tool with `writes=[...]` is a
write; every other tool is a read. Leave a section out when policy.md asks nothing of it."""

STAGE_TASKS: dict[str, str] = {
    "schema": (
        "Design the state for these tools: one table per kind of record the tools below create, read,"
        " change or delete (the records themselves, never one table per tool), with a column for each"
        " field the tools read or write. Name each table with a plural noun for its records, never a"
        " tool's name or an SQL keyword. No table the tools never use, and never a table of the tool"
        " documents themselves. Answer with schema.sql in a ```sql block."
    ),
    "tools": (
        "Complete tools.py: the skeleton below already has EVERY documented tool with its exact name,"
        " parameters, types and docstring; keep those as they are and replace each"
        " `# TODO` and `raise NotImplementedError` with the tool's body against schema.sql. Mark a tool"
        " that changes rows `@tool(writes=[...the tables it changes...])` (the tables its SQL inserts into,"
        " updates or deletes from are added to it). Answer with the whole"
        " file in a ```python block."
    ),
    "seed": (
        "Write the seed data for this schema as a Python generator: complete generate() in the seed"
        " skeleton below. Replace every `...` with an expression for that column's value in row i: a"
        " realistic value of the service's domain that satisfies the column's constraints (use i in"
        " every UNIQUE or key column so rows differ; rng, a random.Random, for variety). Keep the loops,"
        " the keys and the references as written. Answer with the whole file in a ```python block."
        " (Without a skeleton: a ```python block defining generate() returning {table name: [row dicts]},"
        " at least 100 rows in all, keyed by the table names listed below.)"
    ),
    "policy": (
        "Write policy.md: the rules an agent using these tools must follow. Answer in a ```markdown block."
    ),
    "policy_rules": (
        "Write policy_rules.toml: the rules of this policy.md a verifier can check, for these tools."
        " Answer in a ```toml block."
    ),
    "tester": (
        "You are the TESTER. Propose calls that check the tools behave as documented, using ids from the"
        ' sample rows: valid calls and calls that must be refused. Answer ```json [{"tool": ..., '
        '"arguments": {...}, "expect": "success"|"error", "why": ...}]```.'
    ),
    "tool": (
        "Rewrite ONE tool of tools.py so that it passes the checks below: keep its name, parameters,"
        " decorator and docstring, and change its body against schema.sql. Answer with only this one"
        " function (its decorator included) in a ```python block: no imports, no other function, no"
        " other code."
    ),
    "checker": (
        "You are the CHECKER. For each executed call judge whether the result agrees with the docs."
        ' Answer ```json {"verdicts": [{"call": index, "ok": true|false, "reason": ...}]}```.'
    ),
}


REPAIRABLE = ("schema", "tools", "seed", "policy", "policy_rules")

ANSWERS: dict[str, str] = {
    "schema": "schema.sql (SQLite CREATE TABLE statements, no Python) in one ```sql block",
    "tools": "tools.py in one ```python block",
    "seed": "the seed generator (generate()) in one ```python block",
    "policy": "policy.md (your own rules for an agent, not the documents) in one ```markdown block",
    "policy_rules": "policy_rules.toml naming only tools of tools.py, in one ```toml block",
    "tool": "only the one corrected function in one ```python block",
    "tester": "the JSON list of calls in one ```json block",
    "checker": "the JSON verdicts in one ```json block",
}
"""Each stage's answer, said again as the prompt's last line: a long context ends far from the
task's first line, and after a repair's evidence Qwen2.5-Coder-1.5B answered the schema stage
with the tools.py skeleton its context showed ("the complete corrected file"), three rounds
running (captured on the corpus's Redis set)."""


def system(stage: str, round_: int) -> str:
    version = PROMPT_VERSIONS["repair"] if round_ and stage in REPAIRABLE else None
    return SYSTEM.format(stage=stage, round=round_, version=version or PROMPT_VERSIONS[stage])


def messages(
    stage: str, round_: int, context: dict[str, str], evidence: str | None = None
) -> list[dict[str, str]]:
    """The chat messages for one stage: the task, the context it needs, and (repairs) the evidence."""
    parts = [STAGE_TASKS[stage], ENV_FORMAT if stage in ("tools", "seed") else ""]
    if stage == "policy_rules":
        parts.append(RULES_FORMAT)
    for title, body in context.items():
        parts.append(f"## {title}\n{body}")
    if evidence is not None:
        parts.append(
            "## Your previous answer failed these checks\n"
            f"{evidence}\nFix every problem and answer with the complete corrected {ANSWERS[stage]}."
        )
    else:
        parts.append(f"Answer with {ANSWERS[stage]}.")
    return [
        {"role": "system", "content": system(stage, round_)},
        {"role": "user", "content": "\n\n".join(p for p in parts if p)},
    ]


def tool_messages(name: str, round_: int, context: dict[str, str], evidence: str) -> list[dict[str, str]]:
    """The chat messages asking for one tool's function (`splice`): the stage line names the tool
    (`stage=tool_<name>`), so each tool's answer is its own recording key."""
    parts = [STAGE_TASKS["tool"], *(f"## {title}\n{body}" for title, body in context.items())]
    parts.append(f"## The checks {name} fails\n{evidence}\nAnswer with {ANSWERS['tool']}.")
    line = SYSTEM.format(stage=f"tool_{name}", round=round_, version=PROMPT_VERSIONS["tool"])
    return [{"role": "system", "content": line}, {"role": "user", "content": "\n\n".join(parts)}]


_UNKNOWN = re.compile(
    r"unknown (?:id )?(\w+)=(\S+)(?: \(it names a row by (\w+)\.(\w+)[^)]*\))? was not refused \(got: (.*)\)$"
)
"""An unknown id let through, or an unknown value of a column that names one row (`probes`):
the parameter, the value, the table and column it names a row by (for the latter), the result."""
_REFUSAL_CRASHED = re.compile(r"unknown (?:id )?(\w+)=\S+.* crashed instead of being refused")
_WROTE_NOTHING = re.compile(r"every call from seed data that succeeded changed no row")
_MISPLACED = re.compile(r"(\w+)=\S+ names a row by (\w+)\.(\w+), yet was written as (\w+)\.(\w+) of a row")
_MISSING = re.compile(r"(missing|wrong-typed) '(\w+)' was not refused")
_CRASH = re.compile(r"\[it crashed: ([^\]]*)\]")
_ALL_REFUSED = re.compile(r"no valid call from seed data succeeded \(last: Error: (?!internal error)(.*)\)$")
_OBJECT = re.compile(r"its result is a Python object, not a value")
_KEYLESS = re.compile(r"inserted a row into (\w+) with no ([\w/]+) \(NULL\)")


def expected_behaviour(problem: str) -> str | None:
    """What one probe problem asks the tool to do, said as the change to make: told only that an
    unknown id "was not refused", the 1.5B model returned the same function."""
    m = _REFUSAL_CRASHED.search(problem)
    if m:
        return (
            f"a call whose {m[1]} names no row must be refused with ToolError, not crash: look the row up"
            " first (`db.require_one` raises the ToolError) before using the value in any other way"
        )
    if _WROTE_NOTHING.search(problem):
        return (
            "a call with the seed's own values must change a row: the rows its arguments name must"
            " be found (their ids and values are in the call) and written, and a WHERE must match them"
        )
    m = _MISPLACED.search(problem)
    if m:
        return (
            f"{m[1]} is the {m[3]} of the {m[2]} row to act on, not data: look that row up by its {m[3]}"
            f" and change it (an UPDATE of that row, or a row that references it); never write {m[1]}"
            f" into {m[4]}.{m[5]}"
        )
    m = _UNKNOWN.search(problem)
    if m and m[3]:
        return (
            f"{m[1]} names one {m[3]} row by its {m[4]}: look that row up first, raise"
            f' ToolError("{m[1]} not found") when there is none, and act on the row found; {m[1]} is'
            " not a value to store in a new row"
        )
    if m:
        return (
            f'an unknown {m[1]} (such as {m[2]}) must raise ToolError("{m[1]} not found") instead of'
            f" returning {m[5].strip() or 'nothing'}: look the row up first and raise when there is none"
        )
    m = _MISSING.search(problem)
    if m:
        what = "a call without" if m[1] == "missing" else "a call with a wrongly typed"
        return f"{what} {m[2]} must raise ToolError, changing no row"
    m = _ALL_REFUSED.search(problem)
    if m:
        return (
            f"a call with the seed's own values must succeed; every one was refused ({m[1][:80]}). Check"
            " each refusal's condition: `db.require_one` raises when NO row matches, so use it for a row"
            " that must exist; refuse a duplicate with `if await db.fetch_one(...) is not None: raise"
            ' ToolError("... already exists")`'
        )
    if _OBJECT.search(problem):
        return (
            "it must return a value, not the cursor `db.execute` gives: after a write, read the row"
            " written back with `await db.fetch_one(...)` and return that dict"
        )
    m = _KEYLESS.search(problem)
    if m:
        return f"every row it inserts into {m[1]} must have its {m[2]} set (the INSERT names {m[2]})"
    m = _CRASH.search(problem)
    value = re.search(r"no such column: (\w+)", m[1]) if m else None
    if m and (
        re.search(r"incomplete input|syntax error|unrecognized token|datatype mismatch", m[1])
        or (value and f'": "{value[1]}"' in problem)
    ):
        # captured: `sql += f" OFFSET {cursor}"` crashed on the tester's `cursor: ""`; a value
        # pasted unquoted reads as a column (`no such column: compact`, the call's own value)
        return (
            f"it crashed ({m[1]}): its SQL was built from a call's values and broke on them: bind every"
            " value with ?, leave out a clause whose argument is None or empty, and " + BIND_IN_STEP
        )
    if m and re.search(r"no (?:such )?column|has no column", m[1]):
        return f"it crashed ({m[1]}): its SQL must name only the columns its tables have (shown above)"
    if m and "FOREIGN KEY constraint failed" in m[1]:
        return (
            f"it crashed ({m[1]}): a column that references another table must hold a key of an existing row"
        )
    if m:
        return (
            f"it crashed ({m[1]}): every name it uses must be one of its parameters, a variable it sets"
            " first, or an import tools.py already has"
        )
    return None


_NO_COLUMN = re.compile(r"table (\w+) has no column named (\w+)")
_WRITTEN = re.compile(r"(?i)\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE(?:\s+OR\s+\w+)?)\s+[\"`\[]?(\w+)")


def table_facts(
    problems: list[str],
    tables: list[Table],
    function: str,
    seed: dict[str, list[dict[str, Any]]] | None = None,
) -> list[str]:
    """What the schema says that a crash shows the tool got wrong, said as the change to make.

    A column its table lacks: that table's columns, and what to do with a parameter that has none
    (told only "its SQL must name only the columns its tables have", Qwen2.5-Coder-1.5B kept
    inserting `channel_id` into a replies table with no such column, three rounds running). A
    foreign key that failed: each reference of the tables the tool writes, and the lookup that
    fills it (the same model, past the column, wrote the call's `thread_ts` into
    `parent_message_id`, a reference to a message's id, told the reference in words three rounds
    running). Both captured on the corpus's Slack set. With the seed rows, the lookup is written
    out: which column of the referenced table holds the values a parameter takes
    (`reference_lookups`)."""
    by_name = {t.name: t for t in tables}
    out: dict[str, None] = {}
    for table, column in (m.groups() for p in problems if (m := _NO_COLUMN.search(p))):
        if table in by_name:
            names = ", ".join(c.name for c in by_name[table].columns)
            out[
                f"The table {table} has exactly these columns: {names}. {column} is not one of them:"
                " write only these columns; a parameter with no column here is checked (look its row"
                " up in the table it names, raise ToolError when there is none), not stored."
            ] = None
    for param, *named in dict.fromkeys(m.group(1, 3, 4) for p in problems if (m := _UNKNOWN.search(p))):
        if named[0] is not None:  # a value naming a row by a column: the row found is acted on
            table, key = named
            out[
                f"Find the row the {param} names first, before any other read or write: `row = await"
                f' db.require_one("SELECT * FROM {table} WHERE {key} = ?", ({param},), "{param} not'
                ' found")`, then act on that row.'
            ] = None
            continue
        home = _home_of(param, tables)
        if home is not None:
            table, key = home
            out[
                f'Check the {param} first, before any other read or write: `await db.require_one("SELECT'
                f' {key} FROM {table} WHERE {key} = ?", ({param},), "{param} not found")`.'
            ] = None
    for table, key in dict.fromkeys(m.groups() for p in problems if (m := _KEYLESS.search(p))):
        line = new_key_line(table, key, seed or {})
        if line:
            out[line] = None
            insert = keyed_insert(function, table, key)
            if insert:
                out[
                    f"Write the row with its {key} in the INSERT itself (not an UPDATE after it): `{insert}`."
                ] = None
    if any("FOREIGN KEY constraint failed" in p for p in problems):
        for name in dict.fromkeys(_WRITTEN.findall(function)):
            for col in by_name[name].columns if name in by_name else []:
                if col.references:
                    ref_table, ref_col = col.references
                    out[
                        f"{name}.{col.name} must hold the {ref_col} of an existing {ref_table} row: look"
                        f" that row up first from the call's arguments (SELECT {ref_col} FROM {ref_table}"
                        " WHERE ... = ?), raise ToolError when there is none, and write the"
                        f" {ref_col} it found, not an argument as it came."
                    ] = None
                    for line in reference_lookups(
                        function, col.name, ref_table, ref_col, by_name, seed or {}
                    ):
                        out[line] = None
    return list(out)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def new_key_line(table: str, key: str, seed: dict[str, list[dict[str, Any]]]) -> str | None:
    """How to make the key of a row a tool inserts, written out from the seed's keys when they are
    one prefix and a number (`slack_message_7`): the next number after the rows there are. Told
    only that its rows had no id, a model has nothing deterministic to write (a uuid differs every
    run), so the line it can copy is given."""
    held = [str(r[key]) for r in seed.get(table, []) if r.get(key) is not None]
    found = [m for v in held if (m := _NUMBERED.match(v))]
    prefixes = {m[1] for m in found}
    if not held or len(found) != len(held) or len(prefixes) != 1:
        return None
    prefix = prefixes.pop()
    return (
        f"Make the new row's {key} from the rows there are, as the seed's {key}s are made"
        f' ({held[0]}, ...): `count = await db.fetch_one("SELECT COUNT(*) AS n FROM {table}")` then'
        f" `new_{key} = f\"{prefix}{{count['n'] + 1}}\"`, insert it as {key}, and return the row"
        f' read back with `await db.fetch_one("SELECT * FROM {table} WHERE {key} = ?", (new_{key},))`.'
    )


def _string_names(fn: ast.AST) -> dict[str, str]:
    """The function's variables bound to a string literal (`sql = "INSERT ..."`)."""
    bound = {}
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            bound.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return bound


def keyed_insert(function: str, table: str, key: str) -> str | None:
    """The tool's own INSERT into `table`, rewritten to give `key` (`new_<key>`) first, or None
    when it cannot be read (SQL not a literal, columns not listed, values not a tuple). Given the
    line that makes a key, Qwen2.5-Coder-1.5B kept its INSERT without the key and added an UPDATE
    by `result['id']`, a cursor it cannot index (captured on Slack); the statement to write is
    spelled out from the one it wrote."""
    try:
        tree = ast.parse(function)
    except (SyntaxError, ValueError):
        return None
    strings = _string_names(tree)
    shape = re.compile(
        rf"(?is)^\s*INSERT\s+(?:OR\s+\w+\s+)?INTO\s+[\"`\[]?{re.escape(table)}[\"`\]]?\s*\(([^)]*)\)\s*VALUES\s*\("
    )
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "execute"
        ):
            continue
        if len(node.args) != 2 or not isinstance(node.args[1], ast.Tuple):
            continue
        sql_arg = node.args[0]
        sql = (
            sql_arg.value
            if isinstance(sql_arg, ast.Constant) and isinstance(sql_arg.value, str)
            else strings.get(sql_arg.id, "")
            if isinstance(sql_arg, ast.Name)
            else ""
        )
        m = shape.match(sql)
        columns = [c.strip().strip('"`[]') for c in m[1].split(",")] if m else []
        values = [ast.unparse(v) for v in node.args[1].elts]
        if not columns or key in columns or len(columns) != len(values):
            continue
        marks = ", ".join("?" for _ in range(len(columns) + 1))
        return (
            f'await db.execute("INSERT INTO {table} ({", ".join([key, *columns])}) VALUES ({marks})",'
            f" ({', '.join([f'new_{key}', *values])}))"
        )
    return None


def _home_of(param: str, tables: list[Table]) -> tuple[str, str] | None:
    """The table and key column an id parameter names rows of: the table a column named like it
    references, else a table whose primary key has its name."""
    for table in tables:
        for col in table.columns:
            if col.name == param and col.references is not None:
                return col.references
    for table in tables:
        for col in table.columns:
            if col.name == param and col.primary:
                return table.name, col.name
    return None


def _parameters(function: str) -> list[str]:
    try:
        tree = ast.parse(function)
    except (SyntaxError, ValueError):
        return []
    fn = next((n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)), None)
    return [a.arg for a in fn.args.args if a.arg != "db"] if fn else []


def _values(seed: dict[str, list[dict[str, Any]]], table: str, column: str) -> set[str]:
    return {str(r[column]) for r in seed.get(table, []) if r.get(column) is not None}


def reference_lookups(
    function: str,
    column: str,
    ref_table: str,
    ref_col: str,
    tables: dict[str, Table],
    seed: dict[str, list[dict[str, Any]]],
) -> list[str]:
    """The lookup that fills `column` (a reference to `ref_table.ref_col`), written out: for a
    parameter whose values (the seed's values of the other columns named like it, which the probes
    draw from) are values of a column of `ref_table` that tells its rows apart, that column is the
    one to look the row up by. On the Slack capture: the call's `thread_ts` (drawn from the replies'
    `thread_ts`) is a message's `timestamp`."""
    rows = seed.get(ref_table, [])
    out = []
    for param in _parameters(function):
        named = [t for t, shape in tables.items() if param in {c.name for c in shape.columns}]
        for by in [c.name for c in tables[ref_table].columns] if ref_table in tables else []:
            given = set().union(*(_values(seed, t, param) for t in named if (t, param) != (ref_table, by)))
            held = [str(r[by]) for r in rows if r.get(by) is not None]
            if given & set(held) and len(held) == len(set(held)):
                article = ref_table[:-1] if ref_table.endswith("s") else ref_table
                # a variable named for its row: with the channel's lookup also bound to `row`, the
                # 1.5B looked the message up by the channel's id (captured on Slack)
                var = f"{article}_row" if article.isidentifier() else "row"
                out.append(
                    f"The {param} a call gives is a {ref_table}.{by}: write it as"
                    f' `{var} = await db.require_one("SELECT {ref_col} FROM {ref_table} WHERE {by} = ?",'
                    f' ({param},), "{article} not found")` and then {column} = {var}["{ref_col}"].'
                )
                break
    return out


VERDICT: dict[str, Any] = {
    "type": "object",
    "properties": {"call": {"type": "integer"}, "ok": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["call", "ok", "reason"],
}

JSON_SCHEMAS: dict[str, dict[str, object]] = {
    "tester": {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": {
                "tool": {"type": "string"},
                "arguments": {"type": "object"},
                "expect": {"type": "string", "enum": ["success", "error"]},
                "why": {"type": "string"},
            },
            "required": ["tool", "arguments", "expect", "why"],
        },
    },
    "checker": {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "array",
                "items": VERDICT,
            }
        },
        "required": ["verdicts"],
    },
}
"""The shape of each stage whose answer is parsed as JSON (the probe agents'), as a JSON schema:
a server that constrains decoding to it (`LiteLLMResponder(structured=...)`) returns an answer
that always parses, where a small model left free writes prose, trailing commas or half a list.
The seed stage is left free: it may answer with a `generate()` function instead of rows."""


def json_schema(stage: str, messages: list[dict[str, str]]) -> dict[str, object] | None:
    """`stage`'s JSON schema for this prompt: the checker's asks for exactly one verdict per
    executed call, in order (`call` 0, 1, ...), the count read from the prompt's executed calls;
    left free in length, a small model judged some calls twice and others not at all ("no verdict")."""
    schema = JSON_SCHEMAS.get(stage)
    if stage != "checker" or schema is None:
        return schema
    text = messages[-1]["content"] if messages else ""
    _, found, rest = text.partition("## Executed calls\n")
    try:
        calls, _ = json.JSONDecoder().raw_decode(rest)
    except ValueError:
        return schema
    if not found or not isinstance(calls, list):
        return schema
    verdict: dict[str, Any] = dict(VERDICT)
    items = [
        {**verdict, "properties": {**verdict["properties"], "call": {"const": i}}} for i in range(len(calls))
    ]
    return {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "array",
                "prefixItems": items,
                "minItems": len(items),
                "maxItems": len(items),
            }
        },
        "required": ["verdicts"],
    }


LESSONS_IN_ORDER = (
    "Write one function holding every line above, in this order: check each id the call names,"
    " look up the rows its references need, make the new row's key, insert, and return the row read back."
)
"""Said when a repair holds two code lessons or more (Slack, six rounds: the 1.5B's answers each
dropped one of the channel check, the message lookup, the new key and the row read back)."""

LESSONS_ACT_ON_ROW = (
    "Write one function holding every line above, in this order: check each id the call names, look"
    " up the row the call names, change that row with an UPDATE, and return the row read back."
)
"""Said instead when the tool must act on a row a value names rather than insert one."""


def rows_acted_on(problems: list[str]) -> set[str]:
    """The tables a tool wrote a row-naming value into as data (`probes`' misplaced value): its
    repair must change the named row there, not insert one."""
    return {m[4] for p in problems if (m := _MISPLACED.search(p))}


def teaches_an_insert(lesson: str, tables: set[str]) -> bool:
    """Whether an earlier lesson teaches inserting a row into one of `tables` (its key, its INSERT).
    Repeated beside "act on the row it names", such lessons won: the 1.5B kept inserting a new
    Slack message holding the timestamp of the one to react to, given its earlier round's INSERT
    line, the new key's line and the order "make the new row's key, insert", four rounds running."""
    marks = ("INSERT INTO {t} ", "inserts into {t} ", 'FROM {t}")` then `new_')
    return any(mark.format(t=t) in lesson for t in tables for mark in marks)


BIND_IN_STEP = (
    'build the values with the clauses: keep `sql = "SELECT ..."` and start `params = []`, then for'
    ' each optional argument given `sql += " LIMIT ?"` and `params.append(limit)`, and pass'
    " `tuple(params)`"
)
"""Told the values must be bound, the 1.5B's repair of `slack_list_channels` added `LIMIT ?` and
`OFFSET ?` each only when its argument was given but passed both values always (captured on
Slack, eight rounds: "Incorrect number of bindings"); shown `params = [...]` alone, its next
repairs dropped `sql = "SELECT ..."` for it (resumed Slack run: every greedy answer crashed on
`sql` never set)."""


REPAIR_HINTS: tuple[tuple[str, str], ...] = (
    (
        "was not refused",
        'Look each id up before using it: `row = await db.require_one("SELECT ... WHERE id = ?", (x,),'
        ' "x not found")` raises ToolError for an unknown id; an empty list or null is no refusal.',
    ),
    (
        "Cursor object",
        "db.execute returns a cursor, not a result: after a write, return a dict (the row written,"
        " read back with `await db.fetch_one(...)`).",
    ),
    (
        "Incorrect number of bindings",
        f"Each ? takes one value, in order: {BIND_IN_STEP}.",
    ),
    (
        "datatype mismatch",
        "LIMIT and OFFSET take integers, and a cursor or page argument may be empty or no number:"
        " add its clause only when the argument is given and not empty, binding `int(cursor)`;"
        f" {BIND_IN_STEP}.",
    ),
    (
        "ConfinedToolCrash",
        "The tool crashed (a bug, not a refusal): every name it uses must be one of its parameters or"
        ' set in its body, and rows are dicts keyed by column name (row["id"], not row[0]).',
    ),
    (
        ": syntax error (statement: CREATE TABLE",
        "A table named like an SQL keyword or a tool (SET, GET, DELETE, LIST, ...) does not parse:"
        " name each table with a plural noun for the records it holds, one table per kind of record.",
    ),
    (
        'SQLite cannot prepare it: near "from"',
        "schema.sql is SQL: CREATE TABLE statements only, not the tools.py shown for reference.",
    ),
    (
        "statement at module top level",
        "tools.py is a Python module: only imports, constants, helper functions and @tool async"
        " functions at its top level. An answer that is the tool documents (a JSON object) or SQL is"
        " not tools.py: start from the skeleton and write the bodies.",
    ),
    (
        "forbidden name",
        "A Python builtin outside the gate's allowlist (id, type, open, input, ...) or a __dunder__ name may"
        ' not be used: rename the variable (user_id, kind), and read a column as row["id"].',
    ),
    (
        "forbidden SQL",
        "No string may contain the words ATTACH, DETACH, PRAGMA, VACUUM, load_extension, readfile or"
        " writefile, a docstring or message included, even as plain English: reword it"
        ' ("add" for "attach").',
    ),
    (
        "unknown table",
        "seed.json's top-level keys are the schema's table names (under 'Tables to fill'), each"
        " holding a list of rows: objects whose keys are that table's columns.",
    ),
    (
        "syntax error",
        "The file must parse as Python: answer with the complete file in one ```python block, every"
        " string and bracket closed, nothing after the block.",
    ),
)
"""What to change, per kind of static-gate problem: the gate's own words say what is wrong
("tools.py line 1: statement at module top level: Expr"), which Qwen2.5-Coder-0.5B answered
with the same JSON three rounds running (captured on the corpus's Petstore set); "seed.json:2:
unknown table 'table'" got `{"table": [...]}` back three times (Slack)."""


def repair_hints(problems: list[str]) -> list[str]:
    """The hints of `REPAIR_HINTS` whose kind of problem is among `problems`, once each."""
    return [hint for kind, hint in REPAIR_HINTS if any(kind in p for p in problems)]
