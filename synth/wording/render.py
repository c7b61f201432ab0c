"""The user scenario: rendered deterministically from the DAG, optionally rewritten by an LLM.

The scenario says what the user wants to end up with, what they know and what they want to be
told, in the env's own vocabulary (`phrases.py`): never a tool's name or description, never a
numbered list of steps. The DAG stays the verifier; the agent works the steps out. A write is the
user's wish (an expected refusal too: the agent must decline it by the policy, so the user is not
warned); a read is spoken of only where the user's goal refers to what it shows ("the order
placed on 2024-03-07 among my orders"), and a read that only feeds a later step not at all.
Reasoning nodes become the user's condition ("if the total of order O-1 is more than 80, …") or
question ("how many of …"). The persona is the task's principal, and only ever a person-like row.

The template is the source of truth. An LLM rewrite (through `litellm.acompletion`) only makes the
wording of the request lines more natural, one line at a time; the known facts and the answers
stay as written (the harness hides them by their lines). A rewrite is kept only when its judge
finds nothing changed (`checks.rewording`: every value still said, nothing invented, the same
principal, realism measures at 0), else the templated wording ships.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..task.models import (
    ANSWERS_LINE,
    KNOWN_FACTS_LINE,
    ArgSource,
    CallNode,
    Dag,
    Fact,
    ReasonNode,
    UserScenario,
)
from ..task.scoring import normalize_text
from .phrases import PLACEHOLDER, Phrases, singular

# How many results back a reference is described before it is only "the … on file".
_MAX_DEPTH = 3
_LABEL_SUFFIX = re.compile(r" \(step \d+\)$")


# A value that is a code word ("wrong_size", "delivery_too_slow"): a person says it as words.
_CODE_WORD = re.compile(r"[a-z]+(?:_[a-z0-9]+)+")
# A name that only numbers a row ("Member 114", "Agent 3"): no one is called that.
_NUMBERED_NAME = re.compile(r"[A-Za-z]+ ?#?\d+")


# "for 1 days", "add 1 checked bags": a count of one, then a plural noun of one or two words.
_ONE = re.compile(
    r"(?<![\w.,-])1 (?!(?:this|its|his|yes|plus|minus|bus|gas|was|has|is|as|us)\b)"
    r"((?:[a-z]+ )?[a-z]{2,}?)(ies|s)\b(?! of\b)"
)


# Marks around a value in the user's own words while sentences are reworded (`_Renderer.say`).
_KEEP_OPEN, _KEEP_CLOSE = "\x02", "\x03"
_KEPT = re.compile("\x02[^\x03]*\x03")

# "the order of your orders": a value read off a list holds one such row, so it is "your order".
_ONLY_ONE = re.compile(r"\bthe (\w+) of your \1s\b")


def _one(m: re.Match[str]) -> str:
    stem, ending = m.group(1), m.group(2)
    if stem.endswith("s"):  # "1 class", "1 address": not a plural
        return m.group(0)
    return f"1 {stem}{'y' if ending == 'ies' else ''}"


# A column named for how it relates ("assigned_to", "created_by"), not for what it holds.
_PREPOSITIONS = frozenset({"to", "by", "for", "from", "with", "of"})


def _words(name: str) -> str:
    return name.replace("_", " ").strip()


def _field(name: str) -> str:
    """A column as the user speaks of it: "daily rate (in cents)", not "daily rate cents"."""
    words = _words(name)
    return f"{words[: -len(' cents')]} (in cents)" if words.endswith(" cents") else words


def _join(items: list[str]) -> str:
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _value_text(value: Any, exact: bool = False) -> str:
    """A value as the user says it: strings bare (a code word as words, unless `exact`: an id is
    said as it is), lists as "a, b and c", the rest as JSON."""
    if isinstance(value, list):
        return _join([_value_text(v, exact) for v in value])
    if isinstance(value, str):
        return _words(value) if not exact and _CODE_WORD.fullmatch(value) else value
    return json.dumps(value, ensure_ascii=False)


def _is_id(name: str) -> bool:
    return name.endswith(("_id", "_ids", " id", " ids"))


def spoken_text(text: str) -> str:
    """Text compared as said: case, commas and code words' underscores do not count."""
    return normalize_text(text).replace("_", " ")


