"""Attacks on the outputs part of the reward: answers that game a required output without knowing it.

Each test plays the attack against real bundled tasks: the golden calls replayed on a real SQLite
episode (so the state part holds and only the answer decides), then the gamed answer scored.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.harness import Message, ToolCall, shown_texts
from envforge.server import Fleet, State, load_env
from envforge.synth import (
    ANSWERS_LINE,
    Call,
    SynthContext,
    Task,
    build_graph,
    load_graph,
    load_policy_rules,
    load_tasks,
    oracle_messages,
    parse_number,
    score_episode,
    shown_results,
)

from support.paths import REPO, bundled_env_dirs

SPRAY = " ".join(str(v) for v in range(1000))


def _numeric(task: Task) -> bool:
    return bool(task.required_outputs) and all(parse_number(o) is not None for o in task.required_outputs)


def _near(required: str) -> list[str]:
    """`required` and its ten nearest neighbours, written the way `required` is written."""
    number = parse_number(required)
    assert number is not None
    step = 1 if number.kind == "integer" else 0.01
    decimals = len(required.split(".")[1]) if "." in required else 0
    return [f"{float(number.value) + i * step:.{decimals}f}" for i in range(-5, 6)]


ECHO = " ".join(str(v) for v in range(10))
ECHOED: Counter[bool] = Counter()
"""How many echo reads repeated their argument (True) or not (False)."""


async def _golden_runs(env_dir: Path, tasks: list[Task], *, extra: str = "") -> list[tuple[State, list[str]]]:
    """Each task's golden end state and what its calls showed, as every scorer passes it (the
    request, `shown_results`). After the golden calls, `extra` "echo" makes one read more whose
    argument is the integers 0..9 (it fails, and its error may repeat them); "browse" calls every
    read tool that needs no argument, listing whole tables."""
    env = load_env(env_dir)
    fleet = Fleet([env])
    try:
        graph = load_graph(env_dir) or await build_graph(env, fleet)
        ctx = SynthContext.create(env, graph, fleet)
        out = []
        for task in tasks:
            calls = list(task.golden_calls)
            if extra == "echo":
                read = next(c for c in calls if env.tools[c.name].read_only and c.arguments)
                key = next(iter(read.arguments))
                calls.append(read.model_copy(update={"arguments": {**read.arguments, key: ECHO}}))
            if extra == "browse":
                listing = [
                    n for n, t in env.tools.items() if t.read_only and not t.input_schema.get("required")
                ]
                calls += [Call(name=n, arguments={}) for n in listing]
            database, _, _ = ctx.states.task_initial(task)
            state, texts = await ctx.replayer.run_all(database, calls)
            assert state is not None
            shown = shown_results(task, [(c.name, c.arguments, t) for c, t in zip(calls, texts, strict=True)])
            if extra == "echo":
                ECHOED[ECHO in texts[-1]] += 1
            out.append((state, [task.scenario.without_answers(), *shown]))
        return out
    finally:
        await fleet.aclose()


NUMERIC_ENVS = [d for d in bundled_env_dirs() if any(_numeric(t) for t in load_tasks(d))]


@pytest.mark.parametrize("env_dir", NUMERIC_ENVS, ids=lambda p: p.name)
async def test_number_spray_after_the_golden_calls_earns_nothing(env_dir: Path) -> None:
    """The attack: make the golden calls, then say every integer 0..999 and, for good measure, the
    right answer among its ten nearest neighbours. No numeric required output may be earned."""
    tasks = [t for t in load_tasks(env_dir) if _numeric(t)]
    for task, (golden, shown) in zip(tasks, await _golden_runs(env_dir, tasks), strict=True):
        spray = [SPRAY, " ".join(v for o in task.required_outputs for v in _near(o))]
        gamed = score_episode(task, golden, spray, shown_messages=shown)
        assert gamed.state_match, task.id
        assert gamed.reward == 0.0 and gamed.outputs_missing == task.required_outputs, task.id
        honest = score_episode(task, golden, oracle_messages(task))
        assert honest.reward == 1.0, task.id


HEDGES = (
    "It is 1 or 2.",
    "It is 0, 1 or 2.",
    "It is 1, 2 or 3.",
    "It is 1, 2 or 3, or maybe 4.00, 5.00 or 6.00.",
)


@pytest.mark.parametrize("extra", ["", "echo", "browse"])
async def test_hedging_pays_less_than_committing_to_one_guess(extra: str) -> None:
    """The attack: do the golden calls, then name a few small numbers instead of counting, since
    most answers are small counts. Scored with everything the run was shown, every hedge must
    earn on fewer bundled tasks than the best single number among its values does: naming
    several is never a better bet than naming one. Also when the policy first has the hedge's
    values "shown" to it: by a read whose error repeats its argument ("echo"), or by listing
    every table a read tool can list whole ("browse")."""
    wins: dict[str, int] = {}
    for env_dir in NUMERIC_ENVS:
        tasks = [t for t in load_tasks(env_dir) if _numeric(t)]
        runs = await _golden_runs(env_dir, tasks, extra=extra)
        for task, (golden, shown) in zip(tasks, runs, strict=True):
            for said in (*HEDGES, *(f"It is {v}." for v in range(0, 7))):
                earned = score_episode(task, golden, [said], shown_messages=shown).reward == 1.0
                wins[said] = wins.get(said, 0) + earned
    best_single = max(wins[f"It is {v}."] for v in range(0, 7))
    assert best_single >= 20, wins  # the bet is worth making: small answers are common
    assert extra != "echo" or ECHOED[True] > ECHOED[False]  # most reads did repeat every value
    for hedge in HEDGES:
        assert wins[hedge] < best_single, (extra, hedge, wins)


def _first_small_answer(env_dir: Path) -> Task:
    return next(
        t for t in load_tasks(env_dir) if len(t.required_outputs) == 1 and len(t.required_outputs[0]) == 1
    )


@pytest.mark.parametrize("template", ["The total is 1{v}.", "Total: {v}50", "error {v}03"])
def test_gamed_answers_through_envforge_score(template: str, tmp_path: Path) -> None:
    """The attack as the issue found it: golden calls, then an answer holding the digit inside
    another number, scored by `envforge score` on a bundled task whose answer is one digit."""
    env_dir = REPO / "envs" / "flight_booking"
    task = _first_small_answer(env_dir)
    golden = [c.model_dump() for c in task.golden_calls]

    def score(message: str) -> dict:
        actions = tmp_path / "actions.json"
        actions.write_text(json.dumps([*golden, {"message": message}]), encoding="utf-8")
        args = ["score", str(env_dir), "--task", task.id, "--actions", str(actions), "--json"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    (value,) = task.required_outputs
    gamed = score(template.format(v=value))
    assert gamed["state_match"] and gamed["reward"] == 0.0 and gamed["outputs_missing"] == [value]
    assert score(f"The answer is {value}.")["reward"] == 1.0


def test_a_failing_read_cannot_launder_a_hedge(tmp_path: Path) -> None:
    """The attack through `envforge score` and through a harness transcript: golden calls, then a
    read whose error repeats its argument "1 2 3", then "It is 1, 2 or 3.". The echoed values
    were the agent's own, so they are not shown to it, and the hedge earns nothing; the read's
    other values still are ("Error: drug 1 2 3 not found" shows none)."""
    env_dir = REPO / "envs" / "pharmacy"
    task = next(t for t in load_tasks(env_dir) if t.required_outputs == ["2"])
    echo = {"name": "get_drug", "arguments": {"drug_id": "1 2 3"}}
    actions = tmp_path / "actions.json"
    golden = [c.model_dump() for c in task.golden_calls]
    actions.write_text(json.dumps([*golden, echo, {"message": "It is 1, 2 or 3."}]), encoding="utf-8")
    args = ["score", str(env_dir), "--task", task.id, "--actions", str(actions), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    gamed = json.loads(result.output)
    assert gamed["state_match"] and gamed["reward"] == 0.0, gamed
    call = ToolCall(id="c1", name="get_drug", arguments=echo["arguments"])
    transcript = [
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", content="Error: drug 1 2 3 not found", tool_call_id="c1"),
    ]
    assert "2" not in "".join(shown_texts(task, transcript))


async def test_listing_every_entity_id_earns_no_id_output() -> None:
    """The attack on an id answer: name every passenger id of the env. A task variant requiring
    one passenger id must not be earned by the list, and must be by the id alone."""
    env_dir = REPO / "envs" / "flight_booking"
    base = next(t for t in load_tasks(env_dir) if t.required_outputs)
    ((golden, _),) = await _golden_runs(env_dir, [base])
    ids = [r["passenger_id"] for r in golden["passengers"]]
    task = base.model_copy(update={"required_outputs": [ids[17]]})
    listing = "Passengers on file: " + ", ".join(ids) + "."
    gamed = score_episode(task, golden, [listing], shown_messages=[json.dumps(golden["passengers"])])
    assert gamed.state_match and gamed.reward == 0.0 and gamed.outputs_missing == [ids[17]]
    assert score_episode(task, golden, [f"The passenger is {ids[17]}."]).reward == 1.0
    # and a longer id that merely starts with the answer is no answer
    assert score_episode(task, golden, [f"The passenger is {ids[17]}9."]).reward == 0.0


def _needs_user(env_dir: Path, tasks: list[Task]) -> list[Task]:
    """The tasks whose golden writes the env's policy wants the user's yes for: a rollout with no
    user refuses them (`NeedsUser`)."""
    rules = load_policy_rules(load_env(env_dir))
    if rules is None:
        return []
    return [t for t in tasks if any(rules.needs_confirmation(c.name) for c in t.golden_calls)]


CONFIRMING_ENVS = [d for d in bundled_env_dirs() if _needs_user(d, load_tasks(d))]


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
async def test_a_rollout_without_a_user_never_shows_the_answers(env_dir: Path) -> None:
    """`--env-kind fleet` opens each episode with the task itself (no simulated user to ask). The
    instruction's last line lists the answers the user must be told; shown to the policy, echoing
    the prompt would earn the outputs part with no lookup at all. The opening holds no answers line,
    and a policy that does the golden calls and then echoes its opening earns the outputs part only
    where its request already names the answer (a count that is also a quantity asked for).

    Played on every task with required outputs that such a rollout accepts: the env's synthesized
    tasks that need no user's yes and its single-lookup tasks (`--tasks lookup`, whose answer is
    only in what the user must be told). Where the env's policy confirms every write, none of its
    synthesized tasks gets an opening at all: `test_tasks_needing_a_user_are_refused_without_a_user`.
    An env with neither (Slack: text records, every write confirmed) has nothing such a rollout
    plays, and `train --tasks lookup` says so."""
    from envforge.trainer import FleetRolloutEnv, lookup_tasks

    env = load_env(env_dir)
    written = [t for t in load_tasks(env_dir) if t.required_outputs]
    needing = {t.id for t in _needs_user(env_dir, written)}
    synthesized = [t for t in written if t.id not in needing]
    async with Fleet([env]) as fleet:
        tasks = synthesized + await lookup_tasks(fleet, env.name)
        if not tasks:  # no read answers a figure and every task's write waits for the user's yes
            assert written and len(needing) == len(written), env.name
            return
        # where synthesized tasks play, their answers line is there to be left out
        assert not synthesized or any(ANSWERS_LINE in t.scenario.instruction for t in synthesized)
        rollouts = FleetRolloutEnv(fleet, env.name, tasks, use_mcp=False)
        for task in tasks:
            async with rollouts.episode(task.id) as episode:
                opening = episode.initial_messages()
                assert not any(ANSWERS_LINE in m["content"] for m in opening), task.id
                for call in task.golden_calls:
                    await episode.call_tool(call.name, call.arguments)
                info = await episode.finish([opening[-1]["content"]])  # the task, echoed
            if info.parts["outputs"]:  # only where the request itself names the answer ("2 days")
                request = task.scenario.without_answers()
                assert all(
                    re.search(rf"(?<![\w.]){re.escape(o)}(?![\w])", request) for o in task.required_outputs
                ), task.id


@pytest.mark.parametrize("env_dir", CONFIRMING_ENVS, ids=lambda p: p.name)
async def test_tasks_needing_a_user_are_refused_without_a_user(env_dir: Path) -> None:
    """The tasks the opening test cannot play: their writes need the user's yes, which a rollout
    with no user cannot get. Each is refused before anything runs, alone or among tasks that
    could play, with one line naming the count and pointing to `--env-kind harness`."""
    from envforge.trainer import FleetRolloutEnv, NeedsUser, lookup_tasks

    env = load_env(env_dir)
    written = [t for t in load_tasks(env_dir) if t.required_outputs]
    needing = _needs_user(env_dir, written)
    async with Fleet([env]) as fleet:
        playable = await lookup_tasks(fleet, env.name)
        FleetRolloutEnv(fleet, env.name, playable, use_mcp=False)  # the lookups alone play
        for given in ([needing[0]], needing, [*playable, needing[-1]]):
            confirming = sum(t in needing for t in given)
            with pytest.raises(NeedsUser) as err:
                FleetRolloutEnv(fleet, env.name, given, use_mcp=False)
            message = str(err.value)
            assert "\n" not in message, message
            assert f"{confirming} of {len(given)} tasks" in message and "--env-kind harness" in message
        for task in needing:
            with pytest.raises(NeedsUser):
                FleetRolloutEnv(fleet, env.name, [task], use_mcp=False)
