"""The user-error rules: free, deterministic checks of the simulated user's messages against its task.

A user knows its instruction and its facts, and learns what the agent and tools say; anything else
it states came from nowhere. Each rule names the kind of error it found (`ErrorKind`). They are
tuned for precision first: a false "user error" masks a real agent failure and hides it from
training, so an ambiguous case is left to the judge. Measured on the labeled set
(`user_error_set.py`, figures in docs/benchmarks/meu.md); a test holds them to those figures.

- Values from nowhere (`wrong_fact`, `contradiction`, `invented_fact`): a user message holds an
  id (`C-1021`), an email, a date (ISO or "June 3, 2025"), a dollar amount or a phone number that
  is neither in the instruction, nor a fact, nor said earlier by the agent or a tool. An id with a
  fact's prefix, or a value of a class some fact has, is a wrong fact (a contradiction when the
  user had already said a value of that class); anything else is invented (an id of a prefix no
  fact has only with 3 digits or more: "USB-3" names a product).
- Named values (`wrong_fact`): "my days is 5", "8 days", "priority: high", "use 10 as the days"
  where the fact of that name (at any step) has no such value and nobody said it.
- Self-corrections (`contradiction`): the user takes back a value it gave ("no wait", "make that",
  "I meant", "correction", "got my ... wrong", "X, not C-1021"), in a message that states a value.
- Leaks (`leak`): the user states, before the agent or a tool did, a value only the agent could
  find: a required output (a small number only next to words such as "answer", "total" or "you'll
  find"), a specific value (with a digit or `@`, or a code such as `YYZ`) the golden calls take
  from results, or a plain word they take from results said as that field's value ("the cabin is
  economy"; the word alone may be the user's own, so it is not enough).
- Premature stops (`premature_stop`): the user ends the conversation (`###STOP###` /
  `###TRANSFER###`) before the agent said anything, right after the agent asked something (not a
  closing offer such as "anything else I can help you with?"), or right after the agent
  announced more work ("let me ...", "next, I'll ...", "one moment"; the scripted user answers
  those with "Okay, go ahead." and never stops there). A stop after the agent claims it is done,
  or gives up, is never the user's fault here; nor is a stop right after an agent turn that said
  nothing to the user (`users.says_nothing`: empty, punctuation, a call written as text that did
  not parse): an agent that fails and then falls silent must not have its failure masked as the
  user's (the scripted user nudges such a turn and, in the end, charges it to the agent).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, get_args

from envforge.synth import Task

from .records import Message
from .users import STOP, TRANSFER, announces_more_work, fact_text, request_text, says_nothing

ErrorKind = Literal["wrong_fact", "contradiction", "leak", "premature_stop", "invented_fact"]
"""The user errors the detector claims (and the labeled set, `user_error_set.py`, measures)."""
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


@dataclass(frozen=True)
class RuleVerdict:
    """Why the rules call a conversation a user error: the kind, a one-line reason, the message."""

    kind: ErrorKind
    reason: str
    message: int


# --------------------------------------------------------------------------- typed values

ID = re.compile(r"\b([A-Z]{1,4})-(\d+)\b")
EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
WORD_DATE = re.compile(rf"\b({MONTHS})\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?\b", re.I)
MONEY = re.compile(r"\$\s?(\d[\d,]*(?:\.\d{1,2})?)")
DECIMAL = re.compile(r"(?<![\d.])(\d+\.\d+)(?![\d.])")
PHONE = re.compile(r"(?<![\w-])(?:\(?\d{3}\)?[\s-])?\d{3}-\d{4}(?![\w-])")

ValueClass = Literal["id", "email", "date", "amount", "phone"]


def _typed_values(text: str) -> Iterator[tuple[ValueClass, str, str]]:
    """(class, normalised value, as written) for every typed value in `text`."""
    for m in ID.finditer(text):
        yield "id", m.group(0), m.group(0)
    for m in EMAIL.finditer(text):
        yield "email", m.group(0).lower(), m.group(0)
    for m in ISO_DATE.finditer(text):
        yield "date", m.group(0), m.group(0)
    for m in WORD_DATE.finditer(text):
        month = MONTHS.split("|").index(m.group(1).lower()) + 1
        try:
            day = dt.date(int(m.group(3) or 2000), month, int(m.group(2)))
        except ValueError:
            continue
        yield "date", day.isoformat() if m.group(3) else day.strftime("*-%m-%d"), m.group(0)
    for m in MONEY.finditer(text):
        yield "amount", f"{float(m.group(1).replace(',', '')):.2f}", m.group(0)
    for m in PHONE.finditer(text):
        yield "phone", re.sub(r"\D", "", m.group(0)), m.group(0)


MAX_AMOUNT_DIGITS = 15
"""The longest run of digits read as an amount: more is no sum of money (a float holds no more
exactly), and an agent's 400-digit number overflowed `int(n) / 100` (a 4,301-digit one, `int`
itself), ending the whole run from inside the user-error rules."""


def _known_amounts(text: str) -> set[str]:
    """Every number in `text` as an amount (tool results write money as 1199.0 or 119900 cents)."""
    out = {f"{float(n):.2f}" for n in DECIMAL.findall(text)}
    for n in re.findall(r"(?<![\d.])\d+(?![\d.])", text):
        if len(n) <= MAX_AMOUNT_DIGITS:
            out |= {f"{int(n):.2f}", f"{int(n) / 100:.2f}"}
    return out


def _class_key(cls: ValueClass, value: str) -> str:
    """Values that are alternatives of each other: ids by prefix, others by class."""
    return f"id:{ID.match(value).group(1)}" if cls == "id" else cls  # type: ignore[union-attr]


@dataclass
class _Known:
    """What the user may say: its instruction and facts, and what the agent and tools said so far."""

    values: set[str] = field(default_factory=set)
    text: list[str] = field(default_factory=list)
    heard: list[str] = field(default_factory=list)
    """Only what the agent and tools said (a leak is a value the user had not heard)."""

    def learn(self, text: str, *, heard: bool = True) -> None:
        self.text.append(text)
        if heard:
            self.heard.append(text)
        self.values |= _values_in(text)

    def said(self, needle: str) -> bool:
        return any(_has_word(t, needle) for t in self.text)

    def heard_of(self, needle: str) -> bool:
        return any(_has_word(t, needle) for t in self.heard)


@functools.lru_cache(maxsize=2048)  # texts of a few kB: a few MB at most
def _values_in(text: str) -> frozenset[str]:
    """Every value `_Known.learn` takes from `text`: its typed values (a date also as `*-MM-DD`)
    and every number as an amount. Remembered per text: the same instructions, facts and tool
    results come back in every trial of a task, and seven regexes over each cost ~1 ms a trial."""
    values: set[str] = set()
    for cls, value, _ in _typed_values(text):
        values.add(value)
        if cls == "date":
            values.add("*" + value[4:])
    return frozenset(values | _known_amounts(text))


@functools.lru_cache(maxsize=4096)
def _word_pattern(needle: str) -> re.Pattern[str]:
    """`needle` as a whole word (compiled once per needle: `re`'s own cache holds 512 patterns)."""
    return re.compile(rf"(?<![\w.-]){re.escape(needle)}(?![\w-]|\.\d)", re.I)


def _has_word(text: str, needle: str) -> bool:
    """Whether `text` holds `needle` as a whole word, ignoring case.

    ASCII text without the needle as a substring (ignoring case) cannot match, and finding that
    out is a `str.find`, not a case-insensitive pattern tried at every position: most texts a
    trial checks (each tool result, for each value only the agent can find) hold no such value.
    Non-ASCII text goes to the pattern alone (`re`'s case folding matches `K` to `k`)."""
    if text.isascii() and needle.isascii() and needle.lower() not in text.lower():
        return False
    return _word_pattern(needle).search(text) is not None


# --------------------------------------------------------------------------- per task


def _specific(value: object) -> bool:
    """A value a user could not say by chance: with a digit or an `@`, or a code (`YYZ`).

    Plain words ("pending", "urgent") a golden call took from a result are left out: a model
    user may say them for its own reasons, and a false leak would mask an agent failure."""
    if not isinstance(value, str) or len(value) < 3:
        return False
    return any(c.isdigit() for c in value) or "@" in value or (value.isalpha() and value.isupper())


@dataclass
class _TaskFacts:
    fact_keys: dict[str, tuple[str, str]]
    """class key -> (fact name, value) of the first fact of that class (ids: of that prefix)."""
    named: dict[str, set[str]]
    """spoken base name (`days`, `priority`) -> the values facts of that name take (lowercase)."""
    hidden: list[tuple[str, str]]
    """(what, value) only the agent can find: required outputs, golden values from results."""
    hidden_words: list[tuple[str, str]]
    """(spoken argument name, value): plain words a golden call takes from results ("economy"),
    a leak only when the user names the field with them ("the cabin is economy")."""
    request: str

    @classmethod
    def of(cls, task: Task) -> _TaskFacts:
        fact_keys: dict[str, tuple[str, str]] = {}
        named: dict[str, set[str]] = {}
        for f in task.scenario.known_facts:
            text = fact_text(f.value)
            for vcls, value, _ in _typed_values(text):
                fact_keys.setdefault(_class_key(vcls, value), (f.name, value))
            if isinstance(f.value, int | str) and not isinstance(f.value, bool) and len(text.split()) <= 3:
                spoken = re.sub(r"\s*\(step \d+\)$", "", f.name).replace("_", " ").lower()
                named.setdefault(spoken, set()).add(text.lower())
        facts = {fact_text(f.value) for f in task.scenario.known_facts}
        instruction = task.scenario.instruction
        hidden = [("required output", o) for o in task.required_outputs if o not in facts]
        hidden_words: list[tuple[str, str]] = []
        for call in task.golden_calls:
            for key, value in call.arguments.items():
                text = fact_text(value)
                if text in facts or text in instruction:
                    continue
                if _specific(value):
                    hidden.append((key, text))
                elif isinstance(value, str) and re.fullmatch(r"[A-Za-z][\w-]{2,}", text):
                    hidden_words.append((key.replace("_", " ").lower(), text))
        return cls(fact_keys, named, hidden, hidden_words, request_text(task))

    def unexplained(self, text: str) -> str:
        """The part of a user message its request does not account for (the request may be said
        again after a few words: the scripted user's "Are you still there? <request>")."""
        return text.replace(self.request, " ") if self.request else text


# --------------------------------------------------------------------------- the rules


CORRECTION = re.compile(
    r"\b(?:no wait,?(?:\s+sorry,?)?(?:\s+it's|\s+it is)?|make (?:that|it)|i meant|correction:?(?:\s+use)?)"
    r"\s+\"?(?P<value>[\w@.-]+)"
    r"|\bgot (?:my|the) [\w ]{1,30} wrong\b.*?(?P<after>[\w@.-]*\d[\w@.-]*)"
    r"|,\s*not\s+[\w@.-]*\d",
    re.I,
)
OFFER = re.compile(
    r"\b(anything else|something else|help you with|can i help|else i can do|done|completed?|all set)\b",
    re.I,
)
"""A question that closes the conversation ("Anything else I can help you with?"): stopping on it is
the user being done, not cut short."""
ANSWER_CUE = re.compile(
    r"\b(?:answer|total|count|number|how many|comes? to|will be|should be|expected|result"
    r"|(?:you(?:'ll| will| should| would)?|you'd) (?:find|see|get)(?: that)?(?: it(?:'s| is))?)"
    r"(?:\s+(?:is|are|of|was))?",
    re.I,
)
"""Words that make a small number an answer when the number follows them ("the count is 1",
"you'll find it's 6")."""
FIELD_CUE = r"(?:is|are|was|'s|comes? to|will be|should be|would be|[:=])"
"""What joins a field's name to the value the user claims for it ("the cabin is economy")."""


def _named_value_error(facts: _TaskFacts, text: str, known: _Known) -> str | None:
    for name, values in facts.named.items():
        if name in ("", "body", "description", "subject", "reason"):
            continue
        n = re.escape(name)
        patterns = [
            rf"\b(?:my|the|a)[ \t]+{n}(?:[ \t]+for[ \t]+step[ \t]+\d+)?[ \t]*"
            rf"(?:is|was|should be|would be|:|=)[ \t]*\"?([\w@.-]+)",
            rf"\buse\s+\"?([\w@.-]+)\"?\s+(?:as|for)\s+the\s+{n}\b",
            rf"(?:^|\n|[.!?][ \t])[ \t]*{n}(?:[ \t]+for[ \t]+step[ \t]+\d+)?[ \t]*[:=][ \t]*\"?([\w@.-]+)",
        ]
        if all(v.isdigit() for v in values):
            patterns.append(rf"(?<![\w-])(\d+)[ \t]+{n}\b")
        for pattern in patterns:
            for m in re.finditer(pattern, text, re.I):
                said = m.group(1).strip(".\"'").lower()
                if said and said not in values and not known.said(said):
                    return f"says {name} {said!r}, but the {name} is {' or '.join(sorted(values))}"
    return None


def _leak(facts: _TaskFacts, text: str, known: _Known) -> str | None:
    rest = facts.unexplained(text)
    for what, value in facts.hidden:
        if known.heard_of(value) or not _has_word(rest, value):
            continue
        if what != "required output" and _has_word(facts.request, value):
            continue
        small_number = value.replace(".", "").isdigit() and len(value) <= 2
        if small_number and not re.search(ANSWER_CUE.pattern + rf"\W{{0,3}}{re.escape(value)}\b", rest, re.I):
            continue
        return f"states the {what.replace('_', ' ')} {value} before the agent found it"
    for what, value in facts.hidden_words:
        if known.heard_of(value):
            continue
        claim = rf"\b{re.escape(what)}\s+{FIELD_CUE}\s*\"?{re.escape(value)}\b"
        if re.search(claim, rest, re.I) and not re.search(claim, facts.request, re.I):
            return f"states the {what} {value} before the agent found it"
    return None


def _typed_error(
    facts: _TaskFacts, text: str, known: _Known, said_keys: set[str]
) -> tuple[ErrorKind, str] | None:
    for cls, value, written in _typed_values(text):
        if value in known.values:
            continue
        key = _class_key(cls, value)
        if key in facts.fact_keys:
            name, fact = facts.fact_keys[key]
            kind: ErrorKind = "contradiction" if key in said_keys else "wrong_fact"
            return kind, f"says {written}, contradicting the known {name} = {fact}"
        if cls == "id" and len(value.split("-")[1]) < 3:
            continue  # a product name ("USB-3", "PS-5") rather than a record id of a new kind
        return "invented_fact", f"says {written}, which is not among its facts nor said to it"
    return None


def _takes_back(facts: _TaskFacts, text: str) -> bool:
    """A correction cue and a value: "no wait, it's C-1021", "make that 5", "correction: use 10";
    after the weaker cues ("I meant", "make that") only a number, id, email or a fact's word counts,
    so "I meant to ask" takes nothing back."""
    for m in CORRECTION.finditer(text):
        value = m.group("value")
        if value is None or re.match(r"(?:no wait|correction)", m.group(0), re.I):
            return True
        if re.search(r"\d|@", value) or any(value.lower() in values for values in facts.named.values()):
            return True
    return False


def _stop_error(messages: list[Message], i: int) -> str | None:
    last_turn = next((p for p in reversed(messages[:i]) if p.role == "assistant"), None)
    if last_turn is not None and says_nothing(last_turn.content):
        return None  # the agent's last turn said nothing to the user: stopping there is no error
    said = [p for p in messages[:i] if p.role == "assistant" and p.content]
    if not said:
        return "ended the conversation before the agent said anything"
    last = (said[-1].content or "").strip()
    if last.endswith("?") and not OFFER.search(last):
        return "ended the conversation while the agent was asking a question"
    if announces_more_work(last):
        return "ended the conversation while the agent announced more work"
    return None


def rule_verdict(task: Task, messages: list[Message]) -> RuleVerdict | None:
    """The first user error the rules find, or None."""
    facts = _TaskFacts.of(task)
    known = _Known()
    known.learn(task.scenario.instruction, heard=False)
    for f in task.scenario.known_facts:
        known.learn(fact_text(f.value), heard=False)
    said_keys: set[str] = set()
    for i, m in enumerate(messages):
        text = m.content or ""
        if m.role != "user":
            known.learn(text)
            continue
        leak = _leak(facts, text, known)
        if leak:
            return RuleVerdict("leak", f"user message {i} {leak}", i)
        typed = _typed_error(facts, text, known, said_keys)
        if typed:
            return RuleVerdict(typed[0], f"user message {i} {typed[1]}", i)
        named = _named_value_error(facts, facts.unexplained(text), known)
        if named:
            return RuleVerdict("wrong_fact", f"user message {i} {named}", i)
        if i > 0 and _takes_back(facts, text):
            return RuleVerdict("contradiction", f"user message {i} takes back a value it gave", i)
        if STOP in text or TRANSFER in text:
            stop = _stop_error(messages, i)
            if stop:
                return RuleVerdict("premature_stop", f"user message {i} {stop}", i)
        said_keys |= {_class_key(cls, value) for cls, value, _ in _typed_values(text)}
    return None


def rule_user_error(task: Task, messages: list[Message]) -> tuple[bool, str | None]:
    """The rule-based verdict: (user_error, reason)."""
    verdict = rule_verdict(task, messages)
    return (True, verdict.reason) if verdict else (False, None)
