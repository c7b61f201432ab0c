"""Dual-control tasks: who makes each golden call, and env assertions scored by the env's checks.

Attacks: a task file of an existing env changing bytes because the task contract grew; an env
assertion that would write; one naming a tool that is not a check tool (or none at all); a task
with assertions scored without running them. Each must be an error or a 0, never a pass.
"""

from __future__ import annotations

import shutil

import pytest

from envforge.server import load_env, read_env_text
from envforge.synth import (
    Call,
    EnvAssertion,
    EnvAssertionError,
    Evidence,
    RewardPart,
    Task,
    apply_diff,
    compose_reward,
    env_assertion_problems,
    judge_env_assertions,
    load_tasks,
    primary_keys,
    tasks_jsonl,
)

from support.dual_phone import build_dual_phone_tasks
from support.paths import DUAL_PHONE_DIR, bundled_env_dirs


@pytest.fixture(scope="module")
def phone():
    return load_env(DUAL_PHONE_DIR)


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
def test_existing_task_files_keep_their_bytes(env_dir):
    text = read_env_text(env_dir, "tasks.jsonl")
    tasks = load_tasks(env_dir)
    assert all(c.requestor == "assistant" for t in tasks for c in t.golden_calls)
    assert all(not t.env_assertions for t in tasks)
    assert tasks_jsonl(tasks) == text


def test_a_users_call_and_env_assertions_are_written_and_read_back():
    call = Call(name="toggle_data", arguments={}, requestor="user")
    assert call.model_dump() == {"name": "toggle_data", "arguments": {}, "requestor": "user"}
    assert Call(name="get_line", arguments={}).model_dump() == {"name": "get_line", "arguments": {}}
    [task, *_] = load_tasks(DUAL_PHONE_DIR)
    assert '"requestor":"user"' in task.model_dump_json() and '"env_assertions":' in task.model_dump_json()
    again = Task.model_validate_json(task.model_dump_json())
    assert again == task and [c.name for c in again.user_calls][:2] == [
        "check_status_bar",
        "toggle_airplane_mode",
    ]
    assert '"env_assertions":' not in task.model_copy(update={"env_assertions": []}).model_dump_json()


async def test_the_fixture_task_file_is_what_its_builder_makes(phone):
    assert tasks_jsonl(await build_dual_phone_tasks(phone)) == read_env_text(DUAL_PHONE_DIR, "tasks.jsonl")


def _states(phone, task):
    pks = primary_keys(phone.tables)
    initial = apply_diff(pks, phone.seed_state(), task.setup)
    return initial, apply_diff(pks, initial, task.golden_diff)


async def test_env_assertions_judge_the_final_state(phone):
    for task in load_tasks(DUAL_PHONE_DIR):
        initial, golden = _states(phone, task)
        met = await judge_env_assertions(phone, task, golden)
        assert (met.value, met.met, met.of) == (1.0, len(task.env_assertions), len(task.env_assertions))
        unmet = await judge_env_assertions(phone, task, initial)
        assert unmet.value == 0.0 and unmet.reason.startswith("env assertion not met: assert_")
        reward = compose_reward(task, Evidence(golden, verdicts={RewardPart.ENV_ASSERTIONS: met}))
        assert reward.value == 1.0 or RewardPart.ACTIONS in reward.not_judged


async def test_a_task_with_assertions_scored_without_them_is_never_a_pass(phone):
    task = load_tasks(DUAL_PHONE_DIR)[0]
    _, golden = _states(phone, task)
    reward = compose_reward(task, Evidence(golden))
    assert reward.value == 0.0 and RewardPart.ENV_ASSERTIONS not in reward.not_judged
    none = task.model_copy(update={"env_assertions": []})
    assert compose_reward(none, Evidence(golden)).value == 1.0


@pytest.mark.parametrize("name", ["assert_no_such_thing", "get_line", "toggle_data", "suspend_line"])
async def test_an_assertion_naming_no_check_tool_is_an_error(phone, name):
    task = load_tasks(DUAL_PHONE_DIR)[0]
    bad = task.model_copy(update={"env_assertions": [EnvAssertion(env_type="user", func_name=name)]})
    [problem] = env_assertion_problems(phone, bad)
    assert "names no check tool of env 'dual_phone'" in problem and "\n" not in problem
    _, golden = _states(phone, task)
    with pytest.raises(EnvAssertionError, match="names no check tool"):
        await judge_env_assertions(phone, bad, golden)


async def test_an_assertion_that_would_write_is_refused(tmp_path, phone):
    root = tmp_path / "dual_phone"
    shutil.copytree(DUAL_PHONE_DIR, root)
    with (root / "tools.py").open("a") as f:
        f.write(
            '''

@tool(side="check")
async def assert_and_fix(db: Db) -> bool:
    """Claims the phone works, after making it so."""
    await db.execute("UPDATE device SET airplane_mode = 0, line_active = 1")
    return True
'''
        )
    env = load_env(root)
    task = load_tasks(DUAL_PHONE_DIR)[0]
    initial, _ = _states(phone, task)
    bad = task.model_copy(
        update={
            "env_assertions": [
                EnvAssertion(env_type="user", func_name="assert_and_fix"),
                *task.env_assertions,
            ]
        }
    )
    with pytest.raises(EnvAssertionError, match="failed to run"):
        await judge_env_assertions(env, bad, initial)
    wrong_args = task.model_copy(
        update={"env_assertions": [EnvAssertion(env_type="user", func_name="assert_mobile_data")]}
    )
    with pytest.raises(EnvAssertionError, match="failed to run"):
        await judge_env_assertions(env, wrong_args, initial)
