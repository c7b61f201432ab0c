"""Training plots from metrics.jsonl: matplotlib PNGs when it is installed, else self-made SVG line charts.

The SVG path exists so a run on a bare machine still leaves something to look at without adding a
plotting dependency to the `train` extra.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

Series = dict[str, list[tuple[float, float]]]
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def svg_line_chart(title: str, series: Series, *, width: int = 640, height: int = 320) -> str:
    pad_l, pad_r, pad_t, pad_b = 50, 120, 30, 30
    pts = [p for s in series.values() for p in s]
    if not pts:
        pts = [(0.0, 0.0)]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(p[1] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return pad_t + h - (y - y0) / (y1 - y0) * h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{pad_l}" y="18" font-size="14">{escape(title)}</text>',
        f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="black"/>',
        f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="black"/>',
        f'<text x="4" y="{pad_t + 10}" font-size="11">{y1:.3g}</text>',
        f'<text x="4" y="{pad_t + h}" font-size="11">{y0:.3g}</text>',
        f'<text x="{pad_l}" y="{height - 8}" font-size="11">step {x0:.0f}</text>',
        f'<text x="{pad_l + w - 40}" y="{height - 8}" font-size="11">{x1:.0f}</text>',
    ]
    for i, (name, s) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        if s:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        ly = pad_t + 14 * i + 10
        parts.append(f'<rect x="{pad_l + w + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{pad_l + w + 24}" y="{ly}" font-size="11">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def charts_from_metrics(rows: list[dict[str, Any]]) -> dict[str, Series]:
    reward: Series = {"overall": []}
    masked: Series = {"masked fraction": []}
    stale: Series = {"staleness mean": [], "staleness max": [], "dropped (step)": []}
    for r in rows:
        step = float(r["step"])
        reward["overall"].append((step, r["reward_mean"]))
        for env, s in r["per_env"].items():
            reward.setdefault(env, []).append((step, s["reward_mean"]))
        masked["masked fraction"].append((step, r["masked_fraction"]))
        st = r["staleness"] or [0]
        stale["staleness mean"].append((step, sum(st) / len(st)))
        stale["staleness max"].append((step, r["staleness_max"]))
        stale["dropped (step)"].append((step, r["dropped_stale"]))
    return {"reward": reward, "masked_fraction": masked, "staleness": stale}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def held_out_series(runs: dict[str, Path]) -> Series:
    """Held-out mean reward by step (`eval.jsonl`) of each labelled run folder."""
    return {
        label: [(float(r["step"]), r["reward_mean"]) for r in _rows(Path(run) / "eval.jsonl")]
        for label, run in runs.items()
    }


def write_comparison(runs: dict[str, Path], path: Path, *, title: str = "held-out mean reward") -> Path:
    """One chart of several runs' held-out curves (e.g. ERPO and its learning-rate-0 control):
    a PNG when `path` ends in .png and matplotlib is installed, else an SVG beside it."""
    charts = {title: held_out_series(runs)}
    return _draw(charts, path.parent, stem=path.stem, png=path.suffix == ".png")[0]


def write_plots(metrics_path: Path, out_dir: Path, *, eval_path: Path | None = None) -> list[Path]:
    """Write reward / masked-fraction / staleness charts (and the held-out reward, when the run
    evaluated); returns the files written."""
    charts = charts_from_metrics(_rows(metrics_path))
    if eval_path is not None and eval_path.is_file() and eval_path.read_text().strip():
        charts["held_out_reward"] = {
            "held-out mean": [(float(r["step"]), r["reward_mean"]) for r in _rows(eval_path)]
        }
    return _draw(charts, out_dir)


def _draw(
    charts: dict[str, Series], out_dir: Path, *, stem: str | None = None, png: bool = True
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    plt: Any = None  # matplotlib is optional: SVGs without it
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot

        plt = pyplot
    except ImportError:
        pass
    for name, series in charts.items():
        file = stem or name
        if plt is not None and png:
            fig, ax = plt.subplots(figsize=(7, 3.5))
            for label, s in series.items():
                ax.plot([x for x, _ in s], [y for _, y in s], label=label, marker="o" if stem else None)
            ax.set_title(name)
            if stem:  # a comparison of rewards: on the reward's own scale
                ax.set_ylim(0.0, 1.0)
            ax.set_xlabel("step")
            ax.legend()
            path = out_dir / f"{file}.png"
            fig.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(fig)
        else:
            path = out_dir / f"{file}.svg"
            path.write_text(svg_line_chart(name, series))
        written.append(path)
    return written