_spoken = spoken_text


_SAID_WITH_A = ("uni", "use", "usu", "uti", "ure", "uro", "eu", "one", "once")
"""Words spelled with a vowel but said with a consonant ("a user", "a unit", "a euro")."""
_SAID_WITH_AN = ("hour", "honest", "honor", "honour", "heir")
"""Words spelled with a consonant but said with a vowel ("an hour")."""


def _a(noun: str) -> str:
    """`noun` after the article it is said with: "a user" (a synthesized Slack env's persona read
    "An user of the slack service"), "an unresolved ticket", "an hour"."""
    word = noun.lower()
    vowel = word[:1] in "aeiou" and not word.startswith(_SAID_WITH_A)
    return f"{'an' if vowel or word.startswith(_SAID_WITH_AN) else 'a'} {noun}"


class VagueReference(ValueError):
    """A value the task needs comes from so far back in the walk that the user could not name it
    ("the book on file"): such a task is not rendered, so not shipped (`BuildFailed`)."""


@dataclass
class _Renderer:
    dag: Dag
    facts: list[Fact]
    phrases: Phrases
    references: Mapping[str, str] = field(default_factory=dict)
    created: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {n.id: n for n in self.dag.nodes}
        self.known = {json.dumps(f.value, sort_keys=True) for f in self.facts}
        for f in self.facts:
            if isinstance(f.value, list):
                self.known |= {json.dumps(v, sort_keys=True) for v in f.value}
        self.singulars = sorted({e.singular for e in self.phrases.entities.values()}, key=len, reverse=True)
        self.own = _Ownership.of(self.dag, self.phrases)
        principal = self.dag.principal
        self.me = str(next(iter(principal.key.values()))) if principal and len(principal.key) == 1 else None
        # What was already described or named, by value, and the last value said of each noun:
        # a value described again is "that order", and only while no other order was named
        # since. What a text holds counts as said once that text is final (`hear`), never while
        # it is being built: a description never refers to itself.
        self.said: set[tuple[str, str]] = set()  # (noun, value): described or named
        self.last_of: dict[str, str] = {}  # noun -> the value last described or named
        self.made: list[tuple[str, str, str]] = []  # (text, noun, value) not yet heard
        # how many values each write created per table: "the new address" only when one was
        self.tables_created: dict[str, int] = {}
        for _, table in self.created.values():
            self.tables_created[table] = self.tables_created.get(table, 0) + 1
        self.branched = {
            n.then_node for n in self.dag.nodes if isinstance(n, ReasonNode) and n.op == "branch"
        } | {n.else_node for n in self.dag.nodes if isinstance(n, ReasonNode) and n.op == "branch"}

    # ------------------------------------------------------------------ nouns
    def noun(self, column: str) -> str:
        entity = self.phrases.entity_for_column(column)
        if entity is not None:
            return entity.singular
        parent = self.phrases.entities.get(self.references.get(column, ""))
        if parent is not None and column.rsplit("_", 1)[-1] in _PREPOSITIONS:
            # "assigned_to" is no noun; the employee it names is: "the employee of device A-2"
            return parent.singular
        base = column[:-3] if column.endswith("_id") else column
        return _words(base)

    def plural(self, column: str) -> str:
        entity = self.phrases.entity_for_column(column)
        return entity.plural if entity is not None else _words(column)

    def tool_phrase(self, node: CallNode) -> str:
        written = self.phrases.tools.get(node.call.name)
        if written is not None:
            return written.phrase
        # no vocabulary at all: the name's words and each argument, never the name itself
        args = ", ".join(f"{_words(p)} {{{p}}}" for p in node.call.arguments)
        return _words(node.call.name) + (f" ({args})" if args else "")

    # ------------------------------------------------------------------ references
    def describe(self, node_id: str, depth: int) -> str:
        """What a call node's result is about, as the user would name it."""
        node = self.by_id[node_id]
        if isinstance(node, ReasonNode):
            return "that"
        if node.write:  # a write's result is what the user hears back once it is done
            return f"what you hear back when you {self.fill(node, depth + 1)}"
        return self.fill(node, depth + 1)

    def argument(self, node: CallNode, param: str, depth: int) -> str:
        value = node.call.arguments.get(param)
        source = next((a for a in node.args if a.param == param), None)
        if source is None or source.source == "user" or json.dumps(value, sort_keys=True) in self.known:
            return _value_text(value, exact=_is_id(param))
        if self.me is not None and isinstance(value, str | int) and str(value) == self.me:
            # the user's own id, found by a lookup ("the customer of the account of Ada at zip
            # 11201"): the user is that customer, so it is said as them (and `_Ownership` then
            # says it as "your", "yourself" or not at all)
            return str(value)
        key, noun = json.dumps(value, sort_keys=True), self.noun(param)
        if (noun, key) in self.said and self.last_of.get(noun) == key:
            return f"that {noun}"  # described before, and no other since
        said = self.describe_value(node, param, depth, value, source)
        self.made.append((said, noun, key))
        return said

    def describe_value(self, node: CallNode, param: str, depth: int, value: Any, source: ArgSource) -> str:
        """Where the user's value is found, as they would say it ("the order whose status is
        pending among your orders")."""
        if depth >= _MAX_DEPTH or source.node is None or source.node not in self.by_id:
            # "the book on file" names no book: the user could not say which one they mean
            raise VagueReference(f"{node.call.name}.{param} is described {depth} results back")
        feeding = self.by_id[source.node]
        if isinstance(feeding, ReasonNode):
            return self.selection(feeding, depth)
        key = source.key or param
        if key in feeding.call.arguments and feeding.call.arguments[key] == value:
            # a result echoing what its call was given ("device A-3" back from "device A-3"):
            # said as that call's own argument, not "the device of device A-3"
            return self.argument(feeding, key, depth + 1)
        shown = self.data.get(feeding.id)
        if isinstance(shown, dict) and key in shown and shown[key] != value:
            # read from a list inside the result ("the status of your loyalty profile" meaning
            # one reservation's status, not the profile's own): no reader would find it
            raise VagueReference(f"{node.call.name}.{param} is a nested {key}, not the result's own")
        if feeding.write:
            made = self.created.get(json.dumps(value, sort_keys=True))
            if made is not None and made[0] == feeding.id and self.tables_created.get(made[1]) == 1:
                return f"the new {self.noun(source.key or param)}"  # the one row of its kind made
            # a value the write shows but did not make (the address of a cancelled order)
        return f"the {self.noun(source.key or param)} of {self.describe(feeding.id, depth)}"

    def selection(self, r: ReasonNode, depth: int) -> str:
        """An argmax/argmin/filter node as the user's choice: "the order with the highest total"."""
        what = self.noun(r.select or "item")
        source = self.describe(r.source, depth) if r.source else ""
        among = f" among {source}" if source else ""
        field = _field(r.field or "value")
        # "the order whose status is pending among your orders" picks a row of the list; "the
        # drug whose rx id is RX-3 among your prescriptions" would call a prescription a drug
        row = (
            ""
            if not source or re.search(rf"\b{re.escape(self.plural(r.select or 'item'))}\b", source)
            else " of the one"
        )
        if r.op == "filter":
            if self.me is not None and str(r.equals) == self.me:  # "whose author is you"
                return f"the {what}{row} whose {self.noun(r.field or 'value')} is you{among}"
            return f"the {what}{row} whose {field} is {_value_text(r.equals)}{among}"
        which = "highest" if r.op == "argmax" else "lowest"
        return f"the {what}{row} with the {which} {field}{among}"

    def fill(self, node: CallNode, depth: int) -> str:
        """The node's phrase with each placeholder spoken; an argument the phrase has no place
        for is added after it, so no value the call needs is left unsaid."""
        phrase = self.tool_phrase(node)
        used = set(PLACEHOLDER.findall(phrase))
        parts: list[str] = []
        at = unquote = 0
        for m in PLACEHOLDER.finditer(phrase):
            param = m.group(1)
            said = self.argument(node, param, depth)
            before = phrase[at + unquote : m.start()]
            self.note(node, param, said, before)
            unquote = 0
            if (
                not self.literal(node, m.group(1), said)
                and before.endswith('"')
                and phrase[m.end() :].startswith('"')
            ):
                # quotes hold the user's own words ('titled "{subject}"'), never a description
                before, unquote = before[:-1], 1
            noun = self.noun(m.group(1))
            if said.startswith(("the ", "that ")):  # "my order {order_id}" given "the order of …"
                for name in (noun, *self.singulars):
                    lead = next(
                        (
                            lead
                            for lead in (f"the {name} ", f"my {name} ", f"a {name} ", f"{name} ")
                            if before.endswith(lead)
                        ),
                        None,
                    )
                    if lead is not None:
                        before = before[: -len(lead)]
                        break
            parts += [_second_person(before), self.protect(node, param, said)]
            if depth == 0:
                self.hear(said)
            at = m.end()
        text = "".join(parts) + _second_person(phrase[at + unquote :])
        given: list[str] = []  # "with genre mystery", "with the genre of book B-1"
        matched: list[str] = []  # "whose requester is the employee of device A-2"
        for p in node.call.arguments:
            if p in used:
                continue
            said = self.argument(node, p, depth)
            self.note(node, p, said)
            if depth == 0:
                self.hear(said)
            label, noun = _words(p), self.noun(p)
            if self.literal(node, p, said):
                given.append(f"{label} {self.protect(node, p, said)}")
            elif label in said or noun in said:
                given.append(said)
            else:
                matched.append(f"{noun} is {said}")
        text += f" with {_join(given)}" if given else ""
        return text + (f" whose {_join(matched)}" if matched else "")

    def note(self, node: CallNode, param: str, said: str, before: str = "") -> None:
        """Remember a value said as itself, under its entity ("ticket HT-3") or the entity the
        phrase names it by ("the address {line1}", "employee {assignee_id}"): once heard, it is
        the last one of that noun named, and "that address" no longer points past it."""
        if not self.literal(node, param, said):
            return
        key = json.dumps(node.call.arguments.get(param), sort_keys=True)
        if self.phrases.entity_for_column(param) is not None:
            self.made.append((said, self.noun(param), key))
        named = next((n for n in self.singulars if re.search(rf"\b{re.escape(n)} \"?$", before)), None)
        if named is not None and named != self.noun(param):
            self.made.append((said, named, key))

    def hear(self, text: str) -> None:
        """What was made and is in `text` is now said, in the order `text` says it."""
        placed = sorted((text.find(t), noun, key) for t, noun, key in self.made if t in text)
        for _, noun, key in placed:
            self.said.add((noun, key))
            self.last_of[noun] = key
        self.made = []

    def protect(self, node: CallNode, param: str, said: str) -> str:
        """A value in the user's own words (a note, a subject) kept out of the sentence-level
        rewording (`say`): "your", "1 days" or an id inside it stay exactly as given."""
        value = node.call.arguments.get(param)
        if isinstance(value, str) and not _is_id(param) and self.literal(node, param, said):
            return f"{_KEEP_OPEN}{said}{_KEEP_CLOSE}"
        return said

    def literal(self, node: CallNode, param: str, said: str) -> bool:
        """Whether `said` is the argument's value itself, not a description of where it is found."""
        return said == _value_text(node.call.arguments.get(param), exact=_is_id(param))

    # ------------------------------------------------------------------ sentences
    def say(self, sentence: str) -> str:
        """A sentence as said: the user's own rows as theirs, one of a kind in the singular;
        protected values (`protect`) untouched. What it names is now said (`hear`)."""
        self.hear(sentence)
        out, at = [], 0
        for m in _KEPT.finditer(sentence):
            out += [self._reword(sentence[at : m.start()]), m.group(0)]
            at = m.end()
        return "".join([*out, self._reword(sentence[at:])])

    def _reword(self, text: str) -> str:
        return _ONE.sub(_one, _ONLY_ONE.sub(r"your \1", self.own(text)))

    def wishes(self) -> list[str]:
        """One sentence per write the user wants, and per condition, in the DAG's order."""
        out: list[str] = []
        for node in self.dag.nodes:
            lead = "You want to" if not out else "You also want to"
            if isinstance(node, CallNode) and node.write and node.id not in self.branched:
                out.append(self.say(f"{lead} {self.fill(node, 0)}."))
            elif isinstance(node, ReasonNode) and node.op == "branch":
                out.append(self.say(self.branch(node)))
        return out

    def branch(self, r: ReasonNode) -> str:
        subject = self.describe(r.source, 0) if r.source else "it"
        self.hear(subject)  # "if the rate of the car with …, you want to rent that car"
        more = "more" if r.comparator == ">" else "less"
        then_node, else_node = self.by_id[r.then_node or ""], self.by_id[r.else_node or ""]
        assert isinstance(then_node, CallNode) and isinstance(else_node, CallNode)
        threshold = f"{r.threshold:g}" if r.threshold is not None else "the limit"
        return (
            f"If the {_field(r.field or 'figure')} of {subject} is {more} than {threshold}, "
            f"you want to {self.fill(then_node, 0)}; if not, you want to {self.fill(else_node, 0)}."
        )

    def question(self, r: ReasonNode) -> str:
        """A closing sum or count as what the user wants to be told."""
        subject = self.describe(r.source, 0) if r.source else "it"
        if r.path and r.path[-1] != r.field:
            subject = f"the {_words(r.path[-1])} in {subject}"
        field = _field(r.field or "value")
        if r.op == "sum" and field.startswith("is ") and not isinstance(r.value, float):
            # a sum of a yes/no column counts the rows where it holds: "how many … are default"
            return f"how many of {subject} are {field[3:]} (a whole number)"
        if r.op == "sum":
            unit = "to the cent" if isinstance(r.value, float) else "a whole number"
            field = field.removesuffix(" total")  # "copies total": "the total copies"
            total = "the total" if field in ("total", "amount", "sum") else f"the total {field}"
            return f"{total} of {subject} ({unit})"
        principal = self.dag.principal
        if principal is not None and [str(v) for v in principal.key.values()] == [str(r.equals)]:
            # "have author id E-1014" asked by E-1014: "have you as author"
            return f"how many of {subject} have you as {self.noun(r.field or 'value')} (a whole number)"
        if r.equals in ("", None):
            return f"how many of {subject} have no {field} (a whole number)"
        return f"how many of {subject} have {field} {_value_text(r.equals)} (a whole number)"


