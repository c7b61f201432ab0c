"""Short multi-step tasks: the bundled tasks of two or three calls with one write (`--tasks steps`).

Lookups (`lookup.py`) teach one read and one figure; the bundled task sets chain up to seven calls,
where the packaged 0.5B model scores near zero (3 % pass^1 on gym and pharmacy, 0 % elsewhere:
docs/benchmarks/local-models.md) and ERPO has nothing to learn from. Between them are the tasks
of two or three calls, one of them a write: the user gives a fact or a consent, the agent reads
and then changes one record. Every bundled env's synthesized set holds some (the synthesizer's
`--min-calls 2 --max-calls 3` makes more), so the set is the env's own `tasks.jsonl` filtered,
never a second file that could drift from it. They are played with the scripted user (a write
needs its facts and, under a confirmation rule, its yes) and split into train and held-out by the
same hash of the task id as the lookups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from envforge.harness import confirmation_request
from envforge.server import Environment, Fleet
from envforge.synth import (
    KNOWN_FACTS_LINE,
    PolicyRules,
    Step,
    SynthConfig,
    Task,
    load_policy_rules,
    plain_value,
    policy_violations,
    synthesize,
)

from .lookup import held_out

MIN_CALLS, MAX_CALLS, WRITES = 2, 3, 1

SYNTH_TASKS = 80
"""Tasks asked of the synthesizer per env for `--tasks told`; those with one write whose golden
path keeps the policy are kept (17-39 of 80 on car_rental, gym, library and pharmacy at seed 0:
113 in all, 29 of them held out)."""

TOLD_CONFIG = SynthConfig(
    min_calls=MIN_CALLS, max_calls=MAX_CALLS, p_reason=0.0, p_summary=0.0, p_refusal=0.0, p_setup=0.0
)
"""Straight tasks: no reasoning step to pick a record, no count to report, no refusal, no fresh
entity; what is left is the read and the write the request names."""

PAIR_TASKS = 160
"""Tasks asked of the synthesizer per env for `--tasks pair`: a quarter of a set is held out by id
hash, and two-call tasks are fewer to a draw, so twice the told set's draw keeps the held-out side
near the told set's size."""

PAIR_CONFIG = replace(TOLD_CONFIG, min_calls=2, max_calls=2)
"""The told tasks cut to their shortest: one read, then the one write."""

ASKED_ONLY = " Give these only when asked."


def step_tasks(tasks: Sequence[Task]) -> list[Task]:
    """The tasks of `MIN_CALLS`..`MAX_CALLS` calls with exactly `WRITES` write, in file order."""
    return [
        t for t in tasks if MIN_CALLS <= t.difficulty.calls <= MAX_CALLS and t.difficulty.writes == WRITES
    ]


def split_steps(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(train, held-out) by a hash of each task's id (`lookup.held_out`)."""
    return [t for t in tasks if not held_out(t.id)], [t for t in tasks if held_out(t.id)]


async def told_tasks(
    env: Environment, seed: int, n: int = SYNTH_TASKS, config: SynthConfig = TOLD_CONFIG
) -> list[Task]:
    """`--tasks told`: `n` tasks of 2-3 calls synthesized from `env` at `seed` (`TOLD_CONFIG`),
    those with one write whose golden path keeps the env's policy (`_keeps_policy`), each with its
    user telling its facts in the request (`facts_told`).

    The bundled step tasks stay at zero for the packaged 0.5B model: asked to freeze "my
    membership", it never asks for the member id but guesses one (`12345`, `your_member_id`) and
    repeats the failing write until the turn limit (0 of 24 episodes, 0 of 8 after the prompt
    fix). With the id in the request, what is left to learn is the read, the write and the
    report. Same env and seed: the same tasks, byte for byte."""
    report = await synthesize(env, n, seed, config)
    rules = load_policy_rules(env)
    fleet = Fleet([env])
    try:
        kept = [t for t in step_tasks(report.tasks) if rules is None or await _keeps_policy(fleet, rules, t)]
    finally:
        await fleet.aclose()
    return [facts_told(t) for t in kept]


async def pair_tasks(env: Environment, seed: int, n: int = PAIR_TASKS) -> list[Task]:
    """`--tasks pair`: the told tasks of exactly two calls, a read and then the write
    (`PAIR_CONFIG`), with the values in the request.

    The packaged 0.5B model scored 0 of 58 on the 2-3-call told set: it writes before the read
    the policy asks for, or repeats the write until the turn limit. Two calls are the fewest a
    read and a write take, and with the values told up front the read's result is not needed to
    make the write: what is left is the order, the write and the report."""
    tasks = await told_tasks(env, seed, n, PAIR_CONFIG)
    return [t for t in tasks if len(t.golden_calls) == 2 and env.tools[t.golden_calls[0].name].read_only]


async def _keeps_policy(fleet: Fleet, rules: PolicyRules, task: Task) -> bool:
    """Whether the task's golden calls, each write after the user's yes to its proposal, break
    none of the env's declared rules: synthesis ships some that do not (pharmacy's "cancel your
    prescription" as `list_prescriptions` then `cancel_prescription`, no `get_patient` first),
    which no policy could then be paid for."""
    episode = await fleet.create_episode(task.env)
    steps: list[Step] = []
    try:
        for call in task.golden_calls:
            if call.name in rules.writes:
                steps += [Step("agent", confirmation_request(call)), Step("user", "Yes.")]
            result = await fleet.call(episode.id, call.name, call.arguments)
            steps.append(Step("call", result.text, call, result.is_error))
    finally:
        await fleet.close_episode(episode.id)
    return not policy_violations(rules, task, steps)


def facts_told(task: Task) -> Task:
    """`task` with its user's facts said in the request ("My member id is G-114."), as the
    scripted user answers when asked, instead of kept until asked; its id gets `-told`."""
    facts = task.scenario.known_facts
    if not facts:
        return task.model_copy(update={"id": f"{task.id}-told"})
    told = " ".join(f"My {f.name.replace('_', ' ')} is {plain_value(f.value)}." for f in facts)
    lines = []
    for line in task.scenario.instruction.splitlines():
        if line.startswith(KNOWN_FACTS_LINE):
            lines.append(told)
            line = line.replace(ASKED_ONLY, "")
        lines.append(line)
    scenario = task.scenario.model_copy(update={"instruction": "\n".join(lines)})
    return task.model_copy(update={"id": f"{task.id}-told", "scenario": scenario})
