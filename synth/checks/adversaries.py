"""Adversarial agents: the cheap tricks a policy finds first, as pure action-list generators.

A reward that one of these earns in full can be gamed, so `envforge check` fails such a task and
synthesis never ships one. Each adversary is a list of tool calls (chosen from the task and the
env's tool list, before anything runs) and a final message (built from what the calls returned):

- `spray`          the golden calls, then a message stating every candidate value: each number
                   from 0 to 999, every value seen in tool results and every entity id it knows;
- `read_all`       every read tool once per plausible argument set (taken from the task's calls
                   and the user's facts), no write at all, then the same kind of spray;
- `double_write`   the golden calls with each write made twice in a row, then the required outputs;
- `golden_prefix`  the golden calls up to and including the first write, then the required outputs;
- `skip_policy`    the golden calls less those that keep the env's declared policy (identity
                   checks, record lookups), with no word to the user before a write (so no
                   confirmation), then the required outputs;
- `copy_result`    the golden calls, then every result they returned, verbatim, as the answer
                   (an answer read off a result named among its neighbours, docs/scoring.md).

Some runs are the golden solution in disguise and prove nothing: `spray` on a task whose reward
does not rest on stated outputs, `read_all` on such a task whose golden agent calls are all
among its reads (a gold that writes nothing, such as τ² telecom's transfers to a human),
`golden_prefix` on a task with one write, and `double_write`
when every repeat was refused or changed nothing (its end state is the golden one), and
`skip_policy` where no declared rule binds the task's writes (there is nothing to skip), and
`copy_result` where the copy states the required outputs and nothing else a hedge could hold
(it earns with nothing shown: the results held the answers alone). `counts`
says which runs are judged. The same generators serve synthesis and check (`verify.py`, run on
SQLite directly) and the harness's built-in agents (`harness/agents.py`, run through MCP).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any

from ..task.models import Call, Task, ToolShape
from ..task.policy_rules import PolicyRules, leaf_values
from ..task.scoring import task_outputs_missing
from ..walk.memo import BoundedMemo


class Adversary(StrEnum):
    """The adversarial agents (a closed set: the harness plays each as a built-in agent)."""

    SPRAY = "spray"
    READ_ALL = "read_all"
    DOUBLE_WRITE = "double_write"
    GOLDEN_PREFIX = "golden_prefix"
    SKIP_POLICY = "skip_policy"
    COPY_RESULT = "copy_result"


ADVERSARIES: tuple[Adversary, ...] = tuple(Adversary)

# The numbers every spray states, whatever it saw: a short numeric answer is among them.
SPRAY_NUMBERS = range(1000)
# Argument sets `read_all` tries per read tool at most.
READ_ALL_PER_TOOL = 5

# The numbers' texts, made once (every spray message starts with them).
_SPRAY_NUMBER_TEXTS: dict[str, None] = {str(i): None for i in SPRAY_NUMBERS}

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]*")


def write_positions(task: Task, write_tools: set[str]) -> list[int]:
    """Positions in `golden_calls` of write calls meant to succeed (calls the task expects to be
    refused are left out: they change nothing)."""
    refused = {
        json.dumps(n.call.model_dump(), sort_keys=True)
        for n in task.dag.nodes
        if n.kind == "call" and n.expect_error
    }
    return [
        i
        for i, c in enumerate(task.golden_calls)
        if c.name in write_tools and json.dumps(c.model_dump(), sort_keys=True) not in refused
    ]


def _argument_pool(task: Task) -> dict[str, list[Any]]:
    """Per parameter name, the values the task's calls and the user's facts use, in first-seen order."""
    pool: dict[str, list[Any]] = {}

    def add(name: str, value: Any) -> None:
        values = pool.setdefault(name, [])
        if value not in values:
            values.append(value)

    for call in task.golden_calls:
        for name, value in call.arguments.items():
            add(name, value)
    for node in task.dag.nodes:
        if node.kind == "call":
            for name, value in node.call.arguments.items():
                add(name, value)
    for fact in task.scenario.known_facts:
        add(fact.name, fact.value)
    return pool


def read_all_calls(task: Task, tools: Sequence[ToolShape]) -> list[Call]:
    """Each read tool (by name) once per argument set the task makes plausible: the i-th set takes
    each required parameter's i-th known value (its last when it has fewer). A tool with a required
    parameter the task says nothing about is skipped: it could only be called with a guess."""
    pool = _argument_pool(task)
    calls: list[Call] = []
    for tool in sorted((t for t in tools if t.read_only), key=lambda t: t.name):
        if any(p not in pool for p in tool.required):
            continue
        sets = max((len(pool[p]) for p in tool.required), default=1)
        for i in range(min(sets, READ_ALL_PER_TOOL)):
            args = {p: pool[p][min(i, len(pool[p]) - 1)] for p in tool.required}
            calls.append(Call(name=tool.name, arguments=args))
    return calls


def policy_keeping_tools(policy: PolicyRules | None) -> set[str]:
    """The tools whose calls keep a declared rule (identity checks, record lookups)."""
    if policy is None:
        return set()
    return set(policy.identity_tools) | {t for r in policy.declared.lookup for t in r.tools}


def adversary_calls(
    name: str, task: Task, tools: Sequence[ToolShape], policy: PolicyRules | None = None
) -> list[Call]:
    """The tool calls adversary `name` makes on `task`, in order (`policy`: the env's declared
    rules, which `skip_policy` skips)."""
    writes = set(write_positions(task, {t.name for t in tools if not t.read_only}))
    golden = list(task.golden_calls)
    if name in ("spray", "copy_result"):
        return golden
    if name == "read_all":
        return read_all_calls(task, tools)
    if name == "double_write":
        return [c for i, c in enumerate(golden) for _ in range(2 if i in writes else 1)]
    if name == "golden_prefix":
        return golden[: min(writes) + 1] if writes else golden
    if name == "skip_policy":
        keeping = policy_keeping_tools(policy)
        return [c for c in golden if c.name not in keeping]
    raise ValueError(f"unknown adversary {name!r} (one of {', '.join(ADVERSARIES)})")


def result_values(texts: Iterable[str]) -> list[str]:
    """Every value tool results showed, as text: JSON leaves (a float also to cents, as answers
    about money are written), or the word-like tokens of a plain-text result; each with its
    runs of white space made one space and its ends trimmed, as the spray states it."""
    return [value for text in texts for value in _text_values(text)]


# Result texts whose values are kept: the same lookups' results recur from task to task.
_VALUES_KEPT = 4096
_values_of: BoundedMemo[str, tuple[str, ...]] = BoundedMemo(_VALUES_KEPT)


def _text_values(text: str) -> tuple[str, ...]:
    """`result_values` of one text, worked out once per text."""
    hit = _values_of.get(text)
    if hit is not None:
        return hit
    try:
        data = json.loads(text) if text[:1] in "[{" else None
    except ValueError:
        data = None
    out: list[str] = []
    if data is None:
        out.extend(_TOKEN.findall(text))
    else:
        for v in leaf_values(data):
            if isinstance(v, bool):
                out.append(str(v).lower())
            elif isinstance(v, float):
                out.extend((repr(v), f"{v:.2f}"))
            else:
                out.append(str(v))
    return _values_of.put(text, tuple(map(_spaced, out)))


def _spaced(value: str) -> str:
    """`value` with each run of white space made one space, its ends trimmed."""
    return " ".join(value.split())


def spray_message(results: Iterable[str], entity_ids: Iterable[str] = ()) -> str:
    """One message stating every candidate answer, one a line: 0..999, what the results showed, the ids."""
    seen = dict(_SPRAY_NUMBER_TEXTS)
    # `update` leaves a key already there where it is: first mentions keep their place
    seen.update(dict.fromkeys((*result_values(results), *_spaced_ids(entity_ids))))
    return "The answer is one of:\n" + "\n".join(seen)


# The last tuples of ids spaced, with their spaced ids: synthesis passes the same tuple (its state
# cache's: one for the seed, one for the latest setup) for every task on the same initial state,
# often a thousand ids or more.
_SPACED_IDS_KEPT = 2
_spaced_kept: list[tuple[tuple[str, ...], tuple[str, ...]]] = []


def _spaced_ids(entity_ids: Iterable[str]) -> tuple[str, ...]:
    for ids, spaced in _spaced_kept:
        if ids is entity_ids:
            return spaced
    spaced = tuple(map(_spaced, entity_ids))
    if isinstance(entity_ids, tuple):  # immutable: the same object has the same ids
        _spaced_kept.insert(0, (entity_ids, spaced))
        del _spaced_kept[_SPACED_IDS_KEPT:]
    return spaced


def adversary_message(name: str, task: Task, results: Sequence[str], entity_ids: Iterable[str] = ()) -> str:
    """The final message adversary `name` says after its calls returned `results`."""
    if name in ("spray", "read_all"):
        return spray_message(results, entity_ids)
    if name == "copy_result":
        return "\n".join(results)
    return ("All done. " + "; ".join(task.required_outputs)).strip()


def counts(
    name: str,
    task: Task,
    tools: Sequence[ToolShape],
    *,
    reached_golden: bool,
    policy: PolicyRules | None = None,
    message: str | None = None,
    calls: Sequence[Call] | None = None,
) -> bool:
    """Whether a run of adversary `name` is judged: False where it is the golden solution in
    disguise. `reached_golden` says whether the run ended in the golden state (to cents);
    `message` and `calls`, where known, are what the run says at the end and the calls it made."""
    if name == "copy_result":
        outputs = "outputs" in task.reward_basis and bool(task.required_outputs)
        return outputs and (message is None or bool(task_outputs_missing(task, [message])))
    if name == "skip_policy":
        return policy is not None and policy.binds(task, {t.name for t in tools if not t.read_only})
    if name == "spray":
        return "outputs" in task.reward_basis and bool(task.required_outputs)
    if name == "golden_prefix":
        return len(write_positions(task, {t.name for t in tools if not t.read_only})) > 1
    if name == "double_write":
        return not reached_golden
    if name == "read_all" and calls is not None and "outputs" not in task.reward_basis:
        # A gold that writes nothing (τ² telecom's transfers to a human) can be among the reads:
        # with no stated outputs to spray, the run is then the gold with extra reads.
        agent_gold = [c for c in task.golden_calls if c.requestor == "assistant"]
        return not agent_gold or not all(c in calls for c in agent_gold)
    return True
