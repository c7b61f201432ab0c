"""Adversarial agents on real bundled envs, distinct tasks, and `synth tasks`' file handling."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.server import Environment, Fleet, execute, load_env
from envforge.synth import (
    SynthContext,
    Task,
    ToolShape,
    adversary_calls,
    adversary_message,
    adversary_rewards,
    build_graph,
    load_tasks,
    synthesize,
    tool_shapes,
)
from envforge.synth.checks.adversaries import counts, write_positions
from envforge.synth.task.statediff import entity_ids

from support.paths import REPO, bundled_env_dirs
from support.shop import write_shop_env

IT = REPO / "envs" / "it_tickets"


@pytest.fixture(scope="module")
def it_env() -> Environment:
    return load_env(IT)


@pytest.fixture(scope="module")
def unchecked(it_env: Environment) -> list[Task]:
    """it_tickets tasks synthesized without the adversarial checks: some the adversaries game."""
    return asyncio.run(synthesize(it_env, 40, 0, adversaries=False)).tasks


@pytest.fixture
async def ctx(it_env: Environment) -> AsyncIterator[SynthContext]:
    fleet = Fleet([it_env])
    ctx = SynthContext.create(it_env, await build_graph(it_env, fleet), fleet)
    yield ctx
    ctx.close()
    await fleet.aclose()


def shapes_of(env: Environment) -> list[ToolShape]:
    return [
        ToolShape(n, s.read_only, tuple(s.parameters), tuple(p for p in s.parameters if p in s.required))
        for n, s in env.tools.items()
    ]


def writes_of(task: Task, tools: list[ToolShape]) -> list[int]:
    return write_positions(task, {t.name for t in tools if not t.read_only})


def a_task(ctx: SynthContext, tasks: list[Task], *, writes: int = 1, outputs: bool = False) -> Task:
    """The first of `tasks` with at least `writes` writes (and required outputs)."""
    tools = tool_shapes(ctx)
    return next(
        t for t in tasks if len(writes_of(t, tools)) >= writes and (bool(t.required_outputs) or not outputs)
    )


async def run_calls(ctx: SynthContext, task: Task, calls: list) -> tuple[dict, list[str]]:  # type: ignore[type-arg]
    database, _, _ = ctx.states.task_initial(task)
    episode = await ctx.replayer.open_episode(database)
    try:
        texts = [(await execute(episode, c.name, c.arguments)).text for c in calls]
        return await episode.export(), texts
    finally:
        await ctx.replayer.close_episode(episode)


async def test_spray_makes_the_golden_calls_then_states_every_candidate(
    ctx: SynthContext, unchecked: list[Task]
) -> None:
    task = a_task(ctx, unchecked, outputs=True)
    calls = adversary_calls("spray", task, tool_shapes(ctx))
    assert calls == task.golden_calls
    _, texts = await run_calls(ctx, task, calls)
    _, initial, _ = ctx.states.task_initial(task)
    ids = entity_ids(initial, ctx.pks)
    said = adversary_message("spray", task, texts, ids)
    candidates = set(said.splitlines()[1:])
    assert {str(i) for i in range(1000)} <= candidates
    assert ids and set(ids) <= candidates
    # Every value a JSON result showed is named (a float also to cents).
    shown = [json.loads(t) for t in texts if t[:1] in "[{"]
    assert shown
    flat: list[object] = []
    stack: list[object] = list(shown)
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif v is not None and not isinstance(v, bool):
            flat.append(v)
    assert flat and all(" ".join(str(v).split()) in candidates or repr(v) in candidates for v in flat)
    assert all(f"{v:.2f}" in candidates for v in flat if isinstance(v, float))


async def test_read_all_calls_every_read_tool_it_can_fill_and_writes_nothing(
    ctx: SynthContext, unchecked: list[Task]
) -> None:
    task = a_task(ctx, unchecked, writes=1)
    tools = tool_shapes(ctx)
    calls = adversary_calls("read_all", task, tools)
    read = {t.name for t in tools if t.read_only}
    assert calls and {c.name for c in calls} <= read
    # Every read tool the golden calls use is among them, with the golden call's arguments.
    golden_reads = [c for c in task.golden_calls if c.name in read]
    assert {c.name for c in golden_reads} <= {c.name for c in calls}
    # Tools without a required parameter are always called.
    assert {t.name for t in tools if t.read_only and not t.required} <= {c.name for c in calls}
    final, texts = await run_calls(ctx, task, calls)
    _, initial, _ = ctx.states.task_initial(task)
    assert final == initial, "read_all must leave the state as it found it"
    assert sum(1 for t in texts if t[:1] in "[{") >= len(calls) // 2  # most calls found something
    # The task's state must change: reading everything earns nothing.
    rewards = await adversary_rewards(ctx, task)
    assert rewards["read_all"] == 0.0


async def test_double_write_repeats_each_golden_write_in_place(
    ctx: SynthContext, unchecked: list[Task]
) -> None:
    task = a_task(ctx, unchecked, writes=2)
    tools = tool_shapes(ctx)
    writes = writes_of(task, tools)
    calls = adversary_calls("double_write", task, tools)
    expected = [c for i, c in enumerate(task.golden_calls) for _ in range(2 if i in writes else 1)]
    assert calls == expected and len(calls) == len(task.golden_calls) + len(writes)
    rewards = await adversary_rewards(ctx, task)
    final, _ = await run_calls(ctx, task, calls)
    golden, _ = await run_calls(ctx, task, task.golden_calls)
    # Judged only when the repeats changed something: otherwise it is the golden run.
    assert (rewards["double_write"] is None) == (final == golden)


async def test_golden_prefix_stops_after_the_first_write(ctx: SynthContext, unchecked: list[Task]) -> None:
    task = a_task(ctx, unchecked, writes=2)
    tools = tool_shapes(ctx)
    first = writes_of(task, tools)[0]
    calls = adversary_calls("golden_prefix", task, tools)
    assert calls == task.golden_calls[: first + 1]
    assert counts("golden_prefix", task, tools, reached_golden=False)
    one_write = a_task(ctx, unchecked, writes=1)
    if len(writes_of(one_write, tools)) == 1:
        assert not counts("golden_prefix", one_write, tools, reached_golden=True)
    rewards = await adversary_rewards(ctx, task)
    assert rewards["golden_prefix"] is not None and rewards["golden_prefix"] < 1.0


def test_spray_is_judged_only_where_stated_outputs_are_rewarded(
    it_env: Environment, unchecked: list[Task]
) -> None:
    tasks = unchecked
    tools = shapes_of(it_env)
    with_outputs = next(t for t in tasks if t.required_outputs)
    assert counts("spray", with_outputs, tools, reached_golden=True)
    silent = with_outputs.model_copy(update={"reward_basis": ["state"]})
    assert not counts("spray", silent, tools, reached_golden=True)


def keys_of(task: Task) -> tuple[str, str]:
    """A task's two identities, computed here independently of the pipeline."""
    outputs = json.dumps(sorted(o.strip().lower() for o in task.required_outputs))
    return task.golden_cents_hash + outputs, json.dumps(
        [c.model_dump() for c in task.golden_calls], sort_keys=True
    )


