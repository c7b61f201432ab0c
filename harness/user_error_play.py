"""Playing one labeled conversation for the user-error (MEU) set (`user_error_set.py` assembles it).

ERPO masks every trajectory the detector calls a user error, so a false alarm hides a real agent
failure from training and a miss punishes the agent for the user's fault. The set's conversations
are played here, with a truth known by construction:

- the agent side is the oracle that asks for the facts each golden call needs just before making it;
  its calls run for real on the task's initial state, so tool results are what the env returns;
- the user side is the `ScriptedUser` (its facts when asked, in varied words; it stops once the agent
  reports done);
- `clean` items are such conversations, and ones where the *agent* fails while the user behaves
  (gives up, claims done halfway, reports a write it never made, asks what the user cannot know,
  calls with a wrong id): the hard negatives a detector must not call user errors;
- every other item holds exactly one injected user error of one kind (`ERROR_KINDS`) at a place the
  seed draws, in one of several surface forms (ids, emails, dates, counts, enum words, free text),
  so rules are not graded on their own templates (the plans: `user_error_plans.py`). `error_at` is
  the index of the erring message.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from envforge.server import Fleet
from envforge.synth import Call, Fact, Task

from .records import Message, ToolCall
from .tasks import EnvTasks
from .users import STOP, TRANSFER, ScriptedUser, fact_text, request_text

Label = Literal["clean", "wrong_fact", "contradiction", "leak", "premature_stop", "invented_fact"]
TOOL_TEXT_CHARS = 160
"""Tool results are cut to this many characters: the set stays small, and a detector sees what it
would see of a long listing in a trimmed transcript."""


class LabeledConversation(BaseModel):
    """One item: a conversation and the truth about its user's behaviour."""

    model_config = ConfigDict(extra="forbid")

    env: str
    task_id: str
    label: Label
    variant: str
    error_at: int | None = None
    note: str = ""
    messages: list[Message]


# --------------------------------------------------------------------------- values


ID_RE = re.compile(r"^([A-Z]{1,4})-(\d+)$")
ISO_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]+$")
STEP_RE = re.compile(r"\s*\(step (\d+)\)$")


def base_name(name: str) -> str:
    """`car_id (step 3)` -> `car_id`: facts of one parameter used at several steps share it."""
    return STEP_RE.sub("", name)


def spoken_name(name: str) -> str:
    """How a user says a fact's name: `car_id (step 3)` -> `car id for step 3`."""
    step = STEP_RE.search(name)
    spoken = base_name(name).replace("_", " ")
    return f"{spoken} for step {step.group(1)}" if step else spoken


def spoken_date(iso: str) -> str:
    day = dt.date.fromisoformat(iso)
    return f"{day.strftime('%B')} {day.day}, {day.year}"


def other_id(ident: str, rng: random.Random, avoid: set[str]) -> str:
    prefix, digits = ID_RE.match(ident).groups()  # type: ignore[union-attr]
    for _ in range(50):
        n = int(digits) + rng.choice([-1, 1]) * rng.randint(1, 40)
        candidate = f"{prefix}-{max(n, 1):0{len(digits)}d}"
        if candidate not in avoid:
            return candidate
    return f"{prefix}-{int(digits) + 997}"


