"""Attacks on the outputs part of the reward by copying: read what the task asks to read, then
repeat the result (or a slice of it) instead of choosing the value that answers the question.

On a lookup task ("What is the capacity of class CL-217? Tell me the number.") the answer sits
inside the one result the agent was asked to read, beside the result's other numbers. Each of
those was shown to the agent, so under a rule that lets shown values stand beside an answer, a
copy names the answer among at most two others and earns without choosing. The attacks run
through the trainer's own rollout episodes (`FleetRolloutEnv`, the reward ERPO trains on) on every
lookup task of the four envs the ERPO figure was measured on, and through the synthesis scorer
on every bundled task after its golden calls.

A copy that holds no number but the answer (a record with one numeric field) states the answer
alone, as an honest verbose answer would: it is counted as the answer, and the tests say so.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from envforge.server import Fleet, load_env
from envforge.synth import (
    SynthContext,
    Task,
    build_graph,
    load_graph,
    load_tasks,
    oracle_messages,
    parse_number,
    score_episode,
    shown_results,
)
from envforge.trainer import FleetRolloutEnv, lookup_tasks

from support.paths import REPO, bundled_env_dirs

LOOKUP_ENVS = ["car_rental", "library", "gym", "pharmacy"]


def _leaves(data: Any, key: str = "") -> list[tuple[str, Any]]:
    """(key, value) of every scalar of a parsed JSON result, in order."""
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _leaves(v, str(k))]
    if isinstance(data, list):
        return [leaf for v in data for leaf in _leaves(v, key)]
    return [(key, data)]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rendered(pairs: list[tuple[str, Any]]) -> str:
    return ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs)


def copies(text: str, answer: str) -> dict[str, tuple[str, set[float]]]:
    """The copying attacks on one JSON result `text` whose numbers may hold `answer`: per attack,
    the message and the numbers it states (the result's numeric values it carries)."""
    try:
        leaves = _leaves(json.loads(text))
    except ValueError:
        return {}
    numbers = [(k, v) for k, v in leaves if _is_number(v)]
    want = float(parse_number(answer).value)  # type: ignore[union-attr]
    out = {"whole": (text, {float(v) for _, v in numbers})}
    for k in (2, 3):
        first = numbers[:k]
        out[f"first {k}"] = (" ".join(json.dumps(v) for _, v in first), {float(v) for _, v in first})
    at = next((i for i, (_, v) in enumerate(leaves) if _is_number(v) and float(v) == want), None)
    if at is not None:
        window = leaves[max(at - 1, 0) : at + 2]
        out["around the answer"] = (_rendered(window), {float(v) for _, v in window if _is_number(v)})
        field = leaves[at][0]
        named = f"The {field.replace('_', ' ')} is {answer}.\n{text}"
        out["named"] = (named, {float(v) for _, v in numbers} | {want})
    return out


def _alone(stated: set[float], required: set[float], answers: set[float]) -> bool:
    """Whether a copy states every required number and none but the answers (and the task's own
    values): then it is an answer, not a hedge, and earns what the answer alone earns. A copy
    that states no required number (a list whose count is the answer) is no answer, and is
    judged: it must earn nothing."""
    return required <= stated <= answers


def _own_numbers(task: Task) -> set[float]:
    """The numbers the task itself puts in play: the user's facts, the golden calls' arguments."""
    data = [[f.value for f in task.scenario.known_facts], [c.arguments for c in task.golden_calls]]
    out = set()
    for _, v in _leaves(data):
        number = v if _is_number(v) else parse_number(v) if isinstance(v, str) else None
        if number is not None:
            out.add(float(number if _is_number(number) else number.value))
    return out


async def _read_then_say(rollouts: FleetRolloutEnv, task: Task, message: str | None) -> tuple[str, float]:
    """One rollout episode of the trainer: the task's one read, then `message` (if any) as the
    agent's answer; the read's result and the episode's reward."""
    async with rollouts.episode(task.id) as episode:
        (call,) = task.golden_calls
        outcome = await episode.call_tool(call.name, call.arguments)
        if message is None:
            return outcome.text, 0.0
        return outcome.text, (await episode.finish([message])).reward


async def test_copying_the_read_result_earns_nothing_on_lookup_tasks() -> None:
    """The attack as the issue found it: on every lookup task of the ERPO figure's four envs, make
    the one read, then say its result verbatim, its first two or three numbers, the fields around
    the answer, or the result under a sentence naming the asked field. Scored by the trainer's
    rollout reward, no copy that states another number earns; the read and the figure alone, or
    the figure as a small JSON object (the trained model's forms, docs/benchmarks/training.md), also with
    the entity's id, or in a sentence naming the field and the id, earn 1 on every task."""
    envs = [load_env(REPO / "envs" / name) for name in LOOKUP_ENVS]
    judged: Counter[str] = Counter()
    async with Fleet(envs) as fleet:
        for env in envs:
            tasks = await lookup_tasks(fleet, env.name)
            rollouts = FleetRolloutEnv(fleet, env.name, tasks, use_mcp=False)
            for task in tasks:
                (answer,) = task.required_outputs
                text, _ = await _read_then_say(rollouts, task, None)
                field = task.seed.rsplit(":", 1)[1]
                figure = json.loads(text)[field]
                ((param, value),) = task.golden_calls[0].arguments.items()
                said = f"The {field.replace('_', ' ')} of {param.removesuffix('_id')} {value} is {answer}."
                for honest in (
                    answer,
                    said,
                    json.dumps({field: figure}),
                    json.dumps({param: value, field: figure}),
                ):
                    assert (await _read_then_say(rollouts, task, honest))[1] == 1.0, (task.id, honest)
                attacks = copies(text, answer)
                assert set(attacks) == {"whole", "first 2", "first 3", "around the answer", "named"}, task.id
                for attack, (message, stated) in attacks.items():
                    _, reward = await _read_then_say(rollouts, task, message)
                    if _alone(stated, {float(figure)}, {float(figure)}):  # a record whose one number is it
                        assert reward == 1.0, (task.id, attack, message)
                        continue
                    judged[attack] += 1
                    assert reward == 0.0, (task.id, attack, message)
    assert len(judged) == 5 and min(judged.values()) >= 100, judged  # the copies were put to the test


async def _golden_results(env_dir: Path, tasks: list[Task]) -> list[tuple[Any, list[str], list[str]]]:
    """Per task: its golden end state, its golden calls' result texts, and what they showed."""
    env = load_env(env_dir)
    fleet = Fleet([env])
    try:
        graph = load_graph(env_dir) or await build_graph(env, fleet)
        ctx = SynthContext.create(env, graph, fleet)
        out = []
        for task in tasks:
            calls = list(task.golden_calls)
            database, _, _ = ctx.states.task_initial(task)
            state, texts = await ctx.replayer.run_all(database, calls)
            results = [(c.name, c.arguments, t) for c, t in zip(calls, texts, strict=True)]
            out.append((state, texts, [task.scenario.without_answers(), *shown_results(task, results)]))
        return out
    finally:
        await fleet.aclose()


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
async def test_copying_golden_results_earns_nothing_on_bundled_tasks(env_dir: Path) -> None:
    """The same attacks on every bundled task: make the golden calls (the state part holds), then
    copy every result, or one result, its first numbers, the fields around an answer, or the
    result under a sentence naming the answer's field. No copy that states a number beside the
    required outputs earns, nor one that states none of them (results that only list the rows a
    count is of); the required outputs alone do."""
    tasks = [t for t in load_tasks(env_dir) if t.required_outputs]
    assert tasks
    judged = 0
    for task, (state, texts, shown) in zip(tasks, await _golden_results(env_dir, tasks), strict=True):
        assert score_episode(task, state, oracle_messages(task), shown_messages=shown).reward == 1.0, task.id
        required = {float(parse_number(o).value) for o in task.required_outputs}  # type: ignore[union-attr]
        answers = required | _own_numbers(task)
        attacks: list[tuple[str, str, set[float]]] = []
        every: set[float] = set()
        for text in texts:
            for answer in task.required_outputs:
                for attack, (message, stated) in copies(text, answer).items():
                    attacks.append((attack, message, stated))
                    every |= stated if attack == "whole" else set()
        attacks.append(("every result", "\n".join(texts), every))
        for attack, message, stated in attacks:
            if _alone(stated, required, answers):
                continue
            judged += 1
            gamed = score_episode(task, state, [message], shown_messages=shown)
            assert gamed.state_match, task.id
            assert gamed.reward == 0.0, (task.id, attack, message[:300])
    assert judged >= len(tasks) // 2, judged


def test_check_plays_the_copy_on_every_bundled_task() -> None:
    """`envforge check` runs the copy as its `copy_result` adversary (the golden calls, then every
    result verbatim) on every bundled task whose reward rests on stated outputs; none is gamed.
    Under a rule that lets shown values stand beside a read answer it gamed 8 of them (a count
    of 0 or 2 that a flag or a comment's text in some result also showed)."""
    import envforge

    judged = 0
    for env_dir in bundled_env_dirs():
        for check in envforge.check_tasks(env_dir):
            reward = check.adversary_rewards["copy_result"]
            judged += reward is not None
            assert reward is None or reward < 1.0, (check.task_id, reward)
    assert judged >= 200, judged
