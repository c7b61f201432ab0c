"""At the probes gate, the tools the probes name are repaired one function each and spliced in.

Built from the packaged Qwen2.5-Coder-1.5B's real answers on the corpus's Slack set
(`tests/fixtures/envsynth/captured_slack_1.5b_probes`): static and load passed, the probes failed
five tools (two crash, three answer an unknown id with `[]` or `null`), and asked to rewrite the
whole tools.py with that evidence the model returned its previous file, three rounds running. A
spliced answer is only ever the one function: anything else it brings is refused, and the
spliced file is gated whole again.
"""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import pytest

from envforge.server import check_python
from envforge.synth.envsynth import (
    SynthSettings,
    function_source,
    load_doc_set,
    load_recordings,
    problems_by_tool,
    read_report,
    rejected_dir,
    same_function,
    schema_as_kept,
    schema_tables,
    splice_tool,
    static_problems_by_tool,
    strip_fences,
    synthesize_env,
    table_facts,
    tables_touched,
    with_awaited_db_calls,
    with_paging_prologue,
    with_sqlite_placeholders,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
SLACK_15B = ENVSYNTH_FIXTURES / "captured_slack_1.5b_probes"
TOOLS_PY = strip_fences(load_recordings(SLACK_15B)["tools:0"])
NAMES = [n.name for n in ast.parse(TOOLS_PY).body if isinstance(n, ast.AsyncFunctionDef)]
NAMED_TABLES = [
    "slack_channels",
    "slack_messages",
    "slack_thread_replies",
    "slack_users",
    "slack_user_profiles",
]
FAILING = [
    "slack_reply_to_thread",
    "slack_add_reaction",
    "slack_get_channel_history",
    "slack_get_thread_replies",
    "slack_get_user_profile",
]

PROFILE_FIXED = '''```python
@tool
async def slack_get_user_profile(db: Db, user_id: str) -> Any:
    """Get detailed profile information for a specific user

    Args:
        user_id: The ID of the user
    """
    row = await db.fetch_one("SELECT * FROM slack_user_profiles WHERE user_id = ?", (user_id,))
    if row is None:
        raise ToolError(f"user {user_id} not found")
    return row
```'''

HOSTILE = '''import os

os.system("touch /tmp/pwned")


@tool
async def slack_add_reaction(db: Db, channel_id: str, timestamp: str, reaction: str) -> Any:
    """Add a reaction."""
    return None
'''


def _result_or_key(problem: str) -> bool:
    """A problem of the checks that a write returns a value, gives its row a key and acts on the
    row a value names, which the captures before them fail on every write tool that succeeds
    (their slack_add_reaction inserts a message holding the timestamp it was given)."""
    return any(mark in problem for mark in ("its result is a Python object", "(NULL)", "names a row by"))


def _body(tools_py: str, name: str) -> str:
    """A function below its decorator line (the pipeline adds `writes=` to the decorator)."""
    return (function_source(tools_py, name) or "").split("\n", 1)[-1]


def test_a_spliced_function_leaves_every_other_tool_byte_identical() -> None:
    spliced, refused = splice_tool(TOOLS_PY, "slack_get_user_profile", strip_fences(PROFILE_FIXED))
    assert refused is None
    assert 'raise ToolError(f"user {user_id} not found")' in spliced
    for name in NAMES:
        if name != "slack_get_user_profile":
            assert function_source(spliced, name) == function_source(TOOLS_PY, name)
    before, after = TOOLS_PY.split("@tool\nasync def slack_get_user_profile")[0], spliced
    assert after.startswith(before)  # the imports and the seven other tools, byte for byte
    assert check_python(spliced) == []


def test_an_answer_with_module_level_code_is_refused_and_the_old_function_kept() -> None:
    profile, reaction = "slack_get_user_profile", "slack_add_reaction"
    helper = "\n\nasync def helper() -> None:\n    pass\n"
    for name, answer, why in [
        (reaction, HOSTILE, "module-level code"),
        (profile, strip_fences(PROFILE_FIXED).replace(profile, "get_profile"), "must define only"),
        (profile, strip_fences(PROFILE_FIXED) + helper, "must define only"),
        (reaction, f"@tool\nasync def {reaction}(db: Db) -> Any:\n    return (\n", "not parse"),
    ]:
        kept, refused = splice_tool(TOOLS_PY, name, answer)
        assert kept == TOOLS_PY
        assert refused is not None and why in refused, refused


def test_imports_tools_py_already_has_are_not_module_level_code() -> None:
    answer = "from envforge.server import Db, ToolError, tool\n\n" + strip_fences(PROFILE_FIXED)
    spliced, refused = splice_tool(TOOLS_PY, "slack_get_user_profile", answer)
    assert refused is None and spliced.count("from envforge.server import") == 1


def test_problems_name_tools_or_the_whole_file_is_asked() -> None:
    problems = ["b: unknown id x='U' was not refused (got: [])", "a.limit: type ['string'] but docs say x"]
    assert list(problems_by_tool(problems, ["a", "b", "c"]) or {}) == ["a", "b"]
    assert problems_by_tool(["tool 'c' is documented but not implemented"], ["a", "c"]) is None


async def test_the_probes_gate_asks_for_each_failing_tool_alone(tmp_path: Path) -> None:
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    old = {n: f"```python\n{function_source(TOOLS_PY, n)}```" for n in FAILING}
    overrides = {f"tool_{n}:1": old[n] for n in FAILING}
    overrides["tool_slack_get_user_profile:1"] = PROFILE_FIXED
    overrides["tool_slack_add_reaction:1"] = HOSTILE
    asked = Asked(SLACK_15B, overrides=overrides)
    out = tmp_path / "slack"
    await synthesize_env(docs, out, asked, SynthSettings(name="slack", max_rounds=1))
    # one request per failing tool, none for the whole file; an answer refused (the hostile one) or
    # unchanged (the old function) is asked again, sampled, of that tool alone
    assert "tools:1" not in asked.prompts
    # slack_post_message fails too: it returns db.execute's cursor (the capture had no answer for it)
    failing = [*FAILING, "slack_post_message"]
    greedy = sorted(k for k in asked.prompts if k.startswith("tool_") and "~" not in k)
    assert greedy == sorted(f"tool_{n}:1" for n in failing)
    resampled = {k.split("~")[0] for k in asked.prompts if "~" in k}
    assert resampled == {f"tool_{n}" for n in failing if n != "slack_get_user_profile"}
    prompt = asked.prompts["tool_slack_get_user_profile:1"]
    assert "async def slack_get_user_profile" in prompt and prompt.count("async def ") == 1
    assert "CREATE TABLE slack_user_profiles" in prompt and "CREATE TABLE slack_channels" not in prompt
    unknown = "an unknown user_id (such as 'UNKNOWN-ID-0000') must raise ToolError(\"user_id not found\")"
    assert unknown in prompt
    assert "instead of returning null" in prompt
    # the fixed tool passes its probe in round 1; the hostile answer was never spliced
    report = read_report(rejected_dir(out))
    probes = next(g for g in report.rounds[1].gates if g.name == "probes")
    assert probes.passed_checks == report.rounds[0].gates[2].passed_checks + 1
    assert not any(p.startswith("slack_get_user_profile") for p in probes.problems)
    final = (rejected_dir(out) / "rejected_candidate" / "tools.py.txt").read_text(encoding="utf-8")
    assert "os.system" not in final
    assert _body(final, "slack_add_reaction") == _body(TOOLS_PY, "slack_add_reaction")


async def test_the_captured_per_tool_repairs_fix_two_tools_and_keep_the_rest(tmp_path: Path) -> None:
    # the 1.5B's real per-tool answers on Slack: slack_get_user_profile raises on an unknown user
    # from round 1, slack_add_reaction stops naming `text` in round 2; the whole-file repair it was
    # asked before returned the same file, 52 of 57 checks in every round
    captured = ENVSYNTH_FIXTURES / "captured_slack_1.5b_tools"
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    out = tmp_path / "slack"
    report = await synthesize_env(docs, out, Asked(captured), SynthSettings(name="slack", max_rounds=2))
    probes = [next(g for g in r.gates if g.name == "probes") for r in report.rounds]
    # unverified, the run went (52, 57), (52, 56), (54, 57): round 1's slack_get_channel_history
    # looked its channel up in slack_messages and refused every call; that repair lowers the probes
    # and is no longer kept
    # the counts hold the checks that a write tool's result is a value and its rows have keys,
    # which the capture's write tools fail (returning db.execute's cursor, inserting no id)
    assert [(g.passed_checks, g.checks) for g in probes] == [(60, 67), (61, 67), (63, 72)]
    failing = {p.split(":")[0] for p in probes[-1].problems if not _result_or_key(p)}
    assert "slack_get_user_profile" not in failing and "slack_add_reaction" not in failing
    final = (rejected_dir(out) / "rejected_candidate" / "tools.py.txt").read_text(encoding="utf-8")
    kept = with_paging_prologue(TOOLS_PY, docs)
    for name in NAMES:
        if name not in FAILING:  # never asked, never changed (but `writes=` and paging, added in round 0)
            assert _body(final, name) == _body(kept, name)


def test_a_tool_is_shown_the_tables_its_tables_reference() -> None:
    # captured: shown only slack_messages, the 1.5B looked an unknown channel_id up there
    schema = strip_fences(load_recordings(SLACK_15B)["schema:0"])
    shown = tables_touched(schema, function_source(TOOLS_PY, "slack_get_thread_replies") or "")
    assert [t for t in NAMED_TABLES if f"CREATE TABLE {t} " in shown] == [
        "slack_channels",
        "slack_messages",
        "slack_thread_replies",
    ]
    profile = tables_touched(schema, function_source(TOOLS_PY, "slack_get_user_profile") or "")
    assert "CREATE TABLE slack_user_profiles" in profile and "slack_channels" not in profile


RESAMPLED = ENVSYNTH_FIXTURES / "captured_slack_1.5b_resample"


async def test_an_unchanged_answer_is_asked_again_sampled_and_the_sample_spliced(tmp_path: Path) -> None:
    # captured: the 1.5B's greedy repair of slack_reply_to_thread was the function unchanged, still
    # inserting channel_id into slack_thread_replies, which has no such column; its first sample
    # was the same function under an import tools.py already had, its second wrote only the
    # table's columns
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(RESAMPLED)
    out = tmp_path / "slack"
    report = await synthesize_env(docs, out, asked, SynthSettings(name="slack", max_rounds=1))
    probes = [next(g for g in r.gates if g.name == "probes") for r in report.rounds]
    assert [(g.passed_checks, g.checks) for g in probes] == [(60, 67), (65, 72)]
    (before,) = [p for p in probes[0].problems if p.startswith("slack_reply_to_thread")]
    (after,) = [p for p in probes[1].problems if not _result_or_key(p)]
    assert "has no column named channel_id" in before
    assert after.startswith("slack_reply_to_thread") and "FOREIGN KEY constraint failed" in after
    columns = "slack_thread_replies has exactly these columns: id, thread_ts, parent_message_id, text"
    assert columns in asked.prompts["tool_slack_reply_to_thread:1"]
    for sample in (1, 2):
        assert (
            "could not be used (the function unchanged)"
            in asked.prompts[f"tool_slack_reply_to_thread~{sample}:1"]
        )
    # the tools that were fixed greedily were asked once each
    assert not any(k.startswith("tool_slack_get_user_profile~") for k in asked.prompts)


def test_a_failed_foreign_key_names_the_reference_and_the_lookup_that_fills_it() -> None:
    answers = load_recordings(RESAMPLED)
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    schema = schema_as_kept(answers["schema:0"], docs)  # as the pipeline keeps it
    function = strip_fences(answers["tool_slack_reply_to_thread:3"])
    crash = "slack_reply_to_thread: ... [it crashed: ConfinedToolCrash: FOREIGN KEY constraint failed]"
    (fact,) = table_facts([crash], schema_tables(schema), function)
    assert fact.startswith(
        "slack_thread_replies.parent_message_id must hold the id of an existing slack_messages row"
    )
    assert table_facts([crash.replace("FOREIGN KEY", "CHECK")], schema_tables(schema), function) == []


def test_an_answer_reformatted_or_redecorated_is_thesame_function() -> None:
    old = function_source(TOOLS_PY, "slack_reply_to_thread") or ""
    tree = ast.parse(old)
    fn = tree.body[0]
    assert isinstance(fn, ast.AsyncFunctionDef)
    fn.decorator_list = [ast.parse('tool(writes=["slack_thread_replies"])', mode="eval").body]
    same = ast.unparse(tree) + "\n"
    assert same != old and same_function(same, old, "slack_reply_to_thread")
    changed = old.replace("channel_id, ", "", 1)
    assert changed != old and not same_function(changed, old, "slack_reply_to_thread")


def test_the_lookup_that_fills_a_reference_is_written_from_the_seed_rows() -> None:
    # the captured seed's shape: a reply's thread_ts is its message's timestamp, its text is not
    # a message's; the 1.5B, told the reference in words, wrote thread_ts into parent_message_id
    answers = load_recordings(RESAMPLED)
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    tables = schema_tables(schema_as_kept(answers["schema:0"], docs))
    function = strip_fences(answers["tool_slack_reply_to_thread:3"])
    days = [f"2025-01-0{i} 09:00:00" for i in range(1, 4)]
    seed = {
        "slack_messages": [
            {"id": f"m{i}", "channel_id": "c1", "text": f"Message {i}", "timestamp": d}
            for i, d in enumerate(days)
        ],
        "slack_thread_replies": [
            {"id": f"r{i}", "thread_ts": d, "parent_message_id": f"m{i}", "text": f"Reply {i}"}
            for i, d in enumerate(days)
        ],
    }
    crash = "slack_reply_to_thread: ... [it crashed: ConfinedToolCrash: FOREIGN KEY constraint failed]"
    facts = table_facts([crash], tables, function, seed)
    lookup = (
        'slack_message_row = await db.require_one("SELECT id FROM slack_messages WHERE timestamp = ?",'
        " (thread_ts,)"
    )
    assert [f for f in facts if "require_one" in f] == [
        f'The thread_ts a call gives is a slack_messages.timestamp: write it as `{lookup}, "slack_message not'
        ' found")` and then parent_message_id = slack_message_row["id"].'
    ]
    # a channel shared by every message tells none apart: no lookup by it
    assert not any("WHERE channel_id" in f for f in facts)
    # with no seed rows, only the reference in words
    assert [f for f in table_facts([crash], tables, function) if "require_one" in f] == []


def test_an_import_tools_py_already_binds_is_redundant_and_a_new_one_still_refused() -> None:
    # captured: the 1.5B's sample put `from typing import Any` over its function; tools.py binds
    # Any through `from typing import Any, Dict, List, Literal`
    answers = load_recordings(RESAMPLED)
    tools_py = strip_fences(answers["tools:0"])
    sampled = strip_fences(answers["tool_slack_reply_to_thread~1:1"])
    assert sampled.startswith("from typing import Any\n")
    spliced, refused = splice_tool(tools_py, "slack_reply_to_thread", sampled)
    assert refused is None and spliced.count("from typing import") == 1
    function = sampled.split("\n", 1)[1]
    # an import that rebinds a name tools.py has is refused: it would change the other tools
    kept, refused = splice_tool(
        tools_py, "slack_reply_to_thread", "from os import system as Any\n" + function
    )
    assert kept == tools_py and refused is not None and "module-level code" in refused
    # one the function uses that tools.py lacks joins tools.py's imports, where the static gate
    # judges it as every import (captured on Museum: `import datetime`; here sqlite3, forbidden)
    used = function.replace("    sql = ", "    sqlite3.connect(':memory:')\n    sql = ", 1)
    spliced, refused = splice_tool(tools_py, "slack_reply_to_thread", "import sqlite3\n" + used)
    assert refused is None and "from envforge.server import Db, ToolError, tool\nimport sqlite3\n" in spliced
    assert [(v.rule, v.detail) for v in check_python(spliced)] == [("forbidden import", "sqlite3")]


def test_an_import_the_function_never_uses_is_dropped() -> None:
    # captured (Slack, six rounds): the 1.5B's first sample of slack_post_message was right but
    # for `import sqlite3` above it, unused, and was refused in every round
    answers = load_recordings(ENVSYNTH_FIXTURES / "captured_slack_1.5b_unused_import")
    tools_py = strip_fences(answers["tools:0"])
    sampled = strip_fences(answers["tool_slack_post_message~1:4"])
    assert sampled.startswith("import sqlite3\n")
    spliced, refused = splice_tool(tools_py, "slack_post_message", sampled)
    assert refused is None, refused
    assert "import sqlite3" not in spliced and 'new_id = f"slack_message_{count' in spliced
    # captured too (Slack, resumed past the probes): `from typing import Any, Tuple` over a
    # function using `Any` alone, which tools.py binds; `Tuple` goes unbound
    for unused in (
        "import os.path\n",
        "from typing import Any as Anything\n",
        "from typing import Any, Tuple\n",
    ):
        spliced, refused = splice_tool(tools_py, "slack_post_message", unused + sampled.split("\n", 1)[1])
        assert refused is None and unused not in spliced and "Tuple" not in spliced, unused


async def test_a_tools_earlier_lessons_are_repeated_in_its_later_repairs(tmp_path: Path) -> None:
    # captured: given the lookup that fills parent_message_id, the 1.5B wrote it (58 of 59 checks);
    # told next only of the unknown channel it let through, it dropped the lookup
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(ENVSYNTH_FIXTURES / "captured_slack_1.5b_lookup")
    report = await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=3))
    probes = [next(g for g in r.gates if g.name == "probes") for r in report.rounds]
    assert [(g.passed_checks, g.checks) for g in probes][:3] == [(60, 67), (65, 72), (66, 75)]
    lookup = (
        'slack_message_row = await db.require_one("SELECT id FROM slack_messages WHERE timestamp = ?",'
        " (thread_ts,)"
    )
    assert lookup in asked.prompts["tool_slack_reply_to_thread:2"]
    last = asked.prompts["tool_slack_reply_to_thread:3"]
    assert "unknown channel_id" in last and "FOREIGN KEY constraint failed" not in last
    assert "Earlier rounds' lessons, still true (keep them):" in last and lookup in last
    # two code lessons: the steps are said in the order one function holds them
    assert "in this order: check each id the call names, look up the rows" in last
    assert "in this order" not in asked.prompts["tool_slack_reply_to_thread:1"]


