"""A rollout with no simulated user (`FleetRolloutEnv`, what trl's environments play) on a task
judged by the env's check tools (τ² telecom's ENV_ASSERTION).

Attack: the rollout's reward never ran the check tools, so a task whose basis is env assertions
paid 0 to the agent that fixed the line and 0 to the one that did nothing: no signal to learn
from, and a verdict unlike `envforge score`'s on the same calls.
"""

from __future__ import annotations

import anyio
import pytest

from envforge import score_calls
from envforge.server import Fleet, load_env
from envforge.synth import RewardPart, Task, load_tasks
from envforge.trainer import FleetRolloutEnv

from support.paths import DUAL_PHONE_DIR


def _agent_only(task: Task) -> Task:
    """dual_phone's suspended-line task with the user's part (two status-bar reads) taken out: the
    agent's resume alone brings service back, so a rollout with no user can play it."""
    agent = [c for c in task.golden_calls if c.requestor == "assistant"]
    return task.model_copy(
        update={
            "id": task.id + "-agent-only",
            "golden_calls": agent,
            "user_calls": [],
            "reward_basis": [RewardPart.ENV_ASSERTIONS],
        }
    )


def test_a_userless_rollout_is_judged_by_the_envs_check_tools_as_score_is() -> None:
    task = _agent_only(next(t for t in load_tasks(DUAL_PHONE_DIR) if t.id == "dual_phone-suspended"))
    assert task.env_assertions and not task.user_calls

    async def main() -> dict[str, float]:
        fleet = Fleet([load_env(DUAL_PHONE_DIR)])
        try:
            env = FleetRolloutEnv(fleet, "dual_phone", [task], use_mcp=False)
            rewards = {}
            for name, calls in (("fixed", task.golden_calls), ("nothing", [])):
                async with env.episode(task.id) as ep:
                    for call in calls:
                        await ep.call_tool(call.name, dict(call.arguments))
                    info = await ep.finish(["Done."])
                rewards[name] = info.reward
                assert info.parts == {"env_assertions": info.reward}
            return rewards
        finally:
            await fleet.aclose()

    rewards = anyio.run(main)
    assert rewards == {"fixed": 1.0, "nothing": 0.0}
    assert score_calls(DUAL_PHONE_DIR, task, task.golden_calls, ["Done."]).reward == rewards["fixed"]
    assert score_calls(DUAL_PHONE_DIR, task, [], ["Done."]).reward == rewards["nothing"]


def test_trls_dataset_leaves_out_tasks_whose_user_must_act_and_plays_the_rest() -> None:
    """trl's loop has no user: a dual-control task whose user must act on their own device is left
    out (listed), not handed to a rollout that raises mid-training; the userless one plays."""
    from envforge.integrations.trl import environments

    tasks = load_tasks(DUAL_PHONE_DIR)
    with pytest.raises(ValueError, match=r"no task trl can play: all 4 need .*act on their device"):
        environments([DUAL_PHONE_DIR])
    alone = _agent_only(next(t for t in tasks if t.id == "dual_phone-suspended"))
    with environments([DUAL_PHONE_DIR], tasks={"dual_phone": [*tasks, alone]}) as envs:
        assert list(envs.dataset["task_id"]) == [alone.id]
        assert envs.left_out == {"dual_phone": sorted(t.id for t in tasks)}
