"""Synthesis end to end: graph, build attempts, self-verification (`tasks.jsonl` I/O: `taskfile.py`).

Attempt k of a run with seed S uses `random.Random("S:k")` and what attempts 0..k-1 learned about
which calls work (`outcomes.py`) and which intents they shipped (`mix.py`); nothing else varies (no
clocks, no episode ids in the output), so the same seed writes a byte-identical `tasks.jsonl`.

A task ships when it is new, would not make the run repetitive (`mix.py`), passes every self-check
(`verify.py`) and no adversarial agent (`adversaries.py`) earns its full reward. New means distinct
from every task shipped before it in the run: two tasks with the same golden end state and the
same required outputs, or the same golden calls, are one task to an agent, so the later one is
dropped. An env supports only so many
distinct tasks: the run stops once `stall_limit(kept)` attempts in a row have shipped nothing.
"""

from __future__ import annotations

import gc
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from envforge.server import Environment, Fleet, run_inline

from ..checks.rewording import problem_class, rewrite_problems
from ..checks.verify import adversary_rewards, gamed_by, verify_task
from ..graph.toolgraph import build_graph
from ..task.golden import GoldenRun
from ..task.models import Task, ToolGraph, UserScenario
from ..task.taskfile import task_keys
from ..walk.context import SynthContext
from ..walk.outcomes import Outcomes
from ..wording.render import rewrite_scenario
from .config import BuildFailed, SynthConfig
from .mix import IntentMix
from .tasks import build_task

# Attempts in a row that ship nothing before a run concludes the env has no more distinct tasks.
MIN_STALL = 300


def stall_limit(kept: int) -> int:
    """How many fruitless attempts in a row end a run that has shipped `kept` tasks: the more an
    env has given, the longer a new task may take to find among the repeats."""
    return max(MIN_STALL, 5 * kept)


# Allocations between collections of the youngest generation while synthesizing.
GC_THRESHOLD = 50_000


@dataclass
class SynthReport:
    tasks: list[Task] = field(default_factory=list)
    attempts: int = 0
    discarded: Counter[str] = field(default_factory=Counter)
    rewrites_kept: int = 0
    rewrites_rejected: int = 0
    # rejected rewrites by the first problem's class (`checks.rewording.problem_class`)
    rewrite_rejections: Counter[str] = field(default_factory=Counter)
    # (task id, templated instruction, proposed instruction, problems) per rewrite asked
    rewrite_log: list[tuple[str, str, str, list[str]]] = field(default_factory=list)
    exhausted: bool = False  # stopped because attempts kept repeating shipped tasks or failing
    seconds: float = 0.0
    calls_tried: int = 0  # tool calls walks made (answered from memory or not)
    calls_failed: int = 0  # of those, refused or changing nothing

    @property
    def rate(self) -> float:
        return len(self.tasks) / self.seconds if self.seconds else 0.0