def test_static_problems_inside_one_tool_are_that_tools_and_module_code_is_the_files() -> None:
    profile = function_source(TOOLS_PY, "slack_get_user_profile") or ""
    body = profile.rstrip("\n").split("\n")
    marked = profile.replace(body[-1], "    id = user_id\n" + body[-1])
    tools_py = TOOLS_PY.replace(profile, marked)
    problems = [f"tools.py {v}" for v in check_python(tools_py)]
    assert problems and all("forbidden name: id" in p for p in problems)
    grouped = static_problems_by_tool(problems, tools_py, NAMES)
    assert grouped is not None and list(grouped) == ["slack_get_user_profile"]
    assert grouped["slack_get_user_profile"][0].startswith(
        "slack_get_user_profile: `id = user_id`: forbidden name"
    )
    # a problem outside every tool (module code), or a file that does not parse: the whole file
    module_level = [f"tools.py {v}" for v in check_python(tools_py + "\nid = 3\n")]
    assert static_problems_by_tool(module_level, tools_py + "\nid = 3\n", NAMES) is None
    assert static_problems_by_tool(problems, tools_py + "\ndef (", NAMES) is None


def test_an_unknown_id_let_through_gets_the_lookup_of_the_table_it_names() -> None:
    # captured: the 1.5B's slack_reply_to_thread passed every check but this one, round after round
    answers = load_recordings(RESAMPLED)
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    tables = schema_tables(schema_as_kept(answers["schema:0"], docs))
    problem = "slack_reply_to_thread: unknown id channel_id='UNKNOWN-ID-0000' was not refused (got: [])"
    assert table_facts([problem], tables, "") == [
        'Check the channel_id first, before any other read or write: `await db.require_one("SELECT id FROM'
        ' slack_channels WHERE id = ?", (channel_id,), "channel_id not found")`.'
    ]
    profile = problem.replace("channel_id", "user_id")  # a primary key's own table
    assert (
        "SELECT user_id FROM slack_user_profiles WHERE user_id = ?" in table_facts([profile], tables, "")[0]
    )
    unknown = problem.replace("channel_id", "workspace_id")  # no table's column: nothing invented
    assert table_facts([unknown], tables, "") == []


