"""Steered walks: what earlier attempts learned about which calls work, and arguments that fit.

Synthesis spends most of its time on calls that fail (a flown reservation cannot be upgraded, a
delivered order cannot be changed). These tests hold the remedies to what they claim, on the
bundled envs: fewer failed calls per verified task, the same bytes for the same seed, and no call
refused for an argument the schema rules out.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import Any

import pytest

from envforge.server import Fleet, ToolResult, load_env
from envforge.synth import (
    BuildFailed,
    Call,
    ParamDomain,
    SynthConfig,
    SynthContext,
    build_graph,
    build_task,
    synthesize,
    tasks_jsonl,
    verify_task,
)
from envforge.synth.graph.domains import accepts, weighted_choice
from envforge.synth.walk.outcomes import COVERAGE_SPAN, FLOOR, Outcomes, Tally
from envforge.synth.walk.replayer import Replayer

from support.paths import REPO


@pytest.fixture(autouse=True)
def _quiet_runtime() -> None:
    logging.getLogger("envforge.server.runtime").setLevel(logging.CRITICAL)


def test_a_tally_halves_on_a_failure_and_keeps_a_floor() -> None:
    tally = Tally()
    assert tally.weight("upgrade") == 1.0
    tally.add("upgrade", False)
    assert tally.weight("upgrade") == 0.5
    tally.add("upgrade", True)
    assert tally.weight("upgrade") == pytest.approx(2 / 3)
    for _ in range(1000):
        tally.add("change", False)
    assert tally.weight("change") == FLOOR
    frozen = Tally(learn=False)
    frozen.add("upgrade", False)
    assert frozen.weight("upgrade") == 1.0


def test_values_are_tallied_across_writes_and_per_read_tool() -> None:
    outcomes = Outcomes()
    outcomes.record("upgrade_cabin", False, {"reservation_id": "R-1", "cabin": "business"}, ok=False)
    # A flown reservation refused by one write is less promising for every write...
    assert outcomes.value_weight("cancel_reservation", False, "reservation_id", "R-1") == 0.5
    assert outcomes.weigh_for_writes("reservation_id", "R-1") == 0.5
    # ...but a read's success does not vouch for it, and 1, 1.0 and True stay apart.
    outcomes.record("get_reservation", True, {"reservation_id": "R-1"}, ok=True)
    assert outcomes.weigh_for_writes("reservation_id", "R-1") == 0.5
    assert outcomes.value_weight("get_reservation", True, "reservation_id", "R-1") == 1.0
    outcomes.record("add_bags", False, {"bags": 1}, ok=False)
    assert outcomes.weigh_for_writes("bags", True) == 1.0
    assert outcomes.weigh_for_writes("bags", 1.0) == 1.0
    assert (outcomes.calls, outcomes.failed) == (3, 2)


def test_a_refusal_blames_the_values_it_names() -> None:
    outcomes = Outcomes()
    args = {"member_id": "M-1020", "reservation_id": "R-5032", "cabin": "business"}
    outcomes.record("upgrade_cabin", False, args, ok=False, error="Error: member M-1020 is suspended")
    assert outcomes.weigh_for_writes("member_id", "M-1020") == 0.5
    assert outcomes.weigh_for_writes("reservation_id", "R-5032") == 1.0  # not named: not blamed
    outcomes.record("upgrade_cabin", False, args, ok=False, error="Error: no seats left")
    assert outcomes.weigh_for_writes("reservation_id", "R-5032") == 0.5  # nothing named: all blamed


def test_coverage_favours_write_tools_that_ship_less() -> None:
    outcomes = Outcomes()
    tools = ["cancel_order", "change_order", "place_order"]
    for _ in range(10):
        outcomes.record_task(tools, ["place_order"])
    for _ in range(3):
        outcomes.record_task(tools, ["cancel_order"])
    assert outcomes.coverage["change_order"] == COVERAGE_SPAN  # never shipped: as likely as it gets
    assert outcomes.coverage["place_order"] == 1 / COVERAGE_SPAN
    # Shipped, but less than its share: likelier than an average tool, not as likely as unshipped.
    assert outcomes.coverage["cancel_order"] > 1.0
    assert outcomes.coverage["cancel_order"] < COVERAGE_SPAN
    unsteered = Outcomes(learn=False)
    unsteered.record_task(tools, ["place_order"])
    assert unsteered.coverage == {}


@pytest.mark.parametrize("n", [3, 300])  # every item weighed; by rejection
def test_weighted_choice_follows_the_weights(n: int) -> None:
    rng = random.Random(5)
    items = list(range(n))
    weight = {i: (1.0 if i == 0 else 0.05) for i in items}
    picks = Counter(weighted_choice(rng, items, weight.__getitem__) for _ in range(4000))
    share = picks[0] / 4000
    expected = 1.0 / (1.0 + 0.05 * (n - 1))
    assert share == pytest.approx(expected, rel=0.25), (share, expected)


def test_a_value_fits_a_domain_by_enum_or_type() -> None:
    status = ParamDomain(param="status", enum=["in_progress", "resolved"])
    assert accepts(status, "resolved") and not accepts(status, "open")
    ids = ParamDomain(param="passenger_ids", type="string", is_list=True)
    assert accepts(ids, "P-1") and not accepts(ids, 7)
    count = ParamDomain(param="bags", type="integer")
    assert accepts(count, 2) and not accepts(count, True) and not accepts(count, "2")


async def test_steering_cuts_failed_calls_and_keeps_the_bytes() -> None:
    env = load_env(REPO / "envs" / "flight_booking")
    graph = await build_graph(env)
    steered = await synthesize(env, 60, 1, SynthConfig(), graph=graph)
    again = await synthesize(env, 60, 1, SynthConfig(), graph=graph)
    plain = await synthesize(env, 60, 1, SynthConfig(steer=False), graph=graph)
    assert len(steered.tasks) == len(plain.tasks) == 60
    assert tasks_jsonl(again.tasks) == tasks_jsonl(steered.tasks)
    assert tasks_jsonl(plain.tasks) != tasks_jsonl(steered.tasks)
    # Learning needs some attempts to pay off: over 60 tasks a quarter of the failures go.
    assert steered.calls_failed < 0.75 * plain.calls_failed, (steered.calls_failed, plain.calls_failed)


async def test_a_longer_run_starts_with_the_shorter_runs_tasks() -> None:
    """Steering learns from the attempts before, never from how many tasks were asked for: the
    first tasks of a run are the same whatever its length (so `--n` can grow a task file)."""
    env = load_env(REPO / "envs" / "retail_orders")
    graph = await build_graph(env)
    short = await synthesize(env, 12, 5, SynthConfig(), graph=graph)
    long = await synthesize(env, 30, 5, SynthConfig(), graph=graph)
    assert tasks_jsonl(long.tasks[:12]) == tasks_jsonl(short.tasks)


class _Refusals(Replayer):
    """The real replayer, also keeping the text of every refused call (walks see only a verdict)."""

    refusals: list[str]

    async def call(
        self, episode: Any, history: tuple[Any, ...], call: Call, key: str | None = None
    ) -> ToolResult:
        res = await super().call(episode, history, call, key)
        if res.is_error:
            self.refusals.append(res.text)
        return res


@pytest.mark.parametrize("name", ["retail_orders", "it_tickets", "flight_booking"])
async def test_walks_pass_only_arguments_the_schema_allows(name: str) -> None:
    """Values carried over from results (a ticket's status, an item id for a list of ids) are
    checked against the parameter's schema: none is refused by argument validation."""
    env = load_env(REPO / "envs" / name)
    fleet = Fleet([env])
    try:
        ctx = SynthContext.create(env, await build_graph(env, fleet), fleet)
        spy = ctx.replayer = _Refusals(ctx.env, ctx.fleet, ctx.states)
        spy.refusals = []
        built = 0
        for k in range(40):
            try:
                made = await build_task(ctx, f"t{k}", f"9:{k}", SynthConfig())
                task, golden = made.task, made.golden.state
            except BuildFailed:
                continue
            built += 1
            assert await verify_task(ctx, task, golden_state=golden) in ([], ["drop_write"])
        ctx.close()
    finally:
        await fleet.aclose()
    assert built >= 10 and len(spy.refusals) >= 20  # walks did try calls that were refused
    invalid = [r for r in spy.refusals if r.startswith("Error: argument")]
    assert invalid == []
