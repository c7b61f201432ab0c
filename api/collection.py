"""Trajectories for training, collected from Python: a policy plays task groups on the envs.

This is `envforge collect` without the command line: `run_collection` (the trainer) does the
work and writes `trajectories.jsonl`; reading it back is here too, so a script can go from a
model to the token-level records an RL library consumes. The model runs under the `train`
extra (torch, transformers), which only this path loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from envforge.trainer import RolloutConfig, RunOptions, Trajectory, run_collection


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
        options,
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
