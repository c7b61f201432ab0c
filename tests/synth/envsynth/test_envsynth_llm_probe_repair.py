"""The model's own probe (a tester proposes calls, a checker judges them) is repaired tool by tool,
and a crash is a failure whatever the checker says.

Found on the corpus's Slack set with Qwen2.5-Coder-1.5B: past the deterministic probes, its tester
called `slack_list_channels(cursor="")`, which crashed on SQL pasted together from the call's
values (`sql += f" OFFSET {cursor}"`: "incomplete input"). That gate used to send the whole
tools.py back to the model, which the 1.5B answers with the file unchanged. Here the same kind of
function (a value pasted into SQL) is put into the recorded car_rental run, whose checker judged
every call fine: the crash still fails the gate, the repair asks for that one function, and an
answer that crashes the same call again is not kept.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from envforge.synth.envsynth import (
    SynthSettings,
    function_source,
    load_doc_set,
    load_recordings,
    repair_hints,
    strip_fences,
    synthesize_env,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

CAR_RENTAL = ENVSYNTH_FIXTURES / "car_rental"
TOOLS_PY = (CAR_RENTAL / "tools.0.py.txt").read_text(encoding="utf-8")
BOUND = """    if category is not None:
        sql += " AND category = ?"
        params = (location_id, category)"""
PASTED = '''    if category is not None:
        sql += f" AND category = {category}"'''
STILL_PASTED = """    if category is not None:
        sql += " AND category = " + category"""


def _answer(body: str) -> str:
    function = function_source(TOOLS_PY, "list_available_cars")
    assert function is not None and BOUND in function
    return f"```python\n{function.replace(BOUND, body)}```"


async def test_a_crash_the_tester_finds_is_repaired_as_its_tool_and_must_end(tmp_path: Path) -> None:
    docs = load_doc_set(REPO / "envs", REPO / "envs" / "car_rental" / "docs")
    crashing = strip_fences(_answer(PASTED))
    asked = Asked(
        CAR_RENTAL,
        overrides={
            "tools:0": TOOLS_PY.replace(function_source(TOOLS_PY, "list_available_cars") or "", crashing),
            "tool_list_available_cars:1": _answer(PASTED),  # the function unchanged
            "tool_list_available_cars~1:1": _answer(STILL_PASTED),  # crashes the same call again
            "tool_list_available_cars~2:1": _answer(BOUND),
        },
    )
    said: list[str] = []
    report = await synthesize_env(
        docs,
        tmp_path / "car_rental",
        asked,
        SynthSettings(name="car_rental", max_rounds=1),
        progress=said.append,
    )
    first = {g.name: g for g in report.rounds[0].gates}
    assert first["probes"].passed  # only optional `category` crashes, which the probes leave out
    (problem,) = first["llm_probe"].problems
    # the checker said "only available compact cars at LOC-2": the crash fails the call anyway
    assert problem.startswith("list_available_cars: call 1 (")
    assert "[it crashed:" in problem and "no such column: compact" in problem
    assert "checker: only available compact cars" in problem
    # one function asked for, not the file; told to bind the call's values
    assert "tools:1" not in asked.prompts
    prompt = asked.prompts["tool_list_available_cars:1"]
    assert "bind every value with ?" in prompt and "params.append(limit)" in prompt
    refused = [line for line in said if "list_available_cars's answer refused" in line]
    assert "the function unchanged" in refused[0]
    assert 'list_available_cars({"location_id": "LOC-2", "category": "compact"}) still crashes' in refused[1]
    assert report.status == "accepted", report.reasons
    assert [g.name for g in report.rounds[1].gates][-1] == "policy_kept"


def test_values_bound_out_of_step_with_their_clauses_hear_how_to_keep_them_together() -> None:
    # captured (Slack, eight rounds): told to bind the values, the 1.5B's repair of
    # slack_list_channels added `LIMIT ?` and `OFFSET ?` each only when its argument was given,
    # and passed `(limit, cursor)` always; SQLite's own words for that crash name the fix
    conn = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.ProgrammingError) as crash:
        conn.execute("SELECT 1 LIMIT ?", (10, None))
    problem = f"slack_list_channels: no valid call succeeded [it crashed: ConfinedToolCrash: {crash.value}]"
    assert any("params.append(limit)" in hint for hint in repair_hints([problem]))


def test_a_cursor_that_is_no_integer_hears_to_convert_it() -> None:
    # captured (Slack, resumed past the probes): the tester's `slack_list_channels(limit=10,
    # cursor="")` crashed in every repair; bound always, `OFFSET ?` given "" (or None) is
    # SQLite's "datatype mismatch", a cursor is no offset until converted
    conn = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.IntegrityError) as crash:
        conn.execute("SELECT 1 LIMIT ? OFFSET ?", (10, ""))
    problem = f"slack_list_channels: call 0 (...) [it crashed: ConfinedToolCrash: {crash.value}]"
    assert any("int(cursor)" in hint for hint in repair_hints([problem]))


LIST_CHANNELS = ENVSYNTH_FIXTURES / "captured_slack_1.5b_list_channels"


def test_binding_in_step_keeps_the_query_it_adds_clauses_to() -> None:
    # captured (Slack, resumed past the probes): shown `params = [...]` as the first line of the
    # fix, every greedy repair of slack_list_channels wrote it in place of `sql = "SELECT ..."`
    # and crashed on `sql` never set
    recorded = load_recordings(LIST_CHANNELS)
    greedy = strip_fences(recorded["tool_slack_list_channels:7"])
    assert "params = []" in greedy and "sql = " not in greedy
    problem = (
        "slack_list_channels: call 0 (...) [it crashed: ConfinedToolCrash: Incorrect number of bindings]"
    )
    (hint,) = [h for h in repair_hints([problem]) if "params.append(limit)" in h]
    assert hint.index('keep `sql = "SELECT ..."`') < hint.index("`params = []`")
