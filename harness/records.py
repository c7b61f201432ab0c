"""What an evaluation run writes: the manifest and one `TrialRecord` per line of `trials.jsonl`.

These models are the harness's boundary: the report, re-scoring, `--resume` and the RL trainer
read runs back through them — all through `read_trials`, the one reader — so a run directory
stays readable after the code moves on, and every reader agrees on which lines count.

Every trial ending is charged to one side (`Fault`): the agent's (scored, counted in pass^k),
the infrastructure's (not a measurement: left out of pass^k and re-run by `--resume`) or the
environment's (an env bug: left out of pass^k and reported, not re-run — it would recur).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envforge.synth import AnswersMode, Score

from .vocab import Fault, Termination, TrialStatus


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Model):
    id: str = Field(description="the harness's own id in a trial's record (`harness_call_id`)")
    name: str
    arguments: dict[str, Any]


def harness_call_id(index: int) -> str:
    """The id of a trial's `index`-th tool call (from 0), given by the harness whatever id the
    agent or its model server sent (one id for every call, none at all, `call_0` each time)."""
    return f"call_h{index}"


class Message(_Model):
    """One message of the conversation, in OpenAI chat shape (what litellm sends and returns)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    turn: int = 0


def call_results(messages: list[Message]) -> list[tuple[ToolCall, Message]]:
    """Each tool result with the call it answers, paired by position: the results that follow an
    assistant message answer its calls in order (the harness appends them so). Never by the id a
    result names: an agent that reuses one id, or a server that sends none, would otherwise have
    every result credited to the last call of that id. A result past its message's calls answers
    none."""
    pairs: list[tuple[ToolCall, Message]] = []
    pending: list[ToolCall] = []
    for m in messages:
        if m.role == "assistant":
            pending = list(m.tool_calls)
        elif m.role == "tool" and pending:
            pairs.append((pending.pop(0), m))
        elif m.role != "tool":
            pending = []
    return pairs


RECORD_DEPTH = 64
"""How deeply a recorded value may nest: past it, a model's output is cut to "…" so that the
record can be written (pydantic's serializer refuses deeper values)."""


_SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point: in a Python string always a lone one (a JSON pair decodes to one
character), which UTF-8, and so a record, cannot hold."""


class Recordable(NamedTuple):
    """A value as a record can hold it, and the first thing that had to change (None: nothing)."""

    value: Any
    problem: str | None


def recordable(value: Any) -> Recordable:
    """`value` made writable as JSON, and what was wrong with it: a lone surrogate becomes U+FFFD
    ("invalid Unicode"), bytes their text with bad bytes replaced ("binary content"), a value
    nested past `RECORD_DEPTH` "…", a key that is not a string its `str`, any other non-JSON value
    its `repr`. One model output that cannot be written would otherwise end the whole run."""
    problems: list[str] = []

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, str):
            if v.isascii():
                return v
            if _SURROGATE.search(v) is None:
                return v
            problems.append("invalid Unicode (a lone surrogate)")
            return _SURROGATE.sub("\ufffd", v)
        if v is None or isinstance(v, bool | int | float):
            return v
        if depth >= RECORD_DEPTH:
            problems.append(f"nested deeper than {RECORD_DEPTH} levels")
            return "…"
        if isinstance(v, dict):
            return {
                walk(k if isinstance(k, str) else str(k), depth): walk(x, depth + 1) for k, x in v.items()
            }
        if isinstance(v, list | tuple):
            return [walk(x, depth + 1) for x in v]
        if isinstance(v, bytes | bytearray):
            problems.append("binary content (bytes)")
            return bytes(v).decode("utf-8", "replace")
        problems.append(f"not a JSON value ({type(v).__name__})")
        return walk(repr(v), depth)

    cleaned = walk(value, 0)
    return Recordable(cleaned, problems[0] if problems else None)


class Usage(_Model):
    """Tokens and cost of one role's model calls; tokens are kept even when a model has no price."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


FAULT_OF_STATUS: dict[TrialStatus, Fault] = {
    TrialStatus.COMPLETED: Fault.NONE,
    TrialStatus.INFRA_FAILURE: Fault.INFRA,
    TrialStatus.ENV_FAILURE: Fault.ENV,
    TrialStatus.CONTEXT_OVERFLOW: Fault.AGENT,
    TrialStatus.TIMEOUT: Fault.AGENT,
    TrialStatus.MAX_TURNS: Fault.AGENT,
    TrialStatus.MAX_ERRORS: Fault.AGENT,
    TrialStatus.MALFORMED_OUTPUT: Fault.AGENT,
    TrialStatus.NO_RESPONSE: Fault.AGENT,
}

