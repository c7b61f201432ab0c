"""Real-model results: each packaged model as agent (scripted user) on the bundled envs and τ² retail.

For each packaged model (harness/local_models.py) whose packages are installed, one local server
(the launcher `eval --agent local/NAME` uses) serves every env in turn; each env's tasks are run
through the real harness (`run_eval`, one trial per task, temperature 0) against the scripted
user. One row per model and env: pass^1, agent turns per task (assistant messages), the share of
agent turns with a valid tool call (`harness.tool_use`), and mean wall time per trial. τ² retail
(`envs/tau2_retail`, written by `envforge import tau2 ../shared/tau2/retail --out envs/tau2_retail`)
runs its train split; it is skipped with a note when not imported.

The full run (every task: hours on a CPU) is `--limit 0 --tau2-limit 0`; a stated subset is
`--limit N` (the first N tasks of each bundled env), `--tau2-limit M` and `--envs a,b`.

usage: python benchmarks/bench_real_models.py [--models a,b] [--envs a,b] [--limit N] [--tau2-limit M]
                                              [--max-turns T] [--timeout S] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from _util import REPO

from envforge.harness import (
    LOCAL_MODELS,
    EvalConfig,
    Limits,
    LocalModelError,
    LocalServerError,
    TrialRecord,
    local_model_available,
    run_eval,
    running_local_server,
    summarize,
)

ENVS = REPO / "envs"
TAU2 = ENVS / "tau2_retail"


@dataclass
class Row:
    model: str
    env: str
    tasks: int
    pass_1: float | None
    turns_per_task: float
    valid_share: float | None
    wall_s_per_trial: float
    infra: int


def row_of(model: str, env: str, records: list[TrialRecord]) -> Row:
    summary = summarize(records, 1)["overall"]
    turns = [sum(1 for m in r.messages if m.role == "assistant") for r in records]
    return Row(
        model=model,
        env=env,
        tasks=len(records),
        pass_1=summary["pass_hat_k"][0] if summary["pass_hat_k"] else None,
        turns_per_task=statistics.fmean(turns) if turns else 0.0,
        valid_share=summary["tool_calls"]["valid_share"],
        wall_s_per_trial=statistics.fmean(r.duration_s for r in records) if records else 0.0,
        infra=summary["infra_failures"],
    )


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | env | tasks | pass^1 | agent turns / task | valid tool-call turns | wall s / trial |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        infra = f" ({r.infra} infra)" if r.infra else ""
        lines.append(
            f"| {r.model} | {r.env} | {r.tasks}{infra} | {_pct(r.pass_1)} | {r.turns_per_task:.1f} "
            f"| {_pct(r.valid_share)} | {r.wall_s_per_trial:.0f} |"
        )
    return "\n".join(lines)


def env_dirs(names: list[str] | None) -> list[Path]:
    found = sorted(d for d in ENVS.iterdir() if (d / "tasks.jsonl").is_file() and d != TAU2)
    if names:
        unknown = set(names) - {d.name for d in found}
        if unknown:
            raise SystemExit(f"error: no bundled env with tasks named {sorted(unknown)}")
        found = [d for d in found if d.name in names]
    return found


async def run_cell(
    spec: str, server_cfg: EvalConfig, env_dir: Path, split: str | None, limit: int | None
) -> list[TrialRecord]:
    config = server_cfg.model_copy(update={"split": split, "limit": limit})
    with tempfile.TemporaryDirectory() as tmp:
        _, records = await run_eval([env_dir], config, Path(tmp) / "run")
    return records


def main(args: argparse.Namespace) -> int:
    names = args.models.split(",") if args.models else list(LOCAL_MODELS)
    envs = env_dirs(args.envs.split(",") if args.envs else None)
    rows: list[Row] = []
    for name in names:
        if name not in LOCAL_MODELS:
            print(f"error: no packaged model {name!r} (known: {', '.join(LOCAL_MODELS)})", file=sys.stderr)
            return 2
        if not local_model_available(LOCAL_MODELS[name]):
            print(f"{name}: its packages are not installed; skipped", file=sys.stderr)
            continue
        spec = f"local/{name}"
        try:
            with running_local_server(spec) as server:
                base = EvalConfig(
                    agent=spec,
                    agent_llm=server.llm_config(0.0),
                    concurrency=1,
                    limits=Limits(max_turns=args.max_turns, trial_timeout_s=args.timeout),
                )
                cells: list[tuple[Path, str | None, int | None]] = [
                    (d, None, args.limit or None) for d in envs
                ]
                if TAU2.is_dir() and (TAU2 / "tasks.jsonl").is_file():
                    cells.append((TAU2, "train", args.tau2_limit or None))
                else:
                    print("tau2_retail not imported (envforge import tau2 ...); skipped", file=sys.stderr)
                for env_dir, split, limit in cells:
                    started = time.perf_counter()
                    records = anyio.run(run_cell, spec, base, env_dir, split, limit)
                    label = f"{env_dir.name} ({split})" if split else env_dir.name
                    rows.append(row_of(name, label, records))
                    print(
                        f"{name} {label}: {len(records)} trials in {time.perf_counter() - started:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                    if args.markdown:  # the rows so far: an interrupted run keeps what it measured
                        args.markdown.write_text(markdown(rows) + "\n")
        except (LocalModelError, LocalServerError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated packaged model names (default: all)")
    parser.add_argument("--envs", help="comma-separated bundled env names (default: every env with tasks)")
    parser.add_argument("--limit", type=int, default=2, help="first N tasks of each bundled env (0: all)")
    parser.add_argument("--tau2-limit", type=int, default=5, help="first M τ² train tasks (0: all)")
    parser.add_argument("--max-turns", type=int, default=6, help="user/agent exchanges per trial")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit per trial (s)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    sys.exit(main(parser.parse_args()))
