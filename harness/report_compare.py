"""Several runs on one page: pass^k per env side by side, as a table and inline SVG plots.

What a comparison is for is reading, per env, whether one agent (or one model, one prompt) beats
another: so runs are lettered A, B, … in a legend that names each run's directory, agent and
user, and every table cell and plot series carries that letter and colour. An env a run did not
evaluate is a dash, never a zero. Like the single-run report the page is self-contained and its
bytes depend only on the runs read.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .metrics import fmt_ci, fmt_rate, read_run, summarize
from .records import RunManifest
from .report import PALETTE, _date, _e, grouped_bars, page, pass_k_lines

COMPARE_FILE = "compare.html"


@dataclass(frozen=True)
class ComparedRun:
    """One run of a comparison: where it was read from, its manifest and its summary."""

    label: str
    path: str
    manifest: RunManifest
    summary: dict[str, Any]

    @property
    def color(self) -> str:
        return PALETTE[string.ascii_uppercase.index(self.label[0]) % len(PALETTE)]

    def part(self, env: str) -> dict[str, Any] | None:
        envs: dict[str, dict[str, Any]] = self.summary["envs"]
        overall: dict[str, Any] = self.summary["overall"]
        return overall if env == "overall" else envs.get(env)


def _label(i: int) -> str:
    letters = string.ascii_uppercase
    return letters[i % 26] + (str(i // 26) if i >= 26 else "")


def read_runs(run_dirs: Sequence[Path | str]) -> list[ComparedRun]:
    """Each run's manifest and summary (`RunReadError` names the first run that cannot be read)."""
    out = []
    for i, d in enumerate(run_dirs):
        manifest, records = read_run(d)
        out.append(ComparedRun(_label(i), str(d), manifest, summarize(records, manifest.trials)))
    return out


def env_names(runs: Sequence[ComparedRun]) -> list[str]:
    """Every env any run evaluated, sorted, then `overall`."""
    return [*sorted({env for r in runs for env in r.summary["envs"]}), "overall"]


def _pass(run: ComparedRun, env: str, k: int) -> float | None:
    part = run.part(env)
    if part is None or k > len(part["pass_hat_k"]):
        return None
    value: float | None = part["pass_hat_k"][k - 1]
    return value


def runs_table(runs: Sequence[ComparedRun]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "run",
            "directory",
            "agent",
            "user",
            "date",
            "trials/task",
            "counted",
            "infra fail",
            "env fail",
        )
    )
    rows = []
    for r in runs:
        o = r.summary["overall"]
        cells = [
            r.path,
            r.manifest.agent,
            r.manifest.user,
            _date(r.manifest.created_at),
            r.manifest.trials,
            o["n_trials"],
            o["infra_failures"],
            o["env_failures"],
        ]
        rows.append(
            f'<tr><td><span class="swatch" style="background:{r.color}"></span><b>{_e(r.label)}</b></td>'
            + "".join(f"<td>{_e(c)}</td>" for c in cells)
            + "</tr>"
        )
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def pass_table(runs: Sequence[ComparedRun]) -> str:
    """Rows: envs; column groups: pass^1 … pass^k, then mean reward; within a group, one column
    per run, so the runs' figures for an env and a k sit next to each other."""
    k_max = max(r.manifest.trials for r in runs)
    groups = [*(f"pass^{k}" for k in range(1, k_max + 1)), "mean reward", "pass^1 95% CI"]
    top = '<th rowspan="2">env</th>' + "".join(f'<th colspan="{len(runs)}">{_e(g)}</th>' for g in groups)
    sub = "".join(f'<th class="run" style="color:{r.color}">{_e(r.label)}</th>' for _ in groups for r in runs)
    rows = []
    for env in env_names(runs):
        cells = []
        for k in range(1, k_max + 1):
            values = [_pass(r, env, k) for r in runs]
            best = max((v for v in values if v is not None), default=None)
            for v in values:
                cls = ' class="best"' if v is not None and v == best and len(runs) > 1 else ""
                cells.append(f"<td{cls}>{_e(fmt_rate(v) if v is not None else '–')}</td>")
        for r in runs:
            part = r.part(env)
            cells.append(f"<td>{_e(fmt_rate(part['mean_reward']) if part else '–')}</td>")
        for r in runs:
            part = r.part(env)
            ci = part["pass_1_ci"] if part else None
            cells.append(f'<td class="ci">{_e(fmt_ci(ci) if ci else "–")}</td>')
        cls = ' class="total"' if env == "overall" else ""
        rows.append(f"<tr{cls}><td>{_e(env)}</td>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table class="summary compare"><thead><tr>{top}</tr><tr>{sub}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def compare_plots(runs: Sequence[ComparedRun]) -> str:
    envs = env_names(runs)
    names = [f"{r.label}" for r in runs]
    plots = [
        grouped_bars(
            "pass^1 by env and run (95% CI)",
            envs,
            [
                (
                    name,
                    r.color,
                    [_pass(r, env, 1) for env in envs],
                    [(p["pass_1_ci"] if (p := r.part(env)) else None) for env in envs],
                )
                for name, r in zip(names, runs, strict=True)
            ],
            y_max=1.0,
        )
    ]
    k_common = min(r.manifest.trials for r in runs)
    if k_common > 1:
        plots.append(
            grouped_bars(
                f"pass^{k_common} by env and run",
                envs,
                [
                    (name, r.color, [_pass(r, env, k_common) for env in envs], None)
                    for name, r in zip(names, runs, strict=True)
                ],
                y_max=1.0,
            )
        )
    plots.append(
        pass_k_lines(
            "pass^k overall, by run",
            [
                (name, r.color, r.summary["overall"]["pass_hat_k"], False)
                for name, r in zip(names, runs, strict=True)
            ],
        )
    )
    return "".join(plots)


def render_comparison(runs: Sequence[ComparedRun]) -> str:
    """The comparison page as a string (pure: same runs, same bytes)."""
    body = (
        f"<h2>Runs</h2>{runs_table(runs)}"
        f"<h2>pass^k per env</h2>{pass_table(runs)}"
        '<p class="muted">Only trials that measure the agent are counted: infra and env failures are '
        "left out (their numbers per run are above). A dash: the run has no such env or k. "
        "Bold: the best run for that env and k.</p>"
        f'<h2>Plots</h2><div class="plots">{compare_plots(runs)}</div>'
    )
    return page(f"envforge: {len(runs)} runs compared", body)


def write_comparison(run_dirs: Sequence[Path | str], out: Path | str) -> Path:
    """Read every run and write the comparison page to `out`; returns its path."""
    out = Path(out)
    out.write_text(render_comparison(read_runs(run_dirs)), encoding="utf-8")
    return out
