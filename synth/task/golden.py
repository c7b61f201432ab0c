"""What building a task saw of its golden run, so the checks that would replay it need not.

`build_task` executes the golden calls once, for real, to make the task. Three things the
adversarial checks need are already known then: the end state (the golden state), each golden
call's result text (what a `spray` adversary repeats after making exactly those calls), and the
state right after the first successful write (where a `golden_prefix` adversary stops). Tools are
deterministic functions of state and arguments (the `deterministic` self-check holds every
shipped task to that), so a replay would find the same; `verify.adversary_rewards` scores these
instead of replaying.
"""

from __future__ import annotations

from dataclasses import dataclass

from envforge.server import State

from .models import Task


@dataclass(frozen=True)
class GoldenRun:
    """The golden run of a freshly built task."""

    state: State
    """The golden end state, as an export of the run's episode would give it."""
    texts: tuple[str, ...]
    """Each golden call's result text, in `Task.golden_calls` order."""
    after_first_write: State | None
    """The state right after the first successful write call, when the run held it whole (None:
    not captured, e.g. a single-write task, where no adversary stops there)."""


@dataclass(frozen=True)
class BuiltTask:
    """`build_task`'s result: the task and its golden run."""

    task: Task
    golden: GoldenRun
