"""What the report shows beside a trajectory: the task it was judged against, and why it failed.

A reward of 0.00 says nothing on its own. Beside each trial the report puts the user's
instruction, the golden calls, the reward parts of the task's basis with the one(s) that failed,
and, when the end state is wrong, the rows where it differs from the golden end state (expected
vs actual, only what differs). Trials that do not measure the agent (infra or env failures) are
labelled as such instead of being judged.

Tasks come from the `tasks.jsonl` of the env folders the run's manifest names, read once per
report; a run whose env folder is gone (a report re-rendered on another machine) still renders,
with a note in place of the task. The state diff comes from the task's `golden_diff` and the
record's `final_diff` alone (`report_diff.py`): no env is loaded and nothing is replayed.

In a dual-control env (one whose `env.toml` names `user_tables`) the panel marks the golden calls
the user makes, shows what the trial changed on each side (the agent's tables, the user's), and
splits the expected-vs-actual diff the same way.
"""

from __future__ import annotations

import html
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.synth import RewardPart, TableDiff, Task, load_tasks

from .idle_loop import IDLE_EXCHANGES
from .records import RunManifest, TrialRecord
from .report_diff import Line, end_state_lines, keys_of
from .vocab import ControlToken, Fault, Termination, TrialStatus

MAX_DIFF_LINES = 60
"""Diff lines shown per trial: a trial that rewrote a whole table stays a readable page."""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# --------------------------------------------------------------------------- the run's tasks


@dataclass
class RunTasks:
    """The tasks a run was judged against, by env, and why any env's tasks could not be read.

    Everything comes from `tasks.jsonl`: the env itself (schema, seed, tools) is never loaded,
    since the state diff needs only the two stored diffs and the tables' key columns.
    """

    tasks: dict[str, dict[str, Task]] = field(default_factory=dict)
    folders: dict[str, Path] = field(default_factory=dict)
    keys: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    user_tables: dict[str, frozenset[str]] = field(default_factory=dict)
    """Per dual-control env, the tables of the user's side (`env.toml`'s `user_tables`)."""

    def lookup(self, env: str, task_id: str) -> tuple[Task | None, str | None]:
        """The task, or None and a one-line reason."""
        tasks = self.tasks.get(env)
        if tasks is None:
            return None, self.missing.get(env, f"env {env!r} is not in the run's manifest")
        task = tasks.get(task_id)
        if task is None:
            return None, f"task {task_id!r} is no longer in {self.folders[env] / 'tasks.jsonl'}"
        return task, None


def load_run_tasks(manifest: RunManifest) -> RunTasks:
    """Every env of the run with the tasks its manifest lists; env folders that are gone are noted
    (`eval` stores them absolute, so a report reads them wherever it is rendered on that machine)."""
    out = RunTasks()
    for name, folder in zip(manifest.envs, manifest.env_dirs, strict=False):
        if not folder or not (Path(folder) / "tasks.jsonl").is_file():
            out.missing[name] = f"env folder {folder!r} not found: the task is not shown"
            continue
        wanted = set(manifest.task_ids.get(name, []))
        try:
            every = load_tasks(Path(folder))
        except (OSError, ValueError) as exc:
            out.missing[name] = f"{folder}/tasks.jsonl: {str(exc).splitlines()[0]}"
            continue
        out.tasks[name] = {t.id: t for t in every if t.id in wanted}
        out.folders[name] = Path(folder)
        out.keys[name] = keys_of(every)
        user_tables = _user_tables(Path(folder))
        if user_tables:
            out.user_tables[name] = user_tables
    return out


