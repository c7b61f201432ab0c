"""A small model playing the user follows its instruction: it opens with its request, answers the
agent's questions, and stops once the agent is done.

Qwen2.5-Coder-0.5B as the user, against the oracle agent on 9 bundled tasks, opened as the agent
("Hello! I'd be happy to help you ...") 9 times of 9 and, told the stop rule only in its system
prompt, echoed "All done." back until the turn limit in 8 (docs/benchmarks/local-models.md).
Each case runs the real `LLMUser` over HTTP against a fake OpenAI-compatible server answering as
that model did.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from envforge.harness import STOP, LLMConfig, LLMUser, Message, request_text
from envforge.synth import Task, load_tasks

from support.fake_llm import FakeOpenAI, completion
from support.paths import REPO


@pytest.fixture(scope="module")
def task() -> Task:
    return load_tasks(REPO / "envs" / "retail_orders")[0]


def user_for(task: Task, url: str) -> LLMUser:
    return LLMUser(task, LLMConfig(model="openai/small-user", api_base=url, api_key="x", transport="http"))


def answering(*texts: str) -> tuple[FakeOpenAI, list[dict[str, Any]]]:
    """A fake model that answers with `texts` in turn (the last one from then on)."""
    bodies: list[dict[str, Any]] = []
    queue = list(texts)

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        bodies.append(body)
        return 200, completion(queue.pop(0) if len(queue) > 1 else queue[0])

    return FakeOpenAI(brain), bodies


@pytest.mark.parametrize(
    "voice",
    [
        "Hello Fatima! I'd be happy to help you with your order.",
        "I'm sorry, but I can't assist with that.",
        "Hello! I'm sorry to hear that. To help you, could you please provide your order id?",
    ],
    ids=["offers-help", "refuses", "asks-for-details"],
)
def test_an_opening_in_the_agent_voice_twice_becomes_the_request(task: Task, voice: str) -> None:
    fake, bodies = answering(voice, "Hi! How can I help you today?")
    with fake:
        reply = anyio.run(user_for(task, fake.url).start)
    assert len(bodies) == 2  # asked once more, nudged
    assert reply.text == request_text(task) and not reply.stop


def test_each_agent_turn_ends_with_what_the_user_should_do(task: Task) -> None:
    """After a report the user model is reminded to stop; after a question, to answer it."""
    fake, bodies = answering(STOP)
    user = user_for(task, fake.url)
    said = [Message(role="user", content=request_text(task))]
    with fake:
        said.append(Message(role="assistant", content="Shall I cancel order O-5008? (yes/no)"))
        anyio.run(user.reply, said)
        said += [Message(role="user", content="Yes."), Message(role="assistant", content="All done.")]
        reply = anyio.run(user.reply, said)
    asked, told = (b["messages"][-1]["content"] for b in bodies)
    assert asked.startswith("Shall I cancel") and "answer the agent's question" in asked and STOP not in asked
    assert told.startswith("All done.") and f"reply with exactly {STOP}" in told
    assert reply.stop
