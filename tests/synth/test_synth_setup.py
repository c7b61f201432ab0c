"""Task-specific setup rows and untaken branches: what tasks start from, and what they could have done."""

from __future__ import annotations

import random

import pytest

from envforge.server import Environment, Fleet, export_state, load_env, open_database
from envforge.synth import (
    CHECKS,
    Call,
    SynthConfig,
    SynthContext,
    Task,
    apply_diff,
    build_graph,
    primary_keys,
    state_hashes,
    synthesize,
    task_keys,
    tasks_jsonl,
    verify_task,
)

from support.paths import REPO


@pytest.fixture
async def retail_ctx(retail_orders: Environment):  # type: ignore[no-untyped-def]
    fleet = Fleet([retail_orders])
    yield SynthContext.create(retail_orders, await build_graph(retail_orders, fleet), fleet)
    await fleet.aclose()


def _new_keys(env: Environment, task: Task) -> set[object]:
    """The keys of the setup's inserted rows (one-column keys): none of them is in the seed."""
    seed = env.seed_state()
    pks = primary_keys(env.tables)
    keys = set()
    for table, d in task.setup.items():
        if len(pks[table]) == 1:
            (pk,) = pks[table]
            for row in d.inserted:
                assert all(r[pk] != row[pk] for r in seed[table]), row
                keys.add(row[pk])
    return keys


def test_next_key_continues_the_numbering() -> None:
    from envforge.synth.walk.setup import next_key

    assert next_key(["O-5009", "O-5064", "O-5010"], set()) == "O-5065"
    assert next_key(["A-007", "A-010"], {"A-011"}) == "A-012"  # zero-padding kept, taken skipped
    assert next_key([3, 9, 4], {10}) == 11
    assert next_key(["O-1", "X-2"], set()) is None  # two prefixes: not numbered alike
    assert next_key(["abc"], set()) is None


async def test_setup_tasks_act_on_a_fresh_entity_from_a_schema_valid_state(
    retail_orders: Environment, retail_ctx: SynthContext
) -> None:
    report = await synthesize(retail_orders, 4, 11, SynthConfig(p_setup=1.0), graph=retail_ctx.graph)
    assert len(report.tasks) == 4, report.discarded
    seed = retail_orders.seed_state()
    pks = primary_keys(retail_orders.tables)
    for task in report.tasks:
        assert task.setup and all(not d.deleted and not d.updated for d in task.setup.values())
        keys = _new_keys(retail_orders, task)
        # The walk acts on the new entity: a successful write takes its key.
        writes = [n.call for n in task.dag.nodes if n.kind == "call" and n.write and n.executed]
        values = [
            v
            for c in writes
            for arg in c.arguments.values()
            for v in (arg if isinstance(arg, list) else [arg])
        ]
        assert keys & set(values), (task.id, keys)
        # The setup state is one the schema accepts (CHECKs, foreign keys: the loader checks them)
        # and the one every consumer rebuilds: seed plus setup, as the harness does it.
        initial = apply_diff(pks, seed, task.setup)
        conn = open_database(retail_orders.database_from_state(initial))
        try:
            rebuilt = export_state(conn, retail_orders.tables, retail_orders.manifest.volatile_columns)
        finally:
            conn.close()
        assert rebuilt == initial and state_hashes(rebuilt) == state_hashes(initial)
        _, state, _ = retail_ctx.states.task_initial(task)
        assert state == initial and state_hashes(state) == state_hashes(initial)
        assert await verify_task(retail_ctx, task) == []
        # The setup matters: from the bare seed the same calls do not reach the golden state.
        bare = task.model_copy(update={"setup": {}})
        assert "golden_replay" in await verify_task(retail_ctx, bare)


