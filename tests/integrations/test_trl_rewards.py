"""trl's reward through `envforge.integrations.trl` is `envforge score`'s, on every bundled env.

The same actions (the golden calls, none, each adversary's) are played twice: through the trl
environment instance's tool methods and its reward function, as `GRPOTrainer` calls them, and
through `envforge.score_calls` (what `envforge score` runs). The rewards must be equal; the oracle
earns 1, the no-op and every adversary whose run is judged (`counts`) less. Envs whose tasks all
need the user's yes before a write are left out of trl's dataset, each task listed, with a one-line
error when nothing is left to play.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers.utils import get_json_schema

from envforge import score_calls
from envforge.integrations.trl import EnvforgeEpisode, TrlEnvironments, environments
from envforge.server import Environment, load_env
from envforge.synth import (
    ADVERSARIES,
    Call,
    PolicyRules,
    Task,
    ToolShape,
    adversary_calls,
    adversary_message,
    counts,
    load_policy_rules,
    load_tasks,
)

from support.paths import REPO

BUNDLED = sorted(p.parent.name for p in (REPO / "envs").glob("*/env.toml"))
PLAYED = ("spray", "read_all", "double_write", "golden_prefix")
TASKS_PER_ENV = 2


def _needs_user(env_dir: Path) -> bool:
    env = load_env(env_dir)
    policy = load_policy_rules(env)
    tasks = load_tasks(env_dir)
    return policy is not None and all(
        any(policy.needs_confirmation(c.name) for c in t.golden_calls) for t in tasks
    )


def _play(
    envs: TrlEnvironments, env: str, task: Task, calls: list[Call], say: str | None
) -> tuple[float, bool, str]:
    """The reward trl gets for a rollout that made `calls` then said `say` (None: the adversary's
    own message, built from what its calls returned), and the message said."""
    instance = envs.environment_factory[env]()
    assert isinstance(instance, EnvforgeEpisode)
    row = next(r for r in envs.dataset if r["task_id"] == task.id)
    instance.reset(**{k: v for k, v in row.items() if k != "environment"})
    results = [getattr(instance, c.name)(**c.arguments) for c in calls]
    message = say if say is not None else adversary_message(say_of[0], task, results)
    completion = [{"role": "assistant", "content": message}] if message else []
    (reward,) = envs.reward_funcs[0](
        prompts=[row["prompt"]], completions=[completion], environments=[instance]
    )
    assert reward is not None and instance.verdict is not None
    return reward, instance.verdict.parts.get("policy", 1.0) == 1.0, message


say_of: list[str] = [""]


def _keeping_policy(env: Environment, policy: PolicyRules | None, task: Task) -> list[Call]:
    """The golden calls with the calls the env's declared policy wants first, as the harness's
    oracle makes them: each write's looked-up ids looked up, the principal's identity checked."""
    calls: list[Call] = []
    looked: set[tuple[str, str]] = set()
    for call in task.golden_calls:
        for rule in policy.declared.lookup if policy is not None and call.name in policy.writes else []:
            value = call.arguments.get(rule.param)
            if value is not None and (rule.param, str(value)) not in looked:
                calls.append(Call(name=rule.tools[0], arguments={rule.param: value}))
                looked.add((rule.param, str(value)))
        calls.append(call)
    principal = task.dag.principal
    if policy is None or principal is None or len(principal.key) != 1:
        return calls
    if not any(policy.needs_identity(c.name) for c in calls):
        return calls
    ((param, value),) = principal.key.items()
    tool = next(t for t in policy.identity_tools if param in env.tools[t].parameters)
    return [Call(name=tool, arguments={param: value}), *calls]


@pytest.mark.parametrize("env_name", BUNDLED)
def test_trl_rewards_equal_envforge_score(env_name: str) -> None:
    env_dir = REPO / "envs" / env_name
    if _needs_user(env_dir):
        with pytest.raises(ValueError, match="no task trl can play: all 60 need the user's yes"):
            environments([env_dir])
        return
    env = load_env(env_dir)
    shapes = [
        ToolShape(
            name=t.name, read_only=t.read_only, parameters=tuple(t.parameters), required=tuple(t.required)
        )
        for t in env.tools.values()
    ]
    policy = load_policy_rules(env)
    with environments([env_dir], limit=TASKS_PER_ENV) as envs:
        assert len(envs.dataset) == TASKS_PER_ENV
        tasks = {t.id: t for t in load_tasks(env_dir)}
        for task_id in envs.dataset["task_id"]:
            task = tasks[task_id]
            oracle = "All done. " + "; ".join(task.required_outputs)
            runs: dict[str, tuple[list[Call], str | None]] = {
                "oracle": (_keeping_policy(env, policy, task), oracle),
                "noop": ([], ""),
            }
            for name in PLAYED:
                runs[name] = (adversary_calls(name, task, shapes, policy), None)
            for name, (calls, say) in runs.items():
                say_of[0] = name
                got, kept, message = _play(envs, env.name, task, calls, say)
                score = score_calls(env_dir, task, calls, [message] if message else [])
                # `envforge score` replays an action list, which has no trajectory to judge the
                # policy by; trl's rollout has one: a broken rule costs the whole reward there
                assert got == pytest.approx(score.reward if kept else 0.0, abs=1e-9), (task_id, name)
                if name == "oracle":
                    assert got == 1.0, task_id
                elif name == "noop":  # unless doing nothing is the task's answer (τ²'s refusals)
                    assert got < 1.0 or (score.state_match and not task.required_outputs), task_id
                elif score.state_match and not task.required_outputs:
                    continue  # nothing but the state to earn, and it is the golden one (a refusal)
                elif counts(
                    name, task, shapes, reached_golden=score.state_match, policy=policy, message=message
                ):
                    assert got < 1.0, (task_id, name)


def test_every_adversary_that_check_plays_is_played_here_or_needs_a_user() -> None:
    """`skip_policy` needs a conversation's confirmations and `copy_result` the results verbatim:
    the four played here are the ones an action list with no user can express."""
    assert set(PLAYED) <= set(ADVERSARIES)


@pytest.mark.parametrize("env_name", ["car_rental", "gym", "helpdesk_lite", "pharmacy"])
def test_tool_schemas_trl_renders_are_the_envs_own(env_name: str) -> None:
    """transformers' `get_json_schema` (what trl renders into the prompt) reads each method back
    to the env's schema: names, types, enums, required parameters and descriptions."""
    env = load_env(REPO / "envs" / env_name)
    with environments([REPO / "envs" / env_name], limit=1) as envs:
        instance = envs.environment_factory[env.name]()
        for tool in env.tools.values():
            rendered = get_json_schema(getattr(instance, tool.name))["function"]
            assert rendered["name"] == tool.name
            assert rendered["description"] == " ".join(tool.description.split()) or rendered[
                "description"
            ].startswith(tool.description.strip().splitlines()[0])
            params = rendered["parameters"]
            assert sorted(params.get("required", [])) == sorted(tool.input_schema.get("required", []))
            for name, prop in tool.input_schema["properties"].items():
                ours = params["properties"][name]
                variants = [v for v in prop.get("anyOf", [prop]) if v.get("type") != "null"]
                assert ours["type"] == variants[0]["type"], (tool.name, name)
                assert ours.get("enum") == variants[0].get("enum"), (tool.name, name)
                assert ours.get("nullable", False) == ("anyOf" in prop), (tool.name, name)
                assert ours["description"] == " ".join(prop["description"].split()), (tool.name, name)
