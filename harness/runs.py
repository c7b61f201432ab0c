"""A run directory on disk, trial scoring, and re-scoring from what a run stored.

`RUN_DIR/manifest.json` is the `RunManifest` (written once, compared on `--resume`);
`RUN_DIR/trials.jsonl` is append-only, one `TrialRecord` per line, each line flushed and fsynced
so a killed run loses at most the trial in flight. A key may appear more than once (an
infra failure, then its re-run): readers take the last record per key. Lines are read through
`records.read_trials`, which skips (and reports) torn or corrupt lines.

A run directory is owned by one process at a time: `RunDir.lock()` takes an exclusive
`flock` on `RUN_DIR/.lock`, which the OS releases when the process exits however it exits, so
a second `eval` or `--resume` on a directory in use refuses instead of running trials twice.

Scoring lives here because re-scoring must use exactly the code the run used: `score_trial`
gathers what only a trial has (the agent's calls for `actions`, an LLM judge's verdict on
`nl_assertions`, left out and recorded in `not_judged` when no judge model is configured) and
hands it to synth's one reward composer, `compose_reward`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic_core import PydanticSerializationError

from envforge.server import Environment, State, state_hash
from envforge.synth import (
    OFFLINE_PARTS,
    SCORERS,
    Call,
    Evidence,
    PartScore,
    PolicyRules,
    RewardPart,
    Score,
    Step,
    TableDiff,
    Task,
    compose_reward,
    detailed_score,
    judge_env_assertions,
    shown_results,
    with_answers,
)

from .llm import LLMConfig, complete, http_sessions
from .records import (
    Message,
    RunManifest,
    TrialRecord,
    TrialsRead,
    Usage,
    call_results,
    read_trials,
    recordable,
)
from .tasks import EnvTasks, load_env_tasks
from .user_tools import is_user_call, trajectory_calls
from .vocab import TrialStatus

PREMATURE = frozenset(
    {
        TrialStatus.TIMEOUT,
        TrialStatus.MAX_TURNS,
        TrialStatus.MAX_ERRORS,
        TrialStatus.CONTEXT_OVERFLOW,
        TrialStatus.MALFORMED_OUTPUT,
        TrialStatus.NO_RESPONSE,
    }
)
"""Endings before the conversation did: such a trial earns 0 whatever its parts."""
MANIFEST_IGNORED = {
    "run_id",
    "created_at",
    "concurrency",
    "versions",
    "agent_api_base",
    "user_api_base",
    "env_dirs",
}
"""Settings `--resume` may change: identity, speed, versions, and where things are reached (endpoints
and folder paths). Everything else — agent, user, their temperatures, envs, task ids, trials, seed,
limits, judge — changes what a trial measures, so it must match."""
LOCK_FILE = ".lock"
RESCORED_FILE = "rescored.jsonl"


class RunConfigMismatch(ValueError):
    """`--resume` on a run whose manifest says it was run differently, or that has no manifest."""


class RunLocked(RuntimeError):
    """Another process holds the run directory (an `eval` or `--resume` is running in it)."""


def trial_key(env: str, task_id: str, trial: int) -> str:
    return f"{env}/{task_id}/{trial}"


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.manifest_path = self.path / "manifest.json"
        self.trials_path = self.path / "trials.jsonl"

    def read_manifest(self) -> RunManifest | None:
        if not self.manifest_path.exists():
            return None
        return RunManifest.model_validate_json(self.manifest_path.read_text(encoding="utf-8"))

    def write_manifest(self, manifest: RunManifest) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.manifest_path.with_suffix(".json.tmp")
        tmp.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.manifest_path)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Own the directory while the block runs; `RunLocked` at once if another process does."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                raise RunLocked(
                    f"{self.path} is in use by {holder}: wait for it to finish, or choose another --out"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def read(self) -> TrialsRead:
        """Every readable record in file order, and the lines skipped (see `read_trials`)."""
        return read_trials(self.trials_path)

    def read_records(self) -> list[TrialRecord]:
        """Every readable record in file order."""
        return self.read().records

    def latest(self) -> dict[str, TrialRecord]:
        """The last record per trial key."""
        return {r.trial_key: r for r in self.read_records()}

    def append(self, record: TrialRecord) -> None:
        self.extend([record])

    def extend(self, records: Iterable[TrialRecord]) -> None:
        """Append `records` in order, then flush and fsync once."""
        self.path.mkdir(parents=True, exist_ok=True)
        lines = "".join(_record_line(r) + "\n" for r in records)
        if not lines:
            return
        with open(self.trials_path, "a+b") as f:
            # A crash mid-write leaves a torn last line: start on a fresh line so these records survive.
            size = f.seek(0, os.SEEK_END)
            torn = size > 0 and f.seek(size - 1) >= 0 and f.read(1) != b"\n"
            f.write((("\n" if torn else "") + lines).encode())
            f.flush()
            os.fsync(f.fileno())


def _record_line(record: TrialRecord) -> str:
    """The record as one JSON line. A value JSON cannot carry (a lone surrogate or bytes a custom
    agent or tool left in the trajectory, nesting past the serializer's depth) is written as
    `records.recordable` makes it, so no trial goes unwritten and the run goes on."""
    try:
        return record.model_dump_json()
    except PydanticSerializationError:
        data = recordable(record.model_dump(mode="python")).value
        return TrialRecord.model_validate(data).model_dump_json()


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_resumable(old: RunManifest, new: RunManifest) -> None:
    """Raise `RunConfigMismatch` naming every setting that differs (see `MANIFEST_IGNORED`)."""
    a = old.model_dump(exclude=MANIFEST_IGNORED)
    b = new.model_dump(exclude=MANIFEST_IGNORED)
    diffs = [f"{k}: run has {_short(a[k])}, now {_short(b.get(k))}" for k in a if a[k] != b.get(k)]
    if diffs:
        raise RunConfigMismatch(
            f"refusing to resume {old.run_id}: its configuration differs ({'; '.join(diffs)}); "
            "use another --out directory"
        )


# --------------------------------------------------------------------------- scoring


def agent_texts(messages: list[Message]) -> list[str]:
    return [m.content for m in messages if m.role == "assistant" and m.content]


def shown_texts(task: Task, messages: list[Message]) -> list[str]:
    """What the agent was shown: the user's messages, and the results of the task's own calls
    less what each passed in (`shown_results`). Each result is its call's by position
    (`call_results`), never by an id the agent chose."""
    results = [(call.name, call.arguments, m.content) for call, m in call_results(messages) if m.content]
    said = [m.content for m in messages if m.role == "user" and m.content]
    return [*said, *shown_results(task, results)]


NL_SYSTEM = """You judge whether a customer-service conversation meets a list of expected outcomes.
Judge only from what the conversation shows; an outcome that is not clearly met is not met.
Answer with JSON only, one result per expected outcome, in the order given:
{"results": [{"expectedOutcome": "<the outcome>", "reasoning": "<one sentence>", "metExpectation": true}]}"""
"""The judge's contract is τ²-bench's (`expectedOutcomes` in, `results[].metExpectation` out), so a
judge model or a grader prompt tuned for τ² works here unchanged."""


class NLJudgement(NamedTuple):
    """The judge's verdict on a task's NL assertions (1.0: all met) and what its call cost."""

    value: float
    usage: Usage


async def judge_nl_assertions(assertions: list[str], messages: list[Message], cfg: LLMConfig) -> NLJudgement:
    """1.0 when the judge finds every assertion met, else 0.0 (an answer it cannot parse fails)."""
    conversation = "\n".join(f"{m.role}: {m.content}" for m in messages if m.content and m.role != "tool")
    prompt = f"conversation:\n{conversation}\n\nexpectedOutcomes:\n{json.dumps(assertions)}"
    message, usage = await complete(
        cfg, [{"role": "system", "content": NL_SYSTEM}, {"role": "user", "content": prompt}]
    )
    match = re.search(r"\{.*\}", message.content or "", re.S)
    try:
        results = json.loads(match.group(0)).get("results", []) if match else []
    except (ValueError, AttributeError):
        results = []
    ok = (
        isinstance(results, list)
        and len(results) == len(assertions)
        and all(isinstance(r, dict) and r.get("metExpectation") is True for r in results)
    )
    return NLJudgement(1.0 if ok else 0.0, usage)


@dataclass
class TrialScore:
    score: Score
    parts: dict[str, float]
    not_judged: list[str] = field(default_factory=list)
    judge_usage: Usage | None = None


def agent_calls(messages: list[Message]) -> list[Call]:
    """The tool calls the trial made, in order (what the `actions` part matches): the agent's, and
    in a dual-control env the user's too, as τ²'s action matching takes the calls of both sides
    and compares no requestor."""
    return trajectory_calls(messages)


def policy_steps(messages: list[Message]) -> list[Step]:
    """The conversation as the policy part reads it: who said what, and each call with its
    result, in order. A result belongs to the calls of the assistant message before it, by
    position (never by an id the agent chose); a call with no result failed."""
    steps: list[Step] = []
    waiting: list[int] = []
    for m in messages:
        if is_user_call(m):  # the user acting on their own device: no step of the agent's policy
            waiting = []
            continue
        if m.role == "user":
            steps.append(Step("user", m.content or ""))
        elif m.role == "assistant":
            waiting = []
            if m.content:
                steps.append(Step("agent", m.content))
            for c in m.tool_calls:
                waiting.append(len(steps))
                steps.append(Step("call", "", Call(name=c.name, arguments=c.arguments), True))
        elif m.role == "tool" and waiting:
            at = waiting.pop(0)
            steps[at] = Step("call", m.content or "", steps[at].call, m.is_error)
    return steps


async def score_trial(
    task: Task,
    final_state: State,
    messages: list[Message],
    *,
    status: str,
    judge: LLMConfig | None = None,
    keys: Mapping[str, tuple[str, ...]] | None = None,
    policy: PolicyRules | None = None,
    env: Environment | None = None,
) -> TrialScore:
    """The trial's reward from `compose_reward`, with the evidence only a trial has: the agent's
    calls, the LLM judge's verdict on the task's NL assertions (when a judge is configured; none
    to judge are met), whether the trial ended prematurely (then it earns 0), where the env
    declares `policy` rules, the conversation they are checked on, and the verdict of the env's
    check tools on the task's env assertions (`env`: without it a task with some scores 0)."""
    verdicts: dict[RewardPart, PartScore] = {}
    if env is not None and task.env_assertions:
        verdicts[RewardPart.ENV_ASSERTIONS] = await judge_env_assertions(env, task, final_state)
    judge_usage = None
    if RewardPart.NL_ASSERTIONS in task.reward_basis:
        if not task.nl_assertions:
            verdicts[RewardPart.NL_ASSERTIONS] = PartScore(1.0, "no assertions to judge")
        elif judge is not None:
            value, judge_usage = await judge_nl_assertions(task.nl_assertions, messages, judge)
            reason = "the judge found every assertion met" if value == 1.0 else "the judge found one not met"
            verdicts[RewardPart.NL_ASSERTIONS] = PartScore(value, reason)
    evidence = Evidence(
        final_state,
        agent_texts(messages),
        lambda: shown_texts(task, messages),
        keys,
        agent_calls=agent_calls(messages),
        verdicts=verdicts,
        finished=status not in PREMATURE,
        policy=policy,
        trajectory=policy_steps(messages) if policy is not None else None,
    )
    scored = {p: SCORERS[p](task, evidence) for p in OFFLINE_PARTS}
    reward = compose_reward(task, evidence, scored=scored)
    parts = {str(p): s.value for p, s in reward.parts.items()}
    return TrialScore(
        detailed_score(task, scored, reward), parts, [str(p) for p in reward.not_judged], judge_usage
    )


@dataclass
class Rescored:
    """What `rescore` produced: the re-scored records, and what it could not re-score."""

    manifest: RunManifest
    records: list[TrialRecord]
    unscored: dict[str, str] = field(default_factory=dict)
    """trial key -> why it kept its stored score (no stored final state, task no longer exists)."""
    mismatched: dict[str, str] = field(default_factory=dict)
    """trial key -> why its stored final state is not to be believed: the state rebuilt from the
    record's `final_diff` does not hash to its `final_state_hash` (the record was altered, or the
    task's initial state is not the one the run started from), the hash is missing, or the diff
    cannot be rebuilt at all (`_checked_final`). It keeps its stored score."""
    read: TrialsRead = field(default_factory=TrialsRead)
    written: Path | None = None


async def rescore(
    run_dir: str | Path,
    *,
    tasks_from: Iterable[str | Path] = (),
    judge: LLMConfig | None = None,
    write: bool = False,
    out_dir: str | Path | None = None,
) -> Rescored:
    """Score every latest record again from its stored messages and final state, calling no agent.

    Tasks come from the run's own env folders, or — for an env named in `tasks_from` — from that
    folder's current `tasks.jsonl` (τ²'s `--fresh-tasks`). The scorer is `score_trial`, the code a
    run scores with. Records without a stored final state (infra failures) keep what they had, as
    do those whose rebuilt final state does not hash to the recorded one (`Rescored.mismatched`).
    Nothing already written is rewritten: `write` puts the result in `RUN_DIR/rescored.jsonl`;
    `out_dir` makes a new run directory (manifest + trials.jsonl) that `envforge report` reads.
    """
    rd = RunDir(run_dir)
    manifest = rd.read_manifest()
    if manifest is None:
        raise FileNotFoundError(f"{run_dir} has no manifest.json: not a run directory")
    envs: dict[str, EnvTasks] = {}
    for d in manifest.env_dirs:
        if Path(d).is_dir():
            et = load_env_tasks(d)
            et.tasks = with_answers(et.tasks, manifest.answers)
            envs[et.env.name] = et
    for folder in tasks_from:
        et = load_env_tasks(folder)
        et.tasks = with_answers(et.tasks, manifest.answers)
        envs[et.env.name] = et
    async with http_sessions():
        result = await _rescore(rd, manifest, envs, judge)
    if out_dir is not None:
        target = RunDir(out_dir)
        if target.read_manifest() is not None or target.trials_path.exists():
            raise FileExistsError(f"{out_dir} already holds a run: choose a new --out")
        dirs = {name: str(et.env_dir.resolve()) for name, et in envs.items()}
        target.write_manifest(
            manifest.model_copy(update={"env_dirs": [dirs.get(e, "") for e in manifest.envs]})
        )
        for rec in result.records:
            target.append(rec)
        result.written = target.trials_path
    elif write:
        path = rd.path / RESCORED_FILE
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(r.model_dump_json() + "\n" for r in result.records), encoding="utf-8")
        os.replace(tmp, path)
        result.written = path
    return result


