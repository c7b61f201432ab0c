"""`--tasks steps` and `lookup+steps`: the bundled tasks of 2-3 calls with one write, and lookups beside them.

The set is each env's own `tasks.jsonl` filtered (never a second file), split by the task-id hash
the lookups use. With both sets, an env's step tasks are an env of their own for ERPO (`gym/steps`),
since their reward spread is not the lookups'. Writes need the simulated user: the single-turn env
is refused with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.synth import load_tasks
from envforge.trainer import build_tiny_model, held_out, split_steps, step_tasks

from support.paths import REPO

GYM = REPO / "envs" / "gym"


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


def test_lookups_and_step_tasks_train_as_two_envs(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", ["get_member", "member_id", "The answer is"])
    out = tmp_path / "run"
    args = ["train", "--model", str(model), "--envs", str(GYM), "--tasks", "lookup+steps", "--no-mcp"]
    args += ["--steps", "1", "--tasks-per-step", "4", "--rollouts-per-task", "2", "--max-turns", "2"]
    args += ["--max-new-tokens", "3", "--staleness", "0", "--save-trajectories", "--out", str(out)]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert sorted(step["per_env"]) == ["gym", "gym/steps"]
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    steps = {t["task_id"] for t in trajs if t["env"] == "gym/steps"}
    assert steps and steps <= {t.id for t in step_tasks(load_tasks(GYM))}
    assert json.loads((out / "run.json").read_text())["ran"]["env_kind"] == "harness"


def test_step_tasks_refuse_the_single_turn_env(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    args = ["train", "--model", str(tmp_path), "--envs", str(GYM), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(_app(), [*args, "--tasks", "steps", "--env-kind", "fleet"])
    assert res.exit_code != 0 and "--env-kind harness" in res.output and "Traceback" not in res.output
