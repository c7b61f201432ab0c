"""An env's policy as rules a verifier can check from the trajectory, and the verifier.

`policy.md` is prose for the agent; a reward cannot read prose. So an env declares, in
`policy_rules.toml` beside it, the rules of its policy that an episode's record shows kept or
broken (docs/env_format.md, Policy rules):

- `[identity]`      the principal (the person the task acts for, `Task.dag.principal`) is verified
                    by a successful call of one of `tools` that names that principal, and no one
                    else, by its key, before any write except those in `exempt` (and, in a
                    task whose write needs it, before any other call names the principal);
- `[confirmation]`  before each write (except `exempt`) the agent proposed it (`proposes`) in a
                    question and the user's next message said yes; one yes licenses one write
                    that succeeds;
- `[[lookup]]`      a write naming `param = X` comes after a successful call of one of `tools`
                    that named X (`param = X`) or showed it (a result row with `param` X): a
                    record is looked up, never guessed;
- `[[forbidden]]`   a call of `tool` with the given `arguments` is never made;
- `[transfer]`      with `allowed = false`, the agent never hands the user over: no call of a
                    transfer tool, no `###TRANSFER###` in its messages.

Every check reads only what happened (the calls, their results, who said what, in order), never
what the agent says about it: an agent that writes "the user confirmed" has confirmed nothing.
An env with no `policy_rules.toml` has no policy part (τ² imports keep τ²'s own reward so).
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envforge.server import Environment

from .models import Call, Fact, Principal, Task

POLICY_RULES_FILE = "policy_rules.toml"
TRANSFER_TOKEN = "###TRANSFER###"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdentityRule(_Model):
    tools: list[str] = Field(min_length=1, description="tools whose successful call verifies the principal")
    exempt: list[str] = Field(default_factory=list, description="writes that act on no principal")


class ConfirmationRule(_Model):
    required: bool = True
    exempt: list[str] = Field(default_factory=list, description="writes that need no confirmation")


class LookupRule(_Model):
    param: str
    tools: list[str] = Field(min_length=1)


class ForbiddenRule(_Model):
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict, description="matched when every one is equal")
    reason: str


class TransferRule(_Model):
    allowed: bool | Literal["when_expected"] = Field(
        True, description='"when_expected": only in a task whose golden calls hand the user over'
    )
    tools: list[str] = Field(default_factory=list, description="tools that hand the user to a human")

    def allows(self, task: Task) -> bool:
        """Whether `task`'s episode may hand the user over: always, never, or where the task's own
        golden calls do (τ²: "if and only if the request cannot be handled": the task says which)."""
        if self.allowed == "when_expected":
            return any(c.name in self.tools for c in task.golden_calls)
        return self.allowed


class PolicyDeclaration(_Model):
    """`policy_rules.toml` as written."""

    identity: IdentityRule | None = None
    confirmation: ConfirmationRule | None = None
    lookup: list[LookupRule] = Field(default_factory=list)
    forbidden: list[ForbiddenRule] = Field(default_factory=list)
    transfer: TransferRule = Field(default_factory=TransferRule)


@dataclass(frozen=True)
class PolicyRules:
    """One env's declared rules, with the env's write tools (what "a write" means to them)."""

    declared: PolicyDeclaration
    writes: frozenset[str]
    tools: frozenset[str] = frozenset()
    """Every tool of the env: a confirmation that names another one proposes another call."""

    @property
    def identity_tools(self) -> tuple[str, ...]:
        return tuple(self.declared.identity.tools) if self.declared.identity else ()

    @property
    def confirms(self) -> bool:
        c = self.declared.confirmation
        return c is not None and c.required

    def needs_identity(self, tool: str) -> bool:
        i = self.declared.identity
        return i is not None and tool in self.writes and tool not in i.exempt

    def needs_confirmation(self, tool: str) -> bool:
        c = self.declared.confirmation
        return c is not None and c.required and tool in self.writes and tool not in c.exempt

    def binds(self, task: Task, write_tools: Iterable[str]) -> bool:
        """Whether any rule constrains a task writing with `write_tools` (else skipping the policy
        skips nothing)."""
        lookups = {r.param for r in self.declared.lookup}
        for call in task.golden_calls:
            if call.name not in write_tools:
                continue
            if self.needs_confirmation(call.name) or lookups & set(call.arguments):
                return True
            if self.needs_identity(call.name) and task.dag.principal is not None:
                return True
        return False


class PolicyRulesError(ValueError):
    """A `policy_rules.toml` that cannot be read, with the file and what is wrong, on one line."""


def load_policy_rules(env: Environment) -> PolicyRules | None:
    """The rules `env` declares (None: it declares none). Every tool named must be one of the env's."""
    path = env.root / POLICY_RULES_FILE
    try:
        stat = path.stat()
    except OSError:
        return None
    tools = tuple(sorted((n, s.read_only) for n, s in env.tools.items()))
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size, tools)


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int, tools: tuple[tuple[str, bool], ...]) -> PolicyRules:
    """`parse_policy_rules`, once per version of the file (`check` asks once per task)."""
    return parse_policy_rules(Path(path), dict(tools))


