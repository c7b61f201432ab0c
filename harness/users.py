"""Simulated users: who the agent talks to. They know the task's scenario, never the answers.

A user opens the conversation (`start`) and answers each agent message (`reply`). Ending is said
in-band with τ-bench's control tokens: `###STOP###` (satisfied, or giving up) and
`###TRANSFER###` (asked to be handed to a human).

- `ScriptedUser`: deterministic and offline, the person of the task reacting to the agent's last
  turn (the last assistant message; what earlier turns said is never answered again):
  - a turn that says nothing to the user (`says_nothing`: empty, only whitespace or punctuation,
    a call written as text that did not parse, code or JSON with no word around it; a bare value,
    "42" or "$1,250.00", says something) gets a nudge,
    "Are you still there? <the request>"; after `max_nudges` such turns in a row (2) the user
    gives up (`UserReply.agent_silent`): the conversation ends as the agent's failure
    (`no_response`, reward 0), never as a user stop;
  - a confirmation request (`asks_confirmation`: a yes/no question asking consent, "shall I",
    "should I", "do you want me to", "would you like me to", "proceed", "go ahead", "is that
    correct", "confirm that/this/whether/if", or a "(yes/no)" / "(y/n)" marker) gets
    "Yes, please go ahead." when the proposal matches the task (`proposal_matches`) and
    "No, that is not what I want." otherwise;
  - a question names facts (by name or value) and gets them; a closing offer ("anything else I
    can help you with?") ends the conversation; any other question gets "I don't know that,
    sorry." (it never invents a fact);
  - a statement announcing more work ("let me check that") gets "Okay, go ahead."; any other
    statement with words in it is the agent's report (done, or refused) and ends the conversation,
    as does running past `max_turns` replies.
  `lies` makes it state wrong values for some facts: the fault the user-error detector must catch.
- `LLMUser`: a model playing the persona, given the instruction and the facts with the rule to
  reveal them only when asked.

In a dual-control env the trial binds a `UserToolbox` to its user (`bind_toolbox`): the scripted
user then plays the task's golden user calls, a run of them at a time (`user_tools.user_runs`),
each only when the agent asks it to act (the oracle's `user_action_request`, or a turn naming the
run's first tool), never unasked, and says what it saw; the LLM user
gets its tools as function tools and calls them as it sees fit, before each thing it says.

A proposal *matches* when it names at least one thing the task uses and nothing it does not,
judged only from what the user holds (the task's golden calls and known facts, its instruction):
every tool-like name (a `snake_case` word not followed by `=`) is one of the golden calls'
tools; every `key=value` pair is an argument of one golden call (of a named tool, when one is
named), the value written as `confirmation_request` writes it, all pairs of the same call; every
id (`G-114`) or email is among the golden calls' argument values, the facts or the instruction.
An action described only in words ("cancel it") is not judged: its ids decide.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envforge.synth import ANSWERS_LINE, KNOWN_FACTS_LINE, Call, Task, leaf_values, plain_value

from .idle_loop import only_closing
from .llm import LLMConfig, add_usage, complete
from .records import Message, Usage
from .user_tools import USER_ACTION, UserToolbox, is_user_call, results_text, user_runs
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
    agent_silent: bool = False
    """The user gives up on an agent that kept saying nothing: the conversation ends as the agent's
    failure (`TrialStatus.NO_RESPONSE`), not as the user's stop."""

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


# --------------------------------------------------------------------------- reading the agent's turn

_FENCED = re.compile(r"```.*?(?:```|$)", re.S)
_TAG_LIKE = re.compile(r"<[^<>\n]*>")
_CALL_LIKE = re.compile(r"[A-Za-z_][\w.]*\(")
_IDENTIFIER = re.compile(r"\S*_\S*")
_WORD = re.compile(r"[^\W\d_]{2,}")


def _without_structures(text: str) -> str:
    """`text` without its JSON-like spans: each `{...}` / `[...]` and each `name(...)` call, to
    its matching closer or, cut off, to the end (brackets inside quoted strings do not count)."""
    out: list[str] = []
    depth, quote, escaped = 0, "", False
    i = 0
    while i < len(text):
        c = text[i]
        if depth == 0:
            call = _CALL_LIKE.match(text, i)
            if call and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                depth, i = 1, call.end()
                continue
            if c in "{[":
                depth = 1
            else:
                out.append(c)
        elif quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
        i += 1
    return "".join(out)


