"""The run report: one self-contained HTML file with the summary, plots and every trajectory.

Self-contained on purpose: a report is attached to tickets, mailed and opened on machines without
network access, so it holds inline CSS, SVG drawn here and a few lines of vanilla JS for filtering;
nothing is fetched. Every piece of text from a run passes through `html.escape` (agents and users
write `<script>` too), and the output depends only on the run dir, so re-rendering gives the same
bytes.

The page opens on something worth seeing: the first failed trial is expanded (else the first left
out of pass^k, else the first), a plot is drawn only when it compares something, and every trial
says how its conversation ended and, when the user ended it, in the user's own words.
"""

from __future__ import annotations

import functools
import html
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envforge.synth import Task

from .metrics import (
    BUCKET_RULE,
    ENV_FAILED,
    describe_answer_rules,
    fmt_ci,
    fmt_cost,
    fmt_rate,
    is_success,
    read_run,
    summarize,
)
from .records import Message, RunManifest, TrialRecord
from .report_task import RunTasks, ending, failed_parts, load_run_tasks, task_panel
from .vocab import Termination

REPORT_FILE = "report.html"
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(x: float) -> str:
    """SVG coordinates with fixed precision, so output is byte-stable."""
    return f"{x:.1f}"


def _compact(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.3g}k"
    if abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def _nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^n at or above `value`: a round top for an auto-scaled axis."""
    if value <= 0:
        return 1.0
    exp: float = 10 ** math.floor(math.log10(value))  # an int from 1 up, as before
    for step in (1, 2, 5, 10):
        if step * exp >= value * (1 - 1e-9):
            return step * exp
    return 10 * exp


# --------------------------------------------------------------------------- plots


def _legend(items: Sequence[tuple[str, str, bool]], x: float, y: float) -> str:
    out = []
    for i, (name, color, dashed) in enumerate(items):
        yy = y + i * 16
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(
            f'<line x1="{_num(x)}" y1="{_num(yy)}" x2="{_num(x + 18)}" y2="{_num(yy)}" stroke="{color}" '
            f'stroke-width="3"{dash}/><text x="{_num(x + 24)}" y="{_num(yy + 4)}">{_e(name)}</text>'
        )
    return "".join(out)


def _frame(title: str, width: int, height: int, body: str) -> str:
    return (
        f'<figure class="plot"><figcaption>{_e(title)}</figcaption>'
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">{body}</svg></figure>'
    )


def _y_axis(left: float, top: float, plot_w: float, plot_h: float, y_max: float, fmt: Any) -> str:
    out = []
    for i in range(5):
        v = y_max * i / 4
        y = top + plot_h - plot_h * i / 4
        out.append(
            f'<line class="grid" x1="{_num(left)}" y1="{_num(y)}" x2="{_num(left + plot_w)}" y2="{_num(y)}"/>'
            f'<text class="tick" x="{_num(left - 6)}" y="{_num(y + 4)}" text-anchor="end">{_e(fmt(v))}</text>'
        )
    return "".join(out)


LineSeries = tuple[str, str, Sequence[float | None], bool]
"""(name, colour, value per k from 1, dashed) of a pass^k plot."""


def pass_k_lines(title: str, series: Sequence[LineSeries]) -> str:
    """pass^k against k, one line per series (envs of a run, or runs compared)."""
    width, height, left, top, right, bottom = 560, 300, 48, 16, 150, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    k_max = max((len(values) for _, _, values, _ in series), default=1)

    def x_of(k: int) -> float:
        return left + (plot_w / 2 if k_max == 1 else plot_w * (k - 1) / (k_max - 1))

    def y_of(v: float) -> float:
        return top + plot_h * (1 - v)

    body = [_y_axis(left, top, plot_w, plot_h, 1.0, lambda v: f"{v:.2f}")]
    for k in range(1, k_max + 1):
        body.append(
            f'<text class="tick" x="{_num(x_of(k))}" y="{_num(top + plot_h + 16)}" '
            f'text-anchor="middle">{k}</text>'
        )
    body.append(
        f'<text class="tick" x="{_num(left + plot_w / 2)}" y="{height - 4}" text-anchor="middle">k</text>'
    )
    for name, color, values, dashed in series:
        points = [(x_of(k), y_of(v)) for k, v in enumerate(values, start=1) if v is not None]
        if len(points) > 1:
            dash = ' stroke-dasharray="5 3"' if dashed else ""
            path = " ".join(f"{_num(x)},{_num(y)}" for x, y in points)
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{path}"/>')
        for k, v in enumerate(values, start=1):
            if v is not None:
                body.append(
                    f'<circle cx="{_num(x_of(k))}" cy="{_num(y_of(v))}" r="3.5" fill="{color}">'
                    f"<title>{_e(name)} pass^{k} = {v:.3f}</title></circle>"
                )
    body.append(_legend([(n, c, d) for n, c, _, d in series], left + plot_w + 16, top + 8))
    return _frame(title, width, height, "".join(body))


def pass_k_plot(summary: dict[str, Any]) -> str:
    """pass^k against k, one line per env and a dashed overall line."""
    series: list[LineSeries] = [
        (env, PALETTE[i % len(PALETTE)], p["pass_hat_k"], False)
        for i, (env, p) in enumerate(summary["envs"].items())
    ]
    series.append(("overall", "#222", summary["overall"]["pass_hat_k"], True))
    return pass_k_lines("pass^k by env", series)


Series = tuple[str, str, Sequence[float | None], Sequence[list[float] | None] | None]


def grouped_bars(
    title: str,
    categories: Sequence[str],
    series: Sequence[Series],
    y_max: float | None = None,
    fmt: Any = None,
) -> str:
    """Bars per category and series, with CI whiskers where a series has intervals.

    `y_max` None auto-scales to a round number (costs and tokens); rates pass 1.0.
    """
    fmt = fmt or (lambda v: f"{v:.2f}")
    group_w = 96 if len(series) > 1 else 64
    left, top, bottom, right = 60, 16, 48, 130
    plot_w = max(group_w * max(len(categories), 1), 200)
    plot_h = 200
    width, height = left + plot_w + right, top + plot_h + bottom
    if y_max is None:
        tops = [
            max([v or 0.0] + ([ci[1]] if cis and (ci := cis[i]) else []))
            for _, _, values, cis in series
            for i, v in enumerate(values)
        ]
        y_max = _nice_max(max(tops, default=0.0))
    body = [_y_axis(left, top, plot_w, plot_h, y_max, fmt)]
    slot = plot_w / max(len(categories), 1)
    bar_w = min(28.0, (slot - 16) / max(len(series), 1))

    def y_of(v: float) -> float:
        return top + plot_h * (1 - min(max(v / y_max, 0.0), 1.0))

    for ci_idx, cat in enumerate(categories):
        x0 = left + slot * ci_idx + (slot - bar_w * len(series)) / 2
        body.append(
            f'<text class="tick" x="{_num(left + slot * (ci_idx + 0.5))}" y="{_num(top + plot_h + 16)}" '
            f'text-anchor="middle">{_e(cat)}</text>'
        )
        for s_idx, (name, color, values, cis) in enumerate(series):
            v = values[ci_idx]
            x = x0 + bar_w * s_idx
            if v is None:
                body.append(
                    f'<text class="tick" x="{_num(x + bar_w / 2)}" y="{_num(top + plot_h - 4)}" '
                    f'text-anchor="middle">–</text>'
                )
                continue
            ci = cis[ci_idx] if cis else None
            tip = f"{cat} {name}: {fmt(v)}" + (f" (95% CI {fmt(ci[0])}–{fmt(ci[1])})" if ci else "")
            body.append(
                f'<rect x="{_num(x + 1)}" y="{_num(y_of(v))}" width="{_num(bar_w - 2)}" '
                f'height="{_num(top + plot_h - y_of(v))}" fill="{color}"><title>{_e(tip)}</title></rect>'
            )
            if ci:
                cx, y_lo, y_hi = x + bar_w / 2, y_of(ci[0]), y_of(ci[1])
                body.append(
                    f'<path class="whisker" d="M{_num(cx)},{_num(y_lo)}V{_num(y_hi)}'
                    f"M{_num(cx - 5)},{_num(y_lo)}H{_num(cx + 5)}"
                    f'M{_num(cx - 5)},{_num(y_hi)}H{_num(cx + 5)}"/>'
                )
    body.append(
        f'<line class="axis" x1="{left}" y1="{_num(top + plot_h)}" '
        f'x2="{_num(left + plot_w)}" y2="{_num(top + plot_h)}"/>'
    )
    legend = []
    for i, (name, color, _, _) in enumerate(series):
        y = top + 8 + i * 16
        legend.append(
            f'<rect x="{_num(left + plot_w + 16)}" y="{_num(y - 6)}" width="12" height="12" fill="{color}"/>'
            f'<text x="{_num(left + plot_w + 34)}" y="{_num(y + 4)}">{_e(name)}</text>'
        )
    body.extend(legend)
    return _frame(title, int(width), int(height), "".join(body))


def _rate_series(parts: Sequence[dict[str, Any]]) -> list[Series]:
    return [
        ("pass^1", PALETTE[0], [p["pass_hat_k"][0] for p in parts], [p["pass_1_ci"] for p in parts]),
        ("mean reward", PALETTE[1], [p["mean_reward"] for p in parts], [p["mean_reward_ci"] for p in parts]),
    ]


def plots(summary: dict[str, Any]) -> str:
    """The run's plots, each only when it has something to compare: pass^k over more than one k,
    rewards over more than one env or difficulty bucket, tokens or cost a model spent. A run of
    one trial per task on one env draws none ("" : the page leaves the section out)."""
    overall = summary["overall"]
    env_names = [*summary["envs"], "overall"]
    env_parts = [*summary["envs"].values(), overall]
    buckets = [b for b, p in overall["by_difficulty"].items() if p["n_tasks"]]
    bucket_parts = [overall["by_difficulty"][b] for b in buckets]
    roles = list(overall["tokens"])
    tok = overall["tokens"]
    out = []
    if len(overall["pass_hat_k"]) > 1:
        out.append(pass_k_plot(summary))
    if len(summary["envs"]) > 1:
        out.append(grouped_bars("Reward by env (95% CI)", env_names, _rate_series(env_parts), y_max=1.0))
    if len(buckets) > 1:
        out.append(
            grouped_bars("Reward by difficulty (95% CI)", buckets, _rate_series(bucket_parts), y_max=1.0)
        )
    # built-in agents and scripted users call no model: empty token and cost axes say nothing
    if any(tok[r]["prompt_tokens"] or tok[r]["completion_tokens"] for r in roles):
        out.append(
            grouped_bars(
                "Tokens per role",
                roles,
                [
                    ("prompt", PALETTE[0], [tok[r]["prompt_tokens"] for r in roles], None),
                    ("completion", PALETTE[1], [tok[r]["completion_tokens"] for r in roles], None),
                ],
                fmt=_compact,
            )
        )
    if any(tok[r]["cost_usd"] for r in roles):
        out.append(
            grouped_bars(
                "Cost per role (USD)",
                roles,
                [("cost", PALETTE[2], [tok[r]["cost_usd"] for r in roles], None)],
                fmt=lambda v: "$" + _compact(v),
            )
        )
    return "".join(out)


# --------------------------------------------------------------------------- tables


def _date(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _tool_call_line(summary: dict[str, Any] | None) -> str | None:
    """The share of the agent model's turns with a valid tool call (harness/tool_use.py)."""
    calls = (summary or {}).get("overall", {}).get("tool_calls") or {}
    if not calls.get("agent_turns"):
        return None
    return (
        f"{calls['valid_tool_call_turns']} of {calls['agent_turns']} turns made a valid call "
        f"({calls['valid_share']:.0%})"
    )


