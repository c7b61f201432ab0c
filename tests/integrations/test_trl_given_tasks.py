"""`environments(..., tasks=...)` plays a task set made from the env, not its `tasks.jsonl`: the
lookup tasks `envforge train --tasks lookup` learns, which trl's side of
benchmarks/trl_vs_envforge.py trains on. The dataset holds exactly the given tasks, the episode is
the given task's (its reward basis: the figure said and the read made), and a task set that names
no tasks for an env is a one-line error, not the folder's file played instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from envforge.integrations.trl import EnvforgeEpisode, TrlEnvironments, environments
from envforge.server import Fleet, load_env
from envforge.synth import Task
from envforge.trainer import lookup_tasks, split_tasks

from support.paths import REPO

GYM = REPO / "envs" / "gym"


def _lookups(env_dir: Path) -> tuple[list[Task], list[Task]]:
    env = load_env(env_dir)

    async def make() -> list[Task]:
        async with Fleet([env]) as fleet:
            return await lookup_tasks(fleet, env.name)

    return split_tasks(anyio.run(make))


def _reward(envs: TrlEnvironments, task: Task, calls: bool, say: str) -> float | None:
    instance = envs.environment_factory[task.env]()
    assert isinstance(instance, EnvforgeEpisode)
    row = next(r for r in envs.dataset if r["task_id"] == task.id)
    instance.reset(**{k: v for k, v in row.items() if k != "environment"})
    for call in task.golden_calls if calls else []:
        getattr(instance, call.name)(**call.arguments)
    completion: list[dict[str, Any]] = [{"role": "assistant", "content": say}]
    (reward,) = envs.reward_funcs[0](
        prompts=[row["prompt"]], completions=[completion], environments=[instance]
    )
    return reward


def test_the_given_lookup_tasks_are_the_dataset_and_the_episodes() -> None:
    train, held = _lookups(GYM)
    name = load_env(GYM).name
    with environments([GYM], tasks={name: train}) as envs:
        assert sorted(envs.dataset["task_id"]) == sorted(t.id for t in train)
        assert not {t.id for t in held} & set(envs.dataset["task_id"])  # held-out stays out
        task = train[0]
        answer = task.required_outputs[0]
        assert _reward(envs, task, calls=True, say=answer) == 1.0
        # a right figure guessed without the read earns nothing: the lookup's own reward basis
        assert _reward(envs, task, calls=False, say=answer) == 0.0


def test_a_task_set_without_the_env_is_a_one_line_error() -> None:
    train, _ = _lookups(GYM)
    with pytest.raises(ValueError, match="no tasks given for env 'car_rental'"):
        environments([REPO / "envs" / "car_rental", GYM], tasks={load_env(GYM).name: train})
