"""Reading a run back and summarizing it: pass^k, mean reward, bootstrap CIs, per env and difficulty.

Definitions (kept here so the report, the CLI and the trainer agree on one meaning):

- A trial is *counted* when its ending is on the agent's side or nobody's (`records.Fault`:
  `none`, `agent`). Infra failures are re-run by `--resume`, so counting them would charge the
  agent for our crash; env failures are the env's bug. Every agent-side ending
  (`context_overflow`, `malformed_output`, `timeout`, `max_turns`, ...) is an attempt the agent
  made and counts, with whatever reward it got (0 for a premature ending).
- A trial *succeeds* when its reward is 1.0 (>= 1 - 1e-6, float noise from products of parts).
- pass^k is τ-bench's: for a task with n counted trials and c successes, C(c, k) / C(n, k), i.e. the
  chance that k trials drawn without replacement all succeed; averaged over the tasks with n >= k.
  `pass_hat_k_env_failed` is the same with env failures counted as failed trials; every table
  shows the env-failure count beside pass^k, and this figure beside it wherever a trial was the
  env's (report.html and `--json` always), so failures charged to the env stay in view.
- Mean reward is averaged per task first and then over tasks, so it weighs tasks like pass^1 does
  and like the bootstrap (which resamples tasks) assumes.
- Confidence intervals: 95 % percentile bootstrap over tasks, 1000 resamples, `random.Random(0)`,
  so the same run always gives the same interval.
- Difficulty buckets, from the task's number of tool calls (`difficulty["calls"]`): `easy` <= 2,
  `medium` 3-4, `hard` >= 5; a record without difficulty goes to `unknown`.
"""

from __future__ import annotations

import functools
import math
import random
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from .records import RunManifest, TrialRecord, Usage, read_trials
from .tool_use import tool_call_validity
from .vocab import Fault

MANIFEST_FILE = "manifest.json"
TRIALS_FILE = "trials.jsonl"
SUCCESS_EPS = 1e-6
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
ROLES = ("agent", "user", "judge")
BUCKETS = ("easy", "medium", "hard")
BUCKET_RULE = "by tool calls of the golden path: easy <= 2, medium 3-4, hard >= 5"


class RunReadError(ValueError):
    """A run directory that cannot be read: missing, or without a readable manifest."""


class TruncatedRecordWarning(UserWarning):
    """Lines of trials.jsonl that hold no readable record (torn by a crash, or corrupt); skipped."""


# --------------------------------------------------------------------------- reading