def _known(facts: list[Fact]) -> str:
    """ "member id: M-4; book ids: B-1 and B-2": each label once, with every value it has."""
    by_label: dict[str, tuple[str, list[str]]] = {}  # "passenger id" and "passenger ids" are one label
    for f in facts:
        label = _words(_LABEL_SUFFIX.sub("", f.name))
        one = singular(label)
        _, values = by_label.setdefault(one, (label, []))
        if label != one:
            by_label[one] = (label, values)
        for v in f.value if isinstance(f.value, list) else [f.value]:
            if (text := _value_text(v, exact=_is_id(label))) not in values:
                values.append(text)
    parts = []
    for one, (label, values) in by_label.items():
        parts.append(f"{one if len(values) == 1 and label == one else _plural(one)}: {_join(values)}")
    return "; ".join(parts)


def _plural(noun: str) -> str:
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def _second_person(phrase_text: str) -> str:
    """A phrase's own words as said to the user: "your order", where the env's vocabulary speaks
    as the user ("my order {order_id}"). Values are never touched: only the phrase between them."""
    return re.sub(r"\bmy\b", "your", re.sub(r"\bMy\b", "Your", phrase_text))


@dataclass(frozen=True)
class _Ownership:
    """The user's own rows spoken of as theirs: the principal is the user, so "for member M-4"
    goes unsaid (the user is member M-4), "the loans of member M-4" is "your loans", "employee
    E-1's seat" is "your seat". The principal's id stays in what the user knows.

    The patterns match any id where the user's could stand (`_ownership_patterns`, compiled once
    per entity noun) and rewrite only where it is the user's."""

    me: str = ""
    patterns: tuple[tuple[re.Pattern[str], str], ...] = ()

    @classmethod
    def of(cls, dag: Dag, phrases: Phrases) -> _Ownership:
        principal = dag.principal
        if principal is None or len(principal.key) != 1:
            return cls()
        entity = phrases.entities.get(principal.table)
        (value,) = principal.key.values()
        if entity is None or not isinstance(value, str | int):
            return cls()
        # a bare id names the user only when it cannot be a count ("C-1044", not 7)
        distinct = (
            isinstance(value, str) and any(c.isalpha() for c in value) and any(c.isdigit() for c in value)
        )
        return cls(str(value), _ownership_patterns(entity.singular, distinct))

    def __call__(self, text: str) -> str:
        if not self.me or self.me not in text:
            return text
        for pattern, replacement in self.patterns:

            def mine(m: re.Match[str], replacement: str = replacement) -> str:
                return m.expand(replacement) if m.group("id") == self.me else m.group(0)

            text = pattern.sub(mine, text)
        return text.replace("your your ", "your ")


