"""A documented paging argument is an integer before a tool's code reads it (`paging.py`).

Found on the corpus's Slack set with Qwen2.5-Coder-1.5B: past every probe check, its own tester
called `slack_list_channels(limit=10, cursor="")`, and each of nine repair rounds' answers bound
the cursor as it came (`OFFSET ''`: SQLite's "datatype mismatch"), though told to convert it. The
attack here is every value a caller may send a paging argument, against every answer the model
gave for that tool, served from a real confined env over real SQLite.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from envforge.server import ScratchPool, check_python, execute, load_env
from envforge.synth.envsynth import (
    SynthSettings,
    ToolDoc,
    function_source,
    load_doc_set,
    load_recordings,
    paging_prologue,
    schema_as_kept,
    splice_tool,
    strip_fences,
    synthesize_env,
    tools_skeleton,
    with_paging_prologue,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
LIST_CHANNELS = ENVSYNTH_FIXTURES / "captured_slack_1.5b_list_channels"
RECORDED = load_recordings(LIST_CHANNELS)
SLACK = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")

ATTACKS: list[dict[str, Any]] = [
    {},
    {"cursor": ""},
    {"limit": 10, "cursor": ""},
    {"cursor": "abc"},
    {"cursor": "-1"},
    {"cursor": "9" * 40},
    {"cursor": "²"},  # a digit to str.isdigit, none to int()
    {"cursor": "1.5"},
    {"limit": 0},
    {"limit": -5},
    {"limit": 1e12},
    {"limit": float("inf")},  # the server passes what JSON's parsers let through: int(inf) raises
    {"limit": float("-inf")},
    {"limit": float("nan")},
    {"limit": 2.5, "cursor": "1"},
]
"""Each value a caller may send `slack_list_channels` (the server has checked only the types)."""


def _slack_env(root: Path, tools_py: str) -> Path:
    """A confined env with the run's own schema, three channels and `tools_py`."""
    root.mkdir(parents=True)
    schema = schema_as_kept(RECORDED["schema:0"], SLACK)
    channels = [
        {"id": f"C{i}", "name": f"channel-{i}", "description": "d", "created_at": "2025-01-07T09:00:00"}
        for i in range(1, 4)
    ]
    (root / "env.toml").write_text(
        'name = "slack"\ndescription = "d"\nversion = "0.1.0"\nseed = "seed.json"\ntrust = "confined"\n'
    )
    (root / "schema.sql").write_text(schema)
    (root / "seed.json").write_text(json.dumps({"slack_channels": channels}))
    (root / "policy.md").write_text("# Policy\n\nBe helpful.\n")
    (root / "tools.py").write_text(tools_py)
    return root


def _answers() -> dict[str, str]:
    """Every answer the model gave for slack_list_channels that builds its query (the others crash
    on `sql` never set, a failure of their own), spliced into the run's first tools.py."""
    first = strip_fences(RECORDED["tools:0"])
    spliced = {
        key: splice_tool(first, "slack_list_channels", strip_fences(text))
        for key, text in RECORDED.items()
        if key.startswith("tool_slack_list_channels")
    }
    kept = {key: text for key, (text, refused) in spliced.items() if refused is None}
    kept["tools:0"] = first
    return {
        key: text
        for key, text in kept.items()
        if 'sql = "SELECT' in (function_source(text, "slack_list_channels") or "")
    }


