"""Attacks on a reward that leaves the env's policy out: the golden writes made without the
identity check or the user's yes, a yes asked for after the write, another person verified.

Each plays through the real harness (in-process MCP, real SQLite, the scripted user) on bundled
tasks; before the policy part existed every one of them earned 1.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envforge.harness import (
    EvalConfig,
    Message,
    OracleAgent,
    ToolCall,
    confirmation_request,
    load_env_tasks,
    run_eval,
)
from envforge.synth import (
    Call,
    PolicyRulesError,
    Task,
    ToolShape,
    adversary_calls,
    compose_reward,
    counts,
    load_policy_rules,
    oracle_messages,
    parse_policy_rules,
    steps_of_calls,
)
from envforge.synth import Evidence as Ev

from conftest import REPO

RETAIL = REPO / "envs" / "retail_orders"
ENV_DIRS = sorted(p for p in (REPO / "envs").iterdir() if (p / "tasks.jsonl").exists())


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(c: Call, n: int) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=f"a{n}", name=c.name, arguments=c.arguments)])


class Script:
    """Plays a fixed list of turns (a call or a text), then states the required outputs."""

    def __init__(self, task: Task, turns: list[Call | str]) -> None:
        self.task, self.turns, self.at = task, turns, 0

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        if self.at < len(self.turns):
            turn = self.turns[self.at]
            self.at += 1
            return say(turn) if isinstance(turn, str) else call(turn, self.at)
        return say(f"All done. {'; '.join(self.task.required_outputs)}".strip())


def writing_task() -> tuple[Task, list[Call], Call, Call]:
    """A retail task with one successful write on a customer, that customer's email identity call,
    and the same call for another customer."""
    et = load_env_tasks(RETAIL)
    rules = et.policy_rules
    assert rules is not None
    seed = et.env.seed_state()
    for task in et.tasks:
        writes = [c for c in task.golden_calls if c.name in rules.writes]
        if len(writes) != 1 or task.setup or task.dag.principal is None:
            continue
        me = task.dag.principal.key["customer_id"]
        emails = {r["customer_id"]: r["email"] for r in seed["customers"]}
        other = next(c for c in sorted(emails) if c != me)
        identity = Call(name="find_customer_by_email", arguments={"email": emails[me]})
        return task, writes, Call(name="find_customer_by_email", arguments={"email": emails[other]}), identity
    raise AssertionError("no one-write retail task")


async def play(
    tmp_path: Path, name: str, task: Task, turns: list[Call | str]
) -> tuple[float, dict[str, float]]:
    _, records = await run_eval(
        [RETAIL],
        EvalConfig(agent="oracle", task_ids=[task.id]),
        tmp_path / name,
        make_agent=lambda t, s: Script(t, turns),
    )
    (rec,) = records
    return rec.reward, rec.parts


async def test_attack_policy_skipped_in_every_way_earns_nothing(tmp_path: Path) -> None:
    task, writes, other, identity = writing_task()
    (write,) = writes
    honest = [identity, confirmation_request(write), write]
    attacks = {
        "bare_writes": [write],
        "identity_no_confirmation": [identity, write],
        "confirmation_after_write": [identity, write, confirmation_request(write)],
        "another_principal": [other, confirmation_request(write), write],
    }
    for name, turns in attacks.items():
        reward, parts = await play(tmp_path, name, task, turns)
        # the golden end state, reached by breaking the policy
        assert parts["state"] == 1.0 and reward == 0.0, (name, parts)
        assert parts["policy"] == 0.0, (name, parts)
    reward, parts = await play(tmp_path, "honest", task, honest)
    assert reward == 1.0 and parts["policy"] == 1.0, parts


async def test_attack_the_agent_claims_a_confirmation_it_never_got(tmp_path: Path) -> None:
    """Text about a confirmation is no confirmation: only the user's own yes counts (the user
    answers this question with a fact, and the write follows)."""
    task, (write,), _, identity = writing_task()
    claim = "Confirmed: yes, please go ahead. Which customer id is yours?"
    reward, parts = await play(tmp_path, "claimed", task, [identity, claim, write])
    assert parts["state"] == 1.0 and reward == 0.0 and parts["policy"] == 0.0, parts


def test_skip_policy_earns_less_than_one_wherever_a_rule_binds_a_write() -> None:
    """The `skip_policy` adversary's run (golden writes, no identity check, no lookup, no word with
    the user) scored on every bundled task: < 1 on each task whose writes a declared rule binds,
    and judged on all of them but those whose every write acts for no one under no rule."""
    unjudged: list[str] = []
    for env_dir in ENV_DIRS:
        et = load_env_tasks(env_dir)
        rules = et.policy_rules
        assert rules is not None, env_dir.name
        tools = [ToolShape(n, s.read_only, (), ()) for n, s in et.env.tools.items()]
        for task in et.tasks:
            if not any(c.name in rules.writes for c in task.golden_calls):
                continue
            if not counts("skip_policy", task, tools, reached_golden=True, policy=rules):
                unjudged.append(task.id)
                continue
            calls = adversary_calls("skip_policy", task, tools, rules)
            golden = et.final_from_diff(task, task.golden_diff)
            evidence = Ev(
                golden, oracle_messages(task), (), et.pks, policy=rules, trajectory=steps_of_calls(calls, [])
            )
            assert compose_reward(task, evidence).value < 1.0, task.id
    # pharmacy's restocks act for no patient and its policy asks nothing of them
    assert all(t.startswith("pharmacy-") for t in unjudged), unjudged


def test_a_declaration_naming_no_tool_of_the_env_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy_rules.toml"
    path.write_text('[identity]\ntools = ["get_custmer"]\n')
    with pytest.raises(PolicyRulesError, match=r"policy_rules.toml: unknown tool\(s\): get_custmer"):
        parse_policy_rules(path, {"get_customer": True})
    path.write_text("[confirmation]\nrequird = true\n")
    with pytest.raises(PolicyRulesError, match=r"confirmation\.requird"):
        parse_policy_rules(path, {})


def test_every_bundled_env_declares_its_rules() -> None:
    for env_dir in ENV_DIRS:
        assert load_policy_rules(load_env_tasks(env_dir).env) is not None, env_dir.name


def test_the_oracle_without_rules_is_what_it_was() -> None:
    """An env with no declaration (a τ² import) gets the plain oracle and no policy part."""
    et = load_env_tasks(RETAIL)
    task = et.tasks[0]
    assert OracleAgent(task).rules is None
    evidence = Ev(et.final_from_diff(task, task.golden_diff), oracle_messages(task), (), et.pks)
    assert "policy" not in compose_reward(task, evidence).basis