def header(manifest: RunManifest, summary: dict[str, Any] | None = None) -> str:
    rows: list[tuple[str, Any]] = [
        ("run", manifest.run_id),
        ("date", _date(manifest.created_at)),
        ("agent", manifest.agent + (f"  @ {manifest.agent_api_base}" if manifest.agent_api_base else "")),
        ("agent temperature", manifest.agent_temperature),
        ("user", manifest.user + (f"  @ {manifest.user_api_base}" if manifest.user_api_base else "")),
        ("user temperature", manifest.user_temperature),
        ("judge", manifest.judge),
        ("answers", manifest.answers),
        (
            "answer rule",
            describe_answer_rules(summary["overall"]["answer_rules"]) if summary is not None else None,
        ),
        ("agent tool calls", _tool_call_line(summary)),
        ("trials per task", manifest.trials),
        ("envs", ", ".join(f"{e} ({len(manifest.task_ids.get(e, []))} tasks)" for e in manifest.envs)),
        ("concurrency", manifest.concurrency),
        ("seed", manifest.seed),
        ("limits", ", ".join(f"{k}={v:g}" for k, v in sorted(manifest.limits.items()))),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(manifest.versions.items()))),
    ]
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows if v not in (None, ""))
    return f'<table class="manifest">{cells}</table>'