_VALUE = (
    r"(?:[-+]?[$€£]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?"  # 42, -3, $1,250.00, 12.5%
    r"|\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2})?)?|\d{1,2}:\d{2}(?::\d{2})?"  # dates, times
    r"|[A-Za-z]{1,4}-?\d+(?:-\d+)*"  # ids: B-104, W123, P-104-2
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # emails
    r"|yes|no|y|n|true|false)"
)
_BARE_VALUES = re.compile(rf"{_VALUE}(?:(?:\s*[,;/&]\s*|\s+){_VALUE})*", re.I)
_VALUE_WRAPPING = "\"'`*_.,;:!()[]<> \t\r\n"
MAX_BARE_ANSWER = 64
"""Characters a reply of values alone may run to: an answer, not a dump of a table."""


def states_a_value(text: str) -> bool:
    """Whether an agent turn is a short answer made of values alone: a number or an amount (`42`,
    `$1,250.00`), an id (`B-104`), a date or time, an email, or a yes/no, bare, in quotes or
    backticks, or a few of them in a list. It has no word of two letters around it, yet a person
    asking for a figure hears it as the answer."""
    core = text.strip(_VALUE_WRAPPING)
    return 0 < len(core) <= MAX_BARE_ANSWER and _BARE_VALUES.fullmatch(core) is not None


def says_nothing(text: str | None) -> bool:
    """Whether an agent turn says nothing a person could answer: empty, only whitespace or
    punctuation, or nothing but code: fenced blocks, tags, JSON, `name(...)` calls and
    `snake_case` identifiers, closed or cut off (a call written as text that did not parse).

    Judged by what is left once those are taken out: a turn with a word of two letters or more
    in it ("Done.", "OK") says something, and so does a bare answer (`states_a_value`: "42",
    "$1,250.00", "B-104"), which has none."""
    if not text or not text.strip():
        return True
    if states_a_value(text):
        return False
    rest = _without_structures(_TAG_LIKE.sub(" ", _FENCED.sub(" ", text)))
    return _WORD.search(_IDENTIFIER.sub(" ", rest)) is None


