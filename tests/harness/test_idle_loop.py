"""A conversation that goes nowhere ends early, named, and charged to neither side.

The user's action: `eval --agent oracle --user <a model>` where the model playing the user
never says the stop token (Qwen2.5-Coder-0.5B echoed "All done." back until the turn limit, and a
local agent with a local user traded "You're welcome!" for 30 turns: both were `max_turns`, the
agent's failure, reward 0, on tasks the agent had done).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from envforge.harness import (
    EvalConfig,
    Limits,
    LLMConfig,
    OracleAgent,
    TrialRecord,
    load_env_tasks,
    only_closing,
    run_eval,
    write_report,
)
from envforge.harness import Message as HarnessMessage

from support.fake_llm import FakeOpenAI, completion
from support.paths import ENVS

GYM = ENVS / "gym"
MAX_TURNS = 12


def polite_user(*, opening: str = "I would like some help with my membership, please.") -> FakeOpenAI:
    """A model playing the user that asks once, says yes when asked for consent, and otherwise
    only ever thanks: it never says `###STOP###`."""

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body["messages"]
        last = messages[-1].get("content") or ""
        if len(messages) <= 2:
            return 200, completion(opening)
        if "(yes/no)" in last:
            return 200, completion("Yes, please go ahead.")
        return 200, completion("Thank you so much, you're very helpful!")

    return FakeOpenAI(brain)


def play(tmp_path: Path, fake: FakeOpenAI, agent: str = "oracle", make_agent: Any = None) -> TrialRecord:
    task = load_env_tasks(GYM).tasks[0]
    user = "openai/fake-user"
    config = EvalConfig(
        agent=agent,
        user=user,
        user_llm=LLMConfig(model=user, api_base=fake.url, api_key="x", retries=0),
        task_ids=[task.id],
        limits=Limits(max_turns=MAX_TURNS),
    )
    _, records = anyio.run(lambda: run_eval([GYM], config, tmp_path / "run", make_agent=make_agent))
    (rec,) = records
    return rec


def user_turns(rec: TrialRecord) -> int:
    return sum(m.role == "user" for m in rec.messages)


def test_a_thanking_user_and_a_done_agent_end_early_scored_on_the_state(tmp_path: Path) -> None:
    """The agent did the task and says "All done." again to every "Thank you": three such
    exchanges and the trial ends, named `idle_loop`, its reward the end state's (1.0), the agent
    not charged with a turn-limit failure."""
    with polite_user() as fake:
        rec = play(tmp_path, fake)
    assert rec.termination == "idle_loop", (rec.termination, [m.content for m in rec.messages])
    assert rec.status == "completed" and rec.fault == "none"
    assert rec.reward == 1.0
    assert user_turns(rec) < MAX_TURNS // 2
    page = write_report(tmp_path / "run").read_text(encoding="utf-8")  # and the report says so
    assert '<span class="badge end">idle_loop</span>' in page
    assert "exchanges going nowhere" in page and "charged to neither side" in page


def test_refusals_traded_with_thanks_end_early_and_earn_what_the_state_earns(tmp_path: Path) -> None:
    """The noop agent refuses, the user thanks it: a loop of refusals. It ends as `idle_loop`
    too, counted, with the reward of a state nobody changed: 0."""
    with polite_user() as fake:
        rec = play(tmp_path, fake, agent="noop")
    assert rec.termination == "idle_loop" and rec.counted and rec.reward == 0.0
    assert user_turns(rec) <= 4


class AskingAgain(OracleAgent):
    """Asks the same question every turn and never acts: the agent's own failure."""

    async def respond(self, messages: list[HarnessMessage], tools: Any, client: Any) -> HarnessMessage:
        return HarnessMessage(role="assistant", content="Thank you! Could you tell me your member id?")


def test_an_agent_that_asks_again_and_again_is_no_idle_loop(tmp_path: Path) -> None:
    """A question asked again is a side still wanting something: the thanking user does not end
    the conversation for it, and the agent runs into the turn limit, its failure."""
    with polite_user() as fake:
        rec = play(tmp_path, fake, make_agent=lambda t, s: AskingAgain(t))
    assert rec.termination == "max_turns" and rec.fault == "agent"


@pytest.mark.parametrize(
    ("text", "idle"),
    [
        ("You're welcome! Is there anything else I can help you with today?", True),
        ("No, that's all. Thank you so much! ###STOP###", True),
        ("I'm sorry, but I can't help with that request.", True),
        ("Have a great day! Goodbye.", True),
        ("All done.", True),
        ("Thanks! My member id is M-1001.", False),
        ("Yes, please cancel reservation R-5040.", False),
        ("I want to freeze my membership.", False),
        ("Shall I proceed? (yes/no)", False),
        ("", False),
    ],
)
def test_only_closing_words(text: str, idle: bool) -> None:
    assert only_closing(text) is idle
