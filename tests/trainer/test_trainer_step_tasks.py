"""`--tasks steps` and `lookup+steps`: the bundled tasks of 2-3 calls with one write, and lookups beside them.

The set is each env's own `tasks.jsonl` filtered (never a second file), split by the task-id hash
the lookups use. With both sets, an env's step tasks are an env of their own for ERPO (`gym/steps`),
since their reward spread is not the lookups'. Writes need the simulated user: the single-turn env
is refused with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import typer
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.harness import request_text
from envforge.server import Fleet, load_env
from envforge.synth import Task, load_tasks, tasks_jsonl
from envforge.trainer import (
    build_tiny_model,
    held_out,
    pair_tasks,
    split_steps,
    step_tasks,
    told_tasks,
)

from support.paths import REPO
from support.scripted_policy import play_scripted

GYM = REPO / "envs" / "gym"
PHARMACY = REPO / "envs" / "pharmacy"  # synthesizes its told set in ~1 s (gym: ~10 s)


def test_step_tasks_are_the_envs_own_short_writes_split_by_id() -> None:
    tasks = load_tasks(GYM)
    short = step_tasks(tasks)
    assert short and all(2 <= t.difficulty.calls <= 3 and t.difficulty.writes == 1 for t in short)
    assert [t.id for t in short] == [t.id for t in tasks if t in short]  # file order, nothing else
    train, held = split_steps(short)
    assert train and held and {t.id for t in held} == {t.id for t in short if held_out(t.id)}
    assert not {t.id for t in train} & {t.id for t in held}


def _app() -> typer.Typer:
    app = typer.Typer()
    trainer_commands.register(app)
    return app


@pytest.mark.parametrize("kind", ["steps", "told", "pair"])
def test_lookups_and_step_tasks_train_as_two_envs(tmp_path: Path, kind: str) -> None:
    env_dir = GYM if kind == "steps" else PHARMACY
    name = env_dir.name
    model = build_tiny_model(tmp_path / "model", ["get_member", "member_id", "The answer is"])
    out = tmp_path / "run"
    args = ["train", "--model", str(model), "--envs", str(env_dir), "--tasks", f"lookup+{kind}", "--no-mcp"]
    args += ["--steps", "1", "--tasks-per-step", "4", "--rollouts-per-task", "2", "--max-turns", "2"]
    args += ["--max-new-tokens", "3", "--staleness", "0", "--save-trajectories", "--out", str(out)]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert sorted(step["per_env"]) == [name, f"{name}/{kind}"]
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    steps = {t["task_id"] for t in trajs if t["env"] == f"{name}/{kind}"}
    made = (
        step_tasks(load_tasks(GYM))
        if kind == "steps"
        else anyio.run(told_tasks if kind == "told" else pair_tasks, load_env(PHARMACY), 0)
    )
    assert steps and steps <= {t.id for t in made}
    assert json.loads((out / "run.json").read_text())["ran"]["env_kind"] == "harness"


@pytest.mark.parametrize("kind", ["steps", "told", "pair", "lookup+pair"])
def test_step_tasks_refuse_the_single_turn_env(tmp_path: Path, kind: str) -> None:
    """A write played single-turn has no user to give its facts or its yes: refused in one line."""
    (tmp_path / "config.json").write_text("{}")
    args = ["train", "--model", str(tmp_path), "--envs", str(GYM), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(_app(), [*args, "--tasks", kind, "--env-kind", "fleet"])
    assert res.exit_code != 0 and "--env-kind harness" in res.output and "Traceback" not in res.output


def test_told_tasks_are_synthesized_from_the_seed_with_the_facts_in_the_request() -> None:
    """`--tasks told`: the same seed gives the same tasks byte for byte, another seed others; each
    is 2-3 calls with one write, and its user says every fact in the opening instead of waiting to
    be asked (the packaged model never asks: it guesses an id and repeats the failing write)."""
    env = load_env(PHARMACY)
    tasks = anyio.run(told_tasks, env, 0)
    assert tasks_jsonl(tasks) == tasks_jsonl(anyio.run(told_tasks, env, 0))
    assert tasks_jsonl(tasks) != tasks_jsonl(anyio.run(told_tasks, env, 1))
    assert len(tasks) >= 10 and all(t.id.endswith("-told") for t in tasks)
    assert all(2 <= t.difficulty.calls <= 3 and t.difficulty.writes == 1 for t in tasks)
    for t in tasks:
        opening = request_text(t)
        assert t.scenario.known_facts and "only when asked" not in t.scenario.instruction
        assert all(f"My {f.name.replace('_', ' ')} is {f.value}." in opening for f in t.scenario.known_facts)
    train, held = split_steps(tasks)
    assert len(train) >= 2 and held


def test_pair_tasks_are_one_read_then_the_write_with_the_facts_told() -> None:
    """`--tasks pair`: the told set cut to two calls, a read-only tool and then the write, so no
    read the policy asks for comes after the write (the packaged model's failure on the 2-3-call
    set); same seed, same bytes; enough of them on each side of the split to train and evaluate."""
    env = load_env(PHARMACY)
    tasks = anyio.run(pair_tasks, env, 0)
    assert tasks_jsonl(tasks) == tasks_jsonl(anyio.run(pair_tasks, env, 0))  # the seed: `told_tasks`' test
    assert len(tasks) >= 10 and all(t.id.endswith("-told") for t in tasks)
    for t in tasks:
        read, write = t.golden_calls  # exactly two
        assert env.tools[read.name].read_only and not env.tools[write.name].read_only
        assert t.difficulty.writes == 1
        assert all(
            f"My {f.name.replace('_', ' ')} is {f.value}." in request_text(t) for f in t.scenario.known_facts
        )
    train, held = split_steps(tasks)
    assert len(train) >= 2 and held


def replay(task: Task | None, turn: int) -> str:
    """Each golden call, one a turn, then a report with the task's outputs."""
    assert task is not None
    calls = task.golden_calls
    if turn < len(calls):
        return f"{calls[turn].name} {json.dumps(calls[turn].arguments)}"
    return " ".join(["Done: it is all set.", *task.required_outputs])


async def _four_told(fleet: Fleet) -> list[Task]:
    return (await told_tasks(fleet.env("pharmacy"), 0))[:4]


async def _four_pairs(fleet: Fleet) -> list[Task]:
    return (await pair_tasks(fleet.env("pharmacy"), 0))[:4]


@pytest.mark.parametrize("four", [_four_told, _four_pairs])
def test_a_told_task_solved_is_paid_and_its_opening_is_no_user_error(four) -> None:
    """The facts in the opening are the user's own, not a leak nor an invented fact: the golden
    calls and a report earn 1 and the detector flags nothing."""
    solved = anyio.run(
        lambda: play_scripted(PHARMACY, four, replay, groups=4, rollouts_per_task=1, max_turns=5)
    )
    assert [t.reward for t in solved] == [1.0] * 4, [(t.parts, t.user_error_reason) for t in solved]
    assert not any(t.user_error for t in solved), [t.user_error_reason for t in solved]
