"""Attacks on pass^k through whose fault a failure is: an agent must not hide its failures by
provoking an env error.

A trial with an env error that did not succeed is charged to the env and left out of pass^k. A
NUL character as a text argument trips a CHECK constraint of the schema (SQLite's `length`
stops at NUL), which the runtime reported as an internal error of the env: an agent that pokes
once with one had each of its failures left out, and its pass^1 rose to 1.000. The schema
refusing the agent's own values is the agent's invalid call; and the report shows the env
failures beside pass^k, with pass^k counting them as failures.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.harness import EvalConfig, Message, ToolCall, build_agent, run_eval, summarize
from envforge.server import Fleet, load_env
from envforge.synth import Task, load_tasks

from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"
POKES = {
    # each trips a constraint of retail_orders' schema with the agent's own values
    "nul line": {"customer_id": "C-1013", "line1": "\x00", "city": "Raleigh", "state": "NC", "zip": "27601"},
    "nul city": {
        "customer_id": "C-1013",
        "line1": "1 Main St",
        "city": "\x00",
        "state": "NC",
        "zip": "27601",
    },
}


class Guesser:
    """The oracle, except that it guesses every answer it should state (says 0 in its place): it
    fails each task that asks for an answer. With `poke`, it first makes one call whose values the
    schema refuses."""

    def __init__(self, task: Task, seed: int, poke: dict[str, Any] | None) -> None:
        self.oracle = build_agent("oracle", task, seed=seed, policy=load_env(RETAIL).policy)
        self.outputs, self.poke = task.required_outputs, poke

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        if self.poke is not None:
            poke, self.poke = self.poke, None
            return Message(
                role="assistant", tool_calls=[ToolCall(id="p", name="add_address", arguments=poke)]
            )
        reply = await self.oracle.respond(messages, tools, client)
        said = reply if isinstance(reply, Message) else reply.message
        text = said.content or ""
        for output in self.outputs:
            text = text.replace(output, "0")
        return said.model_copy(update={"content": text or None})


async def _pass1(tmp_path: Path, name: str, poke: dict[str, Any] | None) -> dict[str, Any]:
    tasks = load_tasks(RETAIL)[:12]
    assert 0 < sum(bool(t.required_outputs) for t in tasks) < len(tasks)
    _, records = await run_eval(
        [RETAIL],
        EvalConfig(agent="oracle", task_ids=[t.id for t in tasks]),
        tmp_path / name,
        make_agent=lambda task, seed: Guesser(task, seed, poke),
    )
    return summarize(records, 1)["overall"]


async def test_attack_poking_the_schema_first_does_not_raise_pass1(tmp_path: Path) -> None:
    honest = await _pass1(tmp_path, "honest", None)
    assert honest["pass_hat_k"][0] < 1.0, honest["pass_hat_k"]  # failures there to hide
    for name, poke in POKES.items():
        poked = await _pass1(tmp_path, name.replace(" ", "_"), poke)
        assert poked["pass_hat_k"][0] <= honest["pass_hat_k"][0], (
            name,
            poked["pass_hat_k"],
            honest["pass_hat_k"],
        )
        assert poked["env_failures"] == 0 and poked["n_trials"] == honest["n_trials"], (name, poked)


@pytest.mark.parametrize(
    ("env_name", "tool", "text"),
    [("retail_orders", "add_address", "line1"), ("helpdesk_lite", "add_comment", "body")],
    ids=["in-process", "confined"],
)
async def test_a_constraint_the_agents_values_trip_is_its_invalid_call(
    env_name: str, tool: str, text: str
) -> None:
    """At the source, in an in-process env and in a confined one: the runtime answers values the
    schema refused as `invalid` (not `env_error`), names the constraint and keeps nothing; a lone
    surrogate never reaches a tool; and the same call with honest text works."""
    env_dir = REPO / "envs" / env_name
    env = load_env(env_dir)
    task = next(t for t in load_tasks(env_dir) if not t.setup and any(c.name == tool for c in t.golden_calls))
    async with Fleet([env]) as fleet:
        episode = await fleet.create_episode(env.name)
        for call in task.golden_calls:
            if call.name == tool:
                break
            await fleet.call(episode.id, call.name, call.arguments)
        before = await fleet.export_state(episode.id)
        for value in ("\x00", "\x00\x00"):
            result = await fleet.call(episode.id, tool, {**call.arguments, text: value})
            assert result.is_error and result.kind == "invalid", result
            assert "CHECK constraint failed" in result.text, result.text
        surrogate = await fleet.call(episode.id, tool, {**call.arguments, text: "a\ud800"})
        assert surrogate.kind == "invalid" and "not valid Unicode" in surrogate.text, surrogate
        assert await fleet.export_state(episode.id) == before
        ok = await fleet.call(episode.id, tool, call.arguments)
        assert ok.kind == "ok", ok


def test_report_shows_env_failures_beside_pass_k(tmp_path: Path) -> None:
    """An env whose read crashes on valid input (a real bug, rightly the env's): `report` shows how
    many trials the env took beside pass^k, and pass^k with them counted as failures, in the text
    table, in `--json` and on report.html."""
    env_dir = tmp_path / "retail_orders"
    shutil.copytree(RETAIL, env_dir)
    tools = env_dir / "tools.py"
    bug = "    return await _order_detail(db, order_id)\n"
    assert bug in tools.read_text()
    # get_order and the writes that end the same way (place_order, cancel_order, ...) all crash
    tools.write_text(tools.read_text().replace(bug, '    raise RuntimeError("a bug")\n'))
    tasks = load_tasks(env_dir)[:8]
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            str(env_dir),
            "--agent",
            "oracle",
            "--tasks",
            ",".join(t.id for t in tasks),
            "--out",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    text = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    header = next(line for line in text.output.splitlines() if "pass^1" in line)
    assert "env fail" in header and "pass^1 w/ env" in header, text.output
    overall = next(line for line in text.output.splitlines() if line.strip().startswith("overall"))
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    env_failed = sum(r["fault"] == "env" for r in records)
    assert 0 < env_failed < len(tasks), records  # the env took some trials, not all
    assert all(r["env_errors"] and r["reward"] < 1 for r in records if r["fault"] == "env")
    pass1 = (len(tasks) - env_failed) / len(tasks)
    row = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", overall.strip()), strict=True))
    assert row["pass^1"] == "1.000", row  # left out, every counted trial succeeded
    assert row["env fail"] == str(env_failed) and row["pass^1 w/ env"] == f"{pass1:.3f}", row
    printed = CliRunner().invoke(app, ["report", str(run), "--json"]).output
    summary = json.JSONDecoder().raw_decode(printed)[0]["overall"]
    assert summary["env_failures"] == env_failed and summary["pass_hat_k"] == [1.0]
    assert summary["pass_hat_k_env_failed"] == [pass1]
    page = (run / "report.html").read_text()
    assert "<th>env fail</th>" in page and "<th>pass^1 w/ env</th>" in page


REFERENCING_TOOLS = '''
from envforge.server import Db, tool


@tool(writes=["messages"])
async def post_message(db: Db, channel_id: str, text: str) -> dict:
    """Post into a channel; the schema's foreign key is the only check that it exists."""
    n = await db.fetch_value("SELECT COUNT(*) FROM messages")
    await db.execute("INSERT INTO messages VALUES (?, ?, ?)", (f"M-{n + 1}", channel_id, text))
    return {"id": f"M-{n + 1}"}


@tool(writes=["messages"])
async def repost_everywhere(db: Db, text: str) -> dict:
    """A bug of the env's own: the channel it posts into is one it made up."""
    await db.execute("INSERT INTO messages VALUES ('M-99', 'C-made-up', ?)", (text,))
    return {"id": "M-99"}
'''


def _referencing_env(root: Path, trust: str) -> Path:
    root.mkdir(parents=True)
    (root / "env.toml").write_text(
        f'name = "refs"\ndescription = "refs"\nseed = "seed.json"\ntrust = "{trust}"\n'
    )
    (root / "policy.md").write_text("Refs.\n")
    (root / "schema.sql").write_text(
        "CREATE TABLE channels (id TEXT PRIMARY KEY, name TEXT NOT NULL);\n"
        "CREATE TABLE messages (id TEXT PRIMARY KEY, channel_id TEXT NOT NULL REFERENCES channels(id),"
        " text TEXT NOT NULL);\n"
    )
    (root / "seed.json").write_text(
        json.dumps({"channels": [{"id": "C-1", "name": "general"}], "messages": []})
    )
    (root / "tools.py").write_text(REFERENCING_TOOLS)
    return root


@pytest.mark.parametrize("trust", ["trusted", "confined"])
async def test_an_id_naming_no_row_that_the_schema_refuses_is_the_agents_invalid_call(
    tmp_path: Path, trust: str
) -> None:
    """A tool may let the schema's foreign key refuse an unknown id instead of looking it up (the
    packaged 1.5B's Slack `post_message` does). SQLite's error names nothing, and was answered as
    the env's crash: an agent posting into a channel that does not exist moved its own failing
    trial out of pass^k. It is the agent's `invalid` call, naming the id, and keeps nothing; the
    same failure on a reference the tool made up itself stays the env's bug."""
    env = load_env(_referencing_env(tmp_path / "refs", trust))
    async with Fleet([env]) as fleet:
        episode = await fleet.create_episode(env.name)
        before = await fleet.export_state(episode.id)
        for unknown in ("C-404", "", "c-1", "C-1 ", "x" * 500):
            result = await fleet.call(episode.id, "post_message", {"channel_id": unknown, "text": "hi"})
            assert result.kind == "invalid", (unknown, result)
            assert "channel_id=" in result.text and "names no channels row" in result.text, result.text
            assert len(result.text) < 200, result.text
        assert await fleet.export_state(episode.id) == before
        bug = await fleet.call(episode.id, "repost_everywhere", {"text": "hi"})
        assert bug.kind == "env_error", bug
        ok = await fleet.call(episode.id, "post_message", {"channel_id": "C-1", "text": "hi"})
        assert ok.kind == "ok", ok
