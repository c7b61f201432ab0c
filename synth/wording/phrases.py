"""How an env's users speak of its entities and actions: the vocabulary scenarios are rendered in.

A task's DAG is a list of tool calls, but the person who plays the user knows nothing of tools:
they want an order cancelled, or to know how many of their loans are overdue. `phrases.toml` in
the env folder (docs/env_format.md) says, per tool, what a call means as the user's wish ("cancel
my order {order_id}") or, for a read, what the user wants to know about ("my orders"), and per
table what a row is called and which column names it. Hand-written envs ship a written file;
synthesized ones a file derived here from tool names and the schema (`derive_phrases`), and an env
without one renders with the derived vocabulary. Every phrase passes `phrase_problems`: a phrase
that names a tool, reads as a numbered step, or drops a required parameter would leak procedure
into the scenario, or lose a value the verifier needs.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envforge.server import env_file_exists, read_env_text, replace_file

PHRASES_FILE = "phrases.toml"

PLACEHOLDER = re.compile(r"\{(\w+)\}")
NUMBERED_STEP = re.compile(r"^\s*\d+[.)]", re.MULTILINE)
STEP_WORDS = re.compile(r"\bstep \d+\b|\bin this order\b", re.IGNORECASE)

# Nouns whose rows are people: only such a row may be a task's persona.
PERSON_NOUNS = frozenset(
    {
        "customer",
        "member",
        "passenger",
        "patient",
        "employee",
        "user",
        "traveller",
        "traveler",
        "client",
        "requester",
        "student",
        "guest",
        "renter",
        "person",
        "staff",
        "agent",
    }
)
NAME_COLUMNS = ("name", "full_name", "title", "subject", "label")
_READ_VERBS = frozenset({"get", "list", "find", "search", "look", "lookup", "show", "fetch", "read", "view"})


class PhraseError(ValueError):
    """A `phrases.toml` that cannot be used: the message is one line naming the file and the fault."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EntityPhrase(_Model):
    """How a row of one table is spoken of."""

    singular: str
    plural: str
    key: str | None = Field(None, description="the column whose value identifies a row")
    name: str | None = Field(None, description="the column that names a row for a person")
    person: bool = Field(False, description="a row is a person, so it may be a task's persona")


class ToolPhrase(_Model):
    """What a call means to the user: a wish for a write, what they want to know for a read.
    `{param}` placeholders are filled with a value the user knows or a description of one."""

    phrase: str


class Phrases(_Model):
    entities: dict[str, EntityPhrase] = Field(default_factory=dict)
    tools: dict[str, ToolPhrase] = Field(default_factory=dict)

    def entity_for_column(self, column: str) -> EntityPhrase | None:
        """The entity whose key column `column` is (`order_ids` counts as `order_id`)."""
        for candidate in (column, column[:-1] if column.endswith("s") else column):
            for entity in self.entities.values():
                if entity.key == candidate:
                    return entity
        return None

    def people(self) -> list[EntityPhrase]:
        return [e for e in self.entities.values() if e.person]

    def person_tables(self) -> set[str]:
        """The tables whose rows are persons: the realism measure speaks of only these in the third
        person (`stiff_wording`'s `people`)."""
        return {table for table, entity in self.entities.items() if entity.person}