@functools.lru_cache(maxsize=64)
def _ownership_patterns(singular: str, distinct: bool) -> tuple[tuple[re.Pattern[str], str], ...]:
    noun = re.escape(singular)
    if distinct:  # an id with a digit, the noun before it optional ("C-1044", "customer C-1044")
        ident = r"(?<![\w-])(?P<id>[\w-]*\d[\w-]*)(?![\w-])"
        me = rf"(?:the )?(?:{noun} )?{ident}"
    else:  # a number or a word: only after its noun ("customer 7")
        ident = r"(?<![\w-])(?P<id>[\w-]+)(?![\w-])"
        me = rf"(?:the )?{noun} {ident}"
    my_id = rf"(?:\w+ )?id {ident}"  # "the tickets with requester id E-1"
    # one noun phrase: no "of", no second "the", no preposition or "whose"
    owned = r"((?:(?!\b(?:of|the|among|whose|with|in|on|for|to|at|from|by)\b)[\w ])+?)"
    return (
        (re.compile(rf" ?\({me}\)"), ""),
        (re.compile(rf"{me}'s\b"), "your"),
        (re.compile(rf"\b(?:give|grant) {me}"), "get"),
        (re.compile(rf"\b[Tt]he {owned} of {me}"), r"your \1"),
        (re.compile(rf"\b[Tt]he {owned} with {my_id}"), r"your \1"),
        (re.compile(rf",? (?:for|of) {me}"), ""),
        (re.compile(rf"\bto {me}"), "to yourself"),
        (re.compile(rf"\bby {me}"), "by you"),
    )