def latest(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """The last record per trial_key (resume appends superseding lines), sorted env/task/trial."""
    by_key: dict[str, TrialRecord] = {}
    for rec in records:
        by_key[rec.trial_key] = rec
    return sorted(by_key.values(), key=lambda r: (r.env, r.task_id, r.trial, r.trial_key))


class RunContents(NamedTuple):
    """A run's manifest and its current records."""

    manifest: RunManifest
    records: list[TrialRecord]


def read_run(run_dir: Path | str) -> RunContents:
    """The run's manifest and its current records (last per trial_key, sorted env/task/trial).

    Records come through `records.read_trials`, the reader `--resume` uses too: unreadable lines
    are skipped with one `TruncatedRecordWarning` saying how many and where.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunReadError(f"{run_dir}: no such run directory")
    manifest_path = run_dir / MANIFEST_FILE
    if not manifest_path.exists():
        raise RunReadError(f"{run_dir}: not a run directory (no {MANIFEST_FILE})")
    try:
        manifest = RunManifest.model_validate_json(manifest_path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise RunReadError(f"{manifest_path}: not a run manifest: {exc}") from exc
    read = read_trials(run_dir / TRIALS_FILE)
    if read.skipped:
        warnings.warn(read.describe_skipped(run_dir / TRIALS_FILE), TruncatedRecordWarning, stacklevel=2)
    return RunContents(manifest, [r for r in latest(read.records) if r.run_id == manifest.run_id])


# --------------------------------------------------------------------------- statistics


def is_success(reward: float) -> bool:
    return reward >= 1.0 - SUCCESS_EPS


def is_counted(rec: TrialRecord) -> bool:
    return rec.counted


def pass_hat_k(outcomes: Sequence[tuple[int, int]], k: int) -> float | None:
    """Mean over tasks of C(c, k) / C(n, k) for `outcomes` = [(n, c), ...]; tasks with n < k skipped.

    None when no task has k counted trials (the value is undefined, not zero).
    """
    values = [math.comb(c, k) / math.comb(n, k) for n, c in outcomes if n >= k]
    return sum(values) / len(values) if values else None


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 1]."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_ci(
    values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> list[float] | None:
    """95 % percentile bootstrap interval of the mean of per-task `values` (None for no tasks).

    A fresh `random.Random(seed)` per call keeps every interval reproducible on its own, whatever
    else was computed before it.
    """
    if not values:
        return None
    if all(type(v) is float for v in values):
        return list(_bootstrap_floats(tuple(values), resamples, seed))
    return list(_bootstrap(values, resamples, seed))


@functools.lru_cache(maxsize=256)
def _bootstrap_floats(values: tuple[float, ...], resamples: int, seed: int) -> tuple[float, float]:
    """`_bootstrap`, remembered: one summary asks for the same interval several times (the overall
    part and a lone env's part hold the same tasks), and the CLI and the report each summarize the
    run, so a run recomputed ~32 intervals of 1000 resamples where 8 differ. Floats only: equal
    keys then mean equal inputs (1 == 1.0 would otherwise share an entry)."""
    return _bootstrap(values, resamples, seed)


def _bootstrap(values: Sequence[float], resamples: int, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = (1.0 - CI_LEVEL) / 2
    return _percentile(means, alpha), _percentile(means, 1.0 - alpha)


def bucket(difficulty: dict[str, int]) -> str:
    """The difficulty bucket of a task; see the module docstring for the rule."""
    calls = difficulty.get("calls")
    if calls is None:
        return "unknown"
    if calls <= 2:
        return "easy"
    if calls <= 4:
        return "medium"
    return "hard"


# --------------------------------------------------------------------------- summary


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _tokens(records: Sequence[TrialRecord]) -> dict[str, dict[str, Any]]:
    """Usage summed per role over every record (infra failures cost tokens too)."""
    roles = list(ROLES) + sorted({r for rec in records for r in rec.usage} - set(ROLES))
    totals = {role: Usage() for role in roles}
    for rec in records:
        for role, usage in rec.usage.items():
            t = totals[role]
            t.calls += usage.calls
            t.prompt_tokens += usage.prompt_tokens
            t.completion_tokens += usage.completion_tokens
            t.cost_usd += usage.cost_usd
    return {role: u.model_dump() for role, u in totals.items()}


def _tasks(records: Sequence[TrialRecord]) -> dict[tuple[str, str], list[TrialRecord]]:
    tasks: dict[tuple[str, str], list[TrialRecord]] = {}
    for rec in records:
        tasks.setdefault((rec.env, rec.task_id), []).append(rec)
    return tasks


def _core(records: Sequence[TrialRecord], trials: int) -> dict[str, Any]:
    """The success metrics of a set of records: pass^k, mean reward, CIs, user error rate."""
    counted = [r for r in records if is_counted(r)]
    tasks = _tasks(counted)
    outcomes = [(len(rs), sum(is_success(r.reward) for r in rs)) for rs in tasks.values()]
    task_pass1 = [c / n for n, c in outcomes]
    # the same with every env failure counted as a failed trial: beside the figure that leaves them
    # out, so a run whose failures the env took cannot pass for a clean one
    with_env = _tasks([r for r in records if is_counted(r) or r.fault == Fault.ENV])
    charged = [(len(rs), sum(is_success(r.reward) for r in rs)) for rs in with_env.values()]
    task_reward = [sum(r.reward for r in rs) / len(rs) for rs in tasks.values()]
    return {
        "n_tasks": len(tasks),
        "n_trials": len(counted),
        "pass_hat_k": [pass_hat_k(outcomes, k) for k in range(1, trials + 1)],
        "pass_hat_k_env_failed": [pass_hat_k(charged, k) for k in range(1, trials + 1)],
        "pass_1_ci": bootstrap_ci(task_pass1),
        "mean_reward": _mean(task_reward),
        "mean_reward_ci": bootstrap_ci(task_reward),
        "user_error_rate": _mean([1.0 if r.user_error else 0.0 for r in counted]),
        "infra_failures": sum(1 for r in records if r.fault == Fault.INFRA),
        "env_failures": sum(1 for r in records if r.fault == Fault.ENV),
        "agent_failures": sum(1 for r in records if r.fault == Fault.AGENT),
    }


def answer_rules(records: Sequence[TrialRecord]) -> dict[str, int]:
    """How many scored records each answer rule judged ('unrecorded' for records older than it)."""
    rules = Counter((r.score.answer_rule or "unrecorded") for r in records if r.score is not None)
    return dict(sorted(rules.items()))


def describe_answer_rules(rules: dict[str, int]) -> str:
    """`exact (12 trials)`: the line the console summary and the HTML report show."""
    return (
        ", ".join(f"{rule} ({n} trial{'s' if n != 1 else ''})" for rule, n in rules.items()) or "none scored"
    )


def _part(records: Sequence[TrialRecord], trials: int) -> dict[str, Any]:
    tokens = _tokens(records)
    # A task's bucket comes from its first record, so a task never straddles two buckets.
    task_bucket: dict[tuple[str, str], str] = {}
    buckets: dict[str, list[TrialRecord]] = {b: [] for b in BUCKETS}
    for rec in records:
        name = task_bucket.setdefault((rec.env, rec.task_id), bucket(rec.difficulty))
        buckets.setdefault(name, []).append(rec)
    return {
        **_core(records, trials),
        "n_records": len(records),
        "statuses": dict(sorted(Counter(str(r.status) for r in records).items())),
        "faults": dict(sorted(Counter(str(r.fault) for r in records).items())),
        "answer_rules": answer_rules(records),
        "cost_usd": sum(t["cost_usd"] for t in tokens.values()),
        "tokens": tokens,
        "by_difficulty": {b: _core(rs, trials) for b, rs in buckets.items()},
        "tool_calls": tool_call_validity(records),
    }


def summarize(records: list[TrialRecord], trials: int) -> dict[str, Any]:
    """`{"overall": part, "envs": {env: part}}`, JSON-serialisable and deterministic.

    Each part: n_tasks, n_trials (counted), n_records, statuses, pass_hat_k (k = 1..trials; None
    where no task has k counted trials), pass_1_ci, mean_reward, mean_reward_ci, user_error_rate,
    infra_failures, env_failures, agent_failures, faults (fault -> records), answer_rules (rule ->
    scored records), cost_usd, tokens (per role), by_difficulty (bucket -> the success metrics).
    Records are deduplicated by trial_key first, so raw file order may be passed in.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    current = latest(records)
    envs = sorted({r.env for r in current})
    return {
        "overall": _part(current, trials),
        "envs": {env: _part([r for r in current if r.env == env], trials) for env in envs},
    }


# --------------------------------------------------------------------------- terminal


def fmt_rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def fmt_ci(ci: list[float] | None) -> str:
    return "" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def fmt_cost(value: float) -> str:
    return f"${value:.4f}"


SUMMARY_DROP_ORDER = ("reward 95% CI", "cost", "user err", "infra")
"""Columns the summary table leaves out, in this order, when the terminal is too narrow for them
(`--json` always has them); env names, pass^k and the env failures beside it are never cut."""
SUMMARY_COLUMN_GAP = 2
ENV_FAILED = "w/ env"
"""The suffix of the pass^k columns that count env failures as failed trials."""
ENV_FAILED_NOTE = "env fail: trials the env failed, left out of pass^k; w/ env: counted as failed"
NO_ENV_FAILED_NOTE = "env fail: trials the env failed, left out of pass^k (none in this run)"


def summary_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The summary table's headers and rows (each env, then `overall`), as text. The env failure
    count stands beside pass^k; pass^k `w/ env` (env failures counted as failed trials) only where
    a trial of the run was the env's, since otherwise it is pass^k again and would cost the
    columns an 80-column terminal has no room for (report.html and `--json` always have it)."""
    overall = summary["overall"]
    k_max = len(overall["pass_hat_k"])
    with_env = overall["env_failures"] > 0
    headers = ["env", "tasks", "trials", *(f"pass^{k}" for k in range(1, k_max + 1)), "env fail"]
    if with_env:
        headers += [f"pass^{k} {ENV_FAILED}" for k in range(1, k_max + 1)]
    headers += ["reward", "reward 95% CI", "user err", "infra", "cost"]

    def row(name: str, part: dict[str, Any]) -> list[str]:
        return [
            name,
            str(part["n_tasks"]),
            str(part["n_trials"]),
            *(fmt_rate(v) for v in part["pass_hat_k"]),
            str(part["env_failures"]),
            *(fmt_rate(v) for v in part["pass_hat_k_env_failed"] if with_env),
            fmt_rate(part["mean_reward"]),
            fmt_ci(part["mean_reward_ci"]),
            fmt_rate(part["user_error_rate"]),
            str(part["infra_failures"]),
            fmt_cost(part["cost_usd"]),
        ]

    rows = [row(env, part) for env, part in summary["envs"].items()]
    return headers, [*rows, row("overall", overall)]


def stacked(header: str) -> str:
    """A header on two lines, split at its first space (`pass^1` over `w/ env`), so its column is
    as wide as its figures rather than its words."""
    return header.replace(" ", "\n", 1)


def _table_width(widths: list[int], keep: list[int]) -> int:
    return sum(widths[i] for i in keep) + SUMMARY_COLUMN_GAP * (len(keep) - 1)


def fitting_columns(headers: list[str], rows: list[list[str]], width: int) -> tuple[list[int], bool, bool]:
    """Indices of the columns to show within `width` characters, each at its full width, whether
    the headers go on two lines (`stacked`), and whether that fits. Headers stay on one line where
    that fits with only optional columns dropped (`SUMMARY_DROP_ORDER`, in order); otherwise they
    are stacked and the columns chosen again. No cell is ever shortened."""
    keep: list[int] = []
    for two_lines in (False, True):
        shown = [stacked(h) if two_lines else h for h in headers]
        widths = [
            max(*(len(line) for line in h.splitlines()), *(len(r[i]) for r in rows))
            for i, h in enumerate(shown)
        ]
        keep = list(range(len(headers)))
        for name in SUMMARY_DROP_ORDER:
            if _table_width(widths, keep) <= width or name not in headers:
                continue
            keep.remove(headers.index(name))
        if _table_width(widths, keep) <= width:
            return keep, two_lines, True
    return keep, True, False


def _summary_table(
    title: str, headers: list[str], rows: list[list[str]], width: int
) -> tuple[Any, list[str]]:
    """The rich table of `headers` and `rows` fitted to `width`, and the headers it left out."""
    from rich import box
    from rich.table import Table

    keep, two_lines, _ = fitting_columns(headers, rows, width)
    table = Table(  # columns SUMMARY_COLUMN_GAP apart, no margin: the widths `fitting_columns` counts
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    name_width = max(len(r[0]) for r in rows)
    for i in keep:
        header = stacked(headers[i]) if two_lines else headers[i]
        if i == 0:
            table.add_column(header, no_wrap=True, min_width=name_width)
        else:
            table.add_column(header, justify="right", no_wrap=True)
    for n, cells in enumerate(rows):
        is_overall = n == len(rows) - 1
        table.add_row(
            *(cells[i] for i in keep),
            style="bold" if is_overall else None,
            end_section=n == len(rows) - 2,
        )
    return table, [h for i, h in enumerate(headers) if i not in keep]


def print_summary(summary: dict[str, Any], console: Any) -> None:
    """A table fitted to the console: one row per env and an overall row (pass^1..k, env failures,
    reward and its CI, user errors, infra failures, cost). Env names are printed whole, never cut
    to `car_r…`; a narrow console stacks the headers, then drops optional columns, saying which.
    Where pass^k `w/ env` still does not fit beside pass^k, it gets a table of its own below,
    with the env failure count beside it."""
    overall = summary["overall"]
    headers, rows = summary_rows(summary)
    tables = [("Run summary", headers, rows)]
    split = [i for i, h in enumerate(headers) if h.endswith(f" {ENV_FAILED}")]
    if split and not fitting_columns(headers, rows, console.width)[2]:
        first = [i for i in range(len(headers)) if i not in split]
        second = [0, headers.index("env fail"), *split]
        tables = [
            ("Run summary", [headers[i] for i in first], [[r[i] for i in first] for r in rows]),
            (
                "Env failures counted as failed",
                [headers[i] for i in second],
                [[r[i] for i in second] for r in rows],
            ),
        ]
    left_out: list[str] = []
    for title, table_headers, table_rows in tables:
        table, dropped = _summary_table(title, table_headers, table_rows, console.width)
        console.print(table)
        left_out += dropped
    if left_out:
        console.print(f"left out at {console.width} columns: {', '.join(left_out)} (--json has them)")
    console.print(ENV_FAILED_NOTE if overall["env_failures"] else NO_ENV_FAILED_NOTE)
    console.print(f"answers scored by: {describe_answer_rules(overall['answer_rules'])}")
    calls = overall.get("tool_calls") or {}
    if calls.get("agent_turns"):
        console.print(
            f"agent turns with a valid tool call: {calls['valid_tool_call_turns']} of "
            f"{calls['agent_turns']} ({calls['valid_share']:.0%}; {calls['tool_call_turns']} tried a call)"
        )
    if overall["pass_1_ci"] is not None:
        console.print(f"pass^1 95% CI (bootstrap over tasks): {fmt_ci(overall['pass_1_ci'])}")