def summary_table(summary: dict[str, Any]) -> str:
    k_max = len(summary["overall"]["pass_hat_k"])
    head = ["env", "tasks", "trials", *(f"pass^{k}" for k in range(1, k_max + 1)), "env fail"]
    head += [f"pass^{k} {ENV_FAILED}" for k in range(1, k_max + 1)]
    head += ["pass^1 95% CI", "mean reward", "95% CI", "user err", "infra fail", "tokens", "cost"]

    def row(name: str, p: dict[str, Any], cls: str = "") -> str:
        cells = [name, p["n_tasks"], p["n_trials"], *(fmt_rate(v) for v in p["pass_hat_k"])]
        cells += [p["env_failures"], *(fmt_rate(v) for v in p["pass_hat_k_env_failed"])]
        cells += [fmt_ci(p["pass_1_ci"]), fmt_rate(p["mean_reward"]), fmt_ci(p["mean_reward_ci"])]
        cells += [fmt_rate(p["user_error_rate"]), p["infra_failures"]]
        if "tokens" in p:  # difficulty buckets carry success metrics only
            tokens = sum(t["prompt_tokens"] + t["completion_tokens"] for t in p["tokens"].values())
            cells += [_compact(tokens), fmt_cost(p["cost_usd"])]
        else:
            cells += ["", ""]
        return f'<tr class="{cls}">' + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"

    rows = [row(env, p) for env, p in summary["envs"].items()]
    rows.append(row("overall", summary["overall"], "total"))
    by_diff = [
        row(b, p, "bucket")
        for b, p in summary["overall"]["by_difficulty"].items()
        if p["n_tasks"] or b != "unknown"
    ]
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (
        f'<div class="scroll"><table class="summary"><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody>"
        f'<tbody><tr class="sep"><td colspan="{len(head)}">'
        f"by difficulty ({_e(BUCKET_RULE)}), all envs</td></tr>"
        f"{''.join(by_diff)}</tbody></table></div>"
    )