async def test_a_static_problem_in_one_tool_is_repaired_as_that_tool(tmp_path: Path) -> None:
    # captured on Petstore: round 0's one static problem was a variable named id in one tool; the
    # whole-file repair it used to get rewrote tools.py. Its seed then calls strftime, which the
    # seed sandbox refused (datetime imports time) and now runs.
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    asked = Asked(ENVSYNTH_FIXTURES / "captured_petstore_1.5b_static_tool")
    report = await synthesize_env(docs, tmp_path / "pet", asked, SynthSettings(name="pet", max_rounds=1))
    first = report.rounds[0].gates[0]
    assert first.name == "static" and not first.passed
    assert [p.split(": ", 1)[1] for p in first.problems] == ["forbidden name: id"]
    assert "tools:1" not in asked.prompts
    prompt = asked.prompts["tool_createUsersWithListInput:1"]
    assert "createUsersWithListInput: `" in prompt and "rename the variable" in prompt
    gates = {g.name: g for g in report.rounds[1].gates}
    assert gates["static"].passed and gates["load"].passed, gates["load"].problems


async def test_a_tool_that_refuses_every_seed_call_is_told_which_way_require_one_cuts(tmp_path: Path) -> None:
    # captured on Petstore: `if not db.require_one(... username ..., "user already exists")`
    # refused every call, the check inverted (require_one raises when no row matches)
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    asked = Asked(ENVSYNTH_FIXTURES / "captured_petstore_1.5b_static_tool")
    report = await synthesize_env(docs, tmp_path / "pet", asked, SynthSettings(name="pet", max_rounds=2))
    probes = next(g for g in report.rounds[1].gates if g.name == "probes")
    assert (
        "createUser: no valid call from seed data succeeded (last: Error: user already exists)"
        in probes.problems
    )
    prompt = asked.prompts["tool_createUser:2"]
    assert "every one was refused (user already exists)" in prompt
    assert "`db.require_one` raises when NO row matches" in prompt


