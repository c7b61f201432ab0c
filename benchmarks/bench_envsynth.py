"""Env synthesis measured on the corpus of real tool documents, with a given model.

Each doc set of benchmarks/envsynth_corpus/ (or those chosen) goes through `envforge synth envs`
alone, in a scratch folder holding that one set (so wall and CPU time are the set's own). Per set
the table gives: the gate each round reached (the first gate that failed, or `all` when every gate
passed), the rounds used, accepted or the first reason it was not, model calls and tokens, wall
seconds and CPU seconds (the CLI and its children, a local model server included). With
`--tasks N`, an accepted env then gets `synth tasks --n N` (how many verified tasks it ships) and
`check` (its verdict).

The whole corpus with the best packaged model takes hours on two cores:

    python benchmarks/bench_envsynth.py --model local/qwen2.5-coder-1.5b --tasks 50 \
        --markdown /tmp/envsynth.md --json /tmp/envsynth.json

usage: python benchmarks/bench_envsynth.py [--model local] [--sets a,b | --limit N]
    [--max-rounds 3] [--json-schema auto] [--tasks N] [--out DIR] [--markdown FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _util import REPO, child_env

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
ENVFORGE = [sys.executable, "-m", "envforge.cli"]
GATES = ("static", "load", "probes", "llm_probe", "policy_rules", "tasks", "policy_kept")


def corpus_sets() -> list[str]:
    return sorted(p.name for p in CORPUS.iterdir() if (p / "docs").is_dir())


def _timed(cmd: list[str], log: Path) -> tuple[int, float, float]:
    """Run `cmd`, its output into `log`; (exit code, wall s, CPU s of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with log.open("ab") as out:
        code = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, time.perf_counter() - started, cpu


def _report(out: Path, name: str) -> dict[str, Any] | None:
    """The set's synthesis.json: in its env folder if accepted, else under `.rejected/`."""
    for path in (out / name / "synthesis.json", out / ".rejected" / name / "synthesis.json"):
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return data
    return None


def gate_reached(round_: dict[str, Any]) -> str:
    """The first gate of a round that failed, or `all` when every gate it ran passed."""
    for gate in round_.get("gates", []):
        if not gate["passed"]:
            return str(gate["name"])
    return "all"


def one_set(name: str, args: argparse.Namespace, out: Path, log: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="envsynth-") as tmp:
        shutil.copytree(CORPUS / name / "docs", Path(tmp) / name / "docs")
        cmd = [*ENVFORGE, "synth", "envs", tmp, "--out", str(out), "--concurrency", "1"]
        cmd += ["--max-rounds", str(args.max_rounds), "--json-schema", args.json_schema, "--force"]
        cmd += ["--model", args.model] + (["--api-base", args.api_base] if args.api_base else [])
        code, wall, cpu = _timed(cmd, log)
    report = _report(out, name)
    row: dict[str, Any] = {"set": name, "exit": code, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    if report is None:
        return {**row, "status": "not started", "why": f"no synthesis.json (see {log})"}
    rounds = report.get("rounds", [])
    row.update(
        status=report["status"],
        why=""
        if report["status"] == "accepted"
        else "; ".join((report.get("reasons") or ["a gate failed"])[:2]),
        reached=[gate_reached(r) for r in rounds],
        rounds=len(rounds),
        calls=report.get("llm_calls", 0),
        prompt_tokens=report.get("prompt_tokens", 0),
        completion_tokens=report.get("completion_tokens", 0),
        model=report.get("model"),
    )
    if report["status"] == "accepted" and args.tasks:
        env = out / name
        code, wall, _ = _timed(
            [*ENVFORGE, "synth", "tasks", str(env), "--n", str(args.tasks), "--force"], log
        )
        tasks = env / "tasks.jsonl"
        row["verified_tasks"] = len(tasks.read_text().splitlines()) if code == 0 and tasks.exists() else 0
        row["check"] = "ok" if _timed([*ENVFORGE, "check", str(env)], log)[0] == 0 else "failed"
    return row


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = "| doc set | gate reached per round | rounds | result | calls | tokens (prompt + completion) "
    head += "| wall s | CPU s |"
    lines = [
        f"Model `{args.model}`, `--max-rounds {args.max_rounds}`, `--json-schema {args.json_schema}`.",
        "",
    ]
    lines += [head, "|" + "---|" * 8]
    for r in rows:
        result = r["status"] if r["status"] == "accepted" else f"{r['status']}: {r['why']}"
        if "verified_tasks" in r:
            result += f"; {r['verified_tasks']} verified tasks, check {r['check']}"
        tokens = f"{r.get('prompt_tokens', 0):,} + {r.get('completion_tokens', 0):,}"
        reached = " → ".join(r.get("reached", [])) or "–"
        cells = [
            r["set"],
            reached,
            r.get("rounds", 0),
            result,
            r.get("calls", 0),
            tokens,
            r["wall_s"],
            r["cpu_s"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    accepted = sum(r["status"] == "accepted" for r in rows)
    stops = Counter(r["reached"][-1] for r in rows if r.get("reached") and r["status"] != "accepted")
    lines += [
        "",
        f"Accepted: {accepted} of {len(rows)}. Last round stopped at: "
        + (
            ", ".join(
                f"{g} {n}"
                for g, n in sorted(stops.items(), key=lambda kv: GATES.index(kv[0]) if kv[0] in GATES else 99)
            )
            or "none"
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="local")
    parser.add_argument("--api-base")
    parser.add_argument("--sets", help="comma-separated doc sets (default: the whole corpus)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N sets (0: all)")
    parser.add_argument("--max-rounds", type=int, default=3)
    parser.add_argument("--json-schema", default="auto")
    parser.add_argument("--tasks", type=int, default=0, help="synth tasks --n N and check each accepted env")
    parser.add_argument("--out", type=Path, help="where the envs go (default: a scratch folder)")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    known = corpus_sets()
    sets = args.sets.split(",") if args.sets else known
    unknown = [s for s in sets if s not in known]
    if unknown:
        sys.exit(f"error: not in the corpus: {', '.join(unknown)}; known: {', '.join(known)}")
    if args.limit:
        sets = sets[: args.limit]
    out = args.out or Path(tempfile.mkdtemp(prefix="envsynth-out-"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench_envsynth.log"
    rows = []
    for name in sets:
        row = one_set(name, args, out, log)
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = markdown(rows, args)
    print(table)
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"envs and the log: {out}")


if __name__ == "__main__":
    main()