CONSENT = re.compile(
    r"\b(?:shall i|should i|do you want me to|would you like me to|proceed|go ahead"
    r"|is (?:that|this|it) (?:correct|right|ok|okay|alright|what you want)"
    r"|confirm (?:that|this|whether|if|you want)|do you confirm|are you sure)\b",
    re.I,
)
YES_NO = re.compile(r"\((?:yes/no|y/n|yes or no)\)", re.I)
_WH = re.compile(r"^\W*(?:what|which|who|whom|whose|where|when|how|why)\b", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
CLOSING_OFFER = re.compile(r"\b(?:anything else|something else|else i can)\b", re.I)
"""A question that closes the conversation ("Anything else I can help you with?")."""

CONFIRMED = "Yes, please go ahead."
DECLINED = "No, that is not what I want."


def asks_confirmation(text: str) -> bool:
    """Whether an agent turn asks the user's consent: a `(yes/no)` / `(y/n)` marker, or a yes/no
    question (a sentence ending in `?` that does not open with a wh-word: "Which id should I
    use?" asks for a fact) with a consent cue (`CONSENT`)."""
    if YES_NO.search(text):
        return True
    return any(
        s.rstrip().endswith("?") and CONSENT.search(s) and not _WH.match(s) for s in _SENTENCE_END.split(text)
    )


def confirmation_request(call: Call) -> str:
    """The message an agent following a confirmation rule sends before `call`:
    `I am about to <tool> with <k>=<v>, ....  Shall I proceed? (yes/no)`; the scripted user
    confirms it exactly when `call` is one of its task's golden calls."""
    args = ", ".join(f"{k}={plain_value(v)}" for k, v in call.arguments.items())
    return f"I am about to {call.name}{f' with {args}' if args else ''}. Shall I proceed? (yes/no)"


_SNAKE = re.compile(r"(?<![\w.@-])([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)(?![\w@-]|\.\w|\s*=)")
_PAIR = re.compile(r"(?<![\w-])([A-Za-z_]\w*)=")
_ENTITY = re.compile(r"\b[A-Z]{1,4}-\d+\b|\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_VALUE_END = re.compile(r"(?:$|[\s,;)]|\.(?!\w))")


def _strings_in(value: Any) -> Iterator[str]:
    """Every value inside `value` as text: strings and numbers, in lists and objects too."""
    return (plain_value(v) for v in leaf_values(value))


@dataclass(frozen=True)
class _Intent:
    """What the user knows of its own request: the golden calls, the facts and the instruction."""

    calls: tuple[Call, ...]
    tools: frozenset[str]
    words: frozenset[str]
    """Names that are no tool: argument keys, fact names, values written as identifiers."""
    values: frozenset[str]
    instruction: str

    @classmethod
    def of(cls, task: Task) -> _Intent:
        calls = tuple(task.golden_calls)
        values = {s for c in calls for s in _strings_in(c.arguments)}
        values |= {s for f in task.scenario.known_facts for s in (fact_text(f.value), *_strings_in(f.value))}
        keys = {k for c in calls for k in c.arguments} | {f.name for f in task.scenario.known_facts}
        return cls(
            calls,
            frozenset(c.name for c in calls),
            frozenset(keys | values),
            frozenset(values),
            task.scenario.instruction,
        )

    def _pairs_fit(self, text: str, call: Call) -> bool:
        """Whether every `key=value` in `text` is an argument of `call`, written as
        `plain_value` writes it (a pair inside an earlier pair's value is part of that value)."""
        covered = 0
        for m in _PAIR.finditer(text):
            if m.start() < covered:
                continue
            key, rest = m.group(1), text[m.end() :]
            if key not in call.arguments:
                return False
            value = plain_value(call.arguments[key])
            if not (rest.startswith(value) and _VALUE_END.match(rest, len(value))):
                return False
            covered = m.end() + len(value)
        return True

    def matches(self, text: str) -> bool:
        """`proposal_matches`: names something the task uses and nothing it does not."""
        named_tools = set()
        for m in _SNAKE.finditer(text):
            name = m.group(1)
            if name in self.tools:
                named_tools.add(name)
            elif name not in self.words:
                return False  # a tool (or field) the task never uses
        candidates = [c for c in self.calls if not named_tools or c.name in named_tools]
        fitting = [c for c in candidates if self._pairs_fit(text, c)]
        if not fitting:
            return False
        pairs = bool(_PAIR.search(text))
        entities = [m.group(0) for m in _ENTITY.finditer(text)]
        for entity in entities:
            if entity not in self.values and not re.search(
                rf"(?<![\w-]){re.escape(entity)}(?![\w-])", self.instruction
            ):
                return False
        return bool(named_tools or pairs or entities)


def proposal_matches(task: Task, text: str) -> bool:
    """Whether the action an agent proposes in `text` is one the task's user wants (the rule is
    in the module docstring)."""
    return _Intent.of(task).matches(text)


def last_agent_turn(messages: list[Message]) -> str:
    """What the agent said in its last turn: the text of the last assistant message ("" when it
    had none: an earlier message's text is not this turn's)."""
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    return (last.content or "") if last is not None else ""


NUDGE = "Are you still there? {request}"
GIVE_UP = f"You have not answered me, so I will stop here. {STOP}"


def _mentions(text: str, phrase: str) -> bool:
    """Whether `phrase` stands in `text` as a whole word (no letter or digit glued to either end)."""
    if not phrase:
        return False
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?![a-z0-9])", text) is not None