async def test_a_repair_that_lowers_the_probes_is_not_kept(tmp_path: Path) -> None:
    # captured over five rounds: at 58 of 59 checks, the 1.5B's round-4 repair of
    # slack_reply_to_thread traded its message lookup for the channel's and fell to 57 of 58
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    said: list[str] = []
    asked = Asked(ENVSYNTH_FIXTURES / "captured_slack_1.5b_five_rounds")
    report = await synthesize_env(
        docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=4), progress=said.append
    )
    probes = [next(g for g in r.gates if g.name == "probes") for r in report.rounds]
    scores = [(g.passed_checks, g.checks) for g in probes]
    assert scores[3] == (66, 75)  # 58 of 59 before the result, key and row-naming checks
    assert scores[4][0] >= 66, scores  # the worse function was spliced
    assert any("with it the probes pass 65 checks, 66 before" in line for line in said), said


POST_AS_TOLD = '''```python
@tool(writes=["slack_messages"])
async def slack_post_message(db: Db, channel_id: str, text: str) -> Any:
    """Post a new message to a Slack channel"""
    await db.require_one("SELECT id FROM slack_channels WHERE id = ?", (channel_id,), "channel_id not found")
    count = await db.fetch_one("SELECT COUNT(*) AS n FROM slack_messages")
    new_id = f"slack_message_{count['n'] + 1}"
    sql = "INSERT INTO slack_messages (id, channel_id, text) VALUES (?, ?, ?)"
    await db.execute(sql, (new_id, channel_id, text))
    return await db.fetch_one("SELECT * FROM slack_messages WHERE id = ?", (new_id,))
```'''


