"""A simulated user played by a small model: the conversation must begin, and its endings count.

Qwen2.5-Coder-0.5B as the user opened every conversation with the stop token (it copies the last
control token of its prompt), so the agent had nothing to act on and a user-realism measurement had
nothing to measure; it also wrote near misses such as `### STOP###`, which let a conversation run
on after the model meant to end it. Each case runs the real `LLMUser` over HTTP against a fake
OpenAI-compatible server on 127.0.0.1 answering as the small model did.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from envforge.harness import LLMConfig, LLMUser, Message
from envforge.synth import Task, load_tasks

from support.fake_llm import FakeOpenAI, completion
from support.paths import REPO

REQUEST = "Hi, I'd like to cancel one of my orders."


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


@pytest.mark.parametrize("first", ["###STOP###", "", "### STOP ###"], ids=["stop", "empty", "loose-stop"])
def test_an_opening_that_ends_the_conversation_is_asked_again(task: Task, first: str) -> None:
    fake, bodies = answering(first, REQUEST)
    with fake:
        reply = anyio.run(user_for(task, fake.url).start)
    assert reply.text == REQUEST and not reply.stop
    assert len(bodies) == 2 and "have not said anything yet" in bodies[1]["messages"][-1]["content"]
    assert reply.usage.calls == 2  # both calls are counted


def test_a_model_that_insists_on_stopping_is_asked_only_once_more(task: Task) -> None:
    fake, bodies = answering("###STOP###")
    with fake:
        reply = anyio.run(user_for(task, fake.url).start)
    assert reply.stop and len(bodies) == 2


def test_a_good_opening_is_taken_as_it_is(task: Task) -> None:
    fake, bodies = answering(REQUEST)
    with fake:
        reply = anyio.run(user_for(task, fake.url).start)
    assert reply.text == REQUEST and len(bodies) == 1


def test_the_opening_prompt_offers_no_control_token_to_copy(task: Task) -> None:
    """A small model copies the last control token its prompt shows: the opening turn's prompt
    shows none (there is nothing to end yet); every later turn's prompt says how to end."""
    fake, bodies = answering(REQUEST, "Thanks. ###STOP###")
    user = user_for(task, fake.url)
    with fake:
        anyio.run(user.start)
        anyio.run(
            user.reply, [Message(role="user", content=REQUEST), Message(role="assistant", content="Done.")]
        )
    opening, later = (b["messages"][0]["content"] for b in bodies)
    assert "###" not in opening and task.scenario.persona in opening
    assert "###STOP###" in later and "###TRANSFER###" in later


@pytest.mark.parametrize("said", ["Thanks, that's all. ### STOP###", "ok ##stop##", "####TRANSFER####"])
def test_a_near_miss_control_token_ends_the_conversation(task: Task, said: str) -> None:
    fake, _ = answering(said)
    history = [Message(role="user", content=REQUEST), Message(role="assistant", content="Done: cancelled.")]
    with fake:
        reply = anyio.run(user_for(task, fake.url).reply, history)
    assert reply.stop or reply.transfer
    assert "###STOP###" in reply.text or "###TRANSFER###" in reply.text
