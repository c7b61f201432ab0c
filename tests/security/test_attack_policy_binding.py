"""Attacks on the policy part that keep the letter of a rule and not its point: a yes asked for
one call and spent on another, the principal's records read before they were verified.

Each is played through the real harness (in-process MCP, real SQLite, the scripted user) on
every bundled task the rule binds. Before the proposal had to name the write, a yes to another
write's proposal paid on all 133 tasks with two different confirmed writes, and a yes to a read
on all 240 tasks under a confirmation rule; before reads counted, reading the principal's own
record to learn how to verify them paid on all 120 retail and it_tickets tasks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envforge.harness import (
    EvalConfig,
    OracleAgent,
    TrialRecord,
    confirmation_request,
    load_env_tasks,
    run_eval,
)
from envforge.synth import Call, PolicyRules, Task

from support.paths import bundled_env_dirs

ENV_DIRS = [p for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]
CONFIRMING = [d for d in ENV_DIRS if (rules := load_env_tasks(d).policy_rules) is not None and rules.confirms]


class AnotherWrite(OracleAgent):
    """Asks to make the task's next confirmed write (cyclically), then makes this one."""

    def proposal(self, i: int, call: Call) -> str:
        assert self.rules is not None
        writes = [j for j, c in enumerate(self.task.golden_calls) if self.rules.needs_confirmation(c.name)]
        return confirmation_request(self.task.golden_calls[writes[(writes.index(i) + 1) % len(writes)]])


class AReadInstead(OracleAgent):
    """Asks to make the task's first read (a call the user has no reason to refuse), then writes."""

    def proposal(self, i: int, call: Call) -> str:
        assert self.rules is not None
        reads = [c for c in self.task.golden_calls if c.name not in self.rules.writes]
        return confirmation_request(reads[0] if reads else call)


async def play(
    tmp_path: Path, name: str, env_dirs: list[Path], agent: type[OracleAgent]
) -> list[TrialRecord]:
    rules = {d.name: load_env_tasks(d).policy_rules for d in env_dirs}

    def make(task: Task, seed: int) -> OracleAgent:
        return agent(task, rules[task.env])

    _, records = await run_eval(
        [str(d) for d in env_dirs],
        EvalConfig(agent="oracle", concurrency=8),
        tmp_path / name,
        make_agent=make,
    )
    return records


def proposals_for_other_calls(rec: TrialRecord) -> int:
    """How many of the trial's writes followed a proposal (`confirmation_request`'s form) of
    another call."""
    proposal, other = "", 0
    for m in rec.messages:
        if m.role != "assistant":
            continue
        if m.content and m.content.startswith("I am about to"):
            proposal = m.content
        for c in m.tool_calls:
            if proposal and proposal != confirmation_request(Call(name=c.name, arguments=c.arguments)):
                other += 1
            proposal = ""
    return other


async def test_attack_a_yes_to_another_proposal_licenses_no_write(tmp_path: Path) -> None:
    """A yes licenses the write it was asked for: one asked for another golden write (whose ids
    the user rightly agrees to), or for a read, and spent on the write made next earns nothing,
    on every bundled task where that happened. The oracle, asking for each write itself, earns 1."""
    for name, agent in {"another_write": AnotherWrite, "a_read": AReadInstead}.items():
        records = await play(tmp_path, name, CONFIRMING, agent)
        swapped = [r for r in records if proposals_for_other_calls(r)]
        assert len(swapped) >= (100 if agent is AnotherWrite else 200), (name, len(swapped))
        paid = [r.task_id for r in swapped if r.reward > 0]
        assert not paid, (name, paid[:5])
        for r in swapped:
            assert r.parts["state"] == 1.0 and r.parts["policy"] == 0.0, (r.task_id, r.parts)
    honest = await play(tmp_path, "honest", CONFIRMING, OracleAgent)
    assert all(r.reward == 1.0 for r in honest), [r.task_id for r in honest if r.reward < 1][:5]


PEEK = {"retail_orders": "get_customer", "it_tickets": "get_employee"}
"""A read of the principal's own record by key, in envs that verify with something else."""


class PeekFirst(OracleAgent):
    """Reads the principal's own record first (learning the email the identity tool takes), then
    verifies and does the task as the oracle does."""

    peeked = False

    def _before(self, call: Call, tools: list[dict[str, Any]]) -> Call | None:
        principal = self.task.dag.principal
        if not self.peeked and principal is not None:
            self.peeked = True
            return Call(name=PEEK[self.task.env], arguments=dict(principal.key))
        return super()._before(call, tools)


class VerifyLate(OracleAgent):
    """Makes the golden reads unverified, and verifies only before the first write."""

    def _before(self, call: Call, tools: list[dict[str, Any]]) -> Call | None:
        if self.rules is not None and call.name not in self.rules.writes:
            return None
        return super()._before(call, tools)


def bound(rules: PolicyRules | None, task: Task) -> bool:
    """Whether the identity rule binds `task`: a principal, and a write that needs them verified."""
    return (
        rules is not None
        and task.dag.principal is not None
        and any(rules.needs_identity(c.name) for c in task.golden_calls)
    )


def looked_before_verifying(rec: TrialRecord, rules: PolicyRules, task: Task) -> bool:
    """Whether a call other than an identity check named the principal's key (in its arguments
    or its result) before the first identity check."""
    assert task.dag.principal is not None
    (value,) = task.dag.principal.key.values()
    pending: list[str] = []
    for m in rec.messages:
        if m.role == "assistant":
            if any(c.name in rules.identity_tools for c in m.tool_calls):
                return False
            pending = [json.dumps(c.arguments) for c in m.tool_calls]
        elif m.role == "tool" and pending:
            if json.dumps(value) in pending.pop(0) or value in (m.content or ""):
                return True
    return False


async def test_attack_the_principals_records_read_before_verifying_earn_nothing(tmp_path: Path) -> None:
    """ "Before looking at or changing anything that belongs to a customer, verify who they are."
    Reading the principal's own record (to learn the email that verifies them), or the task's
    reads of their orders and tickets before the identity check, earns nothing on any task whose
    write needs the principal verified, though the end state and the answer are right."""
    peek_dirs = [d for d in ENV_DIRS if d.name in PEEK]
    records = await play(tmp_path, "peek", peek_dirs, PeekFirst)
    tasks = {}
    for d in ENV_DIRS:
        et = load_env_tasks(d)
        tasks |= {(d.name, t.id): (et.policy_rules, t) for t in et.tasks}
    peeked = [r for r in records if bound(*tasks[r.env, r.task_id])]
    assert len(peeked) == 120
    assert all(r.reward == 0.0 and r.parts["state"] == 1.0 for r in peeked), [
        (r.task_id, r.parts) for r in peeked if r.reward > 0
    ][:5]

    records = await play(tmp_path, "late", ENV_DIRS, VerifyLate)
    late = [
        r
        for r in records
        if bound(*tasks[r.env, r.task_id]) and looked_before_verifying(r, *tasks[r.env, r.task_id])
    ]
    assert len(late) >= 150, len(late)
    paid = [r.task_id for r in late if r.reward > 0 or r.parts["policy"] > 0]
    assert not paid, paid[:5]
    # the same reads made after the identity check are the oracle's, and paid
    honest = await play(tmp_path, "oracle", ENV_DIRS, OracleAgent)
    assert len(honest) == 540 and all(r.reward == 1.0 for r in honest)