def other_value(value: Any, pool: Sequence[Any], rng: random.Random, avoid: set[str]) -> Any:
    """A valid-looking value of the same type and format as `value`, different from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return max(1, value + rng.choice([-1, 1]) * rng.randint(1, 3)) if value > 1 else value + 2
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        i = rng.randrange(len(value))
        return [*value[:i], other_value(value[i], [], rng, avoid | set(value)), *value[i + 1 :]]
    if not isinstance(value, str):
        return value
    if ID_RE.match(value):
        return other_id(value, rng, avoid)
    if ISO_DATE_RE.match(value):
        return (
            dt.date.fromisoformat(value) + dt.timedelta(days=rng.choice([-1, 1]) * rng.randint(1, 20))
        ).isoformat()
    if EMAIL_RE.match(value):
        local, domain = value.split("@", 1)
        return f"{local}{rng.randint(2, 99)}@{domain}" if rng.random() < 0.5 else f"{local[::-1]}@{domain}"
    if value.isdigit():
        return "".join(
            str((int(c) + rng.randint(1, 9)) % 10) if i >= len(value) - 2 else c for i, c in enumerate(value)
        )
    others = sorted({fact_text(p) for p in pool} - {value} - avoid)
    if others:
        return rng.choice(others)
    if value.isupper() and value.isalpha():
        return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in value)
    words = value.split()
    if len(words) == 1:
        return rng.choice(sorted({"pending", "standard", "other", "replaced", "closed"} - {value.lower()}))
    return " ".join([*words[:-1], rng.choice(["again", "later", "instead", "as well"])])


# --------------------------------------------------------------------------- the conversation


@dataclass
class Step:
    """One golden call and the facts the agent asks for just before making it."""

    call: Call
    ask: list[Fact]


def plan_steps(task: Task) -> list[Step]:
    given: set[str] = set()
    steps = []
    for call in task.golden_calls:
        used = {fact_text(v) for v in call.arguments.values()}
        ask = [f for f in task.scenario.known_facts if f.name not in given and fact_text(f.value) in used]
        given |= {f.name for f in ask}
        steps.append(Step(call, ask))
    return steps


QUESTIONS = (
    "Could you tell me your {names}?",
    "What is the {names}?",
    "To go on I need the {names}. What are they?",
    "Which {names} should I use?",
    "Can you confirm the {names} for me?",
)
PROGRESS = ("", "", "Thanks. ", "Got it. ", "I have looked that up. ", "That went through. ")
DONE = (
    "All done. {outputs}",
    "Everything is complete. {outputs}",
    "Done. {outputs}",
    "I have finished all the steps you asked for. {outputs}",
    "All done. {outputs} Is there anything else I can help you with?",
    "Everything is complete. {outputs} Can I help you with something else?",
)
THANKS = (f"Thank you. {STOP}", f"Great, thanks for your help! {STOP}", f"Perfect. {STOP}", STOP)


def say_facts(facts: Sequence[tuple[str, Any]], rng: random.Random) -> str:
    """A truthful answer naming `facts`, in one of several shapes."""
    pairs = [(spoken_name(n), fact_text(v)) for n, v in facts]
    form = rng.randrange(5)
    if len(pairs) == 1 and form == 0:
        return f"It's {pairs[0][1]}."
    if len(pairs) == 1 and form == 1:
        return pairs[0][1]
    if form == 2:
        return "Sure: " + ", ".join(f"{n} {v}" for n, v in pairs) + "."
    if form == 3:
        return "\n".join(f"{n}: {v}" for n, v in pairs)
    return " ".join(f"My {n} is {v}." for n, v in pairs)


@dataclass
class Plan:
    """How one conversation departs from the clean one.

    `user_at(slot, default)` gives the user's text at each of its turns (slot 0: the opening; the
    last slot: its reply to the agent's closing message); `agent_at(slot, default)` the agent's
    text just before that slot. `stop_after` ends the agent's work after that many golden calls,
    closing with `final_text`; `call_values` replaces argument values in the calls that follow
    slot `values_from` (the agent using what the user said).
    """

    label: Label = "clean"
    variant: str = "full"
    note: str = ""
    user_at: Callable[[int, str, list[Fact]], str] = lambda slot, default, asked: default
    agent_at: Callable[[int, str], str] = lambda slot, default: default
    stop_after: int | None = None
    final_text: str | None = None
    call_values: dict[str, Any] = field(default_factory=dict)
    values_from: int = 0
    extra_calls: dict[int, Call] = field(default_factory=dict)
    leaked: str = ""
    """A leak's volunteered value (the set keeps the item only if the agent had not said it yet)."""
    error_slot: int | None = None
    """The slot of the injected error (its message index is recorded as `error_at`)."""