class ScriptedUser:
    def __init__(
        self, task: Task, *, max_turns: int = 10, max_nudges: int = 2, lies: dict[str, Any] | None = None
    ) -> None:
        self.task = task
        self.max_turns = max_turns
        self.max_nudges = max_nudges
        self.turns = 0
        self.nudges = 0
        self.facts = {f.name: f.value for f in task.scenario.known_facts}
        self.facts.update(lies or {})
        self.told: set[str] = set()
        self.intent = _Intent.of(task)
        self.toolbox: UserToolbox | None = None
        self.runs = user_runs(task)
        self.played = 0  # how many of `runs` the user has played

    async def start(self) -> UserReply:
        return UserReply(request_text(self.task))

    def _asked_to_act(self, said: str) -> bool:
        """Whether the agent's turn asks the user to act on their device: the oracle's hand-over,
        or a turn naming the first tool of the user's next golden run."""
        if self.toolbox is None or self.played >= len(self.runs):
            return False
        first = self.task.golden_calls[self.runs[self.played][0]]
        return said.startswith(USER_ACTION) or _mentions(said.lower(), first.name.lower())

    async def _play(self) -> str:
        """Play the user's next run of golden calls on their device; what they saw."""
        assert self.toolbox is not None
        start, end = self.runs[self.played]
        self.played += 1
        seen = []
        for call in self.task.golden_calls[start:end]:
            seen.append((call.name, await self.toolbox.call(call.name, call.arguments)))
        return results_text(seen)

    def _asked(self, text: str) -> list[str]:
        """The facts a question names, by name or by value, each as a whole word: "IL" (a state)
        is not asked for by a question about the "email"."""
        low = text.lower()
        return [
            name
            for name, value in self.facts.items()
            if any(
                _mentions(low, phrase)
                for phrase in (name.lower(), name.replace("_", " ").lower(), fact_text(value).lower())
            )
        ]

    async def reply(self, messages: list[Message]) -> UserReply:
        self.turns += 1
        said = last_agent_turn(messages)
        if self.turns > self.max_turns:
            return UserReply(f"Thank you. {STOP}")
        if says_nothing(said):
            self.nudges += 1
            if self.nudges > self.max_nudges:
                return UserReply(GIVE_UP, agent_silent=True)
            return UserReply(NUDGE.format(request=request_text(self.task)))
        self.nudges = 0
        if self._asked_to_act(said):
            return UserReply(await self._play())
        if asks_confirmation(said):
            return UserReply(CONFIRMED if self.intent.matches(said) else DECLINED)
        if "?" not in said:
            return UserReply("Okay, go ahead." if announces_more_work(said) else f"Thank you. {STOP}")
        asked = self._asked(said)
        if asked:
            return UserReply(
                " ".join(f"My {n.replace('_', ' ')} is {fact_text(self.facts[n])}." for n in asked)
            )
        if CLOSING_OFFER.search(said):
            return UserReply(f"No, that is all. Thank you. {STOP}")
        return UserReply("I don't know that, sorry.")


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

OFFERS_HELP = re.compile(
    r"\b(?:i(?:'d| would) be (?:happy|glad) to (?:help|assist)|i can help|i'm here to help|i am here to help"
    r"|how (?:can|may) i (?:help|assist)|what can i do for you|happy to assist|to help you"
    r"|sorry to hear|provide me with)\b",
    re.I,
)
"""An opening in the agent's voice: Qwen2.5-Coder-0.5B, shown the greeting, answered as the agent
("Hello! I'd be happy to help you ...") in 9 of 9 openings (docs/benchmarks/local-models.md), and
beside a local agent with "Hello! I'm sorry to hear that you're having trouble with your
membership. To help you, could you please provide ..."."""


def speaks_as_agent(text: str) -> bool:
    """An opening that asks for nothing: it offers help (`OFFERS_HELP`), or only thanks, closes
    or refuses (`idle_loop.only_closing`: "I'm sorry, but I can't assist with that.")."""
    return bool(OFFERS_HELP.search(text)) or only_closing(text)


TURN_REMINDER = (
    "(You are the customer. If what you wanted is done, or cannot be done, reply with exactly "
    f"{ControlToken.STOP} and nothing else.)"
)
"""Put after an agent message that asks nothing: the rule to stop, where a small model attends.
Given it only in the system prompt, Qwen2.5-Coder-0.5B echoed the agent's "All done." back until
the turn limit in 8 of 9 conversations (docs/benchmarks/local-models.md)."""

QUESTION_REMINDER = "(You are the customer: answer the agent's question. Say yes if it offers what you want.)"
"""Put after an agent message that asks something: with the stop rule there instead, the same
model answered the agent's consent requests with the stop token, 6 of 6 times."""

_LOOSE_CONTROL = re.compile(r"#{2,}\s*(STOP|TRANSFER)\s*#{2,}", re.IGNORECASE)


def normalize_control(text: str) -> str:
    """`### STOP###`, `##stop##` and the like as the control token they stand for: a model that
    writes one means it, and a near miss would otherwise let the conversation run on."""
    return _LOOSE_CONTROL.sub(lambda m: f"###{m.group(1).upper()}###", text)


USER_TOOLS_NOTE = """

You can act on your own device with the tools you are given (the agent cannot). When the agent asks
you to do or check something on your device, call the tool for it, then tell the agent what you
saw."""

MAX_USER_CALLS = 16
"""Tool calls an LLM user may make before each thing it says (a model that loops is cut off)."""


