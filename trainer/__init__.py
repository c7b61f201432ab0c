"""RL on the fleet: rollouts, ERPO advantages, the learner, the collection/update loop, Ray workers.

This is the trainer's public surface: the CLI, tests and benchmarks import from here, never
from its modules (ruff's banned-api checks it). Every name loads on first use through a module
`__getattr__`, so `import envforge.trainer` imports neither torch nor transformers: a name
whose module needs them loads them when it is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backends import Generation, HFBackend, VLLMBackend, load_tokenizer, unbatched_session
    from .bandit import INSTRUCTIONS, bandit_corpus, bandit_tasks, write_bandit_env
    from .batching import BatchRequest, LockstepBatcher
    from .distributed import init_from_env, shutdown
    from .envs import build_envs
    from .erpo import env_batch_stats, erpo_advantages, unbiased_std
    from .harness_env import EpisodeVerdict, HarnessRolloutEnv
    from .learner import Learner, LearnerConfig, clipped_pg_loss, token_logprobs
    from .local_weights import resolve_model
    from .lookup import held_out, lookup_tasks, split_tasks
    from .loop import Group, StepMetrics, TrainConfig, collect, job_stream, mask_scores, select_batch, train
    from .memory import release_freed_memory
    from .plots import svg_line_chart, write_comparison, write_plots
    from .ray_workers import (
        BackendSpec,
        EnvSpec,
        RayWorkers,
        RolloutWorker,
        WorkerInfo,
        WorkerSpec,
        state_checksum,
    )
    from .remote_fleet import EpisodeFleet, RemoteFleet
    from .rollout import (
        FleetRolloutEnv,
        NeedsUser,
        ParsedCall,
        PromptTooLong,
        RewardInfo,
        RolloutConfig,
        RolloutEnv,
        RolloutEpisode,
        ToolOutcome,
        parse_tool_call,
    )
    from .rollout import rollout as run_rollout
    from .run import (
        HeldOutScore,
        RunOptions,
        evaluate_held_out,
        run_collection,
        run_training,
        write_user_errors,
    )
    from .short_tasks import pair_tasks, split_steps, step_tasks, told_tasks
    from .summary import RunSummary, summarize
    from .tiny import build_tiny_model
    from .trajectory import IM_END, SequenceBuilder, Trajectory

# name -> module (inside this package) that defines it, imported on first access
_LAZY = {
    "Generation": "backends",
    "HFBackend": "backends",
    "VLLMBackend": "backends",
    "load_tokenizer": "backends",
    "unbatched_session": "backends",
    "BatchRequest": "batching",
    "LockstepBatcher": "batching",
    "INSTRUCTIONS": "bandit",
    "bandit_corpus": "bandit",
    "bandit_tasks": "bandit",
    "write_bandit_env": "bandit",
    "init_from_env": "distributed",
    "shutdown": "distributed",
    "build_envs": "envs",
    "env_batch_stats": "erpo",
    "erpo_advantages": "erpo",
    "unbiased_std": "erpo",
    "EpisodeVerdict": "harness_env",
    "HarnessRolloutEnv": "harness_env",
    "Learner": "learner",
    "LearnerConfig": "learner",
    "clipped_pg_loss": "learner",
    "token_logprobs": "learner",
    "Group": "loop",
    "StepMetrics": "loop",
    "TrainConfig": "loop",
    "collect": "loop",
    "job_stream": "loop",
    "mask_scores": "loop",
    "select_batch": "loop",
    "train": "loop",
    "BackendSpec": "ray_workers",
    "EnvSpec": "ray_workers",
    "RayWorkers": "ray_workers",
    "RolloutWorker": "ray_workers",
    "WorkerInfo": "ray_workers",
    "WorkerSpec": "ray_workers",
    "EpisodeFleet": "remote_fleet",
    "RemoteFleet": "remote_fleet",
    "state_checksum": "ray_workers",
    "FleetRolloutEnv": "rollout",
    "NeedsUser": "rollout",
    "ParsedCall": "rollout",
    "PromptTooLong": "rollout",
    "RewardInfo": "rollout",
    "RolloutConfig": "rollout",
    "RolloutEnv": "rollout",
    "RolloutEpisode": "rollout",
    "ToolOutcome": "rollout",
    "parse_tool_call": "rollout",
    "HeldOutScore": "run",
    "evaluate_held_out": "run",
    "RunOptions": "run",
    "run_collection": "run",
    "run_training": "run",
    "write_user_errors": "run",
    "RunSummary": "summary",
    "summarize": "summary",
    "build_tiny_model": "tiny",
    "resolve_model": "local_weights",
    "lookup_tasks": "lookup",
    "split_tasks": "lookup",
    "held_out": "lookup",
    "step_tasks": "short_tasks",
    "split_steps": "short_tasks",
    "told_tasks": "short_tasks",
    "pair_tasks": "short_tasks",
    "svg_line_chart": "plots",
    "write_comparison": "plots",
    "write_plots": "plots",
    "release_freed_memory": "memory",
    "IM_END": "trajectory",
    "SequenceBuilder": "trajectory",
    "Trajectory": "trajectory",
}

# surface name -> (module, its name there): `rollout` is also the module's name
_RENAMED = {"run_rollout": ("rollout", "rollout")}


def __getattr__(name: str) -> Any:
    module, attr = _RENAMED.get(name, (_LAZY.get(name), name))
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_RENAMED])


__all__ = [
    "IM_END",
    "INSTRUCTIONS",
    "BackendSpec",
    "BatchRequest",
    "EnvSpec",
    "EpisodeFleet",
    "EpisodeVerdict",
    "FleetRolloutEnv",
    "Generation",
    "Group",
    "HFBackend",
    "HarnessRolloutEnv",
    "HeldOutScore",
    "Learner",
    "LearnerConfig",
    "LockstepBatcher",
    "NeedsUser",
    "ParsedCall",
    "PromptTooLong",
    "RayWorkers",
    "RemoteFleet",
    "RewardInfo",
    "RolloutConfig",
    "RolloutEnv",
    "RolloutEpisode",
    "RolloutWorker",
    "RunOptions",
    "RunSummary",
    "SequenceBuilder",
    "StepMetrics",
    "ToolOutcome",
    "TrainConfig",
    "Trajectory",
    "VLLMBackend",
    "WorkerInfo",
    "WorkerSpec",
    "bandit_corpus",
    "bandit_tasks",
    "build_envs",
    "build_tiny_model",
    "clipped_pg_loss",
    "collect",
    "env_batch_stats",
    "erpo_advantages",
    "evaluate_held_out",
    "held_out",
    "init_from_env",
    "job_stream",
    "load_tokenizer",
    "lookup_tasks",
    "mask_scores",
    "pair_tasks",
    "parse_tool_call",
    "release_freed_memory",
    "resolve_model",
    "run_collection",
    "run_rollout",
    "run_training",
    "select_batch",
    "shutdown",
    "split_steps",
    "split_tasks",
    "state_checksum",
    "step_tasks",
    "summarize",
    "svg_line_chart",
    "token_logprobs",
    "told_tasks",
    "train",
    "unbatched_session",
    "unbiased_std",
    "write_bandit_env",
    "write_comparison",
    "write_plots",
    "write_user_errors",
]
