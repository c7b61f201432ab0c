"""The erring user makes real errors of every kind the detector claims, only when drawn, and says which.

Each kind is played on a lookup task (the id lives in the instruction, the user holds no fact) and
on bundled multi-step tasks (typed facts, asked for by the agent): the user must commit it (and
record it), the rules must flag the conversation, and the honest scripted user in the same
conversation must not be flagged, so the error is the injection's and nothing else's. A kind that
needs a moment the conversation never gives (a premature stop when the agent never asks) is not
recorded as committed. The per-episode draw is deterministic and errs in the asked share.
"""

from __future__ import annotations

import anyio
import pytest

from envforge.harness import (
    ERROR_KINDS,
    ErringUser,
    Message,
    ScriptedUser,
    User,
    draw_user_error,
    rule_verdict,
)
from envforge.server import Fleet, load_env
from envforge.synth import Task, load_tasks
from envforge.trainer import lookup_tasks

from support.paths import REPO

LIBRARY = REPO / "envs" / "library"


def _lookup() -> Task:
    async def make() -> Task:
        fleet = Fleet([load_env(LIBRARY)])
        try:
            return (await lookup_tasks(fleet, "library"))[0]
        finally:
            await fleet.aclose()

    return anyio.run(make)


LOOKUP = _lookup()
MULTI = [
    t
    for t in load_tasks(LIBRARY)
    if t.scenario.known_facts and all(ErringUser(t, 0.0, kinds=(k,)).planned == k for k in ERROR_KINDS)
][:3]
"""Tasks that can host every kind (a leak needs a value only the agent can find)."""


async def converse(task: Task, user: User, agent: list[str]) -> list[Message]:
    messages = [Message(role="user", content=(await user.start()).text, turn=0)]
    for i, said in enumerate(agent):
        messages.append(Message(role="assistant", content=said, turn=i))
        reply = await user.reply(messages)
        messages.append(Message(role="user", content=reply.text, turn=i + 1))
        if reply.stop:
            break
    return messages


def agent_turns(task: Task) -> list[str]:
    """An agent that asks for the user's facts, announces work, then reports."""
    if not task.scenario.known_facts:
        return ["Let me check that for you.", f"The answer is {task.required_outputs[0]}."]
    names = " and ".join(f.name.replace("_", " ") for f in task.scenario.known_facts)
    return [f"Could you tell me your {names}?", "Let me check that.", "Done, all set."]


@pytest.mark.parametrize("kind", ERROR_KINDS)
@pytest.mark.parametrize("task", [LOOKUP, *MULTI], ids=lambda t: t.id)
def test_each_kind_is_committed_recorded_and_caught(task: Task, kind: str) -> None:
    user = ErringUser(task, 0.0, kinds=(kind,))  # type: ignore[arg-type]
    messages = anyio.run(converse, task, user, agent_turns(task))
    assert user.planned == kind and user.committed == kind
    assert rule_verdict(task, messages) is not None, [m.content for m in messages if m.role == "user"]
    honest = anyio.run(converse, task, ScriptedUser(task), agent_turns(task))
    assert rule_verdict(task, honest) is None


def test_a_kind_the_task_cannot_host_is_not_planned() -> None:
    bare = LOOKUP.model_copy(update={"required_outputs": [], "golden_calls": []})
    assert ErringUser(bare, 0.0, kinds=("leak",)).planned is None


def test_a_stop_with_no_moment_to_be_premature_is_not_recorded() -> None:
    user = ErringUser(LOOKUP, 0.0, kinds=("premature_stop",))
    answer = f"The answer is {LOOKUP.required_outputs[0]}."
    messages = anyio.run(converse, LOOKUP, user, [answer])
    assert user.committed is None and rule_verdict(LOOKUP, messages) is None


def test_the_draw_is_deterministic_and_errs_in_the_asked_share() -> None:
    draws = [draw_user_error(7, "library", f"t{i % 5}", i // 5, 0.3) for i in range(2000)]
    assert draws == [draw_user_error(7, "library", f"t{i % 5}", i // 5, 0.3) for i in range(2000)]
    assert 0.26 < sum(d is not None for d in draws) / len(draws) < 0.34
    assert draws != [draw_user_error(8, "library", f"t{i % 5}", i // 5, 0.3) for i in range(2000)]
    assert all(draw_user_error(0, "e", "t", n, 0.0) is None for n in range(200))
    assert all(draw_user_error(0, "e", "t", n, 1.0) is not None for n in range(200))
    # every kind gets drawn: the choice covers the kinds a task hosts
    kinds = {ErringUser(MULTI[0], d).planned for d in draws if d is not None}
    assert kinds == set(ERROR_KINDS)
