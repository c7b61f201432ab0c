"""Attacks on what counts as "shown" through tool-call ids: the ids are the agent's to choose.

What the agent was shown is read from the results of the task's own calls. Results were matched
to calls by id, last call wins: an agent that gives every call one id (and an OpenAI-compatible
server that sends no ids, each call then named `call_0`) had every result credited to its last
call. A read whose error repeats "0 1 2 ... 9", made before the golden calls, was then credited to
a golden call, and "It is 1, 2 or 3." earned on far more numeric tasks than the best single guess.
Results now pair with calls by position, and the harness names every call itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envforge.harness import EvalConfig, Limits, LLMConfig, Message, ToolCall, run_eval, shown_texts
from envforge.server import Fleet, load_env
from envforge.synth import (
    Call,
    SynthContext,
    Task,
    build_graph,
    load_graph,
    load_tasks,
    parse_number,
    score_episode,
)

from support.fake_llm import FakeOpenAI, completion
from support.paths import REPO, bundled_env_dirs

ECHO = " ".join(str(v) for v in range(10))
HEDGES = ("It is 1 or 2.", "It is 0, 1 or 2.", "It is 1, 2 or 3.")
SINGLES = tuple(f"It is {v}." for v in range(7))
ID_SCHEMES = {
    "unique": lambda i: f"call_{i}",
    "one id for every call": lambda i: "call_x",
    "no ids (a server's call_0)": lambda i: "call_0",
}


def _numeric(task: Task) -> bool:
    return bool(task.required_outputs) and all(parse_number(o) is not None for o in task.required_outputs)


def _transcript(task: Task, calls: list[Call], texts: list[str], ids: Any) -> list[Message]:
    """The trial as a harness record holds it: the user's request, then one call per agent
    message with the id the scheme gives it, each followed by its result."""
    messages = [Message(role="user", content=task.scenario.without_answers())]
    for i, (call, text) in enumerate(zip(calls, texts, strict=True)):
        messages.append(
            Message(
                role="assistant", tool_calls=[ToolCall(id=ids(i), name=call.name, arguments=call.arguments)]
            )
        )
        messages.append(Message(role="tool", content=text, tool_call_id=ids(i)))
    return messages


async def _echo_first_runs(env_dir: Path, tasks: list[Task]) -> list[tuple[Any, list[Call], list[str]]]:
    """Per task: a read whose argument is "0 1 ... 9" (it fails, and its error may repeat it),
    then the golden calls; the end state, the calls and their results."""
    env = load_env(env_dir)
    async with Fleet([env]) as fleet:
        graph = load_graph(env_dir) or await build_graph(env, fleet)
        ctx = SynthContext.create(env, graph, fleet)
        out = []
        for task in tasks:
            read = next(c for c in task.golden_calls if env.tools[c.name].read_only and c.arguments)
            key = next(iter(read.arguments))
            calls = [read.model_copy(update={"arguments": {**read.arguments, key: ECHO}}), *task.golden_calls]
            database, _, _ = ctx.states.task_initial(task)
            state, texts = await ctx.replayer.run_all(database, calls)
            assert state is not None
            out.append((state, calls, texts))
        return out


NUMERIC_ENVS = [d for d in bundled_env_dirs() if any(_numeric(t) for t in load_tasks(d))]


async def test_hedging_pays_less_than_committing_under_every_id_scheme() -> None:
    """The attack: the echoing read first, the golden calls, then a few small numbers instead of
    the count. Under each id scheme an agent or its server can produce, every hedge must earn on
    fewer bundled tasks than the best single number does."""
    wins: dict[str, dict[str, int]] = {scheme: {} for scheme in ID_SCHEMES}
    echoed = 0
    for env_dir in NUMERIC_ENVS:
        tasks = [t for t in load_tasks(env_dir) if _numeric(t)]
        for task, (golden, calls, texts) in zip(tasks, await _echo_first_runs(env_dir, tasks), strict=True):
            echoed += ECHO in texts[0]
            for scheme, ids in ID_SCHEMES.items():
                shown = shown_texts(task, _transcript(task, calls, texts, ids))
                for said in (*HEDGES, *SINGLES):
                    earned = score_episode(task, golden, [said], shown_messages=shown).reward == 1.0
                    wins[scheme][said] = wins[scheme].get(said, 0) + earned
    assert echoed >= 100  # the reads did repeat the values to launder
    for scheme, counts in wins.items():
        best_single = max(counts[s] for s in SINGLES)
        assert best_single >= 20, (scheme, counts)
        for hedge in HEDGES:
            assert counts[hedge] < best_single, (scheme, hedge, counts)
    assert wins["unique"] == wins["one id for every call"] == wins["no ids (a server's call_0)"], wins


@pytest.mark.parametrize("server_ids", [None, "same"], ids=["no ids", "one id"])
async def test_the_harness_names_every_call_itself(server_ids: str | None, tmp_path: Path) -> None:
    """Through the real harness: a model server that sends no ids, or one id for every call. The
    record names each call with the harness's own unique id, each result answers its own call,
    and the model is sent back a consistent transcript (every result's id is a call's id)."""
    env_dir = REPO / "envs" / "retail_orders"
    task = next(t for t in load_tasks(env_dir) if len(t.golden_calls) >= 2)

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if done >= len(task.golden_calls):
            return 200, completion("Done. ###STOP###")
        call = task.golden_calls[done]
        tool_call = {
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        if server_ids:
            tool_call["id"] = server_ids
        return 200, completion(tool_calls=[tool_call])

    with FakeOpenAI(brain) as fake:
        config = EvalConfig(
            agent="openai/fake",
            agent_llm=LLMConfig(model="openai/fake", api_base=fake.url, api_key="x", backoff_s=0.01),
            task_ids=[task.id],
            limits=Limits(max_turns=3),
        )
        _, (record,) = await run_eval([env_dir], config, tmp_path / "run")
        last = fake.requests[-1]["messages"]
    ids = [c.id for m in record.messages for c in m.tool_calls]
    assert len(ids) == len(task.golden_calls) and len(set(ids)) == len(ids), ids
    results = [m.tool_call_id for m in record.messages if m.role == "tool"]
    assert results == ids
    sent_calls = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == sent_calls == ids
