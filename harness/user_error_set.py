"""The labeled user-error (MEU) set: clean conversations and ones with one injected user error each.

Why it exists: ERPO masks every trajectory the detector (`user_errors.py`) calls a user error, so
its precision decides which agent failures training never sees, and its recall which user faults
the agent is punished for. This set is the anchor both are measured on (`user_error_eval.py`,
`benchmarks/bench_meu.py`) and that a test holds the rules to.

Per bundled env with tasks, `per_env` tasks (drawn by the seed) that ask the user at least one
fact; per task two clean items (a full run, and one where the agent fails) and one item per
error kind. Same seed, same bytes (`dump_set`): the set is stored under `tests/fixtures/`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envforge.server import Fleet

from .tasks import EnvTasks, load_env_tasks
from .user_error_plans import CLEAN_VARIANTS, ERROR_PLANS, TaskContext, clean_plan, leak_plan
from .user_error_play import LabeledConversation, base_name, play

DEFAULT_SEED = 15
DEFAULT_PER_ENV = 6


def bundled_env_dirs(envs_root: Path) -> list[Path]:
    """The synthesized envs under `envs_root` the labeled set is built from. An imported τ² env
    (`envforge import tau2` writes its tasks with source "tau2") is left out: the injected errors
    are written against envforge's scenarios, and the set must not change with what a checkout
    happens to have imported."""
    return sorted(p for p in envs_root.iterdir() if (p / "tasks.jsonl").is_file() and not _imported(p))


def _imported(env_dir: Path) -> bool:
    with (env_dir / "tasks.jsonl").open() as tasks:
        first = tasks.readline()
    return bool(first.strip()) and json.loads(first).get("source") == "tau2"


def _pools(et: EnvTasks) -> dict[str, list[Any]]:
    pools: dict[str, list[Any]] = {}
    for task in et.tasks:
        for fact in task.scenario.known_facts:
            pools.setdefault(base_name(fact.name), []).append(fact.value)
    return pools


def _surfaced_before(item: LabeledConversation, value: str) -> bool:
    """Whether the agent or a tool said `value` before the erring message (then it is no leak)."""
    end = item.error_at if item.error_at is not None else len(item.messages)
    return any(value in (m.content or "") for m in item.messages[:end] if m.role != "user")


async def _task_items(et: EnvTasks, fleet: Fleet, ctx: TaskContext, seed: int) -> list[LabeledConversation]:
    task = ctx.task

    def rng(what: str) -> random.Random:
        return random.Random(f"{seed}:{task.id}:{what}")

    items = [await play(et, fleet, task, clean_plan(ctx, rng("clean/full"), "full"), rng("play/clean/full"))]
    variant = rng("clean/variant").choice(CLEAN_VARIANTS)
    items.append(
        await play(et, fleet, task, clean_plan(ctx, rng("clean/fail"), variant), rng("play/clean/fail"))
    )
    for kind, build in ERROR_PLANS.items():
        items.append(await play(et, fleet, task, build(ctx, rng(kind)), rng(f"play/{kind}")))
    for plan in leak_plan(ctx, rng("leak")):
        item = await play(et, fleet, task, plan, rng("play/leak"))
        if not _surfaced_before(item, plan.leaked):
            items.append(item)
            break
    return items


async def build_set(
    env_dirs: Sequence[Path], *, seed: int = DEFAULT_SEED, per_env: int = DEFAULT_PER_ENV
) -> list[LabeledConversation]:
    """Every item for `env_dirs`, in a stable order (env, task, then clean before error kinds)."""
    items: list[LabeledConversation] = []
    for env_dir in env_dirs:
        et = load_env_tasks(env_dir)
        pools = _pools(et)
        contexts = [TaskContext.of(t, pools) for t in sorted(et.tasks, key=lambda t: t.id)]
        usable = [c for c in contexts if c.answer_slots]
        chosen = random.Random(f"{seed}:{et.env.name}").sample(usable, min(per_env, len(usable)))
        fleet = Fleet([et.env])
        try:
            for ctx in sorted(chosen, key=lambda c: c.task.id):
                items.extend(await _task_items(et, fleet, ctx, seed))
        finally:
            await fleet.aclose()
    return items


def dump_set(items: Sequence[LabeledConversation]) -> bytes:
    """JSON lines, defaults left out (small, and stable across field additions with defaults)."""
    lines = [item.model_dump_json(exclude_defaults=True) for item in items]
    return ("\n".join(lines) + "\n").encode()


def load_set(path: Path) -> list[LabeledConversation]:
    return [
        LabeledConversation.model_validate_json(line)
        for line in path.read_text().splitlines()
        if line.strip()
    ]