def _user_tables(folder: Path) -> frozenset[str]:
    """The env's `user_tables`, read from its env.toml alone (the env is not loaded); none when
    the file cannot be read."""
    try:
        data = tomllib.loads((folder / "env.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return frozenset()
    tables = data.get("user_tables")
    return frozenset(t for t in tables if isinstance(t, str)) if isinstance(tables, list) else frozenset()


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class PartVerdict:
    """One reward part of the task's basis as the trial's record has it."""

    part: str
    value: float | None
    reason: str

    @property
    def failed(self) -> bool:
        return self.value is not None and self.value < 1.0


EXCLUDED_LABEL = {
    Fault.INFRA: "infra failure: not a measurement of the agent, left out of pass^k (--resume runs it again)",
    Fault.ENV: "env failure: the environment had a bug, left out of pass^k",
}


def excluded_label(rec: TrialRecord) -> str | None:
    """Why a trial is left out of pass^k, or None when it counts."""
    return EXCLUDED_LABEL.get(Fault(rec.fault)) if not rec.counted else None


def part_verdicts(rec: TrialRecord, task: Task | None = None) -> list[PartVerdict]:
    """The task's reward parts, in basis order, each with its value and the reason it has it
    (`task`, when known, says whether it required any output at all)."""
    score = rec.score
    if score is None:
        return []
    out = []
    for name in score.basis:
        part = RewardPart(name)
        value = rec.parts.get(part)
        if part == RewardPart.STATE:
            value = 1.0 if score.state_match else 0.0
            reason = "end state matches the golden one" if score.state_match else "end state differs (below)"
        elif part == RewardPart.OUTPUTS:
            value = 1.0 if not score.outputs_missing else 0.0
            if score.outputs_missing:
                reason = f"not communicated: {', '.join(score.outputs_missing)}"
            elif task is not None and not task.required_outputs:
                reason = NO_OUTPUT_REQUIRED
            else:
                reason = "every required output communicated"
        elif part == RewardPart.CHECKPOINTS:
            value = score.checkpoints
            reason = f"{score.checkpoints_passed} of {score.checkpoints_total} checkpoint(s) hold"
        elif value is None or part in score.not_judged or part in rec.not_judged:
            value, reason = None, "not judged (no judge model, or no calls recorded)"
        elif part == RewardPart.POLICY:
            broken = "; ".join(score.policy_broken) or "a declared rule (re-score for which)"
            reason = "every declared policy rule kept" if value == 1.0 else f"policy broken: {broken}"
        elif part == RewardPart.ACTIONS:
            reason = (
                "every expected action was called" if value == 1.0 else "an expected action was not called"
            )
        else:
            reason = "the judge found every assertion met" if value == 1.0 else "the judge found one not met"
        out.append(PartVerdict(str(part), value, reason))
    return out


NO_OUTPUT_REQUIRED = "no output required: the task asks the agent to tell the user nothing"


def last_user_words(rec: TrialRecord) -> str:
    """What the user said last, in the user's own words ("" when it said nothing)."""
    return next((m.content or "" for m in reversed(rec.messages) if m.role == "user"), "").strip()


ENDINGS: dict[str, str] = {
    Termination.USER_STOP: f"the user ended the conversation ({ControlToken.STOP})",
    Termination.TRANSFER: f"the user asked for a human ({ControlToken.TRANSFER})",
    Termination.IDLE_LOOP: (
        f"ended for the user after {IDLE_EXCHANGES} exchanges going nowhere (only thanks, closings, "
        "refusals or repeats, no tool called): scored on the end state, charged to neither side"
    ),
    Termination.AGENT_STOP: f"the agent ended the conversation ({ControlToken.STOP})",
    Termination.AGENT_EMPTY: "the user gave up: the agent kept saying nothing after being nudged",
    Termination.MAX_TOOL_ERRORS: "the agent's failed tool calls passed the limit (max_tool_errors)",
    Termination.MAX_STEPS: "the agent made more tool calls in one turn than the limit (max_steps)",
    Termination.MAX_TURNS: "the exchange limit (max_turns) ran out before either side ended it",
    Termination.TIMEOUT: "the trial's wall-clock limit ran out",
}


def ending(rec: TrialRecord) -> str:
    """Why the conversation ended, in words: who ended it and, when the user did, the user's own
    last words (the scripted user's say why: "Thank you." after the agent's report, "No, that is
    all." after a closing offer, "You have not answered me" after silence)."""
    why = ENDINGS.get(rec.termination) or f"{rec.status}" + (f": {rec.error}" if rec.error else "")
    if rec.termination in (Termination.USER_STOP, Termination.TRANSFER, Termination.AGENT_EMPTY):
        words = last_user_words(rec)  # quoted when it says more than the control token
        if words.replace(ControlToken.STOP, "").replace(ControlToken.TRANSFER, "").strip():
            why += f": \u201c{words}\u201d"
    return why


def ended_early(rec: TrialRecord) -> str | None:
    """A counted trial that did not finish earns 0 whatever its parts say: say so."""
    if rec.counted and rec.status != TrialStatus.COMPLETED:
        return f"ended early ({rec.status}, {rec.termination}): an unfinished trial earns 0"
    return None


def failed_parts(rec: TrialRecord) -> list[str]:
    """The names shown in a failed trial's summary line: the failed parts, or how it ended."""
    names = [v.part for v in part_verdicts(rec) if v.failed]
    if rec.counted and rec.status != TrialStatus.COMPLETED:
        names.append(str(rec.status))
    return names


# --------------------------------------------------------------------------- state diff


def end_state_diff(tasks: RunTasks, task: Task, rec: TrialRecord) -> list[Line] | None:
    """Where the trial's end state differs from the golden one (None: no end state stored)."""
    if rec.final_diff is None:
        return None
    final = {t: TableDiff.model_validate(d) for t, d in rec.final_diff.items()}
    keys = {**keys_of([], [final]), **tasks.keys.get(rec.env, {})}
    return end_state_lines(task.golden_diff, final, keys)


def diff_html(lines: list[Line], heads: tuple[str, str] = ("expected", "actual")) -> str:
    if not lines:
        return '<p class="muted">no difference in the stored end state</p>'
    shown = lines[:MAX_DIFF_LINES]
    body = []
    for i, (t, k, c, x, a) in enumerate(shown):
        if i == 0 or shown[i - 1][0] != t:  # one heading row per table
            body.append(f'<tr class="d-table"><th colspan="4">{_e(t)}</th></tr>')
        body.append(
            f'<tr data-table="{_e(t)}"><td class="d-k">{_e(k)}</td><td class="d-c">{_e(c)}</td>'
            f'<td class="d-x">{_e(x)}</td><td class="d-a">{_e(a)}</td></tr>'
        )
    more = (
        f'<p class="muted">… {len(lines) - len(shown)} more difference(s) not shown</p>'
        if len(lines) > len(shown)
        else ""
    )
    return (
        '<table class="diff"><thead><tr><th>row</th><th>column</th>'
        f"<th>{_e(heads[0])}</th><th>{_e(heads[1])}</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
        f"{more}"
    )


def by_side(lines: list[Line], user_tables: frozenset[str]) -> tuple[list[Line], list[Line]]:
    """`lines` split into the agent's side and the user's side (dual control) by their table."""
    return [ln for ln in lines if ln[0] not in user_tables], [ln for ln in lines if ln[0] in user_tables]


def changes_by_side(tasks: RunTasks, rec: TrialRecord) -> tuple[list[Line], list[Line]] | None:
    """What the trial changed from its initial state, on the agent's side and on the user's
    (None: not a dual-control env, or no end state stored)."""
    user_tables = tasks.user_tables.get(rec.env)
    if not user_tables or rec.final_diff is None:
        return None
    final = {t: TableDiff.model_validate(d) for t, d in rec.final_diff.items()}
    keys = {**keys_of([], [final]), **tasks.keys.get(rec.env, {})}
    return by_side(end_state_lines({}, final, keys), user_tables)


# --------------------------------------------------------------------------- the panel


BY_USER = '<span class="by-user">user</span> '
"""What marks a golden call the user makes (dual control)."""


def _calls_html(task: Task) -> str:
    if not task.golden_calls:
        return '<p class="muted">no calls expected</p>'
    items = "".join(
        f"<li>{BY_USER if c.requestor == 'user' else ''}"
        f'<span class="fn">{_e(c.name)}</span>'
        f"<code>{_e(json.dumps(c.arguments, ensure_ascii=False, sort_keys=True))}</code></li>"
        for c in task.golden_calls
    )
    return f'<ol class="golden">{items}</ol>'


def _verdict_html(rec: TrialRecord, task: Task | None = None) -> str:
    rows = []
    for v in part_verdicts(rec, task):
        cls = "bad" if v.failed else "muted" if v.value is None else "good"
        value = "–" if v.value is None else f"{v.value:.2f}"
        mark = " ✗ failed" if v.failed else ""
        rows.append(
            f'<tr class="{cls}"><th>{_e(v.part)}{mark}</th><td class="v">{value}</td>'
            f"<td>{_e(v.reason)}</td></tr>"
        )
    early = ended_early(rec)
    if early:
        rows.append(f'<tr class="bad"><th>ending ✗</th><td class="v">0</td><td>{_e(early)}</td></tr>')
    if not rows:
        return '<p class="muted">not scored</p>'
    return f'<table class="parts">{"".join(rows)}</table>'


def _state_diff_html(tasks: RunTasks, task: Task, rec: TrialRecord) -> str:
    try:
        lines = end_state_diff(tasks, task, rec)
    except (ValueError, KeyError) as exc:
        return f'<p class="muted">state diff unavailable: {_e(exc)}</p>'
    if lines is None:
        return ""
    user_tables = tasks.user_tables.get(rec.env)
    if user_tables:
        agent_side, user_side = by_side(lines, user_tables)
        return (
            f"<h4>state diff, agent's side (expected vs actual)</h4>{diff_html(agent_side)}"
            f"<h4>state diff, user's side (expected vs actual)</h4>{diff_html(user_side)}"
        )
    return f"<h4>state diff (expected vs actual)</h4>{diff_html(lines)}"


def _changes_html(tasks: RunTasks, rec: TrialRecord) -> str:
    try:
        sides = changes_by_side(tasks, rec)
    except (ValueError, KeyError) as exc:
        return f'<p class="muted">state changes unavailable: {_e(exc)}</p>'
    if sides is None:
        return ""
    heads = ("before", "after")
    agent_side, user_side = (
        diff_html(lines, heads) if lines else '<p class="muted">nothing changed</p>' for lines in sides
    )
    return (
        f"<h4>what the trial changed: agent's side</h4>{agent_side}"
        f"<h4>what the trial changed: user's side</h4>{user_side}"
    )


def task_panel(rec: TrialRecord, tasks: RunTasks) -> str:
    """The task column of a trial: instruction, expected calls, reward parts and the state diff."""
    excluded = excluded_label(rec)
    task, why = tasks.lookup(rec.env, rec.task_id)
    out = []
    if excluded:
        out.append(f'<p class="excluded-note">{_e(excluded)}</p>')
    if task is None:
        out.append(f'<p class="muted">{_e(why)}</p>')
    else:
        instruction = _e(task.scenario.instruction)
        out.append(f'<h4>instruction</h4><blockquote class="instruction">{instruction}</blockquote>')
        if task.scenario.must_be_told:
            out.append(
                '<p class="told">the user must be told: '
                + ", ".join(f"<code>{_e(v)}</code>" for v in task.scenario.must_be_told)
                + "</p>"
            )
        out.append(f"<h4>expected calls ({len(task.golden_calls)})</h4>{_calls_html(task)}")
    if not excluded:
        out.append(f"<h4>reward parts</h4>{_verdict_html(rec, task)}")
        out.append(_changes_html(tasks, rec))
        if task is not None and rec.score is not None and not rec.score.state_match:
            out.append(_state_diff_html(tasks, task, rec))
    return f'<div class="task">{"".join(out)}</div>'