async def test_a_cursor_for_a_result_and_a_row_with_no_key_are_probe_failures(tmp_path: Path) -> None:
    # captured: the 1.5B's write tools end `return await db.execute(...)` (every result read
    # "<...LocalCursor object at 0x7f...>", an address that differs each run) and insert messages
    # without their TEXT id, which SQLite stores as NULL: rows no call can name
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(
        ENVSYNTH_FIXTURES / "captured_slack_1.5b_lookup",
        overrides={"tool_slack_post_message:1": POST_AS_TOLD},
    )
    out = tmp_path / "slack"
    report = await synthesize_env(docs, out, asked, SynthSettings(name="slack", max_rounds=1))
    problems = next(g for g in report.rounds[0].gates if g.name == "probes").problems
    assert any(p.startswith("slack_post_message: its result is a Python object") for p in problems), problems
    assert "slack_post_message: inserted a row into slack_messages with no id (NULL)" in problems
    # the repair is told the line that makes a key as the seed's keys are made, and the return
    prompt = asked.prompts["tool_slack_post_message:1"]
    assert "new_id = f\"slack_message_{count['n'] + 1}\"" in prompt
    assert "return a dict (the row written" in prompt
    # the function written as told passes both checks in round 1
    after = next(g for g in report.rounds[1].gates if g.name == "probes").problems
    assert not any(p.startswith("slack_post_message") for p in after), after