async def test_every_captured_answer_that_pages_answers_every_paging_value(tmp_path: Path) -> None:
    # the prologue puts every call on the path a valid page takes (both arguments given, integers):
    # an answer that serves `limit=2, cursor="1"` as written serves every other value once kept
    paging, crashed_as_written = 0, 0
    for n, (key, tools_py) in enumerate(sorted(_answers().items())):
        written = load_env(_slack_env(tmp_path / f"{n}-written", tools_py))
        pool = ScratchPool(written, size=1)
        valid = await execute(pool.open(written.seed_db), "slack_list_channels", {"limit": 2, "cursor": "1"})
        if valid.is_error:
            continue  # wrong for a valid page too: no paging argument's fault
        paging += 1
        for arguments in ATTACKS:
            result = await execute(pool.open(written.seed_db), "slack_list_channels", arguments)
            crashed_as_written += result.kind == "env_error"
        kept = with_paging_prologue(tools_py, SLACK)
        assert check_python(kept) == []
        env = load_env(_slack_env(tmp_path / f"{n}-kept", kept))
        pool = ScratchPool(env, size=1)
        for arguments in ATTACKS:
            result = await execute(pool.open(env.seed_db), "slack_list_channels", arguments)
            assert result.kind != "env_error", (key, arguments, result.text)
            if not result.is_error:  # (a sample that retyped `limit` as int refuses 2.5)
                rows = json.loads(result.text)
                assert isinstance(rows, list) and len(rows) <= 3, (key, arguments)
    assert paging >= 6
    # the attack is real: as the model wrote them, those answers crash on these values
    assert crashed_as_written >= paging * 6


async def test_the_integers_page_through_the_table(tmp_path: Path) -> None:
    # the skeleton's comment says how they bind; a function that binds them so pages as documented
    first = strip_fences(RECORDED["tools:0"])
    bound = (
        "@tool\nasync def slack_list_channels(db: Db, limit: float | None = None, cursor: str | None = None)"
        ' -> Any:\n    """List channels."""\n'
        '    return await db.fetch_all("SELECT id FROM slack_channels ORDER BY id LIMIT ? OFFSET ?",'
        " (limit, cursor))\n"
    )
    spliced, refused = splice_tool(first, "slack_list_channels", bound)
    assert refused is None
    env = load_env(_slack_env(tmp_path / "env", with_paging_prologue(spliced, SLACK)))
    pool = ScratchPool(env, size=1)

    async def ids(arguments: dict[str, Any]) -> list[str]:
        result = await execute(pool.open(env.seed_db), "slack_list_channels", arguments)
        assert not result.is_error, result.text
        return [row["id"] for row in json.loads(result.text)]

    assert await ids({}) == ["C1", "C2", "C3"]
    assert await ids({"limit": 2}) == ["C1", "C2"]
    assert await ids({"limit": 2, "cursor": "2"}) == ["C3"]
    assert await ids({"limit": 2, "cursor": ""}) == ["C1", "C2"]  # an empty cursor: the first page
    assert await ids({"limit": 0, "cursor": "1"}) == ["C2"]  # a count is at least one row
    assert await ids({"limit": 500}) == ["C1", "C2", "C3"]  # and at most the documented 200


async def test_the_captured_run_passes_its_own_tester_once_the_cursor_is_an_integer(tmp_path: Path) -> None:
    # the captured run from round 4 on: all 70 probe checks, then its tester's `cursor: ""` crashed
    # slack_list_channels, and its checker judged that crash a failure; a crash fails the gate
    # whatever a checker says, so with that verdict recorded as the call's success the run stands
    # or falls on the call itself
    crash = (
        '"ok": false, "reason": "Error: internal error of the environment in tool \'slack_list_channels\''
        ' (ConfinedToolCrash; a bug in the env, not a refusal)"'
    )
    assert crash in RECORDED["checker:4"]
    judged = {"checker:4": RECORDED["checker:4"].replace(crash, '"ok": true, "reason": "the channels"')}
    # the capture's slack_add_reaction inserts a new message holding the timestamp it was given,
    # which the probes now refuse; its round-2 repair is answered with the same model's later one
    # (the bundled env's), which updates the message named
    reaction = function_source((REPO / "envs" / "slack" / "tools.py").read_text(), "slack_add_reaction")
    judged["tool_slack_add_reaction:2"] = f"```python\n{reaction}```"
    out = tmp_path / "slack"
    report = await synthesize_env(
        SLACK, out, Asked(LIST_CHANNELS, overrides=judged), SynthSettings(name="slack", max_rounds=5)
    )
    assert report.status == "accepted", [(g.name, g.problems[:1]) for g in report.rounds[-1].gates]
    last = {g.name: (g.passed_checks, g.checks) for g in report.rounds[-1].gates}
    assert last["probes"] == (75, 75) and last["llm_probe"] == (8, 8)
    tools_py = (out / "tools.py").read_text(encoding="utf-8")
    for doc in SLACK:
        body = function_source(tools_py, doc.name) or ""
        assert all(line in body for line in paging_prologue(doc)), doc.name
    env = load_env(out)
    result = await execute(ScratchPool(env, size=1).open(env.seed_db), "slack_list_channels", ATTACKS[2])
    assert not result.is_error, result.text


