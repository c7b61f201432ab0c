"""Attacks on tool sides (dual control) from the places a policy or a crafted file reaches.

A policy in a training rollout (the path the OpenEnv, trl, verifiers and inspect integrations
share, in process and over MCP) names the user's tools, a task's setup actions and the env's
check tools: each is unknown to it, the state does not move, and the env assertions a user's
call would meet stay unmet. A replayed actions file claiming a setup requestor is refused in
one line, running nothing.
"""

from __future__ import annotations

import json

import pytest

from envforge.harness import load_env_tasks
from envforge.server import Fleet
from envforge.trainer import HarnessRolloutEnv

from support.paths import DUAL_PHONE_DIR
from support.serving import run_envforge

NOT_THE_AGENTS = [
    ("toggle_airplane_mode", {}),  # the user's
    ("toggle_data", {}),  # the user's
    ("turn_airplane_mode_on", {}),  # a task's setup
    ("suspend_line", {"line_id": "L-100"}),  # a task's setup
    ("assert_service_status", {"expected": "connected"}),  # a check
]


@pytest.mark.parametrize("use_mcp", [True, False])
async def test_a_policy_reaches_no_other_sides_tool(use_mcp):
    et = load_env_tasks(DUAL_PHONE_DIR)
    async with Fleet([et.env]) as fleet:
        env = HarnessRolloutEnv(fleet, et, use_mcp=use_mcp)
        async with env.episode("dual_phone-airplane") as episode:
            before = await fleet.export_state(episode.episode_id)
            for name, arguments in NOT_THE_AGENTS:
                outcome = await episode.call_tool(name, arguments)
                assert outcome.is_error and outcome.text == f"Error: Tool '{name}' not found.", outcome.text
            assert await fleet.export_state(episode.episode_id) == before
            info = await episode.finish(["Your phone works now."])
        assert info.reward == 0.0


def test_a_replayed_setup_requestor_is_refused_in_one_line(tmp_path):
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps([{"name": "turn_airplane_mode_on", "arguments": {}, "requestor": "setup"}]))
    done = run_envforge(
        "replay", str(DUAL_PHONE_DIR), "--task", "dual_phone-airplane", "--actions", str(actions), "--json"
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "requestor must be 'assistant' or 'user'" in done.stdout + done.stderr
    user_made = tmp_path / "user.json"
    user_made.write_text(
        json.dumps([{"name": "turn_airplane_mode_on", "arguments": {}, "requestor": "user"}])
    )
    done = run_envforge("replay", str(DUAL_PHONE_DIR), "--actions", str(user_made), "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["errors"] == [True] and "not found" in payload["outputs"][0]