# --------------------------------------------------------------------------- trajectories


@functools.lru_cache(maxsize=2048)  # texts of a few kB: a few MB at most
def _pretty(text: str) -> str:
    """Pretty-print JSON tool results (most are JSON); anything else unchanged.

    Remembered per text: every trial of a task gets the same tool results back, and `indent=2`
    takes json's pure-Python encoder (the report's largest cost, ~0.5 ms a trial)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    if not isinstance(value, dict | list):
        return text
    return json.dumps(value, indent=2, ensure_ascii=False)


def message_html(msg: Message) -> str:
    cls = f"msg {msg.role}" + (" error" if msg.is_error else "")
    label = msg.role + (" (error)" if msg.is_error else "")
    if msg.role == "user" and msg.tool_calls:  # dual control: the user acting on their own device
        label = "user (own tool)"
    if msg.tool_call_id:
        label += f" ← {msg.tool_call_id}"
    parts = []
    if msg.content:
        content = _pretty(msg.content) if msg.role == "tool" else msg.content
        parts.append(f'<pre class="content">{_e(content)}</pre>')
    for call in msg.tool_calls:
        args = json.dumps(call.arguments, indent=2, ensure_ascii=False)
        parts.append(
            f'<div class="call"><span class="fn">{_e(call.name)}</span> '
            f'<span class="cid">{_e(call.id)}</span>'
            f"<pre>{_e(args)}</pre></div>"
        )
    body = "".join(parts) or '<span class="muted">(empty)</span>'
    if msg.role == "system":
        return f'<details class="{cls}"><summary>system prompt</summary>{body}</details>'
    turn = f'<span class="turn">turn {msg.turn}</span>'
    return f'<div class="{cls}"><div class="role">{_e(label)} {turn}</div>{body}</div>'


def score_html(rec: TrialRecord, task: Task | None = None) -> str:
    s = rec.score
    if s is None:
        return '<p class="muted">not scored</p>'
    none_required = task is not None and not task.required_outputs
    rows: list[tuple[str, Any]] = [
        ("reward", f"{s.reward:.3f}"),
        ("basis", " × ".join(s.basis)),
        ("state match", "yes" if s.state_match else "no"),
        (
            "outputs",
            "none required"
            if none_required
            else f"{s.outputs:.2f}"
            + (f" ({s.answer_rule} rule)" if s.answer_rule else "")
            + (f" — missing: {', '.join(s.outputs_missing)}" if s.outputs_missing else ""),
        ),
        ("checkpoints", f"{s.checkpoints_passed}/{s.checkpoints_total} ({s.checkpoints:.2f})"),
    ]
    rows += [(f"part: {name}", f"{value:.3f}") for name, value in rec.parts.items()]
    if rec.not_judged:
        rows.append(("not judged", ", ".join(rec.not_judged)))
    return (
        '<table class="score">'
        + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def trial_outcome(rec: TrialRecord) -> str:
    """`pass`, `fail`, or `excluded` for a trial left out of pass^k (infra and env failures)."""
    if not rec.counted:
        return "excluded"
    return "pass" if is_success(rec.reward) else "fail"


def trial_html(rec: TrialRecord, tasks: RunTasks, *, opened: bool = False) -> str:
    """One trial: a summary line, and the task beside the conversation (shown when `opened`)."""
    outcome = trial_outcome(rec)
    task, _ = tasks.lookup(rec.env, rec.task_id)
    usage = ", ".join(
        f"{role}: {u.calls} calls, {u.prompt_tokens}+{u.completion_tokens} tok, {fmt_cost(u.cost_usd)}"
        for role, u in sorted(rec.usage.items())
    )
    meta: list[tuple[str, Any]] = [
        ("trial key", rec.trial_key),
        ("termination", rec.termination),
        ("error", rec.error),
        ("user error", rec.user_error_reason if rec.user_error else None),
        ("difficulty", ", ".join(f"{k}={v}" for k, v in rec.difficulty.items())),
        ("duration", f"{rec.duration_s:.1f}s"),
        ("usage", usage),
        ("seed", rec.seed),
        ("final state", rec.final_state_hash),
    ]
    meta_rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in meta if v not in (None, ""))
    failed = failed_parts(rec) if outcome == "fail" else []
    search = f"{rec.env} {rec.task_id} {rec.status} {rec.termination} {' '.join(failed)}".lower()
    badges = '<span class="badge ue">user error</span>' if rec.user_error else ""
    if failed:
        badges += f'<span class="badge why">failed: {_e(", ".join(failed))}</span>'
    if rec.termination not in QUIET_ENDINGS and str(rec.termination) != str(rec.status):  # said once
        badges += f'<span class="badge end">{_e(rec.termination)}</span>'
    if outcome == "excluded":
        reward = '<span class="c-reward excluded">–</span>'
        badges += f'<span class="badge excl">{_e(rec.fault)} failure · not counted</span>'
    else:
        reward = f'<span class="c-reward {outcome}">{rec.reward:.2f}</span>'
    return (
        f'<details class="trial {outcome}" data-env="{_e(rec.env)}" data-status="{_e(rec.status)}" '
        f'data-outcome="{outcome}" data-ue="{int(rec.user_error)}" data-search="{_e(search)}"'
        f"{' open' if opened else ''}>"
        f'<summary><span class="c-env">{_e(rec.env)}</span><span class="c-task">{_e(rec.task_id)}</span>'
        f'<span class="c-trial">#{rec.trial}</span>{reward}'
        f'<span class="c-status st-{_e(rec.status)}">{_e(rec.status)}</span>{badges}</summary>'
        f'<div class="trial-body"><div class="side">{task_panel(rec, tasks)}'
        f'<details class="meta"><summary>trial details and score record</summary>'
        f'<table class="meta">{meta_rows}</table>{score_html(rec, task)}</details></div>'
        f'<div class="convo"><h4>conversation</h4>{"".join(message_html(m) for m in rec.messages)}'
        f'<p class="ending"><b>ended:</b> {_e(ending(rec))}</p></div>'
        "</div></details>"
    )


QUIET_ENDINGS = frozenset({Termination.USER_STOP, Termination.AGENT_STOP})
"""Endings a trial's summary line leaves unsaid (how a conversation ends when nothing went wrong);
every other one gets a badge, and every trial says how it ended below its conversation."""


def opened_trial(records: Sequence[TrialRecord]) -> int | None:
    """The trial the page opens on: the first failed one, else the first left out of pass^k, else
    the first (a run where everything passed shows what passing looked like)."""
    outcomes = [trial_outcome(r) for r in records]
    for wanted in ("fail", "excluded"):
        if wanted in outcomes:
            return outcomes.index(wanted)
    return 0 if records else None


def viewer(records: Sequence[TrialRecord], tasks: RunTasks) -> str:
    envs = sorted({r.env for r in records})
    statuses = sorted({r.status for r in records})
    env_opts = "".join(f'<option value="{_e(e)}">{_e(e)}</option>' for e in envs)
    st_opts = "".join(f'<option value="{_e(s)}">{_e(s)}</option>' for s in statuses)
    controls = (
        '<div class="filters"><input id="f-q" type="search" placeholder="filter by task, env, status…">'
        f'<select id="f-env"><option value="">all envs</option>{env_opts}</select>'
        f'<select id="f-status"><option value="">all statuses</option>{st_opts}</select>'
        '<select id="f-outcome"><option value="">pass and fail</option><option value="pass">pass</option>'
        '<option value="fail">fail</option>'
        '<option value="excluded">not counted (infra, env)</option></select>'
        '<label><input id="f-ue" type="checkbox"> user errors only</label>'
        f'<span id="f-count">{len(records)} of {len(records)} trials</span></div>'
    )
    first = opened_trial(records)
    shown = "".join(trial_html(r, tasks, opened=i == first) for i, r in enumerate(records))
    return controls + f'<div id="trials">{shown}</div>'


# --------------------------------------------------------------------------- page

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 12px}h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #ddd}
h4{margin:10px 0 4px}
table{border-collapse:collapse;background:#fff}
th,td{padding:3px 10px;border:1px solid #e3e3e3;text-align:left}
table.manifest th{background:#f3f3f3;font-weight:600}
table.summary td{white-space:nowrap}
table.summary td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}
table.summary thead th{background:#f3f3f3}tr.total td{font-weight:700;background:#f6f6f6}
tr.sep td{background:#f3f3f3;color:#555;font-style:italic}tr.bucket td:first-child{padding-left:20px}
.plots{display:flex;flex-wrap:wrap;gap:16px}
figure.plot{margin:0;background:#fff;border:1px solid #e3e3e3;padding:8px}
figcaption{font-weight:600;margin-bottom:4px}svg text{font-size:11px;fill:#333}.tick{fill:#666}
.grid{stroke:#eee}.axis{stroke:#999}.whisker{stroke:#222;stroke-width:1.5;fill:none}
.filters{display:flex;gap:10px;align-items:center;flex-wrap:wrap;margin:8px 0 12px}
.filters input[type=search]{width:260px;padding:4px}#f-count{color:#666}
details.trial{background:#fff;border:1px solid #e3e3e3;margin:3px 0;border-left:4px solid #e15759}
details.trial.pass{border-left-color:#59a14f}
details.trial>summary{cursor:pointer;padding:4px 8px;display:flex;gap:14px;align-items:center}
.c-env{width:140px;color:#555}.c-task{width:260px;font-family:ui-monospace,monospace}.c-trial{width:36px}
.c-reward{width:50px;font-weight:700;text-align:right}.c-reward.pass{color:#2e7d32}.c-reward.fail{color:#c62828}
.c-status{font-size:12px;padding:1px 6px;border-radius:8px;background:#eee}
.st-infra_failure,.st-env_failure{background:#e0e0e0;color:#444}.st-completed{background:#e3f1e3}
.badge{font-size:12px;padding:1px 6px;border-radius:8px}.badge.ue{background:#fff1c2}
.badge.why{background:#fde2e1;color:#8e1b1b}.badge.end{background:#e8eaf6;color:#283593}
p.ending{margin:8px 0 0;padding:6px 10px;background:#f3f3f3;border-left:3px solid #9e9e9e}
.badge.excl{background:#e0e0e0;color:#444}
details.trial.excluded{border-left-color:#9e9e9e;background:#f4f4f4}
details.trial.excluded>summary{color:#666}.c-reward.excluded{color:#888}
.trial-body{display:grid;grid-template-columns:minmax(0,5fr) minmax(0,6fr);gap:16px;
  padding:8px 12px;border-top:1px solid #eee}
.side{font-size:13px;min-width:0}.side table{width:100%}.side th{background:#f7f7f7}
.side h4:first-child{margin-top:0}
blockquote.instruction{white-space:pre-wrap;margin:0;padding:6px 10px;background:#eef4fb;
  border-left:3px solid #4e79a7}
p.told{margin:4px 0}
ol.golden{margin:0;padding-left:22px}ol.golden li{margin:2px 0;overflow-wrap:anywhere}
ol.golden code,p.told code{font:12px ui-monospace,Menlo,monospace;margin-left:6px;color:#444}
.by-user{font-size:11px;background:#eef4fb;border-radius:3px;padding:0 4px;color:#345}
table.parts th{width:130px;white-space:nowrap}table.parts td.v{width:40px;text-align:right}
table.parts tr.bad th,table.parts tr.bad td{color:#b71c1c;background:#fdecea}
table.parts tr.good td.v{color:#2e7d32}
table.diff{table-layout:fixed;font:12px/1.35 ui-monospace,Menlo,monospace}
table.diff td{overflow-wrap:break-word;vertical-align:top;white-space:pre-wrap}
table.diff th:nth-child(1){width:24%}table.diff th:nth-child(2){width:18%}
table.diff tr.d-table th{background:#f3f3f3;font-weight:600;text-align:left}
td.d-x{background:#eef7ee}td.d-a{background:#fdecea}
p.excluded-note{background:#eee;border-left:3px solid #9e9e9e;padding:6px 10px;margin:0 0 8px;color:#444}
details.meta{margin-top:10px}details.meta>summary{cursor:pointer;color:#555}
.convo{min-width:0}.convo h4{margin-top:0}
.swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}
.scroll{overflow-x:auto;max-width:100%}
table.compare thead th{text-align:center}table.compare td.best{font-weight:700}
table.compare td.ci{color:#666;font-size:12px}table.runs td{overflow-wrap:anywhere}
@media (max-width:900px){.trial-body{grid-template-columns:minmax(0,1fr)}}
.msg{margin:6px 0;padding:6px 10px;border-radius:6px;border:1px solid #e6e6e6}
.msg .role{font-size:12px;font-weight:600;color:#555;margin-bottom:2px}.turn{font-weight:400;color:#999}
.msg.user{background:#eef4fb}.msg.assistant{background:#fff}.msg.tool{background:#f6f6f2;font-size:12.5px}
.msg.system{background:#f3f3f3;color:#555}.msg.error{background:#fdecea;border-color:#e15759}
.msg.error .role{color:#c62828}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;font:12.5px/1.4 ui-monospace,Menlo,monospace}
.msg.user pre.content,.msg.assistant pre.content{font:14px/1.45 system-ui,sans-serif}
.call{border-left:3px solid #4e79a7;padding-left:8px;margin:4px 0}
.fn{font-weight:700;font-family:ui-monospace,monospace}
.cid{color:#999;font-size:11px}.muted{color:#999}
"""

