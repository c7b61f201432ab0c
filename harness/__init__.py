"""The evaluation harness: agents against simulated users, trials scored by synth's reward
composer, run directories, metrics and reports, and the closed vocabularies of a run (`vocab`).

This is the harness's public surface: the trainer, the CLI, tests and benchmarks import from
here, never from its modules (ruff's banned-api checks it). Every name loads on first use
through a module `__getattr__`: litellm, which most of the harness needs, is imported only
when a name that needs it is.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agents import BUILTIN_AGENTS, Agent, LLMAgent, OracleAgent, build_agent
    from .idle_loop import IDLE_EXCHANGES, IdleLoop, only_closing
    from .llm import InfraError, LLMConfig, aclose_http_sessions, http_sessions, routable_model
    from .local_models import MODELS as LOCAL_MODELS
    from .local_models import LocalModel, LocalModelError, assemble, cache_dir, is_local_spec, model_for_spec
    from .local_models import available as local_model_available
    from .local_server import LocalServer, LocalServerError, local_model_ready, running_local_server
    from .local_server import start as start_local_server
    from .local_server import stop as stop_local_server
    from .local_timing import TrialClock
    from .metrics import (
        RunContents,
        RunReadError,
        TruncatedRecordWarning,
        bootstrap_ci,
        bucket,
        pass_hat_k,
        print_summary,
        read_run,
        summarize,
    )
    from .orchestrator import (
        Ending,
        EvalConfig,
        HTTPBackend,
        Limits,
        RunExists,
        UnknownTasks,
        converse,
        run_eval,
    )
    from .records import Message, RunManifest, ToolCall, TrialRecord, Usage, read_trials
    from .report import REPORT_FILE, render_report, write_report
    from .report_compare import COMPARE_FILE, ComparedRun, read_runs, render_comparison, write_comparison
    from .report_diff import end_state_lines, keys_of
    from .report_task import RunTasks, load_run_tasks
    from .runs import (
        NLJudgement,
        RunConfigMismatch,
        RunDir,
        RunLocked,
        TrialScore,
        rescore,
        score_trial,
        shown_texts,
    )
    from .tasks import EnvTasks, TaskSelectionError, load_env_tasks, select_tasks
    from .tool_use import tool_call_validity
    from .toolcalls import MalformedToolCall, parse_tool_calls, tools_into_prompt
    from .user_error_eval import Evaluation, evaluate, rules_only, rules_then_judge, task_index
    from .user_error_eval import table as user_error_table
    from .user_error_inject import ErringUser, draw_user_error
    from .user_error_play import LabeledConversation
    from .user_error_set import DEFAULT_PER_ENV, DEFAULT_SEED, build_set, bundled_env_dirs, dump_set, load_set
    from .user_errors import (
        ERROR_KINDS,
        ErrorKind,
        RuleVerdict,
        UserErrorVerdict,
        detect_user_error,
        judge_transcript,
        rule_user_error,
        rule_verdict,
    )
    from .users import (
        STOP,
        TRANSFER,
        LLMUser,
        ScriptedUser,
        User,
        UserReply,
        asks_confirmation,
        build_user,
        confirmation_request,
        proposal_matches,
        request_text,
        says_nothing,
    )
    from .vocab import AgentName, ControlToken, Fault, RewardPart, Termination, TrialStatus, UserName

# name -> module (inside this package) that defines it, imported on first access
_LAZY = {
    "Agent": "agents",
    "BUILTIN_AGENTS": "agents",
    "LLMAgent": "agents",
    "OracleAgent": "agents",
    "build_agent": "agents",
    "IDLE_EXCHANGES": "idle_loop",
    "IdleLoop": "idle_loop",
    "only_closing": "idle_loop",
    "InfraError": "llm",
    "LLMConfig": "llm",
    "aclose_http_sessions": "llm",
    "http_sessions": "llm",
    "routable_model": "llm",
    "RunContents": "metrics",
    "RunReadError": "metrics",
    "TruncatedRecordWarning": "metrics",
    "bootstrap_ci": "metrics",
    "bucket": "metrics",
    "pass_hat_k": "metrics",
    "print_summary": "metrics",
    "read_run": "metrics",
    "summarize": "metrics",
    "Ending": "orchestrator",
    "EvalConfig": "orchestrator",
    "HTTPBackend": "orchestrator",
    "Limits": "orchestrator",
    "RunExists": "orchestrator",
    "UnknownTasks": "orchestrator",
    "TaskSelectionError": "tasks",
    "LocalModel": "local_models",
    "TrialClock": "local_timing",
    "LocalModelError": "local_models",
    "assemble": "local_models",
    "cache_dir": "local_models",
    "is_local_spec": "local_models",
    "model_for_spec": "local_models",
    "LocalServer": "local_server",
    "LocalServerError": "local_server",
    "local_model_ready": "local_server",
    "running_local_server": "local_server",
    "tool_call_validity": "tool_use",
    "MalformedToolCall": "toolcalls",
    "tools_into_prompt": "toolcalls",
    "LabeledConversation": "user_error_play",
    "parse_tool_calls": "toolcalls",
    "Evaluation": "user_error_eval",
    "evaluate": "user_error_eval",
    "rules_only": "user_error_eval",
    "rules_then_judge": "user_error_eval",
    "task_index": "user_error_eval",
    "DEFAULT_PER_ENV": "user_error_set",
    "DEFAULT_SEED": "user_error_set",
    "build_set": "user_error_set",
    "bundled_env_dirs": "user_error_set",
    "dump_set": "user_error_set",
    "load_set": "user_error_set",
    "ERROR_KINDS": "user_errors",
    "ErringUser": "user_error_inject",
    "draw_user_error": "user_error_inject",
    "ErrorKind": "user_errors",
    "rule_verdict": "user_errors",
    "select_tasks": "tasks",
    "converse": "orchestrator",
    "run_eval": "orchestrator",
    "Message": "records",
    "RunManifest": "records",
    "ToolCall": "records",
    "TrialRecord": "records",
    "Usage": "records",
    "read_trials": "records",
    "REPORT_FILE": "report",
    "render_report": "report",
    "write_report": "report",
    "COMPARE_FILE": "report_compare",
    "ComparedRun": "report_compare",
    "read_runs": "report_compare",
    "render_comparison": "report_compare",
    "write_comparison": "report_compare",
    "end_state_lines": "report_diff",
    "keys_of": "report_diff",
    "RunTasks": "report_task",
    "load_run_tasks": "report_task",
    "NLJudgement": "runs",
    "RunConfigMismatch": "runs",
    "RunDir": "runs",
    "RunLocked": "runs",
    "TrialScore": "runs",
    "rescore": "runs",
    "score_trial": "runs",
    "shown_texts": "runs",
    "EnvTasks": "tasks",
    "load_env_tasks": "tasks",
    "UserErrorVerdict": "user_errors",
    "detect_user_error": "user_errors",
    "judge_transcript": "user_errors",
    "rule_user_error": "user_errors",
    "RuleVerdict": "user_errors",
    "LLMUser": "users",
    "STOP": "users",
    "ScriptedUser": "users",
    "TRANSFER": "users",
    "User": "users",
    "build_user": "users",
    "confirmation_request": "users",
    "asks_confirmation": "users",
    "proposal_matches": "users",
    "says_nothing": "users",
    "UserReply": "users",
    "request_text": "users",
    "AgentName": "vocab",
    "ControlToken": "vocab",
    "Fault": "vocab",
    "RewardPart": "vocab",
    "Termination": "vocab",
    "TrialStatus": "vocab",
    "UserName": "vocab",
}

# surface name -> (module, its name there): names too bare for the package's surface
_RENAMED = {
    "LOCAL_MODELS": ("local_models", "MODELS"),
    "local_model_available": ("local_models", "available"),
    "start_local_server": ("local_server", "start"),
    "stop_local_server": ("local_server", "stop"),
    "user_error_table": ("user_error_eval", "table"),
}


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
    "BUILTIN_AGENTS",
    "COMPARE_FILE",
    "DEFAULT_PER_ENV",
    "DEFAULT_SEED",
    "ERROR_KINDS",
    "IDLE_EXCHANGES",
    "LOCAL_MODELS",
    "REPORT_FILE",
    "STOP",
    "TRANSFER",
    "Agent",
    "AgentName",
    "ComparedRun",
    "ControlToken",
    "Ending",
    "EnvTasks",
    "ErringUser",
    "ErrorKind",
    "EvalConfig",
    "Evaluation",
    "Fault",
    "HTTPBackend",
    "IdleLoop",
    "InfraError",
    "LLMAgent",
    "LLMConfig",
    "LLMUser",
    "LabeledConversation",
    "Limits",
    "LocalModel",
    "LocalModelError",
    "LocalServer",
    "LocalServerError",
    "MalformedToolCall",
    "Message",
    "NLJudgement",
    "OracleAgent",
    "RewardPart",
    "RuleVerdict",
    "RunConfigMismatch",
    "RunContents",
    "RunDir",
    "RunExists",
    "RunLocked",
    "RunManifest",
    "RunReadError",
    "RunTasks",
    "ScriptedUser",
    "TaskSelectionError",
    "Termination",
    "ToolCall",
    "TrialClock",
    "TrialRecord",
    "TrialScore",
    "TrialStatus",
    "TruncatedRecordWarning",
    "UnknownTasks",
    "Usage",
    "User",
    "UserErrorVerdict",
    "UserName",
    "UserReply",
    "aclose_http_sessions",
    "asks_confirmation",
    "assemble",
    "bootstrap_ci",
    "bucket",
    "build_agent",
    "build_set",
    "build_user",
    "bundled_env_dirs",
    "cache_dir",
    "confirmation_request",
    "converse",
    "detect_user_error",
    "draw_user_error",
    "dump_set",
    "end_state_lines",
    "evaluate",
    "http_sessions",
    "is_local_spec",
    "judge_transcript",
    "keys_of",
    "load_env_tasks",
    "load_run_tasks",
    "load_set",
    "local_model_available",
    "local_model_ready",
    "model_for_spec",
    "only_closing",
    "parse_tool_calls",
    "pass_hat_k",
    "print_summary",
    "proposal_matches",
    "read_run",
    "read_runs",
    "read_trials",
    "render_comparison",
    "render_report",
    "request_text",
    "rescore",
    "routable_model",
    "rule_user_error",
    "rule_verdict",
    "rules_only",
    "rules_then_judge",
    "run_eval",
    "running_local_server",
    "says_nothing",
    "score_trial",
    "select_tasks",
    "shown_texts",
    "start_local_server",
    "stop_local_server",
    "summarize",
    "task_index",
    "tool_call_validity",
    "tools_into_prompt",
    "user_error_table",
    "write_comparison",
    "write_report",
]