def test_a_row_inserted_without_its_key_is_told_the_insert_that_gives_it() -> None:
    # captured (Slack, round 1): told the line that makes a key, the 1.5B kept its INSERT without
    # the id and added `UPDATE ... WHERE id = ?` with `result['id']`, a cursor it cannot index
    tools_py = strip_fences(load_recordings(ENVSYNTH_FIXTURES / "captured_slack_1.5b_lookup")["tools:0"])
    function = function_source(tools_py, "slack_post_message")
    assert function is not None
    seed = {"slack_messages": [{"id": f"slack_message_{i}"} for i in range(1, 21)]}
    problem = "slack_post_message: inserted a row into slack_messages with no id (NULL)"
    facts = table_facts([problem], [], function, seed)
    assert any("new_id = f\"slack_message_{count['n'] + 1}\"" in f for f in facts), facts
    insert = (
        'await db.execute("INSERT INTO slack_messages (id, channel_id, text) VALUES (?, ?, ?)",'
        " (new_id, channel_id, text))"
    )
    assert any(insert in f for f in facts), facts
    # keys the seed makes no one way (or a key the INSERT already names) get no line to copy
    assert table_facts([problem], [], function, {"slack_messages": [{"id": "a"}, {"id": "b7"}]}) == []


async def test_replayed_the_sample_with_the_unused_import_is_kept(tmp_path: Path) -> None:
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(ENVSYNTH_FIXTURES / "captured_slack_1.5b_unused_import")
    report = await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=1))
    probes = [next(g for g in r.gates if g.name == "probes") for r in report.rounds]
    assert [(g.passed_checks, g.checks) for g in probes] == [(60, 67), (67, 72)]  # live: (62, 67)
    assert not any(p.startswith("slack_post_message") for p in probes[1].problems), probes[1].problems


