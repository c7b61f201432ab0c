"""Precision and recall of the user-error detector on the labeled set, per kind and overall.

Masking is binary (a trajectory is kept or masked), so an error item counts as caught when the
detector flags it at all, whatever kind it names: recall per kind is caught / items of that kind.
Precision per kind asks how often a verdict *of that kind* was right to mask: of the items the
rules flagged naming that kind, the share that really hold a user error. The judge names no kind,
so its verdicts count under `judge`. A flagged clean item is a false alarm: an agent failure the
trainer would never see.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from envforge.synth import Task, load_tasks

from .llm import LLMConfig
from .user_error_play import LabeledConversation
from .user_errors import ERROR_KINDS, judge_user_error, rule_verdict

Detector = Callable[[Task, LabeledConversation], Awaitable[str | None]]
"""Returns the kind it blames (`judge` for the judge), or None for no user error."""


async def rules_only(task: Task, item: LabeledConversation) -> str | None:
    verdict = rule_verdict(task, item.messages)
    return verdict.kind if verdict else None


def rules_then_judge(judge: LLMConfig) -> Detector:
    """`detect_user_error`'s order: the rules, then the judge when they find nothing."""

    async def detect(task: Task, item: LabeledConversation) -> str | None:
        verdict = rule_verdict(task, item.messages)
        if verdict:
            return verdict.kind
        error, _, _ = await judge_user_error(task, item.messages, judge)
        return "judge" if error else None

    return detect


@dataclass
class KindScore:
    items: int = 0
    caught: int = 0
    named: int = 0
    """Verdicts naming this kind (any item)."""
    named_right: int = 0
    """... of which on an item with a user error."""

    @property
    def recall(self) -> float | None:
        return self.caught / self.items if self.items else None

    @property
    def precision(self) -> float | None:
        return self.named_right / self.named if self.named else None


@dataclass
class Evaluation:
    kinds: dict[str, KindScore] = field(default_factory=dict)
    clean: int = 0
    false_alarms: int = 0
    false_alarm_items: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    @property
    def caught(self) -> int:
        return sum(s.caught for k, s in self.kinds.items() if k in ERROR_KINDS)

    @property
    def errors(self) -> int:
        return sum(s.items for k, s in self.kinds.items() if k in ERROR_KINDS)

    @property
    def precision(self) -> float | None:
        flagged = self.caught + self.false_alarms
        return self.caught / flagged if flagged else None

    @property
    def recall(self) -> float | None:
        return self.caught / self.errors if self.errors else None


def task_index(items: Sequence[LabeledConversation], envs_root: Path) -> dict[tuple[str, str], Task]:
    wanted = {(i.env, i.task_id) for i in items}
    index: dict[tuple[str, str], Task] = {}
    for env in sorted({env for env, _ in wanted}):
        for task in load_tasks(envs_root / env):
            if (env, task.id) in wanted:
                index[(env, task.id)] = task
    missing = wanted - index.keys()
    if missing:
        raise ValueError(f"tasks of the labeled set not found under {envs_root}: {sorted(missing)[:3]}")
    return index


async def evaluate(
    items: Sequence[LabeledConversation],
    tasks: dict[tuple[str, str], Task],
    detect: Detector,
    *,
    concurrency: int = 1,
) -> Evaluation:
    verdicts: list[str | None] = [None] * len(items)
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            verdicts[i] = await detect(tasks[(items[i].env, items[i].task_id)], items[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(items)):
            tg.start_soon(one, i)
    result = Evaluation(kinds={k: KindScore() for k in (*ERROR_KINDS, "judge")})
    for item, verdict in zip(items, verdicts, strict=True):
        where = f"{item.task_id}/{item.label}/{item.variant}"
        if verdict is not None:
            named = result.kinds.setdefault(verdict, KindScore())
            named.named += 1
            named.named_right += item.label != "clean"
        if item.label == "clean":
            result.clean += 1
            if verdict is not None:
                result.false_alarms += 1
                result.false_alarm_items.append(f"{where}: {verdict}")
            continue
        score = result.kinds[item.label]
        score.items += 1
        score.caught += verdict is not None
        if verdict is None:
            result.misses.append(where)
    return result


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def table(evaluations: dict[str, Evaluation]) -> str:
    """A markdown table: one row per kind, precision and recall per detector."""
    names = list(evaluations)
    head = "| kind | items | " + " | ".join(f"{n} precision | {n} recall" for n in names) + " |"
    rows = [head, "|" + "---|" * (2 + 2 * len(names))]
    first = evaluations[names[0]]
    for kind in (*ERROR_KINDS, "judge"):
        if kind == "judge" and not any(e.kinds[kind].named for e in evaluations.values()):
            continue
        cells = [
            f"{_pct(e.kinds[kind].precision)} | {_pct(e.kinds[kind].recall)}" for e in evaluations.values()
        ]
        rows.append(f"| {kind} | {first.kinds[kind].items or '–'} | " + " | ".join(cells) + " |")
    cells = [f"{_pct(e.precision)} | {_pct(e.recall)}" for e in evaluations.values()]
    rows.append(f"| **all errors** | {first.errors} | " + " | ".join(cells) + " |")
    alarms = [f"{e.false_alarms} flagged | –" for e in evaluations.values()]
    rows.append(f"| clean (false alarms) | {first.clean} | " + " | ".join(alarms) + " |")
    return "\n".join(rows)
