"""Task wording by a real model: how many rewrites `synth tasks --llm MODEL` keeps, why it rejects
the rest, and the realism measures of the wording against the templated one.

Per env, `synth tasks --n N` runs with `--llm MODEL` (a packaged model behind its own server, or
any litellm model). Every shipped task's request is reworded line by line and judged
(`synth/checks/rewording.py`); a rejected rewrite ships the templated wording. The realism
measures that wording can move (procedural instructions: a tool's name or description, numbered
steps; stiffly worded instructions) are given three ways over the same tasks: as templated, as
the model proposed them (every rewrite applied, unjudged) and as shipped. The tasks themselves
are the templated run's (a rewrite comes after a task is verified), so only wording differs.

`--capture FILE` writes every rewrite (templated and proposed instruction, problems) as JSON: the
source of `tests/fixtures/task_rewrites.json`.

usage: python benchmarks/bench_task_wording.py [--model local] [--envs retail_orders,car_rental]
    [--n 20] [--seed 0] [--capture FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from _util import REPO

import envforge
from envforge.server import load_env
from envforge.synth import EnvRealism, Task, measure_realism, problem_class


def _realism(env: Any, tasks: list[Task]) -> EnvRealism:
    descriptions = {t.name: t.description for t in env.tools.values()}
    return measure_realism(env.name, tasks, descriptions, descriptions=descriptions)


def _worded(task: Task, instruction: str) -> Task:
    return task.model_copy(update={"scenario": task.scenario.model_copy(update={"instruction": instruction})})


async def one_env(name: str, args: argparse.Namespace, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    env = load_env(REPO / "envs" / name)
    started = time.perf_counter()
    report = await envforge.synthesize_tasks_async(
        env, args.n, seed=args.seed, llm_model=model, completion_kwargs=kwargs
    )
    wall = time.perf_counter() - started
    shipped = report.tasks
    by_id = {t.id: t for t in shipped}
    templated = [_worded(by_id[i], template) for i, template, _, _ in report.rewrite_log]
    proposed = [_worded(by_id[i], offered) for i, _, offered, _ in report.rewrite_log]
    first = Counter(problem_class(p[0]) for *_, p in report.rewrite_log if p)
    every = Counter(c for *_, p in report.rewrite_log for c in dict.fromkeys(map(problem_class, p)))
    return {
        "env": name,
        "tasks": len(shipped),
        "kept": report.rewrites_kept,
        "rejected": report.rewrites_rejected,
        "first_problem": dict(first),
        "any_problem": dict(every),
        "templated": _realism(env, templated).model_dump(include={"procedural", "stiff_tasks"}),
        "proposed": _realism(env, proposed).model_dump(include={"procedural", "stiff_tasks"}),
        "shipped": _realism(env, shipped).model_dump(include={"procedural", "stiff_tasks"}),
        "wall_s": round(wall, 1),
        "rewrites": [
            {"id": i, "template": t, "proposed": o, "problems": p} for i, t, o, p in report.rewrite_log
        ],
    }


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Model `{args.model}`, `--n {args.n} --seed {args.seed}`. Realism: procedural / stiff instructions.",
        "",
        "| env | tasks | rewrites kept | rejected, by first problem | tasks with each problem "
        "| realism templated | realism proposed | realism shipped | wall s |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        first = ", ".join(f"{k} {v}" for k, v in sorted(r["first_problem"].items())) or "–"
        every = ", ".join(f"{k} {v}" for k, v in sorted(r["any_problem"].items())) or "–"
        real = [f"{r[k]['procedural']} / {r[k]['stiff_tasks']}" for k in ("templated", "proposed", "shipped")]
        share = f"{r['kept']} of {r['tasks']} ({r['kept'] / r['tasks']:.0%})" if r["tasks"] else "–"
        cells = [r["env"], r["tasks"], share, first, every, *real, r["wall_s"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="local")
    parser.add_argument("--envs", default="retail_orders,car_rental")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capture", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    with envforge.local_model_servers({"rewrite": args.model}) as configs:
        cfg = configs.get("rewrite")
        model = cfg.model if cfg else args.model
        kwargs = {"api_base": cfg.api_base, "api_key": cfg.api_key, "timeout": cfg.timeout_s} if cfg else {}
        rows = [anyio.run(one_env, name, args, model, kwargs) for name in args.envs.split(",")]
    table = markdown(rows, args)
    print(table)
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    if args.capture:
        captured = [{"env": r["env"], "model": args.model, **w} for r in rows for w in r["rewrites"]]
        args.capture.write_text(json.dumps(captured, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
