"""Dual control in the harness: users that act on their own device, scored by env assertions.

On the `dual_phone` fixture: the oracle agent hands the user's golden calls over and the scripted
user plays them, so together they replay each task's golden interleaving exactly; the agent never
sees the user's calls; a saved run rescored from its stored end state; over `envforge serve` too.
Attacks: an agent calling the user's tools by name; a do-nothing agent (the user's calls alone
must not pass a task that needs the agent); an LLM user given its tools as function tools.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from envforge.harness import (
    EvalConfig,
    LLMConfig,
    Message,
    OracleAgent,
    TaskSelectionError,
    ToolCall,
    load_env_tasks,
    rescore,
    run_eval,
    write_report,
)
from envforge.server import Fleet, build_app, load_env, state_hash
from envforge.synth import Call, load_tasks

from support.fake_llm import FakeOpenAI, completion
from support.paths import DUAL_PHONE_DIR, ENVS
from support.serving import ServerThread

RETAIL_DIR = ENVS / "retail_orders"
TASKS = load_tasks(DUAL_PHONE_DIR)
USER_TOOLS = ("check_status_bar", "toggle_airplane_mode", "toggle_data")


def _calls(messages: list[Any]) -> list[Call]:
    """The trial's calls in order, the user's marked (read off the record, as a reader would)."""
    out = []
    for m in messages:
        for c in m.tool_calls:
            out.append(
                Call(
                    name=c.name, arguments=c.arguments, requestor="user" if m.role == "user" else "assistant"
                )
            )
    return out


async def test_oracle_and_scripted_user_replay_the_golden_interleaving(tmp_path):
    seen: list[list[Any]] = []

    class Watching(OracleAgent):
        async def respond(self, messages, tools, client):  # type: ignore[no-untyped-def]
            seen.append(list(messages))
            assert {t["function"]["name"] for t in tools} == {"get_line", "resume_line"}
            return await super().respond(messages, tools, client)

    config = EvalConfig(agent="oracle", user="scripted", concurrency=2)
    _, records = await run_eval(
        [DUAL_PHONE_DIR], config, tmp_path / "run", make_agent=lambda task, seed: Watching(task)
    )
    assert len(records) == len(TASKS)
    by_id = {t.id: t for t in TASKS}
    for rec in records:
        assert rec.reward == 1.0 and rec.status == "completed", (rec.task_id, rec.parts)
        assert rec.parts["env_assertions"] == 1.0
        assert _calls(rec.messages) == by_id[rec.task_id].golden_calls
        user_ids = [c.id for m in rec.messages if m.role == "user" for c in m.tool_calls]
        assert user_ids == [f"user_h{i}" for i in range(len(by_id[rec.task_id].user_calls))]
    # the agent was never shown the user's calls nor their results
    for shown in seen:
        assert not any(m.role == "user" and m.tool_calls for m in shown)
        assert all(m.tool_call_id is None or m.tool_call_id.startswith("call_h") for m in shown)
    report = write_report(tmp_path / "run")
    html = report.read_text()
    assert "user (own tool)" in html and "what the trial changed: user's side" in html


async def test_a_saved_run_is_rescored_from_its_stored_end_state(tmp_path):
    config = EvalConfig(agent="oracle", user="scripted", task_ids=["dual_phone-airplane"])
    await run_eval([DUAL_PHONE_DIR], config, tmp_path / "run")
    path = tmp_path / "run" / "trials.jsonl"
    rec = json.loads(path.read_text())
    assert rec["parts"] == {"env_assertions": 1.0}
    # the stored end state says airplane mode stayed on: rescoring must judge that, not the record
    rec["final_diff"] = {}
    et = load_env_tasks(DUAL_PHONE_DIR)  # and its hash made to match, as a run that did that writes it
    rec["final_state_hash"] = state_hash(et.final_from_diff(et.task(rec["task_id"]), {}))
    path.write_text(json.dumps(rec) + "\n")
    result = await rescore(tmp_path / "run")
    [again] = result.records
    assert again.reward == 0.0 and again.parts == {"env_assertions": 0.0}


async def test_noop_agent_with_a_scripted_user_fails(tmp_path):
    """The user plays only what it is asked to: an agent that does nothing gets nothing done."""
    config = EvalConfig(agent="noop", user="scripted")
    _, records = await run_eval([DUAL_PHONE_DIR], config, tmp_path / "run")
    assert [r.reward for r in records] == [0.0] * len(TASKS)


async def test_an_agent_calling_the_users_tools_is_refused(tmp_path):
    class Grabby(OracleAgent):
        async def respond(self, messages, tools, client):  # type: ignore[no-untyped-def]
            if not any(m.role == "tool" for m in messages):
                return Message(
                    role="assistant", tool_calls=[ToolCall(id="x", name="toggle_airplane_mode", arguments={})]
                )
            result = await client.call_tool("toggle_airplane_mode", {})
            assert result.text == "Error: Tool 'toggle_airplane_mode' not found."
            return Message(role="assistant", content="I am done.")

    config = EvalConfig(agent="oracle", user="scripted", task_ids=["dual_phone-airplane"])
    _, [rec] = await run_eval(
        [DUAL_PHONE_DIR], config, tmp_path / "run", make_agent=lambda task, seed: Grabby(task)
    )
    tool = next(m for m in rec.messages if m.role == "tool")
    assert tool.is_error and "unknown tool 'toggle_airplane_mode'" in (tool.content or "")
    assert rec.reward == 0.0 and rec.final_diff == {}


async def test_over_envforge_serve_the_user_reaches_its_endpoint(tmp_path):
    fleet = Fleet([load_env(DUAL_PHONE_DIR)], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server:
        config = EvalConfig(agent="oracle", user="scripted", server=server.url)
        _, records = await run_eval([DUAL_PHONE_DIR], config, tmp_path / "run")
    assert [r.reward for r in records] == [1.0] * len(TASKS)
    by_id = {t.id: t for t in TASKS}
    assert all(_calls(r.messages) == by_id[r.task_id].golden_calls for r in records)


async def test_an_llm_user_calls_its_tools_as_function_tools(tmp_path):
    """The user model is offered its device's tools, calls one, sees the result, then speaks."""

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body["messages"]
        if body["model"] == "fake-user":
            names = [t["function"]["name"] for t in body.get("tools") or []]
            assert names == ["check_status_bar", "toggle_airplane_mode", "toggle_data"]
            mine = [m for m in messages if m["role"] == "tool"]
            if len(messages) <= 2:
                return 200, completion("My phone has no signal.")
            if not mine:
                call = {
                    "id": "u1",
                    "type": "function",
                    "function": {"name": "toggle_airplane_mode", "arguments": "{}"},
                }
                return 200, completion(None, [call])
            assert mine[-1]["content"] == "Airplane mode is now off."
            return 200, completion("It works now, thanks. ###STOP###")
        assert not any(m.get("tool_calls") and "toggle" in json.dumps(m["tool_calls"]) for m in messages)
        return 200, completion("Please turn airplane mode off on your phone.")

    with FakeOpenAI(brain) as fake:
        config = EvalConfig(
            agent="openai/fake-agent",
            agent_llm=LLMConfig(model="openai/fake-agent", api_base=fake.url, api_key="x"),
            user="openai/fake-user",
            user_llm=LLMConfig(model="openai/fake-user", api_base=fake.url, api_key="x"),
            task_ids=["dual_phone-airplane"],
        )
        _, [rec] = await run_eval([DUAL_PHONE_DIR], config, tmp_path / "run")
    assert [(c.name, c.requestor) for c in _calls(rec.messages)] == [("toggle_airplane_mode", "user")]
    assert rec.reward == 1.0, rec.parts