AWAITED_SUBSCRIPT = ENVSYNTH_FIXTURES / "captured_slack_1.5b_awaited_subscript"


def test_an_await_over_a_subscript_moves_onto_the_call() -> None:
    # captured: from round 3 on, every greedy answer for slack_reply_to_thread made its key with
    # `f"...{await db.fetch_one('SELECT COUNT(*) ...')['n'] + 1}"`, which subscripts the coroutine
    # (a crash on every call); once `await` was added in front of the call it no longer parsed
    answer = strip_fences(load_recordings(AWAITED_SUBSCRIPT)["tool_slack_reply_to_thread:5"])
    assert "{await db.fetch_one('SELECT COUNT(*) AS n FROM slack_thread_replies')['n'] + 1}" in answer
    fixed = with_awaited_db_calls(answer)
    assert "{(await db.fetch_one('SELECT COUNT(*) AS n FROM slack_thread_replies'))['n'] + 1}" in fixed
    assert ast.parse(fixed) and with_awaited_db_calls(fixed) == fixed
    # unawaited, a subscript, attribute or method of the result gets the parentheses too
    unawaited = (
        "async def f(db: Db) -> Any:\n    a = db.fetch_one('q')['n']\n    return db.fetch_one('q').get('n')\n"
    )
    assert with_awaited_db_calls(unawaited) == (
        "async def f(db: Db) -> Any:\n    a = (await db.fetch_one('q'))['n']\n"
        "    return (await db.fetch_one('q')).get('n')\n"
    )


def test_a_function_answered_without_its_decorator_keeps_the_old_one() -> None:
    # captured: a sample held all four of slack_reply_to_thread's lessons but no `@tool` line
    recorded = load_recordings(AWAITED_SUBSCRIPT)
    answer = strip_fences(recorded["tool_slack_reply_to_thread~1:5"])
    assert not answer.lstrip().startswith("@")
    tools_py = strip_fences(recorded["tools:0"])
    spliced, refused = splice_tool(tools_py, "slack_reply_to_thread", answer)
    assert refused is None
    old = function_source(tools_py, "slack_reply_to_thread") or ""
    new = function_source(spliced, "slack_reply_to_thread") or ""
    decorator = old.split("async def")[0]
    assert decorator.startswith("@tool") and new == decorator + answer.strip() + "\n"
    assert check_python(spliced) == []


