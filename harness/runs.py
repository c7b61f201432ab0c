"""A run directory on disk, trial scoring, and re-scoring from what a run stored.

`RUN_DIR/manifest.json` is the `RunManifest` (written once, compared on `--resume`);
`RUN_DIR/trials.jsonl` is append-only, one `TrialRecord` per line, each line flushed and fsynced
so a killed run loses at most the trial in flight. A key may appear more than once (an
infra failure, then its re-run): readers take the last record per key.

Scoring lives here because re-scoring must use exactly the code the run used: `score_trial`
combines the synth scorer's parts (state, outputs, checkpoints) with the two the harness owns
(`actions`: τ²'s action matching; `nl_assertions`: an LLM judge, left out and recorded in
`not_judged` when no judge model is configured).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.server import State
from envforge.synth.models import ActionCheck, Score, TableDiff, Task
from envforge.synth.scoring import score_episode, with_answers

from .llm import LLMConfig, complete, http_sessions
from .records import Message, RunManifest, TrialRecord, Usage
from .tasks import EnvTasks, load_env_tasks

SYNTH_PARTS = ("state", "outputs", "checkpoints")
PREMATURE = ("timeout", "max_turns", "max_errors", "context_overflow")
MANIFEST_IGNORED = {"run_id", "created_at", "concurrency", "versions"}


class RunConfigMismatch(ValueError):
    """`--resume` on a run whose manifest says it was run differently."""


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

    def read_records(self) -> list[TrialRecord]:
        """Every record in file order; a torn last line (killed mid-write) is skipped."""
        if not self.trials_path.exists():
            return []
        out = []
        for line in self.trials_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    out.append(TrialRecord.model_validate_json(line))
                except ValueError:
                    continue
        return out

    def latest(self) -> dict[str, TrialRecord]:
        """The last record per trial key."""
        return {r.trial_key: r for r in self.read_records()}

    def append(self, record: TrialRecord) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.trials_path, "a+b") as f:
            # A crash mid-write leaves a torn last line: start on a fresh line so this record survives.
            size = f.seek(0, os.SEEK_END)
            torn = size > 0 and f.seek(size - 1) >= 0 and f.read(1) != b"\n"
            f.write((("\n" if torn else "") + record.model_dump_json() + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_resumable(old: RunManifest, new: RunManifest) -> None:
    """Raise `RunConfigMismatch` naming every setting that differs (concurrency may change)."""
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


def actions_matched(checks: list[ActionCheck], messages: list[Message]) -> bool:
    """Every expected action is matched by some agent call: same name, same compared arguments."""
    calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
    for check in checks:
        keys = check.compare_args if check.compare_args is not None else list(check.arguments)
        if not any(
            c.name == check.name and all(c.arguments.get(k) == check.arguments.get(k) for k in keys)
            for c in calls
        ):
            return False
    return True


NL_SYSTEM = """You judge whether a customer-service conversation meets a list of expected outcomes.
Judge only from what the conversation shows; an outcome that is not clearly met is not met.
Answer with JSON only, one result per expected outcome, in the order given:
{"results": [{"expectedOutcome": "<the outcome>", "reasoning": "<one sentence>", "metExpectation": true}]}"""
"""The judge's contract is τ²-bench's (`expectedOutcomes` in, `results[].metExpectation` out), so a
judge model or a grader prompt tuned for τ² works here unchanged."""


async def judge_nl_assertions(
    assertions: list[str], messages: list[Message], cfg: LLMConfig
) -> tuple[float, Usage]:
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
    return (1.0 if ok else 0.0), usage


@dataclass
class TrialScore:
    score: Score
    parts: dict[str, float]
    not_judged: list[str] = field(default_factory=list)
    judge_usage: Usage | None = None


async def score_trial(
    task: Task, final_state: State, messages: list[Message], *, status: str, judge: LLMConfig | None = None
) -> TrialScore:
    """The reward: product of the parts in the task's basis; 0 when the trial ended prematurely."""
    synth_basis = [p for p in task.reward_basis if p in SYNTH_PARTS]
    base = score_episode(
        task.model_copy(update={"reward_basis": synth_basis}), final_state, agent_texts(messages)
    )
    parts: dict[str, float] = {
        "state": 1.0 if base.state_match else 0.0,
        "outputs": 1.0 if not base.outputs_missing else 0.0,
        "checkpoints": base.checkpoints,
    }
    not_judged: list[str] = []
    judge_usage = None
    if "actions" in task.reward_basis:
        parts["actions"] = 1.0 if actions_matched(task.action_checks, messages) else 0.0
    if "nl_assertions" in task.reward_basis and task.nl_assertions:
        if judge is None:
            not_judged.append("nl_assertions")
        else:
            parts["nl_assertions"], judge_usage = await judge_nl_assertions(
                task.nl_assertions, messages, judge
            )
    reward = 1.0
    for part in task.reward_basis:
        if part in parts:
            reward *= parts[part]
    if status in PREMATURE:
        reward = 0.0
    score = base.model_copy(update={"reward": reward, "basis": list(task.reward_basis)})
    return TrialScore(score, {p: parts[p] for p in task.reward_basis if p in parts}, not_judged, judge_usage)


async def rescore(
    run_dir: str | Path, *, judge: LLMConfig | None = None, write: bool = False
) -> list[TrialRecord]:
    """Re-score every latest record from its stored messages and final state diff, without re-running.

    Records without a stored final state (infra failures) are returned unchanged. With `write`,
    the result goes to `RUN_DIR/rescored.jsonl`; `trials.jsonl` is never rewritten.
    """
    rd = RunDir(run_dir)
    manifest = rd.read_manifest()
    if manifest is None:
        raise FileNotFoundError(f"{run_dir} has no manifest.json")
    envs: dict[str, EnvTasks] = {}
    for d in manifest.env_dirs:
        et = load_env_tasks(d)
        et.tasks = with_answers(et.tasks, manifest.answers)
        envs[et.env.name] = et
    async with http_sessions():
        return await _rescore(rd, envs, judge, write)


async def _rescore(
    rd: RunDir, envs: dict[str, EnvTasks], judge: LLMConfig | None, write: bool
) -> list[TrialRecord]:
    out: list[TrialRecord] = []
    for rec in rd.latest().values():
        if rec.final_diff is None or rec.env not in envs:
            out.append(rec)
            continue
        et = envs[rec.env]
        task = et.task(rec.task_id)
        final = et.final_from_diff(task, _diff(rec.final_diff))
        ts = await score_trial(task, final, rec.messages, status=rec.status, judge=judge)
        out.append(
            rec.model_copy(
                update={
                    "score": ts.score,
                    "reward": ts.score.reward,
                    "parts": ts.parts,
                    "not_judged": ts.not_judged,
                }
            )
        )
    if write:
        with open(rd.path / "rescored.jsonl", "w", encoding="utf-8") as f:
            f.writelines(r.model_dump_json() + "\n" for r in out)
    return out


def _diff(raw: dict[str, Any]) -> Any:
    return {t: TableDiff.model_validate(d) for t, d in raw.items()}


def dump_diff(diff: Any) -> dict[str, Any]:
    return {t: d.model_dump(mode="json") for t, d in diff.items()}


def records_for(manifest: RunManifest, records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Records of the manifest's tasks and trials only, in manifest order."""
    by_key = {r.trial_key: r for r in records}
    return [
        by_key[k]
        for env, ids in manifest.task_ids.items()
        for tid in ids
        for t in range(manifest.trials)
        if (k := trial_key(env, tid, t)) in by_key
    ]
