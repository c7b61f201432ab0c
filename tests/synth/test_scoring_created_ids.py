"""The state part up to the ids of created rows: the same rows made in another order score as made
in the golden order, and nothing else does.

Tools name a new row after the last one (`MAX(id) + 1`), so two independent bookings made the
other way round, or a list argument's items given in another order, swap ids with each other.
Each test plays real calls on a bundled task's initial state and scores the end state through the
real scorer, or through `envforge score`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.server import Fleet, State, load_env
from envforge.synth import (
    Call,
    SynthContext,
    TableDiff,
    Task,
    build_graph,
    load_graph,
    load_tasks,
    matches_up_to_created_ids,
    oracle_messages,
    primary_keys,
    score_episode,
)

from support.paths import REPO

GYM = REPO / "envs" / "gym"
RETAIL = REPO / "envs" / "retail_orders"


def two_bookings() -> Task:
    """The first bundled gym task whose third and fourth calls book two classes."""
    return next(t for t in load_tasks(GYM) if [c.name for c in t.golden_calls[2:4]] == ["book_class"] * 2)


def order_of_several_variants() -> Task:
    """The first bundled retail_orders task that places an order of several variants."""
    return next(
        t
        for t in load_tasks(RETAIL)
        if any(len(c.arguments.get("variant_ids", [])) > 1 for c in t.golden_calls)
    )


async def end_state(env_dir: Path, task: Task, calls: list[Call]) -> tuple[State, list[str]]:
    """Every call (reads too) on the task's initial state: the end state, each call's result."""
    env = load_env(env_dir)
    fleet = Fleet([env])
    try:
        graph = load_graph(env_dir) or await build_graph(env, fleet)
        ctx = SynthContext.create(env, graph, fleet)
        database, _, _ = ctx.states.task_initial(task)
        state, texts = await ctx.replayer.run_all(database, calls)
        assert state is not None
        return state, texts
    finally:
        await fleet.aclose()


def reward(env_dir: Path, task: Task, calls: list[Call]) -> tuple[float, list[str]]:
    state, texts = anyio.run(end_state, env_dir, task, calls)
    keys = primary_keys(load_env(env_dir).tables)
    score = score_episode(task, state, oracle_messages(task), shown_messages=texts, keys=keys)
    return score.reward, texts


def test_two_independent_bookings_in_the_other_order_score_as_in_the_golden_one() -> None:
    task = two_bookings()
    golden = list(task.golden_calls)
    swapped = [*golden[:2], golden[3], golden[2], *golden[4:]]
    assert [c.name for c in golden[2:4]] == ["book_class", "book_class"]
    assert reward(GYM, task, golden)[0] == 1.0
    value, texts = reward(GYM, task, swapped)
    assert value == 1.0, texts
    # booking one of them twice instead of both is no renaming of the golden rows
    assert reward(GYM, task, [*golden[:2], golden[3], golden[3], *golden[4:]])[0] == 0.0


def match(final: State, golden: State, inserted: dict[str, list[dict[str, Any]]]) -> bool:
    diff = {t: TableDiff(inserted=rows) for t, rows in inserted.items()}
    keys = {"orders": ("order_id",), "items": ("item_id",), "counts": ("n",)}
    return matches_up_to_created_ids(final, diff, keys, lambda s: s == golden)


def test_only_a_renaming_of_created_rows_matches() -> None:
    """The attacks on the renaming itself: it pairs created rows of the same fields only, renames
    every reference with them, and leaves integer keys and rows it did not create alone."""
    o1, o2 = {"order_id": "O-1", "customer": "C-1"}, {"order_id": "O-2", "customer": "C-2"}
    i1, i2 = (
        {"item_id": "I-1", "order_id": "O-1", "sku": "A"},
        {"item_id": "I-2", "order_id": "O-2", "sku": "B"},
    )
    golden = {"orders": [o1, o2], "items": [i1, i2]}
    inserted = {"orders": [o1, o2], "items": [i1, i2]}
    swapped = {  # C-2's order made first: it is O-1 now, and holds B
        "orders": [{"order_id": "O-1", "customer": "C-2"}, {"order_id": "O-2", "customer": "C-1"}],
        "items": [
            {"item_id": "I-1", "order_id": "O-1", "sku": "B"},
            {"item_id": "I-2", "order_id": "O-2", "sku": "A"},
        ],
    }
    assert match(swapped, golden, inserted)
    # the items follow the wrong orders: C-1's order holds B
    crossed = {
        "orders": swapped["orders"],
        "items": [
            {"item_id": "I-1", "order_id": "O-2", "sku": "B"},
            {"item_id": "I-2", "order_id": "O-1", "sku": "A"},
        ],
    }
    assert not match(crossed, golden, inserted)
    # a field that differs is no renaming
    assert not match(
        {**swapped, "orders": [{**swapped["orders"][0], "customer": "C-3"}, swapped["orders"][1]]},
        golden,
        inserted,
    )
    # an extra created row, or one missing
    assert not match({**swapped, "items": swapped["items"][:1]}, golden, inserted)
    # integer keys are never renamed (a renamed 2 could be a count)
    assert not match(
        {"counts": [{"n": 2, "v": "x"}, {"n": 1, "v": "y"}]},
        {"counts": [{"n": 1, "v": "x"}, {"n": 2, "v": "y"}]},
        {"counts": [{"n": 1, "v": "x"}, {"n": 2, "v": "y"}]},
    )


def test_an_order_with_its_items_listed_the_other_way_round_scores_in_full() -> None:
    task = order_of_several_variants()
    place = next(i for i, c in enumerate(task.golden_calls) if len(c.arguments.get("variant_ids", [])) > 1)
    calls = list(task.golden_calls)
    args: dict[str, Any] = dict(calls[place].arguments)
    args["variant_ids"] = list(reversed(args["variant_ids"]))
    calls[place] = calls[place].model_copy(update={"arguments": args})
    assert reward(RETAIL, task, calls)[0] == 1.0
    # one variant swapped for another the order does not hold is a different order
    args["variant_ids"] = [args["variant_ids"][0], args["variant_ids"][0]]
    calls[place] = calls[place].model_copy(update={"arguments": args})
    assert reward(RETAIL, task, calls)[0] == 0.0


def test_envforge_score_renames_created_ids_too(tmp_path: Path) -> None:
    task = two_bookings()
    golden = [c.model_dump() for c in task.golden_calls]
    swapped = [*golden[:2], golden[3], golden[2], *golden[4:]]
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps([*swapped, *({"message": m} for m in oracle_messages(task))]))
    result = CliRunner().invoke(
        app, ["score", str(GYM), "--task", task.id, "--actions", str(actions), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["state_match"] is True


def test_alike_rows_are_told_apart_by_what_refers_to_them() -> None:
    """Nine orders alike but for their items, made in the reverse order: more orders than any
    search through their orderings would try, yet each item singles out its order."""
    keys = {"orders": ("order_id",), "items": ("item_id",)}

    def state(reverse: bool) -> State:
        orders = [{"order_id": f"O-{i}", "status": "placed"} for i in range(1, 10)]
        items = [
            {"item_id": f"I-{i}", "order_id": f"O-{10 - i if reverse else i}", "variant": f"V-{i}"}
            for i in range(1, 10)
        ]
        return {"orders": orders, "items": items}

    golden, final = state(False), state(True)
    diff = {t: TableDiff(inserted=rows) for t, rows in golden.items()}
    assert matches_up_to_created_ids(final, diff, keys, lambda s: s == golden)
    wrong = {**final, "items": [{**final["items"][0], "variant": "V-0"}, *final["items"][1:]]}
    assert not matches_up_to_created_ids(wrong, diff, keys, lambda s: s == golden)
