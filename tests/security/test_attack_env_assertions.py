"""Attacks on env-assertion scoring (dual control): a final state that makes a check tool fail.

An agent that cannot meet a task's env assertions may still leave a state on which the check
tool refuses or crashes (the row it reads deleted, a value it cannot parse). That must score as
an assertion not met, a 0 with its reason, and the trial stays scored: not an exception that
takes the trial (or a training step, or an integration's session) down with it, and never a
pass. An assertion the task itself gets wrong (no such check tool, arguments the tool refuses, a
check that writes) stays the task's error (`EnvAssertionError`), whatever the state.
"""

from __future__ import annotations

import shutil

import pytest

from envforge.harness import score_trial
from envforge.server import load_env
from envforge.synth import (
    EnvAssertion,
    EnvAssertionError,
    apply_diff,
    judge_env_assertions,
    load_tasks,
    primary_keys,
)

from support.paths import DUAL_PHONE_DIR


@pytest.fixture(scope="module")
def phone():
    return load_env(DUAL_PHONE_DIR)


def _golden(phone, task):
    pks = primary_keys(phone.tables)
    return apply_diff(pks, apply_diff(pks, phone.seed_state(), task.setup), task.golden_diff)


def _without_the_phone(state):
    """The final state an agent leaves when it deletes the row every check reads."""
    return {table: ([] if table == "device" else rows) for table, rows in state.items()}


async def test_a_check_that_crashes_on_the_final_state_is_not_met(phone):
    task = load_tasks(DUAL_PHONE_DIR)[0]
    final = _without_the_phone(_golden(phone, task))
    verdict = await judge_env_assertions(phone, task, final)
    assert verdict.value == 0.0 and (verdict.met, verdict.of) == (0, 1)
    assert "assert_service_status" in verdict.reason and "failed on the final state" in verdict.reason
    assert "\n" not in verdict.reason


async def test_a_trial_whose_final_state_breaks_the_check_scores_zero(phone):
    for task in load_tasks(DUAL_PHONE_DIR):
        final = _without_the_phone(_golden(phone, task))
        ts = await score_trial(task, final, [], status="done", env=phone)
        assert ts.score.reward == 0.0 and ts.parts["env_assertions"] == 0.0


async def test_a_check_refusing_the_final_state_is_not_met(tmp_path, phone):
    root = tmp_path / "dual_phone"
    shutil.copytree(DUAL_PHONE_DIR, root)
    with (root / "tools.py").open("a") as f:
        f.write(
            '''

@tool(side="check")
async def assert_line_active(db: Db, line_id: str) -> bool:
    """Env assertion: whether the line is active.

    Args:
        line_id: The line's id.
    """
    line = await _line(db, line_id)
    return line["status"] == "Active"
'''
        )
    env = load_env(root)
    task = load_tasks(DUAL_PHONE_DIR)[1]
    check = EnvAssertion(env_type="agent", func_name="assert_line_active", arguments={"line_id": "L-100"})
    task = task.model_copy(update={"env_assertions": [check]})
    golden = _golden(phone, task)
    assert (await judge_env_assertions(env, task, golden)).value == 1.0
    no_lines = {table: ([] if table in ("lines", "device") else rows) for table, rows in golden.items()}
    verdict = await judge_env_assertions(env, task, no_lines)
    assert verdict.value == 0.0 and "Line L-100 not found" in verdict.reason


@pytest.mark.parametrize(
    ("arguments", "why"),
    [({"expected": "connected", "extra": 1}, "extra"), ({}, "expected")],
)
async def test_arguments_the_check_refuses_stay_the_tasks_error(phone, arguments, why):
    task = load_tasks(DUAL_PHONE_DIR)[0]
    bad = task.model_copy(
        update={
            "env_assertions": [
                EnvAssertion(env_type="user", func_name="assert_service_status", arguments=arguments)
            ]
        }
    )
    with pytest.raises(EnvAssertionError, match="failed to run"):
        await judge_env_assertions(phone, bad, _golden(phone, task))
