"""The `dual_phone` fixture env's tasks, built from their setup actions and golden calls.

Each task is made as the τ² telecom importer makes one: its initialization runs as `side="setup"`
calls on a fresh episode (the result, diffed against the seed, is the task's `setup`), then its
golden calls, the agent's and the user's (`requestor="user"`, `side="user"`), give the golden end
state. `tests/fixtures/dual_phone/tasks.jsonl` is what `write_dual_phone_tasks` writes; a test
checks they agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envforge.server import Environment, Fleet, load_env, state_hash
from envforge.synth import (
    ActionCheck,
    Call,
    CallNode,
    Dag,
    Difficulty,
    EnvAssertion,
    Fact,
    RewardPart,
    Task,
    UserScenario,
    cents_hash,
    diff_states,
    primary_keys,
    tasks_jsonl,
)

from support.paths import DUAL_PHONE_DIR

CONNECTED = EnvAssertion(
    env_type="user",
    func_name="assert_service_status",
    arguments={"expected": "connected"},
    assert_value=True,
    message="the phone has service",
)
DATA_ON = EnvAssertion(
    env_type="user", func_name="assert_mobile_data", arguments={"expected": True}, assert_value=True
)


def _user(name: str, **arguments: Any) -> Call:
    return Call(name=name, arguments=arguments, requestor="user")


def _agent(name: str, **arguments: Any) -> Call:
    return Call(name=name, arguments=arguments)


SPECS: list[dict[str, Any]] = [
    {
        "id": "dual_phone-airplane",
        "setup": [("turn_airplane_mode_on", {})],
        "calls": [
            _agent("get_line", line_id="L-100"),
            _user("check_status_bar"),
            _user("toggle_airplane_mode"),
            _user("check_status_bar"),
        ],
        "instruction": "Your phone (line L-100) shows no signal. You want to get it working again.",
        "assertions": [CONNECTED],
        "basis": [RewardPart.ENV_ASSERTIONS],
    },
    {
        "id": "dual_phone-suspended",
        "setup": [("suspend_line", {"line_id": "L-100"})],
        "calls": [
            _user("check_status_bar"),
            _agent("get_line", line_id="L-100"),
            _agent("resume_line", line_id="L-100"),
            _user("check_status_bar"),
        ],
        "instruction": "Your phone (line L-100) says 'No service'. You want to get it working again.",
        "assertions": [CONNECTED],
        "basis": [RewardPart.ENV_ASSERTIONS, RewardPart.ACTIONS],
        "actions": [ActionCheck(name="resume_line", arguments={"line_id": "L-100"})],
    },
    {
        "id": "dual_phone-data",
        "setup": [("turn_data_off", {})],
        "calls": [_user("toggle_data"), _user("check_status_bar")],
        "instruction": "Your phone (line L-100) has signal but no internet. You want to get online.",
        "assertions": [DATA_ON],
        "basis": [RewardPart.ENV_ASSERTIONS],
    },
    {
        "id": "dual_phone-both",
        "setup": [("turn_airplane_mode_on", {}), ("suspend_line", {"line_id": "L-100"})],
        "calls": [
            _user("check_status_bar"),
            _agent("get_line", line_id="L-100"),
            _agent("resume_line", line_id="L-100"),
            _user("toggle_airplane_mode"),
            _user("toggle_data"),
            _user("toggle_data"),
            _user("check_status_bar"),
        ],
        "instruction": "Your phone (line L-100) has no signal at all. You want to get it working again.",
        "assertions": [CONNECTED, DATA_ON],
        "basis": [RewardPart.ENV_ASSERTIONS],
    },
]


async def _run(fleet: Fleet, episode_id: str, calls: list[Call]) -> None:
    for call in calls:
        side = "user" if call.requestor == "user" else "agent"
        result = await fleet.call(episode_id, call.name, call.arguments, side=side)
        assert not result.is_error, (call, result.text)


async def build_dual_phone_tasks(env: Environment) -> list[Task]:
    """The fixture's tasks, computed from `SPECS` on `env` (deterministic: same env, same bytes)."""
    pks = primary_keys(env.tables)
    seed = env.seed_state()
    tasks = []
    async with Fleet([env]) as fleet:
        for spec in SPECS:
            episode = await fleet.create_episode(env.name)
            for name, arguments in spec["setup"]:
                result = await fleet.call(episode.id, name, arguments, side="setup")
                assert not result.is_error, result.text
            initial = (await fleet.export(episode.id)).state
            calls: list[Call] = spec["calls"]
            await _run(fleet, episode.id, calls)
            golden = (await fleet.export(episode.id)).state
            await fleet.close_episode(episode.id)
            nodes = [
                CallNode(
                    id=f"n{i}",
                    text=f"{'the user' if c.requestor == 'user' else 'the agent'} calls {c.name}",
                    call=c,
                    write=not env.all_tools[c.name].read_only,
                )
                for i, c in enumerate(calls)
            ]
            writes = sum(n.write for n in nodes)
            tasks.append(
                Task(
                    id=spec["id"],
                    env=env.name,
                    seed=f"fixture:{spec['id']}",
                    dag=Dag(nodes=nodes, edges=[]),
                    setup=diff_states(pks, seed, initial),
                    scenario=UserScenario(
                        persona="A customer of the carrier, calling about their own phone.",
                        instruction=spec["instruction"],
                        known_facts=[Fact(name="line_id", value="L-100")],
                        must_be_told=[],
                    ),
                    golden_calls=calls,
                    golden_hash=state_hash(golden),
                    golden_cents_hash=cents_hash(golden),
                    golden_diff=diff_states(pks, initial, golden),
                    required_outputs=[],
                    checkpoints=[],
                    difficulty=Difficulty(
                        calls=len(calls), writes=writes, reasoning=0, depth=len(calls), tables=2
                    ),
                    reward_basis=spec["basis"],
                    action_checks=spec.get("actions", []),
                    env_assertions=spec["assertions"],
                )
            )
    return tasks


async def write_dual_phone_tasks(root: Path = DUAL_PHONE_DIR) -> str:
    """Write the fixture's tasks.jsonl (its text is returned)."""
    text = tasks_jsonl(await build_dual_phone_tasks(load_env(root)))
    (root / "tasks.jsonl").write_text(text, encoding="utf-8")
    return text