async def test_setups_come_from_the_task_seed_and_leave_other_tasks_alone(unlucky_shop: Environment) -> None:
    graph = await build_graph(unlucky_shop)
    steered = SynthConfig(min_calls=2, max_calls=5, p_setup=0.5)
    first = await synthesize(unlucky_shop, 12, 4, steered, graph=graph)
    again = await synthesize(unlucky_shop, 12, 4, steered, graph=graph)
    assert tasks_jsonl(again.tasks) == tasks_jsonl(first.tasks)
    assert any(t.setup for t in first.tasks)
    # Steered walks learn from the attempts before them, setups included; unsteered, a task
    # without a setup is exactly the task that a run without setups builds.
    cfg = SynthConfig(min_calls=2, max_calls=5, p_setup=0.5, steer=False)
    with_setups = await synthesize(unlucky_shop, 12, 4, cfg, graph=graph)
    assert any(t.setup for t in with_setups.tasks)
    no_setup = SynthConfig(min_calls=2, max_calls=5, p_setup=0.0, steer=False)
    without = await synthesize(unlucky_shop, 30, 4, no_setup, graph=graph)
    # Shipped ids count shipped tasks; the attempt that built a task is its seed.
    by_seed = {t.seed: t for t in without.tasks}
    plain = [t for t in with_setups.tasks if not t.setup]
    same = [by_seed[t.seed].model_copy(update={"id": t.id}) == t for t in plain if t.seed in by_seed]
    assert plain and same and all(same)
    # A plain task that run left out is one it had shipped already (its twin came first there).
    shipped = {key for t in without.tasks for key in task_keys(t)}
    assert all(set(task_keys(t)) & shipped for t in plain if t.seed not in by_seed)


async def test_a_copy_that_breaks_a_unique_constraint_is_not_a_setup() -> None:
    env = load_env(REPO / "envs" / "it_tickets")
    fleet = Fleet([env])
    try:
        ctx = SynthContext.create(env, await build_graph(env, fleet), fleet)
        planner = ctx.setups
        from envforge.synth.walk.setup import _insert

        employee = env.seed_state()["employees"][-1]
        clone = planner._clone("employees", employee)
        assert clone is not None  # a new key, but the same (UNIQUE) email
        assert _insert(env, planner.pks, planner.pool, clone[0]) is None
        for seed in range(20):
            setup = planner.fresh_entity(random.Random(seed))
            assert setup is not None and setup.fresh.table != "employees"
    finally:
        await fleet.aclose()


async def test_untaken_branches_are_run_and_broken_ones_rejected() -> None:
    # flight_booking's bundled run (seed 0) branches once: between two writes a member may ask
    # for (car_rental's branches, rent or send to maintenance, cast a customer as staff).
    env = load_env(REPO / "envs" / "flight_booking")
    fleet = Fleet([env])
    try:
        graph = await build_graph(env, fleet)
        ctx = SynthContext.create(env, graph, fleet)
        report = await synthesize(env, 60, 0, graph=graph)
        task = next(
            t for t in report.tasks if any(n.kind == "reason" and n.op == "branch" for n in t.dag.nodes)
        )
        assert await verify_task(ctx, task) == []
        assert report.discarded["check:untaken_branch"] == 0  # the builder checks before branching

        branch = next(n for n in task.dag.nodes if n.kind == "reason" and n.op == "branch")
        untaken_id = branch.else_node if branch.value else branch.then_node
        untaken = task.dag.node(untaken_id)
        assert untaken.kind == "call" and not untaken.executed

        def with_untaken(**update: object) -> Task:
            nodes = [n.model_copy(update=update) if n.id == untaken_id else n for n in task.dag.nodes]
            return task.model_copy(update={"dag": task.dag.model_copy(update={"nodes": nodes})})

        # Arguments naming nothing that exists: the call would have been refused.
        nowhere = {p: "no-such-id" if isinstance(v, str) else v for p, v in untaken.call.arguments.items()}
        broken = with_untaken(call=Call(name=untaken.call.name, arguments=nowhere))
        assert await verify_task(ctx, broken) == ["untaken_branch"]
        # Marked to be refused, a call that would succeed fails the check too.
        assert await verify_task(ctx, with_untaken(expect_error=True)) == ["untaken_branch"]
        # A branch whose other call is missing cannot be shown to work.
        dangling = task.model_copy(
            update={
                "dag": task.dag.model_copy(
                    update={"nodes": [n for n in task.dag.nodes if n.id != untaken_id]}
                )
            }
        )
        assert "untaken_branch" in await verify_task(ctx, dangling)
        assert "untaken_branch" in CHECKS
    finally:
        await fleet.aclose()