class ToolShape(Protocol):
    """What the vocabulary needs of a tool (`envforge.server.ToolSpec` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> tuple[str, ...]: ...
    @property
    def required(self) -> frozenset[str]: ...
    @property
    def read_only(self) -> bool: ...


class TableShape(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def columns(self) -> tuple[str, ...]: ...
    @property
    def primary_key(self) -> tuple[str, ...]: ...


class EnvShape(Protocol):
    """What the vocabulary needs of an env (`envforge.server.Environment` has it)."""

    @property
    def root(self) -> Path: ...
    @property
    def tools(self) -> Mapping[str, ToolShape]: ...
    @property
    def tables(self) -> Sequence[TableShape]: ...


@dataclass(frozen=True, slots=True)
class PhraseProblem:
    tool: str
    problem: str

    def __str__(self) -> str:
        return f"tools.{self.tool}: {self.problem}"


# --------------------------------------------------------------------------- the gate


def phrase_problems(phrases: Phrases, tools: Mapping[str, ToolShape]) -> list[PhraseProblem]:
    """Why phrases would leak procedure or lose a value: a tool name, a numbered step, a required
    parameter without its placeholder, a placeholder that is no parameter, a tool with no phrase."""
    names = sorted(tools, key=len, reverse=True)
    out: list[PhraseProblem] = []
    for tool in sorted(set(tools) - set(phrases.tools)):
        out.append(PhraseProblem(tool, "no phrase"))
    for tool, tp in sorted(phrases.tools.items()):
        spec = tools.get(tool)
        if spec is None:
            out.append(PhraseProblem(tool, "not a tool of this env"))
            continue
        text = tp.phrase
        lowered = text.lower()
        named = [n for n in names if n.lower() in lowered]
        if named:
            out.append(PhraseProblem(tool, f"names the tool {named[0]!r}"))
        if NUMBERED_STEP.search(text) or STEP_WORDS.search(text):
            out.append(PhraseProblem(tool, "reads as a numbered step"))
        used = set(PLACEHOLDER.findall(text))
        for p in sorted(spec.required - used):
            out.append(PhraseProblem(tool, f"drops the placeholder {{{p}}}"))
        for p in sorted(used - set(spec.parameters)):
            out.append(PhraseProblem(tool, f"{{{p}}} is not a parameter"))
        for p in sorted((used & set(spec.parameters)) - spec.required):
            # a call may leave it out; the renderer says the optional arguments a call has after the phrase
            out.append(PhraseProblem(tool, f"{{{p}}} is optional: only required parameters are placeholders"))
        if not text.strip():
            out.append(PhraseProblem(tool, "is empty"))
    return out


# --------------------------------------------------------------------------- derived vocabulary


def _words(name: str) -> str:
    return name.replace("_", " ").strip()


def singular(noun: str) -> str:
    if noun.endswith("ies") and len(noun) > 4:
        return noun[:-3] + "y"
    if noun.endswith(("sses", "xes", "ches", "shes")):
        return noun[:-2]
    if noun.endswith("s") and not noun.endswith("ss"):
        return noun[:-1]
    return noun


def service_word(names: Iterable[str]) -> str | None:
    """The first word every one of several names shares: the service an MCP server prefixes its
    tools with (`slack_post_message`, `slack_list_channels`; `git_`, `puppeteer_`, `maps_` in the
    corpus), which a model then puts on its tables too. No person says it: "slack reply to thread"
    read as the tool's name spelled out, in 29 of 50 tasks of a real model's Slack env."""
    split = [n.split("_") for n in names]
    firsts = {words[0] for words in split}
    if len(split) < 2 or len(firsts) != 1 or any(len(words) < 2 for words in split):
        return None
    return firsts.pop()


def _name_words(name: str, service: str | None) -> list[str]:
    words = name.split("_")
    return words[1:] if service is not None and words[0] == service and len(words) > 1 else words


def derive_entities(tables: Sequence[TableShape], service: str | None = None) -> dict[str, EntityPhrase]:
    """Each table's nouns, less the `service` word when every table name starts with it."""
    drop = service if service is not None and service_word(t.name for t in tables) == service else None
    out: dict[str, EntityPhrase] = {}
    for t in tables:
        base = "_".join(_name_words(t.name, drop))
        one = _words(singular(base))
        key = t.primary_key[0] if len(t.primary_key) == 1 else None
        name = next((c for c in NAME_COLUMNS if c in t.columns), None)
        last = one.split()[-1] if one else one
        person = last in PERSON_NOUNS or "email" in t.columns
        out[t.name] = EntityPhrase(singular=one, plural=_words(base), key=key, name=name, person=person)
    return out