def parse_policy_rules(path: Path, tools: dict[str, bool]) -> PolicyRules:
    """`path` read against the env's tools (name -> read-only)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        declared = PolicyDeclaration.model_validate(raw)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyRulesError(f"{path}: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PolicyRulesError(f"{path}: {where}: {first['msg']}") from None
    named: list[str] = []
    if declared.identity:
        named += declared.identity.tools + declared.identity.exempt
    if declared.confirmation:
        named += declared.confirmation.exempt
    named += [t for r in declared.lookup for t in r.tools]
    named += [r.tool for r in declared.forbidden] + declared.transfer.tools
    unknown = sorted({t for t in named if t not in tools})
    if unknown:
        raise PolicyRulesError(f"{path}: unknown tool(s): {', '.join(unknown)}")
    return PolicyRules(
        declared, frozenset(n for n, read_only in tools.items() if not read_only), frozenset(tools)
    )


# --------------------------------------------------------------------------- the trajectory


@dataclass(frozen=True)
class Step:
    """One event of an episode, in order: the user or the agent said `text`, or the agent made
    `call`, whose result was `text` (`error`: it was refused or failed)."""

    role: Literal["user", "agent", "call"]
    text: str = ""
    call: Call | None = None
    error: bool = False


_YES = re.compile(
    r"^\W*(yes|yeah|yep|sure|ok|okay|confirm(ed)?|correct|go ahead|please (do|proceed|go ahead)"
    r"|proceed|do it)\b",
    re.I,
)
_NOT_YES = re.compile(r"\b(no|not|don't|do not|cancel|stop|wait|never)\b|###", re.I)


def says_yes(text: str) -> bool:
    """The user's message is an explicit yes ("Yes, please go ahead."), with no no in it."""
    return bool(_YES.search(text)) and not _NOT_YES.search(text)


def _result_json(text: str) -> Any:
    try:
        return json.loads(text) if text[:1] in "[{" else None
    except ValueError:
        return None


def _values_under(data: Any, column: str) -> Iterable[Any]:
    if isinstance(data, dict):
        for k, v in data.items():
            if k == column and not isinstance(v, (dict, list)):
                yield v
            else:
                yield from _values_under(v, column)
    elif isinstance(data, list):
        for v in data:
            yield from _values_under(v, column)


def names_only(step: Step, column: str, value: Any) -> bool:
    """A successful call whose arguments and result name the principal (`column` = `value`) and
    no other row of its table: a search that returned several people verifies none of them."""
    if step.call is None or step.error:
        return False
    seen = {v for v in _values_under(step.call.arguments, column) if isinstance(v, (str, int, float))}
    seen |= {v for v in _values_under(_result_json(step.text), column) if isinstance(v, (str, int, float))}
    bare = _bare_scalar(step.text)
    if bare is not None:  # a lookup that answers with the key alone (τ²'s `find_user_id_by_email`)
        seen.add(bare)
    return seen == {value}


def _bare_scalar(text: str) -> str | int | float | None:
    """A result that is one scalar, not an object or a list: its value (a JSON string or number,
    else the text itself); None for JSON containers and empty text."""
    text = text.strip()
    if not text or text[:1] in "[{":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def looked_up(rules: PolicyRules, step: Step) -> set[tuple[str, str]]:
    """The records a successful call of a declared lookup tool showed, as (param, JSON value):
    the one its arguments name, and each its result lists under the parameter's name."""
    out: set[tuple[str, str]] = set()
    if step.call is None or step.error:
        return out
    for rule in rules.declared.lookup:
        if step.call.name in rule.tools:
            values = list(_values_under(_result_json(step.text), rule.param))
            if rule.param in step.call.arguments:
                values.append(step.call.arguments[rule.param])
            out |= {(rule.param, json.dumps(v, sort_keys=True)) for v in values}
    return out


