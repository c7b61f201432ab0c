"""Tasks as the harness runs them: loaded from an env folder, with their initial states built.

A task stores its initial state as a diff (`setup`) against the env's seed; the harness applies
it once per task and hands the full state to the fleet (`create_episode(env, state=...)` or the
control plane's `{"state": ...}`), so an episode starts exactly where synthesis verified it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envforge.server import Environment, State, env_file_exists, load_env
from envforge.synth import (
    PolicyRules,
    StateDiff,
    Task,
    apply_diff,
    diff_states,
    env_assertion_problems,
    load_policy_rules,
    load_tasks,
    primary_keys,
)


@dataclass
class EnvTasks:
    """One env folder's environment and the tasks selected from its `tasks.jsonl`."""

    env_dir: Path
    env: Environment
    tasks: list[Task]
    policy_rules: PolicyRules | None = None
    """The env's declared policy rules (`policy_rules.toml`): the oracle follows them and every
    trial is scored on them."""
    _initial: dict[str, State] = field(default_factory=dict, repr=False)

    @property
    def pks(self) -> dict[str, tuple[str, ...]]:
        return primary_keys(self.env.tables)

    def initial_state(self, task: Task) -> State:
        """The seed with the task's `setup` applied (cached per task)."""
        if task.id not in self._initial:
            seed = self.env.seed_state()
            self._initial[task.id] = apply_diff(self.pks, seed, task.setup) if task.setup else seed
        return self._initial[task.id]

    def diff_from_initial(self, task: Task, final: State) -> StateDiff:
        return diff_states(self.pks, self.initial_state(task), final)

    def final_from_diff(self, task: Task, diff: StateDiff) -> State:
        return apply_diff(self.pks, self.initial_state(task), diff)

    def task(self, task_id: str) -> Task:
        return next(t for t in self.tasks if t.id == task_id)


class TaskSelectionError(ValueError):
    """A task selection (ids, split, limit) that cannot be applied: nothing is run."""


def split_names(tasks: list[Task]) -> list[str]:
    """The splits `tasks` carry (τ²'s `split_tasks.json` names, on imported tasks), sorted."""
    return sorted({name for t in tasks for name in t.split})


def select_tasks(
    env: str,
    tasks: list[Task],
    *,
    task_ids: list[str] | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Task]:
    """`tasks` (all of the env named `env`, in file order) narrowed to `task_ids`, then to those
    listed in `split`, then to the first `limit`.

    τ² reports results per split (train, test), so a run of one split must be one flag, not a list
    of ids; a split the env does not have is an error rather than an empty run.
    """
    names = split_names(tasks)
    if task_ids is not None:
        wanted = set(task_ids)
        tasks = [t for t in tasks if t.id in wanted]
    if split is not None:
        if not names:
            raise TaskSelectionError(
                f"split {split!r}: {env}'s tasks have no splits (only τ²-bench imports carry them)"
            )
        if split not in names:
            raise TaskSelectionError(
                f"split {split!r}: {env} has no such split (its splits: {', '.join(names)})"
            )
        chosen = [t for t in tasks if split in t.split]
        if tasks and not chosen:  # only task ids given alongside can leave nothing
            raise TaskSelectionError(
                f"split {split!r}: none of the {len(tasks)} selected task(s) of {env} is in it"
            )
        tasks = chosen
    if limit is not None:
        if limit < 1:
            raise TaskSelectionError(f"limit must be at least 1, not {limit}")
        tasks = tasks[:limit]
    return tasks


def load_env_tasks(env_dir: str | Path, task_ids: list[str] | None = None) -> EnvTasks:
    """Load an env and its tasks; `task_ids` selects (unknown ids are ignored, order kept)."""
    env_dir = Path(env_dir)
    env = load_env(env_dir)
    if not env_file_exists(env_dir, "tasks.jsonl"):
        raise FileNotFoundError(f"{env_dir} has no tasks.jsonl (run `envforge synth` first)")
    tasks = select_tasks(env.name, load_tasks(env_dir), task_ids=task_ids)
    problems = [p for t in tasks for p in env_assertion_problems(env, t)]
    if problems:  # found before any trial runs, never scored as a pass or a crash mid-run
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TaskSelectionError(f"{env_dir}: {problems[0]}{more}")
    return EnvTasks(env_dir=env_dir, env=env, tasks=tasks, policy_rules=load_policy_rules(env))