def _doc(**properties: dict[str, Any]) -> ToolDoc:
    return ToolDoc(name="list_things", parameters={"type": "object", "properties": properties})


def test_a_count_takes_its_documented_default_and_largest_value() -> None:
    said = _doc(limit={"type": "number", "description": "Maximum number to return (default 100, max 200)"})
    assert paging_prologue(said) == [
        "limit = 100 if limit is None or limit != limit else int(min(max(limit, 1), 200))"
    ]
    openai = _doc(
        limit={"type": "integer", "description": "Limit can range between 1 and 100, and the default is 20."}
    )
    assert paging_prologue(openai) == [
        "limit = 20 if limit is None or limit != limit else int(min(max(limit, 1), 100))"
    ]
    keyed = _doc(per_page={"type": "integer", "default": 30, "maximum": 50})
    assert paging_prologue(keyed) == [
        "per_page = 30 if per_page is None or per_page != per_page else int(min(max(per_page, 1), 50))"
    ]
    silent = _doc(maxResults={"type": "integer"})
    assert paging_prologue(silent) == [
        "maxResults = 100 if maxResults is None or maxResults != maxResults"
        " else int(min(max(maxResults, 1), 1000))"
    ]


def test_only_arguments_that_page_by_a_number_are_touched() -> None:
    # opaque tokens (OpenAI's `after`, a page token) are an id to look up, not an offset; a `limit`
    # that is an object or a list is no count; a page is counted from 1
    doc = _doc(
        after={"type": "string", "description": "A cursor for use in pagination: an object ID."},
        page_token={"type": "string"},
        limit={"type": "object"},
        offset={"type": "array", "items": {"type": "integer"}},
        page={"type": "integer"},
    )
    assert paging_prologue(doc) == [
        "page = 1 if page is None or page != page else int(min(max(page, 1), 1000000))"
    ]


def test_the_prologue_is_put_back_first_and_never_twice() -> None:
    skeleton = tools_skeleton(SLACK)
    function = function_source(skeleton, "slack_list_channels") or ""
    prologue = paging_prologue(next(d for d in SLACK if d.name == "slack_list_channels"))
    assert all(f"    {line}\n" in function for line in prologue)
    assert with_paging_prologue(skeleton, SLACK) == skeleton  # kept where it is: no second copy
    # an answer that moved the lines below its own, or dropped them, gets them first again
    moved = skeleton.replace(f"    {prologue[1]}\n", "").replace(
        "    raise NotImplementedError\n", f"    {prologue[1]}\n    raise NotImplementedError\n", 1
    )
    fixed = with_paging_prologue(moved, SLACK)
    body = ast.parse(function_source(fixed, "slack_list_channels") or "").body[0]
    assert isinstance(body, ast.AsyncFunctionDef)
    assert [ast.unparse(s) for s in body.body[1:3]] == prologue
    assert with_paging_prologue(fixed, SLACK) == fixed
    assert with_paging_prologue("def broken(:\n", SLACK) == "def broken(:\n"


@pytest.mark.parametrize("value", ["", None, "abc", "7", "٣", "9" * 40, "-3"])
def test_a_string_cursor_becomes_a_row_offset(value: str | None) -> None:
    (line,) = paging_prologue(_doc(cursor={"type": "string"}))
    scope: dict[str, Any] = {"cursor": value}
    exec(line, {}, scope)  # the line alone, as the tool runs it first
    expected = {"7": 7, "٣": 3}.get(value or "", 0)
    assert scope["cursor"] == expected