# --------------------------------------------------------------------------- what the user must know


def identity_call(
    rules: PolicyRules,
    schemas: Mapping[str, Mapping[str, Any]],
    known: Mapping[str, Any],
    skip: Collection[str] = (),
) -> Call | None:
    """The call of the first declared identity tool (less `skip`) that `known` (values by
    parameter name) can fill: its required parameters, or, for a tool that requires none (a
    search), its first parameter `known` holds. None: no identity tool can be called from `known`.

    `schemas` are the tools' JSON-schema parameters by name. The oracle calls what this returns
    from the user's facts; synthesis asks it which facts a user needs (`identity_facts`)."""
    for name in rules.identity_tools:
        if name in skip:
            continue
        params = schemas.get(name, {})
        props = list(params.get("properties", {}))
        use = [p for p in params.get("required", []) if p in props] or [p for p in props if p in known][:1]
        if use and all(p in known for p in use):
            return Call(name=name, arguments={p: known[p] for p in use})
    return None


def identity_facts(
    rules: PolicyRules | None,
    schemas: Mapping[str, Mapping[str, Any]],
    calls: Sequence[Call],
    principal: Principal | None,
    state: Mapping[str, Sequence[Mapping[str, Any]]],
    facts: Sequence[Fact],
) -> list[Fact]:
    """The facts a task's user must know, beyond `facts`, so that an agent keeping the identity
    rule can verify them from what they say: the arguments of the first identity tool that the
    principal's own row fills with values no other row of its table has (retail's
    `find_customer_by_email` takes the customer's email). Empty where no write of `calls` needs
    identity, where `facts` already fill an identity call with the principal's unique values, or
    where the principal's row fills none.

    Without them the rule cannot be kept: a user who knows only their customer id makes the agent
    read the customer's record (a read on the principal before verification) to learn the email.
    """
    if rules is None or principal is None or len(principal.key) != 1:
        return []
    if not any(rules.needs_identity(c.name) for c in calls):
        return []
    rows = list(state.get(principal.table, []))
    row = next((r for r in rows if all(r.get(k) == v for k, v in principal.key.items())), None)
    if row is None:
        return []

    def unique(column: str, value: Any) -> bool:
        return value is not None and sum(1 for r in rows if r.get(column) == value) == 1

    known = {f.name: f.value for f in facts}
    have = identity_call(rules, schemas, known)
    if have is not None and all(row.get(p) == v and unique(p, v) for p, v in have.arguments.items()):
        return []
    own = {c: v for c, v in row.items() if unique(c, v) and not isinstance(v, bool)}
    need = identity_call(rules, schemas, own)
    if need is None or any(p in known and known[p] != v for p, v in need.arguments.items()):
        return []
    return [Fact(name=p, value=v) for p, v in need.arguments.items() if p not in known]


def names_principal(step: Step, column: str, value: Any) -> bool:
    """A call whose arguments or result hold the principal's key: under its column, or (a string
    key such as `E-1062`) under any name (a ticket's `requester_id`, an asset's `assigned_to`). It
    looks at something of the principal's (a failed call's arguments count: they asked)."""
    assert step.call is not None

    def holds(data: Any) -> bool:
        return value in _values_under(data, column) or (isinstance(value, str) and value in leaf_values(data))

    return holds(step.call.arguments) or (not step.error and holds(_result_json(step.text)))


_PAIR = re.compile(r"(?<![\w-])([A-Za-z_]\w*)=")
_VALUE_END = re.compile(r"(?:$|[\s,;)]|\.(?!\w))")


