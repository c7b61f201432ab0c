"""RL episodes on a dual-control env: the scripted user acts on its own device when the policy
hands over, its calls are scored (env assertions judged with the env), and a policy that never
hands over earns nothing from the user's tools."""

from __future__ import annotations

import pytest

from envforge.harness import load_env_tasks, user_action_request
from envforge.server import Fleet
from envforge.trainer import HarnessRolloutEnv

from support.paths import DUAL_PHONE_DIR


async def _play(env: HarnessRolloutEnv, task_id: str, hand_over: bool) -> float:
    task = env.tasks[task_id]
    async with env.episode(task_id) as episode:
        for call in task.golden_calls:
            if call.requestor == "assistant":
                await episode.call_tool(call.name, call.arguments)
        if hand_over:
            said = await episode.user_reply(user_action_request(task.user_calls))
            assert said is not None and said.startswith("I did that.")
        assert await episode.user_reply("All done.") is None
        info = await episode.finish(["All done."])
    return info.reward


@pytest.mark.parametrize("use_mcp", [True, False])
async def test_the_user_acts_when_handed_over_and_env_assertions_are_scored(use_mcp):
    et = load_env_tasks(DUAL_PHONE_DIR)
    async with Fleet([et.env]) as fleet:
        env = HarnessRolloutEnv(fleet, et, use_mcp=use_mcp)
        assert env.tool_names() == ["get_line", "resume_line"]
        assert await _play(env, "dual_phone-data", hand_over=True) == 1.0
        assert await _play(env, "dual_phone-data", hand_over=False) == 0.0
        assert env.verdicts[0].parts == {"env_assertions": 1.0}
        assert env.verdicts[0].user_messages[-1].startswith("Thank you.")
