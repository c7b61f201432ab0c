"""Attacks on a run's continuity: one model output that no record can hold must not end the run.

A lone surrogate (`"\\ud800"`, which JSON can spell and UTF-8 cannot encode) in a tool argument
crashed `eval` while writing the trial record (`PydanticSerializationError`), after the env had
already blamed itself for it; arguments nested past the serializer's depth, and bytes from a
Python agent, did the same. Each attack plays through the real harness: a model behind a real
OpenAI-compatible HTTP server (or a Python agent) sends the output on two tasks, and both trials
must be written, charged to the agent's side (never the env's, never the infrastructure's), and
readable back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envforge.harness import EvalConfig, Limits, LLMConfig, Message, ToolCall, read_trials, run_eval
from envforge.synth import Task, load_tasks

from support.fake_llm import FakeOpenAI, completion
from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


def _nested(depth: int) -> str:
    return "[" * depth + '"x"' + "]" * depth


ATTACKS = {
    # the argument strings as a model server sends them (JSON text, escapes included)
    "lone surrogate": '"\\ud800"',
    "surrogate key": '"C-1001", "\\udfff": 1',
    "deep nesting": _nested(5000),
    "nesting past the record depth": _nested(200),
    "huge": json.dumps("y" * 2_000_000),
    "binary-looking text": json.dumps("\x00\x01\x7f\xff\ufffe"),
}


def _first_argument(task: Task) -> tuple[str, str]:
    call = next(c for c in task.golden_calls if c.arguments)
    return call.name, next(iter(call.arguments))


def _brain(task: Task, value: str) -> Any:
    tool, key = _first_argument(task)

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if any(m["role"] == "tool" for m in body["messages"]):
            return 200, completion("Done \ud800 ###STOP###")
        arguments = "{" + json.dumps(key) + ": " + value + "}"
        call = {"id": "call_0", "type": "function", "function": {"name": tool, "arguments": arguments}}
        return 200, completion("Let me look. \ud800", tool_calls=[call])

    return brain


def _check_written(run: Path, records: list[Any], n: int) -> None:
    assert len(records) == n
    read = read_trials(run / "trials.jsonl")
    assert not read.skipped and len(read.records) == n
    for record in records:
        assert record.fault in ("none", "agent"), (record.status, record.error)
        assert record.env_errors == 0, record.error
        bad = next(m for m in record.messages if m.role == "tool")
        assert bad.is_error, bad.content


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_one_unwritable_model_output_does_not_end_the_run(attack: str, tmp_path: Path) -> None:
    tasks = load_tasks(RETAIL)[:2]
    brain = _brain(tasks[0], ATTACKS[attack])  # one of the env's tools, on both tasks
    run = tmp_path / "run"
    with FakeOpenAI(brain) as fake:
        config = EvalConfig(
            agent="openai/fake",
            agent_llm=LLMConfig(model="openai/fake", api_base=fake.url, api_key="x", backoff_s=0.01),
            task_ids=[t.id for t in tasks],
            limits=Limits(max_turns=2),
        )
        _, records = await run_eval([RETAIL], config, run)
    _check_written(run, records, 2)


class Emits:
    """A Python agent that makes one call with `arguments` in the first argument, then stops."""

    def __init__(self, task: Task, value: Any) -> None:
        self.task, self.value, self.done = task, value, False

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        if self.done:
            return Message(role="assistant", content="Done. ###STOP###")
        self.done = True
        tool, key = _first_argument(self.task)
        return Message(
            role="assistant", tool_calls=[ToolCall(id="x", name=tool, arguments={key: self.value})]
        )


@pytest.mark.parametrize(
    "value",
    [b"\xff\x00binary", "\ud800", {"\ud800": 1}, {1: "a non-string key"}, {"set": {1, 2}}],
    ids=["bytes", "surrogate", "surrogate key", "int key", "set"],
)
async def test_a_python_agents_unwritable_arguments_do_not_end_the_run(value: Any, tmp_path: Path) -> None:
    tasks = load_tasks(RETAIL)[:2]
    run = tmp_path / "run"
    _, records = await run_eval(
        [RETAIL],
        EvalConfig(agent="oracle", task_ids=[t.id for t in tasks], limits=Limits(max_turns=2)),
        run,
        make_agent=lambda task, seed: Emits(task, value),
    )
    _check_written(run, records, 2)