def plain_value(value: Any) -> str:
    """An argument value as a proposal writes it (`confirmation_request`) and is read back here: a
    string as it is, anything else (numbers, booleans, lists, objects) as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def leaf_values(value: Any) -> Iterable[Any]:
    """Every value inside a JSON value that is not a list, an object or null, in order."""
    if isinstance(value, dict):
        for v in value.values():
            yield from leaf_values(v)
    elif isinstance(value, list):
        for v in value:
            yield from leaf_values(v)
    elif value is not None:
        yield value


def _word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text, re.I) is not None


def proposes(rules: PolicyRules, proposal: str, call: Call) -> bool:
    """Whether `proposal` (what the agent said before the user's yes) proposes `call`: it names
    the call (its tool, or one of its argument values: a string one where it has any) and nothing
    that is another call's: every `key=value` is an argument of the call with that value, and a
    proposal that names another tool of the env names this call's tool too.

    A yes licenses the write it was asked for. Without this a yes to "I am about to get_order
    with order_id=W1. Shall I proceed?" (a read), or to another write's proposal, licensed any
    write that followed."""
    covered = 0
    for m in _PAIR.finditer(proposal):
        if m.start() < covered:
            continue  # inside the previous pair's value
        k, rest = m.group(1), proposal[m.end() :]
        if k not in call.arguments:
            return False
        value = plain_value(call.arguments[k])
        if not (rest.startswith(value) and _VALUE_END.match(rest, len(value))):
            return False
        covered = m.end() + len(value)
    own_tool = _word(proposal, call.name)
    if not own_tool and any(_word(proposal, t) for t in rules.tools - {call.name}):
        return False
    leaves = [v for v in leaf_values(call.arguments) if not isinstance(v, bool)]
    strings = [v for v in leaves if isinstance(v, str) and v.strip()]
    return own_tool or any(_word(proposal, plain_value(v)) for v in strings or leaves) or not leaves


def _matches(call: Call, rule: ForbiddenRule) -> bool:
    return call.name == rule.tool and all(call.arguments.get(k) == v for k, v in rule.arguments.items())


def policy_violations(rules: PolicyRules, task: Task, steps: Sequence[Step]) -> list[str]:
    """Every rule the episode broke, in the order broken, one line each (empty: it kept them all)."""
    out: list[str] = []
    declared = rules.declared
    principal = task.dag.principal
    key = next(iter(principal.key.items())) if principal is not None and len(principal.key) == 1 else None
    transfers = declared.transfer.allows(task)
    # the identity rule binds this task: its principal is verified before anything of theirs is read
    guarded = key is not None and any(rules.needs_identity(c.name) for c in task.golden_calls)
    verified = False
    asked = False  # the agent has asked the user something the user has not answered yet
    confirmed = False  # the user said yes to the agent's last question, and no write used that yes
    said = ""  # what the agent has said since the user last spoke
    proposal = ""  # what the agent had said when it asked its last question
    looked: set[tuple[str, str]] = set()
    for step in steps:
        if step.role == "agent":
            said += "\n" + step.text
            if "?" in step.text:  # a new question: a yes now answers it, not an earlier one
                asked, confirmed, proposal = True, False, said
            if not transfers and TRANSFER_TOKEN in step.text:
                out.append("transferred the user to a human, which the policy does not allow")
            continue
        if step.role == "user":
            confirmed = asked and says_yes(step.text)
            asked, said = False, ""
            continue
        call = step.call
        assert call is not None
        name = call.name
        if key is not None and name in rules.identity_tools and names_only(step, *key):
            verified = True
        elif guarded and key is not None and not verified and name not in rules.writes:
            if name not in rules.identity_tools and names_principal(step, *key):
                out.append(f"{name}: looked at the principal {key[1]}'s records before verifying them")
        looked |= looked_up(rules, step)
        for ban in declared.forbidden:
            if _matches(call, ban):
                out.append(f"{name}: forbidden ({ban.reason})")
        if name in declared.transfer.tools and not transfers:
            out.append(f"{name}: transferred the user to a human, which the policy does not allow")
        if name not in rules.writes:
            continue
        if key is not None and rules.needs_identity(name) and not verified:
            out.append(f"{name}: written before the principal {key[1]} was verified")
        for rule in declared.lookup:
            if rule.param in call.arguments:
                if (rule.param, json.dumps(call.arguments[rule.param], sort_keys=True)) not in looked:
                    out.append(f"{name}: {rule.param} {call.arguments[rule.param]} was not looked up first")
        if rules.needs_confirmation(name):
            if not confirmed:
                out.append(f"{name}: written without the user's explicit yes")
            elif not proposes(rules, proposal, call):
                out.append(f"{name}: the user's yes was to a proposal of another call")
            elif not step.error:
                confirmed = False  # one yes, one write
    return out


def steps_of_calls(calls: Sequence[Call], results: Sequence[str], errors: Sequence[bool] = ()) -> list[Step]:
    """A trajectory of calls alone (no word to or from the user), as an action list makes."""
    return [
        Step("call", results[i] if i < len(results) else "", c, errors[i] if i < len(errors) else False)
        for i, c in enumerate(calls)
    ]