async def test_solo_mode_the_agent_drives_both_sides(tmp_path):
    """τ²'s solo mode: the agent is offered the user's tools beside its own and calls them itself;
    setup and check tools stay out of reach; an env without user tools refuses solo mode."""
    offered: list[set[str]] = []

    class Watching(OracleAgent):
        async def respond(self, messages, tools, client):  # type: ignore[no-untyped-def]
            offered.append({t["function"]["name"] for t in tools})
            if len(offered) == 1:
                refused = await client.call_tool("turn_airplane_mode_on", {})
                assert refused.text == "Error: Tool 'turn_airplane_mode_on' not found."
            return await super().respond(messages, tools, client)

    config = EvalConfig(agent="oracle", solo=True)
    manifest, records = await run_eval(
        [DUAL_PHONE_DIR], config, tmp_path / "run", make_agent=lambda task, seed: Watching(task, solo=True)
    )
    assert manifest.solo and [r.reward for r in records] == [1.0] * len(TASKS)
    assert offered[0] == {
        "get_line",
        "resume_line",
        "check_status_bar",
        "toggle_airplane_mode",
        "toggle_data",
    }
    by_id = {t.id: t for t in TASKS}
    for rec in records:
        assert all(m.role != "user" or not m.tool_calls for m in rec.messages)  # every call is the agent's
        golden = [(c.name, c.arguments) for c in by_id[rec.task_id].golden_calls]
        assert [(c.name, c.arguments) for c in _calls(rec.messages)] == golden
    with pytest.raises(TaskSelectionError, match="has no user tools"):
        await run_eval([RETAIL_DIR], EvalConfig(agent="oracle", solo=True), tmp_path / "retail")
