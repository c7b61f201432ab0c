"""The rollout envs a run plays, built from env folders: one module that both the driver
(`run.py`) and Ray actors (`ray_workers.py`) import, so neither imports the other."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from envforge.harness import LLMConfig, UserName, load_env_tasks
from envforge.server import load_env
from envforge.synth import load_tasks

from .harness_env import HarnessRolloutEnv
from .remote_fleet import EpisodeFleet
from .rollout import FleetRolloutEnv, RolloutEnv


def build_envs(
    fleet: EpisodeFleet,
    dirs: Sequence[Path],
    use_mcp: bool,
    *,
    env_kind: Literal["harness", "fleet"] = "fleet",
    user: str = UserName.SCRIPTED,
    user_api_base: str | None = None,
    judge: str | None = None,
    user_error_rate: float = 0.0,
    user_error_seed: int = 0,
) -> list[RolloutEnv]:
    envs: list[RolloutEnv] = []
    for d in dirs:
        tasks_file = Path(d) / "tasks.jsonl"
        if not tasks_file.exists():
            raise FileNotFoundError(f"{tasks_file} is missing: synthesize tasks first (envforge synth tasks)")
        if env_kind == "harness":
            user_llm = None if user == UserName.SCRIPTED else LLMConfig(model=user, api_base=user_api_base)
            envs.append(
                HarnessRolloutEnv(
                    fleet,
                    load_env_tasks(d),
                    user=user,
                    user_llm=user_llm,
                    judge=LLMConfig(model=judge) if judge else None,
                    use_mcp=use_mcp,
                    user_error_rate=user_error_rate,
                    user_error_seed=user_error_seed,
                )
            )
        else:
            name = load_env(d).name
            envs.append(FleetRolloutEnv(fleet, name, load_tasks(Path(d)), use_mcp=use_mcp))
    return envs