# Verbs whose object is made anew: the entity it concerns follows "on" ("add comment on ticket T-1").
_MAKING_VERBS = frozenset(
    {"add", "create", "open", "post", "place", "file", "submit", "make", "leave", "write", "log"}
)
# Verbs that hand something to a person: the person follows "to" ("assign ticket T-1 to agent A-1").
_GIVING_VERBS = frozenset({"assign", "give", "transfer", "send", "reassign", "forward", "grant", "hand"})
_PREPOSITIONS = frozenset(
    {"to", "from", "into", "onto", "on", "off", "out", "back", "in", "at", "for", "with"}
)
# Verbs whose preposition names what is answered, not where a thing goes ("reply to thread").
_ANSWERING_VERBS = frozenset({"reply", "respond", "react", "comment", "vote", "subscribe"})
# Parameters that count a span of time: said as "for {days} days".
_DURATIONS = frozenset({"days", "nights", "hours", "weeks", "months", "minutes", "years"})


def _entity_of(param: str, entities: dict[str, EntityPhrase]) -> EntityPhrase | None:
    """The entity a parameter names: by the table's key (`member_id`), or as `<entity>_id` where
    the key is a bare `id` (`channel_id` of a channels table keyed by `id`)."""
    base = param[:-1] if param.endswith("s") else param
    return next((e for e in entities.values() if e.key in (param, base)), None) or next(
        (e for e in entities.values() if e.key == "id" and param == f"{e.singular.replace(' ', '_')}_id"),
        None,
    )


def _param_phrase(param: str, entities: dict[str, EntityPhrase]) -> str:
    e = _entity_of(param, entities)
    if e is None:
        return f"{_words(param)} {{{param}}}"
    return f"{e.plural if param.endswith('s') and e.key != param else e.singular} {{{param}}}"


def _read_phrase(
    tool: ToolShape, entities: dict[str, EntityPhrase], required: list[str], service: str | None
) -> str:
    """ "the loans of member {member_id}": what a read shows, named by the tool's words less its
    verb and less a word that only repeats the entity its parameter names ("member loans of member")."""
    words = [w for w in _name_words(tool.name, service) if w not in _READ_VERBS]
    owners = {e.singular for p in required if (e := _entity_of(p, entities)) is not None}
    trimmed = [w for w in words if w not in owners] if len(words) > 1 else words
    noun = " ".join(trimmed or words) or _words(tool.name)
    head = next(
        (p for p in required if (e := _entity_of(p, entities)) is not None and e.singular == noun),
        None,
    )
    text = f"the {noun}" + (f" {{{head}}}" if head is not None else "")
    others = [_param_phrase(p, entities) for p in required if p != head]
    return text + (" of " + ", ".join(others) if others else "")