def _persona(env_name: str, dag: Dag, data: dict[str, Any], phrases: Phrases) -> str:
    """The principal by name; without one, the first row of a person-like table that the task's
    results show by name; never a row of any other table (a product is no one's persona)."""
    label = env_name.replace("_", " ")
    people = phrases.people()
    who = people[0].singular if people else "user"
    if dag.principal is not None:
        entity = phrases.entities.get(dag.principal.table)
        if entity is None or entity.person:
            who = entity.singular if entity is not None else who
            if dag.principal.name and not _NUMBERED_NAME.fullmatch(dag.principal.name):
                return f"{dag.principal.name}, {_a(who)} of the {label} service"
    for node in dag.nodes:
        d = data.get(node.id)
        if not isinstance(d, dict):
            continue
        for person in people:
            names = [n for c in (person.name or "").split() if isinstance(n := d.get(c), str)]
            full = " ".join(names)
            if (
                person.key in d
                and names
                and len(names) == len((person.name or "").split())
                and not _NUMBERED_NAME.fullmatch(full)
            ):
                return f"{' '.join(names)}, {_a(person.singular)} of the {label} service"
    return f"{_a(who).capitalize()} of the {label} service"


def render_scenario(
    env_name: str,
    dag: Dag,
    facts: list[Fact],
    outputs: list[str],
    data: dict[str, Any],
    output_labels: list[str] | None = None,
    phrases: Phrases | None = None,
    references: Mapping[str, str] | None = None,
    created: Mapping[str, tuple[str, str]] | None = None,
    *,
    staff: bool = False,
) -> UserScenario:
    """The templated scenario in the env's vocabulary (`phrases`; none: the tools' own words).
    `output_labels` are the builder's; the user's wording of each output comes from the closing
    count or sum that computes it, in order, and the builder's label only where there is none.
    `references` maps relation columns to the table they name; `created` maps each value a write
    made (JSON) to (that write's node id, table): only such a value is "the new …". `staff`: the
    user acts for no one (a restock), so the persona is a member of staff, never a person the
    task's results name."""
    r = _Renderer(
        dag=dag,
        facts=facts,
        phrases=phrases or Phrases(),
        references=references or {},
        created=created or {},
        data=data,
    )
    lines: list[str] = []
    lines += r.wishes()
    if facts:
        known = _known(facts)
        lines.append(
            f"{KNOWN_FACTS_LINE} {known}{'' if known.endswith('.') else '.'} Give these only when asked."
        )
    if outputs:
        questions = [
            r.say(r.question(n)) for n in dag.nodes if isinstance(n, ReasonNode) and n.op in ("sum", "count")
        ]
        if len(questions) != len(outputs):
            questions = [_LABEL_SUFFIX.sub("", lab) for lab in (output_labels or [""] * len(outputs))]
        told = [f"{q}: {value}" if q else value for q, value in zip(questions, outputs, strict=True)]
        # the harness's scripted user leaves this line unsaid (it holds the answers)
        lines.append(f"{ANSWERS_LINE} " + "; and ".join(told) + ".")
    return UserScenario(
        persona=f"A member of staff of the {env_name.replace('_', ' ')} service"
        if staff
        else _persona(env_name, dag, data, phrases or Phrases()),
        instruction="\n".join(lines).replace(_KEEP_OPEN, "").replace(_KEEP_CLOSE, ""),
        known_facts=list(facts),
        must_be_told=list(outputs),
    )