async def synthesize(
    env: Environment,
    n: int,
    seed: int,
    cfg: SynthConfig | None = None,
    *,
    graph: ToolGraph | None = None,
    llm_model: str | None = None,
    max_attempts: int | None = None,
    completion_kwargs: dict[str, Any] | None = None,
    adversaries: bool = True,
) -> SynthReport:
    """Build tasks until `n` distinct ones pass every self-check (or the attempt budget runs out,
    or `stall_limit` attempts in a row ship nothing). `adversaries=False` skips the adversarial
    runs: for measuring what they cost only, as a task they game can then ship."""
    cfg = cfg or SynthConfig()
    report = SynthReport()
    started = time.perf_counter()
    fleet = Fleet([env], max_episodes=64)
    run_inline(fleet)  # one sequential walk at a time: worker threads would only add switches
    ctx: SynthContext | None = None
    gc_threshold = gc.get_threshold()
    # Walks allocate many short-lived containers and few cycles: collecting the youngest
    # generation every 700 allocations (the default) costs 5-10% of synthesis for little. And
    # what exists before synthesis (modules, the env, the graph) need not be scanned by a full
    # collection during it: it is frozen, unless the caller manages frozen objects itself.
    gc.set_threshold(max(gc_threshold[0], GC_THRESHOLD), *gc_threshold[1:])
    froze = gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    try:
        graph = graph or await build_graph(env, fleet)
        ctx = SynthContext.create(env, graph, fleet)
        ctx.outcomes = Outcomes(learn=cfg.steer)
        write_tools = sorted(t.name for t in graph.tools if not t.read_only)
        tools = {t.name: t.description for t in env.tools.values()}
        mix = IntentMix(ctx.roles, write_tools) if cfg.vary else None
        budget = max_attempts if max_attempts is not None else max(50, n * 30)
        k = 0
        last_shipped = 0
        seen: set[str] = set()
        while len(report.tasks) < n and k < budget:
            if k - last_shipped >= stall_limit(len(report.tasks)):
                report.exhausted = True
                break
            task_seed = f"{seed}:{k}"
            task_id = f"{env.name}-{seed}-{k:05d}"
            k += 1
            aim = mix.aim(random.Random(f"{task_seed}:aim")) if mix is not None else None
            try:
                built = await build_task(ctx, task_id, task_seed, cfg, aim=aim)
            except BuildFailed as exc:
                report.discarded[f"build:{exc.reason}"] += 1
                if mix is not None:
                    mix.record(aim, None)
                continue
            task, golden = built.task, built.golden
            if mix is not None and not mix.admits(task):
                report.discarded["repetitive"] += 1  # cheap to tell, and no fault of its principal
                mix.record(aim, None)
                continue
            dropped = await _why_dropped(ctx, task, golden, seen, adversaries)
            if cfg.steer:  # a principal whose walks keep repeating or failing is picked less
                ctx.ownership.record(task.dag.principal, dropped is None)
            if dropped is not None:
                report.discarded[dropped] += 1
                if mix is not None:
                    mix.record(aim, None)
                continue
            if mix is not None:
                mix.record(aim, task)
            keys = task_keys(task)
            # Shipped ids count shipped tasks (`ENV-SEED-00000` is always the first), not attempts.
            task = task.model_copy(update={"id": f"{env.name}-{seed}-{len(report.tasks):05d}"})
            if llm_model:
                task = await _reworded(task, llm_model, tools, report, completion_kwargs or {})
            report.tasks.append(task)
            seen.update(keys)
            last_shipped = k
            ctx.outcomes.record_task(
                write_tools,
                [
                    n.call.name
                    for n in task.dag.nodes
                    if n.kind == "call" and n.write and n.executed and not n.expect_error
                ],
            )
        report.attempts = k
        report.calls_tried, report.calls_failed = ctx.outcomes.calls, ctx.outcomes.failed
    finally:
        gc.set_threshold(*gc_threshold)
        if froze:
            gc.unfreeze()
        if ctx is not None:
            ctx.close()
        await fleet.aclose()
    report.seconds = time.perf_counter() - started
    return report


async def _reworded(
    task: Task,
    model: str,
    tools: dict[str, str],
    report: SynthReport,
    completion_kwargs: dict[str, Any],
) -> Task:
    """`task` with its request reworded by `model` when the rewrite keeps its meaning
    (`checks.rewording`), else as templated; either way counted and logged in `report`."""

    def judge(template: UserScenario, rewritten: UserScenario) -> list[str]:
        return rewrite_problems(task, rewritten, tools)

    rewrite = await rewrite_scenario(task.scenario, model, judge=judge, **completion_kwargs)
    report.rewrite_log.append((task.id, task.scenario.instruction, rewrite.proposed, rewrite.problems))
    if rewrite.problems:
        report.rewrites_rejected += 1
        report.rewrite_rejections[problem_class(rewrite.problems[0])] += 1
        return task
    report.rewrites_kept += 1
    return task.model_copy(update={"scenario": rewrite.scenario})


async def _why_dropped(
    ctx: SynthContext, task: Task, golden: GoldenRun, seen: set[str], adversaries: bool
) -> str | None:
    """Why a built task does not ship (a duplicate, a failed self-check, an adversary earning
    its reward), or None when it ships."""
    if any(key in seen for key in task_keys(task)):
        return "duplicate"
    failed = await verify_task(ctx, task, golden_state=golden.state)
    if failed:
        return f"check:{failed[0]}"
    if adversaries:
        gamed = gamed_by(await adversary_rewards(ctx, task, golden=golden, until_gamed=True))
        if gamed:
            return f"adversary:{gamed[0]}"
    return None
