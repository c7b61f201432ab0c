"""`envforge check` on a dual-control env: the self-checks and the adversaries judge env
assertions on each replayed state, as an eval scores an episode.

Attacks: a dual-control task read as failing its own gold (its reward part left unjudged); an
assertion wrong on the gold's end state, or already met before anyone acts, passing the checks;
an adversary that reads and ends where the task began earning nothing because the assertions
were never run.
"""

from __future__ import annotations

import pytest

from envforge.server import Environment, Fleet, load_env
from envforge.synth import (
    EnvAssertion,
    RewardPart,
    SynthContext,
    Task,
    adversary_rewards,
    build_graph,
    load_tasks,
    verify_task,
)

from support.paths import DUAL_PHONE_DIR


@pytest.fixture(scope="module")
def phone() -> Environment:
    return load_env(DUAL_PHONE_DIR)


@pytest.fixture
async def ctx(phone: Environment):  # type: ignore[no-untyped-def]
    fleet = Fleet([phone])
    yield SynthContext.create(phone, await build_graph(phone, fleet), fleet)
    await fleet.aclose()


def _task(task_id: str) -> Task:
    return next(t for t in load_tasks(DUAL_PHONE_DIR) if t.id == task_id)


async def test_every_fixture_task_passes_and_no_adversary_earns(ctx: SynthContext) -> None:
    """Every check judges the env assertions: the gold (the user's calls played on the user's
    side) meets them, doing nothing and dropping the agent's write do not."""
    for task in load_tasks(DUAL_PHONE_DIR):
        assert await verify_task(ctx, task) == [], task.id
        rewards = await adversary_rewards(ctx, task)
        assert rewards["read_all"] == 0.0 and not [r for r in rewards.values() if r], (task.id, rewards)


async def test_an_assertion_the_gold_does_not_meet_fails_golden_replay(ctx: SynthContext) -> None:
    """The airplane task expecting the phone still without service: its gold fails, and doing
    nothing (the phone starts in airplane mode) meets it."""
    task = _task("dual_phone-airplane")
    [connected] = task.env_assertions
    wrong = task.model_copy(update={"env_assertions": [connected.model_copy(update={"assert_value": False})]})
    assert await verify_task(ctx, wrong) == ["golden_replay", "do_nothing"]


async def test_an_assertion_met_before_anyone_acts_is_gamed_by_reading(ctx: SynthContext) -> None:
    """The data task judged only on 'the phone has service', which it has from the start (only
    its data is off): doing nothing earns it, and so does the adversary that only reads."""
    task = _task("dual_phone-data")
    [connected] = _task("dual_phone-airplane").env_assertions
    met = task.model_copy(update={"env_assertions": [connected]})
    assert await verify_task(ctx, met) == ["do_nothing"]
    assert (await adversary_rewards(ctx, met))["read_all"] == 1.0


async def test_the_actions_part_is_judged_on_the_calls_made(ctx: SynthContext) -> None:
    """The suspended-line task is scored on its assertions and on `resume_line` being called: in a
    variant whose assertion holds from the start, doing nothing (no call) and dropping the resume
    still earn 0, and the gold 1."""
    task = _task("dual_phone-suspended")
    assert task.reward_basis == [RewardPart.ENV_ASSERTIONS, RewardPart.ACTIONS]
    data_on = EnvAssertion(
        env_type="user", func_name="assert_mobile_data", arguments={"expected": True}, assert_value=True
    )
    met = task.model_copy(update={"env_assertions": [data_on]})
    assert await verify_task(ctx, met) == []
