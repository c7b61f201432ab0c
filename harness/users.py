"""Simulated users: who the agent talks to. They know the task's scenario, never the answers.

A user opens the conversation (`start`) and answers each agent message (`reply`). Ending is said
in-band with τ-bench's control tokens: `###STOP###` (satisfied, or giving up) and
`###TRANSFER###` (asked to be handed to a human).

- `ScriptedUser`: deterministic and offline. It states the request, answers a question with the
  facts whose names (or values) the question mentions, says it does not know anything else
  (it never invents a fact), and stops when the agent's message is a statement rather than a
  question (the agent reports done) or after `max_turns` replies; a statement announcing more work
  ("let me check that") gets "Okay, go ahead.", so an agent that talks instead of acting is not
  let off by a stop the user-error detector would blame on the user. `lies` makes it state wrong
  values for some facts: the fault the user-error detector must catch.
- `LLMUser`: a model playing the persona, given the instruction and the facts with the rule to
  reveal them only when asked.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envforge.synth import ANSWERS_LINE, KNOWN_FACTS_LINE, Task

from .llm import LLMConfig, add_usage, complete
from .records import Message, Usage
from .vocab import ControlToken, UserName

STOP = ControlToken.STOP
TRANSFER = ControlToken.TRANSFER

ANNOUNCE = re.compile(
    r"\b(let me (?!know)\w+|next,? i(?:'ll| will)|now i(?:'ll| will| am going to|'m going to)"
    r"|i(?:'m| am) going to|i(?:'ll| will) now|one moment|hold on|give me a (?:moment|second|minute)"
    r"|please wait|bear with me)",
    re.I,
)
CLOSING = re.compile(
    r"\b(done|complete[d]?|finished|all set|sorry|unable|cannot|can't|couldn't|not able|transfer)", re.I
)


def announces_more_work(text: str) -> bool:
    """An agent message that says more is coming ("let me check...") and claims no ending."""
    return bool(ANNOUNCE.search(text)) and not CLOSING.search(text)


@dataclass
class UserReply:
    text: str
    usage: Usage = field(default_factory=Usage)

    @property
    def stop(self) -> bool:
        return STOP in self.text

    @property
    def transfer(self) -> bool:
        return TRANSFER in self.text


@runtime_checkable
class User(Protocol):
    async def start(self) -> UserReply: ...

    async def reply(self, messages: list[Message]) -> UserReply: ...


def fact_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return json.dumps(value)


def request_text(task: Task) -> str:
    """The instruction as the user says it: without the hidden-facts and must-be-told lines."""
    values = tuple(v for v in (fact_text(f.value) for f in task.scenario.known_facts) if v)
    return _request_text(task.scenario.instruction, values)


@functools.lru_cache(maxsize=4096)  # an instruction of a few hundred characters: ~2 MB at most
def _request_text(instruction: str, values: tuple[str, ...]) -> str:
    """`request_text` of an instruction and its fact values. Remembered: every trial of a task asks
    for it three times (the user's two prompts, the user-error rules), and the rewrite compiles a
    pattern of the task's values and runs ten substitutions (~0.4 ms a trial at 2,048 in flight)."""
    lines = [
        line for line in instruction.splitlines() if not line.startswith((KNOWN_FACTS_LINE, ANSWERS_LINE))
    ]
    return _first_person("\n".join(lines), list(values)).strip()


# The scenario speaks to the user ("You want to …", "your loans", "assign it to yourself"); the
# user says it of themselves. Longest forms first, so "yourself" is not read as "your" + "self".
_SECOND_TO_FIRST = (
    (re.compile(r"You want the agent to do the following"), "I need help with the following"),
    (re.compile(r"\bYou (also )?want to\b"), r"I \1want to"),
    (re.compile(r"([;,] (?:if not, )?)you want to\b"), r"\1I want to"),
    (re.compile(r"\byourself\b"), "myself"),
    (re.compile(r"\bYour\b"), "My"),
    (re.compile(r"\byour\b"), "my"),
    (re.compile(r"\b(by|to|for|with) you\b"), r"\1 me"),
    (re.compile(r"\bis you\b"), "is me"),
    (re.compile(r"\bhave you as\b"), "have me as"),
    (re.compile(r"\bwhat you hear back when you\b"), "what I hear back when I"),
)
_QUOTED = re.compile(r'"[^"\n]*"')


def _first_person(text: str, values: list[str]) -> str:
    """`text` with the scenario's second person turned into the user's first; a quoted span or a
    value the user gives (as a whole word: "our" is no value inside "yourself") is left exactly
    as it is (a ticket body may well say "your")."""
    kept = sorted({m.group(0) for m in _QUOTED.finditer(text)} | set(values), key=len, reverse=True)
    spans = (
        re.compile(
            "|".join(
                rf"(?<!\w){re.escape(k)}(?!\w)" if k[:1].isalnum() or k[-1:].isalnum() else re.escape(k)
                for k in kept
            )
        )
        if kept
        else None
    )
    out, at = [], 0
    for m in spans.finditer(text) if spans else ():
        out.append(_swap(text[at : m.start()]))
        out.append(m.group(0))
        at = m.end()
    out.append(_swap(text[at:]))
    return "".join(out)


def _swap(text: str) -> str:
    for pattern, first in _SECOND_TO_FIRST:
        text = pattern.sub(first, text)
    return text


class ScriptedUser:
    def __init__(self, task: Task, *, max_turns: int = 10, lies: dict[str, Any] | None = None) -> None:
        self.task = task
        self.max_turns = max_turns
        self.turns = 0
        self.facts = {f.name: f.value for f in task.scenario.known_facts}
        self.facts.update(lies or {})
        self.told: set[str] = set()

    async def start(self) -> UserReply:
        return UserReply(request_text(self.task))

    def _asked(self, text: str) -> list[str]:
        low = text.lower()
        return [
            name
            for name, value in self.facts.items()
            if name.lower() in low or name.replace("_", " ").lower() in low or fact_text(value).lower() in low
        ]

    async def reply(self, messages: list[Message]) -> UserReply:
        self.turns += 1
        said = next((m.content or "" for m in reversed(messages) if m.role == "assistant" and m.content), "")
        if self.turns <= self.max_turns and "?" not in said and announces_more_work(said):
            return UserReply("Okay, go ahead.")
        if self.turns > self.max_turns or "?" not in said:
            return UserReply(f"Thank you. {STOP}")
        asked = self._asked(said)
        if not asked:
            return UserReply("I don't know that, sorry.")
        return UserReply(" ".join(f"My {n.replace('_', ' ')} is {fact_text(self.facts[n])}." for n in asked))


USER_SYSTEM = """You are a user talking to a customer-service agent. Stay in character.
Persona: {persona}

Your goal (follow it, one step at a time, in your own words):
{instruction}

Facts you know (give one only when the agent asks for it; never invent other facts):
{facts}

Write only what the user says next, in one or two sentences. Start by telling the agent what you
want. Only once your goal is reached, or cannot be reached, reply with exactly {stop}. If the
agent transfers you to a human, reply with exactly {transfer}."""

USER_OPENING = """You are a customer talking to a customer-service agent, not the agent.
Persona: {persona}

Your goal:
{instruction}

Facts you know (give one only when the agent asks for it; never invent other facts):
{facts}

The agent has just greeted you. Write your first message to the agent: in one or two sentences, in
the first person, say what you want. Do not offer help: you are the one asking for it."""
"""The opening turn's prompt: no control tokens, since there is nothing to end yet. Given the full
prompt, Qwen2.5-Coder-0.5B answered the greeting with `### STOP###` every time, nudged or not."""

OPENING_NUDGE = (
    "(You have not said anything yet: the agent is waiting. Tell the agent, in your own words, "
    "what you want.)"
)
"""Sent once when a model opens with the stop token or nothing: small models (Qwen2.5-Coder-0.5B)
copy the last control token of their prompt as their first words, ending a conversation that never
began."""

_LOOSE_CONTROL = re.compile(r"#{2,}\s*(STOP|TRANSFER)\s*#{2,}", re.IGNORECASE)


def normalize_control(text: str) -> str:
    """`### STOP###`, `##stop##` and the like as the control token they stand for: a model that
    writes one means it, and a near miss would otherwise let the conversation run on."""
    return _LOOSE_CONTROL.sub(lambda m: f"###{m.group(1).upper()}###", text)


class LLMUser:
    """A model simulating the user; the agent's messages are its 'user' turns."""

    def __init__(self, task: Task, cfg: LLMConfig) -> None:
        self.task = task
        self.cfg = cfg
        facts = (
            "\n".join(f"- {f.name}: {fact_text(f.value)}" for f in task.scenario.known_facts) or "- (none)"
        )
        self.system = USER_SYSTEM.format(
            persona=task.scenario.persona,
            instruction=request_text(task),
            facts=facts,
            stop=STOP,
            transfer=TRANSFER,
        )
        self.opening = USER_OPENING.format(
            persona=task.scenario.persona, instruction=request_text(task), facts=facts
        )

    async def _ask(self, history: list[dict[str, Any]], system: str | None = None) -> UserReply:
        prompt = [{"role": "system", "content": system or self.system}, *history]
        message, usage = await complete(self.cfg, prompt)
        return UserReply(normalize_control((message.content or "").strip()) or STOP, usage)

    async def start(self) -> UserReply:
        """The opening message, asked for with `USER_OPENING`. One that ends the conversation before
        it began (the stop token, or nothing) is asked for again, once, with a nudge; the second
        answer stands, whatever it is."""
        greeting: list[dict[str, Any]] = [{"role": "user", "content": "Hi! How can I help you today?"}]
        first = await self._ask(greeting, self.opening)
        if not first.stop:
            return first
        nudged = [{"role": "user", "content": f"{greeting[0]['content']}\n{OPENING_NUDGE}"}]
        again = await self._ask(nudged, self.opening)
        both = {"user": first.usage}
        add_usage(both, "user", again.usage)
        again.usage = both["user"]
        return again

    async def reply(self, messages: list[Message]) -> UserReply:
        # Roles flipped: what the agent said is this model's input; tool traffic is invisible to users.
        history: list[dict[str, Any]] = [{"role": "user", "content": "Hi! How can I help you today?"}]
        for m in messages:
            if m.role == "user":
                history.append({"role": "assistant", "content": m.content or ""})
            elif m.role == "assistant" and m.content:
                history.append({"role": "user", "content": m.content})
        return await self._ask(history)


def build_user(spec: str, task: Task, *, llm: LLMConfig | None = None, max_turns: int = 10) -> User:
    if spec == UserName.SCRIPTED:
        return ScriptedUser(task, max_turns=max_turns)
    return LLMUser(task, llm or LLMConfig(model=spec))