def duplicates(tasks: list[Task]) -> list[str]:
    ends = Counter(keys_of(t)[0] for t in tasks)
    calls = Counter(keys_of(t)[1] for t in tasks)
    return [t.id for t in tasks if ends[keys_of(t)[0]] > 1 or calls[keys_of(t)[1]] > 1]


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
async def test_synthesis_ships_only_distinct_tasks(env_dir: Path) -> None:
    env = load_env(env_dir)
    report = await synthesize(env, 90, 3)
    assert len(report.tasks) == 90 or report.exhausted
    assert duplicates(report.tasks) == []


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
def test_bundled_tasks_are_distinct(env_dir: Path) -> None:
    assert duplicates(load_tasks(env_dir)) == []


def test_synth_tasks_stops_and_says_how_many_distinct_tasks_the_env_supports(tmp_path: Path) -> None:
    root = write_shop_env(tmp_path / "shop", lucky=False)
    # Two-call tasks: one principal's shop offers far fewer of those than 500.
    r = CliRunner().invoke(
        app,
        ["synth", "tasks", str(root), "--n", "500", "--min-calls", "2", "--max-calls", "2", "--seed", "0"],
    )
    assert r.exit_code == 0, r.output
    made = load_tasks(root)
    assert 0 < len(made) < 500 and duplicates(made) == []
    line = next(ln for ln in r.output.splitlines() if "distinct tasks" in ln)
    assert f"supports {len(made)} distinct tasks" in line
    assert "500 asked" in " ".join(r.output.split())


def test_synth_tasks_refuses_to_overwrite_writes_elsewhere_and_rejects_n_0(tmp_path: Path) -> None:
    root = tmp_path / "gym"
    shutil.copytree(REPO / "envs" / "gym", root)
    shipped = (root / "tasks.jsonl").read_bytes()
    runner = CliRunner()
    for n in ("0", "-3"):
        r = runner.invoke(app, ["synth", "tasks", str(root), "--n", n, "--force"])
        assert r.exit_code != 0 and "--n must be at least 1" in r.output
        assert len(r.output.strip().splitlines()) <= 2 and "Traceback" not in r.output
        assert (root / "tasks.jsonl").read_bytes() == shipped
    r = runner.invoke(app, ["synth", "tasks", str(root), "--n", "4"])
    assert r.exit_code != 0 and "--force" in r.output and "Traceback" not in r.output
    assert (root / "tasks.jsonl").read_bytes() == shipped
    out = tmp_path / "elsewhere" / "gym_tasks.jsonl"
    r = runner.invoke(app, ["synth", "tasks", str(root), "--n", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (root / "tasks.jsonl").read_bytes() == shipped
    assert len(out.read_text().splitlines()) == 4
    r = runner.invoke(app, ["synth", "tasks", str(root), "--n", "4", "--out", str(out)])
    assert r.exit_code != 0 and "--force" in r.output
    r = runner.invoke(app, ["synth", "tasks", str(root), "--n", "4", "--force"])
    assert r.exit_code == 0, r.output
    assert (root / "tasks.jsonl").read_bytes() == out.read_bytes()  # same seed, same bytes


@pytest.mark.parametrize("agent", ["spray", "read_all", "double_write", "golden_prefix"])
def test_adversaries_run_as_eval_agents(agent: str, tmp_path: Path, it_env: Environment) -> None:
    tasks = load_tasks(IT)[:3]
    ids = ",".join(t.id for t in tasks)
    out = tmp_path / agent
    r = CliRunner().invoke(
        app, ["eval", str(IT), "--agent", agent, "--tasks", ids, "--out", str(out), "--json"]
    )
    assert r.exit_code == 0, r.output
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == 3 and all(t["status"] == "completed" for t in trials)
    tools = shapes_of(it_env)
    for trial in trials:
        task = next(t for t in tasks if t.id == trial["task_id"])
        made = [(c["name"], c["arguments"]) for m in trial["messages"] for c in m.get("tool_calls") or []]
        planned = [(c.name, c.arguments) for c in adversary_calls(agent, task, tools)]
        assert made == planned
        said = [m["content"] for m in trial["messages"] if m["role"] == "assistant" and m.get("content")]
        if agent in ("spray", "read_all"):
            assert "\n999\n" in said[-1]
        if agent == "read_all":
            assert trial["reward"] == 0.0