def request_values(dag: Dag, request: str) -> list[str]:
    """The values a templated request says in words, as said: each argument value and filter value
    of the DAG that `request` holds (a reason "defective", a category "van"); what a rewrite of
    it must still say, beside every figure and id (`checks.rewording`)."""
    said = _spoken(request)
    out: list[str] = []
    values: list[tuple[Any, bool]] = []
    for node in dag.nodes:
        if isinstance(node, CallNode):
            values += [(v, _is_id(p)) for p, v in node.call.arguments.items()]
        elif node.op == "filter" and node.equals not in (None, ""):
            values.append((node.equals, False))
    for value, exact in values:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, dict | bool) or v is None:
                continue
            text = _value_text(v, exact)
            if (
                len(text) >= 3
                and (form := _spoken(text))
                and re.search(rf"(?<!\w){re.escape(form)}(?!\w)", said)
            ):
                if text not in out:
                    out.append(text)
    return out


def needed_strings(scenario: UserScenario) -> list[str]:
    """Every fact value and expected output, as text that a rewrite must still contain."""
    out: list[str] = []
    for f in scenario.known_facts:
        values = f.value if isinstance(f.value, list) else [f.value]
        out.extend(v if isinstance(v, str) else json.dumps(v) for v in values)
    out.extend(scenario.must_be_told)
    return out