class LLMUser:
    """A model simulating the user; the agent's messages are its 'user' turns. In a dual-control
    env it also has its device's tools (`toolbox`), which it calls before it speaks."""

    def __init__(self, task: Task, cfg: LLMConfig) -> None:
        self.task = task
        self.cfg = cfg
        self.toolbox: UserToolbox | None = None
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
        box = self.toolbox
        system = system or self.system
        if box is not None:
            system += USER_TOOLS_NOTE
        prompt = [{"role": "system", "content": system}, *history]
        if box is None:
            message, usage = await complete(self.cfg, prompt)
            return UserReply(normalize_control((message.content or "").strip()) or STOP, usage)
        spent: dict[str, Usage] = {}
        for _ in range(MAX_USER_CALLS + 1):
            message, usage = await complete(self.cfg, prompt, tools=box.tools)
            add_usage(spent, "user", usage)
            if not message.tool_calls:
                break
            prompt.append(_as_user_turn(message))
            for call in message.tool_calls:
                result = await box.call(call.name, call.arguments)
                prompt.append(_tool_result(call.id, result.content))
        return UserReply(
            normalize_control((message.content or "").strip()) or STOP, spent.get("user", Usage())
        )

    async def start(self) -> UserReply:
        """The opening message, asked for with `USER_OPENING`. One that ends the conversation before
        it began (the stop token, or nothing) or speaks as the agent (`speaks_as_agent`) is asked
        for again, once, with a nudge. A second answer still in the agent's voice is replaced by
        the request as the scripted user words it (`request_text`): Qwen2.5-Coder-0.5B, nudged,
        opened with "I'm sorry, but I can't assist with that." or the greeting itself in 9 of 9
        conversations. Any other second answer stands, the stop token included."""
        greeting: list[dict[str, Any]] = [{"role": "user", "content": "Hi! How can I help you today?"}]
        first = await self._ask(greeting, self.opening)
        if not first.stop and not speaks_as_agent(first.text):
            return first
        nudged = [{"role": "user", "content": f"{greeting[0]['content']}\n{OPENING_NUDGE}"}]
        again = await self._ask(nudged, self.opening)
        both = {"user": first.usage}
        add_usage(both, "user", again.usage)
        again.usage = both["user"]
        if speaks_as_agent(again.text):  # the agent's voice twice: the request as the scripted user says it
            again.text = request_text(self.task)
        return again

    async def reply(self, messages: list[Message]) -> UserReply:
        # Roles flipped: what the agent said is this model's input; tool traffic is invisible to users.
        # The user's own tool calls are its own turns (it sees them and their results).
        history: list[dict[str, Any]] = [{"role": "user", "content": "Hi! How can I help you today?"}]
        mine = False
        for m in messages:
            if is_user_call(m):
                history.append(_as_user_turn(m))
                mine = True
                continue
            if m.role == "tool":
                if mine:
                    history.append(_tool_result(m.tool_call_id, m.content))
                continue
            mine = False
            if m.role == "user":
                history.append({"role": "assistant", "content": m.content or ""})
            elif m.role == "assistant" and m.content:
                history.append({"role": "user", "content": m.content})
        if history[-1]["role"] == "user":  # the agent's last message, then what to do with it
            said = history[-1]["content"]
            reminder = QUESTION_REMINDER if "?" in said else TURN_REMINDER
            history[-1] = {**history[-1], "content": f"{said}\n\n{reminder}"}
        return await self._ask(history)


def _as_user_turn(message: Message) -> dict[str, Any]:
    """The user model's own tool calls, as the assistant turn they were in its conversation."""
    return {
        "role": "assistant",
        "content": message.content or "",
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in message.tool_calls
        ],
    }


def _tool_result(call_id: str | None, content: str | None) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content or ""}


def bind_toolbox(user: User, toolbox: UserToolbox) -> bool:
    """Give `user` its device's tools, where it can use them; whether it could."""
    if isinstance(user, ScriptedUser | LLMUser):
        user.toolbox = toolbox
        return True
    return False


def build_user(spec: str, task: Task, *, llm: LLMConfig | None = None, max_turns: int = 10) -> User:
    if spec == UserName.SCRIPTED:
        return ScriptedUser(task, max_turns=max_turns)
    return LLMUser(task, llm or LLMConfig(model=spec))
