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

from envforge.synth import Task

from .lookup import held_out

MIN_CALLS, MAX_CALLS, WRITES = 2, 3, 1


def step_tasks(tasks: Sequence[Task]) -> list[Task]:
    """The tasks of `MIN_CALLS`..`MAX_CALLS` calls with exactly `WRITES` write, in file order."""
    return [
        t for t in tasks if MIN_CALLS <= t.difficulty.calls <= MAX_CALLS and t.difficulty.writes == WRITES
    ]


def split_steps(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(train, held-out) by a hash of each task's id (`lookup.held_out`)."""
    return [t for t in tasks if not held_out(t.id)], [t for t in tasks if held_out(t.id)]
