"""`envforge train` / `envforge collect` on the bandit env with a tiny local model: outputs are written."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import typer
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.server import Fleet, load_env
from envforge.trainer import bandit_corpus, bandit_tasks, build_tiny_model, write_bandit_env


async def _setup(tmp_path: Path) -> tuple[Path, Path]:
    env_dir = write_bandit_env(tmp_path)
    fleet = Fleet([load_env(env_dir)])
    tasks = await bandit_tasks(fleet, "bandit", n=3)
    (env_dir / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    model = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False)
    return env_dir, model


def _app() -> typer.Typer:
    app = typer.Typer()
    trainer_commands.register(app)
    return app


def test_train_and_collect_write_outputs(tmp_path: Path) -> None:
    env_dir, model = anyio.run(_setup, tmp_path)
    out = tmp_path / "run"
    common = ["--model", str(model), "--envs", str(env_dir), "--env-kind", "fleet", "--max-turns", "1"]
    common += ["--max-new-tokens", "1"]
    res = CliRunner().invoke(
        _app(),
        [
            "train",
            *common,
            "--steps",
            "3",
            "--tasks-per-step",
            "2",
            "--rollouts-per-task",
            "3",
            "--staleness",
            "1",
            "--out",
            str(out),
            "--lr",
            "0.01",
            "--save-trajectories",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["per_env"]["bandit"]["groups"] == 2 and r["staleness_max"] <= 1 for r in rows)
    assert (out / "checkpoints" / "step_3" / "config.json").exists()
    assert (out / "checkpoints" / "step_3" / "tokenizer.json").exists()
    plots = sorted(p.stem for p in (out / "plots").iterdir())
    assert plots == ["masked_fraction", "reward", "staleness"]
    assert (out / "plots" / "reward.png").exists() or "<svg" in (out / "plots" / "reward.svg").read_text()
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 3 * 2 * 3

    cout = tmp_path / "collect"
    res = CliRunner().invoke(
        _app(), ["collect", *common, "--groups", "2", "--rollouts-per-task", "2", "--out", str(cout)]
    )
    assert res.exit_code == 0, res.output
    trajs = [json.loads(line) for line in (cout / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 and all(sum(t["loss_mask"]) == 1 for t in trajs)


def test_train_refuses_one_task_per_step(tmp_path: Path) -> None:
    env_dir, model = anyio.run(_setup, tmp_path)
    res = CliRunner().invoke(
        _app(),
        [
            "train",
            "--model",
            str(model),
            "--envs",
            str(env_dir),
            "--steps",
            "1",
            "--tasks-per-step",
            "1",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert res.exit_code == 2
    assert "tasks-per-step" in res.output