JS = """
(function(){
  var q=document.getElementById('f-q'),env=document.getElementById('f-env'),
      st=document.getElementById('f-status'),
      oc=document.getElementById('f-outcome'),ue=document.getElementById('f-ue'),
      count=document.getElementById('f-count'),rows=document.querySelectorAll('details.trial');
  function apply(){
    var text=q.value.toLowerCase(),shown=0;
    rows.forEach(function(r){
      var d=r.dataset,ok=(!env.value||d.env===env.value)&&(!st.value||d.status===st.value)&&
        (!oc.value||d.outcome===oc.value)&&(!ue.checked||d.ue==='1')&&(!text||d.search.indexOf(text)>=0);
      r.style.display=ok?'':'none';if(ok)shown++;
    });
    count.textContent=shown+' of '+rows.length+' trials';
  }
  [q,env,st,oc,ue].forEach(function(el){el.addEventListener('input',apply);el.addEventListener('change',apply);});
})();
"""


def page(title: str, body: str, script: str = "") -> str:
    """A whole self-contained page: inline CSS, the body, an optional inline script."""
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style></head><body><main>"
        f"<h1>{_e(title)}</h1>{body}</main>"
        + (f"<script>{script}</script>" if script else "")
        + "</body></html>\n"
    )


def render_report(
    manifest: RunManifest,
    records: Sequence[TrialRecord],
    summary: dict[str, Any],
    tasks: RunTasks | None = None,
) -> str:
    """The whole page as a string (pure: same inputs, same bytes).

    `tasks` are the run's tasks (`load_run_tasks`), shown beside each trajectory; without them
    each trial says its task is not available.
    """
    tasks = tasks if tasks is not None else RunTasks()
    body = (
        f"{header(manifest, summary)}"
        f"<h2>Summary</h2>{summary_table(summary)}"
        f'<p class="muted">pass^k and mean reward count only trials that measure the agent: '
        f"{summary['overall']['infra_failures']} infra and {summary['overall']['env_failures']} env "
        f"failure(s) are left out (grey below); pass^k {ENV_FAILED} counts the env failures as "
        "failed trials.</p>"
        + (f'<h2>Plots</h2><div class="plots">{drawn}</div>' if (drawn := plots(summary)) else "")
        + f"<h2>Trajectories</h2>{viewer(records, tasks)}"
    )
    return page(f"envforge run {manifest.run_id}", body, JS)


def write_report(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """Render the run's report (to `run_dir/report.html` unless `out` says where); returns its path.

    The tasks shown beside each trajectory are read from the env folders the manifest names.
    """
    run_dir = Path(run_dir)
    manifest, records = read_run(run_dir)
    summary = summarize(records, manifest.trials)
    tasks = load_run_tasks(manifest)
    path = Path(out) if out is not None else run_dir / REPORT_FILE
    path.write_text(render_report(manifest, records, summary, tasks), encoding="utf-8")
    return path
