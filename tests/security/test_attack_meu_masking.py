"""Attacks on ERPO's user-error mask: an agent that fails must not get its failure masked.

A trajectory the detector calls a user error carries no loss, so a policy that can make its own
failures look like the user's escapes every penalty for them. Two ways an agent could do that, each
played through the real harness (real episodes, the scripted user or a model user over HTTP):

- give up politely, ending with a closing offer ("Is there anything else I can help you with?"),
  so that a model user's goodbye lands "right after a question";
- talk instead of acting ("Let me look into that for you."), so that the scripted user, which
  stops on any statement, stops "while the agent announced more work".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envforge.harness import STOP, EvalConfig, Limits, LLMConfig, LLMUser, Message, run_eval
from envforge.synth import load_tasks

from support.fake_llm import FakeOpenAI, completion
from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


class SayOnly:
    """An agent that never calls a tool and says the same thing every turn."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        return Message(role="assistant", content=self.text)


async def test_attack_polite_give_up_with_a_closing_offer_stays_the_agents_failure(tmp_path: Path) -> None:
    def user_model(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        last = body["messages"][-1]["content"]
        return 200, completion(
            f"No, that's all, thanks. {STOP}" if "anything else" in last else "Hi, I need help."
        )

    task_ids = [t.id for t in load_tasks(RETAIL)[:2]]
    quitter = "I'm sorry, I can't help with that. Is there anything else I can help you with?"
    with FakeOpenAI(user_model) as fake:
        user_cfg = LLMConfig(model="openai/fake-user", api_base=fake.url, api_key="x")
        _, records = await run_eval(
            [RETAIL],
            EvalConfig(agent="oracle", task_ids=task_ids),
            tmp_path / "run",
            make_agent=lambda task, seed: SayOnly(quitter),
            make_user=lambda task: LLMUser(task, user_cfg),
        )
    assert [r.termination for r in records] == ["user_stop", "user_stop"]
    for record in records:
        assert record.reward == 0.0
        assert not record.user_error, record.user_error_reason


async def test_attack_announcing_instead_of_acting_is_not_masked(tmp_path: Path) -> None:
    task_ids = [t.id for t in load_tasks(RETAIL)[:2]]
    _, records = await run_eval(
        [RETAIL],
        EvalConfig(agent="oracle", task_ids=task_ids, limits=Limits(max_turns=4)),
        tmp_path / "run",
        make_agent=lambda task, seed: SayOnly("Let me look into that for you."),
    )
    for record in records:
        assert record.reward == 0.0
        assert not record.user_error, record.user_error_reason
        # The scripted user let the agent go on instead of stopping on the announcement.
        assert sum(m.role == "assistant" for m in record.messages) == 4