async def test_the_slack_run_stuck_on_an_awaited_subscript_passes_every_probe(tmp_path: Path) -> None:
    # replayed: the run held 67 of 70 checks from round 3 to round 8, each greedy repair of
    # slack_reply_to_thread refused (`await await ...` failed the static gate) and each sample
    # refused for its missing decorator or a crash; now round 3's repair is kept
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    report = await synthesize_env(
        docs, tmp_path / "slack", Asked(AWAITED_SUBSCRIPT), SynthSettings(name="slack", max_rounds=4)
    )
    probes = [next(g for g in r.gates if g.name == "probes") for r in report.rounds]
    assert [(g.passed_checks, g.checks) for g in probes[3:5]] == [(70, 75), (73, 75)]
    # past every deterministic probe but the two its slack_add_reaction fails, which the capture
    # predates: that reaction inserts a new message holding the timestamp it was given
    left = probes[4].problems
    assert len(left) == 2 and all(p.startswith("slack_add_reaction: ") for p in left), left


def test_another_drivers_placeholders_are_written_as_sqlites() -> None:
    # captured: from round 5 to 8 every answer for slack_reply_to_thread wrote MySQL's
    # `VALUES (%(thread_ts)s, ...)`, which SQLite refuses at `%` on every call, and the
    # function came back unchanged each round with that crash in its evidence
    recorded = load_recordings(ENVSYNTH_FIXTURES / "captured_slack_1.5b_pyformat")
    answer = strip_fences(recorded["tool_slack_reply_to_thread:6"])
    fixed = with_sqlite_placeholders(answer)
    assert "VALUES (:thread_ts, :parent_message_id, :text)" in fixed
    assert fixed.replace("(:thread_ts, :parent_message_id, :text)", "") == answer.replace(
        "(%(thread_ts)s, %(parent_message_id)s, %(text)s)", ""
    )  # nothing else changed, the docstring's quoting included

    def insert(sql: str) -> None:
        db = sqlite3.connect(":memory:")
        db.executescript(schema_as_kept(recorded["schema:0"], []))
        db.execute(sql, {"thread_ts": "1.0", "parent_message_id": "m", "text": "hi"})

    before = re.search(r'sql = "(.*)"', answer)
    after = re.search(r'sql = "(.*)"', fixed)
    assert before and after
    with pytest.raises(sqlite3.OperationalError, match='near "%"'):
        insert(before[1])
    insert(after[1])  # SQLite binds the dict the tool already passes
    # `%s` binds as `?`, but not inside the SQL's own quoted text; f-strings are left as written
    source = (
        "async def f(db: Db, name: str) -> Any:\n"
        "    await db.execute(\"SELECT * FROM t WHERE a LIKE '%s%' AND b = %s\", (name,))\n"
        '    return f"SELECT %s {name}"\n'
    )
    assert with_sqlite_placeholders(source) == source.replace("b = %s", "b = ?")


def test_an_import_the_repair_needs_joins_tools_py_and_the_gate_judges_it() -> None:
    # captured on Museum: `listSpecialEvents` defaulted its date with `datetime.now()`, never
    # imported (a crash on every call); each sampled repair put `import datetime` above the
    # function and was refused as module-level code, three rounds running
    answers = load_recordings(ENVSYNTH_FIXTURES / "captured_museum_1.5b")
    tools_py = strip_fences(answers["tools:0"])
    sampled = strip_fences(answers["tool_listSpecialEvents~1:1"])
    assert sampled.startswith("import datetime\n") and "import datetime" not in tools_py
    spliced, refused = splice_tool(tools_py, "listSpecialEvents", sampled)
    assert refused is None and spliced.count("import datetime\n") == 1
    assert spliced.index("import datetime") < spliced.index("@tool")
    # the module now says what was wrong all along: the wall clock is no tool's to read
    assert ("forbidden module attribute", "datetime.now") in [
        (v.rule, v.detail) for v in check_python(spliced)
    ]


async def test_an_import_joined_to_tools_py_still_meets_the_static_gate_first(tmp_path: Path) -> None:
    # the attack on the import that joins tools.py: a repair that imports os and uses it
    marker = tmp_path / "ran"
    answers = load_recordings(AWAITED_SUBSCRIPT)
    function = strip_fences(answers["tool_slack_reply_to_thread:1"])
    hostile = function.replace('"""\n', f'"""\n    os.system("touch {marker}")\n', 1)
    assert hostile != function
    said: list[str] = []
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(AWAITED_SUBSCRIPT, overrides={"tool_slack_reply_to_thread:1": "import os\n\n" + hostile})
    await synthesize_env(
        docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=1), progress=said.append
    )
    refused = [line for line in said if "round 0: slack_reply_to_thread's answer refused" in line]
    assert refused and "it no longer passes the static gate" in refused[0], said
    assert not marker.exists()
