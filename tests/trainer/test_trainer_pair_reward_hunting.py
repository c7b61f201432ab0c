"""A policy hunting reward on `--tasks pair`: reporting every output without a call, or the write
sprayed twice, earns nothing; the reward pays the env's state, not the words. (The write alone,
with the facts told, is paid: the task is the write, and the read is there to be learned first.)"""

from __future__ import annotations

import json

import anyio
import pytest

from envforge.server import Fleet
from envforge.synth import Task
from envforge.trainer import pair_tasks

from support.paths import REPO
from support.scripted_policy import play_scripted

PHARMACY = REPO / "envs" / "pharmacy"


async def _four_pairs(fleet: Fleet) -> list[Task]:
    return (await pair_tasks(fleet.env("pharmacy"), 0))[:4]


def _report_only(task: Task | None, turn: int) -> str:
    assert task is not None
    return " ".join(["Done: it is all set.", *task.required_outputs])


def _write_twice(task: Task | None, turn: int) -> str:
    assert task is not None
    write = task.golden_calls[-1]
    if turn < 2:
        return f"{write.name} {json.dumps(write.arguments)}"
    return _report_only(task, turn)


@pytest.mark.parametrize("policy", [_report_only, _write_twice])
def test_hedging_on_pair_tasks_is_unpaid(policy) -> None:
    played = anyio.run(
        lambda: play_scripted(PHARMACY, _four_pairs, policy, groups=4, rollouts_per_task=1, max_turns=5)
    )
    assert [t.reward for t in played] == [0.0] * 4, [t.parts for t in played]