def derive_tool_phrase(tool: ToolShape, entities: dict[str, EntityPhrase], service: str | None = None) -> str:
    """A phrase from the tool's name and parameters alone, as a person would put the wish: "book
    class {class_id} for member {member_id}", "send car {car_id} to maintenance", "freeze the
    membership of member {member_id}", "add comment on ticket {ticket_id} with body {body}".
    Deterministic, and it passes the gate by construction (every required parameter is a
    placeholder, the name's words are spaced, never the name itself); a `service` word the env's
    tools all start with is left out."""
    words = _name_words(tool.name, service)
    required = [p for p in tool.parameters if p in tool.required]
    if tool.read_only:
        return _read_phrase(tool, entities, required, service)
    verb, rest = (words[0], words[1:]) if len(words) > 1 else (words[0], [])
    obj = " ".join(rest)
    keyed = {p: e for p in required if (e := _entity_of(p, entities)) is not None}
    # the parameter naming the object itself ("cancel booking {booking_id}") goes right after it
    head = next((p for p, e in keyed.items() if obj and e.singular.endswith(obj)), None)
    things = [p for p, e in keyed.items() if p != head and not e.person]
    people = [p for p, e in keyed.items() if p != head and e.person]
    placed: set[str] = set() if head is None else {head}
    if head is not None:
        text = f"{verb} {obj} {{{head}}}"
    elif rest and rest[0] in _PREPOSITIONS and things and verb not in _ANSWERING_VERBS:
        # "send car {car_id} to maintenance"
        text = f"{verb} {_param_phrase(things[0], entities)} {obj}"
        placed.add(things[0])
    elif obj and verb in _MAKING_VERBS and things:  # "place hold on book {book_id}"
        text = f"{verb} {obj} on {_param_phrase(things[0], entities)}"
        placed.add(things[0])
    elif obj and len(keyed) == 1 and rest[0] not in _PREPOSITIONS:
        # "freeze the membership of member {member_id}"
        (only,) = keyed
        text = f"{verb} the {obj} of {_param_phrase(only, entities)}"
        placed.add(only)
    else:
        text = f"{verb} {obj}".strip()
    scalars: list[str] = []
    for p in required:
        if p in placed:
            continue
        if p in things:
            text += f" on {_param_phrase(p, entities)}"
        elif p in people:
            text += f" {'to' if verb in _GIVING_VERBS else 'for'} {_param_phrase(p, entities)}"
        elif _words(p) in _DURATIONS:
            text += f" for {{{p}}} {_words(p)}"
        else:
            scalars.append(_param_phrase(p, entities))
    if scalars:  # "with line1 {line1}, city {city} and zip {zip}"
        text += " with " + (
            scalars[0] if len(scalars) == 1 else ", ".join(scalars[:-1]) + " and " + scalars[-1]
        )
    return text


def derive_phrases(env: EnvShape) -> Phrases:
    """The vocabulary of an env that ships none, and the generated `phrases.toml` of a synthesized one."""
    service = service_word(env.tools)
    entities = derive_entities(env.tables, service)
    tools = {
        name: ToolPhrase(phrase=derive_tool_phrase(spec, entities, service))
        for name, spec in sorted(env.tools.items())
    }
    return Phrases(entities=entities, tools=tools)


# --------------------------------------------------------------------------- file


def load_phrases(env: EnvShape) -> Phrases:
    """The env's `phrases.toml`, gated; tables and tools it leaves out are derived. No file: derived."""
    derived = derive_phrases(env)
    path = env.root / PHRASES_FILE
    if not env_file_exists(env.root, PHRASES_FILE):
        return derived
    try:
        raw = tomllib.loads(read_env_text(env.root, PHRASES_FILE))  # never through a link out
        written = Phrases.model_validate(raw)
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise PhraseError(f"{path}: {first}") from None
    merged = Phrases(
        entities={**derived.entities, **written.entities},
        tools={**derived.tools, **written.tools},
    )
    problems = phrase_problems(merged, env.tools)
    if problems:
        raise PhraseError(
            f"{path}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    return merged


def phrases_toml(phrases: Phrases, header: str = "") -> str:
    """`phrases` as the TOML file reads (JSON strings are TOML basic strings)."""
    lines = [f"# {line}" for line in header.splitlines()]
    for table, e in sorted(phrases.entities.items()):
        lines += ["", f"[entities.{table}]"]
        for k, v in e.model_dump().items():
            if v is not None:
                lines.append(f"{k} = {json.dumps(v, ensure_ascii=False)}")
    for tool, tp in sorted(phrases.tools.items()):
        lines += ["", f"[tools.{tool}]", f"phrase = {json.dumps(tp.phrase, ensure_ascii=False)}"]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_phrases(env: EnvShape, header: str = "Generated from the tool names and the schema.") -> Path:
    """Write the derived vocabulary into the env folder (env synthesis; `envforge synth phrases`)."""
    return replace_file(env.root / PHRASES_FILE, phrases_toml(derive_phrases(env), header))