_STATUSES = frozenset(s.value for s in TrialStatus)

COUNTED_FAULTS = frozenset({Fault.NONE, Fault.AGENT})
"""Endings that measure the agent: the only ones pass^k and mean reward see."""


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
    fault: Fault = Field(
        Fault.NONE, description="whose side the ending is on; derived from status in older records"
    )
    termination: Termination = Field(description="why the conversation ended (`Termination`)")
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

    @model_validator(mode="before")
    @classmethod
    def _fault_from_status(cls, data: Any) -> Any:
        """Records written before `fault` existed carry only a status: derive whose side it was."""
        if isinstance(data, dict) and "fault" not in data and data.get("status") in _STATUSES:
            data = {**data, "fault": FAULT_OF_STATUS[TrialStatus(data["status"])]}
        return data

    @property
    def counted(self) -> bool:
        """Whether this trial measures the agent (pass^k, mean reward)."""
        return self.fault in COUNTED_FAULTS

    @property
    def rerun_on_resume(self) -> bool:
        return self.fault == Fault.INFRA


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
    answers: AnswersMode = Field(
        "task",
        description="'task': each task's answer rule scored it; 'strict': the exact rule for every task",
    )
    solo: bool = Field(False, description="τ²'s solo mode: the agent drove the user's tools too")
    versions: dict[str, str] = Field(default_factory=dict)


# --------------------------------------------------------------------------- the one reader


@dataclass(frozen=True)
class SkippedLine:
    """A line of trials.jsonl no record could be read from, and the trial it seems to belong to."""

    lineno: int
    reason: str
    trial_key: str | None = None


@dataclass
class TrialsRead:
    """What `read_trials` found: the records in file order, and every line it had to skip."""

    records: list[TrialRecord] = field(default_factory=list)
    skipped: list[SkippedLine] = field(default_factory=list)

    def describe_skipped(self, path: Path | str) -> str:
        """One line for the console: how many lines were skipped, and where."""
        where = ", ".join(str(s.lineno) for s in self.skipped[:10])
        more = f" (+{len(self.skipped) - 10} more)" if len(self.skipped) > 10 else ""
        first = self.skipped[0].reason if self.skipped else ""
        return f"{path}: skipped {len(self.skipped)} unreadable line(s) at line {where}{more}; first: {first}"


_KEY = re.compile(r'"trial_key"\s*:\s*"((?:[^"\\]|\\.)*)"')
_RECORD_START = '{"run_id"'


def _parse(line: str) -> TrialRecord:
    return TrialRecord.model_validate_json(line)


def read_trials(path: Path | str) -> TrialsRead:
    """Every readable record of a trials.jsonl in file order, and each line skipped, with its number.

    A line is skipped — never fatal — when it is torn (a crash mid-write), holds a byte that is not
    UTF-8, is not JSON, or is not a valid `TrialRecord`. Resume, report, rescore and the trainer all
    read through here, so they agree on which trials exist; a skipped trial is simply missing, so
    `--resume` runs it again. A torn prefix with a whole record glued after it (older writers
    appended without starting a fresh line) keeps the glued record.
    """
    path = Path(path)
    return parse_trials(path.read_bytes()) if path.exists() else TrialsRead()


def parse_trials(data: bytes) -> TrialsRead:
    """`read_trials` on the bytes of a log (or of its whole lines read so far)."""
    out = TrialsRead()
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = raw.decode("utf-8", errors="replace")
            out.skipped.append(SkippedLine(lineno, f"not UTF-8 ({exc.reason})", _key_in(text)))
            continue
        try:
            out.records.append(_parse(line))
            continue
        except (ValueError, ValidationError) as exc:
            reason = _reason(exc)
        glued = line.rfind(_RECORD_START)
        if glued > 0:
            try:
                out.records.append(_parse(line[glued:]))
                out.skipped.append(SkippedLine(lineno, "torn record before an appended one", None))
                continue
            except (ValueError, ValidationError):
                pass
        out.skipped.append(SkippedLine(lineno, reason, _key_in(line)))
    return out


def _key_in(line: str) -> str | None:
    match = _KEY.search(line)
    return match.group(1) if match else None


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return f"not valid JSON ({first['msg']})"
        return f"not a trial record ({'.'.join(map(str, first['loc'])) or 'record'}: {first['msg']})"
    return f"not valid JSON ({exc})"
