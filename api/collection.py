"""Trajectories for training, collected from Python, and training itself: a policy plays task
groups on the envs, and (`train`) learns from them with asynchronous ERPO.

This is `envforge collect` and `envforge train` without the command line: `run_collection` and
`run_training` (the trainer) do the work and write `trajectories.jsonl`, metrics and checkpoints;
reading trajectories back is here too, so a script can go from a model to the token-level records
an RL library consumes. Before either loads a model (seconds, and the whole ML stack), the
options are checked as a whole here: a vLLM backend without its URL, a Ray address without
workers, held-out evaluation without held-out tasks. The model runs under the `train` extra
(torch, transformers), which only this path loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from envforge.harness import UserName
from envforge.trainer import (
    LearnerConfig,
    RolloutConfig,
    RunOptions,
    StepMetrics,
    TrainConfig,
    Trajectory,
    run_collection,
    run_training,
)

from .settings import SettingError


def checked_run_options(options: RunOptions) -> RunOptions:
    """`options` as a run plays them; `SettingError` for a combination that cannot run.

    A lookup task is one question with nothing to ask back, so `tasks="lookup"` plays it in the
    single-turn env (`env_kind="fleet"`) rather than with a simulated user, unless that user is
    to err (`user_error_rate`), which needs it."""
    if options.backend == "vllm" and not options.vllm_url:
        raise SettingError("{backend} vllm needs {vllm_url}", "backend", "vllm_url")
    if options.ray_workers < 0:
        raise SettingError("{ray_workers} must be >= 0", "ray_workers")
    if options.ray_address and not options.ray_workers:
        raise SettingError("{ray_address} needs {ray_workers} N", "ray_address", "ray_workers")
    if options.eval_every and options.tasks == "all":
        raise SettingError(
            "{eval_every} evaluates held-out tasks: use it with {tasks} other than all",
            "eval_every",
            "tasks",
        )
    if options.tasks not in ("all", "lookup") and options.env_kind == "fleet":
        raise SettingError(
            "{tasks} " + options.tasks + " plays writes with the simulated user: {env_kind} harness",
            "tasks",
            "env_kind",
        )
    if options.user_error_rate:
        if options.env_kind == "fleet":
            raise SettingError(
                "{user_error_rate} needs a simulated user: {env_kind} harness", "user_error_rate", "env_kind"
            )
        if options.user != UserName.SCRIPTED:
            raise SettingError(
                "{user_error_rate} makes the scripted user err: {user} scripted", "user_error_rate", "user"
            )
        if options.ray_workers:
            raise SettingError(
                "{user_error_rate} plays in this process (no {ray_workers})", "user_error_rate", "ray_workers"
            )
        return options
    if options.tasks == "lookup" and options.env_kind == "harness":
        return options.model_copy(update={"env_kind": "fleet"})
    return options


def check_tasks_per_step(envs: Sequence[Path], tasks_per_step: int) -> None:
    """ERPO compares two tasks per env each step: `SettingError` for fewer per step, `ValueError`
    for an env folder whose `tasks.jsonl` holds fewer than two (checked before any model loads)."""
    if tasks_per_step < 2 * len(envs):
        raise SettingError(
            "{tasks_per_step} "
            + f"{tasks_per_step} is too small: ERPO needs >= 2 per env "
            + f"(>= {2 * len(envs)} for {len(envs)} env(s))",
            "tasks_per_step",
        )
    for d in envs:
        path = Path(d) / "tasks.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        count = sum(1 for line in lines if line.strip())
        if count < 2:
            raise ValueError(
                f"{d} has {count} task(s); ERPO needs >= 2 per env "
                f"(make some with `envforge synth tasks {d}`)"
            )


async def train_async(
    options: RunOptions,
    config: TrainConfig,
    learner_config: LearnerConfig | None = None,
    *,
    on_step: Callable[[StepMetrics], Any] | None = None,
) -> list[StepMetrics]:
    """Train `options.model` on `options.envs` for `config.steps` steps; writes metrics, checkpoints
    and plots to `options.out` and returns each step's metrics (empty on a torchrun rank other than
    0, which only follows rank 0's updates). `on_step` sees each step's metrics as it lands."""
    check_tasks_per_step(options.envs, config.tasks_per_step)
    return await run_training(
        checked_run_options(options), config, learner_config or LearnerConfig(), progress=on_step
    )


def train(
    options: RunOptions,
    config: TrainConfig,
    learner_config: LearnerConfig | None = None,
    *,
    on_step: Callable[[StepMetrics], Any] | None = None,
) -> list[StepMetrics]:
    """`train_async` from synchronous code."""
    return anyio.run(lambda: train_async(options, config, learner_config, on_step=on_step))


async def collect_trajectories_async(
    options: RunOptions,
    *,
    groups: int = 4,
    rollouts_per_task: int = 4,
    rollout_config: RolloutConfig | None = None,
    concurrency: int = 2,
    on_group: Callable[[list[Trajectory]], Any] | None = None,
) -> Path:
    """Play `groups` task groups (round-robin over `options.envs`), `rollouts_per_task` rollouts
    each, with the model `options.model`; returns `options.out / "trajectories.jsonl"`.

    Each group of rollouts of one task is what ERPO's per-task baseline needs; `on_group` sees
    each group as it lands (progress, early inspection).
    """
    if groups < 1 or rollouts_per_task < 1:
        raise ValueError(
            f"groups and rollouts_per_task must be at least 1 (got {groups}, {rollouts_per_task})"
        )
    return await run_collection(
        checked_run_options(options),
        groups=groups,
        rollouts_per_task=rollouts_per_task,
        rollout_config=rollout_config or RolloutConfig(),
        concurrency=concurrency,
        progress=on_group,
    )


def collect_trajectories(
    options: RunOptions,
    *,
    groups: int = 4,
    rollouts_per_task: int = 4,
    rollout_config: RolloutConfig | None = None,
    concurrency: int = 2,
    on_group: Callable[[list[Trajectory]], Any] | None = None,
) -> Path:
    """`collect_trajectories_async` from synchronous code."""
    return anyio.run(
        lambda: collect_trajectories_async(
            options,
            groups=groups,
            rollouts_per_task=rollouts_per_task,
            rollout_config=rollout_config,
            concurrency=concurrency,
            on_group=on_group,
        )
    )


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The trajectories of a `trajectories.jsonl` that `collect_trajectories` wrote."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Trajectory.model_validate_json(line) for line in lines if line.strip()]
