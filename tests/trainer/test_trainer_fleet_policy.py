"""A rollout with no simulated user (`FleetRolloutEnv`) and the env's declared policy rules.

Attacks: training on write tasks without a user, where skipping the identity check paid as much as
keeping it; a confirmation rule nobody can keep silently scored as kept; a lookup rollout that
hands the user to a human where the policy forbids it, paid in full.
"""

from __future__ import annotations

import anyio
import pytest

from envforge.server import Fleet, load_env
from envforge.synth import Task, ToolShape, adversary_calls, load_policy_rules, load_tasks
from envforge.trainer import FleetRolloutEnv, NeedsUser, lookup_tasks

from support.paths import ENVS


def test_write_tasks_under_a_confirmation_rule_are_refused_without_a_user() -> None:
    """No agent can get a yes from a user who is not there: such tasks are refused, named."""
    fleet = Fleet([load_env(ENVS / "retail_orders")])
    tasks = load_tasks(ENVS / "retail_orders")
    with pytest.raises(NeedsUser) as err:
        FleetRolloutEnv(fleet, "retail_orders", tasks)
    message = str(err.value)
    assert "\n" not in message and "60 of 60 tasks" in message and "--env-kind harness" in message
    anyio.run(fleet.aclose)


def _write_task(tasks: list[Task]) -> Task:
    """A gym task whose golden calls verify the member (get_member) before its first write."""
    return next(t for t in tasks if t.golden_calls[0].name == "get_member" and len(t.golden_calls) >= 2)


def test_skipping_the_identity_check_earns_nothing_without_a_user() -> None:
    """gym asks for the member's identity, not for a yes: its write tasks play without a user, and
    the golden writes without `get_member` reach the golden end state yet earn 0."""

    async def main() -> None:
        env_obj = load_env(ENVS / "gym")
        fleet = Fleet([env_obj])
        try:
            tasks = load_tasks(ENVS / "gym")
            env = FleetRolloutEnv(fleet, "gym", tasks, use_mcp=False)
            task = _write_task(tasks)
            rules = load_policy_rules(env_obj)
            assert rules is not None and not rules.confirms
            shapes = [
                ToolShape(n, s.read_only, tuple(s.parameters), tuple(s.input_schema.get("required", [])))
                for n, s in env_obj.tools.items()
            ]
            skipped = adversary_calls("skip_policy", task, shapes, rules)
            assert skipped and all(c.name != "get_member" for c in skipped)
            outcome = {}
            for name, calls in (("kept", task.golden_calls), ("skipped", skipped)):
                async with env.episode(task.id) as ep:
                    for call in calls:
                        await ep.call_tool(call.name, dict(call.arguments))
                    info = await ep.finish(["All done. " + "; ".join(task.required_outputs)])
                outcome[name] = info
            assert outcome["kept"].reward == 1.0 and outcome["kept"].parts["policy"] == 1.0
            assert outcome["skipped"].parts["state"] == 1.0  # the golden end state, reached
            assert outcome["skipped"].parts["policy"] == 0.0 and outcome["skipped"].reward == 0.0
        finally:
            await fleet.aclose()

    anyio.run(main)


def test_a_lookup_rollout_that_transfers_where_the_policy_forbids_it_earns_nothing() -> None:
    """Lookup tasks are reads (no confirmation binds them, so they play without a user), but
    flight_booking's policy allows no transfer: the right figure after the read, with a
    ###TRANSFER###, earns 0; without it, 1."""

    async def main() -> None:
        fleet = Fleet([load_env(ENVS / "flight_booking")])
        try:
            tasks = await lookup_tasks(fleet, "flight_booking")
            env = FleetRolloutEnv(fleet, "flight_booking", tasks, use_mcp=False)
            task = tasks[0]
            figure, read = task.required_outputs[0], task.golden_calls[0]
            got = []
            for said in (f"It is {figure}.", f"It is {figure}. ###TRANSFER###"):
                async with env.episode(task.id) as ep:
                    await ep.call_tool(read.name, dict(read.arguments))
                    await ep.user_reply(said)
                    info = await ep.finish([said])
                got.append((info.reward, info.parts.get("policy")))
            assert got == [(1.0, 1.0), (0.0, 0.0)], got
        finally:
            await fleet.aclose()

    anyio.run(main)
