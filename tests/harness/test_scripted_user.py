"""The scripted user as the person in the task: it nudges an agent that says nothing, charges a
silence that lasts to the agent, confirms a proposal that matches its request and declines one
that does not; and the user-error rules never blame the user for a stop after the agent's silence.

Each conversation is played through the real harness (`run_eval`: real episodes over in-process
MCP, the real scorer and user-error detector) with a scripted agent that says exactly what the
attack needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envforge.harness import (
    STOP,
    EvalConfig,
    Limits,
    Message,
    ScriptedUser,
    ToolCall,
    UserName,
    UserReply,
    asks_confirmation,
    confirmation_request,
    proposal_matches,
    run_eval,
    says_nothing,
)
from envforge.synth import Call, Task, load_tasks

from support.paths import REPO, bundled_env_dirs

GYM = REPO / "envs" / "gym"
BUNDLED = [p for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]

CONFIRMED = "Yes, please go ahead."
DECLINED = "No, that is not what I want."
FACT_QUESTIONS = (  # the labeled set's questions (harness/user_error_play.py), and one more
    "Could you tell me your member id?",
    "What is the member id?",
    "To go on I need the member id. What are they?",
    "Which member id should I use?",
    "Can you confirm the member id for me?",
    "What should I call you?",
)
SILENT_TURNS = {
    "empty": "",
    "whitespace": " \n\t ",
    "punctuation": "...?",
    "cut-off call": '{"name": "freeze_membership", "arguments": {"member_id": "G-1',
    "call as code": "freeze_membership(member_id='G-114')",
    "fenced json": '```json\n{"member": "G-114"}\n```',
    "broken tag": '<tool_call>{"name": "freeze_membership"',
    "a call named before its id": "get_member G-114",
    "a dash": " - ",
}


class Scripted:
    """An agent that sends `turns` one by one, then the last one forever."""

    def __init__(self, turns: list[Message]) -> None:
        self.turns = turns
        self.at = 0

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        turn = self.turns[min(self.at, len(self.turns) - 1)]
        self.at += 1
        return turn.model_copy()


def call(name: str, **arguments: Any) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=f"c_{name}", name=name, arguments=arguments)])


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


async def play(tmp_path: Path, task_ids: list[str], turns: list[Message], **user: Any) -> list[Any]:
    _, records = await run_eval(
        [GYM],
        EvalConfig(agent="scripted-agent", task_ids=task_ids, limits=Limits(max_turns=10)),
        tmp_path / "run",
        make_agent=lambda task, seed: Scripted(turns),
        make_user=(lambda task: ScriptedUser(task, **user)),
    )
    return records


def _users(records: list[Any]) -> list[str]:
    return [m.content for r in records for m in r.messages if m.role == "user"]


# --------------------------------------------------------------------------- the two trajectories


async def test_attack_wrong_write_then_silence_is_the_agents_failure(tmp_path: Path) -> None:
    """The agent freezes a member it invented (G-102; the user's is G-114), then says nothing:
    once charged to the user ("ended the conversation before the agent said anything") and masked
    from training; now nudged twice and then the agent's own failure."""
    turns = [call("freeze_membership", member_id="G-102"), say("")]
    (record,) = await play(tmp_path, ["gym-0-00000"], turns)
    assert record.status == "no_response" and record.termination == "agent_empty"
    assert record.fault == "agent" and record.reward == 0.0
    assert not record.user_error, record.user_error_reason
    users = _users([record])
    assert users[1] == users[2] == "Are you still there? I want to freeze my membership."
    assert users[3].endswith(STOP) and len(users) == 4


async def test_attack_calls_to_made_up_tools_then_silence_is_the_agents_failure(tmp_path: Path) -> None:
    """Four calls to tools named "Member 101" and "Error", then an empty message."""
    turns = [
        call("Member 101", member_id="G-101"),
        call("Error"),
        call("Member 101"),
        call("Error", message="x"),
        say(""),
    ]
    records = await play(tmp_path, ["gym-0-00000", "gym-0-00003", "gym-0-00004"], turns)
    for record in records:
        assert (record.status, record.fault, record.reward) == ("no_response", "agent", 0.0)
        assert not record.user_error, record.user_error_reason


@pytest.mark.parametrize("kind", sorted(SILENT_TURNS))
async def test_attack_each_silent_turn_is_nudged_then_charged_to_the_agent(tmp_path: Path, kind: str) -> None:
    (record,) = await play(tmp_path, ["gym-0-00000"], [say(SILENT_TURNS[kind])])
    assert (record.status, record.fault, record.reward) == ("no_response", "agent", 0.0)
    assert not record.user_error, record.user_error_reason
    assert len([m for m in record.messages if m.role == "user"]) == 4  # opening, two nudges, giving up


@pytest.mark.parametrize("kind", sorted(SILENT_TURNS))
async def test_a_user_that_stops_after_a_silent_turn_is_not_flagged(tmp_path: Path, kind: str) -> None:
    """A user that says goodbye to whatever it hears (the model users of the issue): its stop
    after the agent's silent turn is no user error, and the failure stays the agent's (reward 0)."""

    class Leaves:
        async def start(self) -> UserReply:
            return UserReply("I want to freeze my membership.")

        async def reply(self, messages: list[Message]) -> UserReply:
            return UserReply(f"Thank you. {STOP}")

    turns = [call("freeze_membership", member_id="G-102"), say(SILENT_TURNS[kind])]
    _, (record,) = await run_eval(
        [GYM],
        EvalConfig(agent="scripted-agent", task_ids=["gym-0-00000"]),
        tmp_path / "run",
        make_agent=lambda task, seed: Scripted(turns),
        make_user=lambda task: Leaves(),
    )
    assert record.reward == 0.0 and record.fault == "none"
    assert not record.user_error, record.user_error_reason


async def test_the_agent_that_speaks_after_a_nudge_is_heard(tmp_path: Path) -> None:
    """A nudge is not an ending: an agent that answers it goes on and can still succeed."""
    turns = [
        call("get_member", member_id="G-114"),
        say(""),
        call("freeze_membership", member_id="G-114"),
        say("Your membership is frozen."),
    ]
    (record,) = await play(tmp_path, ["gym-0-00000"], turns)
    assert (record.status, record.termination, record.reward) == ("completed", "user_stop", 1.0)
    assert not record.user_error


# --------------------------------------------------------------------------- confirmation


def _bundled_tasks() -> list[Task]:
    return [t for env in BUNDLED for t in load_tasks(env)]


def test_the_oracles_confirmation_of_every_golden_call_gets_a_yes() -> None:
    tasks = _bundled_tasks()
    assert len(tasks) == 540  # 60 per bundled env
    for task in tasks:
        for golden in task.golden_calls:
            text = confirmation_request(golden)
            assert asks_confirmation(text), text
            assert proposal_matches(task, text), (task.id, text)


def _wrong_id(task: Task, value: str) -> str | None:
    """`value` with its number changed to one no argument, fact or instruction of `task` uses."""
    prefix, _, digits = value.rpartition("-")
    if not prefix or not digits.isdigit():
        return None
    used = task.model_dump_json()
    for n in range(1, 1000):
        candidate = f"{prefix}-{int(digits) + n}"
        if candidate not in used:
            return candidate
    return None


def test_a_confirmation_with_a_wrong_id_or_a_wrong_tool_gets_a_no() -> None:
    wrong_ids = wrong_tools = 0
    for task in _bundled_tasks():
        for golden in task.golden_calls:
            other = Call(name=f"delete_{golden.name}", arguments=golden.arguments)
            assert not proposal_matches(task, confirmation_request(other)), (task.id, other)
            wrong_tools += 1
            for key, value in golden.arguments.items():
                wrong = _wrong_id(task, value) if isinstance(value, str) else None
                if wrong is None:
                    continue
                bad = Call(name=golden.name, arguments={**golden.arguments, key: wrong})
                assert not proposal_matches(task, confirmation_request(bad)), (task.id, bad)
                wrong_ids += 1
    assert wrong_tools > 1000 and wrong_ids > 1000


async def test_the_scripted_user_answers_a_confirmation_as_its_intent_says() -> None:
    (task,) = [t for t in load_tasks(GYM) if t.id == "gym-0-00000"]
    user = ScriptedUser(task)
    right = confirmation_request(task.golden_calls[1])
    assert right == "I am about to freeze_membership with member_id=G-114. Shall I proceed? (yes/no)"
    for text, answer in [
        (right, CONFIRMED),
        (right.replace("G-114", "G-102"), DECLINED),
        (right.replace("freeze_membership", "cancel_membership"), DECLINED),
        ("Shall I freeze the membership of G-114?", CONFIRMED),
        ("Should I go ahead and freeze G-102?", DECLINED),
        ("Shall I proceed?", DECLINED),  # names nothing the user could check
    ]:
        reply = await user.reply([Message(role="user", content="hi"), say(text)])
        assert reply.text == answer, text
        assert not reply.stop


def test_a_question_for_a_fact_is_no_confirmation() -> None:
    """The labeled set's questions ask for facts, whatever their wording ("Which id should I
    use?", "Can you confirm the id for me?"): they get the fact, not a yes."""
    for question in FACT_QUESTIONS:
        assert not asks_confirmation(question), question
    assert asks_confirmation("I found member G-114. Is that correct?")
    assert asks_confirmation("Do you want me to freeze it (y/n)")


# --------------------------------------------------------------------------- the other replies


async def test_the_scripted_user_reacts_to_what_the_agent_said() -> None:
    (task,) = [t for t in load_tasks(GYM) if t.id == "gym-0-00000"]
    user = ScriptedUser(task)
    opening = Message(role="user", content="I want to freeze my membership.")

    async def reply(*turns: Message) -> UserReply:
        return await user.reply([opening, *turns])

    assert (await reply(say("What is your member id?"))).text == "My member id is G-114."
    assert (await reply(say("What is your date of birth?"))).text == "I don't know that, sorry."
    assert (await reply(say("Let me check that for you."))).text == "Okay, go ahead."
    assert (await reply(say("Is there anything else I can help you with?"))).stop
    assert (await reply(say("Your membership is frozen."))).stop
    # the question is the one of the last turn, not an earlier one with text
    asked, silent = say("What is your member id?"), say("")
    assert "still there" in (await reply(asked, call("get_member", member_id="G-114"), silent)).text


async def test_a_fact_is_asked_for_only_by_a_whole_word() -> None:
    """A short value inside another word is no question about it: asked for the email, a user
    whose state is "IL" answered "My state is IL." too (a fact nobody asked for)."""
    task = next(t for t in load_tasks(REPO / "envs" / "retail_orders") if t.id == "retail_orders-0-00018")
    user = ScriptedUser(task)
    user.facts = {"state": "IL", "email": "marcus.anderson@example.com"}
    opening = Message(role="user", content="Hello.")
    answer = (await user.reply([opening, say("What is your email address?")])).text
    assert answer == "My email is marcus.anderson@example.com.", answer
    answer = (await user.reply([opening, say("Which state (IL?) do you live in?")])).text
    assert answer == "My state is IL.", answer


async def test_nudges_are_counted_in_a_row_and_bounded() -> None:
    (task,) = [t for t in load_tasks(GYM) if t.id == "gym-0-00000"]
    user = ScriptedUser(task, max_nudges=2)
    opening = Message(role="user", content="hi")
    first = await user.reply([opening, say("")])
    spoke = await user.reply([opening, say("What is your member id?")])
    second = await user.reply([opening, say(".")])
    third = await user.reply([opening, say("  ")])
    last = await user.reply([opening, say("")])
    assert "still there" in first.text and "G-114" in spoke.text
    assert "still there" in second.text and "still there" in third.text and not third.agent_silent
    assert last.agent_silent and last.stop


@pytest.mark.parametrize("text", ["Done.", "OK", "Your membership G-114 is frozen.", "I can't do that."])
def test_a_turn_with_words_says_something(text: str) -> None:
    assert not says_nothing(text)


BARE_ANSWERS = ("42", "$1,250.00", "-3", "12.5%", "B-104", "2026-01-05", "10:30", "`7`", "**7**.", "Y", "no")


@pytest.mark.parametrize("text", BARE_ANSWERS)
async def test_attack_a_bare_value_is_heard_as_the_answer(text: str) -> None:
    """An agent asked for a figure that replies with the figure alone ("42", "$1,250.00") has
    answered: once heard as saying nothing (no word of two letters), nudged and then charged as
    silence, so a right answer given bare earned 0."""
    (task,) = [t for t in load_tasks(GYM) if t.id == "gym-0-00000"]
    assert not says_nothing(text)
    answer = await ScriptedUser(task).reply([Message(role="user", content="hi"), say(text)])
    assert answer.stop and not answer.agent_silent and "still there" not in answer.text


@pytest.mark.parametrize("kind", sorted(SILENT_TURNS))
def test_a_silent_turn_says_nothing(kind: str) -> None:
    assert says_nothing(SILENT_TURNS[kind])


def test_the_default_user_is_the_scripted_one() -> None:
    assert EvalConfig(agent="oracle").user == UserName.SCRIPTED