def missing_facts(scenario: UserScenario, text: str) -> list[str]:
    said = _spoken(text)
    return [s for s in needed_strings(scenario) if _spoken(s) not in said]


REWRITE_PROMPT = (
    "Below is one thing a customer wants from a support agent. Rewrite it as the customer's own "
    'words to the agent: one short, natural sentence or two in the first person ("I ..."). Keep every '
    "id, name, date, number and quoted text exactly as written. Add nothing that is not in it. Do "
    "not number steps. Reply with the rewritten text only.\n\n{request}"
)
"""One request line at a time: asked for a whole instruction, Qwen2.5-Coder-0.5B kept the first
of its lines and dropped the rest (8 of the 11 instructions of more than one line, of 12 asked
from two bundled envs)."""


def request_lines(instruction: str) -> list[str]:
    """The lines of an instruction that say what the user wants: not the known facts, which the
    user gives only when asked, nor the answers, which no agent-facing prompt may show."""
    return [
        ln
        for ln in instruction.splitlines()
        if ln.strip() and not ln.startswith((KNOWN_FACTS_LINE, ANSWERS_LINE))
    ]


def with_request(instruction: str, request: list[str]) -> str:
    """`instruction` with its request lines replaced by `request`; the known-facts and answers
    lines are kept as they are, so the harness still hides them (`UserScenario.without_answers`)."""
    kept = [ln for ln in instruction.splitlines() if ln.startswith((KNOWN_FACTS_LINE, ANSWERS_LINE))]
    return "\n".join([*request, *kept])


