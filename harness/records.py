"""What an evaluation run writes: the manifest and one `TrialRecord` per line of `trials.jsonl`.

These models are the harness's boundary: the report, re-scoring, `--resume` and the RL trainer
read runs back through them, so a run directory stays readable after the code moves on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envforge.synth.models import Score


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Model):
    id: str
    name: str
    arguments: dict[str, Any]


class Message(_Model):
    """One message of the conversation, in OpenAI chat shape (what litellm sends and returns)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    turn: int = 0


class Usage(_Model):
    """Tokens and cost of one role's model calls; tokens are kept even when a model has no price."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


TrialStatus = Literal["completed", "infra_failure", "context_overflow", "timeout", "max_turns", "max_errors"]


class TrialRecord(_Model):
    """One attempt of one task: the trajectory, how it ended, and its score."""

    run_id: str
    trial_key: str = Field(
        description="'<env>/<task_id>/<trial>': unique within a run; resume skips done keys"
    )
    env: str
    task_id: str
    trial: int
    seed: int
    status: TrialStatus
    termination: str = Field(description="why the conversation ended: user_stop, transfer, agent_stop, ...")
    error: str | None = None
    messages: list[Message]
    final_state_hash: str | None = None
    score: Score | None = None
    reward: float = 0.0
    user_error: bool = False
    user_error_reason: str | None = None
    env_errors: int = Field(
        0, description="tool calls that failed by an internal error of the env (a crash, not a refusal)"
    )
    usage: dict[str, Usage] = Field(default_factory=dict, description="per role: agent, user, judge")
    difficulty: dict[str, int] = Field(default_factory=dict)
    started_at: float
    duration_s: float
    agent: str
    user: str
    final_diff: dict[str, Any] | None = Field(
        None, description="final state as a StateDiff against the task's initial state: rescoring input"
    )
    parts: dict[str, float] = Field(default_factory=dict, description="reward part -> value, as combined")
    not_judged: list[str] = Field(
        default_factory=list, description="reward parts left out because no judge model was configured"
    )


class RunManifest(_Model):
    """The run's configuration, written once at the start and checked again on `--resume`."""

    run_id: str
    created_at: float
    envs: list[str]
    env_dirs: list[str]
    task_ids: dict[str, list[str]]
    trials: int
    agent: str
    agent_api_base: str | None = None
    user: str
    user_api_base: str | None = None
    agent_temperature: float | None = None
    user_temperature: float | None = None
    concurrency: int
    seed: int
    limits: dict[str, float] = Field(default_factory=dict)
    judge: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