class Conversation:
    """Messages as the orchestrator would record them, built turn by turn with real tool calls."""

    def __init__(self, fleet: Fleet, episode_id: str) -> None:
        self.fleet, self.episode_id = fleet, episode_id
        self.messages: list[Message] = []
        self.turn = 0
        self.calls = 0

    def _agent_turn(self) -> None:
        if self.messages and self.messages[-1].role == "user":
            self.turn += 1

    async def call(self, call: Call) -> None:
        self._agent_turn()
        self.calls += 1
        tc = ToolCall(id=f"call_{self.calls}", name=call.name, arguments=call.arguments)
        self.messages.append(Message(role="assistant", tool_calls=[tc], turn=self.turn))
        result = await self.fleet.call(self.episode_id, call.name, call.arguments)
        text = result.text if len(result.text) <= TOOL_TEXT_CHARS else result.text[:TOOL_TEXT_CHARS] + "…"
        self.messages.append(
            Message(role="tool", content=text, tool_call_id=tc.id, is_error=result.is_error, turn=self.turn)
        )

    def say(self, text: str) -> None:
        self._agent_turn()
        self.messages.append(Message(role="assistant", content=text, turn=self.turn))

    def user(self, text: str) -> int:
        self.messages.append(Message(role="user", content=text, turn=self.turn))
        return len(self.messages) - 1


def _substituted(call: Call, values: dict[str, Any]) -> Call:
    args = {k: values.get(fact_text(v), v) for k, v in call.arguments.items()}
    return Call(name=call.name, arguments=args)


async def play(et: EnvTasks, fleet: Fleet, task: Task, plan: Plan, rng: random.Random) -> LabeledConversation:
    """Plays `plan` on `task` against a fresh episode and returns the labeled conversation."""
    episode = await fleet.create_episode(et.env.name, state=et.initial_state(task) if task.setup else None)
    convo = Conversation(fleet, episode.id)
    scripted = ScriptedUser(task, max_turns=1000)
    error_at: int | None = None

    def user(slot: int, default: str, asked: list[Fact]) -> bool:
        nonlocal error_at
        text = plan.user_at(slot, default, asked)
        index = convo.user(text)
        if slot == plan.error_slot:
            error_at = index
        return STOP in text or TRANSFER in text

    try:
        if user(0, request_text(task), []):
            return _item(task, plan, convo, error_at)
        slot = 1
        for i, step in enumerate(plan_steps(task)):
            if plan.stop_after == i:
                break
            if step.ask:
                names = " and ".join(spoken_name(f.name) for f in step.ask)
                question = rng.choice(PROGRESS) * (i > 0) + rng.choice(QUESTIONS).format(names=names)
                convo.say(plan.agent_at(slot, question))
                said = convo.messages[-1].content or ""
                if "?" in said:
                    literal = (await scripted.reply(convo.messages)).text
                    pairs = [(f.name, f.value) for f in step.ask]
                    default = literal if rng.random() < 0.4 else say_facts(pairs, rng)
                else:  # the agent made a statement: the scripted user would stop here
                    default = rng.choice(THANKS)
                if user(slot, default, step.ask):
                    return _item(task, plan, convo, error_at)
                slot += 1
            if i in plan.extra_calls:
                await convo.call(plan.extra_calls[i])
            values = plan.call_values if slot > plan.values_from else {}
            await convo.call(_substituted(step.call, values))
        outputs = " ".join(f"{o}." for o in task.required_outputs)
        final = plan.final_text or rng.choice(DONE).format(outputs=outputs).strip()
        convo.say(final)
        user(slot, rng.choice(THANKS), [])
        return _item(task, plan, convo, error_at)
    finally:
        await fleet.close_episode(episode.id)


def _item(task: Task, plan: Plan, convo: Conversation, error_at: int | None) -> LabeledConversation:
    if plan.label != "clean" and error_at is None:
        raise ValueError(f"{task.id}: the {plan.label} plan never reached its error slot {plan.error_slot}")
    return LabeledConversation(
        env=task.env,
        task_id=task.id,
        label=plan.label,
        variant=plan.variant,
        error_at=error_at,
        note=plan.note,
        messages=convo.messages,
    )
