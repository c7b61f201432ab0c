"""Tasks as the harness runs them: loaded from an env folder, with their initial states built.

A task stores its initial state as a diff (`setup`) against the env's seed; the harness applies
it once per task and hands the full state to the fleet (`create_episode(env, state=...)` or the
control plane's `{"state": ...}`), so an episode starts exactly where synthesis verified it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envforge.server import Environment, State, load_env
from envforge.synth import StateDiff, Task, apply_diff, diff_states, load_tasks, primary_keys


@dataclass
class EnvTasks:
    """One env folder's environment and the tasks selected from its `tasks.jsonl`."""

    env_dir: Path
    env: Environment
    tasks: list[Task]
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


def load_env_tasks(env_dir: str | Path, task_ids: list[str] | None = None) -> EnvTasks:
    """Load an env and its tasks; `task_ids` selects (unknown ids are ignored, order kept)."""
    env_dir = Path(env_dir)
    env = load_env(env_dir)
    if not (env_dir / "tasks.jsonl").exists():
        raise FileNotFoundError(f"{env_dir} has no tasks.jsonl (run `envforge synth` first)")
    tasks = load_tasks(env_dir)
    if task_ids is not None:
        wanted = set(task_ids)
        tasks = [t for t in tasks if t.id in wanted]
    return EnvTasks(env_dir=env_dir, env=env, tasks=tasks)
