"""An evaluation from Python: an agent on a set of tasks, its trials and its pass^k.

`run_eval` (the harness) is the engine and writes a run directory; this adds what a script
wants around it: a synchronous entry point, a temporary run directory when the caller keeps
none, and the summary `envforge eval --json` prints, computed from the same records. What a run
needs settled before its first trial (each model role's `LLMConfig`, the local model servers) is
`eval_setup`'s.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from envforge.harness import (
    Agent,
    EvalConfig,
    Fault,
    RunManifest,
    TrialRecord,
    User,
    run_eval,
    summarize,
)
from envforge.synth import Task


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze every object alive now out of the collector's walks for the block, and undo it on the
    way out.

    After a long evaluation the process holds every record and env of the run; what is left to
    do (summarize, write the report, print) makes little garbage, yet each older-generation
    collection would walk that whole heap again (~1 ms a trial at 2,048 trials). Thawed on the
    way out, so a caller that runs several evaluations in one process leaks nothing. A process that
    froze objects itself keeps its own arrangement (the block then changes nothing)."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


@dataclass(frozen=True)
class Evaluation:
    """A finished run: its manifest, the latest record of each trial, and their summary."""

    manifest: RunManifest
    records: list[TrialRecord]
    summary: dict[str, Any]
    """`{"overall": part, "envs": {env: part}}`, as `envforge eval --json` prints it."""
    run_dir: Path | None
    """Where the run was written (`report`, `rescore` and `--resume` read it); None when temporary."""

    @property
    def infra_failures(self) -> list[TrialRecord]:
        """The trials that failed for infrastructure reasons (a model or server unreachable): no
        measure of the agent, and what `resume=True` runs again."""
        return [r for r in self.records if r.fault == Fault.INFRA]

    def pass_hat_k(self, k: int = 1, env: str | None = None) -> float | None:
        """pass^k over all envs, or over one: the chance that k trials of a task all succeed
        (None when no task has k trials that count, e.g. all were infrastructure failures)."""
        if env is not None and env not in self.summary["envs"]:
            raise ValueError(f"no env {env!r} in this run (it has {', '.join(sorted(self.summary['envs']))})")
        values: list[float | None] = (self.summary["overall"] if env is None else self.summary["envs"][env])[
            "pass_hat_k"
        ]
        if not 1 <= k <= len(values):
            raise ValueError(f"k must be between 1 and the run's trials per task ({len(values)}), got {k}")
        return values[k - 1]


async def evaluate_async(
    env_dirs: Sequence[str | Path],
    config: EvalConfig | str,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> Evaluation:
    """Evaluate an agent on the tasks of `env_dirs` (each an env folder with `tasks.jsonl`).

    `config` is an `EvalConfig` (agent, user, trials, task selection, limits: what the CLI's
    flags set), or just the agent's name with every default. `out` keeps the run directory;
    without it the run goes to a temporary one, removed on return. `make_agent(task, seed)`
    plays your own Python `Agent` instead of the configured one.

    Progress hooks: `on_start(total, done)` once the trials are known (`done`: those a resumed
    run already has), `on_record(record)` as each trial lands, `on_notice(message)` for what the
    run reports in one line (unreadable lines of `trials.jsonl`, to be run again).
    """
    cfg = config if isinstance(config, EvalConfig) else EvalConfig(agent=config)
    if resume and out is None:
        raise ValueError("resume needs the run directory to resume: pass out=")

    async def run(run_dir: str | Path) -> tuple[RunManifest, list[TrialRecord]]:
        return await run_eval(
            env_dirs,
            cfg,
            run_dir,
            resume=resume,
            on_start=on_start,
            on_record=on_record,
            on_notice=on_notice,
            make_agent=make_agent,
            make_user=make_user,
        )

    if out is not None:
        manifest, records = await run(out)
        with frozen_heap():
            return Evaluation(manifest, records, summarize(records, manifest.trials), Path(out))
    with tempfile.TemporaryDirectory(prefix="envforge-eval-") as tmp:
        manifest, records = await run(Path(tmp) / "run")
    with frozen_heap():
        return Evaluation(manifest, records, summarize(records, manifest.trials), None)


def evaluate(
    env_dirs: Sequence[str | Path],
    config: EvalConfig | str,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> Evaluation:
    """`evaluate_async` from synchronous code."""
    return anyio.run(
        lambda: evaluate_async(
            env_dirs,
            config,
            out=out,
            resume=resume,
            make_agent=make_agent,
            make_user=make_user,
            on_record=on_record,
            on_start=on_start,
            on_notice=on_notice,
        )
    )
