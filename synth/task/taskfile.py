"""`tasks.jsonl`, an env's task file: reading, writing, and when two tasks are one.

Everything that reads shipped tasks (the harness, the trainer, `envforge check`, the realism
measures) needs this and nothing of how tasks are built, so it sits with the task contract rather
than with synthesis.
"""

from __future__ import annotations

import json
from pathlib import Path

from envforge.server import read_env_text, replace_file

from .models import Task


def task_keys(task: Task) -> tuple[str, str]:
    """The two identities of a task: its golden end state (to cents) with its required outputs,
    and its golden calls."""
    outputs = sorted(o.strip().lower() for o in task.required_outputs)
    end = task.golden_cents_hash + "\0" + json.dumps(outputs)
    calls = json.dumps([c.model_dump() for c in task.golden_calls], sort_keys=True)
    return end, calls


def tasks_jsonl(tasks: list[Task]) -> str:
    return "".join(t.model_dump_json() + "\n" for t in tasks)


def write_tasks(tasks: list[Task], root: Path) -> Path:
    return write_tasks_to(tasks, Path(root) / "tasks.jsonl")


def write_tasks_to(tasks: list[Task], path: Path) -> Path:
    """Write `tasks` as JSON lines to `path` (its folder made if missing), replacing a link there
    rather than writing through it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_file(path, tasks_jsonl(tasks))


def load_tasks(root: Path, tasks_file: Path | None = None) -> list[Task]:
    """The tasks of the env at `root`: its own `tasks.jsonl`, or `tasks_file` (a file `synth tasks
    --out` wrote elsewhere). A line that is not a task raises `ValueError` naming file and line."""
    if tasks_file is None:
        text = read_env_text(root, "tasks.jsonl")  # never through a link out of the env folder
        where = Path(root) / "tasks.jsonl"
    else:
        text = Path(tasks_file).read_text(encoding="utf-8")
        where = Path(tasks_file)
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(Task.model_validate_json(line))
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise ValueError(f"{where}:{number}: not a task ({first})") from None
    return tasks