class Rewrite(NamedTuple):
    """What a rewrite came to: `scenario` is the rewritten one when `problems` is empty, else the
    templated one; `proposed` is the instruction the model proposed either way (for the record)."""

    scenario: UserScenario
    problems: list[str]
    proposed: str


RewriteJudge = Callable[[UserScenario, UserScenario], list[str]]
"""(templated, rewritten) -> why the rewrite changes the task ([] when it keeps its meaning)."""


async def rewrite_scenario(
    scenario: UserScenario,
    model: str,
    *,
    judge: RewriteJudge,
    label: str | None = None,
    **completion_kwargs: Any,
) -> Rewrite:
    """Ask `model` to reword each request line; keep the rewrite only if `judge` finds nothing it
    changes (synthesis judges with `checks.rewording.rewrite_problems`, which this layer cannot
    import, hence no default). `label` names the model in `instruction_source`."""
    import litellm

    said: list[str] = []
    for line in request_lines(scenario.instruction):
        response = await litellm.acompletion(
            model=model,
            messages=[{"role": "user", "content": REWRITE_PROMPT.format(request=line)}],
            temperature=0,
            **completion_kwargs,
        )
        said.append(" ".join((response.choices[0].message.content or "").split()))
    proposed = with_request(scenario.instruction, said)
    candidate = scenario.model_copy(
        update={"instruction": proposed, "instruction_source": f"llm:{label or model}"}
    )
    problems = ["empty: a request line came back empty"] if not all(said) else judge(scenario, candidate)
    if problems:
        return Rewrite(scenario, problems, proposed)
    return Rewrite(candidate, [], proposed)
