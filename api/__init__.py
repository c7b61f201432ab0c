"""envforge's Python API: load an env, play an episode, synthesize and check tasks, evaluate an
agent, collect trajectories for training.

This is the front door for code that uses envforge (docs/api.md walks through it). It composes
the packages' own surfaces, which stay the reference for everything else:
`envforge.server` (envs, episodes, MCP serving), `envforge.synth` (tasks, verifiers, rewards),
`envforge.harness` (agents, users, runs, metrics), `envforge.trainer` (rollouts, ERPO).
It sits to the right of the trainer (server <- synth <- harness <- trainer <- envforge <- cli),
so none of those packages import from here.

Every name loads on first use through a module `__getattr__`: `import envforge` imports none of
the packages, and `envforge.evaluate` loads the harness but not the trainer (nor torch). Each
long-running function has an `async` form (`*_async`, for code already inside an event loop) and
a synchronous one that runs it with `anyio.run`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envforge.harness import (
        Agent,
        EvalConfig,
        Limits,
        LLMConfig,
        RunManifest,
        TrialRecord,
        User,
        pass_hat_k,
        read_run,
        run_eval,
        summarize,
        write_report,
    )
    from envforge.server import (
        Db,
        Environment,
        Episode,
        EpisodeClient,
        Fleet,
        State,
        ToolError,
        ToolResult,
        build_app,
        episode_client,
        load_env,
        serve_http,
        state_hash,
        tool,
    )
    from envforge.synth import (
        Call,
        Score,
        SynthConfig,
        SynthReport,
        Task,
        ToolGraph,
        build_graph,
        load_tasks,
        score_episode,
        write_tasks_to,
    )
    from envforge.trainer import (
        LearnerConfig,
        RolloutConfig,
        RunOptions,
        StepMetrics,
        TrainConfig,
        Trajectory,
    )

    from .collection import (
        check_tasks_per_step,
        checked_run_options,
        collect_trajectories,
        collect_trajectories_async,
        read_trajectories,
        train,
        train_async,
    )
    from .env_synthesis import EnvBatch, doc_sets, synthesize_envs, synthesize_envs_async
    from .episode_runs import EnvLike, EpisodeRun, as_environment, run_episode, run_episode_async
    from .eval_setup import (
        LLMTransport,
        LocalServerWatch,
        Role,
        check_agent_name,
        llm_config,
        local_model_servers,
        model_roles,
        with_models,
    )
    from .evaluation import (
        Evaluation,
        evaluate,
        evaluate_async,
        frozen_heap,
    )
    from .serving import (
        HttpServer,
        ServeLimits,
        http_server,
        launched_over_pipes,
        listening_socket,
        serve_env_stdio,
        sqlite_work_bytes,
    )
    from .settings import SettingError
    from .synthesis import (
        TaskCheck,
        check_tasks,
        check_tasks_async,
        score_calls,
        score_calls_async,
        synthesize_tasks,
        synthesize_tasks_async,
    )

# name -> the module that defines it (relative: this package's own), imported on first access
_LAZY = {
    **dict.fromkeys(
        (
            "check_tasks_per_step",
            "checked_run_options",
            "collect_trajectories",
            "collect_trajectories_async",
            "read_trajectories",
            "train",
            "train_async",
        ),
        ".collection",
    ),
    **dict.fromkeys(("EnvBatch", "doc_sets", "synthesize_envs", "synthesize_envs_async"), ".env_synthesis"),
    **dict.fromkeys(
        ("EnvLike", "EpisodeRun", "as_environment", "run_episode", "run_episode_async"), ".episode_runs"
    ),
    **dict.fromkeys(
        (
            "LLMTransport",
            "LocalServerWatch",
            "Role",
            "check_agent_name",
            "llm_config",
            "local_model_servers",
            "model_roles",
            "with_models",
        ),
        ".eval_setup",
    ),
    "SettingError": ".settings",
    **dict.fromkeys(
        (
            "Evaluation",
            "evaluate",
            "evaluate_async",
            "frozen_heap",
        ),
        ".evaluation",
    ),
    **dict.fromkeys(
        (
            "HttpServer",
            "ServeLimits",
            "http_server",
            "launched_over_pipes",
            "listening_socket",
            "serve_env_stdio",
            "sqlite_work_bytes",
        ),
        ".serving",
    ),
    **dict.fromkeys(
        (
            "TaskCheck",
            "check_tasks",
            "check_tasks_async",
            "score_calls",
            "score_calls_async",
            "synthesize_tasks",
            "synthesize_tasks_async",
        ),
        ".synthesis",
    ),
    **dict.fromkeys(
        (
            "Db",
            "Environment",
            "Episode",
            "EpisodeClient",
            "Fleet",
            "State",
            "ToolError",
            "ToolResult",
            "build_app",
            "episode_client",
            "load_env",
            "serve_http",
            "state_hash",
            "tool",
        ),
        "envforge.server",
    ),
    **dict.fromkeys(
        (
            "Call",
            "Score",
            "SynthConfig",
            "SynthReport",
            "Task",
            "ToolGraph",
            "build_graph",
            "load_tasks",
            "score_episode",
            "write_tasks_to",
        ),
        "envforge.synth",
    ),
    **dict.fromkeys(
        (
            "Agent",
            "EvalConfig",
            "LLMConfig",
            "Limits",
            "RunManifest",
            "TrialRecord",
            "User",
            "pass_hat_k",
            "read_run",
            "run_eval",
            "summarize",
            "write_report",
        ),
        "envforge.harness",
    ),
    **dict.fromkeys(
        ("LearnerConfig", "RolloutConfig", "RunOptions", "StepMetrics", "TrainConfig", "Trajectory"),
        "envforge.trainer",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("envforge")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Agent",
    "Call",
    "Db",
    "EnvBatch",
    "EnvLike",
    "Environment",
    "Episode",
    "EpisodeClient",
    "EpisodeRun",
    "EvalConfig",
    "Evaluation",
    "Fleet",
    "HttpServer",
    "LLMConfig",
    "LLMTransport",
    "LearnerConfig",
    "Limits",
    "LocalServerWatch",
    "Role",
    "RolloutConfig",
    "RunManifest",
    "RunOptions",
    "Score",
    "ServeLimits",
    "SettingError",
    "State",
    "StepMetrics",
    "SynthConfig",
    "SynthReport",
    "Task",
    "TaskCheck",
    "ToolError",
    "ToolGraph",
    "ToolResult",
    "TrainConfig",
    "Trajectory",
    "TrialRecord",
    "User",
    "as_environment",
    "build_app",
    "build_graph",
    "check_agent_name",
    "check_tasks",
    "check_tasks_async",
    "check_tasks_per_step",
    "checked_run_options",
    "collect_trajectories",
    "collect_trajectories_async",
    "doc_sets",
    "episode_client",
    "evaluate",
    "evaluate_async",
    "frozen_heap",
    "http_server",
    "launched_over_pipes",
    "listening_socket",
    "llm_config",
    "load_env",
    "load_tasks",
    "local_model_servers",
    "model_roles",
    "pass_hat_k",
    "read_run",
    "read_trajectories",
    "run_episode",
    "run_episode_async",
    "run_eval",
    "score_calls",
    "score_calls_async",
    "score_episode",
    "serve_env_stdio",
    "serve_http",
    "sqlite_work_bytes",
    "state_hash",
    "summarize",
    "synthesize_envs",
    "synthesize_envs_async",
    "synthesize_tasks",
    "synthesize_tasks_async",
    "tool",
    "train",
    "train_async",
    "with_models",
    "write_report",
    "write_tasks_to",
]
