"""Attacks on a reward that leaves the env's policy out: the golden writes made without the
identity check or the user's yes, a yes asked for after the write, another person verified.

Each plays through the real harness (in-process MCP, real SQLite, the scripted user) on bundled
tasks; before the policy part existed every one of them earned 1.0.
"""

from __future__ import annotations

import json
import shutil
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

from support.paths import REPO, bundled_env_dirs

RETAIL = REPO / "envs" / "retail_orders"
ENV_DIRS = [p for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]


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
    tmp_path: Path, name: str, task: Task, turns: list[Call | str], env_dir: Path = RETAIL
) -> tuple[float, dict[str, float]]:
    _, records = await run_eval(
        [env_dir],
        EvalConfig(agent="oracle", task_ids=[task.id]),
        tmp_path / name,
        make_agent=lambda t, s: Script(t, turns),
    )
    (rec,) = records
    return rec.reward, rec.parts


def retail_with_rules(tmp_path: Path, name: str, extra: str) -> Path:
    """A copy of retail_orders whose policy_rules.toml adds `extra` to the shipped rules."""
    dst = tmp_path / name / "retail_orders"
    shutil.copytree(RETAIL, dst)
    (dst / "policy_rules.toml").write_text((RETAIL / "policy_rules.toml").read_text() + extra)
    return dst


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


async def test_attack_a_forbidden_call_is_never_paid(tmp_path: Path) -> None:
    """An env that forbids a call (every listed argument equal) pays nothing for an episode that
    makes it, however right its end state: a write with the banned argument, or a read the policy
    bans outright. The same episode where the listed argument differs is paid as before."""
    task, (write,), _, identity = writing_task()
    honest: list[Call | str] = [identity, confirmation_request(write), write]
    key, value = next(iter(write.arguments.items()))
    banned = f'\n[[forbidden]]\ntool = "{write.name}"\narguments = {{ {key} = {json.dumps(value)} }}\n'
    env = retail_with_rules(tmp_path, "ban_write", banned + 'reason = "a banned write"\n')
    reward, parts = await play(tmp_path, "banned_write", task, honest, env)
    assert parts["state"] == 1.0 and parts["policy"] == 0.0 and reward == 0.0, parts

    other = f'\n[[forbidden]]\ntool = "{write.name}"\narguments = {{ {key} = "not-{value}" }}\n'
    env = retail_with_rules(tmp_path, "ban_other", other + 'reason = "another value"\n')
    reward, parts = await play(tmp_path, "other_value", task, honest, env)
    assert reward == 1.0 and parts["policy"] == 1.0, parts

    read = Call(name="get_product", arguments={"product_id": "P-101"})
    env = retail_with_rules(tmp_path, "ban_read", '\n[[forbidden]]\ntool = "get_product"\nreason = "no"\n')
    reward, parts = await play(tmp_path, "banned_read", task, [read, *honest], env)
    assert parts["state"] == 1.0 and parts["policy"] == 0.0 and reward == 0.0, parts
    reward, parts = await play(tmp_path, "read_allowed", task, [read, *honest])  # shipped rules
    assert reward == 1.0, parts


async def test_attack_a_transfer_the_policy_does_not_allow_is_never_paid(tmp_path: Path) -> None:
    """With `[transfer] allowed = false`, handing the user over earns nothing: `###TRANSFER###` in
    the agent's words, or a call of a declared hand-over tool (here a read stands in for one).
    Where transfers are allowed (retail's shipped rules declare none) the same episode is paid."""
    task, (write,), _, identity = writing_task()
    report = f"All done. {'; '.join(task.required_outputs)} ###TRANSFER###".strip()
    turns: list[Call | str] = [identity, confirmation_request(write), write, report]
    reward, parts = await play(tmp_path, "allowed", task, turns)
    assert reward == 1.0 and parts["policy"] == 1.0, parts

    env = retail_with_rules(tmp_path, "no_transfer", "\n[transfer]\nallowed = false\n")
    reward, parts = await play(tmp_path, "said", task, turns, env)
    assert parts["state"] == 1.0 and parts["policy"] == 0.0 and reward == 0.0, parts

    hand_over = Call(name="get_product", arguments={"product_id": "P-101"})
    tool_rule = '\n[transfer]\nallowed = false\ntools = ["get_product"]\n'
    env = retail_with_rules(tmp_path, "no_transfer_tool", tool_rule)
    reward, parts = await play(
        tmp_path, "called", task, [identity, confirmation_request(write), write, hand_over], env
    )
    assert parts["state"] == 1.0 and parts["policy"] == 0.0 and reward == 0.0, parts


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