async def _rescore(
    rd: RunDir, manifest: RunManifest, envs: dict[str, EnvTasks], judge: LLMConfig | None
) -> Rescored:
    read = rd.read()
    result = Rescored(manifest, [], read=read)
    for rec in records_for(manifest, read.records):
        et = envs.get(rec.env)
        task = next((t for t in et.tasks if t.id == rec.task_id), None) if et else None
        if rec.final_diff is None or task is None or et is None:
            why = "no stored final state" if rec.final_diff is None else "task not found in the current tasks"
            result.unscored[rec.trial_key] = why
            result.records.append(rec)
            continue
        final, why = _checked_final(et, task, rec)
        if final is None:
            result.mismatched[rec.trial_key] = why
            result.records.append(rec)
            continue
        ts = await score_trial(
            task,
            final,
            rec.messages,
            status=rec.status,
            judge=judge,
            keys=et.pks,
            policy=et.policy_rules,
            env=et.env,
        )
        result.records.append(
            rec.model_copy(
                update={
                    "score": ts.score,
                    "reward": ts.score.reward,
                    "parts": ts.parts,
                    "not_judged": ts.not_judged,
                }
            )
        )
    return result


def _checked_final(et: EnvTasks, task: Task, rec: TrialRecord) -> tuple[State | None, str]:
    """`rec`'s final state rebuilt from its stored diff, or None and why it is not to be believed:
    the diff cannot be applied, or the state does not hash to `final_state_hash` (a run stores
    the diff and the hash together, so one without the other was altered too)."""
    assert rec.final_diff is not None
    try:
        final = et.final_from_diff(task, _diff(rec.final_diff))
    except (ValueError, KeyError, TypeError) as exc:  # a diff of the wrong shape, or tables
        text = str(exc).strip()
        return None, f"its stored final state cannot be rebuilt ({text.splitlines()[0] if text else exc!r})"
    if rec.final_state_hash is None:
        return None, "it has a stored final state but no final_state_hash to check it against"
    if (rebuilt := state_hash(final)) != rec.final_state_hash:
        return None, (
            f"the final state rebuilt from its stored diff hashes to {rebuilt[:12]}, not to its "
            f"final_state_hash {rec.final_state_hash[:12]}: the record was altered, or the task's "
            "initial state is not the run's"
        )
    return final, ""


def _diff(raw: dict[str, Any]) -> Any:
    return {t: TableDiff.model_validate(d) for t, d in raw.items()}


def dump_diff(diff: Any) -> dict[str, Any]:
    return {t: d.model_dump(mode="json") for t, d in diff.items()}


def records_for(manifest: RunManifest, records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """The latest record of each of the manifest's trials, in manifest order; records another run
    wrote (a different run id) are not this run's and are ignored."""
    by_key = {r.trial_key: r for r in records if r.run_id == manifest.run_id}
    return [
        by_key[k]
        for env, ids in manifest.task_ids.items()
        for tid in ids
        for t in range(manifest.trials)
        if (k := trial_key(env, tid, t)) in by_key
    ]
