"""What the user-error judge reads: the agent's turns and tool results next to the user's words.

A user who repeats an order id the agent just looked up states a correct fact that is not among
the scenario's facts; a judge shown only the user's lines cannot tell that from an invention and
would mask the agent's trajectory for it. And `bench_meu.py --judge local/NAME` measures a real
packaged model as that judge through the CLI's launcher (one server for the run, stopped after).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import psutil
import pytest

from envforge.harness import LLMConfig, Message, ToolCall, detect_user_error, judge_transcript
from envforge.synth import Task

from support.fake_llm import FakeOpenAI, completion
from support.paths import FIXTURES, REPO
from support.skips import LOCAL_MODEL_MISSING, local_model_missing

ID = re.compile(r"\b[A-Z]{1,3}-\d{3,}\b")


def careful_judge(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A judge that does what the prompt asks: an id the user states is an error unless the facts,
    the agent or a tool result showed it first."""
    prompt = body["messages"][-1]["content"]
    facts, _, conversation = prompt.partition("The conversation, in order")
    seen = set(ID.findall(facts))
    invented: list[str] = []
    for line in conversation.splitlines() if conversation else prompt.splitlines():
        ids = set(ID.findall(line))
        if line.startswith(("USER:", "- ")):
            invented += sorted(ids - seen)
        seen |= ids
    verdict = {"user_error": bool(invented), "reason": f"states {invented}"}
    return 200, completion(json.dumps(verdict))


@pytest.fixture(scope="module")
def task() -> Task:
    # frozen beside the MEU set (the conversations here name its customer); bundled tasks change
    return next(
        map(Task.model_validate_json, (FIXTURES / "meu_rule_tasks.jsonl").read_text().splitlines()[1:])
    )


def confirming_conversation(task: Task, result_text: str) -> list[Message]:
    """The user confirms an order id that only the agent's lookup produced, then the run fails."""
    return [
        Message(role="user", content="Hi, I'm customer C-1029 and I'd like to see my last order."),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="c1", name="list_orders", arguments={"customer_id": "C-1029"})],
            turn=1,
        ),
        Message(role="tool", content=result_text, tool_call_id="c1", turn=1),
        Message(role="assistant", content="I found one order. Which order do you mean?", turn=1),
        Message(role="user", content="Yes, O-5001 is the one.", turn=1),
    ]


async def test_a_correct_fact_from_a_tool_result_is_not_judged_an_invention(task: Task) -> None:
    messages = confirming_conversation(task, json.dumps([{"order_id": "O-5001", "status": "pending"}]))
    with FakeOpenAI(careful_judge) as fake:
        verdict = await detect_user_error(task, messages, LLMConfig(model="openai/judge", api_base=fake.url))
    assert len(fake.requests) == 1, "the rules should have let this through to the judge"
    assert not verdict.error, verdict.reason
    prompt = fake.requests[0]["messages"][-1]["content"]
    assert 'CALL: list_orders({"customer_id":"C-1029"})' in prompt
    assert "AGENT: [named no value; asked a question]" in prompt  # the agent's words are withheld


async def test_a_value_nobody_showed_is_still_judged_an_invention(task: Task) -> None:
    messages = confirming_conversation(task, json.dumps([{"order_id": "O-7777", "status": "pending"}]))
    with FakeOpenAI(careful_judge) as fake:
        verdict = await detect_user_error(task, messages, LLMConfig(model="openai/judge", api_base=fake.url))
    assert verdict.error and verdict.reason and "O-5001" in verdict.reason


def test_a_flood_of_tool_output_cannot_push_the_users_words_out_of_the_judges_view(task: Task) -> None:
    """An agent that dumps huge results (or a policy that learns to, to hide its user's errors from
    the judge) gets them clipped and then dropped; every user line stays whole."""
    flood = json.dumps([{"order_id": f"O-{9000 + i}", "note": "x" * 500} for i in range(400)])
    messages = confirming_conversation(task, flood) * 8
    messages.append(Message(role="user", content="And my card is PM-0000, the last thing I say.", turn=9))
    view = judge_transcript(messages, budget=3000)
    assert len(view) <= 3000
    assert view.count("USER: Yes, O-5001 is the one.") == 8
    assert view.splitlines()[-1] == "USER: And my card is PM-0000, the last thing I say."


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
def test_bench_meu_measures_a_local_judge_and_stops_its_server() -> None:
    """The benchmark that refused `--judge local` serves the packaged model itself: one server for
    the run, its verdicts in the table, nothing left running afterwards."""
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_meu.py", "--judge", "local/smollm2", "--per-label", "1"],
        cwd=REPO,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "subset: the first 1 items of each label (6 items)" in out.stderr
    match = re.search(r"local judge: smollm2 at http://127\.0\.0\.1:(\d+)/v1", out.stderr)
    assert match, out.stderr[-2000:]
    port = int(match.group(1))
    listening = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert not any(c.laddr and c.laddr.port == port for c in listening), "the judge's server still listens"
    assert "rules + local/smollm2 precision | rules + local/smollm2 recall" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| **all errors** | 5 |")]
    assert len(rows) == 1, out.stdout
