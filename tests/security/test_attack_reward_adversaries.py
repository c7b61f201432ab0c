"""Attacks on rewards that cheap tricks earn in full, and the adversarial checks that stop them.

Each test plays the trick itself (through `envforge score` or the scorer, never through the code
under test), then shows `envforge check` failing the gamed task, naming the adversary and showing
its best reward, and `synth tasks` never shipping such a task.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import shutil
from pathlib import Path

from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.server import Fleet, load_env
from envforge.synth import SynthContext, Task, build_graph, load_tasks, score_episode, synthesize, write_tasks

from support.paths import REPO

IT = REPO / "envs" / "it_tickets"
NUMBERS = " ".join(str(i) for i in range(1000))


@functools.cache
def unchecked() -> list[Task]:
    """it_tickets tasks synthesized without the adversarial checks, as a careless generator would
    ship them."""
    return asyncio.run(synthesize(load_env(IT), 40, 0, adversaries=False)).tasks


def env_with(tmp_path: Path, tasks: list[Task]) -> Path:
    """A copy of it_tickets shipping exactly `tasks`."""
    root = tmp_path / "it_tickets"
    shutil.copytree(IT, root)
    write_tasks(tasks, root)
    return root


def score_cli(root: Path, task: Task, actions: list[dict], tmp_path: Path) -> float:  # type: ignore[type-arg]
    path = tmp_path / "actions.json"
    path.write_text(json.dumps(actions))
    r = CliRunner().invoke(app, ["score", str(root), "--task", task.id, "--actions", str(path), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["reward"]


def adversary_row(output: str, name: str) -> list[str]:
    """The cells of adversary `name`'s row in `check`'s adversarial table."""
    line = next(ln for ln in output.splitlines() if re.search(rf"│ {name}\s+│", ln))
    return [c.strip() for c in line.strip("│ ").split("│")]


def test_attack_number_spray_after_the_golden_calls(tmp_path: Path) -> None:
    """A required output of one or two digits: saying every number from 0 to 999 after the golden
    calls must not pass `check` wherever the scorer pays for it."""
    task = next(
        t
        for t in unchecked()
        if "outputs" in t.reward_basis
        and t.required_outputs
        and all(len(o) <= 2 and o.isdigit() for o in t.required_outputs)
    )
    root = env_with(tmp_path, [task])
    attack = [c.model_dump() for c in task.golden_calls] + [{"message": f"The answer is one of {NUMBERS}."}]
    gamed = score_cli(root, task, attack, tmp_path) == 1.0
    r = CliRunner().invoke(app, ["check", str(root)])
    row = adversary_row(r.output, "spray")
    if gamed:  # the substring scorer pays the spray: the check must catch it
        assert r.exit_code == 1, r.output
        assert "adversary:spray" in " ".join(r.output.split())
        assert row[1:] == ["1", "1.00", "1"]
    else:  # a scorer that refuses several candidates: nothing to catch
        assert "adversary:spray" not in r.output and row[2] != "1.00"
    # The same adversary is an eval agent: probing the task set gives the reward the check saw.
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["eval", str(root), "--agent", "spray", "--out", str(out)])
    (trial,) = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert trial["status"] == "completed" and trial["reward"] == float(row[2])


def test_attack_duplicate_ticket_under_a_checkpoint_only_reward(tmp_path: Path) -> None:
    """A reward made of checkpoints alone looks up the rows the golden writes made: opening the
    same ticket twice leaves them in place, plus a duplicate nobody checks."""
    base = next(
        t
        for t in unchecked()
        if [c.name for c in t.golden_calls].count("create_ticket") == 1 and t.checkpoints
    )
    task = base.model_copy(update={"reward_basis": ["checkpoints"]})
    root = env_with(tmp_path, [task])
    twice = [c.model_dump() for c in task.golden_calls for _ in range(2 if c.name == "create_ticket" else 1)]
    assert score_cli(root, task, twice, tmp_path) == 1.0, "the attack itself must earn full reward"
    r = CliRunner().invoke(app, ["check", str(root)])
    text = " ".join(r.output.split())
    assert r.exit_code == 1, r.output
    assert "adversary:double_write" in text
    assert adversary_row(r.output, "double_write")[2:] == ["1.00", "1"]
    # The self-checks alone pass it: only the adversary sees the hole.
    for check in ("golden_replay", "do_nothing", "drop_write", "not_presatisfied", "deterministic"):
        assert re.search(rf"│ {check}\s+│\s+1 │\s+0 │", r.output), check


def test_attack_number_spray_finds_no_shipped_task(tmp_path: Path) -> None:
    """Whatever `synth tasks` ships, the golden calls followed by every number from 0 to 999 earn
    less than full reward on each task whose reward rests on stated outputs."""
    root = tmp_path / "it_tickets"
    shutil.copytree(IT, root)
    r = CliRunner().invoke(app, ["synth", "tasks", str(root), "--n", "30", "--seed", "5", "--force"])
    assert r.exit_code == 0, r.output
    tasks = load_tasks(root)
    assert len(tasks) == 30
    assert asyncio.run(sprayed(root, tasks)) == []
    assert CliRunner().invoke(app, ["check", str(root)]).exit_code == 0


async def sprayed(root: Path, tasks: list[Task]) -> list[str]:
    """The tasks that the golden calls plus every number from 0 to 999 pass."""
    env = load_env(root)
    fleet = Fleet([env])
    gamed = []
    try:
        ctx = SynthContext.create(env, await build_graph(env, fleet), fleet)
        for task in tasks:
            if "outputs" not in task.reward_basis or not task.required_outputs:
                continue
            database, _, _ = ctx.states.task_initial(task)
            final, _ = await ctx.replayer.replay(database, task.golden_calls, hashed=False)
            if score_episode(task, final, [f"It is one of {NUMBERS}."]).reward == 1.0:
                gamed.append(task.id)
    finally:
        await fleet.aclose()
    return gamed
