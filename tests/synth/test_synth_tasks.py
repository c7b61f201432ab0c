"""Task synthesis: executed golden states, acyclic DAGs, determinism, and self-checks that bite."""

from __future__ import annotations

import asyncio
import graphlib
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.synth_commands import register
from envforge.server import Environment, Fleet, load_env, state_hash
from envforge.synth import (
    Call,
    SynthConfig,
    SynthContext,
    Task,
    UserScenario,
    build_graph,
    cents_hash,
    diff_states,
    load_tasks,
    rewrite_problems,
    rewrite_scenario,
    synthesize,
    tasks_jsonl,
    verify_task,
)

from support.paths import REPO
from support.shop import write_shop_env

BUNDLED = ("retail_orders", "flight_booking", "it_tickets")


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    return load_env(write_shop_env(tmp_path_factory.mktemp("tasks") / "shop", lucky=False))


@pytest.fixture(scope="module")
def lucky_shop(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    return load_env(write_shop_env(tmp_path_factory.mktemp("lucky") / "shop"))


@pytest.fixture
async def ctx(shop: Environment):  # type: ignore[no-untyped-def]
    fleet = Fleet([shop])
    yield SynthContext.create(shop, await build_graph(shop, fleet), fleet)
    await fleet.aclose()


@pytest.fixture(scope="module")
def shop_tasks(shop: Environment) -> list[Task]:
    report = asyncio.run(synthesize(shop, 12, 7, SynthConfig(min_calls=2, max_calls=6)))
    assert len(report.tasks) == 12, report.discarded
    return report.tasks


def _acyclic_in_order(task: Task) -> bool:
    ids = [n.id for n in task.dag.nodes]
    sorter = graphlib.TopologicalSorter({i: set() for i in ids})
    for e in task.dag.edges:
        sorter.add(e.target, e.source)
    order = list(sorter.static_order())  # raises CycleError on a cycle
    return set(order) == set(ids) and all(ids.index(e.source) < ids.index(e.target) for e in task.dag.edges)


async def test_synthesized_tasks_pass_every_check_standalone(
    ctx: SynthContext, shop_tasks: list[Task]
) -> None:
    for task in shop_tasks:
        assert await verify_task(ctx, task) == []
        assert _acyclic_in_order(task)
        executed = [n for n in task.dag.nodes if n.kind == "call" and n.executed]
        assert [n.call for n in executed] == task.golden_calls
        assert task.difficulty.calls == len(task.golden_calls) >= 2
        assert len(task.checkpoints) == task.difficulty.writes >= 1
        assert task.golden_diff
        _, initial, _ = ctx.states.task_initial(task)
        assert (initial == ctx.env.seed_state()) == (not task.setup)


async def test_golden_state_is_the_executed_end_state(ctx: SynthContext, shop_tasks: list[Task]) -> None:
    for task in shop_tasks:
        database, initial, _ = ctx.states.task_initial(task)
        final, digest = await ctx.replayer.replay(database, task.golden_calls)
        assert digest == task.golden_hash
        assert task.golden_diff == diff_states(ctx.pks, initial, final)


async def test_same_seed_same_bytes_other_seed_other_bytes(shop: Environment, shop_tasks: list[Task]) -> None:
    again = await synthesize(shop, 12, 7, SynthConfig(min_calls=2, max_calls=6))
    assert tasks_jsonl(again.tasks) == tasks_jsonl(shop_tasks)
    other = await synthesize(shop, 12, 8, SynthConfig(min_calls=2, max_calls=6))
    assert tasks_jsonl(other.tasks) != tasks_jsonl(shop_tasks)


async def test_reasoning_nodes_decide_arguments(shop: Environment) -> None:
    report = await synthesize(shop, 30, 1, SynthConfig(min_calls=3, max_calls=6, p_reason=1.0))
    ops = {n.op for t in report.tasks for n in t.dag.nodes if n.kind == "reason"}
    assert ops & {"argmax", "argmin", "filter"}
    for task in report.tasks:
        calls = [n for n in task.dag.nodes if n.kind == "call"]
        for node in task.dag.nodes:
            if node.kind == "reason" and node.op in ("argmax", "argmin", "filter"):
                fed = [a for n in calls for a in n.args if a.node == node.id]
                assert fed and all(a.key == node.select for a in fed)
                consumer = next(n for n in calls if any(a.node == node.id for a in n.args))
                assert node.value in json.dumps(consumer.call.arguments)


def _first_write(ctx: SynthContext, task: Task) -> int:
    return next(i for i, c in enumerate(task.golden_calls) if not ctx.env.tools[c.name].read_only)


async def test_checks_catch_broken_tasks(ctx: SynthContext, shop_tasks: list[Task]) -> None:
    task = shop_tasks[0]
    wrong = task.model_copy(update={"golden_cents_hash": "0" * 64, "golden_hash": "0" * 64})
    assert "golden_replay" in await verify_task(ctx, wrong)

    i = _first_write(ctx, task)
    dropped = task.model_copy(update={"golden_calls": task.golden_calls[:i] + task.golden_calls[i + 1 :]})
    assert "golden_replay" in await verify_task(ctx, dropped)

    presatisfied = task.model_copy(update={"setup": task.golden_diff})
    assert "not_presatisfied" in await verify_task(ctx, presatisfied)

    nothing_asked = task.model_copy(update={"reward_basis": ["outputs"], "required_outputs": []})
    assert "do_nothing" in await verify_task(ctx, nothing_asked)


async def test_drop_write_catches_a_write_that_does_not_matter(ctx: SynthContext) -> None:
    """Cancelling O-1 twice: the second call is refused, so dropping the first changes nothing."""
    cancel = Call(name="cancel_order", arguments={"order_id": "O-1"})
    database, initial, _ = ctx.states.initial("", {})
    once, _ = await ctx.replayer.replay(database, [cancel])
    base = (await synthesize(ctx.env, 1, 7, SynthConfig(min_calls=2, max_calls=6), graph=ctx.graph)).tasks[0]
    twice = base.model_copy(
        update={
            "golden_calls": [cancel, cancel],
            "golden_hash": state_hash(once),
            "golden_cents_hash": cents_hash(once),
            "golden_diff": diff_states(ctx.pks, initial, once),  # the stored end state is this one too
            "setup": {},
            "required_outputs": [],
            "checkpoints": [],
        }
    )
    assert await verify_task(ctx, twice) == ["drop_write"]
    single = twice.model_copy(update={"golden_calls": [cancel]})
    assert await verify_task(ctx, single) == []


async def test_nondeterministic_tool_fails_determinism(lucky_shop: Environment) -> None:
    fleet = Fleet([lucky_shop])
    try:
        ctx = SynthContext.create(lucky_shop, await build_graph(lucky_shop, fleet), fleet)
        call = Call(name="add_lucky_note", arguments={"customer_id": "C-1"})
        database, _, _ = ctx.states.initial("", {})
        final, digest = await ctx.replayer.replay(database, [call])
        base = (await synthesize(lucky_shop, 1, 3, graph=ctx.graph)).tasks[0]
        task = base.model_copy(
            update={
                "golden_calls": [call],
                "golden_hash": digest,
                "golden_cents_hash": cents_hash(final),
                "required_outputs": [],
                "checkpoints": [],
            }
        )
        assert "deterministic" in await verify_task(ctx, task)
    finally:
        await fleet.aclose()


async def test_llm_rewrite_rewords_the_request_and_keeps_facts_and_answers_lines(
    shop_tasks: list[Task],
) -> None:
    task = next(t for t in shop_tasks if t.scenario.known_facts and t.scenario.must_be_told)
    scenario = task.scenario

    def judge(template: UserScenario, rewritten: UserScenario) -> list[str]:
        return rewrite_problems(task, rewritten, {})

    request = [
        ln for ln in scenario.instruction.splitlines() if not ln.startswith(("You know:", "Make sure"))
    ]
    kept_lines = [ln for ln in scenario.instruction.splitlines() if ln.startswith(("You know:", "Make sure"))]
    ok = await rewrite_scenario(scenario, "gpt-4o-mini", judge=judge, mock_response=request[0])
    # the answers line stays a line of its own, so agent-facing prompts still leave it out
    assert ok.proposed.splitlines()[len(request) :] == kept_lines
    if len(request) == 1:
        assert ok.problems == [] and ok.scenario.instruction_source == "llm:gpt-4o-mini"
    rejected = await rewrite_scenario(
        scenario, "gpt-4o-mini", judge=judge, mock_response="Please help me with my order."
    )
    assert rejected.problems and rejected.scenario == scenario


def test_cli_synth_check_and_score(tmp_path: Path) -> None:
    root = write_shop_env(tmp_path / "shop", lucky=False)
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    r = runner.invoke(app, ["synth", "tasks", str(root), "--n", "5", "--seed", "2", "--max-calls", "5"])
    assert r.exit_code == 0, r.output
    first = (root / "tasks.jsonl").read_bytes()
    again = ["synth", "tasks", str(root), "--n", "5", "--seed", "2", "--max-calls", "5", "--force"]
    r = runner.invoke(app, again)
    assert (root / "tasks.jsonl").read_bytes() == first
    assert "tool calls tried" in r.output
    r = runner.invoke(app, [*again, "--no-steer"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["check", str(root)]).exit_code == 0
    r = runner.invoke(app, again)
    assert (root / "tasks.jsonl").read_bytes() == first
    assert runner.invoke(app, ["check", str(root)]).exit_code == 0
    task = load_tasks(root)[0]
    actions = tmp_path / "actions.json"
    actions.write_text(
        json.dumps(
            [c.model_dump() for c in task.golden_calls] + [{"message": "; ".join(task.required_outputs)}]
        )
    )
    r = runner.invoke(app, ["score", str(root), "--task", task.id, "--actions", str(actions), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["reward"] == 1.0 and out["state_match"] is True and out["checkpoints"] == 1.0
    actions.write_text("[]")
    r = runner.invoke(app, ["score", str(root), "--task", task.id, "--actions", str(actions), "--json"])
    assert json.loads(r.stdout)["reward"] == 0.0
    # A tampered task file makes `check` fail.
    lines = (root / "tasks.jsonl").read_text().splitlines()
    bad = Task.model_validate_json(lines[0]).model_copy(update={"golden_cents_hash": "0" * 64})
    (root / "tasks.jsonl").write_text("\n".join([bad.model_dump_json(), *lines[1:]]) + "\n")
    assert runner.invoke(app, ["check", str(root)]).exit_code == 1


@pytest.mark.parametrize("name", BUNDLED)
async def test_bundled_env_ships_verified_tasks(name: str) -> None:
    root = REPO / "envs" / name
    assert (root / "tasks.jsonl").exists(), f"{name} must ship its tasks.jsonl"
    env = load_env(root)
    tasks = load_tasks(root)
    assert len(tasks) >= 50
    hard = [t for t in tasks if t.difficulty.calls >= 5 and t.difficulty.reasoning >= 1]
    assert len(hard) >= 0.2 * len(tasks)
    fleet = Fleet([env])
    try:
        ctx = SynthContext.create(env, await build_graph(env, fleet), fleet)
        for task in tasks[:5]:
            assert await verify_task(ctx, task) == [], task.id
    finally:
        await fleet.aclose()
